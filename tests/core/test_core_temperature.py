"""Length-dependent temperature: Qwen's logn, SSMax and Llama 4's factor, and their use.

Each factor is checked against a transcription of its reference (Qwen-7B's ``logn_list``,
Hugging Face's ``Llama4TextAttention``, the SSMax paper's ``s log n``) and the attention that
uses it against a float64 numpy forward of ``softmax(tau q k^T / sqrt(d)) v``.
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_lite.core import attention, kv_cache, temperature
from flaxformer_lite.core.chunked_attention import chunked_attention

B, H, D = 2, 4, 8


def test_logn_matches_qwens_table():
    """Qwen: ``logn_list = [log(i, L) if i > L else 1 for i in range(1, 32768)]`` indexed by
    the 0-based position (``logn_tensor[:, seq_start:seq_end]``)."""
    train = 16
    positions = np.arange(5 * train)
    qwen = [math.log(i, train) if i > train else 1 for i in range(1, 5 * train + 1)]
    got = temperature.logn_scale(positions, train_length=train)
    assert got.shape == (1, 5 * train) and got.dtype == jnp.float32
    np.testing.assert_allclose(got[0], qwen, rtol=1e-6)
    assert float(got[0, train - 1]) == 1.0 and float(got[0, train]) > 1.0
    at_square = temperature.logn_scale(jnp.asarray([train**2 - 1]), train_length=train)
    assert float(at_square[0, 0]) == pytest.approx(2.0, rel=1e-6)  # p + 1 = L^2


def test_llama4_matches_transformers_formula():
    """HF: ``log1p(floor((positions + 1) / floor_scale)) * attn_scale + 1``, 0-based."""
    positions = np.array([[0, 8190, 8191, 8192, 16382, 16383, 100_000, 1_000_000]])
    got = temperature.llama4_scale(positions)
    want = np.log1p(np.floor((positions + 1.0) / 8192)) * 0.1 + 1.0
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_array_equal(got[0, :2], 1.0)
    assert float(got[0, 2]) == pytest.approx(1 + 0.1 * math.log(2), rel=1e-6)  # p + 1 = 8192
    small = temperature.llama4_scale(jnp.arange(10), floor_scale=4, attn_scale=0.5)
    np.testing.assert_allclose(small[0], np.log1p(np.floor((np.arange(10) + 1) / 4)) * 0.5 + 1)


@pytest.mark.parametrize("window,keep_first", [(None, None), (4, None), (4, 3), (6, 1)])
def test_visible_keys_counts_the_mask(window, keep_first):
    length = 20
    positions = jnp.arange(length)
    if window is None:
        mask = attention.causal_mask(length, length)
    elif keep_first is None:
        mask = attention.window_mask(length, length, window)
    else:
        mask = attention.streaming_mask(length, length, window=window, keep_first=keep_first)
    got = temperature.visible_keys(positions, window=window, keep_first=keep_first)
    np.testing.assert_array_equal(got[0], np.asarray(mask).sum(-1))


def np_scaled_attention(q, k, v, tau):
    """float64 causal softmax(tau_i * q_i k^T / sqrt(d)) v; tau [b, L, h]."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    tau = np.asarray(tau, np.float64)
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    logits = logits * np.transpose(tau, (0, 2, 1))[..., None]
    length = q.shape[1]
    logits = np.where(np.tril(np.ones((length, length), bool)), logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p, v)


def _qkv(seed, length):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.standard_normal((B, length, H, D)), jnp.float32) for _ in range(3))


def test_ssmax_attention_is_softmax_of_s_log_n_times_the_logits():
    """SSMax (arXiv 2501.19399, Eq. 3): row i's logits times s_h * log(i + 1)."""
    length = 13
    q, k, v = _qkv(0, length)
    s = jnp.asarray([0.3, 0.43, 1.0, 2.0], jnp.float32)
    pos = jnp.arange(length)
    tau = temperature.ssmax_scale(pos, s)
    assert tau.shape == (1, length, H)
    np.testing.assert_allclose(tau[0], np.log(np.arange(1, length + 1))[:, None] * np.asarray(s))
    out = attention.attend(
        temperature.scale_queries(q, tau), k, v, q_positions=pos, k_positions=pos, causal=True
    )
    want = np_scaled_attention(q, k, v, np.broadcast_to(tau, (B, length, H)))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    # with s = 1 / log(L) the factor is log(n) / log(L): Qwen's logn, unclamped
    L = 8
    flat = temperature.ssmax_scale(pos, jnp.full((H,), 1 / math.log(L), jnp.float32))
    logn = temperature.logn_scale(pos, train_length=L)
    np.testing.assert_allclose(flat[0, L - 1 :, 0], logn[0, L - 1 :], rtol=1e-5)


