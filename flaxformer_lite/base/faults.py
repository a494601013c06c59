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

Unset (always, outside the kill tests), `hit` costs one environment lookup. SIGKILL, not an
exception: no ``finally`` block or atexit handler runs, as when the machine dies or a
preemptible VM is reclaimed.
"""

from __future__ import annotations

import errno
import os
import signal

ENV = "FLAXFORMER_LITE_FAULT"
_counts: dict[str, int] = {}


def _parse(spec: str) -> tuple[str, int, str]:
    """``(point, n, action)`` of ``<point>:<n>[:<action>]``."""
    rest, _, last = spec.rpartition(":")
    action = "SIGKILL"
    if not last.isdigit():
        rest, _, last = rest.rpartition(":")
        action = spec.rpartition(":")[2]
    return rest, int(last), action


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
