"""The evaluation plan (`flaxformer_lite.evaluation.plan`): every cell of a run, decided and
checked once from its config, before training."""

from __future__ import annotations

import pytest

from configs import extrapolation_lm
from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.train.run_config import RunConfig


def _plan(positional="rope", **changes):
    c = extrapolation_lm.get_config("tiny")  # L = 16, lengths 16, 32, 64
    c.model.positional = positional
    for path, value in changes.items():
        section, field = path.split("__")
        c[section][field] = value
    return RunConfig.from_config(c).eval_plan()


def test_cells_are_variant_by_protocol_by_length_with_labels():
    plan = _plan(eval__rope_scalings=("pi", "yarn"), eval__protocols=("nonoverlapping", "sliding"))
    labels = [(c.label.encoding, c.label.variant, c.protocol, c.length) for c in plan.cells]
    assert len(labels) == 3 * 2 * 3
    assert labels[:4] == [
        ("rope", "base", "nonoverlapping", 16),
        ("rope", "base", "nonoverlapping", 32),
        ("rope", "base", "nonoverlapping", 64),
        ("rope", "base", "sliding", 16),
    ]
    assert labels[-1] == ("rope+yarn", "yarn", "sliding", 64)
    pi64 = next(c for c in plan.cells if c.label.variant == "pi" and c.length == 64)
    assert pi64.model.positional_options.scale == 4.0  # s = 64 / 16
    assert pi64.stride is None and pi64.encoding_options()["scaling"] == "pi"
    sliding = next(c for c in plan.cells if c.protocol == "sliding" and c.length == 32)
    assert sliding.stride == 16  # stride_fraction 0.5
    assert plan.quick.length == 16 and plan.quick.label.variant == "base"


def test_rope_scaling_rows_only_where_the_registry_says_they_apply():
    assert {c.label.variant for c in _plan("alibi", eval__rope_scalings=("pi",)).cells} == {"base"}
    randomized = _plan(model__randomized_positions=True, eval__rope_scalings=("pi",))
    assert {c.label.encoding for c in randomized.cells} == {"rope+randomized"}


def test_unknown_rope_scaling_fails_before_training():
    with pytest.raises(ConfigError, match=r"config\.eval\.rope_scalings=\('pj',\): unknown"):
        _plan("alibi", eval__rope_scalings=("pj",))


def test_attention_implementation_per_length_follows_the_one_threshold():
    plan = _plan(model__chunked_threshold=32)
    assert [c.model.attention_impl for c in plan.cells] == ["xla", "xla", "chunked"]


def test_learned_table_beyond_l_is_not_applicable_not_a_number():
    plan = _plan("learned")  # the study sizes the table to L = 16
    assert [c.na is None for c in plan.cells] == [True, False, False]
    assert "no position embedding past 16" in plan.cells[1].na
    assert plan.cells[0].label.encoding == "learned"
    wide = _plan("learned", model__positional_options={"learned": {"max_length": 64}})
    assert [c.na for c in wide.cells] == [None, None, None]
    assert {c.label.encoding for c in wide.cells} == {"learned+untrained_rows"}


def test_a_table_shorter_than_the_training_length_fails():
    c = extrapolation_lm.get_config("tiny")
    c.model.positional = "learned"
    c.model.positional_options.learned.max_length = 8
    with pytest.raises(ConfigError, match=r"learned\.max_length=8: must be >= 16.*training"):
        RunConfig.from_config(c)


def test_windowed_rows_for_every_encoding():
    for name in ("alibi", "xpos"):
        plan = _plan(name, eval__local_window=16)
        window = [c for c in plan.cells if c.label.variant == "window"]
        assert [c.length for c in window] == [16, 32, 64]
        assert {c.label.encoding for c in window} == {f"{name}+window"}
        assert {c.model.attention_window for c in window} == {16}
        assert window[0].encoding_options()["attention_window"] == 16
    with pytest.raises(ConfigError, match=r"config\.eval\.local_window=-1"):
        _plan(eval__local_window=-1)


def test_streaming_rows_keep_the_first_keys_beside_the_window():
    plan = _plan("rope", eval__local_window=16, eval__streaming_first=4)
    streaming = [c for c in plan.cells if c.label.variant == "streaming"]
    assert [c.length for c in streaming] == [16, 32, 64]
    assert {c.label.encoding for c in streaming} == {"rope+streaming"}
    assert {(c.model.attention_window, c.model.attention_keep_first) for c in streaming} == {
        (16, 4)
    }
    assert streaming[0].encoding_options()["attention_keep_first"] == 4
    window = [c for c in plan.cells if c.label.variant == "window"]
    assert {c.model.attention_keep_first for c in window} == {None}
    assert "attention_keep_first" not in window[0].encoding_options()
    with pytest.raises(ConfigError, match=r"config\.eval\.streaming_first=4.*local_window"):
        _plan(eval__streaming_first=4)


def test_dynamic_ntk_cells_are_scored_incrementally():
    plan = _plan(eval__rope_scalings=("dynamic_ntk", "ntk"))
    assert {c.label.variant: c.incremental for c in plan.cells} == {
        "base": False,
        "dynamic_ntk": True,
        "ntk": False,
    }


def test_sliding_stride_one_and_the_context_cells():
    plan = _plan(eval__protocols=("sliding", "context"), eval__sliding_stride=1)
    assert {c.stride for c in plan.cells if c.protocol == "sliding"} == {1}
    context = [c for c in plan.cells if c.protocol == "context"]
    # c = L x (0.5, 1, 2, 4, 8, 16) with L = 16; windows of c + S - 1 with S = L / 2 = 8
    assert [c.length for c in context] == [8, 16, 32, 64, 128, 256]
    assert [c.sequence_length for c in context] == [15, 23, 39, 71, 135, 263]
    assert {(c.scoring.block, c.scoring.max_context) for c in context} == {(8, 256)}
    with pytest.raises(ConfigError, match=r"config\.eval\.sliding_stride=17.*at most the shortest"):
        _plan(eval__protocols=("sliding",), eval__sliding_stride=17)
    with pytest.raises(ConfigError, match=r"config\.eval\.sliding_stride=-1"):
        _plan(eval__sliding_stride=-1)


def test_temperature_variant_rows_are_labelled_and_tuned_at_the_training_length():
    plan = _plan(eval__temperatures=("logn", "llama4"))
    variants = {c.label.variant: c for c in plan.cells if c.length == 64}
    assert set(variants) == {"base", "logn", "llama4"}
    logn = variants["logn"]
    assert logn.label.encoding == "rope+logn"
    assert (logn.model.attention_temperature, logn.model.temperature_length) == ("logn", 16)
    assert variants["llama4"].label.encoding == "rope+llama4"
    assert variants["base"].model.attention_temperature == "none"
    with pytest.raises(ConfigError, match=r"config\.eval\.temperatures=\('ssmax',\)"):
        _plan(eval__temperatures=("ssmax",))
