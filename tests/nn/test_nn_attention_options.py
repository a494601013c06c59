"""The attention options of `ModelConfig` through the NNX attention module: gpt-oss attention
sinks and StreamingLLM's kept first keys, against a numpy reference, in the plain, chunked and
cached paths, per layer."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tiny_models import tiny_model_config

from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.core import chunked_attention
from flaxformer_lite.nn import param_count
from flaxformer_lite.nn.models import DecoderOnlyLM
from flaxformer_lite.nn.schedules import LayerKind

B, T = 2, 12
BLOCKS = {"block_q": 4, "block_k": 4}  # the chunked path: 3 x 3 blocks of 4 for T = 12


def _tokens(seed: int, shape=(B, T)) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).integers(0, 32, shape), jnp.int32)


def _positions(length: int = T) -> jax.Array:
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (B, length))


def _set_sinks(model: DecoderOnlyLM, seed: int) -> list[np.ndarray]:
    """Distinct, non-zero sink logits in every layer that has them (0 at initialisation)."""
    rng = np.random.default_rng(seed)
    values = []
    for block in model.decoder.blocks:
        attn = block.self_attention
        if attn.sinks is not None:
            v = rng.normal(0.0, 1.5, attn.sinks.shape).astype(np.float32)
            attn.sinks[...] = jnp.asarray(v)
            values.append(v)
    return values


def _chunked_blocks(monkeypatch) -> None:
    """Make "chunked" use blocks of 4, so that T = 12 spans several query and key blocks."""
    original = chunked_attention.chunked_attention
    monkeypatch.setattr(
        chunked_attention, "chunked_attention", functools.partial(original, **BLOCKS)
    )


@functools.partial(jax.jit, static_argnums=0)
def _full_and_cached(graphdef, state, tokens, positions):
    """Full-pass logits and cached ones (3 tokens prefilled, then one at a time)."""
    model = nnx.merge(graphdef, state)
    full = model(tokens, positions)
    cache = model.init_cache(tokens.shape[0], tokens.shape[1], positions=positions)
    first, cache = model.decode_step(tokens[:, :3], positions[:, :3], cache)

    def step(cache, xs):
        token, position = xs
        logits, cache = model.decode_step(token[:, None], position[:, None], cache)
        return cache, logits[:, 0]

    _, rest = jax.lax.scan(step, cache, (tokens[:, 3:].T, positions[:, 3:].T))
    return full, jnp.concatenate([first, jnp.swapaxes(rest, 0, 1)], axis=1)


# ------------------------------------------------------------------------------- sinks


def _numpy_attention(
    attn, x: np.ndarray, sinks: np.ndarray | None, window: int | None, keep_first: int = 0
) -> np.ndarray:
    """Causal multi-head attention in numpy (no positional encoding): with gpt-oss sinks an
    extra softmax column ``s_h`` per head, dropped after the softmax; with a window W query
    i sees keys ``i - W < j <= i``, and also ``j < keep_first`` (StreamingLLM)."""

    def dense(layer, h):
        out = h @ np.asarray(layer.kernel[...], np.float64)
        return out if layer.bias is None else out + np.asarray(layer.bias[...], np.float64)

    b, t, _ = x.shape
    heads, hd = attn.num_heads, attn.head_dim
    q = dense(attn.query, x).reshape(b, t, heads, hd)
    k = dense(attn.key, x).reshape(b, t, heads, hd)
    v = dense(attn.value, x).reshape(b, t, heads, hd)
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd)
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    visible = (j <= i) & (((j > i - window) | (j < keep_first)) if window else True)
    logits = np.where(visible, logits, -np.inf)
    if sinks is not None:
        sink = np.broadcast_to(sinks[None, :, None, None], (b, heads, t, 1))
        logits = np.concatenate([logits, sink], axis=-1)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    p = p if sinks is None else p[..., :-1]
    out = np.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, t, heads * hd)
    return dense(attn.out, out)


@pytest.mark.parametrize("window", [None, 5])
def test_sinks_attention_equals_a_numpy_reference(window):
    cfg = tiny_model_config("none", attention_sinks=True, attention_window=window)
    model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
    (sinks,) = _set_sinks(model, 1)
    attn = model.decoder.blocks[0].self_attention
    x = np.random.default_rng(2).normal(size=(B, T, cfg.d_model)).astype(np.float32)
    out = attn(jnp.asarray(x), q_positions=_positions(), causal=True)
    ref = _numpy_attention(attn, x.astype(np.float64), sinks.astype(np.float64), window)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-4, atol=1e-5)
    # the sinks change the output (not the identity) and the weights sum to 1 - p_sink < 1
    plain = DecoderOnlyLM(tiny_model_config("none", attention_window=window), rngs=nnx.Rngs(0))
    plain_out = plain.decoder.blocks[0].self_attention(
        jnp.asarray(x), q_positions=_positions(), causal=True
    )
    assert not np.allclose(np.asarray(plain_out), np.asarray(out), atol=1e-3)
    w = attn.weights(jnp.asarray(x), q_positions=_positions(), causal=True)
    assert np.all(np.asarray(w).sum(-1) < 1.0)


@pytest.mark.parametrize("encoding", ["rope", "alibi"])
def test_sinks_chunked_equals_plain_and_cached_equals_full(encoding, monkeypatch):
    """A two-layer model with sinks (and a window in one layer): "chunked" in blocks of 4
    gives the "xla" logits; cached decoding token by token gives the full pass's."""
    pattern = (LayerKind(window=4), LayerKind())
    cfg = tiny_model_config(
        encoding, attention_sinks=True, layer_pattern=pattern, num_decoder_layers=2
    )
    model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
    assert len(_set_sinks(model, 3)) == 2
    tokens, positions = _tokens(0), _positions()
    full, cached = _full_and_cached(*nnx.split(model), tokens, positions)
    np.testing.assert_allclose(np.asarray(cached), np.asarray(full), rtol=1e-5, atol=1e-5)
    _chunked_blocks(monkeypatch)
    chunked = DecoderOnlyLM(cfg.replace(attention_impl="chunked"), rngs=nnx.Rngs(0))
    nnx.update(chunked, nnx.state(model, nnx.Param))
    np.testing.assert_allclose(
        np.asarray(chunked(tokens, positions)), np.asarray(full), rtol=1e-5, atol=1e-5
    )


