"""The `ModelConfig` options of pretrained families (DESIGN.md §8), each against a numpy
reference computed another way: RMSNorm and LayerNorm without bias, exact (erf) GELU, SiLU,
the gated feed-forward, grouped-query attention (numpy repeat-kv attention), per-projection
biases, the parallel residual, the embedding norm, learned / sinusoidal position offsets,
fairseq's sinusoid and ALiBi's options; cached decoding equal to the full forward pass with
grouped-query attention (the cache holding only the key/value heads) for every positional
encoding family; and the cached-rotated-keys mechanism of dynamic NTK."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tiny_models import tiny_model_config

from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.nn import layers
from flaxformer_lite.nn.encodings.attention_bias import ALiBiOptions
from flaxformer_lite.nn.encodings.base import PositionalEncoding
from flaxformer_lite.nn.model_config import ModelConfig, check_encodable
from flaxformer_lite.nn.models import DecoderOnlyLM, EncoderDecoder

X_SHAPE = (2, 5, 16)


def _x(seed=0, shape=X_SHAPE):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _p(module, name):
    return np.asarray(getattr(module, name)[...], np.float64)


def np_dense(lin, x):
    y = np.asarray(x, np.float64) @ _p(lin, "kernel")
    return y if lin.bias is None else y + _p(lin, "bias")


def np_norm(norm, x, *, rms, eps):
    x = np.asarray(x, np.float64)
    if rms:
        y = x / np.sqrt(np.mean(x**2, -1, keepdims=True) + eps)
    else:
        mu = x.mean(-1, keepdims=True)
        y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    y = y * _p(norm, "scale")
    bias = getattr(norm, "bias", None)
    return y if bias is None else y + np.asarray(bias[...], np.float64)


def np_erf_gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def np_tanh_gelu(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


NP_ACT = {
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": np_tanh_gelu,
    "gelu_exact": np_erf_gelu,
    "silu": lambda x: x / (1.0 + np.exp(-x)),
}


def np_ffn(ffn, x, activation):
    h = NP_ACT[activation](np_dense(ffn.wi, x))
    if ffn.wu is not None:
        h = h * np_dense(ffn.wu, x)
    return np_dense(ffn.wo, h)


def np_self_attention(mha, x, *, causal=True):
    """Numpy multi-head / grouped-query self-attention without positional encoding: query
    head h uses key/value head h // (H / KV) (HF repeat_kv)."""
    b, length, _ = x.shape
    hd = mha.head_dim
    q = np_dense(mha.query, x).reshape(b, length, -1, hd)
    k = np_dense(mha.key, x).reshape(b, length, -1, hd)
    v = np_dense(mha.value, x).reshape(b, length, -1, hd)
    groups = q.shape[2] // k.shape[2]
    out = np.zeros(q.shape)
    for h in range(q.shape[2]):
        logits = np.einsum("bqd,bkd->bqk", q[:, :, h], k[:, :, h // groups]) / math.sqrt(hd)
        if causal:
            logits = np.where(np.tril(np.ones((length, length), bool)), logits, -np.inf)
        w = np.exp(logits - logits.max(-1, keepdims=True))
        out[:, :, h] = np.einsum("bqk,bkd->bqd", w / w.sum(-1, keepdims=True), v[:, :, h // groups])
    return np_dense(mha.out, out.reshape(b, length, -1))


# ----------------------------------------------------------------------------- config


def test_defaults_keep_todays_model():
    cfg = ModelConfig()
    assert (cfg.norm_type, cfg.norm_epsilon, cfg.norm_bias, cfg.activation) == (
        "layer",
        1e-6,
        True,
        "relu",
    )
    assert (cfg.ffn_gated, cfg.num_kv_heads, cfg.kv_heads, cfg.residual) == (
        False,
        None,
        8,
        "sequential",
    )
    assert not cfg.embedding_norm
    assert all(cfg.bias_of(p) for p in ("qkv", "out", "ffn", "head"))
    cfg = tiny_model_config("none", use_bias=False, qkv_bias=True)
    assert cfg.bias_of("qkv") and not cfg.bias_of("out") and not cfg.bias_of("ffn")
    # the default model's parameters: no wu, no embed_norm, full-width key/value
    model = DecoderOnlyLM(tiny_model_config("none", norm="pre"), rngs=nnx.Rngs(0))
    paths = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    assert not any("wu" in p or "embed_norm" in p for p in paths)
    assert "decoder/blocks/0/self_attention_norm/norm/bias" in paths
    assert model.decoder.blocks[0].self_attention.key.kernel.shape == (16, 16)


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"num_kv_heads": 3, "num_heads": 4}, r"num_kv_heads=3: must divide num_heads=4"),
        ({"num_kv_heads": 0}, r"num_kv_heads=0"),
        ({"residual": "parallel"}, r"residual='parallel': .* needs norm='pre'; got norm='post'"),
        ({"residual": "both"}, r"residual='both': allowed values: \['sequential', 'parallel'\]"),
        ({"activation": "swish"}, r"activation='swish': allowed values: \['relu', 'gelu', "),
        ({"norm_type": "batch"}, r"norm_type='batch': allowed values: \['layer', 'rms', 'gemma"),
        ({"norm_epsilon": 0.0}, r"norm_epsilon=0.0: must be a number in \(0, 1\)"),
        ({"qkv_bias": "yes"}, r"qkv_bias='yes': must be a bool or None"),
        ({"ffn_gated": 1}, r"ffn_gated=1: must be a bool"),
        # every bool field is checked, by its annotation
        ({"tie_embeddings": 1}, r"tie_embeddings=1: must be a bool"),
        ({"scale_embeddings": "no"}, r"scale_embeddings='no': must be a bool"),
        ({"head_bias": 0}, r"head_bias=0: must be a bool or None"),
    ],
)
def test_bad_options_name_field_value_and_allowed(fields, message):
    with pytest.raises(ConfigError, match=rf"ModelConfig\.{message}"):
        ModelConfig(**fields)


