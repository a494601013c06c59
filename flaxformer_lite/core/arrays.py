"""Shapes and constants shared by the pure attention modules (no Flax, no state).

`attention`, `chunked_attention` and `kv_cache` validate the same kinds of arrays; the checks
live here once so their rules and messages cannot drift apart. Scalar argument checks (e.g. a
positive int) are `flaxformer_lite.base.checks`, shared with every layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

Array = jax.Array
# A function of (q_positions [b, q_len], k_positions [b, kv_len]) returning a float32 logit
# bias [b, heads, q_len, kv_len]. Positional encodings of the "bias" kind provide one.
BiasFn = Callable[[Array, Array], Array]
# Logit of a masked entry: finite, so an all-masked row never produces inf - inf = NaN.
MASKED_LOGIT = -1e30


def as_rank4(x: Array, name: str) -> Array:
    """Prepend unit axes explicitly (the code must run with rank promotion set to raise)."""
    if x.ndim > 4:
        raise ValueError(
            f"{name} must have at most 4 axes [batch, heads, q_len, kv_len]; got shape {x.shape}"
        )
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def check_broadcastable(name: str, shape: Sequence[int], target: Sequence[int]) -> None:
    """``shape`` (4 axes) must broadcast to ``target`` = [batch, heads, q_len, kv_len]."""
    if len(shape) != 4 or any(a not in (1, t) for a, t in zip(shape, target, strict=True)):
        raise ValueError(
            f"{name} has shape {tuple(shape)}, which does not broadcast to [batch, heads, "
            f"q_len, kv_len] = {tuple(target)} (missing leading axes count as size 1)"
        )


def check_mask(mask: Array, shape: Sequence[int]) -> Array:
    """A boolean mask (True = attend) as 4 axes that broadcast to ``shape`` = [batch, heads,
    q_len, kv_len] (missing leading axes count as size 1)."""
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        raise ValueError(f"mask must be boolean (True = attend); got dtype {mask.dtype}")
    mask = as_rank4(mask, "mask")
    check_broadcastable("mask", mask.shape, shape)
    return mask


def check_sinks(sinks: Array | None, heads: int) -> Array | None:
    """Attention-sink logits as float32 ``[heads]`` (or None): one learned logit per query head
    (gpt-oss, `attention.dot_product_attention`'s ``sinks``)."""
    if sinks is None:
        return None
    shape = tuple(jnp.shape(sinks))
    if shape != (heads,) or not jnp.issubdtype(jnp.result_type(sinks), jnp.floating):
        raise ValueError(
            f"sinks={jnp.result_type(sinks)}{list(shape)}: must be a float array of shape "
            f"[heads] = [{heads}] (one sink logit per query head)"
        )
    return jnp.asarray(sinks, jnp.float32)


def check_forget_prefix(
    forget_prefix: tuple[Array, Array] | None, q_shape: Sequence[int], kv_len: int
) -> tuple[Array, Array] | None:
    """FoX prefix sums ``(c_q [batch, q_len, heads], c_k [batch, kv_len, heads])`` as float32
    (or None), for queries of shape ``q_shape = [batch, q_len, heads, head_dim]``; the batch
    axis may be 1 (shared)."""
    if forget_prefix is None:
        return None
    if not isinstance(forget_prefix, tuple | list) or len(forget_prefix) != 2:
        raise ValueError(
            f"forget_prefix={forget_prefix!r}: must be a pair (c_q [batch, q_len, heads], "
            "c_k [batch, kv_len, heads]) of prefix sums of log forget gates"
        )
    batch, q_len, heads = q_shape[0], q_shape[1], q_shape[2]
    out = []
    for name, c, length in (("c_q", forget_prefix[0], q_len), ("c_k", forget_prefix[1], kv_len)):
        shape = tuple(jnp.shape(c))
        ok = len(shape) == 3 and shape[0] in (1, batch) and shape[1:] == (length, heads)
        if not ok or not jnp.issubdtype(jnp.result_type(c), jnp.floating):
            raise ValueError(
                f"forget_prefix {name}={jnp.result_type(c)}{list(shape)}: must be a float "
                f"array [batch or 1, {length}, heads={heads}]"
            )
        out.append(jnp.asarray(c, jnp.float32))
    return out[0], out[1]
