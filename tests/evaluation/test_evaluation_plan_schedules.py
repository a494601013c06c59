"""The evaluation plan of a model with a per-layer schedule (`ModelConfig.layer_pattern`),
set in a study config: labels name the pattern, RoPE scalings act on its global layers only,
and the pattern survives the run's identity and the rows' encoding settings."""

from __future__ import annotations

import json

import pytest

from configs import extrapolation_lm
from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.nn import schedules
from flaxformer_lite.train.run_config import RunConfig


def _run(pattern, **model):
    c = extrapolation_lm.get_config("tiny")  # L = 16, lengths 16, 32, 64
    c.model.positional = "rope"
    c.model.layer_pattern = pattern
    for field, value in model.items():
        c.model[field] = value
    c.eval.rope_scalings = ("yarn", "dynamic_ntk")
    return RunConfig.from_config(c)


def test_a_gemma3_pattern_from_a_study_config():
    pattern = schedules.gemma3(window=4, local_per_global=1, global_options={"original_length": 16})
    run = _run(pattern)
    assert [k.window for k in run.model.layer_kinds()] == [4, None][: run.model.num_decoder_layers]
    plan = run.eval_plan()
    labels = {(c.label.encoding, c.label.variant, c.incremental) for c in plan.cells}
    assert labels == {
        ("gemma3", "base", False),
        ("gemma3+yarn", "yarn", False),
        ("gemma3+dynamic_ntk", "dynamic_ntk", True),
    }
    yarn64 = next(c for c in plan.cells if c.label.variant == "yarn" and c.length == 64)
    local, full = yarn64.model.layer_pattern
    assert local == run.model.layer_pattern[0]  # the sliding layer is never scaled
    assert (full.positional_options.scaling, full.positional_options.scale) == ("yarn", 4.0)
    settings = yarn64.encoding_options()
    assert settings["positional"] == "rope"
    assert [k["name"] for k in settings["layer_pattern"]] == ["gemma3.local", "gemma3.global"]
    assert settings["layer_pattern"][1]["positional_options"]["scaling"] == "yarn"
    json.dumps(settings)  # a results row holds it as JSON
    # the identity holds the pattern as plain data: a config rebuilt from it is the same run
    identity = run.identity()
    assert identity["model"]["layer_pattern"][0]["window"] == 4
    assert json.loads(json.dumps(identity)) == identity
    again = _run([dict(k) for k in identity["model"]["layer_pattern"]])
    assert again.model == run.model and again.hash() == run.hash()
    wider = schedules.gemma3(window=8, local_per_global=1, global_options={"original_length": 16})
    assert _run(wider).hash() != run.hash()


def test_a_pattern_that_inherits_the_sized_rope_options():
    """gpt-oss windows over the study's RoPE (original_length sized to L): the scaled rows
    scale the full layers only, and the label names the encoding and the pattern."""
    plan = _run(schedules.gpt_oss(window=4)).eval_plan()
    assert {c.label.encoding for c in plan.cells} == {
        "rope+gpt_oss",
        "rope+gpt_oss+yarn",
        "rope+gpt_oss+dynamic_ntk",
    }
    cell = next(c for c in plan.cells if c.label.variant == "yarn" and c.length == 32)
    assert [k.positional_options.scale for k in cell.model.layer_kinds()][:2] == [1.0, 2.0]


def test_no_scaled_rows_without_a_global_rope_layer():
    plan = _run(schedules.cohere2(window=4)).eval_plan()  # global layers are NoPE
    assert {c.label.encoding for c in plan.cells} == {"rope+cohere2"}


def test_a_global_rope_kind_without_a_training_length_fails_before_training():
    with pytest.raises(
        ConfigError, match=r"layer_pattern\[1\]\.positional_options\.original_length=None"
    ):
        _run(schedules.gemma3(window=4, local_per_global=1))


def test_provenance_records_each_kind_of_the_pattern():
    from flaxformer_lite.train import provenance

    model = _run(schedules.cohere2(window=4)).model
    record = provenance.encoding(model)
    assert record["name"] == "rope"
    assert [(k["name"], k["window"]) for k in record["layers"]] == [("rope", 4)] * 3 + [
        ("none", None)
    ]
    assert record["layers"][3]["factory"].endswith("NoPositionalEncoding")
    assert "layers" not in provenance.encoding(model.replace(layer_pattern=()))
