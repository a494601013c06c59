"""Scaled dot-product attention as pure functions of arrays (no Flax, no state).

Layout (the one `jax.nn.dot_product_attention` uses)::

    q: [batch, q_len, heads, head_dim]      k, v: [batch, kv_len, kv_heads, head_dim]
    weights / bias / mask: [batch, heads, q_len, kv_len]  (broadcastable)

``kv_heads`` is ``heads`` (multi-head attention) or a divisor of it: grouped-query attention
(Ainslie et al. 2023, "GQA"; ``kv_heads = 1`` is multi-query attention, Shazeer 2019). Query
head ``h`` then attends with key/value head ``h // (heads / kv_heads)``, the order of Hugging
Face transformers' ``repeat_kv`` and of `jax.nn.dot_product_attention` (`repeat_kv`).

The formula is Vaswani et al. 2017, "Attention Is All You Need", Eq. 1::

    Attention(Q, K, V) = softmax(Q K^T * scale + bias) V,   scale = 1 / sqrt(head_dim)

Logits and the softmax are always computed in float32, whatever the input dtype, because
bfloat16 cannot resolve the small differences a softmax over long rows depends on (and on CPU,
`attend` computes bfloat16 / float16 inputs entirely in float32, see its docstring). Masks are
boolean with ``True`` meaning "may attend". A query row whose keys are all masked produces
zero weights and a zero output, never NaN.

Every function that takes ``causal`` also takes ``window``: a positive int W (only with
``causal=True``) restricting query ``i`` to keys ``i - W < j <= i``, its last W keys itself
included (`window_mask`). This is sliding-window ("local") causal attention as in Longformer
(Beltagy et al. 2020) and Mistral 7B (Jiang et al. 2023), and the blockwise-causal attention
xPos is evaluated with (Sun et al. 2022, "A Length-Extrapolatable Transformer"); the chunked
implementation then does ``O(length * W)`` work instead of ``O(length^2)``. They also take
``chunk``: a positive int C (only with ``causal=True``, not with a window) restricting query
``i`` to keys ``j <= i`` of its own block of C positions, ``floor(j / C) == floor(i / C)``
(`chunk_mask`): the block-local ("chunked") attention of Llama 4's RoPE layers (HF
transformers ``attention_chunk_size``); the chunked implementation skips the other blocks.

Three further options change the softmax row itself; every implementation honours them:

* ``sinks`` (gpt-oss; OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card", arXiv 2508.10925):
  a learned logit ``s_h`` per head joins every row of head ``h`` as one extra softmax column,
  dropped after the softmax: ``p_ij = exp(l_ij) / (exp(s_h) + sum_j' exp(l_ij'))``. It
  absorbs probability and contributes no value, so a row may put less than all of its weight
  on the keys (a row that sees no key gives zeros, as without sinks).
* ``keep_first`` (with a ``window``; StreamingLLM, Xiao et al. 2023, arXiv 2309.17453): query
  ``i`` also sees the first ``keep_first`` keys, ``j < k or i - W < j <= i`` (`streaming_mask`).
* ``forget_prefix`` (`attend` only; Forgetting Transformer, Lin et al. 2025, arXiv
  2503.02130): ``(c_q, c_k)``, prefix sums of log forget gates; logit ``(i, j)`` gets
  ``c_q[i] - c_k[j]`` (`flaxformer_lite.core.forgetting`), built per block by "chunked".
"""

from __future__ import annotations

import inspect
import logging

import jax
import jax.numpy as jnp

from flaxformer_lite.base.checks import check_positive_int
from flaxformer_lite.core import chunked_attention as _chunked
from flaxformer_lite.core import forgetting, mixed_precision
from flaxformer_lite.core.arrays import (
    MASKED_LOGIT,
    BiasFn,
    as_rank4,
    check_broadcastable,
    check_forget_prefix,
    check_mask,
    check_sinks,
)
from flaxformer_lite.core.chunked_attention import check_chunk, check_keep_first, check_window
from flaxformer_lite.core.positions import as_batched_positions

Array = jax.Array

