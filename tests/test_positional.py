"""Tests of the pure positional encodings against closed forms and the papers' claims.

References (float64 numpy, written here): the sinusoid formula of Vaswani et al. 2017 §3.5,
the RoPE rotation matrix of Su et al. 2021 (Eq. 15/34), and the official ALiBi
``get_slopes`` of ofirpress/attention_with_linear_biases.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_lite.core import absolute, attention, attention_bias, rotary
from flaxformer_lite.core.positions import as_batched_positions, relative_positions

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


# ----------------------------------------------------------------------------------- RoPE


def np_rope(x, positions, *, base=10000.0, layout="half", rotary_dim=None):
    """Rotate x [b, l, h, d] by explicit block rotation matrices built per position."""
    x = np.asarray(x, np.float64)
    b, length, _, d = x.shape
    r = d if rotary_dim is None else rotary_dim
    positions = np.asarray(positions, np.float64).reshape(-1, length)
    positions = np.broadcast_to(positions, (b, length))
    out = x.copy()
    for bi in range(b):
        for li in range(length):
            rot = np.eye(d)
            for i in range(r // 2):
                a = positions[bi, li] * base ** (-2 * i / r)
                u, w = (i, i + r // 2) if layout == "half" else (2 * i, 2 * i + 1)
                rot[u, u], rot[u, w] = np.cos(a), -np.sin(a)
                rot[w, u], rot[w, w] = np.sin(a), np.cos(a)
            out[bi, li] = x[bi, li] @ rot.T
    return out


def _x(seed, shape=(2, 5, 3, 8), dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


ROPE_POSITIONS = np.array([[0, 1, 2, 7, 300], [5, 6, 40, 41, 99]], np.int32)


@pytest.mark.parametrize("layout", rotary.ROPE_LAYOUTS)
@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_rope_matches_rotation_matrix(layout, base):
    x = _x(0)
    y = rotary.apply_rope(jnp.asarray(x), ROPE_POSITIONS, base=base, layout=layout)
    assert y.shape == x.shape and y.dtype == jnp.float32
    ref = np_rope(x, ROPE_POSITIONS, base=base, layout=layout)
    np.testing.assert_allclose(y, ref, atol=2e-4)
    # A rotation preserves norms; position 0 is the identity.
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    np.testing.assert_allclose(y[0, 0], x[0, 0], atol=1e-6)


def test_rope_half_and_interleaved_are_the_same_rotation_under_a_permutation():
    d = 8
    perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])  # 0 2 4 6 1 3 5 7
    x = _x(1, (2, 5, 3, d))
    half = rotary.apply_rope(jnp.asarray(x[..., perm]), ROPE_POSITIONS, layout="half")
    inter = rotary.apply_rope(jnp.asarray(x), ROPE_POSITIONS, layout="interleaved")
    np.testing.assert_allclose(half, np.asarray(inter)[..., perm], atol=1e-5)
    # Without the permutation the two layouts differ (the equality is not trivial).
    plain_half = rotary.apply_rope(jnp.asarray(x), ROPE_POSITIONS, layout="half")
    assert np.abs(np.asarray(plain_half) - np.asarray(inter)).max() > 0.1


@pytest.mark.parametrize("layout", rotary.ROPE_LAYOUTS)
def test_rope_partial_rotary_dim_leaves_the_rest_untouched(layout):
    x = _x(2, (2, 5, 3, 12))
    y = np.asarray(rotary.apply_rope(jnp.asarray(x), ROPE_POSITIONS, layout=layout, rotary_dim=4))
    np.testing.assert_array_equal(y[..., 4:], x[..., 4:])
    ref = np_rope(x, ROPE_POSITIONS, layout=layout, rotary_dim=4)  # theta_i = base^(-2i/4)
    np.testing.assert_allclose(y, ref, atol=2e-4)
    assert np.abs(y[..., :4] - x[..., :4]).max() > 0.1


@pytest.mark.parametrize("layout", rotary.ROPE_LAYOUTS)
def test_rope_logits_depend_only_on_the_offset(layout):
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.standard_normal((2, 6, 2, 16)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((2, 6, 2, 16)), jnp.float32)
    pos = np.array([[0, 1, 2, 3, 4, 5], [3, 9, 10, 20, 21, 50]], np.int32)

    def logits(p):
        qr = rotary.apply_rope(q, p, layout=layout)
        kr = rotary.apply_rope(k, p, layout=layout)
        return np.asarray(attention.attention_logits(qr, kr)[0])

    base = logits(pos)
    for shift in (1, 17, 1000):
        np.testing.assert_allclose(logits(pos + shift), base, atol=2e-3)
    # Relative, not absolute: changing one offset does change the logits.
    other = pos.copy()
    other[:, 0] += 1
    assert np.abs(logits(other) - base).max() > 1e-2


def test_rope_angles_are_float32_for_bf16_inputs():
    x = jnp.asarray(_x(4, (1, 2, 1, 8)), jnp.bfloat16)
    pos = np.array([[256, 257]], np.int32)  # 257 is not representable in bf16
    y = rotary.apply_rope(x, pos)
    assert y.dtype == jnp.bfloat16
    ref = np_rope(np.asarray(x, np.float64), pos)
    np.testing.assert_allclose(np.asarray(y, np.float64), ref, atol=3e-2)
    rounded = np_rope(np.asarray(x, np.float64), np.array([[256, 256]]))
    assert np.abs(rounded[0, 1] - ref[0, 1]).max() > 0.1  # rounding the position is visible


def test_rope_inv_frequencies_closed_form():
    np.testing.assert_allclose(
        rotary.rope_inv_frequencies(8),
        [1.0, 0.1, 0.01, 0.001],  # 10000^(-2i/8) = 10^(-i), rtol=1e-6
    )
    np.testing.assert_allclose(rotary.rope_inv_frequencies(4, base=100.0), [1.0, 0.1], rtol=1e-6)


# ---------------------------------------------------------------------------------- ALiBi


def official_get_slopes(n):
    """Verbatim logic of `get_slopes` in ofirpress/attention_with_linear_biases."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (
        get_slopes_power_of_2(closest_power_of_2)
        + official_get_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
    )


