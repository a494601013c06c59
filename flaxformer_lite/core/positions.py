"""Positions: explicit int ``[length]`` or ``[batch, length]`` arrays, input of every formula.

Positions are passed down explicitly (DESIGN.md §2); nothing derives them from a shape. Here:
normalising them (`as_batched_positions`), relative distances (`relative_positions`), sorted
random positions for training (`randomized_positions`, Ruoss et al. 2023) and the positions a
run feeds its model (`PositionScheme`: ``0..L-1`` or randomized, the same for training and
evaluation).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from flaxformer_lite.base.checks import ConfigError, check_positive_int

Array = jax.Array


def as_batched_positions(
    positions: Array,
    *,
    name: str = "positions",
    length: int | None = None,
    batch: int | None = None,
) -> Array:
    """Positions as int32 ``[batch or 1, length]``; a ``[length]`` array becomes ``[1, length]``.

    The one positions convention: every public function and model that takes positions takes
    int ``[length]`` (shared by every row, e.g. ``jnp.arange(L)``) or ``[batch, length]``;
    this is where both are checked and brought to two axes (broadcast over the batch later).

    Args:
      positions: the array to check.
      name: the argument's name, used in the error (e.g. ``"k_positions"``).
      length: if given, the length the positions must have (the last axis).
      batch: if given, a ``[batch, length]`` array must have ``batch`` rows or 1.

    Raises:
      ValueError: ``<name>=<dtype>[<shape>]: must be integers of shape [length] or [batch,
        length] ...``, naming the accepted shapes.
    """
    positions = jnp.asarray(positions)
    shape = tuple(positions.shape)
    ok = jnp.issubdtype(positions.dtype, jnp.integer) and len(shape) in (1, 2)
    if ok and length is not None:
        ok = shape[-1] == length
    if ok and batch is not None and len(shape) == 2:
        ok = shape[0] in (1, batch)
    if not ok:
        raise ValueError(
            f"{name}={positions.dtype}{list(shape)}: "
            f"{_allowed_positions(length=length, batch=batch)}"
        )
    if positions.ndim == 1:
        positions = positions[None, :]
    return positions.astype(jnp.int32)


def _allowed_positions(*, length: int | None, batch: int | None) -> str:
    """The accepted shapes, in words, for `as_batched_positions`' error."""
    allowed = "must be integers of shape [length] or [batch, length]"
    if length is not None and batch is not None:
        return f"{allowed}, here [{length}] or [{batch}, {length}] (or [1, {length}])"
    if length is not None:
        return f"{allowed}, here [{length}] or [batch, {length}]"
    return allowed


def relative_positions(q_positions: Array, k_positions: Array) -> Array:
    """``q_pos[i] - k_pos[j]`` as int32 ``[batch, q_len, kv_len]`` (positive: key in the past).

    Positions are int ``[length]`` or ``[batch, length]`` (`as_batched_positions`).
    """
    q_positions = as_batched_positions(q_positions, name="q_positions")
    k_positions = as_batched_positions(k_positions, name="k_positions")
    return q_positions[:, :, None] - k_positions[:, None, :]


def randomized_positions(key: Array, batch: int, length: int, *, max_position: int) -> Array:
    """Randomized positions (Ruoss et al. 2023, arXiv 2305.16843), int32 ``[batch, length]``.

    Each row is ``length`` distinct values drawn uniformly without replacement from
    ``[0, max_position)``, sorted ascending: the first ``length`` entries of a random
    permutation, per row (rows are independent; the DeepMind code draws one row per batch).
    Deterministic for a given ``key``. Works with every encoding: they all read positions.

    Args:
      key: a JAX PRNG key.
      batch, length: output shape (static ints).
      max_position: exclusive upper bound, ``>= length`` (2048 in the paper's code).
    """
    check_positive_int("batch", batch)
    check_positive_int("length", length)
    check_positive_int("max_position", max_position)
    if length > max_position:
        raise ValueError(
            f"length={length} distinct positions cannot be drawn from "
            f"[0, max_position={max_position}); need max_position >= length"
        )
    keys = jax.random.split(key, batch)
    row = lambda k: jnp.sort(jax.random.permutation(k, max_position)[:length])
    return jax.vmap(row)(keys).astype(jnp.int32)


def scaled_positions(positions: Array, freqs: Array) -> Array:
    """``positions[..., None] * freqs`` in float32 with explicit ranks (no rank promotion)."""
    freqs = freqs.reshape((1,) * positions.ndim + freqs.shape)
    return positions.astype(jnp.float32)[..., None] * freqs


@dataclasses.dataclass(frozen=True)
class PositionScheme:
    """The positions a run feeds its model, in training and at evaluation.

    ``randomized=False``: ``0..length-1`` for every row. ``randomized=True``: sorted distinct
    positions drawn from ``[0, max_position)`` (Ruoss et al. 2023), from a key derived from
    ``seed`` and the caller's ``key_parts`` (e.g. ``(0, step)`` for training batches), so every
    batch's positions are a pure function of the run's seed and where they are used.
    """

    randomized: bool = False
    max_position: int = 2048
    seed: int = 0

    def positions(self, key_parts: tuple[int, ...], batch: int, length: int) -> Array:
        """int32 ``[batch, length]``."""
        if not self.randomized:
            return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32)[None, :], (batch, length))
        if length > self.max_position:
            raise ConfigError(
                f"config.model.max_position={self.max_position}: randomized positions need "
                f"max_position >= the sequence length {length}"
            )
        key = jax.random.key(self.seed)
        for part in key_parts:
            key = jax.random.fold_in(key, part)
        return randomized_positions(key, batch, length, max_position=self.max_position)
