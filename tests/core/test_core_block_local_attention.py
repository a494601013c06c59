"""Block-local ("chunked") causal attention -- Llama 4's ``attention_chunk_size`` -- in every
attention implementation, against a float64 numpy reference.

With chunk C, query i sees key j iff ``j <= i`` and ``j // C == i // C``. The reference is
written here from that rule with loops; the plain implementation must equal it, and the
chunked (online-softmax) implementation and the fused-kernel wrapper must equal the plain one,
forward and backward, skipping the key blocks of other chunks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_lite.core import attention, attention_bias
from flaxformer_lite.core.chunked_attention import chunked_attention, kv_blocks_visited

B, H, D = 2, 3, 8


def np_chunk_mask(lq, lk, chunk):
    """Loop reference of the rule."""
    return np.array([[j <= i and j // chunk == i // chunk for j in range(lk)] for i in range(lq)])


def np_attention(q, k, v, allowed, bias=None):
    """float64 softmax(q k^T / sqrt(d) + bias) v over ``allowed`` [b, h, q, k]; empty rows 0."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    if bias is not None:
        logits = logits + np.asarray(bias, np.float64)
    logits = np.where(allowed, logits, -np.inf)
    rows = allowed.any(-1, keepdims=True)
    e = np.exp(logits - np.where(rows, logits.max(-1, keepdims=True), 0.0))
    w = np.where(rows, e / np.where(rows, e.sum(-1, keepdims=True), 1.0), 0.0)
    return np.einsum("bhqk,bkhd->bqhd", w, v)


def _qkv(seed, lq, lk, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((B, n, H, D)).astype(np.float32) for n in (lq, lk, lk))
    return tuple(jnp.asarray(a, dtype) for a in (q, k, v))


def _positions(length):
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (B, length))


def _alibi(qp, kp):
    return attention_bias.alibi_bias(qp, kp, attention_bias.alibi_slopes(H), causal=True)


@pytest.mark.parametrize(
    "lq,lk,chunk", [(7, 7, 1), (7, 7, 3), (9, 9, 4), (6, 6, 6), (6, 6, 20), (9, 5, 3), (4, 8, 3)]
)
def test_chunk_mask_values(lq, lk, chunk):
    m = np.asarray(attention.chunk_mask(lq, lk, chunk))
    assert m.dtype == bool and m.shape == (lq, lk)
    np.testing.assert_array_equal(m, np_chunk_mask(lq, lk, chunk))
    assert m.sum(-1).max() <= chunk  # at most the chunk's keys
    if chunk >= max(lq, lk):
        np.testing.assert_array_equal(m, attention.causal_mask(lq, lk))
    np.testing.assert_array_equal(attention.causal_span_mask(lq, lk, chunk=chunk), m)
    np.testing.assert_array_equal(
        attention.causal_span_mask(lq, lk, window=chunk), attention.window_mask(lq, lk, chunk)
    )


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("chunk", [1, 3, 4, 50])
def test_chunked_attention_matches_numpy(chunk, padding):
    lq = lk = 9
    q, k, v = _qkv(chunk + 10 * padding, lq, lk)
    allowed = np_chunk_mask(lq, lk, chunk)[None, None]
    mask = None
    if padding:
        valid = np.ones((B, lk), bool)
        valid[0, 3] = False  # chunk 1: query 3 of row 0 sees nothing; chunk 3: key 3 starts one
        mask = valid[:, None, None, :]
        allowed = allowed & mask
    ref = np_attention(q, k, v, np.broadcast_to(allowed, (B, H, lq, lk)))
    kw = {"mask": mask, "causal": True, "chunk": chunk}
    out = np.asarray(attention.dot_product_attention(q, k, v, **kw))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    w = np.asarray(attention.attention_weights(q, k, **kw))
    np.testing.assert_array_equal(w[~np.broadcast_to(allowed, w.shape)], 0.0)
    if chunk == 1 and not padding:  # each query sees only itself
        np.testing.assert_allclose(out, v, rtol=1e-6, atol=1e-6)
    causal = np.asarray(attention.dot_product_attention(q, k, v, mask=mask, causal=True))
    if chunk >= lk:
        np.testing.assert_allclose(out, causal, rtol=1e-6, atol=1e-6)
    else:  # a chunk shorter than the sequence changes the answer
        assert np.abs(causal - out).max() > 1e-2


