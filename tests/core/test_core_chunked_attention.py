"""Chunked (online-softmax) attention against the plain implementation, and the dispatch.

The plain `attention.dot_product_attention` is itself tested against a float64 numpy
reference in test_core_attention.py; here every chunked result is compared with it (and, for
the bias, with a numpy ALiBi), forward and backward, on shapes chosen so that the lengths
are not multiples of the block sizes and several blocks are visited.
"""

from __future__ import annotations

import functools
import logging
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxformer_lite.core import attention, attention_bias
from flaxformer_lite.core.chunked_attention import chunked_attention, kv_blocks_visited

B, H, D = 2, 4, 8
BLOCKS = {"block_q": 8, "block_k": 16}


def _qkv(seed, lq, lk, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((B, n, H, D)).astype(np.float32) for n in (lq, lk, lk))
    return tuple(jnp.asarray(a, dtype) for a in (q, k, v))


def _positions(length, offset=0):
    return jnp.broadcast_to(jnp.arange(offset, offset + length, dtype=jnp.int32), (B, length))


def _alibi(causal):
    slopes = attention_bias.alibi_slopes(H)
    return lambda qp, kp: attention_bias.alibi_bias(qp, kp, slopes, causal=causal)


def _plain(q, k, v, qp, kp, bias_fn, mask, causal, window=None):
    bias = None if bias_fn is None else bias_fn(qp, kp)
    return attention.dot_product_attention(
        q, k, v, mask=mask, bias=bias, causal=causal, window=window
    )


def _chunked(q, k, v, qp, kp, bias_fn, mask, causal, window=None, **blocks):
    return chunked_attention(
        q,
        k,
        v,
        q_positions=qp,
        k_positions=kp,
        bias_fn=bias_fn,
        mask=mask,
        causal=causal,
        window=window,
        **(blocks or BLOCKS),
    )


def _loss(fn):
    # A non-linear read-out so every output element gets a different cotangent.
    return lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v).astype(jnp.float32) * 3.0))


def _out_and_grads(fn):
    """One compiled function: ``fn(q, k, v)`` and the gradients of `_loss` w.r.t. q, k, v."""
    return jax.jit(lambda q, k, v: (fn(q, k, v), jax.grad(_loss(fn), argnums=(0, 1, 2))(q, k, v)))


# ----------------------------------------------------------------------------- exactness


@pytest.mark.parametrize(
    "causal,bias,padding,lq,lk",
    [
        (True, False, False, 37, 37),  # causal self-attention, 37 = 4*8 + 5 and 2*16 + 5
        (True, True, True, 37, 37),  # + ALiBi + key padding
        (False, True, False, 29, 53),  # q_len != kv_len, bidirectional ALiBi
        (False, False, True, 40, 32),  # divisible lengths, padding only
        (True, True, False, 45, 21),  # causal with more queries than keys
    ],
)
def test_chunked_matches_plain_forward_and_gradients(causal, bias, padding, lq, lk):
    q, k, v = _qkv(lq * 100 + lk, lq, lk)
    qp, kp = _positions(lq, offset=lk - lq if lk > lq else 0), _positions(lk)
    bias_fn = _alibi(causal) if bias else None
    mask = None
    if padding:
        valid = np.ones((B, lk), bool)
        valid[0, lk - 7 :] = False  # right padding
        valid[1, :3] = False  # left padding
        mask = jnp.asarray(valid)[:, None, None, :]

    plain = lambda q, k, v: _plain(q, k, v, qp, kp, bias_fn, mask, causal)
    chunk = lambda q, k, v: _chunked(q, k, v, qp, kp, bias_fn, mask, causal)
    ref, g_ref = _out_and_grads(plain)(q, k, v)
    out, g_out = _out_and_grads(chunk)(q, k, v)
    assert out.shape == q.shape and out.dtype == q.dtype
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    for name, a, b in zip("qkv", g_out, g_ref, strict=True):
        assert np.abs(b).max() > 1e-2, name  # the gradient is not trivially zero
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5, err_msg=f"d loss / d {name}")


