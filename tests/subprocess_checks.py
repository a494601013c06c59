"""Helpers for tests that run a command in a subprocess and check how it fails: its
environment (``env``), its one last line of stderr (``last_line``), a run under a file-size
limit or with file permissions enforced (``restricted``), and the temporary files an
interrupted write could leave (``temporary_files``). A plain module, as `tiny_models` is:
``from subprocess_checks import env, last_line``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from flaxformer_lite.base import faults

# A study as a user runs it: tiny preset, the rope and alibi cells, 8 steps, checkpoints at 4
# and 8, both evaluation protocols (tests/integration/test_integration_kill_resume.py).
STUDY_ARGS = (
    "--config=configs/extrapolation_lm.py:tiny",
    "--only=alibi,rope",  # cells in sweep order: rope-seed0, then alibi-seed0
    "--config.train.num_steps=8",
    "--config.train.checkpoint_every=4",
    "--config.eval.length_multiples=(1,2)",
    "--config.eval.max_bytes=512",  # 4 + 2 evaluation batches per cell
    "--config.eval.protocols=('nonoverlapping','context')",
    "--config.eval.context_multiples=(1,2)",  # c = 16, 32: 8 target blocks of 8 bytes
    "--config.eval.context_targets=64",
    "--progress=false",
)


def env(**extra: str) -> dict[str, str]:
    """This environment without a fault to inject, on the CPU, with ``extra`` added."""
    out = {k: v for k, v in os.environ.items() if k != faults.ENV}
    return out | {"JAX_PLATFORMS": "cpu"} | extra


def last_line(proc) -> str:
    """The last line of stderr, after checking that no traceback came before it."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert lines, f"rc {proc.returncode}, empty stderr"
    return lines[-1]


def temporary_files(directory: Path) -> list[Path]:
    """Temporary files of atomic writes and orbax temporary checkpoint directories."""
    return [p for p in directory.rglob("*") if re.search(r"\.tmp\d*$|orbax-checkpoint-tmp", p.name)]


RESTRICT = """
import ctypes, os, resource, sys
fsize, read_only, cmd = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3:]
if fsize:  # Python ignores SIGXFSZ: a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
if read_only and os.geteuid() == 0:  # root: give up ignoring file permissions
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        libc.prctl(24, capability, 0, 0, 0)  # PR_CAPBSET_DROP: gone after the exec
os.execv(cmd[0], cmd)
"""


def restricted(cmd: list[str], *, fsize: int = 0, read_only: bool = False) -> list[str]:
    """``cmd`` run under a file-size limit (a small disk) or, for root, with file permissions
    enforced (a read-only directory is read-only to it too); no ``preexec_fn`` (a fork of this
    multithreaded process)."""
    return [sys.executable, "-c", RESTRICT, str(fsize), str(int(read_only)), *cmd]


# The command-line harness: run as ``python -c HARNESS SCRIPT CASES`` with SCRIPT
# scripts/run_study.py, scripts/train.py or scripts/generate.py and CASES a JSON list of
# argument lists (or @FILE holding one: a command line caps one argument at 128 KiB), it imports
# the script's command once and forks a child per case, which calls the command's ``run``
# as ``python SCRIPT ARGS`` does; it prints RESULTS and a JSON list of {"rc", "output"}.
HARNESS = r"""
import importlib.util, json, os, sys, tempfile, traceback
script, cases = sys.argv[1], sys.argv[2]
cases = json.loads(open(cases[1:]).read() if cases.startswith("@") else cases)
command = {"run_study.py": "study", "train.py": "train", "generate.py": "generate"}[
    os.path.basename(script)
]
module = importlib.import_module("flaxformer_lite.cli." + command)
out = []
for args in cases:
    with tempfile.TemporaryFile("w+") as log:
        pid = os.fork()
        if pid == 0:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            code = 0
            try:
                module.run([script, *args], prog="python " + script)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        log.seek(0)
        out.append({"rc": os.waitstatus_to_exitcode(status), "output": log.read()})
print("RESULTS" + json.dumps(out))
"""


ROOT = Path(__file__).resolve().parent.parent


def run_cases(
    script: str, cases: list[list[str]], *, environment: dict[str, str] | None = None
) -> list[dict]:
    """``python SCRIPT ARGS`` for each argument list of ``cases`` through `HARNESS` (one
    import of the command, a forked child per case), in the repository root with
    ``environment`` (default `env`): ``[{"rc", "output"}]``, in the order of ``cases``."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cases, f)  # a file: a command line caps one argument at 128 KiB
    try:
        proc = subprocess.run(
            [sys.executable, "-c", HARNESS, script, "@" + f.name],
            cwd=ROOT,
            env=env() if environment is None else environment,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        os.unlink(f.name)
    assert proc.returncode == 0 and "RESULTS" in proc.stdout, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("RESULTS", 1)[1])