# "xla": plain, materialises the [b, heads, q_len, kv_len] scores (causal self-attention as
# query blocks that skip the masked upper triangle, `causal_query_blocks`). "chunked": online
# softmax over blocks, O(length) memory, bias built per block (`chunked_attention`). "cudnn": the
# fused `jax.nn.dot_product_attention(implementation="cudnn")` kernel (NVIDIA GPU, fp16/bf16,
# no bias_fn), an error elsewhere. "auto": "cudnn" where it can run, else "chunked" when
# kv_len > chunked_threshold, else "xla".
IMPLEMENTATIONS = ("xla", "chunked", "cudnn", "auto")
# Above this many keys "auto" and `choose_implementation` pick "chunked" (one default for
# training, inference and evaluation; `ModelConfig.chunked_threshold` sets it per model): at
# 1024 tokens the plain scores are [heads, 1024, 1024] float32 = 4 MiB per head per batch row
# and fast; past it memory grows quadratically (docs/benchmarks.md, "Long-context attention").
DEFAULT_CHUNKED_THRESHOLD = 1024
# A forward pass alone (evaluation) chunks above this many keys when its model's threshold is
# higher: without a backward pass the online softmax beats the plain scores from about 768
# keys on CPU (1.8x at 1024 keys for a 9-head x 64 model), while a training step's forward +
# backward is still faster plain at 1024 (docs/performance.md, "Evaluating long windows").
FORWARD_CHUNKED_THRESHOLD = 768
_FUSED_DTYPES = (jnp.float16, jnp.bfloat16)
_logger = logging.getLogger(__name__)
_notices_given: set[str] = set()
_BIAS_REASON = (
    "the fused kernel cannot evaluate a positional bias_fn (the bias would have to be "
    "materialised as [batch, heads, q_len, kv_len])"
)
# jax.nn.dot_product_attention takes a sliding window as local_window_size=(left, right) in
# the JAX versions that have that argument; older ones cannot run a window fused.
_FUSED_HAS_WINDOW = (
    "local_window_size" in inspect.signature(jax.nn.dot_product_attention).parameters
)
_WINDOW_REASON = (
    "this JAX's jax.nn.dot_product_attention has no local_window_size argument (needed for "
    "a sliding window)"
)
_SOFTMAX_REASON = (
    "the fused kernel has no attention-sink column, StreamingLLM mask or forget-gate bias"
)