def test_alibi_bias_matches_numpy_reference():
    """The per-block bias reproduces the numpy ALiBi, -m_h (i - j), through the output."""
    lq = lk = 21
    q, k, v = _qkv(3, lq, lk)
    qp = kp = _positions(lq)
    slopes = np.asarray(attention_bias.alibi_slopes(H), np.float64)
    rel = np.arange(lq)[:, None] - np.arange(lk)[None, :]
    logits = np.einsum("bqhd,bkhd->bhqk", np.float64(q), np.float64(k)) / np.sqrt(D)
    logits = logits - slopes[None, :, None, None] * rel[None, None]
    logits = np.where(rel[None, None] >= 0, logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    ref = np.einsum("bhqk,bkhd->bqhd", w / w.sum(-1, keepdims=True), np.float64(v))
    out = _chunked(q, k, v, qp, kp, _alibi(True), None, True, block_q=4, block_k=8)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_fully_masked_rows_are_zero_with_finite_gradients():
    lq, lk = 19, 23
    q, k, v = _qkv(5, lq, lk)
    qp, kp = _positions(lq), _positions(lk)
    q_valid = np.ones((B, lq), bool)
    q_valid[0, -4:] = False  # padding queries: their rows are fully masked
    kv_valid = np.ones((B, lk), bool)
    kv_valid[1, :] = False  # an all-padding batch row: every row fully masked
    mask = attention.padding_mask(jnp.asarray(q_valid), jnp.asarray(kv_valid))
    chunk = lambda q, k, v: _chunked(q, k, v, qp, kp, _alibi(True), mask, True)
    plain = lambda q, k, v: _plain(q, k, v, qp, kp, _alibi(True), mask, True)
    out, grads = _out_and_grads(chunk)(q, k, v)
    ref, refs = _out_and_grads(plain)(q, k, v)
    assert np.all(np.isfinite(out))
    assert np.all(np.asarray(out)[0, -4:] == 0.0) and np.all(np.asarray(out)[1] == 0.0)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, refs, strict=True):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)


def test_bfloat16_inputs_match_plain_and_float32():
    lq = lk = 40
    q, k, v = _qkv(7, lq, lk, jnp.bfloat16)
    qp = kp = _positions(lq)
    chunk = lambda q, k, v: _chunked(q, k, v, qp, kp, _alibi(True), None, True)
    plain = lambda q, k, v: _plain(q, k, v, qp, kp, _alibi(True), None, True)
    out, grads = _out_and_grads(chunk)(q, k, v)
    ref16 = jax.jit(plain)(q, k, v)
    ref32, refs32 = _out_and_grads(plain)(*(a.astype(jnp.float32) for a in (q, k, v)))
    assert out.dtype == jnp.bfloat16
    o = np.asarray(out, np.float32)
    np.testing.assert_allclose(o, np.asarray(ref16, np.float32), atol=2e-2, rtol=2e-2)
    np.testing.assert_allclose(o, ref32, atol=2e-2, rtol=2e-2)
    for g, g_ref in zip(grads, refs32, strict=True):
        assert g.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(g, np.float32), g_ref, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("window", [None, 11])
def test_gradient_reaches_parameters_the_bias_fn_closes_over(window):
    """A learned bias (here: trainable ALiBi slopes) gets the plain implementation's gradient."""
    lq = lk = 33
    q, k, v = _qkv(11, lq, lk)
    qp = kp = _positions(lq)

    def loss(slopes, impl):
        bias_fn = lambda a, b: attention_bias.alibi_bias(a, b, slopes)
        if impl == "chunked":
            out = _chunked(q, k, v, qp, kp, bias_fn, None, True, window)
        else:
            out = _plain(q, k, v, qp, kp, bias_fn, None, True, window)
        return jnp.sum(jnp.sin(out * 3.0))

    slopes = attention_bias.alibi_slopes(H)
    g = jax.jit(jax.grad(loss), static_argnums=1)(slopes, "chunked")
    g_ref = jax.jit(jax.grad(loss), static_argnums=1)(slopes, "xla")
    assert np.abs(g_ref).max() > 1e-2
    np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-4)


# Sliding windows (query i sees keys i - W < j <= i) with blocks of 8 queries and 16 keys:
# W below, at and above a block (and above the length), W = 1, lengths that are not block
# multiples, more queries than keys (rows past kv_len + W - 1 see nothing), more keys than
# queries, block_q > block_k, and divisible lengths (no padded block).
WINDOW_CASES = [
    # lq, lk, window, blocks, bias, padding
    (37, 37, 5, BLOCKS, False, False),
    (37, 37, 8, BLOCKS, True, True),
    (37, 37, 16, BLOCKS, True, False),
    (37, 37, 23, BLOCKS, False, True),
    (37, 37, 100, BLOCKS, True, False),
    (37, 37, 1, BLOCKS, False, True),
    (45, 21, 3, BLOCKS, True, False),
    (29, 53, 20, BLOCKS, False, True),
    (50, 50, 12, {"block_q": 16, "block_k": 8}, True, True),
    (64, 64, 16, {"block_q": 16, "block_k": 16}, False, False),
]


