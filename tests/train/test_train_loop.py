"""The training engine: smoke, learning, determinism, exact resume, evaluation, NaN guard."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from configs import extrapolation_lm
from flaxformer_lite.data.data_config import open_dataset
from flaxformer_lite.evaluation import metrics, step
from flaxformer_lite.evaluation import run as run_evaluation
from flaxformer_lite.evaluation.protocols import Windows
from flaxformer_lite.evaluation.score import score
from flaxformer_lite.train import loop
from flaxformer_lite.train.batches import TrainBatches
from flaxformer_lite.train.run_config import ConfigError, RunConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    """A small, learnable corpus: a few sentences repeated with variations."""
    rng = np.random.default_rng(0)
    words = [b"alpha", b"beta", b"gamma", b"delta", b"epsilon", b"zeta", b"eta", b"theta"]
    lines = [b" ".join(words[i] for i in rng.integers(0, 8, size=6)) + b".\n" for _ in range(3000)]
    path = tmp_path_factory.mktemp("corpus") / "toy.txt"
    path.write_bytes(b"".join(lines))
    return path


def tiny_config(corpus_file: Path, **train):
    c = extrapolation_lm.get_config("tiny")
    c.data.corpus = "path"
    c.data.path = str(corpus_file)
    c.train.update(train)
    return c


def read_losses(workdir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


def params_of(workdir: Path, c) -> list[np.ndarray]:
    run = RunConfig.from_config(c)
    model = loop.build_model(run)
    from flaxformer_lite.train.checkpoint import Checkpointer
    from flaxformer_lite.train.optim import make_optimizer
    from flaxformer_lite.train.step import init_train_state

    _, state = init_train_state(model, make_optimizer(run.optim, run.train.num_steps))
    ckpt = Checkpointer(workdir / "checkpoints", keep=2)
    restored, step = ckpt.restore_latest(state)
    ckpt.close()
    assert step == run.train.num_steps
    return [np.asarray(x) for x in jax.tree.leaves(restored["params"])]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, corpus_file):
    c = tiny_config(corpus_file, num_steps=12, log_every=1, checkpoint_every=6)
    workdir = tmp_path_factory.mktemp("run") / "a"
    summary = loop.train_and_evaluate(c, workdir)
    return c, workdir, summary


def test_smoke_writes_everything(uninterrupted):
    c, workdir, summary = uninterrupted
    for name in ("config.json", "metrics.jsonl", "eval.json", "provenance.json"):
        assert (workdir / name).is_file(), name
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.is_dir()) == ["12", "6"]
    assert any((workdir / "tensorboard").iterdir())
    lengths = [r["eval_length"] for r in summary["eval"]]
    assert lengths == [16, 32, 64]
    for r in summary["eval"]:
        assert math.isclose(r["bits_per_byte"], r["loss"] / math.log(2))
        assert r["tokens"] == c.eval.max_bytes
    assert json.loads((workdir / "config.json").read_text())["data"]["train_length"] == 16


def test_second_invocation_returns_cached_result(uninterrupted):
    c, workdir, summary = uninterrupted
    again = loop.train_and_evaluate(c, workdir)
    assert again["eval"] == json.loads(json.dumps(summary["eval"]))


def test_a_stopped_evaluation_resumes_at_its_next_cell(uninterrupted, tmp_path, monkeypatch):
    """The cells an evaluation finished before it stopped wait in eval_cells.jsonl and are not
    scored again (a line a kill cut short is dropped); the resumed summary equals an
    uninterrupted run's, and eval_cells.jsonl goes once eval.json holds every cell."""
    c, _, summary = uninterrupted
    workdir = tmp_path / "run"
    scored = []
    original = run_evaluation.evaluate_cell

    def scoring(*args, **kwargs):
        if "positions_tag" not in kwargs:  # a cell of the plan, not validation in training
            scored.append(args[2])
            if dies and len(scored) == 2:
                raise KeyboardInterrupt("simulated kill")
        return original(*args, **kwargs)

    monkeypatch.setattr(run_evaluation, "evaluate_cell", scoring)
    dies = True
    with pytest.raises(KeyboardInterrupt):
        loop.train_and_evaluate(c, workdir)
    cells = workdir / "eval_cells.jsonl"
    assert len(cells.read_text().splitlines()) == 1 and not (workdir / "eval.json").exists()
    with open(cells, "a") as f:
        f.write('{"config_hash": "')  # killed while appending the next line
    dies, first = False, scored[0]
    scored.clear()
    resumed = loop.train_and_evaluate(c, workdir)
    assert len(summary["eval"]) == 3 and len(scored) == 2 and first not in scored
    assert resumed["eval"] == json.loads(json.dumps(summary["eval"]))
    assert not cells.exists() and (workdir / "eval.json").is_file()