@pytest.mark.parametrize("n", [*range(1, 17), 24, 48])
def test_alibi_slopes_match_the_official_rule(n):
    slopes = attention_bias.alibi_slopes(n)
    assert slopes.shape == (n,) and slopes.dtype == jnp.float32
    np.testing.assert_allclose(slopes, official_get_slopes(n), rtol=1e-6)


@pytest.mark.parametrize(
    "n,neg_log2",
    [
        (1, [8]),
        (2, [4, 8]),
        (8, [1, 2, 3, 4, 5, 6, 7, 8]),
        (16, [0.5 * i for i in range(1, 17)]),
        (12, [1, 2, 3, 4, 5, 6, 7, 8, 0.5, 1.5, 2.5, 3.5]),
        (6, [2, 4, 6, 8, 1, 3]),
    ],
)
def test_alibi_slopes_closed_forms(n, neg_log2):
    np.testing.assert_allclose(
        -np.log2(np.asarray(attention_bias.alibi_slopes(n))), neg_log2, atol=1e-6
    )


@pytest.mark.parametrize("causal", [True, False])
def test_alibi_bias_matches_numpy(causal):
    qp = np.array([[0, 1, 2, 3], [10, 11, 12, 13]], np.int32)
    kp = np.array([[0, 1, 2, 3, 4], [7, 9, 11, 13, 15]], np.int32)
    slopes = np.array([0.5, 0.25, 0.0625], np.float32)
    bias = np.asarray(attention_bias.alibi_bias(qp, kp, slopes, causal=causal))
    assert bias.shape == (2, 3, 4, 5) and bias.dtype == np.float32
    ref = np.zeros((2, 3, 4, 5))
    for b in range(2):
        for h in range(3):
            for i in range(4):
                for j in range(5):
                    d = qp[b, i] - kp[b, j]
                    ref[b, h, i, j] = -slopes[h] * (d if causal else abs(d))
    np.testing.assert_allclose(bias, ref, rtol=1e-6)
    # Unbatched positions broadcast as one row.
    one = attention_bias.alibi_bias(qp[0], kp[0], slopes, causal=causal)
    np.testing.assert_array_equal(one[0], bias[0])


