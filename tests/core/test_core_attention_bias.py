"""ALiBi in `core.attention_bias` against the official rule and numpy: slopes of
ofirpress/attention_with_linear_biases' ``get_slopes`` (non-power-of-two interleaving) and
their closed forms, the causal and bidirectional bias, and its dependence on the offset only."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_lite.core import attention_bias


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


# ------------------------------------------------------------ ALiBi with position interpolation


@pytest.mark.parametrize("n", [4, 6, 12])
def test_alibi_interpolated_slopes_keep_the_training_lengths_largest_penalty(n):
    """ALiBi-PI (arXiv 2310.13017): slopes times L / L' at L' > L, so the bias over L' tokens
    is the bias over L tokens with positions interpolated (p * L / L')."""
    slopes = attention_bias.alibi_slopes(n)
    got = attention_bias.alibi_interpolated_slopes(slopes, train_length=64, eval_length=256)
    np.testing.assert_allclose(got, np.asarray(slopes) * 0.25, rtol=1e-7)
    q = k = jnp.arange(256)
    interpolated = attention_bias.alibi_bias(q, k, got)
    # the same bias as plain ALiBi at the fractional positions p * L / L'
    rel = (np.arange(256)[:, None] - np.arange(256)[None, :]) * 64 / 256
    want = -np.asarray(slopes, np.float64)[:, None, None] * rel[None]
    np.testing.assert_allclose(interpolated[0], want, rtol=1e-6, atol=1e-6)
    # the farthest key at L' costs what the farthest key at L did (up to (L'-1)/L' vs (L-1)/L)
    assert float(interpolated[0, 0, 255, 0]) == pytest.approx(-float(slopes[0]) * 255 / 4)


def test_alibi_interpolated_slopes_are_unchanged_within_the_training_length():
    slopes = attention_bias.alibi_slopes(8)
    for eval_length in (32, 64):
        got = attention_bias.alibi_interpolated_slopes(
            slopes, train_length=64, eval_length=eval_length
        )
        np.testing.assert_array_equal(got, slopes)
    with pytest.raises(ValueError, match="eval_length=0: must be a positive int"):
        attention_bias.alibi_interpolated_slopes(slopes, train_length=64, eval_length=0)
    with pytest.raises(ValueError, match=r"slopes must be \[heads\]"):
        attention_bias.alibi_interpolated_slopes(slopes[None], train_length=4, eval_length=8)