def test_sinks_per_layer_kind_parameters_and_label():
    """``LayerKind.sinks`` overrides the model's: only those layers get ``[heads]`` sink
    logits, counted by `param_count`; the label says ``+sinks``; the gpt_oss pattern can
    carry them; a non-bool is refused naming the field."""
    pattern = (LayerKind(window=4, sinks=True), LayerKind())
    cfg = tiny_model_config("rope", layer_pattern=pattern, num_decoder_layers=3)
    assert [k.sinks for k in cfg.layer_kinds()] == [True, False, True]
    model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
    has = [b.self_attention.sinks is not None for b in model.decoder.blocks]
    assert has == [True, False, True]
    assert model.decoder.blocks[0].self_attention.sinks.shape == (cfg.num_heads,)
    traced = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert param_count.count_parameters(cfg) == traced
    assert param_count.layer_attention_params(cfg) == 2 * cfg.num_heads
    assert cfg.encoding_label() == "rope+[w4,global]+sinks"
    assert tiny_model_config("rope").encoding_label() == "rope"
    off = tiny_model_config("rope", attention_sinks=True, layer_pattern=(LayerKind(sinks=False),))
    assert [k.sinks for k in off.layer_kinds()] == [False]
    from flaxformer_lite.nn import schedules

    assert all(k.sinks for k in schedules.gpt_oss(4, sinks=True))
    with pytest.raises(ValueError, match=r"layer_pattern\[0\]\.sinks=1"):
        tiny_model_config("rope", layer_pattern=({"sinks": 1},))
    with pytest.raises(ValueError, match=r"ModelConfig\.attention_sinks='yes'"):
        tiny_model_config("rope", attention_sinks="yes")


# ------------------------------------------------------------------------- temperature

L, FLOOR, ATTN = 4, 3.0, 0.5  # temperature_length, llama4's floor_scale and attn_scale


def _numpy_tau(kind: str, positions: np.ndarray, s: np.ndarray, window: int | None):
    """The query factor ``[T, heads]`` written out from the papers' formulas."""
    p = positions.astype(np.float64)[:, None]
    if kind == "logn":  # Qwen: logn_list[i - 1] = log_L(i) if i > L else 1, i = p + 1
        return np.where(p + 1 > L, np.log(p + 1) / np.log(L), 1.0) * np.ones_like(s)
    if kind == "llama4":  # HF Llama4TextAttention: log(floor((p + 1) / f) + 1) * a + 1
        return (np.log(np.floor((p + 1) / FLOOR) + 1.0) * ATTN + 1.0) * np.ones_like(s)
    n = p + 1 if window is None else np.minimum(p + 1, window)  # SSMax: s_h log n
    return s[None, :] * np.log(n)