@pytest.mark.parametrize("causal", [True, False])
def test_alibi_bias_depends_only_on_the_offset(causal):
    slopes = attention_bias.alibi_slopes(4)
    qp = np.array([[0, 1, 2, 3, 4, 5]], np.int32)
    base = np.asarray(attention_bias.alibi_bias(qp, qp, slopes, causal=causal))
    for shift in (1, 100, 4096):
        np.testing.assert_array_equal(
            attention_bias.alibi_bias(qp + shift, qp + shift, slopes, causal=causal), base
        )
    # Equal offsets i - j give equal entries (a Toeplitz matrix per head).
    for off in range(-5, 6):
        diag = np.diagonal(base, offset=-off, axis1=2, axis2=3)
        np.testing.assert_array_equal(diag, diag[..., :1] * np.ones_like(diag))


def test_relative_positions_and_batched_positions():
    qp = np.array([[3, 4]], np.int32)
    kp = np.array([[0, 2, 4]], np.int32)
    np.testing.assert_array_equal(relative_positions(qp, kp), [[[3, 1, -1], [4, 2, 0]]])
    p = as_batched_positions(np.arange(5, dtype=np.int64))
    assert p.shape == (1, 5) and p.dtype == jnp.int32
    with pytest.raises(ValueError, match=r"^positions=float32\[5\]: must be integers of shape"):
        as_batched_positions(np.arange(5.0))
    with pytest.raises(ValueError, match=r"^positions=int32\[1, 2, 3\]: .*\[batch, length\]$"):
        as_batched_positions(np.zeros((1, 2, 3), np.int32))
    # With the expected length and batch: [L] and [1 or B, L] pass, others name both shapes.
    p = as_batched_positions(np.arange(4), name="k_positions", length=4, batch=3)
    np.testing.assert_array_equal(p, [[0, 1, 2, 3]])
    assert as_batched_positions(np.zeros((3, 4), np.int32), length=4, batch=3).shape == (3, 4)
    with pytest.raises(ValueError, match=r"^k_positions=int32\[2, 4\]: .*here \[4\] or \[3, 4\]"):
        as_batched_positions(np.zeros((2, 4), np.int32), name="k_positions", length=4, batch=3)
    with pytest.raises(ValueError, match=r"^q_positions=int32\[5\]: .*here \[4\] or \[batch, 4\]"):
        as_batched_positions(np.arange(5, dtype=np.int32), name="q_positions", length=4)
    # Every positional formula takes [L] as the broadcast [B, L].
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 4, 1, 8)), jnp.float32)
    flat, batched = np.arange(4), np.broadcast_to(np.arange(4), (2, 4))
    np.testing.assert_array_equal(rotary.apply_rope(x, flat), rotary.apply_rope(x, batched))
    with pytest.raises(ValueError, match=r"^positions=int32\[2, 5\]: .*here \[4\] or \[2, 4\]"):
        rotary.apply_rope(x, np.zeros((2, 5), np.int32))
    np.testing.assert_array_equal(
        attention.mask_from_positions(flat, flat),
        attention.mask_from_positions(batched, batched)[:1],
    )


def test_invalid_arguments_raise_clear_errors():
    x = jnp.zeros((1, 3, 1, 8))
    with pytest.raises(ValueError, match=r"rotary_dim must be even.*got 3"):
        rotary.apply_rope(x, np.arange(3), rotary_dim=3)
    with pytest.raises(ValueError, match="layout='zigzag'"):
        rotary.apply_rope(x, np.arange(3), layout="zigzag")
    with pytest.raises(ValueError, match="do not fit head_dim=8"):
        rotary.apply_rope(x, np.arange(3), rotary_dim=10)
    with pytest.raises(ValueError, match="dim=0: must be a positive int"):
        absolute.sinusoidal(np.arange(3), 0)
    with pytest.raises(ValueError, match="num_heads=0: must be a positive int"):
        attention_bias.alibi_slopes(0)
    with pytest.raises(ValueError, match=r"base=.*: must be a finite number > 0"):
        absolute.sinusoidal(np.arange(3), 4, base=-1.0)
