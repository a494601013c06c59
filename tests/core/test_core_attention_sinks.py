"""Attention sinks (gpt-oss) and StreamingLLM's first-keys-plus-window mask, in every path.

The spec is `np_sink_attention`, a float64 numpy forward written from the gpt-oss reference
(``sdpa`` in gpt_oss/torch/model.py: the sink logit concatenated to each row's logits, softmax,
the sink column dropped) and from StreamingLLM's mask (keys ``j < k`` or ``i - W < j <= i``).
Plain, blocked-causal, chunked and cached decoding are each compared with it or with the
plain path, forward and backward (the sink logits' gradients included).
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_lite.core import attention, attention_bias, kv_cache
from flaxformer_lite.core.chunked_attention import chunked_attention, kv_blocks_visited

B, H, D = 2, 4, 8
BLOCKS = {"block_q": 8, "block_k": 16}


def np_streaming_allowed(lq, lk, *, window=None, keep_first=None):
    """bool [lq, lk]: causal; with a window i - W < j; with keep_first also j < k."""
    i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
    allowed = j <= i
    if window is not None:
        recent = j > i - window
        if keep_first is not None:
            recent = recent | (j < keep_first)
        allowed = allowed & recent
    return allowed


def np_sink_attention(q, k, v, *, sinks=None, allowed=None, bias=None, scale=None):
    """float64 reference: (weights [b, h, lq, lk], output [b, lq, h, d]).

    ``allowed`` bool broadcastable to [b, h, lq, lk]; a row with no allowed key gives zeros
    (and, with a sink, its whole mass on the sink)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    rep = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if bias is not None:
        logits = logits + np.asarray(bias, np.float64)
    allowed = np.broadcast_to(True if allowed is None else np.asarray(allowed), logits.shape)
    logits = np.where(allowed, logits, -np.inf)
    if sinks is not None:
        sink = np.broadcast_to(
            np.asarray(sinks, np.float64)[None, :, None, None], (*logits.shape[:3], 1)
        )
        logits = np.concatenate([logits, sink], axis=-1)
    top = np.max(logits, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(logits - top)
    total = e.sum(-1, keepdims=True)
    w = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)
    if sinks is not None:
        w = w[..., :-1]  # the sink column is dropped: it carries no value
    return w, np.einsum("bhqk,bkhd->bqhd", w, v)


def _qkv(seed, lq, lk, kv_heads=H):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, lq, H, D)).astype(np.float32)
    k, v = (rng.standard_normal((B, lk, kv_heads, D)).astype(np.float32) for _ in range(2))
    return jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)


def _sinks(seed=7):
    # spread so that some heads put much mass on the sink and some little
    return jnp.asarray(np.random.default_rng(seed).normal(0.0, 2.0, H), jnp.float32)


def _loss(fn):
    return lambda *a: jnp.sum(jnp.sin(fn(*a).astype(jnp.float32) * 3.0))


# ------------------------------------------------------------------- the spec, plain path


@pytest.mark.parametrize("kv_heads", [H, 2])
@pytest.mark.parametrize("causal,padding", [(False, False), (True, False), (True, True)])
def test_plain_sinks_match_numpy(causal, padding, kv_heads):
    lq = lk = 9
    q, k, v = _qkv(1, lq, lk, kv_heads)
    sinks = _sinks()
    mask = None
    allowed = np.ones((B, 1, lq, lk), bool)
    if padding:
        valid = np.ones((B, lk), bool)
        valid[0, :3] = False  # left padding: rows 0-2 of batch 0 see no key at all
        mask = jnp.asarray(valid)[:, None, None, :]
        allowed = allowed & valid[:, None, None, :]
    if causal:
        allowed = allowed & np_streaming_allowed(lq, lk)
    w_ref, out_ref = np_sink_attention(q, k, v, sinks=sinks, allowed=allowed)
    out = attention.dot_product_attention(q, k, v, mask=mask, causal=causal, sinks=sinks)
    np.testing.assert_allclose(out, out_ref, rtol=1e-5, atol=1e-6)
    w = attention.attention_weights(q, k, mask=mask, causal=causal, sinks=sinks)
    np.testing.assert_allclose(w, w_ref, rtol=1e-5, atol=1e-7)
    # the sink absorbs mass: every row sums to less than 1, by the sink's share
    sums = np.asarray(w).sum(-1)
    assert np.all(sums < 1.0)
    if padding:
        np.testing.assert_array_equal(np.asarray(out)[0, :3], 0.0)  # no key: zeros


