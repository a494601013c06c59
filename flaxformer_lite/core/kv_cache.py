"""Key-value caches for autoregressive decoding, as plain pytrees (no hidden module state).

A cache is a value: layers take one and return the updated one, so decoding composes with
``jax.jit`` and ``jax.lax`` loops (`flaxformer_lite.nn.generate`). Shapes::

    KVCache        key, value  [batch, capacity, kv_heads, head_dim]   projected (rotated or
                               not: see below); kv_heads < heads with grouped-query attention
                   positions   int32 [batch, capacity]   position of each slot
                   valid       bool  [batch, capacity]   the slot holds a key
                   index       int32 []                  next slot to write
                   forget_prefix  float32 [batch, capacity, heads] or None: FoX's prefix
                               sums c of log forget gates at each slot (`continue_prefix`)
    CrossKVCache   key, value  [batch, src_len, kv_heads, head_dim]   the encoder's, projected once
                   positions   int32 [batch, src_len];  valid  bool [batch, src_len]
    DecoderCache   self_attention: one KVCache per decoder block
                   cross_attention: one CrossKVCache per block (EncoderDecoder) or None

Whether keys are cached rotated depends on the encoding (its ``caches_rotated_keys``):

* False (xPos, and every encoding without a rotate hook): keys are cached before rotation. A
  rotate-hook encoding of this kind may depend on the whole set of key positions, not only on
  each key's own (xPos centres its scale on ``(min + max) // 2`` of the key positions), so each
  decoding step calls ``rotate(q, k, q_positions, k_positions)`` on the new queries and the
  whole cache, with the cache's slot positions -- exactly the call a full forward pass makes.
* True (RoPE and its scalings): each step rotates its new queries and keys at their own
  positions and caches the rotated keys, as Hugging Face transformers does. With a fixed
  rotation this equals the full forward pass; with dynamic NTK each key keeps the scale of the
  step that wrote it (HF's cached generation, which differs from a full pass past the
  original length).

``positions`` is filled at creation with the positions the slots *will* hold (default
``0..capacity-1``) and overwritten with the true ones as tokens are written, so a cache of
``capacity`` slots reproduces the full forward pass over ``capacity`` tokens for every
registered encoding (dynamic NTK past its original length excepted, as above). Unfilled
slots are masked out by ``valid``; the causal mask comes from positions
(`attention.mask_from_positions`), not from slot indices.

A layer that sees at most the last S positions -- a sliding window of W keys, or block-local
attention in chunks of C (a query sees keys of its own chunk only, all among the last C
positions) -- keeps a **ring buffer** of ``S = min(W or C, capacity)`` slots instead
(`ring_capacity`): token ``n`` of the sequence lives in slot ``n mod S`` (`write_ring`), so
its memory does not grow with the sequence. Such a layer attends from its new queries to the
ring's keys followed by its new keys (`visible_mask` decides which are visible, from
positions), then writes the new keys over the oldest slots; with positions that increase
by one from token to token this is exactly the full pass with that window or chunk.

Forgetting attention (FoX, Lin et al. 2025, arXiv 2503.02130) adds ``c_i - c_j`` to the logit
of query ``i`` and key ``j``, ``c`` the prefix sum of the log forget gates. A cache created
with ``forget_heads`` keeps ``c`` per slot: each step continues the sum from the last
written slot (`continue_prefix`) and writes it with the keys, so decoding needs only the new
tokens' gates, and equals the full pass up to float rounding.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from flaxformer_lite.base.checks import check_positive_int
from flaxformer_lite.core import attention
from flaxformer_lite.core.chunked_attention import check_keep_first
from flaxformer_lite.core.positions import as_batched_positions

Array = jax.Array


class KVCache(NamedTuple):
    """One self-attention layer's cache (see the module docstring for shapes)."""

    key: Array
    value: Array
    positions: Array
    valid: Array
    index: Array
    forget_prefix: Array | None = None

    @property
    def capacity(self) -> int:
        return self.key.shape[1]


