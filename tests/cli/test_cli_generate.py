"""``flaxformer-lite generate`` through the command line: a call that cannot fit in memory is
refused in one line before the checkpoint is loaded, the prompt's bytes reach the model as
given (also bytes that are not UTF-8, or a --prompt_file), and a run without a checkpoint ends
with its one-line error and no traceback at exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from subprocess_checks import run_cases

from configs import extrapolation_lm
from flaxformer_lite.base import faults
from flaxformer_lite.train import memory

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny trained run (ALiBi, 4 steps), and a workdir with its config but no checkpoint."""
    from flaxformer_lite.train.loop import train_and_evaluate

    base = tmp_path_factory.mktemp("generate")
    c = extrapolation_lm.get_config("tiny")
    c.model.positional = "alibi"
    c.train.update(num_steps=4, checkpoint_every=2, progress=False)
    c.eval.update(length_multiples=(1,), max_bytes=64)
    train_and_evaluate(c, base / "run")
    empty = base / "no_checkpoint"
    empty.mkdir()
    (empty / "config.json").write_bytes((base / "run" / "config.json").read_bytes())
    return base / "run", empty


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in (memory.ENV, faults.ENV)}
    return out | {"JAX_PLATFORMS": "cpu"}


def generate(*args) -> subprocess.CompletedProcess:
    """The command in a process of its own (its exit is part of the test)."""
    return subprocess.run(
        [sys.executable, "-m", "flaxformer_lite", "generate", *args],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        timeout=120,
    )


def one_line(rc: int, output: str) -> str:
    assert rc == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), output[-3000:]
    return lines[0]


REFUSED = {  # case: (arguments after --workdir, the start of its one line)
    "billion_new_tokens": (
        ["--max_new_tokens=1000000000"],
        "error: --max_new_tokens=1000000000: generating 1000000000 tokens after a 4-token "
        "prompt needs ≈ ",
    ),
    "prompt_too_long": (
        ["--prompt_file={big}"],
        "error: the prompt (100000 tokens): generating 200 tokens after a 100000-token prompt",
    ),
    "empty_prompt": (["--prompt="], "error: --prompt='': give at least one byte"),
    "missing_file": (
        ["--prompt_file=/nonexistent/p"],
        "error: --prompt_file='/nonexistent/p': cannot read it (No such file or directory)",
    ),
    "empty_file": (["--prompt_file=/dev/null"], "error: --prompt_file='/dev/null' is empty"),
    "both": (["--prompt=a", "--prompt_file=/dev/null"], "error: --prompt and --prompt_file"),
    "no_new_tokens": (["--max_new_tokens=0"], "error: --max_new_tokens=0: must be >= 1"),
}


@pytest.fixture(scope="module")
def refusals(workdirs, tmp_path_factory) -> dict[str, dict]:
    big = tmp_path_factory.mktemp("prompt") / "prompt.bin"
    big.write_bytes(b"x" * 100_000)
    argvs = [
        [f"--workdir={workdirs[0]}", *(a.format(big=big) for a in args)]
        for args, _ in REFUSED.values()
    ]
    outcomes = run_cases("scripts/generate.py", argvs, environment=env())
    return dict(zip(REFUSED, outcomes, strict=True))


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_call_that_cannot_run_is_refused_in_one_line(refusals, case):
    line = one_line(refusals[case]["rc"], refusals[case]["output"])
    assert line.startswith(REFUSED[case][1]), line
    if case == "billion_new_tokens":
        assert "; lower --max_new_tokens, or set " + memory.ENV in line
    if case == "prompt_too_long":
        assert "; give a shorter prompt, or set " + memory.ENV in line


def test_prompt_bytes_reach_the_model_as_given(workdirs, tmp_path):
    raw = b"d\xff\xfe \x80ef"  # not UTF-8
    by_argv = generate(f"--workdir={workdirs[0]}", b"--prompt=" + raw, "--max_new_tokens=8")
    assert by_argv.returncode == 0, by_argv.stderr.decode()[-3000:]
    (tmp_path / "p").write_bytes(raw)
    by_file = generate(
        f"--workdir={workdirs[0]}", f"--prompt_file={tmp_path / 'p'}", "--max_new_tokens=8"
    )
    assert by_argv.stdout == by_file.stdout
    shown = raw.decode("utf-8", errors="replace").encode()
    assert by_argv.stdout.startswith(shown) and by_argv.stdout.endswith(b"\n")


def test_a_run_without_a_checkpoint_ends_with_one_line_and_no_traceback(workdirs):
    proc = generate(f"--workdir={workdirs[1]}", "--max_new_tokens=5")
    line = one_line(proc.returncode, proc.stderr.decode())
    assert line == f"error: workdir={str(workdirs[1])!r} has no readable checkpoint"


def _harness(argvs: list[list[str]]) -> list[dict]:
    return run_cases("scripts/generate.py", argvs, environment=env())


def test_a_pretrained_model_continues_text_and_stops_at_the_stop_token(workdirs):
    """--pretrained with a GGUF file: the continuation ends with the first stop token, as
    transformers' generate with that eos_token_id ended it (golden ids of the same file)."""
    import numpy as np

    from flaxformer_lite.pretrained import gguf, gguf_tokenizer

    path = ROOT / "tests" / "pretrained" / "gguf_models" / "llama_q8_0" / "model.gguf"
    tok = gguf_tokenizer.load_tokenizer(gguf.open_gguf(path))
    golden = np.load(path.parent / "golden.npz")
    prompt = tok.decode(golden["prompt_ids"][0].tolist())
    assert tok.encode(prompt, add_special_tokens=True) == golden["prompt_ids"][0].tolist()
    stop = int(golden["stop_token"])
    ok, eos_bytes, both, bad = _harness(
        [
            [f"--pretrained={path}", f"--prompt={prompt}", "--max_new_tokens=12",
             f"--stop_token={stop}"],
            [f"--workdir={workdirs[0]}", "--stop_token=eos"],
            [f"--workdir={workdirs[0]}", f"--pretrained={path}"],
            [f"--pretrained={path}", "--stop_token=end"],
        ]
    )  # fmt: skip
    assert ok["rc"] == 0, ok["output"][-3000:]
    assert ok["output"] == prompt + tok.decode(golden["stopped_ids"][0].tolist()) + "\n"
    assert one_line(eos_bytes["rc"], eos_bytes["output"]).startswith(
        "error: --stop_token=eos: a byte-level run has no end-of-text token"
    )
    assert one_line(both["rc"], both["output"]) == (
        "error: give one of --workdir (a training run) and --pretrained"
    )
    assert one_line(bad["rc"], bad["output"]).startswith("error: --stop_token='end': give 'eos'")