@pytest.mark.parametrize("lq,lk,window,blocks,bias,padding", WINDOW_CASES)
def test_windowed_chunked_matches_plain_forward_and_gradients(
    lq, lk, window, blocks, bias, padding
):
    q, k, v = _qkv(lq * 1000 + lk * 10 + window, lq, lk)
    qp, kp = _positions(lq), _positions(lk)
    bias_fn = _alibi(True) if bias else None
    mask = None
    if padding:
        valid = np.ones((B, lk), bool)
        valid[0, lk - 7 :] = False
        valid[1, :3] = False
        mask = jnp.asarray(valid)[:, None, None, :]

    plain = lambda q, k, v: _plain(q, k, v, qp, kp, bias_fn, mask, True, window)
    chunk = lambda q, k, v: _chunked(q, k, v, qp, kp, bias_fn, mask, True, window, **blocks)
    ref, g_ref = _out_and_grads(plain)(q, k, v)
    out, g_out = _out_and_grads(chunk)(q, k, v)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    for name, a, b in zip("qkv", g_out, g_ref, strict=True):
        if window == 1 and name != "v":  # a softmax over one key: constant 1, no gradient
            np.testing.assert_allclose(a, 0.0, atol=1e-5)  # (up to rounding in dp - delta)
        else:
            assert np.abs(b).max() > 1e-2, name
        assert np.all(np.isfinite(a)), name
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5, err_msg=f"d loss / d {name}")
    # The window matters (unless it covers everything): plain causal differs.
    if window < lk:
        causal = _plain(q, k, v, qp, kp, bias_fn, mask, True)
        assert np.abs(np.asarray(causal) - np.asarray(out)).max() > 1e-2
    if window == 1 and not padding:
        np.testing.assert_allclose(out, v, rtol=1e-6, atol=1e-6)
    if lq > lk + window - 1:  # queries past the last key's window: zeros
        np.testing.assert_array_equal(np.asarray(out)[:, lk + window - 1 :], 0.0)


@pytest.mark.parametrize("window", [5, 16, 33])
def test_windowed_bfloat16_inputs_match_plain_and_float32(window):
    lq = lk = 40
    q, k, v = _qkv(37, lq, lk, jnp.bfloat16)
    qp = kp = _positions(lq)
    chunk = lambda q, k, v: _chunked(q, k, v, qp, kp, _alibi(True), None, True, window)
    plain = lambda q, k, v: _plain(q, k, v, qp, kp, _alibi(True), None, True, window)
    out, grads = _out_and_grads(chunk)(q, k, v)
    ref16 = jax.jit(plain)(q, k, v)
    ref32, refs32 = _out_and_grads(plain)(*(a.astype(jnp.float32) for a in (q, k, v)))
    assert out.dtype == jnp.bfloat16
    o = np.asarray(out, np.float32)
    np.testing.assert_allclose(o, np.asarray(ref16, np.float32), atol=2e-2, rtol=2e-2)
    np.testing.assert_allclose(o, ref32, atol=2e-2, rtol=2e-2)
    for g, g_ref in zip(grads, refs32, strict=True):
        assert g.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(g, np.float32), g_ref, atol=5e-2, rtol=5e-2)


# ----------------------------------------------------------------------------- memory / skipping


def test_causal_blocks_above_the_diagonal_are_never_evaluated():
    """Count the (query block, key block) pairs whose bias is computed, at run time."""
    lq = lk = 50
    bq, bk = 8, 16  # 7 query blocks, 4 key blocks (both with padding)
    visited = []

    def bias_fn(qp, kp):
        jax.debug.callback(lambda a, b: visited.append((int(a), int(b))), qp[0, 0], kp[0, 0])
        return _alibi(True)(qp, kp)

    q, k, v = _qkv(13, lq, lk)
    qp = kp = _positions(lq)
    chunk = lambda q, k, v: _chunked(q, k, v, qp, kp, bias_fn, None, True, block_q=bq, block_k=bk)
    jax.block_until_ready(jax.jit(chunk)(q, k, v))
    expected = {(i * bq, j * bk) for i in range(7) for j in range(4) if j * bk <= i * bq + bq - 1}
    assert sorted(visited) == sorted(expected)  # each needed block exactly once
    assert len(expected) < 7 * 4 * 0.7  # and that is far from all 28
    assert kv_blocks_visited(lq, lk, causal=True, block_q=bq, block_k=bk) == [1, 1, 2, 2, 3, 3, 4]

    visited.clear()  # forward + backward: the same blocks once more (recomputation)
    jax.block_until_ready(jax.jit(jax.grad(_loss(chunk)))(q, k, v))
    assert sorted(visited) == sorted(list(expected) * 2)