class CrossKVCache(NamedTuple):
    """One cross-attention layer's encoder keys and values, computed once per source."""

    key: Array
    value: Array
    positions: Array
    valid: Array


class DecoderCache(NamedTuple):
    """A decoder stack's caches: per-block self-attention, optional per-block cross-attention."""

    self_attention: tuple[KVCache, ...]
    cross_attention: tuple[CrossKVCache, ...] | None = None


def slot_positions(batch: int, capacity: int, positions: Array | None = None) -> Array:
    """int32 ``[batch, capacity]`` planned slot positions: ``positions`` or ``0..capacity-1``."""
    check_positive_int("batch", batch)
    check_positive_int("capacity", capacity)
    if positions is None:
        positions = jnp.arange(capacity, dtype=jnp.int32)
    positions = as_batched_positions(jnp.asarray(positions))
    if positions.shape[1] != capacity or positions.shape[0] not in (1, batch):
        raise ValueError(
            f"positions shape {positions.shape} does not match the cache: expected "
            f"[batch={batch}, capacity={capacity}] or [capacity]"
        )
    return jnp.broadcast_to(positions.astype(jnp.int32), (batch, capacity))


def init_kv_cache(
    batch: int,
    capacity: int,
    num_heads: int,
    head_dim: int,
    *,
    dtype: jnp.dtype = jnp.float32,
    positions: Array | None = None,
    forget_heads: int | None = None,
) -> KVCache:
    """An empty `KVCache` ``[batch, capacity, num_heads, head_dim]`` whose planned positions
    are ``positions`` (int ``[batch, capacity]`` or ``[capacity]``; default
    ``0..capacity-1``). ``num_heads`` is the key/value head count (fewer than the query heads
    with grouped-query attention). ``forget_heads`` (FoX: the query head count): also keep
    float32 ``forget_prefix [batch, capacity, forget_heads]``; None: no such field."""
    shape = (batch, capacity, num_heads, head_dim)
    prefix = None
    if forget_heads is not None:
        check_positive_int("forget_heads", forget_heads)
        prefix = jnp.zeros((batch, capacity, forget_heads), jnp.float32)
    return KVCache(
        key=jnp.zeros(shape, dtype),
        value=jnp.zeros(shape, dtype),
        positions=slot_positions(batch, capacity, positions),
        valid=jnp.zeros((batch, capacity), bool),
        index=jnp.zeros((), jnp.int32),
        forget_prefix=prefix,
    )


def write(
    cache: KVCache,
    key: Array,
    value: Array,
    positions: Array,
    *,
    forget_prefix: Array | None = None,
) -> KVCache:
    """Store ``l`` new keys/values ``[batch, l, kv_heads, head_dim]`` at positions int
    ``[batch, l]`` into slots ``index .. index + l - 1``; returns the updated cache.

    ``forget_prefix``: the new tokens' FoX prefix sums float ``[batch, l, heads]``
    (`continue_prefix`), required exactly when the cache keeps them (``forget_heads``).

    Writing past ``capacity`` is a ``ValueError`` when it can be seen (eagerly); under
    ``jit`` the index is traced, and the caller (e.g. `generate`) sizes the cache.
    """
    batch, length = _check_write(cache, key, value, positions, forget_prefix)
    if length > cache.capacity:
        raise ValueError(f"{length} new tokens do not fit a cache of capacity {cache.capacity}")
    try:
        filled = int(cache.index)
    except jax.errors.ConcretizationTypeError:  # traced (under jit): cannot check here
        filled = None
    if filled is not None and filled + length > cache.capacity:
        raise ValueError(
            f"the cache holds {filled} of {cache.capacity} slots; {length} more tokens do "
            "not fit (create it with a larger capacity)"
        )
    start = cache.index
    prefix = cache.forget_prefix
    if forget_prefix is not None:
        prefix = jax.lax.dynamic_update_slice(
            prefix, forget_prefix.astype(jnp.float32), (0, start, 0)
        )
    return KVCache(
        key=jax.lax.dynamic_update_slice(cache.key, key.astype(cache.key.dtype), (0, start, 0, 0)),
        value=jax.lax.dynamic_update_slice(
            cache.value, value.astype(cache.value.dtype), (0, start, 0, 0)
        ),
        positions=jax.lax.dynamic_update_slice(
            cache.positions, positions.astype(jnp.int32), (0, start)
        ),
        valid=jax.lax.dynamic_update_slice(
            cache.valid, jnp.ones((batch, length), bool), (0, start)
        ),
        index=start + length,
        forget_prefix=prefix,
    )


