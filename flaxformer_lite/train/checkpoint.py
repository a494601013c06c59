"""Checkpoints with orbax-checkpoint's ``CheckpointManager`` (no pickle anywhere).

Orbax writes each step into a temporary directory and renames it when complete, so a process
killed mid-save leaves no half-written step behind. If the newest step is nevertheless
unreadable (truncated or corrupted files), `Checkpointer.restore_latest` warns and falls back
to the previous one, and to a fresh start if none can be read; it never mixes states.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class Checkpointer:
    """Save and restore the training state (a pytree) under ``directory``."""

    def __init__(self, directory: str | Path, *, keep: int):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=False
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: Any) -> None:
        """Write ``state`` as step ``step`` (synchronously; returns when it is on disk)."""
        if step in self.manager.all_steps():
            return
        self.manager.save(step, args=ocp.args.StandardSave(state), force=True)
        self.manager.wait_until_finished()

    def restore_latest(self, abstract_state: Any) -> tuple[Any, int] | None:
        """``(state, step)`` of the newest readable checkpoint, or None if there is none.

        ``abstract_state`` gives the tree structure, shapes and dtypes (e.g. a fresh state).
        """
        for step in reversed(self.steps()):
            try:
                state = self.manager.restore(step, args=ocp.args.StandardRestore(abstract_state))
            except Exception as e:
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
        self.manager.close()
