"""Forgetting attention (FoX): a data-dependent decay of the logits from forget gates.

Lin et al. 2025, "Forgetting Transformer: Softmax Attention with a Forget Gate" (ICLR 2025,
arXiv 2503.02130), Eq. 4-6: each head has a scalar forget gate per token computed from the
layer's input, ``f_t = sigmoid(w_h . x_t + b_h)``, and the logit of query ``i`` for key
``j <= i`` gets

    D_ij = sum_{k = j+1 .. i} log f_k = c_i - c_j,     c_t = sum_{k <= t} log f_k,

so a key's weight decays with the gates passed since it, a learned, data-dependent ALiBi
(x-transformers ``DataDependentAlibi``; flash-linear-attention ``ops/forgetting_attn``). The
model uses no other positional information. Attention needs only the prefix sums ``c``: an
implementation that works block by block adds ``c_q[i] - c_k[j]`` per block
(`attention.attend`'s ``forget_prefix``), and a KV cache keeps ``c`` per key
(`kv_cache.continue_prefix`). All values float32 ``[batch, length, heads]``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def log_forget_gates(x: Array, w: Array, b: Array) -> Array:
    """``log f_t = log sigmoid(x_t . w_h + b_h)``: float32 ``[batch, length, heads]``.

    ``x`` ``[batch, length, d_model]`` (the attention layer's input, after its norm); ``w``
    ``[d_model, heads]``; ``b`` ``[heads]``. Computed in float32 with ``log_sigmoid`` (no
    ``log(0)`` for very negative pre-activations); always ``<= 0``.
    """
    if x.ndim != 3 or w.ndim != 2 or w.shape[0] != x.shape[-1] or b.shape != (w.shape[1],):
        raise ValueError(
            f"x {tuple(x.shape)}, w {tuple(w.shape)}, b {tuple(b.shape)}: need x [batch, "
            "length, d_model], w [d_model, heads], b [heads]"
        )
    logits_BTN = jnp.einsum(
        "btd,dn->btn", x.astype(jnp.float32), w.astype(jnp.float32), precision="highest"
    )
    return jax.nn.log_sigmoid(logits_BTN + b.astype(jnp.float32)[None, None, :])


def forget_prefix(log_forget: Array) -> Array:
    """Prefix sums ``c_t = sum_{k <= t} log f_k`` along the length, float32 ``[batch, length,
    heads]`` from ``log_forget`` ``[batch, length, heads]`` (`log_forget_gates`)."""
    if log_forget.ndim != 3:
        raise ValueError(
            f"log_forget must be [batch, length, heads]; got shape {tuple(log_forget.shape)}"
        )
    return jnp.cumsum(log_forget.astype(jnp.float32), axis=1)


def forgetting_bias(c_q: Array, c_k: Array) -> Array:
    """FoX's logit bias ``D_ij = c_q[i] - c_k[j]``, float32 ``[batch, heads, q_len, kv_len]``.

    ``c_q`` ``[batch or 1, q_len, heads]`` are the queries' prefix sums, ``c_k`` ``[batch or
    1, kv_len, heads]`` the keys' (the same array in self-attention without a cache). For
    ``j <= i`` it is ``sum_{k=j+1..i} log f_k <= 0``; entries with ``j > i`` are positive and
    must be removed by the causal mask (FoX is causal).
    """
    if c_q.ndim != 3 or c_k.ndim != 3 or c_q.shape[2] != c_k.shape[2]:
        raise ValueError(
            f"c_q {tuple(c_q.shape)} and c_k {tuple(c_k.shape)} must be [batch or 1, length, "
            "heads] with the same heads"
        )
    c_q_BNT = jnp.swapaxes(c_q.astype(jnp.float32), 1, 2)
    c_k_BNS = jnp.swapaxes(c_k.astype(jnp.float32), 1, 2)
    return c_q_BNT[..., :, None] - c_k_BNS[..., None, :]