def _band_blocks(nq, nk, bq, bk, window):
    """(query block, key block) pairs holding some (i, j) with i - window < j <= i."""
    return {
        (i, j)
        for i in range(nq)
        for j in range(nk)
        # some key of block j is <= the last query, and some key > the first query - window
        if j * bk <= (i + 1) * bq - 1 and (j + 1) * bk - 1 > i * bq - window
    }


@pytest.mark.parametrize("window,bq,bk", [(10, 8, 16), (3, 8, 16), (16, 16, 8), (40, 8, 16)])
def test_windowed_blocks_outside_the_window_are_never_evaluated(window, bq, bk):
    """Forward and backward evaluate exactly the blocks that meet the band, once each."""
    lq = lk = 50
    nq, nk = -(-lq // bq), -(-lk // bk)
    visited = []

    def bias_fn(qp, kp):
        jax.debug.callback(lambda a, b: visited.append((int(a), int(b))), qp[0, 0], kp[0, 0])
        return _alibi(True)(qp, kp)

    q, k, v = _qkv(41, lq, lk)
    qp = kp = _positions(lq)
    chunk = lambda q, k, v: _chunked(
        q, k, v, qp, kp, bias_fn, None, True, window, block_q=bq, block_k=bk
    )
    jax.block_until_ready(jax.jit(chunk)(q, k, v))
    expected = {(i * bq, j * bk) for i, j in _band_blocks(nq, nk, bq, bk, window)}
    assert sorted(visited) == sorted(expected)
    counts = kv_blocks_visited(lq, lk, causal=True, window=window, block_q=bq, block_k=bk)
    assert counts == [sum(a == i * bq for a, _ in expected) for i in range(nq)]
    causal = kv_blocks_visited(lq, lk, causal=True, block_q=bq, block_k=bk)
    assert all(w <= c for w, c in zip(counts, causal, strict=True))
    if window < 40:
        assert sum(counts) < sum(causal)  # the window really skips blocks

    visited.clear()  # the backward pass visits the same pairs once more
    jax.block_until_ready(jax.jit(jax.grad(_loss(chunk)))(q, k, v))
    assert sorted(visited) == sorted(list(expected) * 2)


def test_windowed_kv_blocks_visited_is_linear_in_length():
    # 50 tokens, blocks 8 / 16, W = 10: query block i needs keys (8i - 10, 8i + 7].
    assert kv_blocks_visited(50, 50, causal=True, window=10, block_q=8, block_k=16) == [
        1, 1, 2, 2, 2, 2, 2
    ]  # fmt: skip
    assert kv_blocks_visited(50, 50, causal=True, window=1, block_q=8, block_k=8) == [1] * 7
    # A window as long as the sequence is plain causal.
    assert kv_blocks_visited(50, 50, causal=True, window=50, block_q=8, block_k=16) == (
        kv_blocks_visited(50, 50, causal=True, block_q=8, block_k=16)
    )
    # 4096 tokens, blocks of 512, W = 512: at most 2 key blocks per query block ...
    blocks = {"block_q": 512, "block_k": 512}
    counts = kv_blocks_visited(4096, 4096, causal=True, window=512, **blocks)
    assert counts == [1] + [2] * 7
    assert sum(kv_blocks_visited(4096, 4096, causal=True, **blocks)) == 36  # causal: 8*9/2
    # ... and the total grows linearly with the length (O(L * W)), not quadratically.
    for length in (8192, 32768):
        counts = kv_blocks_visited(length, length, causal=True, window=512, **blocks)
        assert max(counts) == 2 and sum(counts) == 2 * (length // 512) - 1
    counts = kv_blocks_visited(32768, 32768, causal=True, window=1024, **blocks)
    assert max(counts) == 3 and sum(counts) <= 3 * (32768 // 512)
    # Fewer keys than queries: the last query blocks see no key at all.
    assert kv_blocks_visited(64, 16, causal=True, window=4, block_q=8, block_k=8) == [
        1, 2, 1, 0, 0, 0, 0, 0
    ]  # fmt: skip
    with pytest.raises(ValueError, match="window=4: a sliding window needs causal=True"):
        kv_blocks_visited(64, 64, causal=False, window=4)


def _large_intermediates(jaxpr, length):
    """Shapes of values in ``jaxpr`` (recursively) with two or more axes >= ``length``."""
    found = []

    def visit(jx):
        for eqn in jx.eqns:
            for var in eqn.outvars:
                shape = getattr(var.aval, "shape", ())
                if sum(n >= length for n in shape) >= 2:
                    found.append((eqn.primitive.name, shape))
            for param in eqn.params.values():
                for p in param if isinstance(param, tuple | list) else (param,):
                    if isinstance(p, jax.extend.core.ClosedJaxpr):
                        visit(p.jaxpr)
                    elif isinstance(p, jax.extend.core.Jaxpr):
                        visit(p)

    visit(jaxpr.jaxpr)
    return found


@pytest.mark.parametrize("window", [None, 300])
def test_no_length_squared_intermediate_at_2048_tokens(window):
    length, batch = 2048, 1
    spec = jax.ShapeDtypeStruct((batch, length, H, 16), jnp.float32)
    pos = jnp.arange(length, dtype=jnp.int32)[None, :]
    bias_fn = _alibi(True)
    blocks = {"block_q": 256, "block_k": 256}

    def chunk(q, k, v):
        return chunked_attention(
            q,
            k,
            v,
            q_positions=pos,
            k_positions=pos,
            bias_fn=bias_fn,
            causal=True,
            window=window,
            **blocks,
        )

    def plain(q, k, v):
        return _plain(q, k, v, pos, pos, bias_fn, None, True, window)

    fwd = jax.make_jaxpr(jax.jit(chunk))(spec, spec, spec)
    bwd = jax.make_jaxpr(jax.jit(jax.grad(_loss(chunk), argnums=(0, 1, 2))))(spec, spec, spec)
    assert _large_intermediates(fwd, length) == []
    assert _large_intermediates(bwd, length) == []
    # The check has power: the plain implementation does materialise [b, h, L, L].
    assert (1, H, length, length) in [
        s for _, s in _large_intermediates(jax.make_jaxpr(jax.jit(plain))(spec, spec, spec), length)
    ]


# ----------------------------------------------------------------------------- dispatch


def test_attend_dispatches_chunked_and_auto_on_cpu(caplog):
    if jax.default_backend() != "cpu":
        pytest.skip("what 'auto' chooses on CPU")
    lq = lk = 24
    q, k, v = _qkv(17, lq, lk)
    qp = kp = _positions(lq)
    kwargs = dict(q_positions=qp, k_positions=kp, bias_fn=_alibi(True), causal=True)
    xla = attention.attend(q, k, v, implementation="xla", **kwargs)
    chunked = attention.attend(q, k, v, implementation="chunked", **kwargs)
    np.testing.assert_allclose(chunked, xla, rtol=1e-5, atol=1e-5)
    attention._notices_given.clear()
    with caplog.at_level(logging.INFO, logger="flaxformer_lite.core.attention"):
        auto = attention.attend(q, k, v, implementation="auto", **kwargs)
        attention.attend(q, k, v, implementation="auto", **kwargs)
    np.testing.assert_array_equal(auto, xla)  # below the threshold "auto" is "xla" on CPU
    notices = [r for r in caplog.records if "does not use the fused kernel" in r.message]
    assert len(notices) == 1 and "'cpu'" in notices[0].message  # once per reason
    # above the threshold "auto" is the chunked implementation, bit for bit
    above = attention.attend(q, k, v, implementation="auto", chunked_threshold=lk - 1, **kwargs)
    np.testing.assert_array_equal(above, chunked)


@pytest.mark.parametrize("window", [1, 6, 30])
def test_attend_with_window_agrees_across_implementations(window, caplog):
    lq = lk = 24
    q, k, v = _qkv(43, lq, lk)
    qp = kp = _positions(lq)
    valid = np.ones((B, lk), bool)
    valid[1, 5:9] = False
    mask = jnp.asarray(valid)[:, None, None, :]
    kwargs = dict(q_positions=qp, k_positions=kp, mask=mask, causal=True, window=window)
    ref = _plain(q, k, v, qp, kp, None, mask, True, window)
    xla = attention.attend(q, k, v, implementation="xla", **kwargs)
    chunked = attention.attend(q, k, v, implementation="chunked", **kwargs)
    with caplog.at_level(logging.INFO, logger="flaxformer_lite.core.attention"):
        auto = attention.attend(q, k, v, implementation="auto", **kwargs)
        above = attention.attend(q, k, v, implementation="auto", chunked_threshold=8, **kwargs)
    np.testing.assert_array_equal(xla, ref)
    np.testing.assert_allclose(chunked, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(auto, xla)  # CPU, below the threshold: "xla"
    np.testing.assert_array_equal(above, chunked)  # above it: "chunked", window included
    # The window is really applied by each (plain causal differs).
    if window < lk:
        causal = _plain(q, k, v, qp, kp, None, mask, True)
        assert np.abs(np.asarray(causal) - np.asarray(chunked)).max() > 1e-2


def test_model_chunked_threshold_reaches_attention(monkeypatch, tiny_config):
    """`ModelConfig.chunked_threshold` is the threshold "auto" uses inside the model."""
    from flaxformer_lite.core import chunked_attention as module
    from flaxformer_lite.nn.models import DecoderOnlyLM

    calls = []
    original = module.chunked_attention
    monkeypatch.setattr(
        module, "chunked_attention", lambda *a, **k: calls.append(1) or original(*a, **k)
    )
    tokens = np.zeros((1, 8), np.int32)
    positions = np.arange(8, dtype=np.int32)[None]
    for threshold, chunked in ((8, False), (7, True)):
        cfg = tiny_config("alibi", attention_impl="auto", chunked_threshold=threshold)
        calls.clear()
        DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))(tokens, positions)
        assert bool(calls) == chunked, threshold


def test_cudnn_request_raises_where_it_cannot_run():
    q, k, v = _qkv(19, 8, 8)
    qp = _positions(8)
    # on CPU the backend is the reason; on a GPU these float32 inputs are
    reason = "backend" if jax.default_backend() == "cpu" else "the fused kernel needs float16"
    with pytest.raises(ValueError, match=f"implementation='cudnn' cannot run here: {reason}"):
        attention.attend(q, k, v, q_positions=qp, k_positions=qp, implementation="cudnn")


def test_fused_unavailable_reasons():
    reason = attention._fused_unavailable_reason
    bf16, f32 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)
    assert reason("gpu", (bf16,) * 3, has_bias=False) is None
    assert "bias_fn" in reason("gpu", (bf16,) * 3, has_bias=True)
    assert "float16 or bfloat16" in reason("gpu", (f32,) * 3, has_bias=False)
    assert "float16 or bfloat16" in reason("gpu", (bf16, bf16, f32), has_bias=False)
    assert "'cpu'" in reason("cpu", (bf16,) * 3, has_bias=False)


@pytest.mark.parametrize("causal", [False, True])
def test_fused_wrapper_zeroes_fully_masked_rows(causal):
    """The GPU branch's wrapper, run through jax.nn.dot_product_attention's XLA kernel."""
    lq, lk = 9, 12
    q, k, v = _qkv(23, lq, lk)
    kv_valid = np.ones((B, lk), bool)
    kv_valid[0, :5] = False  # causal: queries 0..4 of row 0 see no key
    kv_valid[1, :] = False
    for mask in (
        jnp.asarray(kv_valid)[:, None, None, :],
        attention.padding_mask(jnp.asarray(np.arange(lq)[None, :] < [[7], [9]]), kv_valid),
    ):
        out = attention._fused_attention(
            q, k, v, mask=mask, causal=causal, scale=None, kernel="xla"
        )
        ref = attention.dot_product_attention(q, k, v, mask=mask, causal=causal)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(out)[1] == 0.0)


