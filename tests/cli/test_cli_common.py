"""`common.run_command` under a signal: an interrupted command ends with status 143 and its one line
within ``FLAXFORMER_LITE_EXIT_GRACE`` seconds even when its cleanup hangs, and an interactive
session (IPython, a notebook) never arms the watchdog. Each case runs a small script in a
subprocess."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from subprocess_checks import env

from flaxformer_lite.base import interrupt

ROOT = Path(__file__).resolve().parents[2]

HANGING_COMMAND = """
import os, signal, sys, threading, time
from flaxformer_lite.base import interrupt
from flaxformer_lite.cli import common

MODE = sys.argv[1]  # run_command replaces sys.argv

def main(argv):
    with common.one_line_failures():
        interrupt.where(run="cell x", phase="evaluating")
        if MODE == "shutdown":  # a thread that interpreter exit waits for, for ever
            threading.Thread(target=threading.Event().wait).start()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(60)
        finally:
            if MODE == "cleanup":  # a finally block that never ends
                threading.Event().wait()

common.run_command(main, doc="test", module=__name__, argv=["hang"])
"""


@pytest.mark.parametrize("hang", ["cleanup", "shutdown"])
def test_an_interrupted_command_ends_even_when_its_cleanup_hangs(tmp_path, hang):
    """A command ends ``FLAXFORMER_LITE_EXIT_GRACE`` seconds after SIGTERM with status 143
    and the one line, though a ``finally`` block or a thread at interpreter exit never ends."""
    script = tmp_path / "hang.py"
    script.write_text(HANGING_COMMAND)
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(script), hang],
        cwd=ROOT,
        env=env(**{interrupt.GRACE_ENV: "1"}),
        capture_output=True,
        text=True,
        timeout=120,  # without the watchdog: TimeoutExpired
    )
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert time.monotonic() - t0 < 60
    lines = proc.stderr.strip().splitlines()
    line = "interrupted (SIGTERM) while evaluating cell x; rerun the same command to resume"
    assert lines[-1] == line and lines.count(line) == 1, proc.stderr[-3000:]
    warned = "warning: the process did not end within 1 s of SIGTERM"
    # the command printed its line before exit hung: the watchdog adds nothing
    assert any(x.startswith(warned) for x in lines) is (hang == "cleanup"), lines


SESSION_COMMAND = """
import sys, types
from flaxformer_lite.cli import common

shell = types.ModuleType("IPython")  # imported (tqdm.auto imports it); a shell only if running
shell.get_ipython = (lambda: object()) if sys.argv[1] == "shell" else (lambda: None)
sys.modules["IPython"] = shell
common.run_command(
    lambda argv: print(common._running_a_command), doc="test", module=__name__, argv=["p"]
)
"""


def test_an_interactive_session_never_arms_the_watchdog(tmp_path):
    """`run_command` in IPython / a notebook: its SystemExit does not end the kernel, so no
    watchdog may end it later; a command line arms it."""
    script = tmp_path / "session.py"
    script.write_text(SESSION_COMMAND)
    for session, armed in (("shell", "False"), ("none", "True")):
        proc = subprocess.run(
            [sys.executable, str(script), session], cwd=ROOT, env=env(), capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0 and proc.stdout.strip() == armed, proc.stderr[-3000:]