def repeat_kv(x: Array, num_heads: int) -> Array:
    """Key/value heads ``[batch, kv_len, kv_heads, head_dim]`` repeated to ``num_heads``:
    ``[batch, kv_len, num_heads, head_dim]`` whose head ``h`` is input head
    ``h // (num_heads / kv_heads)`` (HF transformers ``repeat_kv``; grouped-query attention,
    Ainslie et al. 2023). The input itself when ``kv_heads == num_heads``."""
    kv_heads = x.shape[2]
    if kv_heads == num_heads:
        return x
    if kv_heads < 1 or num_heads % kv_heads:
        raise ValueError(
            f"{kv_heads} key/value heads cannot serve {num_heads} query heads: the key/value "
            "head count must divide the query head count (grouped-query attention)"
        )
    return jnp.repeat(x, num_heads // kv_heads, axis=2)


def causal_mask(q_len: int, kv_len: int) -> Array:
    """Boolean ``[q_len, kv_len]`` mask, True where key ``j <= i`` for query ``i``.

    The triangle is aligned to the top-left corner (query 0 sees key 0), as in
    ``jax.nn.dot_product_attention(is_causal=True)``. For cached decoding, where queries sit
    at the end of a longer key sequence, build the mask from positions instead
    (`mask_from_positions`).
    """
    check_positive_int("q_len", q_len)
    check_positive_int("kv_len", kv_len)
    return jnp.arange(kv_len)[None, :] <= jnp.arange(q_len)[:, None]


def window_mask(q_len: int, kv_len: int, window: int) -> Array:
    """Boolean ``[q_len, kv_len]`` sliding-window causal mask: True where ``i - W < j <= i``.

    Query ``i`` sees its last ``window`` keys, itself included (``window=1``: only key ``i``;
    ``window >= kv_len``: `causal_mask`). Top-left aligned like `causal_mask`; local
    attention as in Longformer / Mistral, and the blockwise-causal attention xPos is
    evaluated with (Sun et al. 2022).
    """
    window = check_positive_int("window", window)
    causal = causal_mask(q_len, kv_len)
    return causal & (jnp.arange(kv_len)[None, :] > jnp.arange(q_len)[:, None] - window)


def streaming_mask(q_len: int, kv_len: int, *, window: int, keep_first: int) -> Array:
    """Boolean ``[q_len, kv_len]`` StreamingLLM mask: True where ``j <= i`` and (``j < k`` or
    ``i - W < j``), ``k = keep_first``, ``W = window``.

    Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks" (arXiv
    2309.17453): a model evaluated with a sliding window keeps the keys of the first ``k``
    tokens (4 in the paper), which absorb the attention mass a window would otherwise
    redistribute. Top-left aligned like `causal_mask`; by index, keys keep their true
    positions (the paper's re-numbering of positions inside its rolling cache is not part
    of the mask).
    """
    window = check_positive_int("window", window)
    keep_first = check_keep_first(keep_first, window)
    first = jnp.arange(kv_len)[None, :] < keep_first
    return window_mask(q_len, kv_len, window) | (causal_mask(q_len, kv_len) & first)


def chunk_mask(q_len: int, kv_len: int, chunk: int) -> Array:
    """Boolean ``[q_len, kv_len]`` block-local causal mask: True where ``j <= i`` and
    ``floor(j / C) == floor(i / C)``.

    Query ``i`` sees the keys of its own block of ``chunk`` positions up to itself (Llama 4's
    chunked attention, HF transformers ``attention_chunk_size``; ``chunk >= kv_len``:
    `causal_mask`). Top-left aligned like `causal_mask`.
    """
    chunk = check_positive_int("chunk", chunk)
    causal = causal_mask(q_len, kv_len)
    return causal & (jnp.arange(kv_len)[None, :] // chunk == jnp.arange(q_len)[:, None] // chunk)


def causal_span_mask(
    q_len: int,
    kv_len: int,
    *,
    window: int | None = None,
    chunk: int | None = None,
    keep_first: int | None = None,
) -> Array:
    """`causal_mask`, `window_mask` (``window``; `streaming_mask` with ``keep_first`` too) or
    `chunk_mask` (``chunk``): what causal self-attention with that span sees, ``[q_len,
    kv_len]`` bool."""
    if window is not None:
        if keep_first is not None:
            return streaming_mask(q_len, kv_len, window=window, keep_first=keep_first)
        return window_mask(q_len, kv_len, window)
    if chunk is not None:
        return chunk_mask(q_len, kv_len, chunk)
    return causal_mask(q_len, kv_len)


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

    Positions are int ``[length]`` or ``[batch, length]`` arrays (`as_batched_positions`).
    Equals `causal_mask` when both are ``0..L-1``; unlike it, stays correct for queries
    appended to a key-value cache.
    """
    q_positions = as_batched_positions(q_positions, name="q_positions")
    k_positions = as_batched_positions(k_positions, name="k_positions")
    return k_positions[:, None, None, :] <= q_positions[:, None, :, None]


def attention_logits(
    q: Array,
    k: Array,
    *,
    mask: Array | None = None,
    bias: Array | None = None,
    causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
    keep_first: int | None = None,
    chunk: int | None = None,
) -> tuple[Array, Array | None]:
    """Masked float32 logits ``[batch, heads, q_len, kv_len]`` and the combined boolean mask.

    Masked entries hold a large negative finite number. The mask returned is the
    broadcastable combination of ``mask`` and ``causal`` (`window_mask` or `chunk_mask`
    instead of `causal_mask` when a ``window`` or ``chunk`` is given, `streaming_mask` with a
    window and ``keep_first``; None if neither ``mask`` nor ``causal`` is given).
    """
    _check_qk(q, k)
    k_BSNH = repeat_kv(k, q.shape[2])
    window = check_window(window, causal)
    keep_first = check_keep_first(keep_first, window)
    chunk = check_chunk(chunk, causal, window)
    head_dim = q.shape[-1]
    scale = head_dim**-0.5 if scale is None else scale
    logits_BNTS = jnp.einsum("BTNH,BSNH->BNTS", q, k_BSNH, preferred_element_type=jnp.float32)
    logits_BNTS = logits_BNTS * jnp.float32(scale)
    if bias is not None:
        bias_BNTS = as_rank4(jnp.asarray(bias, dtype=jnp.float32), "bias")
        check_broadcastable("bias", bias_BNTS.shape, logits_BNTS.shape)
        logits_BNTS = logits_BNTS + bias_BNTS
    combined_BNTS = None if mask is None else check_mask(mask, logits_BNTS.shape)
    if causal:
        span_TS = causal_span_mask(
            q.shape[1], k_BSNH.shape[1], window=window, chunk=chunk, keep_first=keep_first
        )
        span_BNTS = span_TS[None, None]
        combined_BNTS = span_BNTS if combined_BNTS is None else combined_BNTS & span_BNTS
    if combined_BNTS is not None:
        logits_BNTS = jnp.where(combined_BNTS, logits_BNTS, jnp.float32(MASKED_LOGIT))
    return logits_BNTS, combined_BNTS


def attention_weights(
    q: Array,
    k: Array,
    v: Array | None = None,
    *,
    mask: Array | None = None,
    bias: Array | None = None,
    causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
    sinks: Array | None = None,
    keep_first: int | None = None,
    chunk: int | None = None,
) -> Array:
    """Attention probabilities ``[batch, heads, q_len, kv_len]`` in float32.

    Same arguments as `dot_product_attention` (``v`` is accepted and ignored so the two
    calls can share an argument list). Fully masked rows are all zeros. With ``sinks`` a
    row sums to ``1 - p_sink`` (the sink column is dropped).
    """
    del v
    sinks_N = check_sinks(sinks, q.shape[2])
    logits_BNTS, combined_BNTS = attention_logits(
        q,
        k,
        mask=mask,
        bias=bias,
        causal=causal,
        window=window,
        scale=scale,
        chunk=chunk,
        keep_first=keep_first,
    )
    zero_masked = mask is not None or window is not None or chunk is not None
    return _softmax(logits_BNTS, combined_BNTS, zero_masked=zero_masked, sinks_N=sinks_N)


def _softmax(
    logits_BNTS: Array,
    combined_BNTS: Array | None,
    *,
    zero_masked: bool,
    sinks_N: Array | None = None,
) -> Array:
    if sinks_N is None:
        weights_BNTS = jax.nn.softmax(logits_BNTS, axis=-1)
    else:
        # gpt-oss: the sink is one more column of the row's softmax, dropped afterwards
        sink_BNT1 = jnp.broadcast_to(sinks_N[None, :, None, None], (*logits_BNTS.shape[:3], 1))
        full_BNTS = jax.nn.softmax(jnp.concatenate([logits_BNTS, sink_BNT1], axis=-1), axis=-1)
        weights_BNTS = full_BNTS[..., :-1]
    if zero_masked:
        # Zero out masked entries; for an all-masked row the softmax was uniform over
        # identical sentinel logits, so this also turns that row into zeros. A causal mask
        # alone needs no pass: it never hides a whole row (every query sees key 0) and its
        # entries are already exactly 0 (exp(-1e30 - max) underflows). A window can hide
        # whole rows (query i >= kv_len + W - 1 sees no key), and so can a chunk.
        weights_BNTS = jnp.where(combined_BNTS, weights_BNTS, jnp.float32(0.0))
    return weights_BNTS


def _weighted_values(weights_BNTS: Array, v_BSNH: Array) -> Array:
    """Weights ``[b, heads, q, k]`` times ``v`` ``[b, k, heads, d]``: ``[b, q, heads, d]``."""
    out_BTNH = jnp.einsum(
        "BNTS,BSNH->BTNH",
        weights_BNTS.astype(v_BSNH.dtype),
        v_BSNH,
        preferred_element_type=jnp.float32,
    )
    return out_BTNH.astype(v_BSNH.dtype)


def dot_product_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None = None,
    bias: Array | None = None,
    causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
    sinks: Array | None = None,
    keep_first: int | None = None,
    chunk: int | None = None,
) -> Array:
    """``softmax(q k^T * scale + bias) v`` for ``[batch, length, heads, head_dim]`` inputs.

    Args:
      q: ``[batch, q_len, heads, head_dim]``.
      k: ``[batch, kv_len, kv_heads, head_dim]``, ``kv_heads`` dividing ``heads``
        (grouped-query attention, `repeat_kv`).
      v: ``[batch, kv_len, kv_heads, head_dim]``.
      mask: optional bool, broadcastable to ``[batch, heads, q_len, kv_len]`` (missing
        leading axes count as size 1, e.g. a ``[q_len, kv_len]`` mask); True = attend.
      bias: optional additive logit bias broadcastable to the same shape (added in float32).
      causal: also apply `causal_mask` (query i sees keys j <= i).
      window: optional positive int W, only with ``causal=True``: sliding-window causal
        attention, query i sees keys ``i - W < j <= i`` (`window_mask` replaces
        `causal_mask`). Longformer / Mistral-style local attention; the blockwise-causal
        attention xPos is evaluated with (Sun et al. 2022).
      scale: logit scale; defaults to ``1/sqrt(head_dim)`` (Vaswani et al. 2017, §3.2.1).
      sinks: optional float ``[heads]``, one sink logit per query head (gpt-oss): an extra
        softmax column ``s_h`` (not scaled, no value), dropped after the softmax.
      keep_first: optional positive int k, only with a ``window``: query i also sees keys
        ``j < k`` (StreamingLLM, `streaming_mask`).
      chunk: optional positive int C, only with ``causal=True`` and no window: block-local
        causal attention, query i sees keys ``j <= i`` with ``j // C == i // C``
        (`chunk_mask`; Llama 4's chunked attention).

    Returns:
      ``[batch, q_len, heads, head_dim]`` in ``v.dtype``. Rows with no visible key are zeros.
    """
    _check_v(v, k)
    weights_BNTS = attention_weights(
        q,
        k,
        mask=mask,
        bias=bias,
        causal=causal,
        window=window,
        scale=scale,
        sinks=sinks,
        keep_first=keep_first,
        chunk=chunk,
    )
    return _weighted_values(weights_BNTS, repeat_kv(v, q.shape[2]))


def causal_query_blocks(length: int) -> int:
    """How many query blocks the "xla" implementation splits causal self-attention into.

    Query block ``[lo, hi)`` can only see keys ``[0, hi)``, so with ``n`` equal blocks the score
    products, the softmax and their gradients cover ``(n + 1) / 2n`` of the full square (3/4
    for 2 blocks, 5/8 for 4) instead of computing the masked upper triangle and discarding it.
    The result is the same function (each row's softmax runs over the keys it can see; the
    keys it skips had weight exactly 0), equal to float32 rounding; the skipped work makes the
    training step faster (docs/performance.md §Attention). More blocks mean more, smaller
    products and longer compiles, so 4 blocks from 256 tokens, 2 from 64, below that one.
    """
    length = check_positive_int("length", length)
    return 4 if length >= 256 else 2 if length >= 64 else 1


def materialised_bias(
    q_positions: Array,
    k_positions: Array,
    bias_fn: BiasFn | None,
    forget_prefix: tuple[Array, Array] | None,
) -> Array | None:
    """The logit bias `attend` adds, as one ``[batch, heads, q_len, kv_len]`` array:
    ``bias_fn(q_positions, k_positions)`` plus FoX's ``c_q[i] - c_k[j]`` of ``forget_prefix =
    (c_q, c_k)`` (`forgetting.forgetting_bias`); None without either."""
    bias_BNTS = None if bias_fn is None else bias_fn(q_positions, k_positions)
    if forget_prefix is not None:
        fox_BNTS = forgetting.forgetting_bias(*forget_prefix)
        bias_BNTS = fox_BNTS if bias_BNTS is None else bias_BNTS + fox_BNTS
    return bias_BNTS


def _blocked_causal_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    q_positions: Array,
    k_positions: Array,
    bias_fn: BiasFn | None,
    mask: Array | None,
    scale: float | None,
    blocks: int,
    sinks_N: Array | None = None,
    forget_prefix: tuple[Array, Array] | None = None,
) -> Array:
    """Causal self-attention (``q_len == kv_len``) as ``blocks`` query blocks, each against the
    keys up to its last query (`causal_query_blocks`); the rest as `dot_product_attention`."""
    length = q.shape[1]
    k_BSNH, v_BSNH = repeat_kv(k, q.shape[2]), repeat_kv(v, q.shape[2])
    mask_BNTS = None
    if mask is not None:
        mask_BNTS = check_mask(mask, (q.shape[0], q.shape[2], length, length))
    outs_BtNH = []
    for i in range(blocks):
        lo, hi = i * length // blocks, (i + 1) * length // blocks
        block_mask_BNtS = causal_mask(hi, hi)[lo:][None, None]  # rows lo..hi-1 of the triangle
        if mask_BNTS is not None:
            mask_BNtS = mask_BNTS[:, :, lo:hi] if mask_BNTS.shape[2] > 1 else mask_BNTS
            mask_BNtS = mask_BNtS[..., :hi] if mask_BNTS.shape[3] > 1 else mask_BNtS
            block_mask_BNtS = jnp.logical_and(mask_BNtS, block_mask_BNtS)
        fox = None  # FoX's prefix sums of this block's queries and its keys
        if forget_prefix is not None:
            fox = (forget_prefix[0][:, lo:hi], forget_prefix[1][:, :hi])
        bias_BNtS = materialised_bias(q_positions[:, lo:hi], k_positions[:, :hi], bias_fn, fox)
        logits_BNtS, combined_BNtS = attention_logits(
            q[:, lo:hi], k_BSNH[:, :hi], mask=block_mask_BNtS, bias=bias_BNtS, scale=scale
        )
        # as in `attention_weights`: the causal part never hides a whole row (query lo + r
        # sees key 0), so only a caller's mask needs the zeroing pass
        weights_BNtS = _softmax(
            logits_BNtS, combined_BNtS, zero_masked=mask_BNTS is not None, sinks_N=sinks_N
        )
        outs_BtNH.append(_weighted_values(weights_BNtS, v_BSNH[:, :hi]))
    return jnp.concatenate(outs_BtNH, axis=1)


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
    window: int | None = None,
    scale: float | None = None,
    implementation: str = "xla",
    chunked_threshold: int = DEFAULT_CHUNKED_THRESHOLD,
    sinks: Array | None = None,
    keep_first: int | None = None,
    forget_prefix: tuple[Array, Array] | None = None,
    chunk: int | None = None,
) -> Array:
    """The one attention entry point the layers call; positions make the bias a function.

    ``bias_fn(q_positions, k_positions)`` is evaluated by the chosen implementation, so an
    implementation that works block by block can build the bias per block instead of as one
    ``[q_len, kv_len]`` array.

    Args:
      q, k, v: as in `dot_product_attention`; ``k`` and ``v`` may have fewer heads than
        ``q`` (grouped-query attention: every implementation shares key/value head ``h //
        (heads / kv_heads)`` with query head ``h``; the fused kernel natively, the others
        through `repeat_kv`).
      q_positions: int ``[q_len]`` or ``[batch, q_len]``; k_positions: int ``[kv_len]`` or
        ``[batch, kv_len]`` (a ``[length]`` array, e.g. ``jnp.arange(L)``, is shared by the
        batch). Every implementation accepts both; ``bias_fn`` gets ``[batch or 1, length]``.
      bias_fn: optional positional logit bias (ALiBi, T5, ...), see `BiasFn`.
      mask, causal, window, scale: as in `dot_product_attention`. Every implementation
        applies the ``window``; "chunked" then skips the key blocks outside it
        (``O(length * W)`` work), the fused kernel gets ``local_window_size=(W - 1, 0)``.
      chunk: as in `dot_product_attention` (block-local causal attention); "chunked" skips
        the key blocks of other chunks (``O(length * C)`` work), the fused kernel gets it as
        a boolean mask.
      implementation: one of `IMPLEMENTATIONS`: "xla" materialises the scores (causal
        self-attention without a window as `causal_query_blocks` query blocks); "chunked"
        is `chunked_attention.chunked_attention` (O(length) memory, bias per block);
        "cudnn" is the fused GPU kernel (no bias_fn, fp16/bf16; a ValueError elsewhere);
        "auto" takes the fused kernel where it can run, else "chunked" above
        ``chunked_threshold`` keys, else "xla", logging the reason once.
      chunked_threshold: the key count above which "auto" chunks (`choose_implementation`).
      sinks, keep_first: as in `dot_product_attention` (gpt-oss sinks; StreamingLLM's first
        keys with a window); "chunked" seeds its running max and denominator with the sink.
      forget_prefix: optional ``(c_q [batch or 1, q_len, heads], c_k [batch or 1, kv_len,
        heads])``, float prefix sums of log forget gates (`forgetting.forget_prefix`): logit
        ``(i, j)`` gets ``c_q[i] - c_k[j]`` (FoX, Lin et al. 2025). "chunked" builds it per
        block, never as ``[q_len, kv_len]``. Neither the fused kernel's.

    All implementations agree to float32 tolerance; masked-out rows are zeros in each.

    bfloat16 / float16 ``q``, ``k``, ``v`` with "xla" on CPU are computed in float32 (products
    included) and the output rounded to ``v.dtype``: XLA:CPU has no fast low-precision path for
    the gradient of this function (its products take float32 cotangents, the per-block key
    gradients are summed in bfloat16 one rounded add at a time), so float32 is both more
    accurate and faster there (docs/performance.md §Attention). On GPU / TPU the
    low-precision products stay.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"implementation={implementation!r} is not known; allowed: {list(IMPLEMENTATIONS)}"
        )
    window = check_window(window, causal)
    keep_first = check_keep_first(keep_first, window)
    chunk = check_chunk(chunk, causal, window)
    _check_qk(q, k)
    sinks_N = check_sinks(sinks, q.shape[2])
    forget_prefix = check_forget_prefix(forget_prefix, q.shape, k.shape[1])
    softmax_extras = sinks_N is not None or keep_first is not None or forget_prefix is not None
    batch = q.shape[0]
    q_positions = as_batched_positions(
        q_positions, name="q_positions", length=q.shape[1], batch=batch
    )
    k_positions = as_batched_positions(
        k_positions, name="k_positions", length=k.shape[1], batch=batch
    )
    if implementation in ("auto", "cudnn"):
        masking = {"mask": mask, "causal": causal, "window": window, "scale": scale, "chunk": chunk}
        out_BTNH, reason = _try_fused(
            implementation,
            q,
            k,
            v,
            has_bias=bias_fn is not None,
            softmax_extras=softmax_extras,
            **masking,
        )
        if out_BTNH is not None:
            return out_BTNH
        implementation = choose_implementation(
            "xla", q.shape[1], k.shape[1], threshold=chunked_threshold
        )
        _notice_once(
            reason,
            f"attention implementation='auto' does not use the fused kernel: {reason}; "
            f"using {implementation!r} (chunked above {chunked_threshold} keys).",
            # Only the bias costs a user a kernel the hardware has: make that one visible.
            level=logging.WARNING if reason.startswith(_BIAS_REASON) else logging.INFO,
        )
    if implementation == "chunked":
        # the chunked kernel takes one head per query head: share the key/value heads first
        return _chunked.chunked_attention(
            q,
            repeat_kv(k, q.shape[2]),
            repeat_kv(v, q.shape[2]),
            q_positions=q_positions,
            k_positions=k_positions,
            bias_fn=bias_fn,
            mask=mask,
            causal=causal,
            window=window,
            scale=scale,
            sinks=sinks_N,
            keep_first=keep_first,
            forget_prefix=forget_prefix,
            chunk=chunk,
        )

    def materialised(q: Array, k: Array, v: Array) -> Array:
        if causal and window is None and chunk is None and q.shape[1] == k.shape[1]:
            blocks = causal_query_blocks(q.shape[1])
            if blocks > 1:
                _check_v(v, k)
                return _blocked_causal_attention(
                    q,
                    k,
                    v,
                    q_positions=q_positions,
                    k_positions=k_positions,
                    bias_fn=bias_fn,
                    mask=mask,
                    scale=scale,
                    blocks=blocks,
                    sinks_N=sinks_N,
                    forget_prefix=forget_prefix,
                )
        return dot_product_attention(
            q,
            k,
            v,
            mask=mask,
            bias=materialised_bias(q_positions, k_positions, bias_fn, forget_prefix),
            causal=causal,
            window=window,
            scale=scale,
            sinks=sinks_N,
            keep_first=keep_first,
            chunk=chunk,
        )

    if not any(mixed_precision.is_low_precision(x.dtype) for x in (q, k, v)):
        return materialised(q, k, v)

    def in_float32(q: Array, k: Array, v: Array) -> Array:
        f32 = jnp.float32
        return materialised(q.astype(f32), k.astype(f32), v.astype(f32)).astype(v.dtype)

    # bfloat16 / float16 on CPU: computed in float32 (`attend`'s docstring)
    return jax.lax.platform_dependent(q, k, v, cpu=in_float32, default=materialised)


def choose_implementation(
    requested: str, q_len: int, kv_len: int, *, threshold: int = DEFAULT_CHUNKED_THRESHOLD
) -> str:
    """The implementation to evaluate ``q_len`` queries against ``kv_len`` keys with.

    "xla" becomes "chunked" when ``kv_len > threshold`` (default `DEFAULT_CHUNKED_THRESHOLD`
    = 1024 keys) and ``q_len > 1``: the two agree to float32 tolerance, and past the threshold the
    plain scores ``[batch, heads, q_len, kv_len]`` dominate memory (16k tokens need ~16 GB).
    Single-query decoding steps keep "xla" (their scores are one row). "chunked" and
    "cudnn" are explicit choices and "auto" resolves itself per call in `attend` with the
    same rule, so all three are returned unchanged.
    """
    if requested not in IMPLEMENTATIONS:
        raise ValueError(
            f"implementation={requested!r} is not known; allowed: {list(IMPLEMENTATIONS)}"
        )
    check_positive_int("q_len", q_len)
    check_positive_int("kv_len", kv_len)
    check_positive_int("threshold", threshold)
    if requested == "xla" and kv_len > threshold and q_len > 1:
        return "chunked"
    return requested


def _fused_unavailable_reason(
    backend: str,
    dtypes: tuple[jnp.dtype, ...],
    *,
    has_bias: bool,
    has_window: bool = False,
    softmax_extras: bool = False,
) -> str | None:
    """Why `jax.nn.dot_product_attention(implementation="cudnn")` cannot run, or None."""
    if backend not in ("gpu", "cuda"):
        return f"backend {backend!r} has no fused attention kernel (cuDNN needs an NVIDIA GPU)"
    names = sorted({jnp.dtype(dt).name for dt in dtypes})
    if any(jnp.dtype(dt) not in _FUSED_DTYPES for dt in dtypes) or len(names) > 1:
        return f"the fused kernel needs float16 or bfloat16 q, k, v of one dtype; got {names}"
    if has_bias:
        return _BIAS_REASON
    if softmax_extras:
        return _SOFTMAX_REASON
    if has_window and not _FUSED_HAS_WINDOW:
        return _WINDOW_REASON
    return None


def _try_fused(
    implementation: str,
    q: Array,
    k: Array,
    v: Array,
    *,
    has_bias: bool,
    softmax_extras: bool = False,
    **kwargs,
) -> tuple[Array | None, str | None]:
    """`_fused_attention` for "cudnn" / "auto": ``(output, None)``, or ``(None, reason)``.

    "cudnn" raises where "auto" returns the reason (to fall back): the kernel cannot run
    here (`_fused_unavailable_reason`), or it rejected the call. ``kwargs`` are `attend`'s
    ``mask, causal, window, scale, chunk``.
    """
    reason = _fused_unavailable_reason(
        jax.default_backend(),
        (q.dtype, k.dtype, v.dtype),
        has_bias=has_bias,
        has_window=kwargs["window"] is not None,
        softmax_extras=softmax_extras,
    )
    if reason is None:
        try:
            return _fused_attention(q, k, v, **kwargs), None
        except (ValueError, NotImplementedError, RuntimeError) as err:
            if implementation == "cudnn":
                raise
            return None, f"the fused kernel rejected the call ({type(err).__name__}: {err})"
    if implementation == "cudnn":
        raise ValueError(
            f"implementation='cudnn' cannot run here: {reason}. Use 'auto' (falls back "
            "automatically), 'chunked' or 'xla'."
        )
    return None, reason


def _fused_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Array | None,
    causal: bool,
    scale: float | None,
    window: int | None = None,
    kernel: str = "cudnn",
    chunk: int | None = None,
) -> Array:
    """`jax.nn.dot_product_attention` with this module's conventions for masked rows.

    The fused kernel turns a boolean mask into a large negative bias, so a row with no
    visible key would average all values; such rows are set to zero here, as in
    `dot_product_attention`. A ``window`` W becomes ``local_window_size=(W - 1, 0)`` with
    ``is_causal=True``: key ``j`` is visible from query ``i`` iff ``i - (W - 1) <= j <= i``.
    A ``chunk`` C becomes part of the boolean mask (`chunk_mask`; the kernel has no
    block-local mode). ``kernel="xla"`` runs the same code path on any backend (tests).
    """
    _check_qk(q, k)
    window = check_window(window, causal)
    chunk = check_chunk(chunk, causal, window)
    if window is not None and not _FUSED_HAS_WINDOW:
        raise NotImplementedError(_WINDOW_REASON)
    shape = (q.shape[0], q.shape[2], q.shape[1], k.shape[1])
    mask_BNTS = None if mask is None else check_mask(mask, shape)
    if chunk is not None:
        chunk_BNTS = chunk_mask(q.shape[1], k.shape[1], chunk)[None, None]
        mask_BNTS = chunk_BNTS if mask_BNTS is None else mask_BNTS & chunk_BNTS
    kwargs = {} if window is None else {"local_window_size": (window - 1, 0)}
    out_BTNH = jax.nn.dot_product_attention(
        q, k, v, mask=mask_BNTS, scale=scale, is_causal=causal, implementation=kernel, **kwargs
    )
    if mask_BNTS is not None or window is not None:
        # [mb, mh, q_len or 1]: the rows that see a key
        visible_BNT = _visible_rows(mask_BNTS, causal, window, q.shape[1], k.shape[1])
        out_BTNH = jnp.where(
            jnp.swapaxes(visible_BNT, 1, 2)[..., None], out_BTNH, jnp.zeros((), out_BTNH.dtype)
        )
    return out_BTNH


def _visible_rows(
    mask_BNTS: Array | None, causal: bool, window: int | None, q_len: int, kv_len: int
) -> Array:
    """Bool ``[mb, mh, q_len or 1]``: the query row sees at least one key.

    ``mask_BNTS`` is None only with a window (which hides rows ``i >= kv_len + W - 1``).
    """
    if not causal:
        return jnp.any(mask_BNTS, axis=-1)
    if mask_BNTS is None:
        mask_BNTS = jnp.ones((1, 1, 1, kv_len), bool)
    if mask_BNTS.shape[2] > 1:  # the mask is already [.., q_len, kv_len]-sized
        index = causal_mask(q_len, kv_len) if window is None else window_mask(q_len, kv_len, window)
        return jnp.any(mask_BNTS & index[None, None, :, :], axis=-1)
    # Row i sees keys max(0, i - W + 1)..min(i, kv_len - 1) (no window: from 0): visible iff
    # one of them is unmasked, i.e. the count of unmasked keys up to each end differs.
    keys_BNS = jnp.broadcast_to(mask_BNTS[:, :, 0, :], (*mask_BNTS.shape[:2], kv_len))
    counts_BNS = jnp.pad(jnp.cumsum(keys_BNS.astype(jnp.int32), axis=-1), ((0, 0), (0, 0), (1, 0)))
    rows = jnp.arange(q_len)
    hi = jnp.minimum(rows + 1, kv_len)  # counts[..., n] = unmasked keys among 0..n-1
    lo = jnp.zeros_like(rows) if window is None else jnp.clip(rows - window + 1, 0, kv_len)
    lo = jnp.minimum(lo, hi)
    return jnp.take(counts_BNS, hi, axis=-1) > jnp.take(counts_BNS, lo, axis=-1)


def _notice_once(reason: str, message: str, *, level: int = logging.INFO) -> None:
    """Log ``message`` the first time ``reason`` occurs in this process."""
    if reason not in _notices_given:
        _notices_given.add(reason)
        _logger.log(level, message)


def _check_v(v: Array, k: Array) -> None:
    _check_rank("v", v, 4)
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"v has shape {v.shape} but k has shape {k.shape}; they must agree on "
            "[batch, kv_len, heads]"
        )


def _check_qk(q: Array, k: Array) -> None:
    _check_rank("q", q, 4)
    _check_rank("k", k, 4)
    if (
        q.shape[0] != k.shape[0]
        or q.shape[3] != k.shape[3]
        or k.shape[2] < 1
        or q.shape[2] % k.shape[2]
    ):
        raise ValueError(
            f"q has shape {q.shape} and k has shape {k.shape}; they must agree on batch "
            "and head_dim, and k's heads must divide q's (grouped-query attention) "
            "([batch, length, heads, head_dim])"
        )


def _check_rank(name: str, x: Array, rank: int) -> None:
    if jnp.ndim(x) != rank:
        raise ValueError(f"{name} must have rank {rank}; got shape {jnp.shape(x)}")
