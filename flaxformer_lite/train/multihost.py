"""One run on several processes (``config.mesh.multihost``): who writes, and how they agree.

Every process (one per host) runs the same program on one shared workdir. Training steps and
checkpoint saves and restores are collective: every process takes part (orbax writes each
process's shards and commits the step once). The run's own files (identity, config, metrics,
TensorBoard events, ``eval.json``) are written by process 0 alone (`is_primary`), and every
decision that reads the workdir -- may this workdir hold the run, is the lock free, is the
run finished -- is taken by process 0 and shared (`on_process_0`), so every process takes
the same branch, raises the same error or returns the same result, and no process reads a
file while process 0 is writing it.

On one process every helper is the plain call: `on_process_0(fn)` is ``fn()``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import numpy as np

from flaxformer_lite.base.checks import ConfigError

T = TypeVar("T")


def is_primary() -> bool:
    """True on process 0 (and on a single process): the one that writes the run's files."""
    return jax.process_index() == 0


def broadcast_text(text: str) -> str:
    """Process 0's ``text`` on every process (the others' argument is ignored).

    A collective: every process must call it, in the same order.
    """
    if jax.process_count() == 1:
        return text
    from jax.experimental import multihost_utils

    # bytes as int32 (broadcast_one_to_all sums the source's values with zeros), with a
    # leading 1 so that an empty text is not an empty array
    data = np.frombuffer(text.encode("utf-8"), np.uint8) if is_primary() else np.zeros(0, np.uint8)
    data = np.concatenate([[1], data]).astype(np.int32)
    size = int(multihost_utils.broadcast_one_to_all(np.int32(data.size)))
    if not is_primary():
        data = np.zeros(size, np.int32)
    out = np.asarray(multihost_utils.broadcast_one_to_all(data))
    return out[1:].astype(np.uint8).tobytes().decode("utf-8")


def on_process_0(fn: Callable[[], T]) -> T:
    """``fn()`` on process 0 alone, its outcome on every process.

    On several processes (a collective: every process calls it, in the same order) ``fn``'s
    value goes through JSON (``default=str``), and every process, process 0 included, returns
    the same decoded value. If ``fn`` raises, process 0 raises its error and every other
    process raises one with the same message: a `ConfigError` (the scripts' one-line refusal)
    for a `ConfigError`, else a `RuntimeError` naming process 0 and the error's type.
    """
    if jax.process_count() == 1:
        return fn()
    outcome: dict[str, Any] = {}
    error = None
    if is_primary():
        try:
            outcome["value"] = fn()
        except Exception as e:  # shared below, then raised on every process
            error = e
            outcome["error"] = [type(e).__name__, isinstance(e, ConfigError), str(e)]
    shared = json.loads(broadcast_text(json.dumps(outcome, default=str)))
    if error is not None:
        raise error
    if "error" in shared:
        name, config_error, message = shared["error"]
        if config_error:
            raise ConfigError(message)
        raise RuntimeError(f"process 0 failed with {name}: {message}")
    return shared["value"]


def check_same(value: int, what: str) -> None:
    """Raise `RuntimeError` on every process unless all processes hold the same ``value``
    (a collective on several processes; nothing on one)."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    values = np.asarray(multihost_utils.process_allgather(np.int32(value))).reshape(-1)
    if len(set(values.tolist())) > 1:
        raise RuntimeError(
            f"the processes disagree on {what}: {values.tolist()} (by process index); "
            "do all hosts see the same workdir (a shared file system)?"
        )