def _check_write(
    cache: KVCache, key: Array, value: Array, positions: Array, forget_prefix: Array | None
) -> tuple[int, int]:
    """``(batch, l)`` of ``l`` new keys/values ``[batch, l, kv_heads, head_dim]`` at positions
    ``[batch, l]`` to write into ``cache``, with their FoX prefix sums ``[batch, l, heads]``
    exactly when the cache keeps them; a ValueError if their shapes do not fit."""
    batch, length = key.shape[:2]
    if key.shape != value.shape or key.shape[0] != cache.key.shape[0]:
        raise ValueError(
            f"key {key.shape} and value {value.shape} must both be "
            f"[batch={cache.key.shape[0]}, l, heads, head_dim]"
        )
    if positions.shape != (batch, length):
        raise ValueError(
            f"positions shape {positions.shape} must be [batch, l] = {(batch, length)}"
        )
    if (forget_prefix is None) != (cache.forget_prefix is None):
        raise ValueError(
            "forget_prefix: pass the new tokens' prefix sums [batch, l, heads] exactly when "
            "the cache keeps them (init_kv_cache(..., forget_heads=heads)); got "
            f"{'none' if forget_prefix is None else 'some'} for a cache that keeps "
            f"{'none' if cache.forget_prefix is None else 'them'}"
        )
    if forget_prefix is not None:
        expected = (batch, length, cache.forget_prefix.shape[2])
        if tuple(forget_prefix.shape) != expected:
            raise ValueError(
                f"forget_prefix shape {tuple(forget_prefix.shape)} must be [batch, l, heads] = "
                f"{expected}"
            )
    return batch, length


def continue_prefix(cache: KVCache, log_forget: Array) -> Array:
    """FoX prefix sums of ``l`` new tokens, float32 ``[batch, l, heads]``: the sum in the last
    written slot (0 in an empty cache) plus the running sum of their log forget gates
    ``log_forget`` float ``[batch, l, heads]`` (`forgetting.log_forget_gates`), i.e. what
    `forgetting.forget_prefix` gives these tokens over the whole sequence so far."""
    if cache.forget_prefix is None:
        raise ValueError(
            "this cache keeps no FoX prefix sums: create it with init_kv_cache(..., "
            "forget_heads=heads)"
        )
    batch, heads = cache.forget_prefix.shape[0], cache.forget_prefix.shape[2]
    if log_forget.ndim != 3 or log_forget.shape[0] != batch or log_forget.shape[2] != heads:
        raise ValueError(
            f"log_forget shape {tuple(log_forget.shape)} must be [batch={batch}, l, heads={heads}]"
        )
    # the last written slot: index - 1, taken modulo the capacity so that a cache whose
    # index counts every token written (a ring buffer) reads the right one too
    last_slot = jnp.mod(jnp.maximum(cache.index - 1, 0), cache.capacity)
    last_B1N = jax.lax.dynamic_slice_in_dim(cache.forget_prefix, last_slot, 1, axis=1)
    last_B1N = jnp.where(cache.index > 0, last_B1N, jnp.float32(0.0))
    return last_B1N + jnp.cumsum(log_forget.astype(jnp.float32), axis=1)


def self_attention_mask(
    q_positions: Array,
    cache: KVCache,
    *,
    window: int | None = None,
    chunk: int | None = None,
    keep_first: int | None = None,
) -> Array:
    """Bool ``[batch, 1, l, capacity]``: filled slots whose position is <= the query's (and,
    with a ``window`` W, > the query's position - W: the last W positions, as windowed
    causal attention over ``0..n-1`` sees them; with ``keep_first`` k also positions < k,
    StreamingLLM's `attention.streaming_mask`; with a ``chunk`` C, in the query's chunk).
    `visible_mask` of the cache's slots."""
    return visible_mask(
        q_positions,
        cache.positions,
        cache.valid,
        window=window,
        chunk=chunk,
        keep_first=keep_first,
    )