def test_loss_goes_down(corpus_file, tmp_path):
    c = tiny_config(corpus_file, num_steps=40, log_every=1, checkpoint_every=40)
    c.optim.update(learning_rate=1e-2, warmup_steps=5)
    loop.train_and_evaluate(c, tmp_path / "run")
    losses = read_losses(tmp_path / "run")
    first = np.mean([losses[s] for s in (1, 2, 3)])
    last = np.mean([losses[s] for s in (38, 39, 40)])
    assert first > 4.5  # ~ln(256) at initialisation
    assert last < 0.6 * first, (first, last)


def killed_at_step_8(c, workdir: Path, monkeypatch) -> None:
    """Train ``c`` in ``workdir`` until building the batch of step 8 raises KeyboardInterrupt."""
    original = TrainBatches.__call__

    def dying(self, step):
        if step == 8:
            raise KeyboardInterrupt("simulated kill")
        return original(self, step)

    with monkeypatch.context() as m:
        m.setattr(TrainBatches, "__call__", dying)
        with pytest.raises(KeyboardInterrupt):
            loop.train_and_evaluate(c, workdir)


def test_deterministic_and_exact_resume(uninterrupted, corpus_file, tmp_path, monkeypatch):
    c, workdir_a, _ = uninterrupted
    losses_a = read_losses(workdir_a)

    # Same config and seed from scratch: bit-identical losses.
    loop.train_and_evaluate(c, tmp_path / "b")
    assert read_losses(tmp_path / "b") == losses_a

    # Interrupted after step 8 (checkpoint at 6), then resumed.
    killed_at_step_8(c, tmp_path / "c", monkeypatch)
    assert max(read_losses(tmp_path / "c")) == 7  # rows past the checkpoint at 6 exist
    loop.train_and_evaluate(c, tmp_path / "c")
    assert read_losses(tmp_path / "c") == losses_a  # no duplicated or changed rows
    for a, b in zip(params_of(workdir_a, c), params_of(tmp_path / "c", c), strict=True):
        np.testing.assert_array_equal(a, b)