@pytest.mark.parametrize("implementation", ["xla", "chunked", "auto"])
def test_attend_with_chunk_and_bias_matches_numpy(implementation):
    lq = lk = 11
    chunk = 4
    q, k, v = _qkv(3, lq, lk)
    qp = _positions(lq)
    allowed = np.broadcast_to(np_chunk_mask(lq, lk, chunk)[None, None], (B, H, lq, lk))
    ref = np_attention(q, k, v, allowed, bias=_alibi(qp, qp))
    out = attention.attend(
        q,
        k,
        v,
        q_positions=qp,
        k_positions=qp,
        bias_fn=_alibi,
        causal=True,
        chunk=chunk,
        implementation=implementation,
    )
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


CHUNK_CASES = [  # lq, lk, chunk, blocks: lengths not multiples of the blocks, chunks across them
    (37, 37, 5, {"block_q": 8, "block_k": 16}),
    (37, 37, 16, {"block_q": 8, "block_k": 16}),
    (37, 37, 1, {"block_q": 8, "block_k": 16}),
    (50, 50, 12, {"block_q": 16, "block_k": 8}),
    (45, 21, 7, {"block_q": 8, "block_k": 16}),
    (40, 40, 64, {"block_q": 16, "block_k": 16}),
]


def _loss(fn):
    return lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v).astype(jnp.float32) * 3.0))


@pytest.mark.parametrize("lq,lk,chunk,blocks", CHUNK_CASES)
def test_chunked_implementation_matches_plain_forward_and_gradients(lq, lk, chunk, blocks):
    q, k, v = _qkv(lq + 7 * chunk, lq, lk)
    qp, kp = _positions(lq), _positions(lk)
    valid = np.ones((B, lk), bool)
    valid[1, 2:5] = False
    mask = jnp.asarray(valid)[:, None, None, :]

    def plain(q, k, v):
        return attention.dot_product_attention(
            q, k, v, mask=mask, bias=_alibi(qp, kp), causal=True, chunk=chunk
        )

    def blockwise(q, k, v):
        return chunked_attention(
            q,
            k,
            v,
            q_positions=qp,
            k_positions=kp,
            bias_fn=_alibi,
            mask=mask,
            causal=True,
            chunk=chunk,
            **blocks,
        )

    both = jax.jit(
        lambda q, k, v: [
            (f(q, k, v), jax.grad(_loss(f), argnums=(0, 1, 2))(q, k, v)) for f in (plain, blockwise)
        ]
    )
    (ref, g_ref), (out, g_out) = both(q, k, v)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    for name, a, b in zip("qkv", g_out, g_ref, strict=True):
        assert np.all(np.isfinite(a)), name
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5, err_msg=f"d loss / d {name}")


def _chunk_blocks(nq, nk, bq, bk, chunk, lq, lk):
    """(query block, key block) pairs holding some visible (i, j)."""
    return {
        (i, j)
        for i in range(nq)
        for j in range(nk)
        if any(
            jj <= ii and jj // chunk == ii // chunk
            for ii in range(i * bq, min((i + 1) * bq, lq))
            for jj in range(j * bk, min((j + 1) * bk, lk))
        )
    }


