"""SIGINT and SIGTERM in-process (`base.interrupt`): a signal inside a deferred section waits for
its end, the exit grace is read from its variable and checked, a signal handled inside a
garbage-collector callback is raised in ordinary code, and in-process use arms no watchdog."""

from __future__ import annotations

import gc
import os
import re
import signal
import sys
import time
import traceback

import pytest

from flaxformer_lite.base import interrupt


def test_a_signal_inside_a_deferred_section_waits_for_its_end():
    reached = []
    before = [signal.getsignal(s) for s in interrupt.SIGNALS]
    with interrupt.handling_signals():
        with pytest.raises(interrupt.Interrupted) as raised:
            with interrupt.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # the handler has run by now: held, not raised
                reached.append(True)
        assert reached == [True]
        assert raised.value.exit_status == 143
        with pytest.raises(interrupt.Interrupted) as raised:  # outside: at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        assert raised.value.exit_status == 130
    assert [signal.getsignal(s) for s in interrupt.SIGNALS] == before


def test_exit_grace_is_read_from_its_variable(monkeypatch):
    monkeypatch.delenv(interrupt.GRACE_ENV, raising=False)
    assert interrupt.exit_grace() == interrupt.DEFAULT_GRACE_S == 60.0
    monkeypatch.setenv(interrupt.GRACE_ENV, " 2.5 ")
    assert interrupt.exit_grace() == 2.5
    bad_values = (("0", "0.0"), ("-1", "-1.0"), ("abc", "'abc'"), ("inf", "inf"), ("nan", "nan"))
    for bad, shown in bad_values:
        monkeypatch.setenv(interrupt.GRACE_ENV, bad)
        message = f"{interrupt.GRACE_ENV}={shown}: must be a finite number > 0"
        with pytest.raises(ValueError, match=re.escape(message) + "$"):
            interrupt.exit_grace()
    with pytest.raises(ValueError, match=re.escape("exit_after=0: must be a finite number > 0")):
        with interrupt.handling_signals(exit_after=0):
            pass


def test_a_signal_handled_inside_a_gc_callback_is_not_lost():
    """Python ignores an exception raised in a garbage-collector callback (JAX registers one):
    a signal whose handler runs there is sent again and raised in ordinary code."""
    ran = []

    def callback(phase, info):
        if phase == "start" and not ran:
            ran.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10_000):  # bytecode to run the handler on, inside the callback
                pass

    hook = sys.unraisablehook
    gc.callbacks.append(callback)
    try:
        with interrupt.handling_signals():
            with pytest.raises(interrupt.Interrupted) as raised:
                gc.collect()
                for _ in range(100):
                    time.sleep(0.01)
            assert raised.value.exit_status == 143
            assert ran == [True]
            # the signal came back through the hook, not from the callback's own frame
            assert "callback" not in [f.name for f in traceback.extract_tb(raised.tb)]
    finally:
        gc.callbacks.remove(callback)
    assert sys.unraisablehook is hook


def test_without_exit_after_an_interruption_arms_no_watchdog():
    """In-process use (a notebook, these tests) catches `Interrupted` and goes on: nothing may
    end the process later."""
    with interrupt.handling_signals():
        with pytest.raises(interrupt.Interrupted):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert interrupt._watchdog is None
