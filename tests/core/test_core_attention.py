"""Tests of the pure attention core against numpy references and the seed article's claims.

Every reference here is an independent float64 numpy implementation of
``softmax(q k^T * scale + bias) v`` (Vaswani et al. 2017, Eq. 1), never the code under test.
The softmax of huge logits stays finite, with finite gradients, for every implementation."""

from __future__ import annotations

import functools
import zlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_lite.core import attention

B, H, D = 2, 3, 8


def np_attention(q, k, v, *, mask=None, bias=None, causal=False, scale=None):
    """float64 reference: returns (logits with -inf where masked, weights, output)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    b, lq, h, d = q.shape
    lk = k.shape[1]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if bias is not None:
        logits = logits + np.asarray(bias, np.float64)
    allowed = np.ones((b, h, lq, lk), bool)
    if mask is not None:
        allowed = allowed & np.broadcast_to(np.asarray(mask), allowed.shape)
    if causal:
        allowed = allowed & (np.arange(lk)[None, :] <= np.arange(lq)[:, None])
    logits = np.where(allowed, logits, -np.inf)
    rows = allowed.any(-1)
    shifted = np.exp(logits - np.where(rows, logits.max(-1), 0.0)[..., None])
    weights = np.where(
        rows[..., None], shifted / np.maximum(shifted.sum(-1, keepdims=True), 1e-300), 0
    )
    out = np.einsum("bhqk,bkhd->bqhd", weights, v)
    return logits, weights, out, allowed


def _qkv(seed, lq=5, lk=7, dtype=np.float32, d=D):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, lq, H, d)).astype(dtype)
    k = rng.standard_normal((B, lk, H, d)).astype(dtype)
    v = rng.standard_normal((B, lk, H, d)).astype(dtype)
    return q, k, v


def _case(name, rng, lq, lk):
    """Keyword arguments for one masking / bias / scale configuration."""
    if name == "plain":
        return {}
    if name == "mask_2d":
        return {"mask": rng.random((lq, lk)) > 0.3}
    if name == "mask_4d":
        return {"mask": rng.random((B, H, lq, lk)) > 0.4}
    if name == "key_padding":
        valid = np.ones((B, lk), bool)
        valid[0, -3:] = False
        return {"mask": valid[:, None, None, :]}
    if name == "bias":
        return {"bias": rng.standard_normal((B, H, lq, lk)).astype(np.float32) * 2}
    if name == "bias_per_head_broadcast":
        return {"bias": rng.standard_normal((H, lq, lk)).astype(np.float32)}
    if name == "causal":
        return {"causal": True}
    if name == "causal_mask_bias_scale":
        return {
            "causal": True,
            "mask": rng.random((B, 1, lq, lk)) > 0.2,
            "bias": rng.standard_normal((B, H, lq, lk)).astype(np.float32),
            "scale": 0.37,
        }
    if name == "scale":
        return {"scale": 0.05}
    raise AssertionError(name)


CASES = [
    "plain",
    "mask_2d",
    "mask_4d",
    "key_padding",
    "bias",
    "bias_per_head_broadcast",
    "causal",
    "causal_mask_bias_scale",
    "scale",
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("lq,lk", [(5, 7), (6, 6)])
def test_attention_matches_numpy(case, lq, lk):
    rng = np.random.default_rng(zlib.crc32(f"{case}-{lq}-{lk}".encode()))
    q, k, v = _qkv(rng.integers(1 << 30), lq, lk)
    kw = _case(case, rng, lq, lk)
    ref_logits, ref_w, ref_out, allowed = np_attention(q, k, v, **kw)

    out = attention.dot_product_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), **kw)
    w = attention.attention_weights(jnp.asarray(q), jnp.asarray(k), **kw)
    logits, combined = attention.attention_logits(jnp.asarray(q), jnp.asarray(k), **kw)

    assert out.shape == (B, lq, H, D) and out.dtype == jnp.float32
    assert w.shape == (B, H, lq, lk) and w.dtype == jnp.float32
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        np.where(allowed, logits, 0.0), np.where(allowed, ref_logits, 0.0), rtol=1e-5, atol=1e-5
    )
    # Masked logits are very negative but finite; the returned mask is the combined one.
    assert np.all(np.isfinite(logits))
    assert np.all(np.asarray(logits)[~allowed] < -1e29)
    if combined is None:
        assert allowed.all()
    else:
        np.testing.assert_array_equal(np.broadcast_to(combined, allowed.shape), allowed)


def test_default_scale_is_inverse_sqrt_head_dim():
    q, k, v = _qkv(1, d=16)
    _, _, ref, _ = np_attention(q, k, v, scale=0.25)
    out = attention.dot_product_attention(q, k, v)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    # ... and a different scale really changes the answer (the comparison has power).
    _, _, other, _ = np_attention(q, k, v, scale=1.0)
    assert np.abs(other - ref).max() > 1e-2


def test_causal_mask_is_top_left_aligned_for_rectangular_inputs():
    q, k, _ = _qkv(2, lq=3, lk=5)
    w = np.asarray(attention.attention_weights(q, k, causal=True))
    assert np.all(w[..., 0, 1:] == 0.0)  # query 0 sees only key 0
    assert np.all(w[..., 2, 3:] == 0.0)
    np.testing.assert_allclose(w[..., 0, 0], 1.0, rtol=1e-6)


def test_bf16_inputs_give_float32_accurate_logits():
    d = 64
    q, k, v = _qkv(3, lq=8, lk=8, d=d)
    qb, kb, vb = (jnp.asarray(a, jnp.bfloat16) for a in (q, k, v))
    # Reference from the exact bf16 values, in float64.
    q64, k64 = np.asarray(qb, np.float64), np.asarray(kb, np.float64)
    ref = np.einsum("bqhd,bkhd->bhqk", q64, k64) / np.sqrt(d)
    logits, _ = attention.attention_logits(qb, kb)
    assert logits.dtype == jnp.float32
    np.testing.assert_allclose(logits, ref, rtol=1e-5, atol=1e-5)
    # The tolerance above is tight enough that bf16 logits would fail it.
    bf16_logits = jnp.einsum("bqhd,bkhd->bhqk", qb, kb).astype(jnp.float32) / np.sqrt(d)
    assert np.abs(np.asarray(bf16_logits) - ref).max() > 1e-3

    w = attention.attention_weights(qb, kb, causal=True)
    assert w.dtype == jnp.float32
    _, ref_w, ref_out, _ = np_attention(q64, k64, np.asarray(vb, np.float64), causal=True)
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    out = attention.dot_product_attention(qb, kb, vb, causal=True)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), ref_out, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("causal", [True, False])
def test_low_precision_attend_on_cpu_is_the_float32_computation(causal):
    """bf16 ``q, k, v`` through ``attend`` ("xla") on CPU are computed in float32, products
    included, and rounded once: the output equals the float32 computation on the same (bf16)
    values, rounded to bf16, bit for bit (a bf16 product path would round the weights before
    the weights x values product and differ). Causal: 64 tokens, the query-block path;
    bidirectional: with a padding mask. Gradients come back in bf16, close to the float32
    path's."""
    if jax.default_backend() != "cpu":
        pytest.skip("the float32 computation of low-precision inputs is XLA:CPU's")
    q, k, v = _qkv(40, lq=64, lk=64)
    qb, kb, vb = (jnp.asarray(a, jnp.bfloat16) for a in (q, k, v))
    q32, k32, v32 = (a.astype(jnp.float32) for a in (qb, kb, vb))
    pos = jnp.arange(64)
    mask = None if causal else np.random.default_rng(3).random((B, 1, 1, 64)) > 0.2

    def run(q, k, v):
        return attention.attend(q, k, v, q_positions=pos, k_positions=pos, causal=causal, mask=mask)

    out = jax.jit(run)(qb, kb, vb)
    assert out.dtype == jnp.bfloat16
    ref = jax.jit(run)(q32, k32, v32).astype(jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(ref, np.float32))

    w = jnp.asarray(np.random.default_rng(4).standard_normal(out.shape), jnp.bfloat16)

    def loss(q, k, v):
        return jnp.sum(run(q, k, v).astype(jnp.bfloat16).astype(jnp.float32) * w)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(qb, kb, vb)
    grads32 = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q32, k32, v32)
    for name, a, b in zip("qkv", grads, grads32, strict=True):
        assert a.dtype == jnp.bfloat16, name
        np.testing.assert_allclose(
            np.asarray(a, np.float32), np.asarray(b), rtol=1e-2, atol=1e-2, err_msg=name
        )


