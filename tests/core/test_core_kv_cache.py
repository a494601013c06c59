"""The ring-buffer KV cache of windowed and block-local layers, and the position masks.

Each write is checked against a plain list of the tokens written so far: the ring must hold
exactly the last S of them, token n in slot n mod S.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_lite.core import attention, kv_cache

B, KV, D = 2, 1, 3


def _kv(first, length):
    """Keys/values [B, l, KV, D] whose entries encode the token number (first..first+l-1)."""
    n = np.arange(first, first + length, dtype=np.float32)
    key = (
        np.broadcast_to(n[None, :, None, None], (B, length, KV, D))
        + np.array([0, 100])[:, None, None, None]
    )
    return jnp.asarray(key), jnp.asarray(-key), jnp.asarray(np.broadcast_to(n, (B, length)), int)


@pytest.mark.parametrize("slots", [1, 3, 4])
@pytest.mark.parametrize("writes", [(1,) * 9, (5, 1, 1, 1), (2, 7, 1), (4, 4)])
def test_ring_holds_the_last_slots_tokens(slots, writes):
    cache = kv_cache.init_kv_cache(B, slots, KV, D)
    written = 0
    write = jax.jit(kv_cache.write_ring)
    for length in writes:
        key, value, positions = _kv(written, length)
        cache = write(cache, key, value, positions.astype(jnp.int32))
        written += length
        assert int(cache.index) == written
        kept = list(range(max(0, written - slots), written))
        for n in kept:  # token n in slot n mod S
            s = n % slots
            assert bool(cache.valid[0, s]) and int(cache.positions[0, s]) == n
            np.testing.assert_array_equal(cache.key[:, s, 0, 0], [n, n + 100])
            np.testing.assert_array_equal(cache.value[:, s, 0, 0], [-n, -n - 100])
        assert int(cache.valid[0].sum()) == len(kept)


def test_ring_capacity():
    assert kv_cache.ring_capacity(100, None) == 100  # a global layer keeps every key
    assert kv_cache.ring_capacity(100, 16) == 16
    assert kv_cache.ring_capacity(8, 16) == 8  # never more slots than tokens
    with pytest.raises(ValueError, match="span=0: must be a positive int"):
        kv_cache.ring_capacity(8, 0)


@pytest.mark.parametrize("span", [{}, {"window": 3}, {"chunk": 3}, {"window": 20}])
def test_visible_mask_over_arange_positions_is_the_full_pass_mask(span):
    length = 10
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (B, length))
    valid = jnp.ones((B, length), bool)
    mask = kv_cache.visible_mask(positions, positions, valid, **span)
    assert mask.shape == (B, 1, length, length)
    expected = attention.causal_span_mask(length, length, **span)
    np.testing.assert_array_equal(mask[0, 0], expected)
    np.testing.assert_array_equal(mask[1, 0], expected)
    # an invalid slot is never visible
    valid = valid.at[0, 4].set(False)
    mask = kv_cache.visible_mask(positions, positions, valid, **span)
    assert not bool(mask[0, 0, :, 4].any()) and bool(mask[1, 0, 4, 4])
