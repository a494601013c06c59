"""Tests of `ModelConfig`: base-Transformer defaults, validation errors that name the field,
the value and what is allowed (DESIGN.md §6), and the encoding's own settings in
``positional_options`` (the options dataclass of the chosen encoding)."""

from __future__ import annotations

import dataclasses
import json
import re

import ml_collections
import pytest

from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.core import attention
from flaxformer_lite.nn.encodings import (
    FireOptions,
    LearnedOptions,
    ModelDims,
    NoOptions,
    RopeOptions,
    SinusoidalOptions,
    T5Options,
    XPosOptions,
    get_positional_encoding,
    positional_encoding_names,
)
from flaxformer_lite.nn.encodings.attention_bias import ALiBiOptions
from flaxformer_lite.nn.encodings.forgetting import FoxOptions
from flaxformer_lite.nn.encodings.rotary import PRopeOptions
from flaxformer_lite.nn.model_config import ModelConfig, options_template


def test_defaults_are_the_base_transformer():
    cfg = ModelConfig()
    assert (cfg.num_encoder_layers, cfg.num_decoder_layers) == (6, 6)
    assert (cfg.d_model, cfg.num_heads, cfg.d_ff, cfg.head_dim) == (512, 8, 2048, 64)
    assert cfg.dropout_rate == 0.1
    assert (cfg.norm, cfg.activation, cfg.positional) == ("post", "relu", "sinusoidal")
    assert cfg.positional_options == SinusoidalOptions(base=10000.0)
    rope = ModelConfig(positional="rope").positional_options
    assert (rope.base, rope.layout, rope.scaling, rope.scale) == (10000.0, "half", "none", 1.0)
    assert cfg.vocab_size == 256 and cfg.dtype == "float32" and cfg.param_dtype == "float32"
    assert cfg.chunked_threshold == attention.DEFAULT_CHUNKED_THRESHOLD == 1024
    assert cfg.encoding is get_positional_encoding("sinusoidal")
    assert cfg.dims == ModelDims(
        d_model=512, num_heads=8, head_dim=64, param_dtype=cfg.params_dtype
    )


def _check(changes, field, value, allowed):
    with pytest.raises(ConfigError) as err:
        ModelConfig(**changes)
    msg = str(err.value)
    assert f"ModelConfig.{field}={value!r}" in msg, msg
    assert re.search(allowed, msg), msg


@pytest.mark.parametrize(
    "field,value",
    [
        ("vocab_size", 0),
        ("d_model", -8),
        ("num_heads", 0),
        ("d_ff", 0),
        ("max_position", 0),
        ("chunked_threshold", 0),
        ("chunked_threshold", 512.0),
        ("d_model", 16.0),
        ("d_model", True),
    ],
)
def test_sizes_must_be_positive_ints(field, value):
    _check({field: value}, field, value, ": must be a positive int")


def test_learned_table_size_must_be_a_positive_int():
    _check(
        {"positional": "learned", "positional_options": {"max_length": -1}},
        "positional_options.max_length",
        -1,
        ": must be a positive int",
    )
    _check(
        {"positional": "learned", "positional_options": LearnedOptions(max_length=0)},
        "positional_options.max_length",
        0,
        ": must be a positive int",
    )


@pytest.mark.parametrize("field", ["num_encoder_layers", "num_decoder_layers"])
def test_layer_counts_must_be_non_negative(field):
    _check({field: -1}, field, -1, ">= 0")
    assert getattr(ModelConfig(**{field: 0}), field) == 0  # zero layers is allowed


def test_d_model_must_divide_by_num_heads():
    _check({"d_model": 30, "num_heads": 4}, "num_heads", 4, r"d_model=30 must be divisible")