def visible_mask(
    q_positions: Array,
    k_positions: Array,
    k_valid: Array,
    *,
    window: int | None = None,
    chunk: int | None = None,
    keep_first: int | None = None,
) -> Array:
    """Bool ``[batch, 1, l, s]``: which of ``s`` keys each of ``l`` queries sees, from
    positions: a valid key (``k_valid`` bool ``[batch, s]``) at position ``m <= n`` for the
    query at ``n`` (int ``[batch, l]``; ``k_positions`` int ``[batch, s]``), and with a
    ``window`` W also ``m > n - W`` (or, with ``keep_first`` k, ``m < k``: StreamingLLM), with
    a ``chunk`` C also ``m // C == n // C``.

    Over positions ``0..L-1`` this is `attention.causal_span_mask`: the cached twin of the
    full pass's index-based masks."""
    keep_first = check_keep_first(keep_first, window)
    mask_B1TS = attention.mask_from_positions(q_positions, k_positions)
    mask_B1TS = mask_B1TS & k_valid[:, None, None, :]
    q_B1T1, k_B11S = q_positions[:, None, :, None], k_positions[:, None, None, :]
    if window is not None:
        recent_B1TS = k_B11S > q_B1T1 - window
        if keep_first is not None:
            recent_B1TS = recent_B1TS | (k_B11S < keep_first)
        mask_B1TS = mask_B1TS & recent_B1TS
    if chunk is not None:
        mask_B1TS = mask_B1TS & (k_B11S // chunk == q_B1T1 // chunk)
    return mask_B1TS


def ring_capacity(capacity: int, span: int | None) -> int:
    """Slots one layer's cache needs for ``capacity`` tokens: ``min(span, capacity)`` for a
    layer that sees at most the last ``span`` positions (a window W or a chunk C), else
    ``capacity`` (a global layer keeps every key)."""
    capacity = check_positive_int("capacity", capacity)
    return capacity if span is None else min(check_positive_int("span", span), capacity)


def write_ring(
    cache: KVCache,
    key: Array,
    value: Array,
    positions: Array,
    *,
    forget_prefix: Array | None = None,
) -> KVCache:
    """Store ``l`` new keys/values ``[batch, l, kv_heads, head_dim]`` at positions int
    ``[batch, l]`` in a ring buffer of ``S = cache.capacity`` slots: the ``t``-th new token
    goes to slot ``(index + t) mod S``, overwriting the oldest; when ``l > S`` only the last
    ``S`` are kept. ``index`` counts every token written. Never overflows.

    ``forget_prefix``: the new tokens' FoX prefix sums float ``[batch, l, heads]``
    (`continue_prefix`), exactly when the cache keeps them, as in `write`."""
    _, length = _check_write(cache, key, value, positions, forget_prefix)
    slots = cache.capacity
    kept = min(length, slots)  # static: the last `kept` new tokens survive the write
    first = cache.index + (length - kept)
    slot_S = (first + jnp.arange(kept, dtype=jnp.int32)) % slots  # distinct slots
    prefix = cache.forget_prefix
    if forget_prefix is not None:
        new = forget_prefix[:, length - kept :].astype(jnp.float32)
        prefix = prefix.at[:, slot_S].set(new)
    return KVCache(
        key=cache.key.at[:, slot_S].set(key[:, length - kept :].astype(cache.key.dtype)),
        value=cache.value.at[:, slot_S].set(value[:, length - kept :].astype(cache.value.dtype)),
        positions=cache.positions.at[:, slot_S].set(
            positions[:, length - kept :].astype(jnp.int32)
        ),
        valid=cache.valid.at[:, slot_S].set(True),
        index=cache.index + length,
        forget_prefix=prefix,
    )