def _fully_masked_mask(lq, lk):
    mask = np.ones((B, 1, lq, lk), bool)
    mask[0, 0, 1, :] = False  # one query row of batch 0 sees nothing
    mask[1, 0, :, :] = False  # all of batch 1 sees nothing
    return mask


def test_fully_masked_rows_are_zero_never_nan():
    q, k, v = _qkv(4)
    mask = _fully_masked_mask(5, 7)
    bias = np.full((B, H, 5, 7), -50.0, np.float32)  # a large bias must not break it either
    for kw in ({"mask": mask}, {"mask": mask, "bias": bias, "causal": True}):
        out = np.asarray(attention.dot_product_attention(q, k, v, **kw))
        w = np.asarray(attention.attention_weights(q, k, **kw))
        assert np.all(np.isfinite(out)) and np.all(np.isfinite(w))
        np.testing.assert_array_equal(out[0, 1], 0.0)
        np.testing.assert_array_equal(out[1], 0.0)
        np.testing.assert_array_equal(w[0, :, 1], 0.0)
        np.testing.assert_array_equal(w[1], 0.0)
        # The other rows are the ordinary numpy answer.
        _, _, ref, _ = np_attention(q, k, v, **kw)
        np.testing.assert_allclose(out[0, [0, 2, 3, 4]], ref[0, [0, 2, 3, 4]], atol=1e-5)


