"""Tests of `ModelConfig`: base-Transformer defaults and validation errors that name the
field, the value and what is allowed (DESIGN.md §6)."""

from __future__ import annotations

import dataclasses
import re

import ml_collections
import pytest

from flaxformer_lite.core import attention
from flaxformer_lite.nn.encodings import positional_encoding_names
from flaxformer_lite.nn.model_config import ModelConfig


def test_defaults_are_the_base_transformer():
    cfg = ModelConfig()
    assert (cfg.num_encoder_layers, cfg.num_decoder_layers) == (6, 6)
    assert (cfg.d_model, cfg.num_heads, cfg.d_ff, cfg.head_dim) == (512, 8, 2048, 64)
    assert cfg.dropout_rate == 0.1
    assert (cfg.norm, cfg.activation, cfg.positional) == ("post", "relu", "sinusoidal")
    assert (cfg.rope_base, cfg.sinusoidal_base, cfg.rope_layout) == (10000.0, 10000.0, "half")
    assert cfg.vocab_size == 256 and cfg.dtype == "float32" and cfg.param_dtype == "float32"


def _check(changes, field, value, allowed):
    with pytest.raises(ValueError) as err:
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
        ("max_length", -1),
        ("d_model", 16.0),
        ("d_model", True),
    ],
)
def test_sizes_must_be_positive_ints(field, value):
    _check({field: value}, field, value, "positive int")


@pytest.mark.parametrize("field", ["num_encoder_layers", "num_decoder_layers"])
def test_layer_counts_must_be_non_negative(field):
    _check({field: -1}, field, -1, ">= 0")
    assert getattr(ModelConfig(**{field: 0}), field) == 0  # zero layers is allowed


def test_d_model_must_divide_by_num_heads():
    _check({"d_model": 30, "num_heads": 4}, "num_heads", 4, r"d_model=30 must be divisible")


def test_rope_needs_an_even_head_dim():
    _check(
        {"d_model": 12, "num_heads": 4, "positional": "rope"},
        "positional",
        "rope",
        r"even head_dim.*d_model=12.*num_heads=4.*= 3",
    )
    ModelConfig(d_model=12, num_heads=4, positional="sinusoidal")  # odd head_dim is fine there
    ModelConfig(d_model=12, num_heads=3, positional="rope")  # head_dim 4


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
    _check({"positional": "rope", "rope_layout": "zigzag"}, "rope_layout", "zigzag", "'half'")
    _check({"rope_base": 1.0}, "rope_base", 1.0, "> 1")
    _check({"sinusoidal_base": 0}, "sinusoidal_base", 0, "> 1")


def test_from_mapping_rejects_unknown_keys():
    with pytest.raises(ValueError, match=r"no field\(s\) \['d_modle'\]") as err:
        ModelConfig.from_mapping({"d_modle": 64})
    assert "'d_model'" in str(err.value)  # the allowed fields are listed


def test_from_mapping_round_trips_and_accepts_config_dict():
    cfg = ModelConfig(d_model=64, num_heads=4, positional="alibi", norm="pre")
    assert ModelConfig.from_mapping(cfg.to_dict()) == cfg
    cd = ml_collections.ConfigDict({"d_model": 64, "num_heads": 4, "positional": "rope"})
    assert ModelConfig.from_mapping(cd) == ModelConfig(d_model=64, num_heads=4, positional="rope")
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