def _temperature_cfg(kind: str, window: int | None = None, **fields):
    return tiny_model_config(
        "none",
        attention_temperature=kind,
        temperature_length=L,
        temperature_floor_scale=FLOOR,
        temperature_attn_scale=ATTN,
        attention_window=window,
        **fields,
    )


@pytest.mark.parametrize(("kind", "window"), [("logn", None), ("llama4", None), ("ssmax", 5)])
def test_temperature_scales_the_queries_as_a_numpy_reference(kind, window):
    """The layer's output equals plain attention whose queries are multiplied by the
    factor computed in numpy; SSMax's s starts at 1 / log L (set here per head)."""
    model = DecoderOnlyLM(_temperature_cfg(kind, window), rngs=nnx.Rngs(0))
    attn = model.decoder.blocks[0].self_attention
    s = np.array([0.9, 1.7], np.float32)
    if kind == "ssmax":
        np.testing.assert_allclose(np.asarray(attn.ssmax_s[...]), 1 / np.log(L), rtol=1e-6)
        attn.ssmax_s[...] = jnp.asarray(s)
    tau = _numpy_tau(kind, np.arange(T), s, window)  # [T, heads]
    assert tau.max() > 1.2  # positions past L (and past floor_scale) are scaled
    x = np.random.default_rng(2).normal(size=(B, T, 16)).astype(np.float32)
    out = attn(jnp.asarray(x), q_positions=_positions(), causal=True)
    # the reference: the same projections, the queries scaled in numpy
    plain = DecoderOnlyLM(tiny_model_config("none", attention_window=window), rngs=nnx.Rngs(0))
    p_attn = plain.decoder.blocks[0].self_attention
    for name in ("query", "key", "value", "out"):
        nnx.update(getattr(p_attn, name), nnx.state(getattr(attn, name)))
    ref = _numpy_tempered(p_attn, x.astype(np.float64), tau, window)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-4, atol=1e-5)


def _numpy_tempered(attn, x, tau, window):
    """Causal attention in numpy with queries ``q * tau`` (tau ``[T, heads]``)."""

    def dense(layer, h):
        return h @ np.asarray(layer.kernel[...], np.float64) + np.asarray(layer.bias[...])

    b, t, _ = x.shape
    heads, hd = attn.num_heads, attn.head_dim
    q = dense(attn.query, x).reshape(b, t, heads, hd) * tau[None, :, :, None]
    k = dense(attn.key, x).reshape(b, t, heads, hd)
    v = dense(attn.value, x).reshape(b, t, heads, hd)
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd)
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    visible = (j <= i) & ((j > i - window) if window else True)
    logits = np.where(visible, logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    return dense(attn.out, np.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, t, heads * hd))


def test_temperature_per_layer_chunked_equals_plain_and_cached_equals_full(monkeypatch):
    """Three layers, one temperature each (SSMax with a window of 4): the chunked path in
    blocks of 4 and cached decoding token by token give the full pass's logits; SSMax's s
    are parameters, counted by `param_count`; the label names each temperature."""
    pattern = (
        LayerKind(temperature="logn"),
        LayerKind(window=4, temperature="ssmax"),
        LayerKind(temperature="llama4"),
    )
    cfg = _temperature_cfg("none", layer_pattern=pattern, num_decoder_layers=3)
    cfg = cfg.replace(positional="rope")
    model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
    traced = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert param_count.count_parameters(cfg) == traced
    assert cfg.encoding_label() == "rope+[global,w4,global]+logn+ssmax+llama4"
    tokens, positions = _tokens(0), _positions()
    full, cached = _full_and_cached(*nnx.split(model), tokens, positions)
    np.testing.assert_allclose(np.asarray(cached), np.asarray(full), rtol=1e-5, atol=1e-5)
    _chunked_blocks(monkeypatch)
    chunked = DecoderOnlyLM(cfg.replace(attention_impl="chunked"), rngs=nnx.Rngs(0))
    np.testing.assert_allclose(
        np.asarray(chunked(tokens, positions)), np.asarray(full), rtol=1e-5, atol=1e-5
    )


