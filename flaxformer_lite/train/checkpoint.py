"""Checkpoints with orbax-checkpoint's ``CheckpointManager`` (no pickle anywhere).

Orbax writes each step into a temporary directory and renames it when complete, so a process
killed mid-save leaves no half-written step behind. Each step also stores a digest (CRC-32 of
every array's bytes, with its shape and dtype) and is verified against it on restore: a
truncated, corrupted or foreign step is rejected even when orbax would decode it (a flipped
byte in a compressed chunk can decode to wrong numbers). `Checkpointer.restore_latest` then
warns and falls back to the previous step, and to a fresh start if none can be read; the
state it returns is always one whole, verified step, never a mix.

Only this run's checkpoints are touched. ``checkpoints/`` must be a real folder: a symbolic
link (say, to a bigger disk) is refused (`refuse_link`), because orbax would restore from, and
delete old steps in, whatever it points to. A folder in it named like a step but without
orbax's own files (``_CHECKPOINT_METADATA``, or this project's ``state/`` and ``digest/``
items) is not a step: the ``Checkpointer`` refuses to start rather than let orbax take it
for an unreadable step and delete it (`foreign_steps`); `remove_steps` (a restart in place)
removes the steps and orbax's temporary folders, nothing else.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import shutil
import sys
import time
import warnings
import zlib
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from flaxformer_lite.base import faults, interrupt
from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.base.io import UnsafeFileError, write_error

log = logging.getLogger(__name__)


class CorruptCheckpointError(ValueError):
    """A checkpoint step decoded, but its arrays do not match the digest saved with them."""


# What orbax writes into every step folder of this project (any one of them marks a step).
STEP_MARKERS = ("_CHECKPOINT_METADATA", "commit_success.txt", "state", "digest")
_TEMPORARY = ".orbax-checkpoint-tmp"


class LinkedFolderError(UnsafeFileError):
    """A folder the run writes into (``checkpoints/``) is a symbolic link: refused."""

    @property
    def hint(self) -> str:
        return (
            "a run never reads or writes its state through a link (orbax would restore from, "
            "and delete old steps in, whatever it points to); put the folder itself there, or "
            "give a --workdir on that disk"
        )


class ForeignStepsError(ConfigError):
    """``checkpoints/`` holds folders named like steps that orbax did not write."""


def refuse_link(path: str | Path) -> None:
    """Raise `LinkedFolderError` if ``path`` (a folder a run writes into) is a symbolic link."""
    path = Path(path)
    if path.is_symlink():
        raise LinkedFolderError(path, f"a symbolic link (to {os.readlink(path)})")


def check_folder(directory: str | Path) -> None:
    """Refuse, in one line, a checkpoint folder orbax must not read or clean up: a symbolic
    link (`refuse_link`), or one holding step-named folders it did not write
    (`foreign_steps`). An absent folder passes."""
    directory = Path(directory).absolute()
    refuse_link(directory)
    foreign = foreign_steps(directory)
    if foreign:
        shown = ", ".join(f"{name}/" for name in foreign[:5])
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        raise ForeignStepsError(
            f"{directory} holds {shown}{more}, named like checkpoint steps but not "
            "written by a run (no orbax checkpoint files in them); orbax would take them "
            f"for unreadable steps and delete them: move them out of {directory} "
            "and rerun"
        )


def is_step(path: Path) -> bool:
    """Whether ``path`` is a step folder orbax wrote: an integer name and at least one of
    `STEP_MARKERS` inside (a corrupted step keeps most of them)."""
    return (
        path.name.isdigit()
        and path.is_dir()
        and not path.is_symlink()
        and any(os.path.lexists(path / marker) for marker in STEP_MARKERS)
    )


def foreign_steps(directory: str | Path) -> list[str]:
    """The entries of ``directory`` that orbax would list as steps (integer names) but that
    hold none of its files: a user's folders, never to be read or deleted as checkpoints."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(
        (p.name for p in directory.iterdir() if p.name.isdigit() and not is_step(p)), key=int
    )


def remove_steps(directory: str | Path) -> list[str]:
    """Delete this project's steps (`is_step`) and orbax's temporary step folders from the
    checkpoint folder ``directory``, and the folder once empty; return the names of what
    else is in it (left in place)."""
    directory = Path(directory)
    refuse_link(directory)
    kept = []
    for path in sorted(directory.iterdir()):
        if is_step(path) or (_TEMPORARY in path.name and path.is_dir() and not path.is_symlink()):
            shutil.rmtree(path)
        else:
            kept.append(path.name)
    if not kept:
        directory.rmdir()
    return kept


