"""Shapes and constants shared by the pure attention modules (no Flax, no state).

`attention`, `chunked_attention` and `kv_cache` validate the same kinds of arrays; the checks
live here once so their rules and messages cannot drift apart. Scalar argument checks (e.g. a
positive int) are `flaxformer_lite.base.checks`, shared with every layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax

Array = jax.Array
# A function of (q_positions [b, q_len], k_positions [b, kv_len]) returning a float32 logit
# bias [b, heads, q_len, kv_len]. Positional encodings of the "bias" kind provide one.
BiasFn = Callable[[Array, Array], Array]
# Logit of a masked entry: finite, so an all-masked row never produces inf - inf = NaN.
MASKED_LOGIT = -1e30


def as_rank4(x: Array) -> Array:
    """Prepend unit axes explicitly (the code must run with rank promotion set to raise)."""
    if x.ndim > 4:
        raise ValueError(f"expected at most 4 axes [batch, heads, q_len, kv_len]; got {x.shape}")
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def check_broadcastable(name: str, shape: Sequence[int], target: Sequence[int]) -> None:
    """``shape`` (4 axes) must broadcast to ``target`` = [batch, heads, q_len, kv_len]."""
    if len(shape) != 4 or any(a not in (1, t) for a, t in zip(shape, target, strict=True)):
        raise ValueError(
            f"{name} has shape {tuple(shape)}, which does not broadcast to [batch, heads, "
            f"q_len, kv_len] = {tuple(target)} (missing leading axes count as size 1)"
        )