@pytest.mark.parametrize("window", [1, 4, 20])
def test_fused_wrapper_with_window_matches_xla(window):
    """local_window_size=(W - 1, 0) in jax.nn.dot_product_attention's XLA kernel, and the
    rows the window (with or without a mask) leaves empty are zeros."""
    assert attention._FUSED_HAS_WINDOW  # the installed JAX has local_window_size
    lq, lk = 13, 9  # window 1 or 4: queries >= lk + window - 1 see no key
    q, k, v = _qkv(47, lq, lk)
    kv_valid = np.ones((B, lk), bool)
    kv_valid[0, 2:6] = False  # window <= 4: query 5 of row 0 sees only padding
    masks = (
        None,
        jnp.asarray(kv_valid)[:, None, None, :],
        attention.padding_mask(jnp.asarray(np.arange(lq)[None, :] < [[11], [13]]), kv_valid),
    )
    for mask in masks:
        out = attention._fused_attention(
            q, k, v, mask=mask, causal=True, scale=None, window=window, kernel="xla"
        )
        ref = attention.dot_product_attention(q, k, v, mask=mask, causal=True, window=window)
        assert np.all(np.isfinite(out))
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
        if lq > lk + window - 1:
            np.testing.assert_array_equal(np.asarray(out)[:, lk + window - 1 :], 0.0)
    if window <= 4:
        np.testing.assert_array_equal(np.asarray(out)[0, 5], 0.0)
    with pytest.raises(ValueError, match="window=4: a sliding window needs causal=True"):
        attention._fused_attention(q, k, v, mask=None, causal=False, scale=None, window=4)


