"""Relative positional formulas: a **bias** added to the attention logits (DESIGN.md §3).

ALiBi (Press et al. 2022; the official slopes and MPT's rule), T5 relative-position buckets
(Raffel et al. 2020), KERPLE (Chi et al. 2022) and FIRE's normalised distance (Li et al.
2024), all from explicit positions. Biases
are float32 ``[batch, heads, q_len, kv_len]``; learned parameters (T5's table, KERPLE's and
FIRE's coefficients) live in `flaxformer_lite.nn.encodings.attention_bias`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from flaxformer_lite.base.checks import check_positive_int, check_positive_number
from flaxformer_lite.core.positions import as_batched_positions, relative_positions

Array = jax.Array


ALIBI_SLOPES = ("official", "mpt")


def alibi_slopes(num_heads: int, *, max_bias: float = 8.0) -> Array:
    """Per-head ALiBi slopes ``m_h``, float32 ``[num_heads]`` (Press et al. 2022, §3).

    For ``n`` a power of two the slopes are geometric with first term and ratio
    ``2^(-max_bias/n)`` (the paper: ``max_bias = 8``). Otherwise, as in the official
    ``get_slopes`` (and BLOOM's ``build_alibi_tensor``): the slopes for the nearest lower
    power of two ``p``, followed by every other slope of ``2p`` heads (indices 0, 2, 4, ...)
    until there are ``n``. E.g. -log2 of the 12-head slopes is
    ``[1, 2, ..., 8, 0.5, 1.5, 2.5, 3.5]``.
    """
    check_positive_int("num_heads", num_heads)
    check_positive_number("max_bias", max_bias)
    return jnp.asarray(_alibi_slopes_list(num_heads, float(max_bias)), dtype=jnp.float32)


def _alibi_slopes_list(n: int, max_bias: float = 8.0) -> list[float]:
    def geometric(p: int) -> list[float]:
        start = 2.0 ** (-max_bias / p)
        return [start ** (i + 1) for i in range(p)]

    p = 2 ** math.floor(math.log2(n))
    if p == n:
        return geometric(n)
    return geometric(p) + geometric(2 * p)[0::2][: n - p]


def mpt_alibi_slopes(num_heads: int, *, max_bias: float = 8.0) -> Array:
    """ALiBi slopes as MPT builds them (HF transformers ``modeling_mpt.build_mpt_alibi_tensor``,
    ``alibi_bias_max = max_bias``), float32 ``[num_heads]``.

    With ``n2 = 2^ceil(log2 n)``: ``m_i = 2^(-i * max_bias / n2)`` for ``i = 1..n2``; when
    ``n2 != n``, the odd-indexed ``m_2, m_4, ...`` followed by ``m_1, m_3, ...``, cut to ``n``.
    These are `alibi_slopes`' values for every ``n`` (the even ``m`` are the ``n2 / 2``-head
    geometric series, the odd ones every other slope of ``n2`` heads), computed the way MPT
    does; a separate rule so that a checkpoint names the one it was trained with.
    """
    check_positive_int("num_heads", num_heads)
    check_positive_number("max_bias", max_bias)
    n2 = 2 ** math.ceil(math.log2(num_heads))
    m = np.arange(1, n2 + 1, dtype=np.float64) * (float(max_bias) / n2)
    slopes = 1.0 / 2.0**m
    if n2 != num_heads:
        slopes = np.concatenate([slopes[1::2], slopes[::2]])[:num_heads]
    return jnp.asarray(slopes, dtype=jnp.float32)


def alibi_bias(
    q_positions: Array, k_positions: Array, slopes: Array, *, causal: bool = True
) -> Array:
    """ALiBi logit bias (Press et al. 2022, "Train Short, Test Long", arXiv 2108.12409).

    Causal: ``-m_h * (i - j)`` (entries with key j after query i are positive but are
    removed by the causal mask). Bidirectional (``causal=False``): ``-m_h * |i - j|``.
    Computed from the true positions, so it is valid with padding and cached decoding
    (the official code's keys-only form relies on softmax shift-invariance instead).

    Args:
      q_positions: int ``[batch, q_len]`` (or ``[q_len]``).
      k_positions: int ``[batch, kv_len]`` (or ``[kv_len]``).
      slopes: float ``[heads]``, e.g. `alibi_slopes`.
      causal: choose the causal or the symmetric form.

    Returns:
      float32 ``[batch, heads, q_len, kv_len]``.
    """
    rel_BTS = relative_positions(q_positions, k_positions).astype(jnp.float32)
    if not causal:
        rel_BTS = jnp.abs(rel_BTS)
    slopes_N = jnp.asarray(slopes, dtype=jnp.float32)
    if slopes_N.ndim != 1:
        raise ValueError(f"slopes must be [heads]; got shape {slopes_N.shape}")
    return -slopes_N[None, :, None, None] * rel_BTS[:, None, :, :]


def alibi_interpolated_slopes(slopes: Array, *, train_length: int, eval_length: int) -> Array:
    """ALiBi slopes under position interpolation, float32 ``[heads]``: ``m_h * L / L'``.

    Al-Khateeb et al. 2023, "Position Interpolation Improves ALiBi Extrapolation" (arXiv
    2310.13017): evaluating at ``L' > L`` tokens, scale every slope by ``L / L'`` so that the
    largest penalty, ``m_h (L' - 1) * L / L'``, stays that of the training length (PI for
    ALiBi: positions times ``L / L'``). ``L' <= L`` keeps the slopes. No training needed.
    """
    train_length = check_positive_int("train_length", train_length)
    eval_length = check_positive_int("eval_length", eval_length)
    slopes_N = jnp.asarray(slopes, dtype=jnp.float32)
    if slopes_N.ndim != 1:
        raise ValueError(f"slopes must be [heads]; got shape {slopes_N.shape}")
    return slopes_N * jnp.float32(min(1.0, train_length / eval_length))


# --------------------------------------------------------------- T5 relative-position buckets


def t5_relative_position_bucket(
    relative_position: Array,
    *,
    bidirectional: bool,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Array:
    """T5 relative-position buckets (Raffel et al. 2020, §2.1; flaxformer
    ``RelativePositionBiases._relative_position_bucket``).

    **Sign convention**: ``relative_position = q_pos - k_pos``, as returned by
    `relative_positions` (positive: the key is in the past). T5's code takes
    ``memory_position - query_position``, the negative of ours, and negates it first.

    With ``B`` buckets per side (``num_buckets // 2`` if bidirectional, else ``num_buckets``)
    and ``max_exact = B // 2``, a distance ``n >= 0`` goes to

    * bucket ``n`` if ``n < max_exact`` (one bucket per distance), else
    * ``max_exact + floor(log(n / max_exact) / log(max_distance / max_exact) * (B - max_exact))``
      capped at ``B - 1`` (log-spaced up to ``max_distance``; every ``n >= max_distance``
      shares the last bucket).

    Bidirectional: keys in the past or at the query (``q - k >= 0``) use buckets ``[0, B)``
    with ``n = q - k``; keys in the future use ``[B, 2B)`` with ``n = k - q``.
    Causal (``bidirectional=False``): ``n = max(q - k, 0)``, all ``num_buckets`` describe the
    past and future keys share bucket 0 (the causal mask removes them anyway).

    The log-spaced boundaries are integer thresholds computed on the host in float64, so a
    distance whose formula value is a whole number (e.g. ``n = 16``, ``B = 16``:
    ``max_exact + 2``) lands in the right bucket on every backend; flaxformer adds float32
    ``eps`` inside the log for the same purpose.

    Args:
      relative_position: int array of any shape, ``q_pos - k_pos``.
      bidirectional: bidirectional (encoder) or causal (decoder) bucketing.
      num_buckets: total buckets (T5: 32).
      max_distance: distances from here on share the last bucket of their side (T5: 128).

    Returns:
      int32 buckets in ``[0, num_buckets)``, same shape as ``relative_position``.
    """
    relative_position = jnp.asarray(relative_position)
    if not jnp.issubdtype(relative_position.dtype, jnp.integer):
        raise ValueError(f"relative_position must be integers; got dtype {relative_position.dtype}")
    check_positive_int("num_buckets", num_buckets)
    check_positive_int("max_distance", max_distance)
    side = num_buckets // 2 if bidirectional else num_buckets
    if side < 2:
        raise ValueError(
            f"num_buckets={num_buckets} is too small: need >= {4 if bidirectional else 2} "
            f"(bidirectional={bidirectional})"
        )
    max_exact = side // 2
    if max_distance <= max_exact:
        raise ValueError(
            f"max_distance={max_distance} must exceed the exact range max_exact={max_exact} "
            f"(num_buckets={num_buckets}, bidirectional={bidirectional})"
        )
    rel = relative_position.astype(jnp.int32)
    if bidirectional:
        offset = jnp.where(rel < 0, jnp.int32(side), jnp.int32(0))
        n = jnp.abs(rel)
    else:
        offset = jnp.zeros_like(rel)
        n = jnp.maximum(rel, 0)
    thresholds = _t5_log_thresholds(max_exact, side, max_distance)
    if thresholds.size:
        th = jnp.asarray(thresholds, jnp.int32).reshape((1,) * n.ndim + thresholds.shape)
        passed = (n[..., None] >= th).astype(jnp.int32).sum(axis=-1)
    else:
        passed = jnp.zeros_like(n)
    bucket = jnp.where(n < max_exact, n, max_exact + passed)
    return (offset + bucket).astype(jnp.int32)


def _t5_log_thresholds(max_exact: int, side: int, max_distance: int) -> np.ndarray:
    """Smallest distance reaching log bucket ``max_exact + k``, for k = 1..side-max_exact-1.

    ``floor(log(n/e) / log(D/e) * (side - e)) >= k  <=>  n >= e * (D/e)^(k / (side - e))``.
    """
    k = np.arange(1, side - max_exact, dtype=np.float64)
    t = max_exact * (max_distance / max_exact) ** (k / (side - max_exact))
    nearest = np.round(t)
    t = np.where(np.abs(t - nearest) <= 1e-9 * t, nearest, np.ceil(t))
    return t.astype(np.int64)


# ---------------------------------------------------------------------------------- KERPLE


def kerple_log_bias(q_positions: Array, k_positions: Array, r1: Array, r2: Array) -> Array:
    """KERPLE logarithmic kernel bias ``-r1_h * log(1 + r2_h * |i - j|)``.

    Chi et al. 2022, "KERPLE" (arXiv 2205.09921), Eq. for the log variant; reference
    chijames/KERPLE ``ParallelKerpleLog``. ``r1, r2``: float ``[heads]``, positive (the
    module clamps them). Returns float32 ``[batch, heads, q_len, kv_len]``.
    """
    dist_B1TS, r1_1N11, r2_1N11 = _abs_distance_and_heads(q_positions, k_positions, r1, r2)
    return -r1_1N11 * jnp.log1p(r2_1N11 * dist_B1TS)


def kerple_power_bias(q_positions: Array, k_positions: Array, r1: Array, r2: Array) -> Array:
    """KERPLE power kernel bias ``-r1_h * |i - j|^r2_h`` (``r1 > 0``, ``0 < r2 <= 2``).

    Chi et al. 2022 (arXiv 2205.09921); reference ``ParallelKerplePower``. The value (and the
    gradient with respect to ``r2``) is 0 at distance 0. Returns float32
    ``[batch, heads, q_len, kv_len]``.
    """
    dist_B1TS, r1_1N11, r2_1N11 = _abs_distance_and_heads(q_positions, k_positions, r1, r2)
    positive_B1TS = dist_B1TS > 0
    # avoids 0^r2's log(0) in the gradient
    safe_B1TS = jnp.where(positive_B1TS, dist_B1TS, jnp.float32(1.0))
    return -r1_1N11 * jnp.where(positive_B1TS, safe_B1TS**r2_1N11, jnp.float32(0.0))


def _abs_distance_and_heads(
    q_positions: Array, k_positions: Array, r1: Array, r2: Array
) -> tuple[Array, Array, Array]:
    """``|i - j|`` as float32 ``[b, 1, q, k]`` and per-head params as ``[1, heads, 1, 1]``."""
    dist_B1TS = jnp.abs(relative_positions(q_positions, k_positions)).astype(jnp.float32)[:, None]
    out = []
    for name, r in (("r1", r1), ("r2", r2)):
        r_N = jnp.asarray(r, jnp.float32)
        if r_N.ndim != 1:
            raise ValueError(f"{name} must be [heads]; got shape {r_N.shape}")
        out.append(r_N[None, :, None, None])
    return dist_B1TS, out[0], out[1]


# ------------------------------------------------------------------------------------ FIRE


def fire_normalized_distance(
    q_positions: Array,
    k_positions: Array,
    *,
    c: Array | float,
    threshold: Array | float,
    eps: float = 1e-6,
) -> Array:
    """FIRE's progressively normalised distance ``psi(|i - j|) / (psi(max(L, i)) + eps)``.

    Li et al. 2024, "Functional Interpolation for Relative Positions Improves Long Context
    Transformers" (arXiv 2310.04418), Eq. 3-4, with ``psi(x) = log(c x + 1)``, ``i`` the
    query position, ``j`` the key position and ``L = threshold``. The paper states it for
    causal attention (``i >= j``); the absolute value makes it defined for bidirectional
    attention too, symmetric in past and future (as in the public implementations, which
    take ``|c (i - j)|``). ``eps`` as in those implementations (keeps ``i = 0`` finite).

    Args:
      q_positions, k_positions: int ``[batch, len]`` (or ``[len]``).
      c: positive scalar (learned; init 0.1). threshold: positive scalar L (learned; init 512).

    Returns:
      float32 ``[batch, q_len, kv_len]``, in ``[0, 1)`` for ``0 <= j <= i``.
    """
    rel_BTS = jnp.abs(relative_positions(q_positions, k_positions)).astype(jnp.float32)
    c = jnp.asarray(c, jnp.float32)
    threshold = jnp.asarray(threshold, jnp.float32)
    i_BT1 = as_batched_positions(q_positions).astype(jnp.float32)[:, :, None]
    numerator_BTS = jnp.log1p(c * rel_BTS)
    denominator_BT1 = jnp.log1p(c * jnp.maximum(threshold, i_BT1)) + jnp.float32(eps)
    return numerator_BTS / denominator_BT1
