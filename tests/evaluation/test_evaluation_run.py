"""Executing an evaluation plan (`flaxformer_lite.evaluation.run`): a cell whose variant
changes no number of the model repeats its base cell instead of being scored again."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from configs import extrapolation_lm
from flaxformer_lite.data.data_config import open_dataset
from flaxformer_lite.evaluation import run as run_evaluation
from flaxformer_lite.nn.models import DecoderOnlyLM
from flaxformer_lite.train.run_config import RunConfig

SCALINGS = ("pi", "ntk", "dynamic_ntk", "yarn")


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory):
    """A tiny RoPE model (L = 16, lengths 16, 32, 64; random weights: the identity holds for
    any), its plan with every RoPE scaling, and its corpus."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_bytes(rng.integers(32, 127, size=6000, dtype=np.uint8).tobytes())
    c = extrapolation_lm.get_config("tiny")
    c.model.positional = "rope"
    c.data.update(corpus="path", path=str(path))
    c.eval.update(rope_scalings=SCALINGS, max_bytes=256)
    run = RunConfig.from_config(c)
    model = DecoderOnlyLM(run.model, rngs=nnx.Rngs(params=0, dropout=1))
    return model, run.eval_plan(), open_dataset(run.data)


def test_the_plan_repeats_a_scaling_only_where_it_is_the_model_itself(rope_run):
    _, plan, _ = rope_run
    base = plan.cells[0]
    assert (base.label.variant, base.length, base.same_as) == ("base", 16, None)
    repeats = [(c.label.variant, c.length, c.same_as) for c in plan.cells if c.same_as is not None]
    assert repeats == [(v, 16, 0) for v in SCALINGS]  # s = 1 at L' = L; s > 1 beyond


def test_a_context_cell_repeats_only_if_its_sequences_stay_within_l():
    """A context cell of c tokens scores sequences of c + S - 1: dynamic NTK scales past L
    there, so the cell repeats its base only when the whole sequence fits in L."""
    c = extrapolation_lm.get_config("tiny")  # L = 16, S = 8: c = 8 -> 15 tokens, 16 -> 23
    c.model.positional = "rope"
    c.eval.update(rope_scalings=("dynamic_ntk",), protocols=("context",))
    plan = RunConfig.from_config(c).eval_plan()
    repeats = {(x.length, x.sequence_length): x.same_as for x in plan.cells[6:]}
    assert list(repeats.items())[:2] == [((8, 15), 0), ((16, 23), None)]
    assert list(repeats.values())[2:] == [None] * 4


def test_a_scaling_at_s_1_scores_the_base_cells_numbers(rope_run):
    """The claim the repeat rests on: scored for real, each scaling at L' = L gives the base
    cell's numbers (PI, NTK and YaRN exactly; dynamic NTK, scored token by token, to
    rounding)."""
    model, plan, dataset = rope_run
    base = run_evaluation.evaluate_cell(model, plan, plan.cells[0], dataset)
    for cell in plan.cells:
        if cell.same_as is None:
            continue
        r = run_evaluation.evaluate_cell(model, plan, cell, dataset)
        exact = cell.label.variant != "dynamic_ntk"
        tolerance = {"rtol": 0.0} if exact else {"rtol": 1e-5}
        np.testing.assert_allclose(r["loss"], base["loss"], **tolerance, err_msg=cell.label)
        np.testing.assert_allclose(r["loss_by_position"], base["loss_by_position"], **tolerance)
    pi_32 = next(c for c in plan.cells if (c.label.variant, c.length) == ("pi", 32))
    base_32 = run_evaluation.evaluate_cell(model, plan, plan.cells[1], dataset)
    assert run_evaluation.evaluate_cell(model, plan, pi_32, dataset)["loss"] != base_32["loss"]


def test_evaluate_plan_copies_the_repeated_cells_with_their_own_labels(rope_run, monkeypatch):
    model, plan, dataset = rope_run
    calls = []
    original = run_evaluation.evaluate_cell

    def counting(model, plan, cell, *args, **kwargs):
        calls.append((cell.label.variant, cell.length))
        return original(model, plan, cell, *args, **kwargs)

    monkeypatch.setattr(run_evaluation, "evaluate_cell", counting)
    results = run_evaluation.evaluate_plan(model, plan, dataset)
    assert len(results) == len(plan.cells) == 15
    assert len(calls) == 11 and not any(length == 16 and v != "base" for v, length in calls)
    for cell, r in zip(plan.cells, results, strict=True):
        assert (r["variant"], r["eval_length"]) == (cell.label.variant, cell.length)
        assert r["encoding"] == cell.label.encoding
        if cell.same_as is None:
            assert r["scoring"] in ("parallel", "incremental")
            continue
        assert r["scoring"] == run_evaluation.REPEAT and r["encoding"] == f"rope+{r['variant']}"
        assert r["encoding_options"]["scaling"] == r["variant"]
        assert r["loss"] == results[0]["loss"] and r["blocks"] == results[0]["blocks"]


def test_a_model_with_its_own_scaling_is_never_repeated(rope_run):
    """A checkpoint trained with a scaling (here YaRN s = 2) is not plain RoPE: replacing its
    scaling changes numbers at every length, so every cell is scored."""
    c = extrapolation_lm.get_config("tiny")
    c.model.positional = "rope"
    c.model.positional_options.rope.update(scaling="yarn", scale=2.0)
    c.eval.rope_scalings = SCALINGS
    plan = RunConfig.from_config(c).eval_plan()
    assert {cell.same_as for cell in plan.cells} == {None}


def test_alibi_position_interpolation_within_l_repeats_the_base_cell():
    c = extrapolation_lm.get_config("tiny")
    c.model.positional = "alibi"
    c.model.positional_options.alibi.pi_train_length = 16
    c.eval.rope_scalings = ("alibi_pi",)
    plan = RunConfig.from_config(c).eval_plan()
    assert [(x.label.variant, x.length, x.same_as) for x in plan.cells] == [
        ("base", 16, None),
        ("base", 32, None),
        ("base", 64, None),
        ("alibi_pi", 16, 0),
        ("alibi_pi", 32, None),
        ("alibi_pi", 64, None),
    ]