def test_fused_reason_for_a_window_without_local_window_size(monkeypatch):
    """On a JAX without local_window_size the fused path reports it: "auto" falls back."""
    reason = attention._fused_unavailable_reason
    bf16 = jnp.dtype(jnp.bfloat16)
    assert reason("gpu", (bf16,) * 3, has_bias=False, has_window=True) is None
    monkeypatch.setattr(attention, "_FUSED_HAS_WINDOW", False)
    assert "local_window_size" in reason("gpu", (bf16,) * 3, has_bias=False, has_window=True)
    assert reason("gpu", (bf16,) * 3, has_bias=False, has_window=False) is None
    q, k, v = _qkv(53, 8, 8)
    with pytest.raises(NotImplementedError, match="local_window_size"):
        attention._fused_attention(
            q, k, v, mask=None, causal=True, scale=None, window=3, kernel="xla"
        )


def test_choose_implementation():
    choose = attention.choose_implementation
    assert attention.DEFAULT_CHUNKED_THRESHOLD == 1024
    assert choose("xla", 1024, 1024) == "xla"
    assert choose("xla", 1025, 1025) == "chunked"
    assert choose("xla", 1, 65536) == "xla"  # one decoding query: a single score row
    assert choose("xla", 600, 600, threshold=512) == "chunked"
    for explicit in ("chunked", "cudnn", "auto"):
        assert choose(explicit, 8, 8) == explicit == choose(explicit, 9999, 9999)
    with pytest.raises(ValueError, match="implementation='flash'"):
        choose("flash", 8, 8)