def test_several_steps_per_call_train_the_same_steps(
    uninterrupted, corpus_file, tmp_path, monkeypatch
):
    """``train.steps_per_call=4``: one `lax.scan` over 4 batches per compiled call. With 12
    steps and checkpoints at 6 the calls run steps 1-4, 5, 6 (one each: 4 do not fit before
    the checkpoint), 7-10, 11, 12 -- both programs. Losses of every step, checkpoints and
    parameters equal one step per call bit for bit, and a run interrupted with one step per
    call resumes with four."""
    c, workdir_a, summary_a = uninterrupted
    calls = []
    original_stack = loop._stack

    def counting(batches):
        calls.append(len(batches))
        return original_stack(batches)

    monkeypatch.setattr(loop, "_stack", counting)
    c4 = tiny_config(corpus_file, num_steps=12, log_every=1, checkpoint_every=6, steps_per_call=4)
    summary = loop.train_and_evaluate(c4, tmp_path / "four")
    assert calls == [4, 4]  # steps 1-4 and 7-10; the other four ran one per call
    assert read_losses(tmp_path / "four") == read_losses(workdir_a)
    assert sorted(p.name for p in (tmp_path / "four" / "checkpoints").iterdir()) == ["12", "6"]
    for a, b in zip(params_of(workdir_a, c), params_of(tmp_path / "four", c4), strict=True):
        np.testing.assert_array_equal(a, b)
    assert summary["eval"] == summary_a["eval"]
    assert summary["config_hash"] == summary_a["config_hash"]  # not part of the identity

    # interrupted at step 8 with one step per call (checkpoint at 6), resumed with four
    killed_at_step_8(c, tmp_path / "mixed", monkeypatch)
    calls.clear()
    loop.train_and_evaluate(c4, tmp_path / "mixed")
    assert calls == [4]  # steps 7-10
    assert read_losses(tmp_path / "mixed") == read_losses(workdir_a)
    for a, b in zip(params_of(workdir_a, c), params_of(tmp_path / "mixed", c4), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("steps_per_call", [1, 4])  # 4: step 3 is the third of a call's four
def test_nan_guard_names_step_and_metric(corpus_file, tmp_path, monkeypatch, steps_per_call):
    original = TrainBatches.__call__

    def poisoned(self, step):
        batch = original(self, step)
        if step == 2:
            batch["loss_mask"] = batch["loss_mask"] * np.nan
        return batch

    monkeypatch.setattr(TrainBatches, "__call__", poisoned)
    c = tiny_config(corpus_file, num_steps=6, checkpoint_every=6, steps_per_call=steps_per_call)
    with pytest.raises(FloatingPointError, match=r"'loss' is nan at step 3"):
        loop.train_and_evaluate(c, tmp_path / "run")


@pytest.fixture(scope="module")
def trained_model(uninterrupted):
    c, _workdir, _ = uninterrupted
    run = RunConfig.from_config(c)
    model = loop.build_model(run)
    return run, model, open_dataset(run.data).split(run.eval.split)


def test_sliding_with_stride_l_equals_nonoverlapping(trained_model):
    _, model, split = trained_model
    a = score(model, Windows(32, max_bytes=500), split)
    b = score(model, Windows(32, stride=32, max_bytes=500), split)
    assert a["loss"] == b["loss"] and a["loss_by_position"] == b["loss_by_position"]
    c = score(model, Windows(32, stride=8, max_bytes=500), split)
    assert c["tokens"] == a["tokens"] == 500  # every target scored once in both protocols
    assert c["protocol"] == "sliding" and c["loss"] != a["loss"]


def test_eval_loss_matches_direct_computation(trained_model):
    """Loss from the evaluator == log-softmax of direct model calls, computed in numpy; and
    the per-position means, weighted by their counts, average to the total."""
    _run, model, split = trained_model
    length, max_bytes = 16, 200
    r = score(model, Windows(length, max_bytes=max_bytes, train_length=16), split, batch_size=4)
    total, count, by_pos = 0.0, 0, np.zeros(length)
    n_pos = np.zeros(length)
    for w in split.eval_windows(length, max_bytes=max_bytes):
        logits = np.asarray(model(w["inputs"][None], np.arange(length)[None]), np.float64)[0]
        shifted = logits - logits.max(-1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        nll = -logp[np.arange(length), w["targets"]] * w["loss_mask"]
        total += nll.sum()
        count += int(w["loss_mask"].sum())
        by_pos += nll
        n_pos += w["loss_mask"]
    assert r["tokens"] == count == max_bytes
    np.testing.assert_allclose(r["loss"], total / count, rtol=1e-5)
    np.testing.assert_allclose(r["loss_by_position"], by_pos / n_pos, rtol=1e-5)
    weighted = np.nansum(np.array(r["loss_by_position"], float) * n_pos) / n_pos.sum()
    np.testing.assert_allclose(weighted, r["loss"], rtol=1e-6)
    assert list(r["bucket_loss"]) == ["[0,16)"]


def test_bucket_losses_edges():
    loss_sum = np.arange(10, dtype=float)
    count = np.ones(10)
    buckets = metrics.bucket_losses(loss_sum, count, 2)
    assert buckets == {"[0,2)": 0.5, "[2,4)": 2.5, "[4,8)": 5.5, "[8,10)": 8.5}


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        ("optim.learning_rate", -0.1, r"config\.optim\.learning_rate=-0\.1: must be > 0"),
        ("data.batch_size", 0, r"config\.data\.batch_size=0"),
        ("eval.length_multiples", (0, 2), r"config\.eval\.length_multiples"),
        ("eval.protocols", ("bogus",), r"config\.eval\.protocols"),
        ("model.positional", "bogus", r"positional='bogus'.*allowed"),
        ("model.num_heads", 3, r"num_heads=3"),
        ("train.num_steps", 1.5, r"config\.train\.num_steps=1\.5: must be an int"),
        (  # as Python carries a byte that is not UTF-8 (a file name, from the library)
            "data.path",
            "/tmp/corpus\udcff.txt",
            r"config\.data\.path=b'/tmp/corpus\\xff\.txt': holds bytes that are not UTF-8",
        ),
        ("train.steps_per_call", 0, r"config\.train\.steps_per_call=0: must be > 0"),
        (
            "train.steps_per_call",
            11,
            r"steps_per_call=11: must be <= config\.train\.checkpoint_every=10",
        ),
    ],
)
def test_bad_config_values_name_the_field(path, value, match):
    d = extrapolation_lm.get_config("tiny").to_dict()  # a dict: ConfigDict would type-check
    section, field = path.split(".")
    d[section][field] = value
    with pytest.raises(ConfigError, match=match):
        RunConfig.from_config(d)