# -------------------------------------------------------------------- norm, activation


@pytest.mark.parametrize(
    "fields",
    [
        {"norm_type": "rms", "norm_epsilon": 1e-5},
        {"norm_type": "layer", "norm_bias": False, "norm_epsilon": 1e-5},
        {"norm_type": "layer", "norm_epsilon": 0.5},
    ],
)
def test_norms_match_numpy(fields):
    cfg = tiny_model_config("none", **fields)
    norm = layers._norm(cfg, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(1)
    norm.scale[...] = jnp.asarray(rng.normal(size=16), jnp.float32)
    has_bias = cfg.norm_type == "layer" and cfg.norm_bias
    assert (getattr(norm, "bias", None) is not None) == has_bias
    if has_bias:
        norm.bias[...] = jnp.asarray(rng.normal(size=16), jnp.float32)
    x = _x() * 3.0 + 1.0
    ref = np_norm(norm, x, rms=cfg.norm_type == "rms", eps=cfg.norm_epsilon)
    np.testing.assert_allclose(norm(jnp.asarray(x)), ref, atol=2e-5)


@pytest.mark.parametrize(
    "activation,gated",
    [("gelu_exact", False), ("gelu", False), ("silu", True), ("gelu_exact", True)],
)
def test_feed_forward_matches_numpy(activation, gated):
    cfg = tiny_model_config("none", activation=activation, ffn_gated=gated)
    ffn = layers.FeedForward(cfg, rngs=nnx.Rngs(0))
    assert (ffn.wu is not None) == gated
    x = _x() * 2.0
    np.testing.assert_allclose(ffn(jnp.asarray(x)), np_ffn(ffn, x, activation), atol=2e-5)


def test_exact_and_tanh_gelu_differ():
    x = jnp.linspace(-4.0, 4.0, 81)
    exact, tanh = layers.ACTIVATION_FNS["gelu_exact"](x), layers.ACTIVATION_FNS["gelu"](x)
    np.testing.assert_allclose(exact, np_erf_gelu(np.asarray(x, np.float64)), atol=1e-6)
    assert float(jnp.max(jnp.abs(exact - tanh))) > 1e-4


# ------------------------------------------------------------- attention and biases


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_gqa_attention_matches_numpy_repeat_kv(kv_heads):
    cfg = tiny_model_config("none", num_heads=4, num_kv_heads=kv_heads)
    mha = layers.MultiHeadAttention(cfg, rngs=nnx.Rngs(0))
    assert mha.key.kernel.shape == mha.value.kernel.shape == (16, kv_heads * 4)
    assert mha.query.kernel.shape == mha.out.kernel.shape == (16, 16)
    x = _x()
    out = mha(jnp.asarray(x), q_positions=jnp.arange(5), causal=True)
    np.testing.assert_allclose(out, np_self_attention(mha, x), atol=2e-5)
    weights = mha.weights(jnp.asarray(x), q_positions=jnp.arange(5), causal=True)
    assert weights.shape == (2, 4, 5, 5)
    np.testing.assert_allclose(jnp.sum(weights, -1), 1.0, atol=1e-6)


def test_per_projection_biases():
    cfg = tiny_model_config("none", use_bias=False, qkv_bias=True, tie_embeddings=False)
    model = DecoderOnlyLM(cfg.replace(norm="pre"), rngs=nnx.Rngs(0))
    block = model.decoder.blocks[0]
    att = block.self_attention
    assert all(getattr(att, n).bias is not None for n in ("query", "key", "value"))
    assert att.out.bias is None and block.ffn.wi.bias is None and block.ffn.wo.bias is None
    assert model.decoder.embed.head.bias is None
    cfg = tiny_model_config("none", out_bias=False, ffn_bias=False, tie_embeddings=False)
    model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
    block = model.decoder.blocks[0]
    assert block.self_attention.query.bias is not None and block.self_attention.out.bias is None
    assert block.ffn.wi.bias is None and model.decoder.embed.head.bias is not None
    cfg = tiny_model_config("none", head_bias=False, tie_embeddings=False)
    assert DecoderOnlyLM(cfg, rngs=nnx.Rngs(0)).decoder.embed.head.bias is None


# ---------------------------------------------------------------- parallel residual


def test_parallel_residual_block_matches_numpy():
    cfg = tiny_model_config(
        "none",
        norm="pre",
        residual="parallel",
        num_heads=4,
        num_kv_heads=2,
        activation="gelu_exact",
        norm_epsilon=1e-5,
    )
    block = layers.DecoderBlock(cfg, cross_attention=False, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(3)
    for an in (block.self_attention_norm, block.ffn_norm):  # distinct norm1 / norm2
        an.norm.scale[...] = jnp.asarray(rng.normal(size=16), jnp.float32)
        an.norm.bias[...] = jnp.asarray(rng.normal(size=16), jnp.float32)
    pe = cfg.encoding.build(cfg, rngs=nnx.Rngs(0))
    x = _x()
    out = block(jnp.asarray(x), jnp.broadcast_to(jnp.arange(5), (2, 5)), pe=pe)
    n1 = np_norm(block.self_attention_norm.norm, x, rms=False, eps=1e-5)
    n2 = np_norm(block.ffn_norm.norm, x, rms=False, eps=1e-5)
    ref = x + np_self_attention(block.self_attention, n1) + np_ffn(block.ffn, n2, "gelu_exact")
    np.testing.assert_allclose(out, ref, atol=5e-5)


def test_parallel_residual_refuses_cross_attention():
    cfg = tiny_model_config("none", norm="pre", residual="parallel")
    with pytest.raises(ValueError, match=r"residual='parallel'.*without cross-attention"):
        layers.DecoderBlock(cfg, cross_attention=True, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"residual='parallel'"):
        EncoderDecoder(cfg, rngs=nnx.Rngs(0))


# ------------------------------------------------ embedding norm and position offsets


def test_embedding_norm_and_learned_offset_match_numpy():
    """With no blocks the logits are head(final_norm(embed_norm(embed + table[p + 2]))): the
    embedding norm sits after the positional add (BLOOM), the learned row is p + offset (OPT)."""
    cfg = tiny_model_config(
        "learned",
        options={"max_length": 10, "offset": 2},
        norm="pre",
        norm_type="rms",
        embedding_norm=True,
        num_decoder_layers=0,
        tie_embeddings=False,
        scale_embeddings=False,
    )
    model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
    dec = model.decoder
    dec.embed_norm.scale[...] = jnp.linspace(0.5, 2.0, 16)
    tokens = jnp.asarray([[1, 5, 7, 2], [3, 3, 0, 9]])
    positions = jnp.asarray([[0, 1, 2, 3], [4, 5, 6, 7]])
    logits = model(tokens, positions)
    table, emb = _p(dec.pe, "table"), _p(dec.embed.embed, "embedding")
    h = emb[np.asarray(tokens)] + table[np.asarray(positions) + 2]
    h = np_norm(dec.embed_norm, h, rms=True, eps=cfg.norm_epsilon)
    h = np_norm(dec.final_norm, h, rms=True, eps=cfg.norm_epsilon)
    np.testing.assert_allclose(logits, np_dense(dec.embed.head, h), atol=2e-5)
    assert cfg.encoding.capacity(cfg.positional_options) == 8
    with pytest.raises(ValueError, match=r"max_length=10 - offset=2 rows .* max_length >= 11"):
        model(jnp.zeros((1, 9), jnp.int32))
    with pytest.raises(ConfigError, match=r"learned\.max_length=10: must be >= 11"):
        check_encodable(cfg, 9, what="the longest evaluation sequence")
    with pytest.raises(ConfigError, match=r"positional_options\.offset=10: must be < max_length"):
        tiny_model_config("learned", options={"max_length": 10, "offset": 10})


def test_fairseq_sinusoid_with_offset_in_the_model():
    cfg = tiny_model_config("sinusoidal", options={"variant": "fairseq", "offset": 2})
    pe = cfg.encoding.build(cfg, rngs=nnx.Rngs(0))
    positions = jnp.asarray([[0, 1, 2], [5, 6, 7]])
    x = jnp.zeros((2, 3, 16))
    half = 8
    freqs = np.exp(-math.log(10000.0) * np.arange(half) / (half - 1))
    angles = (np.asarray(positions) + 2)[..., None] * freqs
    ref = np.concatenate([np.sin(angles), np.cos(angles)], -1)
    np.testing.assert_allclose(pe.add(x, positions), ref, atol=1e-5)
    default = tiny_model_config("sinusoidal").encoding.build(
        tiny_model_config("sinusoidal"), rngs=nnx.Rngs(0)
    )
    assert (default.variant, default.offset) == ("vaswani", 0)
    with pytest.raises(ConfigError, match=r"positional_options\.variant='xglm': allowed"):
        tiny_model_config("sinusoidal", options={"variant": "xglm"})
    with pytest.raises(ConfigError, match=r"positional_options\.offset=-1: must be an int >= 0"):
        tiny_model_config("sinusoidal", options={"offset": -1})


def test_alibi_options():
    cfg = tiny_model_config("alibi", options={"slopes": "mpt", "max_bias": 16.0}, num_heads=4)
    assert cfg.positional_options == ALiBiOptions(slopes="mpt", max_bias=16.0)
    pe = cfg.encoding.build(cfg, rngs=nnx.Rngs(0))
    np.testing.assert_allclose(pe.slope_values(), 2.0 ** (-4.0 * np.arange(1, 5)), rtol=1e-6)
    bias = pe.bias(jnp.arange(3)[None], jnp.arange(3)[None], causal=True)
    np.testing.assert_allclose(bias[0, 1, 2], -(2.0**-8) * np.array([2, 1, 0]), rtol=1e-6)
    with pytest.raises(ConfigError, match=r"positional_options\.slopes='bloom': allowed"):
        tiny_model_config("alibi", options={"slopes": "bloom"})
    with pytest.raises(ConfigError, match=r"positional_options\.max_bias=0\.0: must be a finite"):
        tiny_model_config("alibi", options={"max_bias": 0.0})


# ------------------------------------------------------ cached decoding == full forward

CACHED = {
    # encoding: (options, extra fields): each family once, mixing the architecture options
    "none": ({}, {"norm_type": "rms", "activation": "silu", "ffn_gated": True}),
    "sinusoidal": ({"variant": "fairseq", "offset": 2}, {"activation": "gelu_exact"}),
    "learned": ({"max_length": 12, "offset": 2}, {"embedding_norm": True}),
    "rope": ({}, {"norm_type": "rms", "ffn_gated": True, "activation": "silu"}),
    "xpos": ({}, {"residual": "parallel"}),
    "alibi": ({"slopes": "mpt"}, {"embedding_norm": True, "norm_bias": False}),
    "t5": ({}, {"residual": "parallel", "qkv_bias": True, "use_bias": False}),
    "fire": ({}, {}),
}


@pytest.mark.parametrize("name", sorted(CACHED))
def test_cached_decoding_equals_full_forward_with_gqa(name):
    options, fields = CACHED[name]
    cfg = tiny_model_config(
        name,
        options=options,
        num_heads=4,
        num_kv_heads=2,
        num_decoder_layers=2,
        norm="pre",
        **fields,
    )
    model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, size=(2, 7)))
    full = model(tokens)
    cache = model.init_cache(2, 7)
    assert cache.self_attention[0].key.shape == (2, 7, 2, 4)  # only the key/value heads
    logits, cache = model.decode_step(tokens[:, :4], jnp.arange(4), cache)
    steps = [logits]
    for i in range(4, 7):
        logits, cache = model.decode_step(tokens[:, i : i + 1], jnp.asarray([i]), cache)
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, 1), full, atol=5e-5)