def test_invalid_arguments_raise_clear_errors():
    q, k, v = _qkv(29, 8, 8)
    qp = _positions(8)
    with pytest.raises(ValueError, match="mask must be boolean"):
        chunked_attention(q, k, v, q_positions=qp, k_positions=qp, mask=jnp.ones((8, 8)))
    with pytest.raises(ValueError, match=r"^k_positions=int32\[2, 5\]: .*\[8\] or \[2, 8\]"):
        chunked_attention(q, k, v, q_positions=qp, k_positions=qp[:, :5])
    with pytest.raises(ValueError, match=r"block_k=.*: must be a positive int"):
        chunked_attention(q, k, v, q_positions=qp, k_positions=qp, block_k=0)
    with pytest.raises(ValueError, match="bias_fn must return"):
        chunked_attention(
            q, k, v, q_positions=qp, k_positions=qp, bias_fn=lambda a, b: a[:, :, None] - b[:, None]
        )
    with pytest.raises(ValueError, match="mask has shape"):
        chunked_attention(q, k, v, q_positions=qp, k_positions=qp, mask=jnp.ones((3, 8), bool))
    with pytest.raises(ValueError, match="window=4: a sliding window needs causal=True"):
        chunked_attention(q, k, v, q_positions=qp, k_positions=qp, window=4)
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match=rf"^window={bad!r}: must be a positive int$"):
            chunked_attention(q, k, v, q_positions=qp, k_positions=qp, causal=True, window=bad)


def test_decoder_lm_loss_and_gradients_equal_with_chunked(monkeypatch):
    """Training through the layers with a *learned* bias (FIRE: an MLP of positions, whose
    parameters the bias function closes over), padding, several blocks per sequence."""
    from flax import nnx

    from flaxformer_lite import DecoderOnlyLM, ModelConfig
    from flaxformer_lite.core import chunked_attention as module

    small_blocks = functools.partial(module.chunked_attention, block_q=8, block_k=16)
    monkeypatch.setattr(module, "chunked_attention", small_blocks)
    cfg = ModelConfig(
        vocab_size=32,
        d_model=32,
        num_heads=H,
        d_ff=64,
        num_decoder_layers=1,
        dropout_rate=0.0,
        positional="fire",
    )
    length = 37
    tokens = jnp.asarray(np.random.default_rng(31).integers(0, 32, (B, length)), jnp.int32)
    valid = jnp.asarray(np.arange(length)[None, :] < np.array([[length], [30]]))
    positions = _positions(length)

    def loss_fn(model):
        logits = model(tokens[:, :-1], positions[:, :-1], valid=valid[:, :-1])
        ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], axis=-1)
        return jnp.sum(ce[..., 0] * valid[:, 1:]) / jnp.sum(valid[:, 1:])

    results = {}
    for impl in ("xla", "chunked"):
        model = DecoderOnlyLM(cfg.replace(attention_impl=impl), rngs=nnx.Rngs(0))
        loss, grads = nnx.jit(nnx.value_and_grad(loss_fn))(model)
        results[impl] = (loss, nnx.state(grads, nnx.Param))
    (l_x, g_x), (l_c, g_c) = results["xla"], results["chunked"]
    np.testing.assert_allclose(l_c, l_x, rtol=1e-5)
    flat_x = jax.tree_util.tree_leaves_with_path(g_x)
    flat_c = jax.tree.leaves(g_c)
    assert len(flat_c) == len(flat_x) > 5
    pe_grads = [b for path, b in flat_x if "'pe'" in jax.tree_util.keystr(path)]
    assert pe_grads and max(float(jnp.abs(b).max()) for b in pe_grads) > 1e-4
    for (path, b), a in zip(flat_x, flat_c, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-6, err_msg=jax.tree_util.keystr(path))