def test_fully_masked_rows_have_finite_gradients():
    q, k, v = _qkv(5)
    mask = jnp.asarray(_fully_masked_mask(5, 7))
    cot = np.random.default_rng(0).standard_normal((B, 5, H, D)).astype(np.float32)

    def loss(q, k, v):
        return jnp.sum(attention.dot_product_attention(q, k, v, mask=mask, causal=True) * cot)

    grads = jax.grad(loss, argnums=(0, 1, 2))(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
    for g in grads:
        assert np.all(np.isfinite(g))
    gq, gk, gv = (np.asarray(g) for g in grads)
    # Nothing reaches or leaves a fully masked query row / batch.
    np.testing.assert_array_equal(gq[0, 1], 0.0)
    np.testing.assert_array_equal(gq[1], 0.0)
    np.testing.assert_array_equal(gk[1], 0.0)
    np.testing.assert_array_equal(gv[1], 0.0)
    assert np.abs(gq[0, 2]).max() > 0  # ... while live rows do get gradient


def test_attention_weights_rows_sum_to_one():
    rng = np.random.default_rng(6)
    q, k, _ = _qkv(6, lq=6, lk=6)
    mask = rng.random((B, H, 6, 6)) > 0.5
    mask[0, 0, 3] = False
    w = np.asarray(attention.attention_weights(q, k, mask=mask, causal=True))
    live = (mask & (np.arange(6)[None, :] <= np.arange(6)[:, None])).any(-1)
    assert live.sum() > 10 and (~live).sum() >= 1
    np.testing.assert_allclose(w.sum(-1)[live], 1.0, atol=1e-6)
    np.testing.assert_array_equal(w.sum(-1)[~live], 0.0)
    assert np.all(w >= 0)
    # Masked entries are exactly zero.
    np.testing.assert_array_equal(w[~np.broadcast_to(mask, w.shape)], 0.0)
    np.testing.assert_array_equal(np.triu(np.ones((6, 6)), 1)[None, None] * w, 0.0)


@pytest.mark.parametrize("lq,lk", [(4, 4), (3, 5), (5, 3), (1, 1)])
def test_causal_mask_values(lq, lk):
    m = np.asarray(attention.causal_mask(lq, lk))
    assert m.dtype == bool and m.shape == (lq, lk)
    ref = np.array([[j <= i for j in range(lk)] for i in range(lq)])
    np.testing.assert_array_equal(m, ref)


def test_padding_mask_values():
    qv = np.array([[1, 1, 1, 0], [1, 0, 0, 0]], np.int32)
    kv = np.array([[1, 0, 1, 1, 1], [1, 1, 0, 0, 0]], bool)
    m = np.asarray(attention.padding_mask(qv, kv))
    assert m.shape == (2, 1, 4, 5) and m.dtype == bool
    for b in range(2):
        for i in range(4):
            for j in range(5):
                assert m[b, 0, i, j] == bool(qv[b, i] and kv[b, j])
    self_m = np.asarray(attention.padding_mask(qv))
    assert self_m.shape == (2, 1, 4, 4)
    np.testing.assert_array_equal(self_m[:, 0], qv[:, :, None].astype(bool) & qv[:, None, :])


def test_mask_from_positions_values():
    qp = np.array([[4, 5], [0, 1]], np.int32)  # batch 0: two queries appended to a cache
    kp = np.array([[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]], np.int32)
    m = np.asarray(attention.mask_from_positions(qp, kp))
    assert m.shape == (2, 1, 2, 6)
    ref = kp[:, None, None, :] <= qp[:, None, :, None]
    np.testing.assert_array_equal(m, ref)
    np.testing.assert_array_equal(m[0, 0, 0], [1, 1, 1, 1, 1, 0])
    np.testing.assert_array_equal(m[1, 0, 0], [1, 0, 0, 0, 0, 0])
    # For positions 0..L-1 it is the causal mask.
    ar = np.arange(5, dtype=np.int32)[None]
    np.testing.assert_array_equal(
        attention.mask_from_positions(ar, ar)[0, 0], attention.causal_mask(5, 5)
    )


# ------------------------------------------------------------------ seed-article properties


@pytest.mark.parametrize("d_k", [16, 64, 256])
def test_scaling_keeps_logit_variance_near_one(d_k):
    """q, k ~ N(0, 1): q.k has variance d_k; dividing by sqrt(d_k) brings it back to 1.

    2048 independent query and key vectors give a standard error below 0.012 on the
    variance (measured over 100 seeds), so the +-0.1 band is about 9 standard errors wide,
    while a wrong scale (none, or 1/d_k) misses it by a factor >= 16.
    """
    rng = np.random.default_rng(d_k)
    q = jnp.asarray(rng.standard_normal((4, 64, 8, d_k)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((4, 64, 8, d_k)), jnp.float32)
    scaled, _ = attention.attention_logits(q, k)
    unscaled, _ = attention.attention_logits(q, k, scale=1.0)
    var_scaled = float(np.var(np.asarray(scaled, np.float64)))
    var_unscaled = float(np.var(np.asarray(unscaled, np.float64)))
    assert abs(var_scaled - 1.0) < 0.1, var_scaled
    assert abs(var_unscaled / d_k - 1.0) < 0.1, var_unscaled  # grows linearly with d_k


@pytest.mark.parametrize("with_bias", [False, True])
def test_causal_outputs_have_zero_gradient_wrt_future_inputs(with_bias):
    lq = 6
    q, k, v = _qkv(7, lq=lq, lk=lq)
    bias = np.random.default_rng(1).standard_normal((B, H, lq, lq)).astype(np.float32)

    def f(q, k, v):
        return attention.dot_product_attention(
            q, k, v, causal=True, bias=bias if with_bias else None
        )

    jq, jk, jv = jax.jacobian(f, argnums=(0, 1, 2))(*map(jnp.asarray, (q, k, v)))
    # Jacobians are [B, L, H, D, B, L, H, D]: output (b, t, ...) w.r.t. input (b', s, ...).
    for j, name in ((jq, "q"), (jk, "k"), (jv, "v")):
        j = np.asarray(j)
        for t in range(lq):
            future = j[:, t, :, :, :, t + 1 :]
            assert np.all(future == 0.0), (name, t)
            past = j[:, t, :, :, :, : t + 1]
            # The test has power: the past does matter (query 0 attends only to key 0 with
            # weight 1, so its output depends on v alone).
            if t > 0 or name == "v":
                assert np.abs(past).max() > 0, (name, t)


def _alibi_like(qp):
    """An ALiBi-shaped ``bias_fn`` (one slope per head, ``-m_h |i - j|`` of the positions) and,
    computed separately in numpy, its bias for queries and keys both at positions ``qp``."""
    slopes = np.array([0.5, 0.25, 0.125], np.float32)

    def bias_fn(qpos, kpos):
        rel = (qpos[:, :, None] - kpos[:, None, :]).astype(jnp.float32)
        return -jnp.asarray(slopes)[None, :, None, None] * jnp.abs(rel)[:, None, :, :]

    ref_bias = -slopes[None, :, None, None] * np.abs(qp[:, :, None] - qp[:, None, :])[:, None]
    return bias_fn, ref_bias


# Every implementation that runs on any backend ("cudnn" is GPU-only and takes no bias_fn;
# tests/core/test_core_chunked_attention.py covers it).
PORTABLE = [impl for impl in attention.IMPLEMENTATIONS if impl != "cudnn"]


@pytest.mark.parametrize("implementation", PORTABLE)
def test_attend_with_bias_fn_matches_numpy(implementation):
    q, k, v = _qkv(8, lq=6, lk=6)
    qp = np.array([[0, 1, 2, 3, 4, 5], [10, 11, 12, 13, 14, 15]], np.int32)
    rng = np.random.default_rng(9)
    mask = rng.random((B, 1, 6, 6)) > 0.2
    mask[0, 0, 2] = False  # a fully masked row: zeros in every implementation
    bias_fn, ref_bias = _alibi_like(qp)
    _, _, ref, _ = np_attention(q, k, v, mask=mask, bias=ref_bias, causal=True)
    out = attention.attend(
        q,
        k,
        v,
        q_positions=qp,
        k_positions=qp,
        bias_fn=bias_fn,
        mask=mask,
        causal=True,
        implementation=implementation,
    )
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(out)[0, 2], 0.0)


class AttendWithAndWithoutJitTest(chex.TestCase):
    """Every portable implementation gives the numpy reference's outputs and equal gradients,
    traced eagerly and under ``jax.jit`` (`chex.variants`)."""

    def _inputs(self):
        q, k, v = _qkv(21, lq=6, lk=6)
        qp = np.array([[0, 1, 2, 3, 4, 5], [3, 4, 5, 6, 7, 8]], np.int32)
        mask = np.random.default_rng(22).random((B, 1, 6, 6)) > 0.2
        return q, k, v, qp, mask

    @chex.variants(with_jit=True, without_jit=True)
    def test_outputs_match_numpy(self):
        q, k, v, qp, mask = self._inputs()
        bias_fn, ref_bias = _alibi_like(qp)
        _, _, ref, _ = np_attention(q, k, v, mask=mask, bias=ref_bias, causal=True)
        for implementation in PORTABLE:
            fn = self.variant(
                functools.partial(
                    attention.attend, bias_fn=bias_fn, causal=True, implementation=implementation
                )
            )
            out = fn(q, k, v, q_positions=qp, k_positions=qp, mask=mask)
            chex.assert_shape(out, (B, 6, H, D))
            chex.assert_trees_all_close(out, ref.astype(np.float32), rtol=1e-5, atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_gradients_agree_across_implementations(self):
        q, k, v, qp, mask = self._inputs()
        bias_fn, _ = _alibi_like(qp)

        def grads(implementation):
            def loss(q, k, v):
                out = attention.attend(
                    q,
                    k,
                    v,
                    q_positions=qp,
                    k_positions=qp,
                    bias_fn=bias_fn,
                    mask=mask,
                    causal=True,
                    implementation=implementation,
                )
                return jnp.sum(out * jnp.cos(out))

            return self.variant(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)

        reference = grads("xla")
        chex.assert_tree_all_finite(reference)
        for implementation in PORTABLE:
            got = grads(implementation)
            chex.assert_trees_all_equal_shapes(got, reference)
            chex.assert_trees_all_close(got, reference, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("blocks", "mask_shape"),
    [(2, None), (3, (B, 1, 10, 10)), (4, (1, 1, 1, 10)), (3, (10, 10)), (4, None)],
)
def test_causal_query_blocks_match_numpy_and_the_full_square(monkeypatch, blocks, mask_shape):
    """The "xla" causal path split into query blocks (forced here: 10 queries in 2, 3 or 4
    uneven blocks) against the float64 reference, with a positional ``bias_fn`` per block and
    padding masks of every broadcast shape (a fully masked row included); its gradients
    against the unsplit `dot_product_attention`'s. Each block count and mask shape occurs."""
    monkeypatch.setattr(attention, "causal_query_blocks", lambda n: blocks)
    q, k, v = _qkv(20 + blocks, lq=10, lk=10)
    qp = np.stack([np.arange(10), np.arange(10) + 7]).astype(np.int32)
    bias_fn, ref_bias = _alibi_like(qp)
    mask = None
    if mask_shape is not None:
        mask = np.random.default_rng(blocks).random(mask_shape) > 0.25
        if mask_shape[-2] == 10:
            mask[(0,) * (mask.ndim - 2) + (6,)] = False  # query 6 sees nothing: a zero row
        else:
            mask[..., 0] = False  # key 0 hidden: causal query 0 sees nothing
    _, _, ref, _ = np_attention(q, k, v, mask=mask, bias=ref_bias, causal=True)

    def blocked(q, k, v):
        return attention.attend(
            q, k, v, q_positions=qp, k_positions=qp, bias_fn=bias_fn, mask=mask, causal=True
        )

    def full(q, k, v):
        bias = bias_fn(jnp.asarray(qp), jnp.asarray(qp))
        return attention.dot_product_attention(q, k, v, mask=mask, bias=bias, causal=True)

    out = jax.jit(blocked)(q, k, v)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    if mask is not None:
        np.testing.assert_array_equal(np.asarray(out)[0, 6 if mask_shape[-2] == 10 else 0], 0.0)
    w = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    grads = [
        jax.jit(jax.grad(lambda *a, f=f: jnp.sum(f(*a) * w), argnums=(0, 1, 2)))(q, k, v)
        for f in (blocked, full)
    ]
    for name, a, b in zip("qkv", *grads, strict=True):
        assert np.isfinite(np.asarray(a)).all(), name
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)


def test_causal_query_blocks_rule_and_skipped_work():
    """1 block below 64 tokens, 2 below 256, then 4; and the program really skips the upper
    triangle: 64 causal tokens give score products of 32 x 32 and 32 x 64, never 64 x 64."""
    assert [attention.causal_query_blocks(n) for n in (1, 63, 64, 255, 256, 4096)] == [
        1,
        1,
        2,
        2,
        4,
        4,
    ]
    with pytest.raises(ValueError, match="length=0"):
        attention.causal_query_blocks(0)
    q, k, v = (jnp.asarray(a) for a in _qkv(30, lq=64, lk=64))
    pos = jnp.arange(64)

    def run(causal, window=None):
        return attention.attend(
            q, k, v, q_positions=pos, k_positions=pos, causal=causal, window=window
        )

    def score_shapes(causal, window=None):
        jaxpr = jax.make_jaxpr(lambda: run(causal, window))()
        return {
            tuple(eq.outvars[0].aval.shape[2:])
            for eq in jaxpr.eqns
            if eq.primitive.name == "dot_general"
            and eq.outvars[0].aval.shape[:2] == (B, H)
            and D not in eq.outvars[0].aval.shape[2:]  # the scores, not weights x values
        }

    assert score_shapes(True) == {(32, 32), (32, 64)}
    assert score_shapes(False) == {(64, 64)}  # bidirectional: one square
    assert score_shapes(True, window=8) == {(64, 64)}  # a window keeps the square (and its mask)
    np.testing.assert_allclose(
        run(True), np_attention(q, k, v, causal=True)[2], rtol=1e-5, atol=1e-5
    )


def test_invalid_arguments_raise_clear_errors():
    q, k, v = _qkv(10)
    with pytest.raises(ValueError, match="implementation='nope'"):
        attention.attend(q, k, v, q_positions=None, k_positions=None, implementation="nope")
    with pytest.raises(ValueError, match="mask must be boolean"):
        attention.dot_product_attention(q, k, v, mask=np.ones((5, 7), np.float32))
    with pytest.raises(ValueError, match="mask has shape"):
        attention.dot_product_attention(q, k, v, mask=np.ones((5, 6), bool))
    with pytest.raises(ValueError, match="q must have rank 4"):
        attention.dot_product_attention(q[0], k, v)
    with pytest.raises(ValueError, match="head_dim"):
        attention.dot_product_attention(q, k[..., :4], v)
    with pytest.raises(ValueError, match=r"q_len=.*: must be a positive int"):
        attention.causal_mask(0, 3)


# ------------------------------------------------------------------ sliding-window attention


def np_window_mask(lq, lk, window):
    """Loop reference: query i sees key j iff i - window < j <= i."""
    return np.array([[i - window < j <= i for j in range(lk)] for i in range(lq)], bool)


@pytest.mark.parametrize(
    "lq,lk,window", [(6, 6, 1), (6, 6, 3), (6, 6, 6), (6, 6, 9), (4, 7, 2), (9, 4, 2), (1, 1, 1)]
)
def test_window_mask_values(lq, lk, window):
    m = np.asarray(attention.window_mask(lq, lk, window))
    assert m.dtype == bool and m.shape == (lq, lk)
    np.testing.assert_array_equal(m, np_window_mask(lq, lk, window))
    # Each query sees at most its last `window` keys; a window >= the length is causal.
    assert m.sum(-1).max() <= window
    if window >= lk:
        np.testing.assert_array_equal(m, attention.causal_mask(lq, lk))


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("window", [1, 2, 4, 7, 50])
def test_windowed_attention_matches_numpy(window, padding):
    lq = lk = 7
    rng = np.random.default_rng(100 + window + 7 * padding)
    q, k, v = _qkv(rng.integers(1 << 30), lq, lk)
    band = np_window_mask(lq, lk, window)
    mask = None
    allowed_mask = band[None, None]
    if padding:
        valid = np.ones((B, lk), bool)
        valid[0, 2:4] = False  # with window 1 or 2, rows 2 and/or 3 of batch 0 see nothing
        valid[1, 0] = False  # with window 1, row 0 of batch 1 sees nothing
        mask = valid[:, None, None, :]
        allowed_mask = band[None, None] & mask
    ref_logits, ref_w, ref_out, allowed = np_attention(q, k, v, mask=allowed_mask)

    kw = {"mask": mask, "causal": True, "window": window}
    out = np.asarray(attention.dot_product_attention(q, k, v, **kw))
    w = np.asarray(attention.attention_weights(q, k, **kw))
    logits, combined = attention.attention_logits(jnp.asarray(q), jnp.asarray(k), **kw)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(w))
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.broadcast_to(combined, allowed.shape), allowed)
    np.testing.assert_allclose(
        np.where(allowed, logits, 0.0), np.where(allowed, ref_logits, 0.0), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_array_equal(w[~allowed], 0.0)  # nothing outside the band, exactly
    live = allowed.any(-1)
    np.testing.assert_allclose(w.sum(-1)[live], 1.0, atol=1e-6)
    np.testing.assert_array_equal(w.sum(-1)[~live], 0.0)
    if padding and window <= 2:  # the test covers rows the window and padding empty
        assert not live.all()
    if window == 1 and not padding:  # each query sees only itself: the output is v
        np.testing.assert_allclose(out, v, rtol=1e-6, atol=1e-6)
    if window >= lk:  # a window covering the sequence is plain causal attention
        plain = attention.dot_product_attention(q, k, v, mask=mask, causal=True)
        np.testing.assert_allclose(out, plain, rtol=1e-6, atol=1e-6)
    elif window > 1:  # ... and a shorter one really changes the answer
        plain = attention.dot_product_attention(q, k, v, mask=mask, causal=True)
        assert np.abs(np.asarray(plain) - out).max() > 1e-2


def test_window_rows_past_the_keys_are_zero_with_finite_gradients():
    """Query i >= kv_len + W - 1 sees no key at all: zeros, never NaN, no gradient."""
    lq, lk, window = 9, 4, 2
    q, k, v = _qkv(11, lq, lk)
    out = np.asarray(attention.dot_product_attention(q, k, v, causal=True, window=window))
    _, _, ref, _ = np_attention(q, k, v, mask=np_window_mask(lq, lk, window))
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[:, lk + window - 1 :], 0.0)
    assert np.abs(out[:, lk + window - 2]).max() > 0

    def loss(q, k, v):
        return jnp.sum(jnp.sin(attention.dot_product_attention(q, k, v, causal=True, window=2)))

    gq, gk, gv = jax.grad(loss, argnums=(0, 1, 2))(*map(jnp.asarray, (q, k, v)))
    assert all(np.all(np.isfinite(g)) for g in (gq, gk, gv))
    np.testing.assert_array_equal(np.asarray(gq)[:, lk + window - 1 :], 0.0)
    assert np.abs(np.asarray(gk)).max() > 1e-3