@pytest.mark.parametrize("chunk,bq,bk", [(10, 8, 16), (16, 8, 8), (5, 16, 8), (32, 8, 16)])
def test_blocks_of_other_chunks_are_never_evaluated(chunk, bq, bk):
    """Forward and backward evaluate the blocks that hold a visible pair, and few others."""
    lq = lk = 50
    nq, nk = -(-lq // bq), -(-lk // bk)
    visited = []

    def bias_fn(qp, kp):
        jax.debug.callback(lambda a, b: visited.append((int(a), int(b))), qp[0, 0], kp[0, 0])
        return _alibi(qp, kp)

    q, k, v = _qkv(41, lq, lk)
    qp = _positions(lq)

    def fn(q, k, v):
        return chunked_attention(
            q,
            k,
            v,
            q_positions=qp,
            k_positions=qp,
            bias_fn=bias_fn,
            causal=True,
            chunk=chunk,
            block_q=bq,
            block_k=bk,
        )

    jax.block_until_ready(jax.jit(fn)(q, k, v))
    needed = {(i * bq, j * bk) for i, j in _chunk_blocks(nq, nk, bq, bk, chunk, lq, lk)}
    forward = set(visited)
    assert len(visited) == len(forward)  # each block once
    assert forward >= needed  # every needed block
    # the forward visits a contiguous range per query block: from the first query's chunk
    counts = kv_blocks_visited(lq, lk, causal=True, chunk=chunk, block_q=bq, block_k=bk)
    assert counts == [sum(a == i * bq for a, _ in forward) for i in range(nq)]
    for i in range(nq):
        first_key = (i * bq // chunk) * chunk
        assert min(b for a, b in forward if a == i * bq) == first_key // bk * bk
    causal = kv_blocks_visited(lq, lk, causal=True, block_q=bq, block_k=bk)
    if chunk < 32:
        assert sum(counts) < sum(causal)  # the chunk really skips blocks
    visited.clear()  # the backward pass skips the same way
    jax.block_until_ready(jax.jit(jax.grad(_loss(fn)))(q, k, v))
    backward = set(visited) - forward
    assert not backward  # no block the forward pass skipped
    assert set(visited) >= needed


def test_kv_blocks_visited_with_a_chunk_is_linear_in_length():
    blocks = {"block_q": 512, "block_k": 512}
    # C = 512 with 512-blocks: each query block needs exactly its own key block.
    for length in (2048, 8192):
        counts = kv_blocks_visited(length, length, causal=True, chunk=512, **blocks)
        assert counts == [1] * (length // 512)
    # C = 1024 with 512-blocks: 1 or 2 key blocks per query block, whatever the length.
    counts = kv_blocks_visited(8192, 8192, causal=True, chunk=1024, **blocks)
    assert counts == [1, 2] * 8
    # the default blocks (256 queries x 512 keys): a query block needs 1 key block at C = 512
    assert kv_blocks_visited(2048, 2048, causal=True, chunk=512) == [1] * 8


@pytest.mark.parametrize("chunk", [1, 3, 20])
def test_fused_wrapper_with_chunk_matches_xla(chunk):
    """The chunk as a boolean mask of jax.nn.dot_product_attention (its XLA kernel here),
    with rows the chunk and padding leave empty set to zeros."""
    lq = lk = 9
    q, k, v = _qkv(47, lq, lk)
    valid = np.ones((B, lk), bool)
    valid[0, 3] = False  # chunk 1 or 3: query 3 of row 0 sees only padding
    for mask in (None, jnp.asarray(valid)[:, None, None, :]):
        out = attention._fused_attention(
            q, k, v, mask=mask, causal=True, scale=None, chunk=chunk, kernel="xla"
        )
        ref = attention.dot_product_attention(q, k, v, mask=mask, causal=True, chunk=chunk)
        assert np.all(np.isfinite(out))
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    if chunk == 3:
        np.testing.assert_array_equal(np.asarray(out)[0, 3], 0.0)


def test_chunk_argument_errors():
    q, k, v = _qkv(14, 6, 6)
    qp = _positions(6)
    calls = {
        "dot_product_attention": lambda **kw: attention.dot_product_attention(q, k, v, **kw),
        "attention_weights": lambda **kw: attention.attention_weights(q, k, **kw),
    }
    for impl in ("xla", "chunked", "auto"):
        calls[impl] = lambda impl=impl, **kw: attention.attend(
            q, k, v, q_positions=qp, k_positions=qp, implementation=impl, **kw
        )
    for name, call in calls.items():
        with pytest.raises(ValueError, match=r"chunk=3: block-local attention needs causal=True"):
            call(chunk=3)
        with pytest.raises(ValueError, match=r"^chunk=0: must be a positive int$"):
            call(chunk=0, causal=True)
        with pytest.raises(ValueError, match=r"chunk=2 and window=3: give one of them"):
            call(chunk=2, window=3, causal=True)
        assert np.all(np.isfinite(call(chunk=2, causal=True))), name