def test_learned_table_must_cover_the_training_length():
    """Beyond L the cells are "n/a" (tests/evaluation/test_evaluation_plan.py); a table
    shorter than L cannot train."""
    c = extrapolation_lm.get_config("tiny")
    c.model.positional = "learned"
    c.model.positional_options.learned.max_length = 8
    with pytest.raises(
        ConfigError, match=r"config\.model\.positional_options\.learned\.max_length=8.*>= 16"
    ):
        RunConfig.from_config(c)


def test_workdir_of_a_different_config_is_refused(uninterrupted):
    c, workdir, _ = uninterrupted
    other = extrapolation_lm.get_config("tiny")
    other.data.update(corpus=c.data.corpus, path=c.data.path)
    other.optim.learning_rate = 1e-4
    with pytest.raises(ConfigError, match=r"different config.*optim\.learning_rate"):
        loop.train_and_evaluate(other, workdir)


def test_cli_bad_override_writes_nothing(tmp_path):
    workdir = tmp_path / "never"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "train.py"),
            "--config=configs/extrapolation_lm.py:tiny",
            f"--workdir={workdir}",
            "--config.optim.learning_rate=-1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "config.optim.learning_rate=-1.0: must be > 0" in proc.stderr
    assert not workdir.exists()


def test_rebuild_model_shares_parameters(trained_model):
    run, model, _ = trained_model
    other = step.rebuild_model(model, run.model.replace(attention_impl="xla"))
    a = nnx.state(model, nnx.Param)
    b = nnx.state(other, nnx.Param)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_the_report_command_reads_a_train_workdir(uninterrupted, tmp_path):
    """`flaxformer-lite report WORKDIR` on a single run's workdir (no rows.jsonl: made from its
    eval.json) writes the tables with the run's own numbers."""
    _, workdir, summary = uninterrupted
    proc = subprocess.run(
        [sys.executable, "scripts/make_report.py", str(workdir), f"--out={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (workdir / "rows.jsonl").exists()  # the run's workdir is left as it was
    table = tmp_path / "tables" / "bits_per_byte_nonoverlapping.csv"
    with open(table) as f:
        cells = {int(r["eval_length"]): float(r["mean"]) for r in csv.DictReader(f)}
    expected = {
        r["eval_length"]: r["bits_per_byte"]
        for r in summary["eval"]
        if r["protocol"] == "nonoverlapping"
    }
    assert cells == pytest.approx(expected, rel=1e-12)