# ------------------------------------------------------------- cached rotated keys


class _LengthScaledRotation(PositionalEncoding):
    """A toy rotate-hook encoding whose transform depends on the largest key position (as
    dynamic NTK's scale does): q and k are multiplied by 1 + max(k_positions) / 10."""

    hook = "rotate"

    def rotate(self, q, k, q_positions, k_positions):
        scale = 1.0 + jnp.max(k_positions).astype(jnp.float32) / 10.0
        return q * scale, k * scale


class _CachingLengthScaledRotation(_LengthScaledRotation):
    caches_rotated_keys = True


@pytest.mark.parametrize("caches", [False, True])
def test_decode_step_caches_rotated_keys_when_the_encoding_says_so(caches):
    cfg = tiny_model_config("none", num_heads=4, num_kv_heads=2)
    mha = layers.MultiHeadAttention(cfg, rngs=nnx.Rngs(0))
    pe = (_CachingLengthScaledRotation if caches else _LengthScaledRotation)()
    assert pe.caches_rotated_keys is caches and PositionalEncoding.caches_rotated_keys is False
    x = jnp.asarray(_x(shape=(1, 4, 16)))
    cache = mha.init_cache(1, 4)
    _, cache = mha.decode_step(x[:, :3], jnp.arange(3), cache, pe=pe)
    out, cache = mha.decode_step(x[:, 3:], jnp.asarray([3]), cache, pe=pe)
    k = mha._split(mha.key(x))
    if caches:  # each key keeps the scale of the step that wrote it (HF's cached generation)
        expected_keys = jnp.concatenate([k[:, :3] * 1.2, k[:, 3:] * 1.3], 1)
    else:  # unrotated keys; each step scales the whole cache by its largest slot position
        expected_keys = k
    np.testing.assert_allclose(cache.key, expected_keys, rtol=1e-6, atol=1e-6)
    # the last query against the keys as used, by hand (query scaled by 1 + 3/10)
    q = mha._split(mha.query(x))[:, 3:] * 1.3
    used = expected_keys if caches else k * 1.3
    v = mha._split(mha.value(x))
    groups = 2
    heads = []
    for h in range(4):
        logits = jnp.einsum("bqd,bkd->bqk", q[:, :, h], used[:, :, h // groups]) / 2.0
        heads.append(jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(logits, -1), v[:, :, h // groups]))
    ref = mha.out(jnp.stack(heads, 2).reshape(1, 1, 16))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
