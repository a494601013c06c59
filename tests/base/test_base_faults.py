"""The test-only fault hook (`base.faults`): every valid value parses, and any other value of
``FLAXFORMER_LITE_FAULT`` is refused in one line naming the variable, the value and what is
allowed -- in Python and through the command line, before any work."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flaxformer_lite.base import faults
from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.base.io import StateWriteError, write_error

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("train_step:3", ("train_step", 3, "SIGKILL")),
        ("checkpoint_save:1:SIGTERM", ("checkpoint_save", 1, "SIGTERM")),
        ("eval_batch:2:SIGINT", ("eval_batch", 2, "SIGINT")),
        ("write:eval.json:1:EIO", ("write:eval.json", 1, "EIO")),
        ("write:rows.jsonl:2", ("write:rows.jsonl", 2, "SIGKILL")),
    ],
)
def test_valid_values_parse(spec, parsed):
    assert faults._parse(spec) == parsed


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("bogus", "no <n>"),
        ("train_step:x", "<n>='x' is not an int >= 1"),
        ("train_step:0", "<n>='0' is not an int >= 1"),
        ("train_stpe:1", "unknown point 'train_stpe'"),
        ("write::1", "unknown point 'write:'"),
        ("eval_batch:1:SIGFOO", "unknown action 'SIGFOO'"),
        ("write:eval.json:1:ENOPE", "unknown action 'ENOPE'"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable_value_and_allowed(spec, problem, monkeypatch):
    monkeypatch.setenv(faults.ENV, spec)
    for call in (faults.check, lambda: faults.hit("train_step"), lambda: faults.armed("x")):
        with pytest.raises(ConfigError) as raised:
            call()
        message = str(raised.value)
        assert message.startswith(f"{faults.ENV}={spec!r}: {problem}; must be <point>:<n>")
        assert "train_step, checkpoint_save, eval_batch, write:<file name>" in message
        assert "SIGKILL (the default), SIGINT, SIGTERM or an errno name" in message
        assert "\n" not in message


def test_a_bad_value_stops_the_command_before_any_work(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu") | {faults.ENV: "train_step:x"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "flaxformer_lite",
            "train",
            "--config=extrapolation_lm:tiny",
            f"--workdir={tmp_path / 'w'}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(f"error: {faults.ENV}='train_step:x': <n>='x' is not an int")
    assert not (tmp_path / "w").exists()


def test_a_failed_checkpoint_write_names_the_file_inside_the_step(tmp_path):
    step = tmp_path / "checkpoints" / "4"
    inner = f"{step}.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/ocdbt.process_0/d/3f2a"
    message = (
        'OUT_OF_RANGE: Error writing "x" in OCDBT database at local file '
        f'"{step}.orbax-checkpoint-tmp/state/": Failed writing: "{inner}": Failed to write '
        "97384 bytes to file 24: No space left on device [os_error_code='28']"
    )
    error = write_error(ValueError(message), step)
    assert isinstance(error, StateWriteError) and error.errno == errno.ENOSPC
    assert str(error) == (
        f"cannot write {step}: [Errno 28] No space left on device (writing {inner})"
    )
    # a plain OS error naming a file inside the step's directory
    error = write_error(OSError(errno.ENOSPC, "No space left on device", f"{step}/digest"), step)
    assert str(error).endswith(f"(writing {step}/digest)")
    # an atomic write's temporary file is not named: the file is
    tmp = tmp_path / ".eval.json.tmp12"
    error = write_error(
        OSError(errno.ENOSPC, "No space left on device", str(tmp)), tmp_path / "eval.json"
    )
    assert (
        str(error) == f"cannot write {tmp_path / 'eval.json'}: [Errno 28] No space left on device"
    )