def state_digest(state: Any) -> dict[str, str] | None:
    """``{tree path: "dtype[shape]:crc32"}`` of every leaf, or None for multi-host arrays.

    The bytes are read on the host (as orbax does when saving); arrays sharded over devices
    of several processes are not fully addressable here and are not digested.
    """
    leaves = jax.tree_util.tree_leaves_with_path(state)
    out = {}
    for path, leaf in leaves:
        if isinstance(leaf, jax.Array):
            if not leaf.is_fully_addressable:
                return None
            if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                leaf = jax.random.key_data(leaf)
        a = np.asarray(jax.device_get(leaf))
        crc = zlib.crc32(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
        out[jax.tree_util.keystr(path)] = f"{a.dtype}{list(a.shape)}:{crc:08x}"
    return out


def _first_difference(saved: dict[str, str], restored: dict[str, str]) -> str:
    for key in sorted(set(saved) | set(restored)):
        if saved.get(key) != restored.get(key):
            return f"{key}: saved {saved.get(key)}, read {restored.get(key)}"
    return "none"


class Checkpointer:
    """Save and restore the training state (a pytree) under ``directory``."""

    def __init__(self, directory: str | Path, *, keep: int):
        self.directory = Path(directory).absolute()
        check_folder(self.directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=True,
            enable_async_checkpointing=False,
            cleanup_tmp_directories=True,  # a save killed midway leaves one behind
            **_fault_options(),
        )
        self.manager = ocp.CheckpointManager(
            self.directory, item_names=("state", "digest"), options=options
        )
        self.unreadable: set[int] = set()  # steps restore_latest had to skip

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: Any) -> None:
        """Write ``state`` as step ``step`` (synchronously; returns when it is on disk).

        An existing step is kept, unless `restore_latest` found it unreadable: then this
        state (recomputed from an earlier step) replaces it. A signal arriving meanwhile waits
        until the step is committed (`interrupt.deferred`); an OS error (disk full, ...)
        removes the step's temporary directory and is raised as `io.StateWriteError`.
        """
        if step in self.manager.all_steps():
            if step not in self.unreadable:
                return
            self.manager.delete(step)
            self.unreadable.discard(step)
        digest = {"step": int(step), "leaves": state_digest(state)}
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state), digest=ocp.args.JsonSave(digest)
        )
        _quiet_closed_event_loops()
        with interrupt.deferred():
            try:
                with _orbax_errors_held() as held:
                    self.manager.save(step, args=args, force=True)
                    self.manager.wait_until_finished()
            except Exception as e:
                self._remove_temporary(step)
                _forget_abandoned_writes()
                error = write_error(e, self.directory / str(step))
                if error.errno is None:  # not an OS error: orbax's own, say it as it is
                    raise
                raise error from e
            for record in held:  # the save succeeded after all: show what orbax logged
                logging.getLogger(record.name).handle(record)
            interrupt.where(checkpoint=step)  # before a held signal is raised

    def _remove_temporary(self, step: int) -> None:
        """Remove the temporary directory of a failed save of ``step``; TensorStore may still
        finish writes it had in flight into it, so look again for up to two seconds."""
        for _ in range(20):
            leftovers = list(self.directory.glob(f"{step}.orbax-checkpoint-tmp*"))
            for tmp in leftovers:
                shutil.rmtree(tmp, ignore_errors=True)
            if not leftovers:
                return
            time.sleep(0.1)

    def restore(self, step: int, abstract_state: Any) -> Any:
        """The state of ``step``, verified against its digest.

        Raises whatever orbax raises for an unreadable step, or `CorruptCheckpointError`.
        A leaf of ``abstract_state`` without a sharding (e.g. a ``jax.ShapeDtypeStruct``)
        is restored onto the first local device, also when the step was written on another
        topology (by several processes).
        """
        local = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state, fallback_sharding=local),
            digest=ocp.args.JsonRestore(),
        )
        restored = self.manager.restore(step, args=args)
        saved = restored["digest"]
        if not isinstance(saved, dict) or saved.get("step") != step:
            raise CorruptCheckpointError(f"step {step}: its digest names step {saved!r}")
        state = restored["state"]
        if saved.get("leaves") is not None:
            digest = state_digest(state)
            if digest is not None and digest != saved["leaves"]:
                raise CorruptCheckpointError(
                    f"step {step}: arrays differ from their saved digest "
                    f"(first: {_first_difference(saved['leaves'], digest)})"
                )
        return state

    def restore_latest(self, abstract_state: Any) -> tuple[Any, int] | None:
        """``(state, step)`` of the newest readable checkpoint, or None if there is none.

        ``abstract_state`` gives the tree structure, shapes and dtypes (e.g. a fresh state);
        it is never modified. Each unreadable step is skipped with a `RuntimeWarning`.
        """
        for step in reversed(self.steps()):
            try:
                state = self.restore(step, abstract_state)
            except Exception as e:
                self.unreadable.add(step)
                _collect_quietly()
                warnings.warn(
                    f"checkpoint step {step} in {self.directory} is unreadable "
                    f"({type(e).__name__}: {str(e)[:200]}); falling back to an earlier one",
                    RuntimeWarning,
                    stacklevel=2,
                )
                continue
            return state, step
        if self.steps():
            warnings.warn(
                f"no readable checkpoint in {self.directory}; starting from scratch",
                RuntimeWarning,
                stacklevel=2,
            )
        return None

    def close(self) -> None:
        """Wait for orbax's background work and close the manager. Its constructor starts a
        thread that removes temporary directories of earlier runs, which ``close`` does not
        wait for: a process exiting right after (a command refusing a workdir without
        checkpoints) would print that thread's traceback at interpreter shutdown."""
        cleanup = getattr(self.manager, "_maybe_await_cleanup_tmp_directory", None)
        if cleanup is not None:
            try:
                cleanup()
            except Exception:  # best effort: a leftover temporary directory is harmless
                pass
        self.manager.close()