def test_sinks_change_the_output_and_a_very_low_sink_is_no_sink():
    q, k, v = _qkv(2, 6, 6)
    plain = attention.dot_product_attention(q, k, v, causal=True)
    low = attention.dot_product_attention(q, k, v, causal=True, sinks=jnp.full((H,), -1e4))
    with_sinks = attention.dot_product_attention(q, k, v, causal=True, sinks=_sinks())
    np.testing.assert_allclose(low, plain, rtol=1e-6, atol=1e-7)
    assert float(jnp.max(jnp.abs(with_sinks - plain))) > 1e-2


def test_sink_logit_is_not_scaled_and_equals_a_key_with_zero_value():
    """The sink is the logit of an extra key whose value is 0 (and whose logit is s_h as is,
    not multiplied by the logit scale): attention with that key appended is the same."""
    q, k, v = _qkv(3, 5, 5)
    sinks = _sinks()
    out = attention.dot_product_attention(q, k, v, sinks=sinks, scale=0.37)
    # an extra key k* with q . k* * 0.37 = s_h: k* = s_h / 0.37 * q / |q|^2, per query row, so
    # compare row by row through the numpy spec with the sink as an ordinary column instead
    logits = np.einsum("bqhd,bkhd->bhqk", np.float64(q), np.float64(k)) * 0.37
    extra = np.broadcast_to(np.asarray(sinks, np.float64)[None, :, None, None], (B, H, 5, 1))
    full = np.concatenate([logits, extra], -1)
    w = np.exp(full - full.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
    v_ext = np.concatenate([np.float64(v), np.zeros((B, 1, H, D))], axis=1)
    ref = np.einsum("bhqk,bkhd->bqhd", w, v_ext)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------- chunked == plain, with gradients


@pytest.mark.parametrize(
    "causal,window,keep_first,bias,padding,lq,lk",
    [
        (True, None, None, True, True, 37, 37),  # causal + ALiBi + key padding
        (False, None, None, True, False, 29, 53),  # bidirectional, q_len != kv_len
        (True, 7, 3, True, False, 45, 45),  # StreamingLLM: first 3 keys + window 7
        (True, 11, 20, False, True, 45, 45),  # first keys spanning two key blocks
    ],
)
def test_chunked_matches_plain_with_sinks(causal, window, keep_first, bias, padding, lq, lk):
    q, k, v = _qkv(lq * 7 + lk, lq, lk)
    sinks = _sinks(lq)
    qp, kp = jnp.arange(lq), jnp.arange(lk)
    slopes = attention_bias.alibi_slopes(H)
    bias_fn = (
        (lambda a, b: attention_bias.alibi_bias(a, b, slopes, causal=causal)) if bias else None
    )
    mask = None
    if padding:
        valid = np.ones((B, lk), bool)
        valid[1, lk - 6 :] = False
        mask = jnp.asarray(valid)[:, None, None, :]
    kw = dict(bias_fn=bias_fn, mask=mask, causal=causal, window=window, keep_first=keep_first)

    def plain(q, k, v, s):
        return attention.attend(q, k, v, q_positions=qp, k_positions=kp, sinks=s, **kw)

    def chunk(q, k, v, s):
        return chunked_attention(q, k, v, q_positions=qp, k_positions=kp, sinks=s, **kw, **BLOCKS)

    grads = lambda fn: jax.jit(jax.grad(_loss(fn), argnums=(0, 1, 2, 3)))(q, k, v, sinks)
    np.testing.assert_allclose(chunk(q, k, v, sinks), plain(q, k, v, sinks), rtol=1e-5, atol=1e-5)
    for name, a, b in zip(("q", "k", "v", "sinks"), grads(chunk), grads(plain), strict=True):
        assert np.abs(b).max() > 1e-2, name  # the gradient is not trivially zero
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=3e-5, err_msg=f"d loss / d {name}")


def test_sink_gradient_matches_finite_differences():
    """The custom VJP's sink gradient, -sum_i p_sink(i) D_i, against central differences."""
    q, k, v = _qkv(5, 20, 20)
    sinks = _sinks(5)
    pos = jnp.arange(20)

    def loss(s):
        out = chunked_attention(
            q, k, v, q_positions=pos, k_positions=pos, causal=True, sinks=s, **BLOCKS
        )
        return jnp.sum(jnp.sin(out * 3.0))

    loss = jax.jit(loss)
    g = np.asarray(jax.jit(jax.grad(loss))(sinks))
    eps = 1e-2
    for h in range(H):
        e = jnp.zeros(H).at[h].set(eps)
        fd = (float(loss(sinks + e)) - float(loss(sinks - e))) / (2 * eps)
        assert g[h] == pytest.approx(fd, rel=2e-2, abs=2e-3), h