@pytest.mark.parametrize("positional", ["rope", "xpos"])
def test_rotary_encodings_need_an_even_head_dim(positional):
    _check(
        {"d_model": 12, "num_heads": 4, "positional": positional},
        "num_heads",
        4,
        rf"positional='{positional}' needs an even head_dim; d_model=12 / num_heads=4 = 3 ",
    )
    ModelConfig(d_model=12, num_heads=4, positional="sinusoidal")  # odd head_dim is fine there
    ModelConfig(d_model=12, num_heads=3, positional=positional)  # head_dim 4
    # Partial rotary rotates an even number of dims of an odd head_dim.
    cfg = ModelConfig(
        d_model=12, num_heads=4, positional=positional, positional_options={"fraction": 0.5}
    )
    assert cfg.positional_options.fraction == 0.5


@pytest.mark.parametrize("value", [1.0, -0.1, 1.5, "0.1"])
def test_dropout_must_be_in_unit_interval(value):
    _check({"dropout_rate": value}, "dropout_rate", value, r"\[0, 1\)")


@pytest.mark.parametrize(
    "field,value,allowed",
    [
        ("norm", "middle", ["post", "pre"]),
        ("activation", "swish", ["relu", "gelu"]),
        ("dtype", "float64", ["float32", "bfloat16"]),
        ("param_dtype", "int8", ["float32", "bfloat16"]),
        ("attention_impl", "flash9", list(attention.IMPLEMENTATIONS)),
    ],
)
def test_unknown_choice_names_field_value_and_allowed(field, value, allowed):
    _check({field: value}, field, value, "allowed")
    with pytest.raises(ValueError) as err:
        ModelConfig(**{field: value})
    for a in allowed:
        assert repr(a) in str(err.value)


def test_unknown_positional_lists_registered_names():
    with pytest.raises(ValueError, match=r"ModelConfig\.positional='sinusoid'") as err:
        ModelConfig(positional="sinusoid")
    for name in positional_encoding_names():
        assert repr(name) in str(err.value)


def test_rope_layout_and_bases_are_validated():
    rope = {"positional": "rope"}
    _check(
        rope | {"positional_options": {"layout": "zigzag"}},
        "positional_options.layout",
        "zigzag",
        r": allowed values: \['half', 'interleaved'\]",
    )
    _check(
        rope | {"positional_options": {"base": 1.0}},
        "positional_options.base",
        1.0,
        ": must be a number > 1",
    )
    # sinusoidal is the default encoding; an int base is normalised to a float first
    _check({"positional_options": {"base": 0}}, "positional_options.base", 0.0, "> 1")
    _check(
        {"positional": "xpos", "positional_options": {"base": 1.0}},
        "positional_options.base",
        1.0,
        "> 1",
    )


# ------------------------------------------------------------------ positional_options


