"""Forgetting attention (FoX): gates, prefix sums, the bias, in every attention path.

The spec is `np_fox_attention`, a float64 numpy forward written from the FoX paper (Lin et
al. 2025, Eq. 4-6): ``f_t = sigmoid(w . x_t + b)`` per head, logit ``(i, j)`` plus
``sum_{k=j+1..i} log f_k`` for ``j <= i`` -- summed term by term, not through prefix sums.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_lite.core import attention, attention_bias, forgetting, kv_cache
from flaxformer_lite.core.chunked_attention import chunked_attention

B, H, D, DM = 2, 4, 8, 12
BLOCKS = {"block_q": 8, "block_k": 16}


def np_fox_attention(q, k, v, x, w, b, *, sinks=None):
    """float64 FoX forward: (D [b, h, L, L] with -inf above the diagonal, output)."""
    q, k, v, x, w, b = (np.asarray(a, np.float64) for a in (q, k, v, x, w, b))
    length = q.shape[1]
    log_f = -np.log1p(np.exp(-(x @ w + b)))  # log sigmoid, [b, L, h]
    decay = np.full((q.shape[0], q.shape[2], length, length), -np.inf)
    for i in range(length):
        for j in range(i + 1):
            decay[:, :, i, j] = log_f[:, j + 1 : i + 1].sum(axis=1)  # gates passed since j
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1]) + decay
    if sinks is not None:
        sink = np.broadcast_to(
            np.asarray(sinks, np.float64)[None, :, None, None], (*logits.shape[:3], 1)
        )
        logits = np.concatenate([logits, sink], axis=-1)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    if sinks is not None:
        p = p[..., :-1]
    return decay, np.einsum("bhqk,bkhd->bqhd", p, v)


def _inputs(seed, length):
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.standard_normal((B, length, H, D)), jnp.float32) for _ in range(3))
    x = jnp.asarray(rng.standard_normal((B, length, DM)), jnp.float32)
    w = jnp.asarray(rng.normal(0.0, 0.5, (DM, H)), jnp.float32)
    b = jnp.asarray(rng.normal(1.0, 1.0, H), jnp.float32)  # gates between ~0.3 and ~0.99
    return q, k, v, x, w, b


def _fox(x, w, b):
    c = forgetting.forget_prefix(forgetting.log_forget_gates(x, w, b))
    return c, c


def test_fox_forward_matches_numpy_in_every_implementation():
    length = 21
    q, k, v, x, w, b = _inputs(0, length)
    decay, ref = np_fox_attention(q, k, v, x, w, b)
    c_q, c_k = _fox(x, w, b)
    bias = forgetting.forgetting_bias(c_q, c_k)
    causal = np.tril(np.ones((length, length), bool))
    np.testing.assert_allclose(np.where(causal, bias, -np.inf), decay, rtol=1e-5, atol=1e-5)
    pos = jnp.arange(length)
    for implementation in ("xla", "chunked"):
        out = attention.attend(
            q,
            k,
            v,
            q_positions=pos,
            k_positions=pos,
            causal=True,
            forget_prefix=(c_q, c_k),
            implementation=implementation,
        )
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5, err_msg=implementation)


def test_constant_gates_are_alibi_with_slope_minus_log_f():
    """With the same gate f at every token, c_i - c_j = (i - j) log f: ALiBi with slope
    m_h = -log f_h (the data-independent special case)."""
    length = 9
    f = np.array([0.9, 0.5, 0.99, 0.2])
    log_f = jnp.broadcast_to(jnp.log(jnp.asarray(f, jnp.float32)), (1, length, H))
    c = forgetting.forget_prefix(log_f)
    pos = jnp.arange(length)
    alibi = attention_bias.alibi_bias(pos, pos, jnp.asarray(-np.log(f), jnp.float32))
    causal = np.tril(np.ones((length, length), bool))
    got = forgetting.forgetting_bias(c, c)
    np.testing.assert_allclose(np.where(causal, got, 0), np.where(causal, alibi, 0), atol=1e-5)


def test_gate_values_and_the_decay_depends_only_on_gates_after_the_key():
    x = jnp.asarray(np.random.default_rng(1).standard_normal((1, 6, DM)), jnp.float32)
    w = jnp.zeros((DM, H))
    b = jnp.asarray([0.0, 2.0, -2.0, 30.0])
    log_f = forgetting.log_forget_gates(x, w, b)
    want = np.log(1.0 / (1.0 + np.exp(-np.asarray(b, np.float64))))
    np.testing.assert_allclose(log_f[0, 0], want, rtol=1e-6, atol=1e-12)
    assert np.all(np.asarray(log_f) <= 0.0)
    # changing the gate input at token 2 changes D_ij only for j < 2 <= i
    _, _, _, x, w, b = _inputs(2, 6)
    d0 = forgetting.forgetting_bias(*_fox(x, w, b))
    d1 = forgetting.forgetting_bias(*_fox(x.at[:, 2].add(3.0), w, b))
    changed = np.abs(np.asarray(d1 - d0)).max(axis=(0, 1)) > 1e-6
    i, j = np.arange(6)[:, None], np.arange(6)[None, :]
    np.testing.assert_array_equal(changed & (j <= i), (j < 2) & (i >= 2))


@pytest.mark.parametrize(
    "window,sinks,padding,length",
    [(None, False, False, 37), (None, True, True, 37), (9, False, False, 45)],
)
def test_chunked_matches_plain_with_gate_gradients(window, sinks, padding, length):
    """Forward and gradients of q, k, v and the gate parameters w, b (through the prefix
    sums, which the chunked custom VJP differentiates per block)."""
    q, k, v, x, w, b = _inputs(length, length)
    s = jnp.asarray(np.random.default_rng(3).normal(0.0, 2.0, H), jnp.float32) if sinks else None
    pos = jnp.arange(length)
    mask = None
    if padding:
        valid = np.ones((B, length), bool)
        valid[0, :4] = False
        mask = jnp.asarray(valid)[:, None, None, :]

    def run(implementation):
        def fn(q, k, v, w, b):
            out = attention.attend(
                q,
                k,
                v,
                q_positions=pos,
                k_positions=pos,
                mask=mask,
                causal=True,
                window=window,
                sinks=s,
                forget_prefix=_fox(x, w, b),
                implementation=implementation,
            )
            return jnp.sum(jnp.sin(3.0 * out))

        return jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2, 3, 4)))(q, k, v, w, b)

    (lp, gp), (lc, gc) = run("xla"), run("chunked")
    assert float(lc) == pytest.approx(float(lp), rel=1e-5, abs=1e-4)
    for name, a, ref in zip(("q", "k", "v", "w", "b"), gc, gp, strict=True):
        assert np.abs(ref).max() > 1e-2, name
        np.testing.assert_allclose(a, ref, rtol=1e-4, atol=5e-5, err_msg=f"d loss / d {name}")


def test_chunked_with_a_shared_prefix_and_different_query_and_key_sums():
    """c_q and c_k of batch size 1 broadcast over the batch; gradients flow to both."""
    lq, lk = 12, 30
    rng = np.random.default_rng(4)
    q = jnp.asarray(rng.standard_normal((B, lq, H, D)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((B, lk, H, D)), jnp.float32) for _ in range(2))
    c_k = jnp.cumsum(-jnp.abs(jnp.asarray(rng.standard_normal((1, lk, H)), jnp.float32)), axis=1)
    c_q = c_k[:, lk - lq :] + 0.25
    qp, kp = jnp.arange(lk - lq, lk), jnp.arange(lk)
    mask = (kp[None, :] <= qp[:, None])[None, None]

    def loss(impl, c_q, c_k):
        fn = chunked_attention if impl == "chunked" else attention.attend
        extra = BLOCKS if impl == "chunked" else {}
        out = fn(
            q, k, v, q_positions=qp, k_positions=kp, mask=mask, forget_prefix=(c_q, c_k), **extra
        )
        return jnp.sum(jnp.sin(3.0 * out))

    g_plain = jax.jit(jax.grad(functools.partial(loss, "xla"), argnums=(0, 1)))(c_q, c_k)
    g_chunk = jax.jit(jax.grad(functools.partial(loss, "chunked"), argnums=(0, 1)))(c_q, c_k)
    for a, ref in zip(g_chunk, g_plain, strict=True):
        assert a.shape == ref.shape == (1, *a.shape[1:])
        np.testing.assert_allclose(a, ref, rtol=1e-4, atol=3e-5)
    # the row sums of dS vanish (softmax is shift invariant) when no sink is present
    np.testing.assert_allclose(g_plain[0], 0.0, atol=1e-5)


def test_chunked_fox_has_no_length_squared_intermediate():
    length = 1024
    spec = jax.ShapeDtypeStruct((1, length, 2, 8), jnp.float32)
    c_spec = jax.ShapeDtypeStruct((1, length, 2), jnp.float32)
    pos = jnp.arange(length)

    def loss(q, k, v, c):
        out = chunked_attention(
            q,
            k,
            v,
            q_positions=pos,
            k_positions=pos,
            causal=True,
            forget_prefix=(c, c),
            block_q=128,
            block_k=128,
        )
        return jnp.sum(out)

    jaxpr = jax.make_jaxpr(jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))))(spec, spec, spec, c_spec)
    big = []

    def visit(jx):
        for eqn in jx.eqns:
            for var in eqn.outvars:
                if sum(n >= length for n in getattr(var.aval, "shape", ())) >= 2:
                    big.append(var.aval.shape)
            for param in eqn.params.values():
                for p in param if isinstance(param, tuple | list) else (param,):
                    if isinstance(p, jax.extend.core.ClosedJaxpr):
                        visit(p.jaxpr)
                    elif isinstance(p, jax.extend.core.Jaxpr):
                        visit(p)

    visit(jaxpr.jaxpr)
    assert big == []


@pytest.mark.parametrize("sinks", [False, True])
def test_cached_decoding_equals_the_full_pass(sinks):
    """Prefill 6 tokens, decode the rest one at a time: the cache continues the prefix sums
    from its last slot (`continue_prefix`), and every output equals the full pass's."""
    length, prompt = 15, 6
    q, k, v, x, w, b = _inputs(5, length)
    s = jnp.asarray(np.random.default_rng(6).normal(0.0, 2.0, H), jnp.float32) if sinks else None
    pos = jnp.arange(length)
    full = attention.attend(
        q, k, v, q_positions=pos, k_positions=pos, causal=True, sinks=s, forget_prefix=_fox(x, w, b)
    )

    @jax.jit
    def step(cache, q, k, v, x, step_pos):
        c_new = kv_cache.continue_prefix(cache, forgetting.log_forget_gates(x, w, b))
        cache = kv_cache.write(cache, k, v, step_pos, forget_prefix=c_new)
        out = attention.attend(
            q,
            cache.key,
            cache.value,
            q_positions=step_pos,
            k_positions=cache.positions,
            mask=kv_cache.self_attention_mask(step_pos, cache),
            sinks=s,
            forget_prefix=(c_new, cache.forget_prefix),
        )
        return cache, out

    cache = kv_cache.init_kv_cache(B, length, H, D, forget_heads=H)
    outs = []
    for lo, hi in [(0, prompt)] + [(t, t + 1) for t in range(prompt, length)]:
        step_pos = jnp.broadcast_to(pos[lo:hi], (B, hi - lo))
        sl = slice(lo, hi)
        cache, out = step(cache, q[:, sl], k[:, sl], v[:, sl], x[:, sl], step_pos)
        outs.append(out)
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cache.forget_prefix, _fox(x, w, b)[0], rtol=1e-5, atol=1e-5)


class ForgettingJitTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_fox_attention_matches_numpy(self):
        q, k, v, x, w, b = _inputs(8, 10)
        _, ref = np_fox_attention(q, k, v, x, w, b)
        pos = jnp.arange(10)

        def fox_attention(q, k, v, x, w, b, implementation):
            return attention.attend(
                q,
                k,
                v,
                q_positions=pos,
                k_positions=pos,
                causal=True,
                forget_prefix=_fox(x, w, b),
                implementation=implementation,
            )

        for implementation in ("xla", "chunked"):
            fn = self.variant(functools.partial(fox_attention, implementation=implementation))
            chex.assert_trees_all_close(
                fn(q, k, v, x, w, b), ref.astype(np.float32), rtol=1e-5, atol=1e-5
            )


def test_forgetting_argument_errors():
    q, k, v, x, w, b = _inputs(9, 5)
    pos = jnp.arange(5)
    c = jnp.zeros((B, 5, H))
    with pytest.raises(
        ValueError, match=r"need x \[batch, length, d_model\], w \[d_model, heads\]"
    ):
        forgetting.log_forget_gates(x, w[:3], b)
    with pytest.raises(ValueError, match="log_forget must be"):
        forgetting.forget_prefix(jnp.zeros((5, H)))
    with pytest.raises(ValueError, match="with the same heads"):
        forgetting.forgetting_bias(c, c[..., :2])
    with pytest.raises(ValueError, match="must be a pair"):
        attention.attend(q, k, v, q_positions=pos, k_positions=pos, forget_prefix=c)
    with pytest.raises(ValueError, match=r"forget_prefix c_k=float32\[2, 5, 3\]"):
        chunked_attention(q, k, v, q_positions=pos, k_positions=pos, forget_prefix=(c, c[..., :3]))
    with pytest.raises(ValueError, match=r"forget_prefix c_q=int32\[2, 5, 4\]"):
        attention.attend(
            q, k, v, q_positions=pos, k_positions=pos, forget_prefix=(c.astype(jnp.int32), c)
        )
    cache = kv_cache.init_kv_cache(B, 5, H, D)
    with pytest.raises(ValueError, match="keeps no FoX prefix sums"):
        kv_cache.continue_prefix(cache, c[:, :1])
    with pytest.raises(ValueError, match="exactly when the cache keeps them"):
        kv_cache.write(
            cache, k[:, :1], v[:, :1], pos[None, :1].repeat(B, 0), forget_prefix=c[:, :1]
        )
    fox_cache = kv_cache.init_kv_cache(B, 5, H, D, forget_heads=H)
    with pytest.raises(ValueError, match="exactly when the cache keeps them"):
        kv_cache.write(fox_cache, k[:, :1], v[:, :1], pos[None, :1].repeat(B, 0))
    with pytest.raises(ValueError, match=r"log_forget shape \(2, 1, 3\) must be"):
        kv_cache.continue_prefix(fox_cache, c[:, :1, :3])
