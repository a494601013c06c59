"""A pretrained model's ``train`` workdir (nothing trained: the model is loaded and
evaluated) through the commands a user runs next: ``report`` tabulates it, ``generate`` says
it has no checkpoint. The committed tiny GPT-2 (tests/pretrained/hf_models/), L = 16."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from subprocess_checks import env

from configs import pretrained
from flaxformer_lite.train import loop

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "pretrained" / "hf_models"


def gpt2_config(source: Path):
    c = pretrained.get_config("tiny")
    c.pretrained.source = str(source)
    c.data.train_length = 16
    c.eval.update(length_multiples=(1, 2), max_bytes=512, protocols=("nonoverlapping",))
    return c


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory) -> tuple[Path, Path, dict]:
    """``(model folder, workdir, summary)`` of `train_and_evaluate` on a copy of gpt2."""
    base = tmp_path_factory.mktemp("pretrained_run")
    shutil.copytree(MODELS / "gpt2", base / "gpt2")
    summary = loop.train_and_evaluate(gpt2_config(base / "gpt2"), base / "run")
    return base / "gpt2", base / "run", summary


def command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flaxformer_lite", *args],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_report_tabulates_it_and_generate_says_it_has_no_checkpoint(evaluated, tmp_path):
    _, workdir, summary = evaluated
    report = command("report", str(workdir), f"--out={tmp_path}", "--noplots")
    assert report.returncode == 0, report.stderr[-3000:]
    with open(tmp_path / "tables" / "bits_per_byte_nonoverlapping.csv") as f:
        cells = {int(r["eval_length"]): float(r["mean"]) for r in csv.DictReader(f)}
    assert cells == pytest.approx({r["eval_length"]: r["bits_per_byte"] for r in summary["eval"]})

    generate = command("generate", f"--workdir={workdir}", "--max_new_tokens=4")
    lines = [line for line in generate.stderr.splitlines() if line.strip()]
    assert generate.returncode == 2 and len(lines) == 1, generate.stderr[-3000:]
    assert lines[0] == (
        f"error: workdir={str(workdir)!r}: this run has no checkpoint: it evaluated a loaded "
        f"model ({json.loads((workdir / 'config.json').read_text())['pretrained']['source']}); "
        "load that model with flaxformer_lite.load_pretrained"
    )