@pytest.mark.parametrize("length", [70, 256])  # 2 and 4 query blocks in the "xla" path
def test_blocked_causal_xla_path_with_sinks_matches_numpy(length):
    assert attention.causal_query_blocks(length) > 1
    q, k, v = _qkv(length, length, length)
    sinks = _sinks()
    pos = jnp.arange(length)
    out = attention.attend(
        q, k, v, q_positions=pos, k_positions=pos, causal=True, sinks=sinks, implementation="xla"
    )
    _, ref = np_sink_attention(q, k, v, sinks=sinks, allowed=np_streaming_allowed(length, length))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=2e-6)


class SinksJitTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_attend_with_sinks_and_streaming_mask_matches_numpy(self):
        q, k, v = _qkv(11, 12, 12)
        sinks = _sinks()
        pos = jnp.arange(12)
        allowed = np_streaming_allowed(12, 12, window=4, keep_first=2)
        _, ref = np_sink_attention(q, k, v, sinks=sinks, allowed=allowed)
        for implementation in ("xla", "chunked"):
            fn = self.variant(
                functools.partial(
                    attention.attend,
                    causal=True,
                    window=4,
                    keep_first=2,
                    implementation=implementation,
                )
            )
            out = fn(q, k, v, q_positions=pos, k_positions=pos, sinks=sinks)
            chex.assert_trees_all_close(out, ref.astype(np.float32), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------ cached decoding


@pytest.mark.parametrize("window,keep_first", [(None, None), (5, None), (5, 2)])
def test_cached_decoding_with_sinks_equals_the_full_pass(window, keep_first):
    """Prefill 7 tokens, then decode 1 at a time through a KVCache: every step's output
    equals the full causal pass's row, sinks (and the streaming mask) included."""
    length, prompt = 16, 7
    q, k, v = _qkv(13, length, length, kv_heads=2)
    sinks = _sinks()
    pos = jnp.arange(length)
    full = attention.attend(
        q,
        k,
        v,
        q_positions=pos,
        k_positions=pos,
        causal=True,
        window=window,
        keep_first=keep_first,
        sinks=sinks,
    )

    @jax.jit
    def step(cache, q, k, v, step_pos):
        cache = kv_cache.write(cache, k, v, step_pos)
        mask = kv_cache.self_attention_mask(step_pos, cache, window=window, keep_first=keep_first)
        out = attention.attend(
            q,
            cache.key,
            cache.value,
            q_positions=step_pos,
            k_positions=cache.positions,
            mask=mask,
            sinks=sinks,
        )
        return cache, out

    cache = kv_cache.init_kv_cache(B, length, 2, D)
    outs = []
    for lo, hi in [(0, prompt)] + [(t, t + 1) for t in range(prompt, length)]:
        step_pos = jnp.broadcast_to(pos[lo:hi], (B, hi - lo))
        cache, out = step(cache, q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], step_pos)
        outs.append(out)
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------- StreamingLLM's mask


@pytest.mark.parametrize("lq,lk,window,keep_first", [(9, 9, 3, 2), (12, 12, 1, 4), (6, 10, 4, 1)])
def test_streaming_mask_values(lq, lk, window, keep_first):
    got = attention.streaming_mask(lq, lk, window=window, keep_first=keep_first)
    want = np_streaming_allowed(lq, lk, window=window, keep_first=keep_first)
    np.testing.assert_array_equal(got, want)
    # keep_first >= window's reach: the first keys add nothing beyond the plain window
    # only when they already lie in it; keep_first = lk gives the causal mask
    full = attention.streaming_mask(lq, lk, window=window, keep_first=lk)
    np.testing.assert_array_equal(full, attention.causal_mask(lq, lk))


def test_streaming_attention_without_sinks_matches_numpy_and_differs_from_the_window():
    q, k, v = _qkv(17, 20, 20)
    allowed = np_streaming_allowed(20, 20, window=5, keep_first=3)
    _, ref = np_sink_attention(q, k, v, allowed=allowed)
    out = attention.dot_product_attention(q, k, v, causal=True, window=5, keep_first=3)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    windowed = attention.dot_product_attention(q, k, v, causal=True, window=5)
    # rows i < W = 5 see keys 0..i either way; from row 5 on the first keys are extra
    np.testing.assert_allclose(out[:, :5], windowed[:, :5], rtol=1e-6)
    assert float(jnp.min(jnp.max(jnp.abs(out[:, 5:] - windowed[:, 5:]), axis=(0, 2, 3)))) > 1e-3