def test_windowed_outputs_depend_only_on_the_window():
    """Output t has zero derivative w.r.t. inputs s > t and s <= t - W, nonzero within."""
    lq, window = 7, 3
    q, k, v = _qkv(12, lq=lq, lk=lq)

    def f(q, k, v):
        return attention.dot_product_attention(q, k, v, causal=True, window=window)

    jk, jv = jax.jacobian(f, argnums=(1, 2))(*map(jnp.asarray, (q, k, v)))
    for j, name in ((jk, "k"), (jv, "v")):
        j = np.asarray(j)  # [B, L, H, D, B, L, H, D]
        for t in range(lq):
            outside = [s for s in range(lq) if not t - window < s <= t]
            assert np.all(j[:, t, :, :, :, outside] == 0.0), (name, t)
            inside = [s for s in range(lq) if t - window < s <= t]
            if t > 0 or name == "v":
                assert np.abs(j[:, t, :, :, :, inside]).max() > 0, (name, t)


@pytest.mark.parametrize("implementation", PORTABLE)
def test_attend_with_window_matches_numpy(implementation):
    lq = lk = 8
    window = 3
    q, k, v = _qkv(13, lq=lq, lk=lk)
    qp = np.broadcast_to(np.arange(lq, dtype=np.int32), (B, lq))
    valid = np.ones((B, lk), bool)
    valid[0, 3:6] = False  # batch 0, query 5 sees keys 3..5: all padding -> zeros
    mask = valid[:, None, None, :]
    bias_fn, ref_bias = _alibi_like(qp)
    band = np_window_mask(lq, lk, window)[None, None] & mask
    _, _, ref, _ = np_attention(q, k, v, mask=band, bias=ref_bias)
    kw = dict(q_positions=qp, k_positions=qp, mask=mask, causal=True, window=window)
    out = attention.attend(q, k, v, bias_fn=bias_fn, implementation=implementation, **kw)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(out)[0, 5], 0.0)
    _, _, ref_nobias, _ = np_attention(q, k, v, mask=band)
    out = attention.attend(q, k, v, implementation=implementation, **kw)
    np.testing.assert_allclose(out, ref_nobias, rtol=1e-5, atol=1e-5)