def test_temperature_config_errors_and_training_free_variant():
    """Bad values name the field; logn needs its L; ``with_temperature`` sets the factor
    and L (the training length) and keeps the parameters (none are added)."""
    with pytest.raises(ValueError, match=r"ModelConfig\.attention_temperature='log'"):
        tiny_model_config("rope", attention_temperature="log")
    with pytest.raises(ValueError, match=r"ModelConfig\.temperature_length=1"):
        tiny_model_config("rope", temperature_length=1)
    with pytest.raises(ValueError, match=r"layer_pattern\[0\]\.temperature='ssmax'"):
        tiny_model_config("rope", layer_pattern=(LayerKind(chunk=4, temperature="ssmax"),))
    with pytest.raises(ValueError, match=r"temperature_length=None"):
        DecoderOnlyLM(tiny_model_config("rope", attention_temperature="logn"), rngs=nnx.Rngs(0))
    base = tiny_model_config("rope")
    variant = base.with_temperature("logn", 16)
    assert (variant.attention_temperature, variant.temperature_length) == ("logn", 16)
    assert variant.encoding_label() == "rope+logn"
    assert param_count.count_parameters(variant) == param_count.count_parameters(base)
    with pytest.raises(ValueError, match="temperature='ssmax'"):
        base.with_temperature("ssmax", 16)
    assert base.evaluation_temperatures(("logn",)) == ("logn",)
    assert _temperature_cfg("ssmax").evaluation_temperatures(("logn",)) == ()
    assert (
        tiny_model_config("rope", attention_temperature="ssmax")
        .with_original_length(32)
        .temperature_length
        == 32
    )


# --------------------------------------------------------------------------------- FoX

FOX = {"gate_bias_init": 0.5}  # f ~ sigmoid(0.5): a visible decay within T = 12


def test_fox_attention_equals_a_numpy_reference():
    """FoX: logit (i, j) + sum_{k=j+1..i} log sigmoid(x_k . w_h + b_h), written out as the
    double sum (not as prefix sums), then causal softmax attention."""
    cfg = tiny_model_config("fox", options=FOX)
    model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
    block = model.decoder.blocks[0]
    attn, pe = block.self_attention, block.pe
    x = np.random.default_rng(2).normal(size=(B, T, cfg.d_model))
    out = attn(jnp.asarray(x, jnp.float32), q_positions=_positions(), pe=pe, causal=True)
    w, b = np.asarray(pe.w[...], np.float64), np.asarray(pe.b[...], np.float64)
    log_f = -np.log1p(np.exp(-(x @ w + b)))  # [B, T, heads]
    decay = np.zeros((B, attn.num_heads, T, T))
    for i in range(T):
        for j in range(i + 1):
            decay[:, :, i, j] = log_f[:, j + 1 : i + 1].sum(axis=1)
    assert decay.min() < -3.0  # the oldest keys are visibly forgotten

    def dense(layer, h):
        return h @ np.asarray(layer.kernel[...], np.float64) + np.asarray(layer.bias[...])

    heads, hd = attn.num_heads, attn.head_dim
    q, k, v = (dense(p, x).reshape(B, T, heads, hd) for p in (attn.query, attn.key, attn.value))
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd) + decay
    logits = np.where(np.tril(np.ones((T, T), bool)), logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    ref = dense(attn.out, np.einsum("bhqk,bkhd->bqhd", p, v).reshape(B, T, heads * hd))
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-4, atol=1e-5)


def test_fox_chunked_equals_plain_without_a_full_bias_and_cached_equals_full(monkeypatch):
    """Two FoX layers (one with a window of 4, a ring buffer in decoding): the chunked path
    in blocks of 4 gives the plain logits and never builds the [T, T] bias
    (`forgetting.forgetting_bias` is not called); cached decoding token by token gives the
    full pass's; each layer owns its gates, counted by `param_count`."""
    from flaxformer_lite.core import forgetting

    pattern = (LayerKind(window=4), LayerKind())
    cfg = tiny_model_config("fox", options=FOX, layer_pattern=pattern, num_decoder_layers=2)
    model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
    traced = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert param_count.count_parameters(cfg) == traced
    assert model.decoder.blocks[0].pe.w.shape == (cfg.d_model, cfg.num_heads)
    tokens, positions = _tokens(0), _positions()
    full, cached = _full_and_cached(*nnx.split(model), tokens, positions)
    np.testing.assert_allclose(np.asarray(cached), np.asarray(full), rtol=1e-5, atol=1e-5)
    _chunked_blocks(monkeypatch)
    calls = []
    original = forgetting.forgetting_bias
    monkeypatch.setattr(
        forgetting, "forgetting_bias", lambda *a: calls.append(a[0].shape) or original(*a)
    )
    chunked = DecoderOnlyLM(cfg.replace(attention_impl="chunked"), rngs=nnx.Rngs(0))
    np.testing.assert_allclose(
        np.asarray(chunked(tokens, positions)), np.asarray(full), rtol=1e-5, atol=1e-5
    )
    assert calls == []
    DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))(tokens, positions)  # the plain path builds it
    assert calls


