"""The arithmetic parameter count (`nn.param_count`) equals the traced one (``nnx.eval_shape``
of the model, summing its parameter sizes) over a grid of tiny configs, and answers absurd
sizes at once."""

from __future__ import annotations

import dataclasses
import math
import time

import jax
import pytest
from flax import nnx
from tiny_models import tiny_model_config

from flaxformer_lite.nn import param_count
from flaxformer_lite.nn.encodings import positional_encoding_names
from flaxformer_lite.nn.model_config import ModelConfig
from flaxformer_lite.nn.models import DecoderOnlyLM, EncoderDecoder
from flaxformer_lite.nn.schedules import LayerKind

FIELDS = {f.name for f in dataclasses.fields(ModelConfig)}

# Architecture options beyond the encoding, each on its own (only those this ModelConfig has).
OPTIONS = [
    {},
    {"tie_embeddings": False},
    {"tie_embeddings": False, "use_bias": False},
    {"norm": "pre"},
    {"norm_type": "rms"},
    {"norm": "pre", "norm_bias": False},
    {"ffn_gated": True},
    {"num_kv_heads": 1},
    {"use_bias": False, "qkv_bias": True},
    {"out_bias": False, "ffn_bias": False, "head_bias": False, "tie_embeddings": False},
    {"norm": "pre", "residual": "parallel"},
    {"embedding_norm": True, "norm": "pre"},
    {"norm_type": "gemma_rms", "norm": "pre", "sandwich_norm": True},
    {"qk_norm": True, "head_size": 12, "num_kv_heads": 1},
    {"attention_sinks": True},
    {
        "num_decoder_layers": 5,
        "layer_pattern": (
            LayerKind(window=2),
            LayerKind(positional="t5", positional_options={"num_buckets": 4}),
            LayerKind(positional="none"),
        ),
    },
]
OPTIONS = [o for o in OPTIONS if set(o) <= FIELDS]
# encoding options that change its parameter count
ENCODING_OPTIONS = {
    "learned": {"max_length": 48},
    "t5": {"num_buckets": 8},
    "fire": {"mlp_width": 4},
}


def traced(model_class, cfg: ModelConfig) -> int:
    abstract = nnx.eval_shape(lambda: model_class(cfg, rngs=nnx.Rngs(0)))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def _grid():
    """Every encoding tied and untied, post- and pre-LN; every option with two encodings."""
    basic = ({}, {"tie_embeddings": False}, {"norm": "pre"})
    for encoding in positional_encoding_names():
        for options in basic:
            yield pytest.param(encoding, options, id=f"{encoding}-{options}")
    for encoding in ("t5", "rope"):
        for options in (o for o in OPTIONS if o not in basic):
            yield pytest.param(encoding, options, id=f"{encoding}-{options}")


@pytest.mark.parametrize(("encoding", "options"), list(_grid()))
def test_the_arithmetic_count_equals_the_traced_one(encoding, options):
    cfg = tiny_model_config(encoding, options=ENCODING_OPTIONS.get(encoding), **options)
    assert param_count.count_parameters(cfg) == traced(DecoderOnlyLM, cfg)
    bidirectional = not cfg.encoding.causal_only and cfg.attention_window is None
    bidirectional = bidirectional and not cfg.layer_pattern  # (decoder stacks only)
    if bidirectional and options.get("residual", "sequential") == "sequential":
        cfg = cfg.replace(num_encoder_layers=2)
        assert param_count.count_parameters(cfg, "encoder_decoder") == traced(EncoderDecoder, cfg)


def test_every_encoding_with_parameters_declares_its_count():
    """No encoding falls back to tracing itself (the fallback stays correct, but slower)."""
    for encoding in positional_encoding_names():
        cfg = tiny_model_config(encoding)
        assert cfg.encoding.num_params is not None, encoding
        assert param_count.encoding_params(cfg) == param_count._traced_encoding_params(cfg)


@pytest.mark.parametrize(
    "fields",
    [{"num_decoder_layers": 10**6}, {"d_model": 10**9, "num_heads": 2}, {"d_ff": 10**12}],
)
def test_absurd_sizes_are_counted_at_once(fields):
    cfg = tiny_model_config("learned", **fields)
    start = time.perf_counter()
    n = param_count.count_parameters(cfg)
    assert time.perf_counter() - start < 0.1
    small = tiny_model_config("learned")
    assert n > 1000 * param_count.count_parameters(small)


def test_an_unknown_model_kind_is_named():
    with pytest.raises(ValueError, match=r"model='encoder'; allowed: \['decoder_only'"):
        param_count.count_parameters(tiny_model_config(), "encoder")
