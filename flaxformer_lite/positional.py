"""Positional encodings as pure functions of explicit integer positions (no Flax, no state).

Positions are int arrays ``[batch, length]`` (``[length]`` is accepted and treated as one
row shared by the batch). Everything is computed from the positions, never sliced from a
fixed table, so any length works. Angles and biases are float32: bfloat16 has an 8-bit
mantissa and cannot tell position 256 from 257.

Three hook points (DESIGN.md §3): an encoding is **added** to token embeddings
(`sinusoidal`), **rotates** queries and keys (`apply_rope`), or **biases** attention logits
(`alibi_bias`). The learned table lives in `flaxformer_lite.encodings` because it has
parameters.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
ROPE_LAYOUTS = ("half", "interleaved")


def as_batched_positions(positions: Array) -> Array:
    """Positions as int32 ``[batch, length]``; a ``[length]`` array becomes ``[1, length]``."""
    positions = jnp.asarray(positions)
    if not jnp.issubdtype(positions.dtype, jnp.integer):
        raise ValueError(f"positions must be integers; got dtype {positions.dtype}")
    if positions.ndim == 1:
        positions = positions[None, :]
    if positions.ndim != 2:
        raise ValueError(f"positions must be [batch, length] or [length]; got {positions.shape}")
    return positions.astype(jnp.int32)


def sinusoidal(positions: Array, dim: int, *, base: float = 10000.0) -> Array:
    """Sinusoidal encoding of Vaswani et al. 2017, §3.5, in the original interleaved layout.

    ``PE[p, 2i] = sin(p / base^(2i/dim))`` and ``PE[p, 2i+1] = cos(p / base^(2i/dim))``:
    sine on even dimensions, cosine on odd ones. For an odd ``dim`` the last (cosine)
    column is dropped.

    Args:
      positions: int ``[batch, length]`` or ``[length]``.
      dim: encoding width (the model's ``d_model``).
      base: wavelength base, 10000 in the paper.

    Returns:
      float32 ``positions.shape + (dim,)``.
    """
    _check_positive_int("dim", dim)
    _check_positive_float("base", base)
    positions = jnp.asarray(positions)
    if not jnp.issubdtype(positions.dtype, jnp.integer):
        raise ValueError(f"positions must be integers; got dtype {positions.dtype}")
    half = (dim + 1) // 2
    # 1 / base^(2i/dim) for i = 0..half-1, in float64 on the host, then float32.
    inv_freq = jnp.asarray(base ** (-2.0 * np.arange(half) / dim), dtype=jnp.float32)
    angles = _outer(positions, inv_freq)  # [..., half]
    pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [..., half, 2]
    return pe.reshape((*positions.shape, 2 * half))[..., :dim]


def rope_inv_frequencies(rotary_dim: int, *, base: float = 10000.0) -> Array:
    """RoPE frequencies ``theta_i = base^(-2i/rotary_dim)``, float32 ``[rotary_dim // 2]``.

    Su et al. 2021, "RoFormer" (arXiv 2104.09864), Eq. 15.
    """
    _check_positive_int("rotary_dim", rotary_dim)
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even (dimensions rotate in pairs); got {rotary_dim}")
    _check_positive_float("base", base)
    return jnp.asarray(base ** (-2.0 * np.arange(rotary_dim // 2) / rotary_dim), jnp.float32)


def rope_angles(positions: Array, inv_freq: Array) -> Array:
    """Rotation angles ``p * theta_i`` in float32: ``[batch, length, len(inv_freq)]``."""
    positions = as_batched_positions(positions)
    return _outer(positions, jnp.asarray(inv_freq, jnp.float32))


def apply_rotary(x: Array, angles: Array, *, layout: str = "half") -> Array:
    """Rotate pairs of the last axis of ``x`` by ``angles``.

    Args:
      x: ``[batch, length, heads, head_dim]``; only the first ``2 * angles.shape[-1]``
        dimensions are rotated, the rest pass through (partial rotary).
      angles: float32 ``[batch or 1, length, rotary_dim // 2]``.
      layout: ``"half"`` pairs dimension i with i + rotary_dim/2 (GPT-NeoX, HF LLaMA);
        ``"interleaved"`` pairs 2i with 2i+1 (RoFormer Eq. 34, GPT-J, Meta LLaMA). The two are
        the same rotation up to a fixed permutation of the rotated dimensions.

    Returns:
      Same shape and dtype as ``x``; the rotation itself is computed in float32.
    """
    if layout not in ROPE_LAYOUTS:
        raise ValueError(f"layout={layout!r} is not known; allowed: {list(ROPE_LAYOUTS)}")
    if x.ndim != 4:
        raise ValueError(f"x must be [batch, length, heads, head_dim]; got shape {x.shape}")
    pairs = angles.shape[-1]
    rotary_dim = 2 * pairs
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"{pairs} rotation pairs do not fit head_dim={x.shape[-1]}")
    cos = jnp.cos(angles)[:, :, None, :]  # [b, l, 1, pairs]
    sin = jnp.sin(angles)[:, :, None, :]
    rot, rest = x[..., :rotary_dim].astype(jnp.float32), x[..., rotary_dim:]
    if layout == "half":
        x1, x2 = rot[..., :pairs], rot[..., pairs:]
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    if layout == "half":
        rotated = jnp.concatenate([y1, y2], axis=-1)
    else:
        rotated = jnp.stack([y1, y2], axis=-1).reshape(rot.shape)
    return jnp.concatenate([rotated.astype(x.dtype), rest], axis=-1)


def apply_rope(
    x: Array,
    positions: Array,
    *,
    base: float = 10000.0,
    layout: str = "half",
    rotary_dim: int | None = None,
) -> Array:
    """Rotary position embedding (Su et al. 2021, arXiv 2104.09864).

    Each pair of dimensions is rotated by angle ``p * theta_i`` with
    ``theta_i = base^(-2i/rotary_dim)``, so ``<rope(q, m), rope(k, n)>`` depends on the
    positions only through ``m - n``.

    Args:
      x: queries or keys ``[batch, length, heads, head_dim]``.
      positions: int ``[batch, length]`` or ``[length]``.
      base: frequency base (10000 in the paper).
      layout: ``"half"`` (default) or ``"interleaved"``; see `apply_rotary`.
      rotary_dim: rotate only the first ``rotary_dim`` dimensions (even); default all.

    Returns:
      ``x`` rotated, same shape and dtype.
    """
    rotary_dim = x.shape[-1] if rotary_dim is None else rotary_dim
    angles = rope_angles(positions, rope_inv_frequencies(rotary_dim, base=base))
    if angles.shape[1] != x.shape[1]:
        raise ValueError(f"positions length {angles.shape[1]} != x length {x.shape[1]}")
    return apply_rotary(x, angles, layout=layout)


def alibi_slopes(num_heads: int) -> Array:
    """Per-head ALiBi slopes ``m_h``, float32 ``[num_heads]`` (Press et al. 2022, §3).

    For ``n`` a power of two the slopes are geometric with first term and ratio
    ``2^(-8/n)``. Otherwise, as in the official ``get_slopes``: the slopes for the nearest
    lower power of two ``p``, followed by every other slope of ``2p`` heads (indices 0, 2,
    4, ...) until there are ``n``. E.g. -log2 of the 12-head slopes is
    ``[1, 2, ..., 8, 0.5, 1.5, 2.5, 3.5]``.
    """
    _check_positive_int("num_heads", num_heads)
    return jnp.asarray(_alibi_slopes_list(num_heads), dtype=jnp.float32)


def _alibi_slopes_list(n: int) -> list[float]:
    def geometric(p: int) -> list[float]:
        start = 2.0 ** (-8.0 / p)
        return [start ** (i + 1) for i in range(p)]

    p = 2 ** math.floor(math.log2(n))
    if p == n:
        return geometric(n)
    return geometric(p) + geometric(2 * p)[0::2][: n - p]


def relative_positions(q_positions: Array, k_positions: Array) -> Array:
    """``q_pos[i] - k_pos[j]`` as int32 ``[batch, q_len, kv_len]`` (positive: key in the past)."""
    q_positions = as_batched_positions(q_positions)
    k_positions = as_batched_positions(k_positions)
    return q_positions[:, :, None] - k_positions[:, None, :]


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
    rel = relative_positions(q_positions, k_positions).astype(jnp.float32)
    if not causal:
        rel = jnp.abs(rel)
    slopes = jnp.asarray(slopes, dtype=jnp.float32)
    if slopes.ndim != 1:
        raise ValueError(f"slopes must be [heads]; got shape {slopes.shape}")
    return -slopes[None, :, None, None] * rel[:, None, :, :]


def _outer(positions: Array, freqs: Array) -> Array:
    """``positions[..., None] * freqs`` in float32 with explicit ranks (no rank promotion)."""
    freqs = freqs.reshape((1,) * positions.ndim + freqs.shape)
    return positions.astype(jnp.float32)[..., None] * freqs


def _check_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ValueError(f"{name} must be a positive int; got {value!r}")


def _check_positive_float(name: str, value: float) -> None:
    if not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number; got {value!r}")