def test_fox_is_causal_only_and_sees_the_layer_input():
    from flaxformer_lite.nn.models import EncoderDecoder

    with pytest.raises(ValueError, match="causal"):
        EncoderDecoder(tiny_model_config("fox"), rngs=nnx.Rngs(0))
    model = DecoderOnlyLM(tiny_model_config("fox", options=FOX), rngs=nnx.Rngs(0))
    pe = model.decoder.blocks[0].pe
    assert pe.hook == "forget"
    x = jnp.ones((1, 3, 16))
    np.testing.assert_allclose(
        np.asarray(pe.log_forget(x)),
        np.asarray(jax.nn.log_sigmoid(x @ pe.w[...] + pe.b[...][None, None, :])),
        rtol=1e-6,
    )


# ------------------------------------------------------------------ StreamingLLM's first keys


@pytest.mark.parametrize("sinks", [False, True])
def test_streaming_attention_equals_a_numpy_reference(sinks):
    """A window of 3 plus the first 2 keys (with and without gpt-oss sinks): the numpy
    attention with that visibility; it differs from the window alone."""
    cfg = tiny_model_config(
        "none", attention_window=3, attention_keep_first=2, attention_sinks=sinks
    )
    model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
    values = _set_sinks(model, 1)
    attn = model.decoder.blocks[0].self_attention
    x = np.random.default_rng(2).normal(size=(B, T, cfg.d_model)).astype(np.float32)
    out = attn(jnp.asarray(x), q_positions=_positions(), causal=True)
    sink = values[0].astype(np.float64) if sinks else None
    ref = _numpy_attention(attn, x.astype(np.float64), sink, window=3, keep_first=2)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-4, atol=1e-5)
    window_only = _numpy_attention(attn, x.astype(np.float64), sink, window=3)
    assert not np.allclose(ref, window_only, atol=1e-3)
    w = np.asarray(attn.weights(jnp.asarray(x), q_positions=_positions(), causal=True))
    assert np.all(w[..., 6:, 2] == 0) and np.all(w[..., 6:, :2] > 0)  # j=2 left the window


def test_streaming_chunked_equals_plain_and_cached_decoding_refuses(monkeypatch):
    """RoPE, a window of 4 in one of two layers, the first 2 keys kept: "chunked" in blocks
    of 4 gives the "xla" logits; the other layer (global) is unchanged by the option; cached
    decoding refuses it (a ring buffer holds the last W keys only)."""
    pattern = (LayerKind(window=4), LayerKind())
    cfg = tiny_model_config(
        "rope", layer_pattern=pattern, num_decoder_layers=2, attention_keep_first=2
    )
    model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
    assert [b.self_attention.keep_first for b in model.decoder.blocks] == [2, None]
    tokens, positions = _tokens(0), _positions()
    full = model(tokens, positions)
    plain = DecoderOnlyLM(cfg.replace(attention_keep_first=None), rngs=nnx.Rngs(0))
    assert not np.allclose(np.asarray(plain(tokens, positions)), np.asarray(full), atol=1e-4)
    _chunked_blocks(monkeypatch)
    chunked = DecoderOnlyLM(cfg.replace(attention_impl="chunked"), rngs=nnx.Rngs(0))
    np.testing.assert_allclose(
        np.asarray(chunked(tokens, positions)), np.asarray(full), rtol=1e-5, atol=1e-5
    )
    cache = model.init_cache(B, T, positions=positions)
    with pytest.raises(ValueError, match=r"attention_keep_first=2.*cached decoding"):
        model.decode_step(tokens[:, :3], positions[:, :3], cache)


def test_streaming_needs_a_window():
    with pytest.raises(ConfigError, match=r"ModelConfig\.attention_keep_first=4.*sliding window"):
        tiny_model_config("rope", attention_keep_first=4)
    with pytest.raises(ConfigError, match=r"ModelConfig\.attention_keep_first=0"):
        tiny_model_config("rope", attention_window=4, attention_keep_first=0)
