"""Test-only fault injection: kill the process at an exact point to test resuming.

``FLAXFORMER_LITE_FAULT=<point>:<n>`` makes the process SIGKILL itself the ``n``-th time
(counted from 1, per process) it passes ``<point>``. Points:

- ``train_step``: a training step has been dispatched, before its metrics are logged;
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

import os
import signal

ENV = "FLAXFORMER_LITE_FAULT"
_counts: dict[str, int] = {}


def armed(point: str) -> bool:
    """Whether the environment asks for a kill at ``point``."""
    return os.environ.get(ENV, "").rpartition(":")[0] == point


def hit(point: str) -> None:
    """Count a pass through ``point``; SIGKILL this process on the n-th pass if asked to."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    name, _, n = spec.rpartition(":")
    if name != point:
        return
    _counts[point] = _counts.get(point, 0) + 1
    if _counts[point] == int(n):
        os.kill(os.getpid(), signal.SIGKILL)
