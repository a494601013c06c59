"""SIGINT and SIGTERM end a run with one line: where it was, and that rerunning resumes it.

    with interrupt.handling_signals():   # the scripts wrap their work in this
        ...
    # SIGINT / SIGTERM inside -> `Interrupted` (a KeyboardInterrupt: `except Exception` never
    # swallows it); the script prints `describe(e.signum)` and exits with `e.exit_status`.

- `deferred()` marks a section that must not be cut in half (an atomic file write, a
  checkpoint save): a signal arriving inside is held and raised when the section ends, so an
  interruption never leaves a half-written file behind. A second signal inside raises at once.
- `where(run=..., phase=..., step=...)` records what the process is doing (the study runner
  names the cell, the training loop the step and its last checkpoint); `describe` turns it
  into e.g. ``interrupted (SIGINT) at step 5 of cell rope-seed0 (8 steps; resumes from its
  checkpoint at step 4); rerun the same command to resume``.

Outside `handling_signals` nothing changes: SIGINT raises Python's KeyboardInterrupt and SIGTERM
ends the process, as usual. Standard library only.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived inside `handling_signals`."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def exit_status(self) -> int:
        """128 + the signal number (130 for SIGINT, 143 for SIGTERM), as a shell reports it."""
        return 128 + self.signum


_defer_depth = 0
_pending: int | None = None
_where: dict[str, Any] = {}


def _handler(signum: int, frame: Any) -> None:
    global _pending
    if _defer_depth and _pending is None:
        _pending = signum
        return
    raise Interrupted(signum)


@contextlib.contextmanager
def handling_signals() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into `Interrupted` inside (a no-op off the main thread)."""
    global _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, _handler)
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        _pending = None


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold a signal that arrives inside until the section ends (then raise `Interrupted`)."""
    global _defer_depth, _pending
    _defer_depth += 1
    try:
        yield
    finally:
        _defer_depth -= 1
        if _defer_depth == 0 and _pending is not None:
            signum, _pending = _pending, None
            raise Interrupted(signum)


def where(**fields: Any) -> None:
    """Record what the process is doing (a None value forgets the field). Fields: ``run``
    (``"cell rope-seed0"``, ``"the run in runs/x"``), ``phase`` (a gerund phrase the run
    completes: ``"evaluating"``, ``"writing the rows of"``; ``"training"`` uses ``step``,
    ``steps`` and ``checkpoint``)."""
    for key, value in fields.items():
        if value is None:
            _where.pop(key, None)
        else:
            _where[key] = value


def describe(signum: int | None = None) -> str:
    """The one line to print when a run is interrupted (see the module docstring)."""
    name = f" ({signal.Signals(signum).name})" if signum is not None else ""
    run, phase = _where.get("run"), _where.get("phase")
    if phase == "training" and "step" in _where:
        text = f"interrupted{name} at step {_where['step']}" + (f" of {run}" if run else "")
        checkpoint = _where.get("checkpoint")
        resume = (
            f"resumes from its checkpoint at step {checkpoint}"
            if checkpoint
            else "no checkpoint yet: resumes from step 0"
        )
        text += f" ({_where['steps']} steps; {resume})" if "steps" in _where else f" ({resume})"
    elif phase:
        text = f"interrupted{name} while {phase}" + (f" {run}" if run else "")
    else:
        text = f"interrupted{name}" + (f" in {run}" if run else "")
    return f"{text}; rerun the same command to resume"
