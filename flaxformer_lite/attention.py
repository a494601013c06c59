"""Scaled dot-product attention as pure functions of arrays (no Flax, no state).

Layout (the one `jax.nn.dot_product_attention` uses)::

    q: [batch, q_len, heads, head_dim]      k, v: [batch, kv_len, heads, head_dim]
    weights / bias / mask: [batch, heads, q_len, kv_len]  (broadcastable)

The formula is Vaswani et al. 2017, "Attention Is All You Need", Eq. 1::

    Attention(Q, K, V) = softmax(Q K^T * scale + bias) V,   scale = 1 / sqrt(head_dim)

Logits and the softmax are always computed in float32, whatever the input dtype, because
bfloat16 cannot resolve the small differences a softmax over long rows depends on. Masks are
boolean with ``True`` meaning "may attend". A query row whose keys are all masked produces
zero weights and a zero output, never NaN.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

Array = jax.Array
# A function of (q_positions [b, q_len], k_positions [b, kv_len]) returning a float32 logit
# bias [b, heads, q_len, kv_len]. Positional encodings of the "bias" kind provide one.
BiasFn = Callable[[Array, Array], Array]

IMPLEMENTATIONS = ("xla",)
_MASKED_LOGIT = -1e30  # finite, so an all-masked row never produces inf - inf = NaN


def causal_mask(q_len: int, kv_len: int) -> Array:
    """Boolean ``[q_len, kv_len]`` mask, True where key ``j <= i`` for query ``i``.

    The triangle is aligned to the top-left corner (query 0 sees key 0), as in
    ``jax.nn.dot_product_attention(is_causal=True)``. For cached decoding, where queries sit
    at the end of a longer key sequence, build the mask from positions instead
    (`mask_from_positions`).
    """
    _check_positive_int("q_len", q_len)
    _check_positive_int("kv_len", kv_len)
    return jnp.arange(kv_len)[None, :] <= jnp.arange(q_len)[:, None]


def padding_mask(q_valid: Array, kv_valid: Array | None = None) -> Array:
    """Boolean ``[batch, 1, q_len, kv_len]`` mask from per-token validity flags.

    Args:
      q_valid: ``[batch, q_len]`` bool (or 0/1), True for real (non-padding) query tokens.
      kv_valid: ``[batch, kv_len]``; defaults to ``q_valid`` (self-attention).

    A pair (i, j) may attend iff both query i and key j are real tokens. Rows of padding
    queries are fully masked, so their outputs are zeros.
    """
    kv_valid = q_valid if kv_valid is None else kv_valid
    _check_rank("q_valid", q_valid, 2)
    _check_rank("kv_valid", kv_valid, 2)
    q_valid = jnp.asarray(q_valid, dtype=bool)
    kv_valid = jnp.asarray(kv_valid, dtype=bool)
    return q_valid[:, None, :, None] & kv_valid[:, None, None, :]


def mask_from_positions(q_positions: Array, k_positions: Array) -> Array:
    """Causal mask ``[batch, 1, q_len, kv_len]`` from explicit positions: key pos <= query pos.

    Positions are ``[batch, length]`` int arrays. Equals `causal_mask` when both are
    ``0..L-1``; unlike it, stays correct for queries appended to a key-value cache.
    """
    _check_rank("q_positions", q_positions, 2)
    _check_rank("k_positions", k_positions, 2)
    return k_positions[:, None, None, :] <= q_positions[:, None, :, None]


def attention_logits(
    q: Array,
    k: Array,
    *,
    mask: Array | None = None,
    bias: Array | None = None,
    causal: bool = False,
    scale: float | None = None,
) -> tuple[Array, Array | None]:
    """Masked float32 logits ``[batch, heads, q_len, kv_len]`` and the combined boolean mask.

    Masked entries hold a large negative finite number. The mask returned is the
    broadcastable combination of ``mask`` and ``causal`` (None if neither is given).
    """
    _check_qk(q, k)
    head_dim = q.shape[-1]
    scale = head_dim**-0.5 if scale is None else scale
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    logits = logits * jnp.float32(scale)
    if bias is not None:
        bias = _as_rank4(jnp.asarray(bias, dtype=jnp.float32))
        _check_broadcastable("bias", bias, logits.shape)
        logits = logits + bias
    combined = _combine_masks(mask, causal, q.shape[1], k.shape[1], logits.shape)
    if combined is not None:
        logits = jnp.where(combined, logits, jnp.float32(_MASKED_LOGIT))
    return logits, combined


def attention_weights(
    q: Array,
    k: Array,
    v: Array | None = None,
    *,
    mask: Array | None = None,
    bias: Array | None = None,
    causal: bool = False,
    scale: float | None = None,
) -> Array:
    """Attention probabilities ``[batch, heads, q_len, kv_len]`` in float32.

    Same arguments as `dot_product_attention` (``v`` is accepted and ignored so the two
    calls can share an argument list). Fully masked rows are all zeros.
    """
    del v
    logits, combined = attention_logits(q, k, mask=mask, bias=bias, causal=causal, scale=scale)
    weights = jax.nn.softmax(logits, axis=-1)
    if combined is not None:
        # Zero out masked entries; for an all-masked row the softmax was uniform over
        # identical sentinel logits, so this also turns that row into zeros.
        weights = jnp.where(combined, weights, jnp.float32(0.0))
    return weights


def dot_product_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    bias: Array | None = None,
    causal: bool = False,
    scale: float | None = None,
) -> Array:
    """``softmax(q k^T * scale + bias) v`` for ``[batch, length, heads, head_dim]`` inputs.

    Args:
      q: ``[batch, q_len, heads, head_dim]``.
      k: ``[batch, kv_len, heads, head_dim]``.
      v: ``[batch, kv_len, heads, head_dim]``.
      mask: optional bool, broadcastable to ``[batch, heads, q_len, kv_len]`` (missing
        leading axes count as size 1, e.g. a ``[q_len, kv_len]`` mask); True = attend.
      bias: optional additive logit bias broadcastable to the same shape (added in float32).
      causal: also apply `causal_mask` (query i sees keys j <= i).
      scale: logit scale; defaults to ``1/sqrt(head_dim)`` (Vaswani et al. 2017, §3.2.1).

    Returns:
      ``[batch, q_len, heads, head_dim]`` in ``v.dtype``. Rows with no visible key are zeros.
    """
    _check_rank("v", v, 4)
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"v has shape {v.shape} but k has shape {k.shape}; they must agree on "
            "[batch, kv_len, heads]"
        )
    weights = attention_weights(q, k, mask=mask, bias=bias, causal=causal, scale=scale)
    out = jnp.einsum(
        "bhqk,bkhd->bqhd", weights.astype(v.dtype), v, preferred_element_type=jnp.float32
    )
    return out.astype(v.dtype)


def attend(
    q: Array,
    k: Array,
    v: Array,
    *,
    q_positions: Array,
    k_positions: Array,
    bias_fn: BiasFn | None = None,
    mask: Array | None = None,
    causal: bool = False,
    scale: float | None = None,
    implementation: str = "xla",
) -> Array:
    """The one attention entry point the layers call; positions make the bias a function.

    ``bias_fn(q_positions, k_positions)`` is evaluated by the chosen implementation, so an
    implementation that works block by block can build the bias per block instead of as one
    ``[q_len, kv_len]`` array.

    Args:
      q, k, v: as in `dot_product_attention`.
      q_positions: int ``[batch, q_len]``; k_positions: int ``[batch, kv_len]``.
      bias_fn: optional positional logit bias (ALiBi, T5, ...), see `BiasFn`.
      mask, causal, scale: as in `dot_product_attention`.
      implementation: one of `IMPLEMENTATIONS` ("xla" materialises the scores).
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"implementation={implementation!r} is not known; allowed: {list(IMPLEMENTATIONS)}"
        )
    bias = None if bias_fn is None else bias_fn(q_positions, k_positions)
    return dot_product_attention(q, k, v, mask=mask, bias=bias, causal=causal, scale=scale)


