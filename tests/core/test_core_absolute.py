"""The sinusoidal encoding (`core.absolute`) against its closed form: the formula of Vaswani et
al. 2017 §3.5 (sin on even dims, cos on odd dims, float64 numpy written here) and the shift by
k positions as one fixed linear map."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_lite.core import absolute

# ----------------------------------------------------------------------------- sinusoidal


def np_sinusoidal(positions, dim, base=10000.0):
    """PE[p, 2i] = sin(p / base^(2i/dim)), PE[p, 2i+1] = cos(p / base^(2i/dim))."""
    positions = np.asarray(positions, np.float64)
    pe = np.zeros((*positions.shape, dim))
    for j in range(dim):
        angle = positions / base ** (2 * (j // 2) / dim)
        pe[..., j] = np.sin(angle) if j % 2 == 0 else np.cos(angle)
    return pe


@pytest.mark.parametrize("dim", [16, 7, 1])
@pytest.mark.parametrize("base", [10000.0, 100.0])
def test_sinusoidal_matches_formula(dim, base):
    positions = np.array([[0, 1, 5, 37, 100], [256, 257, 511, 999, 1000]], np.int32)
    pe = absolute.sinusoidal(positions, dim, base=base)
    assert pe.shape == (2, 5, dim) and pe.dtype == jnp.float32
    np.testing.assert_allclose(pe, np_sinusoidal(positions, dim, base), atol=3e-4)
    # Pin the layout explicitly: sine on even dims, cosine on odd dims.
    np.testing.assert_allclose(pe[0, 2, 0], np.sin(5.0), atol=1e-6)
    if dim > 1:
        np.testing.assert_allclose(pe[0, 2, 1], np.cos(5.0), atol=1e-6)
    # Unbatched positions are accepted; 256 and 257 are told apart (float32 angles).
    flat = absolute.sinusoidal(positions[1], dim, base=base)
    assert flat.shape == (5, dim)
    np.testing.assert_array_equal(flat, pe[1])
    assert np.abs(flat[0] - flat[1]).max() > 0.1


def _shift_map(k, dim, base=10000.0):
    """The fixed linear map M_k with PE(p + k) = M_k PE(p): 2x2 blocks on (sin, cos) pairs.

    sin(a + b) = sin a cos b + cos a sin b;  cos(a + b) = cos a cos b - sin a sin b.
    """
    m = np.zeros((dim, dim))
    for i in range(dim // 2):
        b = k / base ** (2 * i / dim)
        m[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = [[np.cos(b), np.sin(b)], [-np.sin(b), np.cos(b)]]
    return m


@pytest.mark.parametrize("dim", [16, 6])
def test_sinusoidal_shift_is_a_fixed_linear_map(dim):
    pos = np.array([0, 3, 17, 100, 511], np.int32)
    pe = np.asarray(absolute.sinusoidal(pos, dim), np.float64)
    for k in (1, 5, 50):
        m_k = _shift_map(k, dim)  # depends on k only, not on pos
        shifted = np.asarray(absolute.sinusoidal(pos + k, dim), np.float64)
        np.testing.assert_allclose(pe @ m_k.T, shifted, atol=2e-4)
        # M_k is a rotation (orthogonal), and a different k gives a different map.
        np.testing.assert_allclose(m_k @ m_k.T, np.eye(dim), atol=1e-12)
        assert np.abs(pe @ _shift_map(k + 1, dim).T - shifted).max() > 1e-2
