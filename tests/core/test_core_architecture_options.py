"""Pure-core pieces of the pretrained-family options, each against a second computation:
grouped-query attention (numpy repeat-kv attention, HF ``repeat_kv`` order) in every
implementation, MPT's and the official ALiBi slopes (numpy transcriptions of HF
``build_mpt_alibi_tensor`` and Press et al.'s ``get_slopes``), and fairseq's sinusoid (a
numpy transcription of ``SinusoidalPositionalEmbedding.get_embedding``)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_lite.core import absolute, attention, attention_bias

B, L, H, D = 2, 6, 4, 8


def np_gqa_attention(q, k, v, *, causal, bias=None, mask=None):
    """Numpy attention with key/value heads repeated as HF's ``repeat_kv``: query head h
    uses key/value head h // (H / KV). q ``[b, l, H, d]``, k/v ``[b, s, KV, d]``."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    groups = q.shape[2] // k.shape[2]
    out = np.zeros(q.shape)
    for h in range(q.shape[2]):
        kh, vh = k[:, :, h // groups], v[:, :, h // groups]
        logits = np.einsum("bqd,bkd->bqk", q[:, :, h], kh) / math.sqrt(q.shape[-1])
        if bias is not None:
            logits = logits + np.asarray(bias, np.float64)[:, h]
        allowed = np.ones(logits.shape, bool)
        if causal:
            allowed &= np.tril(np.ones(logits.shape[1:], bool))[None]
        if mask is not None:
            allowed &= np.broadcast_to(np.asarray(mask)[:, 0], logits.shape)
        logits = np.where(allowed, logits, -np.inf)
        w = np.exp(logits - logits.max(-1, keepdims=True))
        w = w / w.sum(-1, keepdims=True)
        out[:, :, h] = np.einsum("bqk,bkd->bqd", w, vh)
    return out


def _qkv(kv_heads, seed=0, length=L):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, length, H, D)).astype(np.float32)
    k = rng.normal(size=(B, length, kv_heads, D)).astype(np.float32)
    v = rng.normal(size=(B, length, kv_heads, D)).astype(np.float32)
    return q, k, v