def test_length_positions_broadcast_in_chunked_and_attend():
    """``[L]`` positions (e.g. ``jnp.arange(L)``) equal the broadcast ``[B, L]`` ones in
    `chunked_attention` and every `attend` implementation, and equal dense attention."""
    L = 20
    q, k, v = _qkv(41, L, L)
    bias_fn = _alibi(True)
    flat, batched = jnp.arange(L), _positions(L)
    dense = _plain(q, k, v, batched, batched, bias_fn, None, True)
    for qp, kp in ((flat, flat), (flat, batched), (batched[:1], flat)):
        out = _chunked(q, k, v, qp, kp, bias_fn, None, True)
        np.testing.assert_allclose(out, dense, rtol=1e-5, atol=1e-5)
    ref = _chunked(q, k, v, batched, batched, bias_fn, None, True)
    np.testing.assert_array_equal(_chunked(q, k, v, flat, flat, bias_fn, None, True), ref)
    for impl in ("xla", "chunked", "auto"):
        out = attention.attend(
            q, k, v, q_positions=flat, k_positions=flat, bias_fn=bias_fn, causal=True,
            implementation=impl, chunked_threshold=8,
        )  # fmt: skip
        np.testing.assert_allclose(out, dense, rtol=1e-5, atol=1e-5, err_msg=impl)
    # Bad shapes and dtypes name the argument and the accepted shapes.
    accepted = (
        r"must be integers of shape \[length\] or \[batch, length\], here \[20\] or \[2, 20\]"
    )
    for impl in ("xla", "chunked"):
        for name, bad, shown in (
            ("q_positions", _positions(L + 1), r"int32\[2, 21\]"),
            ("k_positions", jnp.zeros((2, 3, L), jnp.int32), r"int32\[2, 3, 20\]"),
            ("k_positions", jnp.arange(L, dtype=jnp.float32), r"float32\[20\]"),
            ("q_positions", jnp.zeros((3, L), jnp.int32), r"int32\[3, 20\]"),
        ):
            args = {"q_positions": flat, "k_positions": flat, name: bad}
            with pytest.raises(ValueError, match=rf"^{name}={shown}: {accepted}"):
                attention.attend(q, k, v, **args, causal=True, implementation=impl)
        with pytest.raises(ValueError, match=rf"^k_positions=int32\[2, 21\]: {accepted}"):
            chunked_attention(q, k, v, q_positions=flat, k_positions=_positions(L + 1))


def test_attend_auto_above_default_threshold_takes_arange_positions():
    """The "auto" implementation chunks above `DEFAULT_CHUNKED_THRESHOLD` keys and takes
    ``jnp.arange(L)`` positions there too (no error), agreeing with dense attention."""
    L = attention.DEFAULT_CHUNKED_THRESHOLD + 16
    rng = np.random.default_rng(43)
    q, k, v = (jnp.asarray(rng.standard_normal((1, L, 1, 8)), jnp.float32) for _ in range(3))
    slopes = attention_bias.alibi_slopes(1)
    bias_fn = lambda qp, kp: attention_bias.alibi_bias(qp, kp, slopes, causal=True)
    pos = jnp.arange(L)
    spy = mock.patch.object(attention._chunked, "chunked_attention", wraps=chunked_attention)
    with spy as called:
        out = attention.attend(
            q, k, v, q_positions=pos, k_positions=pos, bias_fn=bias_fn, causal=True,
            implementation="auto",
        )  # fmt: skip
    assert called.call_count == 1
    dense = _plain(q, k, v, pos[None], pos[None], bias_fn, None, True)
    np.testing.assert_allclose(out, dense, rtol=1e-5, atol=1e-5)