@contextlib.contextmanager
def _orbax_errors_held():
    """Hold back the ERROR records (with tracebacks) that orbax's worker threads log before
    a failed save raises: the caller raises one error naming the step instead. Yields the list
    of held records."""
    held: list[logging.LogRecord] = []

    def keep(record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and "orbax" in record.pathname:
            held.append(record)
            return False
        return True

    logger = logging.getLogger("absl")
    logger.addFilter(keep)
    try:
        yield held
    finally:
        logger.removeFilter(keep)


def _quiet_closed_event_loops() -> None:
    """When a save fails (disk full), TensorStore completes the writes it had in flight and
    calls back into orbax's event loop, already closed: Python would print an "Event loop is
    closed" traceback for each (dozens). From the first save on, drop those, and only those,
    unraisables (they never mean anything else)."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_closed_event_loops", False):
        return

    def hook(unraisable) -> None:
        error = unraisable.exc_value
        if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
            return
        previous(unraisable)

    hook.drops_closed_event_loops = True
    sys.unraisablehook = hook
    # The failed save's gathered write futures are garbage-collected later; asyncio then
    # logs "exception was never retrieved" with TensorStore's traceback: drop those records
    # (only for orbax's OCDBT writes: the error itself was already raised, naming the file).
    logging.getLogger("asyncio").addFilter(_unretrieved_orbax_write)


def _unretrieved_orbax_write(record: logging.LogRecord) -> bool:
    """False (drop) for asyncio's "exception was never retrieved" record of an orbax write."""
    message = record.getMessage()
    return not ("exception was never retrieved" in message and "OCDBT" in message)


def _forget_abandoned_writes() -> None:
    """After a failed save, orbax's gathered write coroutines that were never started are
    collected later (often at interpreter exit), each with a "coroutine ... was never
    awaited" RuntimeWarning printed after the error line: the error already names the step,
    so collect them now and silence that warning, and only that one, for the rest of the
    process (it is about to stop with the error)."""
    warnings.filterwarnings(
        "ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning
    )
    _collect_quietly()


def _collect_quietly() -> None:
    """A failed orbax read leaves un-awaited read coroutines behind: collect them now, without
    the traceback Python prints for each one when it is garbage-collected later."""
    hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: None
    try:
        gc.collect()
    finally:
        sys.unraisablehook = hook


def _fault_options() -> dict[str, Any]:
    """Test-only (`faults`): a temporary-path class that can be killed just before commit."""
    if not faults.armed("checkpoint_save"):
        return {}
    from orbax.checkpoint._src.path import atomicity

    class KillBeforeCommit(atomicity.AtomicRenameTemporaryPath):
        async def finalize(self, *args, **kwargs):
            if self._final_path.name.isdigit():  # the step directory, not one of its items
                faults.hit("checkpoint_save")
            return await super().finalize(*args, **kwargs)

    return {"temporary_path_class": KillBeforeCommit}