def test_repeat_kv_follows_hf_order():
    k = np.arange(2 * 3 * 2 * 1, dtype=np.float32).reshape(2, 3, 2, 1)
    out = np.asarray(attention.repeat_kv(jnp.asarray(k), 6))
    assert out.shape == (2, 3, 6, 1)
    for h in range(6):
        np.testing.assert_array_equal(out[:, :, h], k[:, :, h // 3])
    same = jnp.asarray(k)
    assert attention.repeat_kv(same, 2) is same  # as many heads: the input itself
    with pytest.raises(ValueError, match="must divide the query head count"):
        attention.repeat_kv(jnp.asarray(k), 3)
    q, k4, v4 = _qkv(3)
    with pytest.raises(ValueError, match="k's heads must divide q's"):
        attention.dot_product_attention(q, k4, v4)


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("implementation", ["xla", "chunked"])
def test_gqa_attend_matches_numpy_repeat_kv(kv_heads, implementation):
    q, k, v = _qkv(kv_heads)
    pos = jnp.arange(L)
    valid = np.ones((B, L), bool)
    valid[1, -2:] = False
    mask = attention.padding_mask(jnp.ones((B, L), bool), jnp.asarray(valid))
    for causal, m in ((True, None), (False, mask)):
        out = attention.attend(
            q,
            k,
            v,
            q_positions=pos,
            k_positions=pos,
            mask=m,
            causal=causal,
            implementation=implementation,
        )
        assert out.shape == (B, L, H, D)
        ref = np_gqa_attention(q, k, v, causal=causal, mask=None if m is None else np.asarray(m))
        np.testing.assert_allclose(out, ref, atol=2e-5)
    weights = attention.attention_weights(q, k, causal=True)
    assert weights.shape == (B, H, L, L)


def test_gqa_blocked_causal_xla_and_fused_kernel_order():
    """64 tokens take the "xla" implementation's blocked-causal path; the fused
    `jax.nn.dot_product_attention` (its XLA kernel here) takes the fewer key/value heads
    natively and must agree with the repeat-kv order."""
    q, k, v = _qkv(2, seed=1, length=64)
    pos = jnp.arange(64)
    assert attention.causal_query_blocks(64) > 1
    out = attention.attend(q, k, v, q_positions=pos, k_positions=pos, causal=True)
    ref = np_gqa_attention(q, k, v, causal=True)
    np.testing.assert_allclose(out, ref, atol=2e-5)
    fused = attention._fused_attention(q, k, v, mask=None, causal=True, scale=None, kernel="xla")
    np.testing.assert_allclose(fused, ref, atol=2e-5)


def test_gqa_chunked_equals_xla_with_mpt_alibi_forward_and_gradients():
    """Chunked == xla with grouped-query attention and ALiBi ("mpt" slopes, max_bias 16) as a
    per-block bias function, values and gradients (the key/value gradients sum over each
    group of query heads)."""
    q, k, v = _qkv(2, seed=2, length=12)
    pos = jnp.arange(12)
    slopes = attention_bias.mpt_alibi_slopes(H, max_bias=16.0)

    def bias_fn(qp, kp):
        return attention_bias.alibi_bias(qp, kp, slopes, causal=True)

    def run(implementation):
        def loss(q, k, v):
            out = attention.attend(
                q,
                k,
                v,
                q_positions=pos,
                k_positions=pos,
                bias_fn=bias_fn,
                causal=True,
                implementation=implementation,
            )
            return jnp.sum(out * jnp.cos(out)), out

        (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
        return out, grads

    out_x, grads_x = run("xla")
    out_c, grads_c = run("chunked")
    ref = np_gqa_attention(q, k, v, causal=True, bias=bias_fn(pos[None], pos[None]))
    np.testing.assert_allclose(out_x, ref, atol=2e-5)
    np.testing.assert_allclose(out_c, out_x, atol=2e-5)
    for gc, gx, shape in zip(grads_c, grads_x, (q.shape, k.shape, v.shape), strict=True):
        assert gc.shape == shape
        np.testing.assert_allclose(gc, gx, atol=2e-5)


# ------------------------------------------------------------------------------ ALiBi


def np_mpt_slopes(n_heads, alibi_bias_max=8.0):
    """Numpy transcription of HF transformers modeling_mpt.build_mpt_alibi_tensor's slopes
    (torch float32 arithmetic)."""
    num_heads_power_of_2 = 2 ** math.ceil(math.log2(n_heads))
    base = np.arange(1, num_heads_power_of_2 + 1, dtype=np.float32)
    base = base * np.float32(alibi_bias_max / num_heads_power_of_2)
    slopes = np.float32(1.0) / np.power(np.float32(2.0), base)
    if num_heads_power_of_2 != n_heads:
        slopes = np.concatenate([slopes[1::2], slopes[::2]])[:n_heads]
    return slopes


def np_official_slopes(n, max_bias=8.0):
    """Press et al.'s get_slopes (ofirpress/attention_with_linear_biases), 8 -> max_bias."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - math.log2(max_bias))))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    p = 2 ** math.floor(math.log2(n))
    return power_of_2(p) + np_official_slopes(2 * p, max_bias)[0::2][: n - p]


@pytest.mark.parametrize("n", [1, 4, 6, 12])
@pytest.mark.parametrize("max_bias", [8.0, 16.0])
def test_mpt_slopes_match_hf_transcription(n, max_bias):
    slopes = attention_bias.mpt_alibi_slopes(n, max_bias=max_bias)
    assert slopes.shape == (n,) and slopes.dtype == jnp.float32
    np.testing.assert_allclose(slopes, np_mpt_slopes(n, max_bias), rtol=1e-6)
    # MPT's rule gives the official slopes for every head count (see its docstring)
    np.testing.assert_allclose(slopes, attention_bias.alibi_slopes(n, max_bias=max_bias), rtol=1e-6)


@pytest.mark.parametrize("n", [3, 4, 6, 12, 24])
def test_official_slopes_generalise_max_bias_and_keep_8(n):
    np.testing.assert_array_equal(
        attention_bias.alibi_slopes(n), attention_bias.alibi_slopes(n, max_bias=8.0)
    )
    # the default is bit for bit the formula it was before max_bias existed
    start = lambda p: 2.0 ** (-8.0 / p)
    p = 2 ** math.floor(math.log2(n))
    before = [start(p) ** (i + 1) for i in range(p)]
    before += [start(2 * p) ** (i + 1) for i in range(2 * p)][0::2][: n - p]
    np.testing.assert_array_equal(attention_bias.alibi_slopes(n), np.float32(before))
    np.testing.assert_allclose(
        attention_bias.alibi_slopes(n, max_bias=4.0), np_official_slopes(n, 4.0), rtol=1e-6
    )
    with pytest.raises(ValueError, match=r"max_bias=0\.0: must be a finite number > 0"):
        attention_bias.alibi_slopes(n, max_bias=0.0)


# ------------------------------------------------------------------ fairseq sinusoid


def np_fairseq_get_embedding(num_embeddings, embedding_dim):
    """Numpy transcription of fairseq SinusoidalPositionalEmbedding.get_embedding (and HF
    XGLM's), without the padding row zeroing."""
    half_dim = embedding_dim // 2
    emb = math.log(10000) / (half_dim - 1)
    emb = np.exp(np.arange(half_dim, dtype=np.float64) * -emb)
    emb = np.arange(num_embeddings, dtype=np.float64)[:, None] * emb[None, :]
    emb = np.concatenate([np.sin(emb), np.cos(emb)], axis=1).reshape(num_embeddings, -1)
    if embedding_dim % 2 == 1:
        emb = np.concatenate([emb, np.zeros((num_embeddings, 1))], axis=1)
    return emb


@pytest.mark.parametrize("dim", [8, 9, 16])
def test_fairseq_sinusoid_matches_get_embedding(dim):
    positions = np.array([[0, 1, 2, 7], [3, 40, 100, 511]], np.int32)
    pe = absolute.sinusoidal_fairseq(positions, dim)
    assert pe.shape == (2, 4, dim) and pe.dtype == jnp.float32
    table = np_fairseq_get_embedding(512, dim)
    np.testing.assert_allclose(pe, table[positions], atol=2e-5)
    with pytest.raises(ValueError, match="dim=3: the fairseq sinusoid needs dim >= 4"):
        absolute.sinusoidal_fairseq(positions, 3)