def test_window_argument_errors():
    q, k, v = _qkv(14, lq=6, lk=6)
    qp = np.broadcast_to(np.arange(6, dtype=np.int32), (B, 6))
    calls = {
        "dot_product_attention": lambda **kw: attention.dot_product_attention(q, k, v, **kw),
        "attention_weights": lambda **kw: attention.attention_weights(q, k, **kw),
        "attention_logits": lambda **kw: attention.attention_logits(q, k, **kw),
    }
    for impl in attention.IMPLEMENTATIONS:
        calls[impl] = lambda impl=impl, **kw: attention.attend(
            q, k, v, q_positions=qp, k_positions=qp, implementation=impl, **kw
        )
    for name, call in calls.items():
        with pytest.raises(ValueError, match=r"window=3: a sliding window needs causal=True"):
            call(window=3)
        with pytest.raises(ValueError, match=r"^window=0: must be a positive int$"):
            call(window=0, causal=True)
        with pytest.raises(ValueError, match=r"^window=True: must be a positive int$"):
            call(window=True, causal=True)
        with pytest.raises(ValueError, match=r"^window=-2: must be a positive int$"):
            call(window=-2, causal=True)
        with pytest.raises(ValueError, match=r"^window=2.0: must be a positive int$"):
            call(window=2.0, causal=True)
        if name != "cudnn":  # (cudnn cannot run on this backend at all)
            assert np.all(np.isfinite(call(window=2, causal=True)[0])), name
    with pytest.raises(ValueError, match=r"^window=0: must be a positive int$"):
        attention.window_mask(4, 4, 0)