def test_streaming_kv_blocks_visited():
    # 64 tokens, blocks of 8, window 8: without keep_first 1 or 2 blocks per query block;
    # keep_first 10 (blocks 0 and 1) adds the blocks before each window's first
    base = kv_blocks_visited(64, 64, causal=True, window=8, block_q=8, block_k=8)
    more = kv_blocks_visited(64, 64, causal=True, window=8, block_q=8, block_k=8, keep_first=10)
    assert base == [1, 2, 2, 2, 2, 2, 2, 2]
    assert more == [1, 2, 3, 4, 4, 4, 4, 4]


def test_streaming_chunked_never_evaluates_blocks_outside_the_mask():
    """With window and keep_first, the forward pass's bias_fn is called for exactly the
    (query block, key block) pairs that hold a visible key."""
    calls = []

    def bias_fn(qp, kp):
        jax.debug.callback(lambda a, b: calls.append((int(a), int(b))), qp[0, 0], kp[0, 0])
        return jnp.zeros((1, 1, qp.shape[1], kp.shape[1]), jnp.float32)

    length, bs = 48, 8
    q, k, v = _qkv(19, length, length)
    pos = jnp.arange(length)
    chunked_attention(
        q,
        k,
        v,
        q_positions=pos,
        k_positions=pos,
        bias_fn=bias_fn,
        causal=True,
        window=8,
        keep_first=3,
        block_q=bs,
        block_k=bs,
    )
    jax.effects_barrier()
    allowed = np_streaming_allowed(length, length, window=8, keep_first=3)
    blocks = allowed.reshape(length // bs, bs, length // bs, bs).any(axis=(1, 3))
    want = {(i * bs, j * bs) for i, j in zip(*np.nonzero(blocks), strict=True)}
    assert set(calls) == want


# ------------------------------------------------------------------------------ errors


def test_sink_and_streaming_argument_errors():
    q, k, v = _qkv(23, 4, 4)
    pos = jnp.arange(4)
    with pytest.raises(ValueError, match=r"sinks=float32\[3\]: must be a float array of shape"):
        attention.dot_product_attention(q, k, v, sinks=jnp.zeros(3))
    with pytest.raises(ValueError, match=r"sinks=int32\[4\]"):
        attention.attend(q, k, v, q_positions=pos, k_positions=pos, sinks=jnp.zeros(4, jnp.int32))
    with pytest.raises(ValueError, match=r"sinks=float32\[1, 4\]"):
        chunked_attention(q, k, v, q_positions=pos, k_positions=pos, sinks=jnp.zeros((1, H)))
    with pytest.raises(ValueError, match="keep_first=2: keeping the first keys needs a sliding"):
        attention.dot_product_attention(q, k, v, causal=True, keep_first=2)
    with pytest.raises(ValueError, match="keep_first=0: must be a positive int"):
        attention.attend(
            q, k, v, q_positions=pos, k_positions=pos, causal=True, window=2, keep_first=0
        )
    with pytest.raises(ValueError, match="keep_first=2: keeping the first keys"):
        chunked_attention(q, k, v, q_positions=pos, k_positions=pos, causal=True, keep_first=2)
    cache = kv_cache.init_kv_cache(B, 4, H, D)
    with pytest.raises(ValueError, match="keep_first=1: keeping the first keys"):
        kv_cache.self_attention_mask(pos, cache, keep_first=1)


def test_fused_kernel_declines_sinks_with_a_reason_and_auto_falls_back(caplog):
    reason = attention._fused_unavailable_reason(
        "gpu", (jnp.bfloat16,) * 3, has_bias=False, softmax_extras=True
    )
    assert reason == attention._SOFTMAX_REASON
    assert attention._fused_unavailable_reason("gpu", (jnp.bfloat16,) * 3, has_bias=False) is None
    q, k, v = _qkv(29, 6, 6)
    pos = jnp.arange(6)
    sinks = _sinks()
    auto = attention.attend(
        q, k, v, q_positions=pos, k_positions=pos, causal=True, sinks=sinks, implementation="auto"
    )
    xla = attention.attend(q, k, v, q_positions=pos, k_positions=pos, causal=True, sinks=sinks)
    np.testing.assert_allclose(auto, xla, rtol=1e-6)
