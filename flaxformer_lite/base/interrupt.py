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

- A signal whose handler runs inside code where Python ignores exceptions (a garbage-collector
  callback such as JAX's ``_xla_gc_callback``, a ``__del__``, a weakref callback) would be lost:
  the interpreter prints "Exception ignored in ..." and goes on. Inside `handling_signals`, such
  a lost `Interrupted` has its signal sent again (from a helper thread), so that it is raised
  at the next point of ordinary code.
- `handling_signals(exit_after=S)` (what the commands use, via `cli.one_line_failures`) also
  bounds the time an interrupted process takes to end: S seconds after `Interrupted` is raised,
  a watchdog thread ends the process with the same status (128 + the signal number) and, if the
  command has not printed it yet (`report`), the `describe` line. The cleanup an interruption
  runs (``finally`` blocks, closing the checkpointer, joining threads at interpreter exit)
  takes well under a second; an exception raised at an arbitrary point can still leave a
  thread waiting for ever, and an interrupted run must end. Everything the process writes is
  atomic (files, checkpoints), so ending it then loses nothing the interruption did not.
  ``FLAXFORMER_LITE_EXIT_GRACE`` sets S for the commands (default 60 seconds).

Outside `handling_signals` nothing changes: SIGINT raises Python's KeyboardInterrupt and SIGTERM
ends the process, as usual. Standard library only (and `base.checks`).
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from flaxformer_lite.base.checks import check_positive_number

SIGNALS = (signal.SIGINT, signal.SIGTERM)
GRACE_ENV = "FLAXFORMER_LITE_EXIT_GRACE"
DEFAULT_GRACE_S = 60.0


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
_exit_after: float | None = None  # seconds: the watchdog's deadline (`handling_signals`)
_watchdog: threading.Timer | None = None
_reported = False


def _handler(signum: int, frame: Any) -> None:
    global _pending
    if _defer_depth and _pending is None:
        _pending = signum
        return
    _raise(signum)


def _raise(signum: int) -> None:
    global _watchdog
    if _exit_after is not None and _watchdog is None:
        _watchdog = threading.Timer(_exit_after, _end_process, args=(signum, _exit_after))
        _watchdog.daemon = True
        _watchdog.start()
    raise Interrupted(signum)


def _unraisable(hook: Any, unraisable: Any) -> None:
    """``sys.unraisablehook`` inside `handling_signals`: an `Interrupted` that Python would drop
    (raised in a gc callback, ``__del__`` ...) is sent again as its signal; the rest goes to the
    previous hook."""
    if isinstance(unraisable.exc_value, Interrupted):
        # Sent from here, or from a thread this hook waits for (`Thread.start` waits), the
        # handler would run at once, inside the hook, and its exception would be dropped again.
        _thread.start_new_thread(_send_again, (unraisable.exc_value.signum,))
        return
    hook(unraisable)


def _send_again(signum: int) -> None:
    time.sleep(0.01)  # the main thread leaves the code that dropped it (it retries if not)
    os.kill(os.getpid(), signum)


def _end_process(signum: int, seconds: float) -> None:
    """The watchdog: the interrupted process has not ended ``seconds`` after `Interrupted`."""
    if not _reported:
        name = signal.Signals(signum).name
        print(
            f"warning: the process did not end within {seconds:g} s of {name}; "
            f"ending it now (set {GRACE_ENV} to wait longer)",
            file=sys.stderr,
        )
        print(describe(signum), file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(128 + signum)


def exit_grace() -> float:
    """Seconds from ``FLAXFORMER_LITE_EXIT_GRACE`` (default 60), for ``exit_after``.

    Raises:
      ValueError: naming the variable and its value, when it is not a finite number > 0.
    """
    text = os.environ.get(GRACE_ENV, "").strip()
    if not text:
        return DEFAULT_GRACE_S
    try:
        value: Any = float(text)
    except ValueError:
        value = text
    return check_positive_number(GRACE_ENV, value)


def report(signum: int) -> None:
    """Print the `describe` line to stderr (once: the watchdog then prints nothing)."""
    global _reported
    _reported = True
    print(describe(signum), file=sys.stderr)


@contextlib.contextmanager
def handling_signals(exit_after: float | None = None) -> Iterator[None]:
    """Turn SIGINT and SIGTERM into `Interrupted` inside (a no-op off the main thread).

    Args:
      exit_after: seconds; if given, the process ends with status ``128 + signum`` this long
        after an `Interrupted` is raised, whatever it is doing then (see the module
        docstring). Only for a process that exits on an interruption anyway (the commands);
        None (default) for code that catches `Interrupted` and goes on.
    """
    global _pending, _exit_after
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if exit_after is not None:
        exit_after = check_positive_number("exit_after", exit_after)
    old = {s: signal.getsignal(s) for s in SIGNALS}
    old_exit_after, _exit_after = _exit_after, exit_after
    old_hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: _unraisable(old_hook, unraisable)
    for s in SIGNALS:
        signal.signal(s, _handler)
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        sys.unraisablehook = old_hook
        _pending = None
        _exit_after = old_exit_after


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
            _raise(signum)


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