def _combine_masks(
    mask: Array | None, causal: bool, q_len: int, kv_len: int, shape: tuple[int, ...]
) -> Array | None:
    combined = None
    if mask is not None:
        mask = jnp.asarray(mask)
        if mask.dtype != jnp.bool_:
            raise ValueError(f"mask must be boolean (True = attend); got dtype {mask.dtype}")
        mask = _as_rank4(mask)
        _check_broadcastable("mask", mask, shape)
        combined = mask
    if causal:
        tri = causal_mask(q_len, kv_len)[None, None, :, :]
        combined = tri if combined is None else jnp.logical_and(combined, tri)
    return combined


def _as_rank4(x: Array) -> Array:
    """Prepend unit axes explicitly (the code must run with rank promotion set to raise)."""
    if x.ndim > 4:
        raise ValueError(f"expected at most 4 axes [batch, heads, q_len, kv_len]; got {x.shape}")
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def _check_qk(q: Array, k: Array) -> None:
    _check_rank("q", q, 4)
    _check_rank("k", k, 4)
    if q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(
            f"q has shape {q.shape} and k has shape {k.shape}; they must agree on batch, "
            "heads and head_dim ([batch, length, heads, head_dim])"
        )


def _check_rank(name: str, x: Array, rank: int) -> None:
    if jnp.ndim(x) != rank:
        raise ValueError(f"{name} must have rank {rank}; got shape {jnp.shape(x)}")


def _check_broadcastable(name: str, x: Array, shape: tuple[int, ...]) -> None:
    if any(a not in (1, b) for a, b in zip(x.shape, shape, strict=True)):
        raise ValueError(
            f"{name} has shape {x.shape}, which does not broadcast to [batch, heads, q_len, "
            f"kv_len] = {shape} (missing leading axes count as size 1)"
        )


def _check_positive_int(name: str, value: int) -> None:
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int; got {value!r}")
