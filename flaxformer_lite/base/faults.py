"""Test-only fault injection: kill the process at an exact point to test resuming.

``FLAXFORMER_LITE_FAULT=<point>:<n>`` makes the process SIGKILL itself the ``n``-th time
(counted from 1, per process) it passes ``<point>``; ``<point>:<n>:<action>`` does
``<action>`` instead: a signal name (``SIGINT``, ``SIGTERM``: sent to this process, as a user
or a scheduler would) or an errno name (``ENOSPC``, ``EIO``: raised there as an `OSError`, as
a full or failing disk would). Points:

- ``train_step``: a compiled training call (one step, or ``train.steps_per_call`` steps) has
  been dispatched, before its metrics are logged;
- ``checkpoint_save``: orbax has written a checkpoint step into its temporary directory, before
  the rename that commits it;
- ``eval_batch``: an evaluation batch is about to be scored;
- ``write:<file name>``: `atomic_write_text` has written and synced the temporary file, before
  the rename, e.g. ``write:results.jsonl``, ``write:rows.jsonl``, ``write:eval.json``.

Any other value is refused in one line naming the variable, the value and what is allowed
(`check`, a `ConfigError`: the commands check it before any work; `hit` and `armed` raise
the same), never a traceback and never a fault point that silently never fires.

Unset (always, outside the kill tests), `hit` costs one environment lookup. SIGKILL, not an
exception: no ``finally`` block or atexit handler runs, as when the machine dies or a
preemptible VM is reclaimed.
"""

from __future__ import annotations

import errno
import os
import signal

from flaxformer_lite.base.checks import ConfigError

ENV = "FLAXFORMER_LITE_FAULT"
POINTS = ("train_step", "checkpoint_save", "eval_batch")  # and write:<file name>
_SIGNALS = ("SIGKILL", "SIGINT", "SIGTERM")
_counts: dict[str, int] = {}
_ALLOWED = (
    "must be <point>:<n>[:<action>] with <point> one of "
    + ", ".join(POINTS)
    + ", write:<file name>; <n> an int >= 1; <action> SIGKILL (the default), SIGINT, SIGTERM "
    + "or an errno name (ENOSPC, EIO, ...); e.g. write:results.jsonl:1:ENOSPC"
)


def _parse(spec: str) -> tuple[str, int, str]:
    """``(point, n, action)`` of ``<point>:<n>[:<action>]``; `ConfigError` (one line naming
    `ENV`, the value and what is allowed) for anything else."""
    parts = spec.split(":")
    if parts[-1].isdigit() or len(parts) < 3:  # no action: SIGKILL
        point, last, action = ":".join(parts[:-1]), parts[-1], "SIGKILL"
    else:
        point, last, action = ":".join(parts[:-2]), parts[-2], parts[-1]
    problem = None
    if len(parts) < 2:
        problem = "no <n>"
    elif not last.isdigit() or int(last) < 1:
        problem = f"<n>={last!r} is not an int >= 1"
    elif point not in POINTS and not (point.startswith("write:") and len(point) > len("write:")):
        problem = f"unknown point {point!r}"
    elif action not in _SIGNALS and not (
        action.startswith("E") and isinstance(getattr(errno, action, None), int)
    ):
        problem = f"unknown action {action!r}"
    if problem is not None:
        raise ConfigError(f"{ENV}={spec!r}: {problem}; {_ALLOWED}")
    return point, int(last), action


def check() -> None:
    """Raise `ConfigError` if `ENV` is set to a value that is not a fault (see `_parse`)."""
    spec = os.environ.get(ENV)
    if spec:
        _parse(spec)


def armed(point: str) -> bool:
    """Whether the environment asks for a fault at ``point``."""
    spec = os.environ.get(ENV, "")
    return bool(spec) and _parse(spec)[0] == point


def hit(point: str) -> None:
    """Count a pass through ``point``; on the n-th pass do the fault asked for (SIGKILL)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    name, n, action = _parse(spec)
    if name != point:
        return
    _counts[point] = _counts.get(point, 0) + 1
    if _counts[point] != n:
        return
    if action.startswith("SIG"):
        os.kill(os.getpid(), getattr(signal, action))
    else:
        code = getattr(errno, action)
        raise OSError(code, os.strerror(code))