def test_options_are_normalised_to_the_dataclass_and_stay_hashable():
    cfg = ModelConfig(
        positional="rope", positional_options={"base": 500, "scaling": "pi", "scale": 2}
    )
    assert type(cfg.positional_options) is RopeOptions
    assert cfg.positional_options == RopeOptions(base=500.0, scaling="pi", scale=2.0)
    assert isinstance(cfg.positional_options.base, float)  # int accepted for a float option
    same = ModelConfig(
        positional="rope", positional_options=RopeOptions(base=500.0, scaling="pi", scale=2.0)
    )
    assert cfg == same and hash(cfg) == hash(same)
    assert len({cfg, same, ModelConfig(positional="rope")}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.positional_options.base = 1.0  # type: ignore[misc]
    defaults = {
        "none": NoOptions(),
        "sinusoidal": SinusoidalOptions(),
        "learned": LearnedOptions(),
        "rope": RopeOptions(),
        "xpos": XPosOptions(),
        "alibi": ALiBiOptions(),
        "t5": T5Options(),
        "kerple_log": NoOptions(),
        "kerple_power": NoOptions(),
        "fire": FireOptions(),
        "p_rope": PRopeOptions(),
        "fox": FoxOptions(),
    }
    assert set(defaults) == set(positional_encoding_names())
    for name, options in defaults.items():
        for given in (None, {}):
            cfg = ModelConfig(positional=name, positional_options=given)
            assert cfg.positional_options == options and type(cfg.positional_options) is type(
                options
            )
            hash(cfg)


def test_options_of_the_wrong_encoding_or_shape_are_rejected():
    with pytest.raises(ConfigError, match=r"positional='rope' takes RopeOptions, not T5Options"):
        ModelConfig(positional="rope", positional_options=T5Options())
    with pytest.raises(ConfigError, match=r"ModelConfig\.positional_options=3: must be a mapping"):
        ModelConfig(positional="rope", positional_options=3)
    with pytest.raises(
        ConfigError,
        match=r"ModelConfig\.positional_options has no option\(s\) \['bse'\] for "
        r"positional='rope'; allowed: \['attention_factor', 'base', ",
    ):
        ModelConfig(positional="rope", positional_options={"bse": 500.0})
    with pytest.raises(ConfigError, match=r"no option\(s\) \['scaling'\] for positional='xpos'"):
        ModelConfig(positional="xpos", positional_options={"scaling": "pi"})
    with pytest.raises(ConfigError, match=r"no option\(s\) \['base'\] for positional='alibi'"):
        ModelConfig(positional="alibi", positional_options={"base": 2.0})
    with pytest.raises(
        ConfigError, match=r"ModelConfig\.positional_options\.base='big': must be a number"
    ):
        ModelConfig(positional="rope", positional_options={"base": "big"})
    with pytest.raises(
        ConfigError, match=r"ModelConfig\.positional_options\.num_buckets=8\.0: must be an int"
    ):
        ModelConfig(positional="t5", positional_options={"num_buckets": 8.0})


@pytest.mark.parametrize(
    "old,value,place",
    [
        ("rope_base", 500.0, "positional_options.rope.base"),
        ("rope_scaling", "pi", "positional_options.rope.scaling"),
        ("max_length", 16, "positional_options.learned.max_length"),
        ("t5_num_buckets", 8, "positional_options.t5.num_buckets"),
        ("xpos_scale_base", 4.0, "positional_options.xpos.scale_base"),
        ("fire_threshold_init", 4.0, "positional_options.fire.threshold_init"),
        ("sinusoidal_base", 100.0, "positional_options.sinusoidal.base"),
    ],
)
def test_an_old_flat_field_is_refused_like_any_unknown_field(old, value, place):
    """A flat field that became an encoding option is not a field: the constructor refuses it
    as Python refuses any keyword, ``from_mapping`` with the allowed fields listed; the option
    it became is given as ``positional_options``."""
    with pytest.raises(TypeError) as err:
        ModelConfig(**{old: value})
    msg = str(err.value)
    assert f"unexpected keyword argument {old!r}" in msg, msg
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_mapping({old: value})
    msg = str(err.value)
    assert f"ModelConfig has no field(s) [{old!r}]; allowed fields: [" in msg, msg
    assert "'positional_options'" in msg, msg
    # the new place holds the option
    encoding, option = place.split(".")[1:]
    new = ModelConfig(positional=encoding, positional_options={option: value})
    assert getattr(new.positional_options, option) == value


def test_unknown_constructor_field_is_still_a_plain_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'rope_bass'"):
        ModelConfig(rope_bass=500.0)  # type: ignore[call-arg]


def test_from_mapping_refuses_old_flat_fields():
    """Old flat fields are unknown fields, alone, mixed or beside the new form; the new form
    alone builds the config they described."""
    allowed = r"; allowed fields: \[.*'positional_options'"
    with pytest.raises(
        ConfigError, match=r"no field\(s\) \['rope_base', 't5_num_buckets'\]" + allowed
    ):
        ModelConfig.from_mapping({"positional": "rope", "rope_base": 500.0, "t5_num_buckets": 8})
    new = ModelConfig(positional="rope", positional_options={"base": 500.0})
    assert new.positional_options == RopeOptions(base=500.0)
    with pytest.raises(ConfigError, match=r"no field\(s\) \['max_length'\]" + allowed):
        ModelConfig.from_mapping({"positional": "learned", "max_length": 16})
    learned = ModelConfig.from_mapping(
        {"positional": "learned", "positional_options": {"max_length": 16}}
    )
    assert learned.positional_options == LearnedOptions(max_length=16)
    t5 = ModelConfig.from_mapping({"positional": "t5", "positional_options": {"num_buckets": 8}})
    assert t5.positional_options == T5Options(num_buckets=8, max_distance=128)
    old_xpos = {
        "positional": "xpos",
        "rope_base": 500.0,
        "xpos_scale_base": 4.0,
        "rope_scaling": "pi",
    }
    with pytest.raises(ConfigError, match=r"\['rope_base', 'rope_scaling', 'xpos_scale_base'\]"):
        ModelConfig.from_mapping(old_xpos)
    xpos = ModelConfig.from_mapping(
        {"positional": "xpos", "positional_options": {"base": 500.0, "scale_base": 4.0}}
    )
    assert xpos.positional_options == XPosOptions(base=500.0, scale_base=4.0)
    # old and new forms together: the old field is refused even when it agrees
    both = {"positional": "rope", "rope_base": 500.0, "positional_options": {"base": 500.0}}
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_mapping(both)
    msg = str(err.value)
    assert "no field(s) ['rope_base']" in msg and "allowed fields: [" in msg, msg
    assert ModelConfig.from_mapping({k: v for k, v in both.items() if k != "rope_base"}) == new
    # the option is validated like any option
    with pytest.raises(ConfigError, match=r"ModelConfig\.positional_options\.base=1\.0: must"):
        ModelConfig.from_mapping({"positional": "rope", "positional_options": {"base": 1.0}})


def test_from_mapping_per_encoding_options_pick_the_chosen_encoding():
    per_encoding = {
        "rope": {"base": 500.0, "original_length": 8},
        "t5": {"num_buckets": 8, "max_distance": 16},
        "learned": {"max_length": 16},
    }
    t5 = ModelConfig.from_mapping({"positional": "t5", "positional_options": per_encoding})
    assert t5 == ModelConfig(positional="t5", positional_options=T5Options(8, 16))
    rope = ModelConfig.from_mapping({"positional": "rope", "positional_options": per_encoding})
    assert rope.positional_options == RopeOptions(base=500.0, original_length=8)
    # an encoding without a section gets its defaults
    fire = ModelConfig.from_mapping({"positional": "fire", "positional_options": per_encoding})
    assert fire.positional_options == FireOptions()
    # the whole template of a study config works, with every encoding's defaults
    for name in positional_encoding_names():
        cfg = ModelConfig.from_mapping(
            {"positional": name, "positional_options": options_template()}
        )
        assert cfg == ModelConfig(positional=name)
    # every section is checked, not only the chosen one
    bad = per_encoding | {"rope": {"bse": 500.0}}
    with pytest.raises(
        ValueError, match=r"ModelConfig\.positional_options\.rope has no option\(s\) \['bse'\]"
    ):
        ModelConfig.from_mapping({"positional": "t5", "positional_options": bad})
    bad = per_encoding | {"fire": {"mlp_width": "wide"}}
    with pytest.raises(
        ValueError, match=r"ModelConfig\.positional_options\.fire\.mlp_width='wide': must be an int"
    ):
        ModelConfig.from_mapping({"positional": "t5", "positional_options": bad})
    # the chosen section is validated as the options
    with pytest.raises(ConfigError, match=r"ModelConfig\.positional_options\.max_distance=4"):
        ModelConfig.from_mapping(
            {
                "positional": "t5",
                "positional_options": {"t5": {"num_buckets": 8, "max_distance": 4}},
            }
        )


def test_options_template_lists_every_encodings_defaults():
    template = options_template()
    assert list(template) == list(positional_encoding_names())
    assert template["rope"] == dataclasses.asdict(RopeOptions())
    assert template["t5"] == {"num_buckets": 32, "max_distance": 128}
    assert template["alibi"] == {
        "slopes": "official",
        "max_bias": 8.0,
        "pi_train_length": None,
        "pi_eval_length": None,
    }
    assert template["none"] == {}


def test_from_mapping_rejects_unknown_keys():
    with pytest.raises(ValueError, match=r"no field\(s\) \['d_modle'\]") as err:
        ModelConfig.from_mapping({"d_modle": 64})
    assert "'d_model'" in str(err.value)  # the allowed fields are listed


@pytest.mark.parametrize(
    "cfg",
    [
        ModelConfig(d_model=64, num_heads=4, positional="alibi", norm="pre"),
        ModelConfig(
            positional="rope",
            positional_options={"scaling": "yarn", "scale": 2.0, "original_length": 64},
        ),
        ModelConfig(positional="t5", positional_options={"num_buckets": 8, "max_distance": 10}),
        ModelConfig(positional="learned", positional_options={"max_length": 16}),
        ModelConfig(chunked_threshold=256),
    ],
    ids=["alibi", "rope-yarn", "t5", "learned", "chunked"],
)
def test_to_dict_round_trips_through_from_mapping(cfg):
    values = cfg.to_dict()
    assert values["positional_options"] == dataclasses.asdict(cfg.positional_options)
    assert ModelConfig.from_mapping(values) == cfg
    assert ModelConfig.from_mapping(json.loads(json.dumps(values))) == cfg  # as config.json


def test_from_mapping_accepts_config_dict_and_validates():
    cd = ml_collections.ConfigDict({"d_model": 64, "num_heads": 4, "positional": "rope"})
    assert ModelConfig.from_mapping(cd) == ModelConfig(d_model=64, num_heads=4, positional="rope")
    cd = ml_collections.ConfigDict(
        {"positional": "rope", "positional_options": {"rope": {"base": 500.0}, "t5": {}}}
    )
    assert ModelConfig.from_mapping(cd).positional_options == RopeOptions(base=500.0)
    with pytest.raises(ValueError, match=r"ModelConfig\.num_heads=3"):
        ModelConfig.from_mapping({"d_model": 64, "num_heads": 3})  # and validates


def test_frozen_hashable_and_replace_validates():
    cfg = ModelConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 64  # type: ignore[misc]
    assert hash(cfg) == hash(ModelConfig()) and cfg == ModelConfig()
    assert cfg.replace(num_heads=16).head_dim == 32
    with pytest.raises(ValueError, match=r"ModelConfig\.num_heads=5"):
        cfg.replace(num_heads=5)


def test_replace_positional_resets_or_keeps_the_options():
    rope = ModelConfig(
        positional="rope", positional_options={"base": 500.0, "layout": "interleaved"}
    )
    assert rope.replace(num_heads=4).positional_options == rope.positional_options
    assert rope.replace(positional="rope") == rope  # same encoding: options kept
    xpos = rope.replace(positional="xpos")  # another encoding: its defaults, not rope's base
    assert xpos.positional_options == XPosOptions()
    assert rope.replace(positional="t5").positional_options == T5Options()
    given = rope.replace(positional="xpos", positional_options={"scale_base": 4.0})
    assert given.positional_options == XPosOptions(scale_base=4.0)
    assert rope.replace(positional_options={"base": 100.0}).positional_options == RopeOptions(
        base=100.0
    )
    with pytest.raises(ConfigError, match=r"ModelConfig\.positional_options\.base=1\.0"):
        rope.replace(positional_options={"base": 1.0})
    with pytest.raises(ConfigError, match=r"positional='t5' takes T5Options, not RopeOptions"):
        rope.replace(positional="t5", positional_options=rope.positional_options)