@pytest.mark.parametrize("implementation", ["xla", "chunked"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_softmax_of_huge_logits_is_finite_with_finite_gradients(implementation, dtype):
    """Logits of +-1e4 (from q.k and from the bias) give finite outputs equal to the hard
    attention they approximate, and finite gradients."""
    b, n, h, d = 1, 6, 2, 4
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(b, n, h, d)), dtype)
    k = jnp.asarray(rng.normal(size=(b, n, h, d)), dtype)
    v = jnp.asarray(rng.normal(size=(b, n, h, d)), dtype)
    positions = jnp.arange(n, dtype=jnp.int32)[None, :]

    def bias_fn(qp, kp):
        """+1e4 on key j = i // 2 (<= i), -1e4 elsewhere: each query sees one key only."""
        hit = kp[:, None, None, :] == qp[:, None, :, None] // 2
        return jnp.broadcast_to(
            jnp.where(hit, 1e4, -1e4).astype(jnp.float32), (b, h, qp.shape[1], kp.shape[1])
        )

    def out(q, k, v, scale):
        return attention.attend(
            q * scale,
            k,
            v,
            q_positions=positions,
            k_positions=positions,
            bias_fn=bias_fn,
            causal=True,
            implementation=implementation,
        )

    y = out(q, k, v, 1.0)
    assert y.dtype == dtype and bool(jnp.all(jnp.isfinite(y.astype(jnp.float32))))
    expected = np.asarray(v, np.float32)[:, np.arange(n) // 2]  # the one key each query sees
    np.testing.assert_allclose(np.asarray(y, np.float32), expected, atol=1e-2)

    # q.k itself huge (|logits| ~ 1e4 and beyond): still finite, gradients too.
    def loss(q, k, v):
        return out(q, k, v, 3e3).astype(jnp.float32).sum()

    grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    assert bool(jnp.all(jnp.isfinite(out(q, k, v, 3e3).astype(jnp.float32))))
    for g in grads:
        assert bool(jnp.all(jnp.isfinite(g.astype(jnp.float32))))


def test_softmax_weights_of_opposite_huge_logits():
    """attention_weights of logits exactly +1e4 / -1e4: a one-hot row, finite gradients."""
    d = 4
    q = jnp.zeros((1, 1, 1, d)).at[..., 0].set(100.0)
    k = jnp.zeros((1, 3, 1, d)).at[0, :, 0, 0].set(jnp.array([200.0, -200.0, 0.0]))
    # logits = q.k / sqrt(d) = [1e4, -1e4, 0]
    w = attention.attention_weights(q, k)
    np.testing.assert_allclose(np.asarray(w[0, 0, 0]), [1.0, 0.0, 0.0], atol=0)
    g = jax.grad(lambda q: attention.attention_weights(q, k)[0, 0, 0, 1])(q)
    assert bool(jnp.all(jnp.isfinite(g)))


def test_causal_weights_without_the_zeroing_pass_are_bitwise_the_masked_ones():
    """`attention_weights` skips the final select for a causal-only mask; the result is
    bit-for-bit the one computed with the same mask given explicitly (which selects)."""
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    q = jax.random.normal(keys[0], (2, 7, 3, 4)) * 4.0
    k = jax.random.normal(keys[1], (2, 9, 3, 4)) * 4.0
    bias = -0.5 * jnp.abs(jnp.arange(7)[:, None] - jnp.arange(9)[None, :]).astype(jnp.float32)
    causal = attention.attention_weights(q, k, bias=bias[None, None], causal=True)
    explicit = attention.attention_weights(
        q, k, bias=bias[None, None], mask=attention.causal_mask(7, 9)[None, None]
    )
    np.testing.assert_array_equal(np.asarray(causal), np.asarray(explicit))
    assert np.all(np.asarray(causal)[:, :, 0, 1:] == 0.0)
