"""A pretrained model's ``train`` workdir (nothing trained: the model is loaded and
evaluated) through the commands a user runs next: ``report`` tabulates it, ``generate`` says
it has no checkpoint, and ``train`` again continues it only for a model of the same content
(the folder may move; weights changed are refused). The committed tiny GPT-2
(tests/pretrained/hf_models/), L = 16."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from subprocess_checks import env, run_cases

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


TRAIN_ARGS = (  # `gpt2_config` as the train command's flags
    "--config=configs/pretrained.py:tiny",
    "--config.data.train_length=16",
    "--config.eval.length_multiples=(1,2)",
    "--config.eval.max_bytes=512",
    "--config.eval.protocols=('nonoverlapping',)",
)


def test_the_identity_of_a_model_is_its_content_not_its_path(evaluated, tmp_path):
    """``flaxformer-lite train`` on the finished workdir: the same folder moved to a new path
    (its files touched: the hashes are computed again) returns the finished result; a weight
    changed (same size, a new time) is refused in one line naming the weights' hash."""
    folder, workdir, _ = evaluated
    moved, changed = tmp_path / "moved" / "gpt2", tmp_path / "changed" / "gpt2"
    shutil.copytree(folder, moved)
    for path in moved.iterdir():
        os.utime(path, ns=(1, 1))  # another time: the cheap check cannot vouch for it
    shutil.copytree(folder, changed)
    data = bytearray((changed / "model.safetensors").read_bytes())
    data[-4:] = bytes(4)  # the last float of the last tensor: 0.0
    (changed / "model.safetensors").write_bytes(bytes(data))
    workdirs = [tmp_path / "w_moved", tmp_path / "w_changed"]
    for copy in workdirs:
        shutil.copytree(workdir, copy)
    finished = (workdir / "eval.json").read_bytes()
    cases = [
        [*TRAIN_ARGS, f"--config.pretrained.source={source}", f"--workdir={copy}"]
        for source, copy in zip((moved, changed), workdirs, strict=True)
    ]
    same, other = run_cases("scripts/train.py", cases)

    assert same["rc"] == 0, same["output"][-3000:]
    assert (workdirs[0] / "eval.json").read_bytes() == finished  # the finished result
    recorded = json.loads((workdirs[0] / "identity.json").read_text())
    assert recorded["recorded"]["pretrained_files"]["model.safetensors"][1] == 1  # the new times

    lines = [line for line in other["output"].splitlines() if line.strip()]
    assert other["rc"] == 2 and len(lines) == 1, other["output"][-3000:]
    assert re.fullmatch(
        rf"error: workdir={re.escape(repr(str(workdirs[1])))} holds a run of a different config "
        r"\(differs in pretrained\.weights_sha256: 'sha256:[0-9a-f]{16}\.\.\.' -> "
        r"'sha256:[0-9a-f]{16}\.\.\.'\); use another --workdir, the same config, or "
        r"--restart_changed to start it afresh in place",
        lines[0],
    ), lines[0]


def test_a_pretrained_runs_identity_holds_how_its_documents_are_scored():
    """The separator, the BOS and how text is scored change the numbers: they are in the
    identity, also when the model's files are unchanged since a record that lacks them (a run
    scored otherwise is not resumed as if it were this one)."""
    from configs import pretrained as presets
    from flaxformer_lite.train import identity
    from flaxformer_lite.train.run_config import RunConfig

    c = presets.get_config("tiny")
    c.pretrained.source = str(Path(presets.TINY_MODELS) / "gpt2")
    c.data.train_length = 16
    run = RunConfig.from_config(c)
    content, stats = identity.pretrained_content(run)
    want = {"separator_id": 0, "bos_id": None, "scored_text": identity.SCORED_TEXT}
    assert content["documents"] == want
    old = {"pretrained": {k: content[k] for k in ("weights_sha256", "tokenizer_sha256")}}
    old["recorded"] = {"pretrained_files": stats}
    assert identity.pretrained_content(run, old)[0] == content


def test_lengths_below_l_are_for_pretrained_models_and_whole_tokens():
    """``eval.length_divisors``: L / d before the multiples for a pretrained model; refused
    for a trained one (says nothing about extrapolation) and where d does not divide L; a
    run without them keeps the identity it had before the field existed."""
    from configs import extrapolation_lm
    from configs import pretrained as presets
    from flaxformer_lite.base.checks import ConfigError
    from flaxformer_lite.train.run_config import RunConfig

    c = presets.get_config("tiny")
    c.pretrained.source = str(Path(presets.TINY_MODELS) / "gpt2")
    c.data.train_length = 16
    c.eval.update(length_multiples=(1, 2), length_divisors=(2, 4))
    assert RunConfig.from_config(c).eval_lengths == (4, 8, 16, 32)
    c.eval.length_divisors = (3,)
    with pytest.raises(ConfigError, match=r"length_divisors=\(3,\): each must divide .* 16"):
        RunConfig.from_config(c)
    trained = extrapolation_lm.get_config("tiny")
    before = RunConfig.from_config(trained)
    assert "length_divisors" not in before.identity()["eval"]
    trained.eval.length_divisors = (2,)
    with pytest.raises(ConfigError, match="must be \\(\\) for a trained model"):
        RunConfig.from_config(trained)
