"""Position arrays (`core.positions`): relative positions ``q_pos - k_pos`` and the
batching of ``[length]`` positions to ``[batch, length]``."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_lite.core import attention, rotary
from flaxformer_lite.core.positions import as_batched_positions, relative_positions


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