def test_ssmax_gradient_of_s_is_the_same_through_chunked_and_plain():
    length = 40
    q, k, v = _qkv(1, length)
    pos = jnp.arange(length)
    s0 = jnp.asarray([0.3, 0.43, 0.6, 0.9], jnp.float32)

    def loss(s, implementation):
        qs = temperature.scale_queries(q, temperature.ssmax_scale(pos, s, window=9))
        if implementation == "chunked":
            out = chunked_attention(
                qs, k, v, q_positions=pos, k_positions=pos, causal=True, window=9, block_q=8
            )
        else:
            out = attention.attend(
                qs, k, v, q_positions=pos, k_positions=pos, causal=True, window=9
            )
        return jnp.sum(jnp.sin(3.0 * out))

    g_plain = jax.jit(jax.grad(loss), static_argnums=1)(s0, "xla")
    g_chunk = jax.jit(jax.grad(loss), static_argnums=1)(s0, "chunked")
    assert np.abs(g_plain).min() > 1e-3
    np.testing.assert_allclose(g_chunk, g_plain, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rule", ["logn", "llama4"])
def test_query_factor_in_cached_decoding_equals_the_full_pass(rule):
    """A per-query factor needs nothing from the cache: scaling each step's queries at their
    own positions reproduces the full pass."""
    length, prompt = 14, 5

    def tau_of(pos):
        if rule == "logn":
            return temperature.logn_scale(pos, train_length=4)
        return temperature.llama4_scale(pos, floor_scale=3, attn_scale=0.3)

    q, k, v = _qkv(2, length)
    pos = jnp.arange(length)
    full = attention.attend(
        temperature.scale_queries(q, tau_of(pos)),
        k,
        v,
        q_positions=pos,
        k_positions=pos,
        causal=True,
    )

    @jax.jit
    def step(cache, q, k, v, p):
        cache = kv_cache.write(cache, k, v, p)
        out = attention.attend(
            temperature.scale_queries(q, tau_of(p)),
            cache.key,
            cache.value,
            q_positions=p,
            k_positions=cache.positions,
            mask=kv_cache.self_attention_mask(p, cache),
        )
        return cache, out

    cache = kv_cache.init_kv_cache(B, length, H, D)
    outs = []
    for lo, hi in [(0, prompt)] + [(t, t + 1) for t in range(prompt, length)]:
        p = jnp.broadcast_to(pos[lo:hi], (B, hi - lo))
        cache, out = step(cache, q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], p)
        outs.append(out)
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, rtol=1e-5, atol=1e-6)
    assert float(jnp.max(tau_of(pos))) > 1.0  # the factor did act


class TemperatureJitTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_factors_under_jit(self):
        pos = jnp.arange(40)[None]
        s = jnp.asarray([0.5, 1.0, 1.5, 2.0])
        for fn in (
            lambda p: temperature.logn_scale(p, train_length=8),
            lambda p: temperature.llama4_scale(p, floor_scale=7),
            lambda p: temperature.ssmax_scale(p, s, window=5, keep_first=2),
        ):
            chex.assert_trees_all_close(self.variant(fn)(pos), fn(pos), rtol=1e-6, atol=0)


def test_scale_queries_values_dtype_and_shapes():
    q = jnp.ones((B, 3, H, D), jnp.bfloat16)
    per_query = temperature.scale_queries(q, jnp.asarray([[1.0, 2.0, 3.0]]))
    assert per_query.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(per_query[0, :, 0, 0], np.float32), [1.0, 2.0, 3.0])
    per_head = temperature.scale_queries(q, jnp.arange(12, dtype=jnp.float32).reshape(1, 3, H))
    assert float(per_head[1, 2, 3, 5]) == 11.0


def test_temperature_argument_errors():
    pos = jnp.arange(4)
    with pytest.raises(ValueError, match="train_length=1: must be >= 2"):
        temperature.logn_scale(pos, train_length=1)
    with pytest.raises(ValueError, match="train_length=0: must be a positive int"):
        temperature.logn_scale(pos, train_length=0)
    with pytest.raises(ValueError, match="floor_scale=0: must be a finite number > 0"):
        temperature.llama4_scale(pos, floor_scale=0)
    with pytest.raises(ValueError, match=r"s=float32\[1, 4\]: must be a float array \[heads\]"):
        temperature.ssmax_scale(pos, jnp.ones((1, H)))
    with pytest.raises(ValueError, match="keep_first=2: keeping the first keys needs"):
        temperature.visible_keys(pos, keep_first=2)
    with pytest.raises(ValueError, match=r"tau shape \(1, 3\) must be"):
        temperature.scale_queries(jnp.ones((B, 4, H, D)), jnp.ones((1, 3)))
    with pytest.raises(ValueError, match="q must be"):
        temperature.scale_queries(jnp.ones((4, H, D)), jnp.ones((1, 4)))
    with pytest.raises(ValueError, match="positions=float32"):
        temperature.logn_scale(jnp.ones(3), train_length=4)
