"""evaluation.step: the argmax helper computes exactly numpy's argmax."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from flaxformer_lite.evaluation.step import argmax_last


def test_argmax_last_equals_argmax_including_ties():
    rng = np.random.default_rng(0)
    smooth = rng.standard_normal((3, 5, 17)).astype(np.float32)
    ties = rng.integers(0, 3, (4, 6, 9)).astype(np.float32)  # many tied maxima
    ties[0, 0] = 2.0  # a row that is all maxima: index 0
    for x in (smooth, ties):
        np.testing.assert_array_equal(argmax_last(jnp.asarray(x)), np.argmax(x, axis=-1))
    assert argmax_last(jnp.asarray(ties)).dtype == jnp.int32
