"""Length-dependent attention temperature: a per-query factor ``tau`` on the logits.

Softmax attention over ``n`` keys flattens as ``n`` grows (the largest weight goes to 0 like
``1/n`` for logits of bounded size); multiplying the logits of a query that sees more keys by
a larger ``tau`` keeps its attention as sharp as during training. Three published rules:

* ``logn`` -- Qwen (``use_logn_attn``, Qwen-7B ``modeling_qwen.py``; Su 2021, "Entropy
  invariance of the scaled dot-product attention"): ``tau = max(1, log(p + 1) / log(L))`` for
  the query at 0-based position ``p`` (Qwen indexes its ``logn_list`` by the 1-based position
  ``p + 1``), ``L`` the training length. 1 within the training length.
* ``ssmax`` -- Scalable-Softmax (Nakanishi 2025, arXiv 2501.19399): ``tau = s_h * log(n)``,
  ``n`` the number of keys the query sees, ``s_h`` learned per head. `visible_keys` gives
  ``n`` for causal attention (with a window: at most W; with StreamingLLM's first keys, W +
  those). With ``s_h = 1 / log(L)`` (no training) it is ``log(n) / log(L)``, the unclamped
  ``logn`` rule.
* ``llama4`` -- Llama 4's ``attn_temperature_tuning`` on its NoPE layers (Hugging Face
  ``modeling_llama4.Llama4TextAttention``): ``tau = log(floor((p + 1) / floor_scale) + 1) *
  attn_scale + 1`` with 0-based ``p``, ``floor_scale`` 8192, ``attn_scale`` 0.1. 1 below
  ``floor_scale - 1``.

All three scale the **queries** (as Qwen and Llama 4 do: ``q * tau``), so the factor
multiplies the ``q . k`` term of the logits and not an additive positional bias; with no bias
that is the whole logit, SSMax's definition. A query factor passes through every attention
implementation and a KV cache unchanged (the keys are not touched). Factors are float32.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from flaxformer_lite.base.checks import check_positive_int, check_positive_number
from flaxformer_lite.core.chunked_attention import check_keep_first
from flaxformer_lite.core.positions import as_batched_positions

Array = jax.Array

TEMPERATURES = ("logn", "ssmax", "llama4")
LLAMA4_FLOOR_SCALE = 8192  # HF Llama4TextConfig.floor_scale
LLAMA4_ATTN_SCALE = 0.1  # HF Llama4TextConfig.attn_scale


def logn_scale(positions: Array, *, train_length: int) -> Array:
    """Qwen's log-n query factor, float32 ``[batch or 1, length]``.

    ``tau(p) = max(1, log(p + 1) / log(L))`` for 0-based positions ``p`` and training length
    ``L >= 2`` (Qwen-7B ``modeling_qwen.py``: ``logn_list[i - 1] = log_L(i) if i > L else 1``
    for 1-based ``i``, applied to ``query``; Qwen applies it only in evaluation, ``not
    self.training``).
    """
    positions = as_batched_positions(positions)
    train_length = check_positive_int("train_length", train_length)
    if train_length < 2:
        raise ValueError(f"train_length={train_length}: must be >= 2 (log(L) divides)")
    ratio = jnp.log(positions.astype(jnp.float32) + 1.0) / jnp.float32(math.log(train_length))
    return jnp.maximum(ratio, jnp.float32(1.0))


def llama4_scale(
    positions: Array,
    *,
    floor_scale: float = LLAMA4_FLOOR_SCALE,
    attn_scale: float = LLAMA4_ATTN_SCALE,
) -> Array:
    """Llama 4's query factor on its NoPE layers, float32 ``[batch or 1, length]``.

    ``tau(p) = log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1`` for 0-based ``p``
    (Hugging Face ``Llama4TextAttention.forward``, ``attn_temperature_tuning``; after SSMax,
    arXiv 2501.19399): a step function of the position, 1 for ``p + 1 < floor_scale``.
    """
    positions = as_batched_positions(positions)
    floor_scale = check_positive_number("floor_scale", floor_scale)
    if isinstance(attn_scale, bool) or not isinstance(attn_scale, int | float):
        raise ValueError(f"attn_scale={attn_scale!r}: must be a number")
    steps = jnp.floor((positions.astype(jnp.float32) + 1.0) / jnp.float32(floor_scale))
    return jnp.log1p(steps) * jnp.float32(attn_scale) + jnp.float32(1.0)


def visible_keys(
    positions: Array, *, window: int | None = None, keep_first: int | None = None
) -> Array:
    """How many keys causal attention over positions ``0..p`` shows the query at ``p``:
    int32 ``[batch or 1, length]``.

    ``p + 1``; with a window W ``min(p + 1, W)``; with StreamingLLM's ``keep_first`` k also
    the first keys before the window, ``min(p + 1, W) + clip(p + 1 - W, 0, k)``
    (`attention.streaming_mask`). The ``n`` of SSMax's ``s log n``.
    """
    positions = as_batched_positions(positions)
    keep_first = check_keep_first(keep_first, window)
    n = positions + 1
    if window is None:
        return n
    window = check_positive_int("window", window)
    seen = jnp.minimum(n, window)
    if keep_first is not None:
        seen = seen + jnp.clip(n - window, 0, keep_first)
    return seen


def ssmax_scale(
    positions: Array,
    s: Array,
    *,
    window: int | None = None,
    keep_first: int | None = None,
) -> Array:
    """Scalable-Softmax's query factor, float32 ``[batch or 1, length, heads]``.

    ``tau = s_h * log(n)`` with ``n`` = `visible_keys` (Nakanishi 2025, "Scalable-Softmax Is
    Superior for Attention", arXiv 2501.19399, Eq. 3: ``SSMax(z) = softmax(s log(n) z)``).
    ``s``: float ``[heads]`` (learned per head; ``1 / log(L)`` gives ``log(n) / log(L)``).
    Differentiable in ``s``.
    """
    s = jnp.asarray(s)
    if s.ndim != 1 or not jnp.issubdtype(s.dtype, jnp.floating):
        raise ValueError(f"s={s.dtype}{list(s.shape)}: must be a float array [heads]")
    n_BT = visible_keys(positions, window=window, keep_first=keep_first)
    log_n_BT = jnp.log(n_BT.astype(jnp.float32))
    return log_n_BT[:, :, None] * s.astype(jnp.float32)[None, None, :]


def scale_queries(q: Array, tau: Array) -> Array:
    """``q * tau``: queries ``[batch, length, heads, head_dim]`` times a factor float
    ``[batch or 1, length]`` (one per query) or ``[batch or 1, length, heads]`` (per head).

    The product is taken in float32 and rounded to ``q.dtype`` once (as Llama 4 rounds
    ``query_states * attn_scales`` to the query dtype).
    """
    if q.ndim != 4:
        raise ValueError(f"q must be [batch, length, heads, head_dim]; got shape {q.shape}")
    tau = jnp.asarray(tau, jnp.float32)
    tau_BTN = tau[:, :, None] if tau.ndim == 2 else tau
    ok = (
        tau_BTN.ndim == 3
        and tau_BTN.shape[0] in (1, q.shape[0])
        and tau_BTN.shape[1] == q.shape[1]
        and tau_BTN.shape[2] in (1, q.shape[2])
    )
    if not ok:
        raise ValueError(
            f"tau shape {tuple(tau.shape)} must be [batch or 1, length={q.shape[1]}] or "
            f"[batch or 1, length, heads={q.shape[2]}]"
        )
    return (q.astype(jnp.float32) * tau_BTN[..., None]).astype(q.dtype)
