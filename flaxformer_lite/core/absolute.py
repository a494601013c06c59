"""Absolute positional formulas: encodings **added** to the token embeddings (DESIGN.md §3).

The sinusoidal encoding of Vaswani et al. 2017 (and fairseq's concatenated variant, which
XGLM uses) is computed from explicit positions, never sliced from a table, so any length
works. The learned table has parameters and lives in
`flaxformer_lite.nn.encodings.absolute`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from flaxformer_lite.base.checks import check_positive_int, check_positive_number
from flaxformer_lite.core.positions import scaled_positions

Array = jax.Array


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
    check_positive_int("dim", dim)
    check_positive_number("base", base)
    positions = jnp.asarray(positions)
    if not jnp.issubdtype(positions.dtype, jnp.integer):
        raise ValueError(
            f"positions={positions.dtype}{list(positions.shape)}: must be integers of shape "
            "[length] or [batch, length]"
        )
    half = (dim + 1) // 2
    # 1 / base^(2i/dim) for i = 0..half-1, in float64 on the host, then float32.
    inv_freq = jnp.asarray(base ** (-2.0 * np.arange(half) / dim), dtype=jnp.float32)
    angles = scaled_positions(positions, inv_freq)  # [..., half]
    pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [..., half, 2]
    return pe.reshape((*positions.shape, 2 * half))[..., :dim]


def sinusoidal_fairseq(positions: Array, dim: int, *, base: float = 10000.0) -> Array:
    """fairseq's sinusoidal encoding (``SinusoidalPositionalEmbedding.get_embedding``; XGLM).

    With ``half = dim // 2`` and ``f_i = base^(-i / (half - 1))`` for ``i = 0..half-1``:
    ``PE[p] = [sin(p f_0), ..., sin(p f_{half-1}), cos(p f_0), ..., cos(p f_{half-1})]``,
    sines then cosines concatenated (not interleaved, and the exponent's denominator is
    ``half - 1``, not ``dim``), with a zero column appended for an odd ``dim``. fairseq's
    table zeroes its padding row; callers add their offset to ``positions`` instead
    (XGLM's positions start at 2).

    Args:
      positions: int ``[batch, length]`` or ``[length]``.
      dim: encoding width (the model's ``d_model``), >= 4.
      base: wavelength base, 10000 in fairseq.

    Returns:
      float32 ``positions.shape + (dim,)``.
    """
    check_positive_int("dim", dim)
    check_positive_number("base", base)
    if dim < 4:
        raise ValueError(f"dim={dim}: the fairseq sinusoid needs dim >= 4 (half - 1 > 0)")
    positions = jnp.asarray(positions)
    if not jnp.issubdtype(positions.dtype, jnp.integer):
        raise ValueError(
            f"positions={positions.dtype}{list(positions.shape)}: must be integers of shape "
            "[length] or [batch, length]"
        )
    half = dim // 2
    freqs = jnp.asarray(np.exp(-np.log(base) * np.arange(half) / (half - 1)), dtype=jnp.float32)
    angles = scaled_positions(positions, freqs)  # [..., half]
    pe = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
    if dim % 2:
        pe = jnp.concatenate([pe, jnp.zeros((*pe.shape[:-1], 1), pe.dtype)], axis=-1)
    return pe
