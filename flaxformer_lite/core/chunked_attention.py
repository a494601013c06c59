"""Memory-efficient attention: an online softmax over query and key blocks (pure JAX, no Flax).

Computes exactly what `attention.dot_product_attention` computes, ``softmax(q k^T * scale +
bias) v`` with boolean masks, without ever holding a ``[q_len, kv_len]`` array: queries are
processed ``block_q`` rows at a time, and for each query block the keys and values are
visited ``block_k`` at a time while a running maximum ``m``, a running normaliser ``l`` and an
unnormalised output ``acc`` are rescaled as new maxima appear::

    m'   = max(m, rowmax(S_j))                     S_j = Q_i K_j^T * scale + bias(i, j)
    l'   = l * exp(m - m') + rowsum(exp(S_j - m'))
    acc' = acc * exp(m - m') + exp(S_j - m') V_j         out_i = acc / l

(Rabe & Staats 2021, "Self-attention Does Not Need O(n^2) Memory", arXiv 2112.05682; Dao et al.
2022, "FlashAttention", arXiv 2205.14135, Algorithm 1; the loop order -- query blocks outside,
key blocks inside -- is FlashAttention-2's, Dao 2023, arXiv 2307.08691.)

* The positional bias is a *function* of positions, ``bias_fn(q_positions_block,
  k_positions_block) -> [b, heads, block_q, block_k]``, evaluated per block.
* With ``causal=True`` the key blocks strictly above the diagonal are never visited (the inner
  loop's trip count depends on the query block), and blocks strictly below it skip the
  causal ``where``; only blocks cut by the diagonal are masked.
* With a ``window`` W (sliding-window / local causal attention as in Longformer and Mistral,
  and the blockwise-causal attention xPos is evaluated with, Sun et al. 2022: query ``i``
  sees keys ``i - W < j <= i``) the key blocks entirely before every query's window are
  skipped too (the loop starts at the query block's first needed key block), so the forward
  pass costs ``O(length * W)`` instead of ``O(length^2)``; blocks cut by the window's lower
  edge are masked, blocks entirely inside it are not. The backward pass skips the query
  blocks outside each key block's band the same way.
* With a ``chunk`` C (block-local causal attention, Llama 4: query ``i`` sees keys ``j <= i``
  with ``floor(j / C) == floor(i / C)``) the key blocks before the first query's chunk are
  skipped likewise (``O(length * C)`` work), and in the backward pass the query blocks after
  each key block's chunk.
* Reverse mode is a `jax.custom_vjp` that saves only ``q, k, v``, the output and the
  per-row log-sum-exp ``[b, heads, q_len]`` and recomputes the block scores in the backward
  pass (FlashAttention Algorithm 2 / FlashAttention-2 Algorithm 2), so training memory is
  ``O(length)`` too. Parameters a ``bias_fn`` closes over (a learned T5 / FIRE bias) get
  their gradients: they are hoisted with `jax.closure_convert` and differentiated per block.

* Attention sinks (gpt-oss: a learned logit ``s_h`` per head, one more softmax column that
  carries no value) seed the online softmax: ``m = s_h``, ``l = 1``, ``acc = 0`` before the
  first key block. The saved log-sum-exp then includes the sink, so the backward pass needs
  no change for q, k, v; the sink's own gradient is ``-sum_i p_sink(i) * D_i`` with
  ``p_sink(i) = exp(s_h - lse_i)`` and ``D_i = rowsum(dO_i * O_i)``.
* StreamingLLM's mask (``keep_first`` k with a window W: keys ``j < k`` or ``i - W < j <=
  i``) visits the key blocks holding the first k keys as well as the window's.
* FoX's forget-gate bias ``c_q[i] - c_k[j]`` (``forget_prefix``, prefix sums of log forget
  gates; Lin et al. 2025, arXiv 2503.02130) is added per block from the two slices of the
  prefix sums; its gradients are the row and (negated) column sums of ``dS``.

Logits, running max and sum are float32 whatever the input dtype; the output has ``v.dtype``.
A query row with no visible key gives zeros, never NaN.
"""

from __future__ import annotations

import functools
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from flaxformer_lite.base.checks import check_positive_int
from flaxformer_lite.core.arrays import (
    MASKED_LOGIT,
    BiasFn,
    check_broadcastable,
    check_forget_prefix,
    check_mask,
    check_sinks,
)
from flaxformer_lite.core.positions import as_batched_positions

Array = jax.Array

DEFAULT_BLOCK_Q = 256
DEFAULT_BLOCK_K = 512
_F32 = jnp.float32


def chunked_attention(
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
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
    sinks: Array | None = None,
    keep_first: int | None = None,
    forget_prefix: tuple[Array, Array] | None = None,
    chunk: int | None = None,
) -> Array:
    """Blockwise ``softmax(q k^T * scale + bias_fn(q_pos, k_pos)) v`` in ``O(length)`` memory.

    Args:
      q: ``[batch, q_len, heads, head_dim]``.
      k, v: ``[batch, kv_len, heads, head_dim]``.
      q_positions: int ``[q_len]`` or ``[batch or 1, q_len]``; k_positions: int ``[kv_len]``
        or ``[batch or 1, kv_len]`` (e.g. ``jnp.arange(L)``). Only ``bias_fn`` reads them;
        the causal mask is by index (as `attention.causal_mask`).
      bias_fn: optional ``bias_fn(q_positions_block [b, bq], k_positions_block [b, bk])``
        returning a float logit bias broadcastable to ``[batch, heads, bq, bk]`` (4 axes),
        e.g. ``lambda qp, kp: attention_bias.alibi_bias(qp, kp, slopes)``. Called once per
        visited block, never on the full lengths.
      mask: optional bool broadcastable to ``[batch, heads, q_len, kv_len]`` (missing leading
        axes count as size 1); True = attend. Sliced per block, so a key-padding mask
        ``[batch, 1, 1, kv_len]`` costs ``O(kv_len)``.
      causal: query ``i`` sees key ``j`` iff ``j <= i`` (top-left aligned).
      window: optional positive int W, only with ``causal=True``: query ``i`` sees key ``j``
        iff ``i - W < j <= i`` (its last W keys, itself included; `check_window`). Key
        blocks outside every query's window are never visited: ``O(q_len * W)`` work.
      scale: logit scale, a Python number; default ``1/sqrt(head_dim)``.
      chunk: optional positive int C, only with ``causal=True`` and no window: query ``i``
        sees key ``j`` iff ``j <= i`` and ``j // C == i // C`` (`check_chunk`). Key blocks of
        other chunks are never visited: ``O(q_len * C)`` work.
      block_q, block_k: block sizes, clipped to the lengths. Lengths that are not a multiple
        are padded, and the padding is masked.
      sinks: optional float ``[heads]`` sink logits (gpt-oss): an extra softmax column per
        row, no value; seeds the running max and denominator. Differentiable.
      keep_first: optional positive int k, only with a ``window``: query ``i`` also sees keys
        ``j < k`` (StreamingLLM, arXiv 2309.17453); their key blocks are visited too.
      forget_prefix: optional ``(c_q [batch or 1, q_len, heads], c_k [batch or 1, kv_len,
        heads])`` float prefix sums of log forget gates: logit ``(i, j)`` gets ``c_q[i] -
        c_k[j]`` (FoX), built per block. Differentiable.

    Returns:
      ``[batch, q_len, heads, head_dim]`` in ``v.dtype``; rows with no visible key are zeros.
    """
    q_positions, k_positions = _check_inputs(q, k, v, q_positions, k_positions)
    batch, q_len, heads, head_dim = q.shape
    kv_len = k.shape[1]
    mask_BNTS = None if mask is None else check_mask(mask, (batch, heads, q_len, kv_len))
    window = check_window(window, causal)
    keep_first = check_keep_first(keep_first, window)
    sinks_N = check_sinks(sinks, heads)
    forget_prefix = check_forget_prefix(forget_prefix, q.shape, kv_len)
    chunk = check_chunk(chunk, causal, window)
    block_q = check_positive_int("block_q", block_q)
    block_k = check_positive_int("block_k", block_k)
    scale = head_dim**-0.5 if scale is None else scale
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise ValueError(f"scale must be a Python number (static); got {scale!r}")
    cfg = _Config(
        q_len,
        kv_len,
        *_blocking(q_len, kv_len, block_q, block_k),
        causal=bool(causal),
        scale=float(scale),
        mask_q=mask_BNTS is not None and mask_BNTS.shape[2] > 1,
        mask_k=mask_BNTS is not None and mask_BNTS.shape[3] > 1,
        window=window or 0,
        keep_first=keep_first or 0,
        chunk=chunk or 0,
    )
    q_pad, k_pad = cfg.nq * cfg.q_block_len, cfg.nk * cfg.k_block_len  # padded lengths
    if cfg.mask_q:  # the padding is masked
        mask_BNTS = _pad_axis(mask_BNTS, 2, q_pad, False)
    if cfg.mask_k:
        mask_BNTS = _pad_axis(mask_BNTS, 3, k_pad, False)
    # [b, L, h, d] -> [b, h, L_padded, d]: blocks are slices along axis 2.
    q_BNTH = _pad_axis(jnp.swapaxes(q, 1, 2), 2, q_pad, 0)
    k_BNSH = _pad_axis(jnp.swapaxes(k, 1, 2), 2, k_pad, 0)
    v_BNSH = _pad_axis(jnp.swapaxes(v, 1, 2), 2, k_pad, 0)
    qpos_BT = _pad_axis(jnp.asarray(q_positions), 1, q_pad, "edge")
    kpos_BS = _pad_axis(jnp.asarray(k_positions), 1, k_pad, "edge")
    converted, consts = _convert_bias_fn(
        bias_fn, qpos_BT[:, : cfg.q_block_len], kpos_BS[:, : cfg.k_block_len], batch, heads
    )
    fox = None
    if forget_prefix is not None:  # [b or 1, L, h] -> [b, h, L_padded] (batch for its gradient)
        fox = tuple(
            _pad_axis(jnp.swapaxes(jnp.broadcast_to(c, (batch, *c.shape[1:])), 1, 2), 2, n, 0.0)
            for c, n in zip(forget_prefix, (q_pad, k_pad), strict=True)
        )
    extras = (sinks_N, fox)
    out_BNTH = _attention(
        cfg, converted, q_BNTH, k_BNSH, v_BNSH, qpos_BT, kpos_BS, mask_BNTS, consts, extras
    )
    return jnp.swapaxes(out_BNTH[:, :, :q_len], 1, 2)


def kv_blocks_visited(
    q_len: int,
    kv_len: int,
    *,
    causal: bool,
    window: int | None = None,
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
    keep_first: int | None = None,
    chunk: int | None = None,
) -> list[int]:
    """Number of key blocks the forward pass visits for each query block (for docs/tests).

    Causal: ``min(nk, ((i + 1) * bq - 1) // bk + 1)`` for query block ``i``, i.e. about half
    of the ``nq * nk`` blocks at ``q_len == kv_len``; otherwise all ``nk``. With a
    ``window`` W the blocks before ``max(0, (i * bq - W + 1) // bk)`` are skipped as well: a
    query block needs keys ``i * bq - W + 1 .. (i + 1) * bq - 1``, which lie in at most
    ``(bq + W - 3) // bk + 2`` key blocks whatever the length, so the total is
    ``O(q_len * W / bk)`` (at ``bq = bk = W = 512``: 2 per query block, 1 for the first).
    With a ``chunk`` C the blocks before the one holding ``floor(i * bq / C) * C`` (the
    first key of the first query's chunk) are skipped. With ``keep_first`` k (StreamingLLM)
    the blocks before the window that hold keys ``j < k`` are visited too (`_first_blocks`).
    """
    window = check_window(window, causal)
    keep_first = check_keep_first(keep_first, window)
    chunk = check_chunk(chunk, causal, window)
    cfg = _Config(
        q_len,
        kv_len,
        *_blocking(q_len, kv_len, block_q, block_k),
        causal,
        1.0,
        window=window or 0,
        keep_first=keep_first or 0,
        chunk=chunk or 0,
    )
    return [
        max(0, int(_kv_end(cfg, i)) - int(_kv_start(cfg, i))) + int(_first_blocks(cfg, i))
        for i in range(cfg.nq)
    ]


def _blocking(q_len: int, kv_len: int, block_q: int, block_k: int) -> tuple[int, int, int, int]:
    """``(q_block_len, k_block_len, nq, nk)``: block sizes clipped to the lengths, and block
    counts (the last block padded)."""
    q_block_len, k_block_len = min(block_q, q_len), min(block_k, kv_len)
    return q_block_len, k_block_len, -(-q_len // q_block_len), -(-kv_len // k_block_len)


def check_window(window, causal: bool) -> int | None:
    """``window`` as an int (or None): a positive int, and only together with ``causal=True``.

    The one rule for every attention implementation (`attention.attend` and friends): with
    window W, query ``i`` attends to key ``j`` iff ``i - W < j <= i``.
    """
    if window is None:
        return None
    window = check_positive_int("window", window)
    if not causal:
        raise ValueError(
            f"window={window}: a sliding window needs causal=True (query i sees keys "
            "i - window < j <= i)"
        )
    return window


def check_keep_first(keep_first, window: int | None) -> int | None:
    """``keep_first`` as an int (or None): a positive int, and only together with a ``window``.

    StreamingLLM's evaluation mask (Xiao et al. 2023, "Efficient Streaming Language Models
    with Attention Sinks", arXiv 2309.17453): with window W and ``keep_first`` k, query ``i``
    attends to key ``j`` iff ``j <= i`` and (``j < k`` or ``i - W < j``) -- the first k
    tokens (the "attention sinks") plus a recent window.
    """
    if keep_first is None:
        return None
    keep_first = check_positive_int("keep_first", keep_first)
    if window is None:
        raise ValueError(
            f"keep_first={keep_first}: keeping the first keys needs a sliding window (query i "
            "sees keys j < keep_first or i - window < j <= i); without one it sees them all"
        )
    return keep_first


def check_chunk(chunk, causal: bool, window: int | None = None) -> int | None:
    """``chunk`` as an int (or None): a positive int, only with ``causal=True`` and without a
    ``window`` (a layer's attention is either sliding-window or block-local).

    The one rule for every implementation: with chunk C, query ``i`` attends to key ``j``
    iff ``j <= i`` and ``floor(j / C) == floor(i / C)`` (Llama 4's chunked attention).
    """
    if chunk is None:
        return None
    chunk = check_positive_int("chunk", chunk)
    if not causal:
        raise ValueError(
            f"chunk={chunk}: block-local attention needs causal=True (query i sees keys j <= i "
            "of its own chunk)"
        )
    if window is not None:
        raise ValueError(
            f"chunk={chunk} and window={window}: give one of them (sliding-window or "
            "block-local attention)"
        )
    return chunk


# --------------------------------------------------------------------------- implementation


class _Config(NamedTuple):
    """Static description of one call (hashable; a nondiff argument of the custom VJP)."""

    q_len: int
    kv_len: int
    q_block_len: int
    k_block_len: int
    nq: int
    nk: int
    causal: bool
    scale: float
    mask_q: bool = False  # the mask varies along queries / keys (else broadcast, size 1)
    mask_k: bool = False
    window: int = 0  # sliding window W (causal only): query i sees keys i - W < j <= i; 0 = none
    keep_first: int = 0  # StreamingLLM (with a window): keys j < keep_first are seen too
    chunk: int = 0  # block-local C (causal only): query i sees j <= i with j // C == i // C

    @property
    def kv_padded(self) -> bool:
        return self.nk * self.k_block_len != self.kv_len

    @property
    def nk_first(self) -> int:
        """Key blocks holding the first ``keep_first`` keys (0 without StreamingLLM's mask)."""
        return min(self.nk, -(-self.keep_first // self.k_block_len))

    @property
    def local(self) -> bool:
        """A window or a chunk: some key blocks below the diagonal are skipped or masked."""
        return bool(self.window or self.chunk)


def _first_blocks(cfg: _Config, i):
    """StreamingLLM: key blocks ``[0, n)`` before the window's first block (`_kv_start`)
    that query block ``i`` visits for its first ``keep_first`` keys (0 without them)."""
    if not cfg.keep_first:
        return 0
    return jnp.minimum(cfg.nk_first, _kv_start(cfg, i))


def _lowest_key(cfg: _Config, i):
    """The lowest key query ``i`` sees (0 without a window or chunk): ``i - W + 1``, or the
    first key of its chunk ``floor(i / C) * C``."""
    if cfg.window:
        return i - cfg.window + 1
    if cfg.chunk:
        return (i // cfg.chunk) * cfg.chunk
    return 0


def _kv_start(cfg: _Config, i):
    """First key block query block ``i`` needs: 0, or with a window or chunk the block
    holding the lowest key its first query ``i * bq`` sees (`_lowest_key`)."""
    if not cfg.local:
        return 0
    return jnp.maximum(0, _lowest_key(cfg, i * cfg.q_block_len) // cfg.k_block_len)


def _kv_end(cfg: _Config, i):
    """Key blocks ``[start, end)`` that query block ``i`` needs (causal: up to the diagonal)."""
    if not cfg.causal:
        return cfg.nk
    return jnp.minimum(cfg.nk, ((i + 1) * cfg.q_block_len - 1) // cfg.k_block_len + 1)


def _kv_full(cfg: _Config, i):
    """Key blocks ``[lo, hi)`` every query of block ``i`` sees whole, without index masking.

    ``hi``: the blocks entirely at or below the diagonal (a padded last block is masked);
    ``lo``: with a window or chunk, the first block entirely inside what the last query sees,
    i.e. whose first key ``j * bk >= _lowest_key((i + 1) * bq - 1)`` (a query block that
    spans two chunks has none: its first query is below the last query's chunk, and the
    blocks of that chunk are above it). The range may be empty (``lo >= hi``).
    """
    last = cfg.nk - 1 if cfg.kv_padded else cfg.nk  # a padded last key block is masked
    if not cfg.causal:
        return 0, last
    hi = jnp.minimum(last, (i * cfg.q_block_len + 1) // cfg.k_block_len)
    if not cfg.local:
        return 0, hi
    lowest = _lowest_key(cfg, (i + 1) * cfg.q_block_len - 1)
    return jnp.maximum(0, -(-lowest // cfg.k_block_len)), hi


def _q_start(cfg: _Config, j):
    """First query block that sees key block ``j`` (inverse of `_kv_end`)."""
    return (j * cfg.k_block_len) // cfg.q_block_len if cfg.causal else 0


def _highest_query(cfg: _Config, j):
    """The highest query that sees key ``j`` (with a window or chunk): ``j + W - 1``, or the
    last position of its chunk ``floor(j / C) * C + C - 1``."""
    if cfg.window:
        return j + cfg.window - 1
    return (j // cfg.chunk) * cfg.chunk + cfg.chunk - 1


def _q_end(cfg: _Config, j):
    """Query blocks ``[start, end)`` see key block ``j``: all, or with a window or chunk
    those up to the one holding the highest query that sees the block's last key
    (`_highest_query`; the inverse of `_kv_start`)."""
    if not cfg.local:
        return cfg.nq
    last_key = (j + 1) * cfg.k_block_len - 1
    return jnp.minimum(cfg.nq, _highest_query(cfg, last_key) // cfg.q_block_len + 1)


def _q_full(cfg: _Config, j):
    """Query blocks ``[lo, hi)`` see all of key block ``j`` without index masking.

    ``lo``: the blocks entirely at or below the diagonal; ``hi``: with a window, the blocks
    whose last query ``(i + 1) * bq - 1 < j * bk + W`` still sees the block's first key; with
    a chunk, those whose last query is in the chunk of the block's first key, and none when
    the key block spans two chunks.
    """
    if cfg.causal:
        lo = jnp.minimum(cfg.nq, -(-((j + 1) * cfg.k_block_len - 1) // cfg.q_block_len))
    else:
        lo = jnp.asarray(0)
    if cfg.kv_padded:
        lo = jnp.where(j == cfg.nk - 1, cfg.nq, lo)
    if not cfg.local:
        return lo, cfg.nq
    first_key = j * cfg.k_block_len
    hi = jnp.minimum(cfg.nq, (_highest_query(cfg, first_key) + 1) // cfg.q_block_len)
    if cfg.chunk:
        last_key = first_key + cfg.k_block_len - 1
        hi = jnp.where(first_key // cfg.chunk == last_key // cfg.chunk, hi, 0)
    return lo, hi


def _split(start, lo, hi, end):
    """Cut ``[start, end)`` into masked ``[start, a)``, unmasked ``[a, b)``, masked ``[b, end)``.

    ``[lo, hi)`` is the range that needs no index mask (possibly empty or reaching outside).
    Returns ``(a, b)`` with ``start <= a <= b <= end`` (or empty ranges if ``start > end``).
    """
    a = jnp.minimum(jnp.maximum(lo, start), end)
    b = jnp.minimum(jnp.maximum(hi, a), end)
    return a, b


def _block(x: Array, i, size: int, axis: int) -> Array:
    """Block ``i`` of ``size`` entries along ``axis``: ``x[..., i * size : (i + 1) * size]``."""
    return lax.dynamic_slice_in_dim(x, i * size, size, axis=axis)


def _add_to_block(x: Array, i, size: int, y: Array) -> Array:
    """``x`` with ``y`` added to its block ``i`` of ``size`` entries along axis 2."""
    return lax.dynamic_update_slice_in_dim(x, _block(x, i, size, 2) + y, i * size, axis=2)


def _logits(
    cfg, bias_fn, consts, q_BNtH, k_BNsH, qpos_Bt, kpos_Bs, mask, i, j, index_mask, fox=None
):
    """Float32 block logits ``[b, h, bq, bk]`` and the bool validity mask (or None).

    ``fox``: the block's FoX prefix sums ``(c_q [b, h, bq], c_k [b, h, bk])`` or None."""
    logits_BNts = jnp.einsum("BNtH,BNsH->BNts", q_BNtH, k_BNsH, preferred_element_type=_F32)
    logits_BNts = logits_BNts * _F32(cfg.scale)
    if bias_fn is not None:
        logits_BNts = logits_BNts + bias_fn(qpos_Bt, kpos_Bs, *consts).astype(_F32)
    if fox is not None:
        c_q_BNt, c_k_BNs = fox
        logits_BNts = logits_BNts + (c_q_BNt[..., :, None] - c_k_BNs[..., None, :])
    valid_BNts = None
    if mask is not None:
        valid_BNts = mask
        if cfg.mask_q:
            valid_BNts = _block(valid_BNts, i, cfg.q_block_len, 2)
        if cfg.mask_k:
            valid_BNts = _block(valid_BNts, j, cfg.k_block_len, 3)
    if index_mask:
        k_idx_s = j * cfg.k_block_len + lax.broadcasted_iota(
            jnp.int32, (1, 1, 1, cfg.k_block_len), 3
        )
        idx_valid_ts = None
        if cfg.causal:
            q_idx_t = i * cfg.q_block_len + lax.broadcasted_iota(
                jnp.int32, (1, 1, cfg.q_block_len, 1), 2
            )
            idx_valid_ts = k_idx_s <= q_idx_t
            if cfg.window:
                recent_ts = k_idx_s > q_idx_t - cfg.window
                if cfg.keep_first:  # StreamingLLM: the first keys stay visible
                    recent_ts = recent_ts | (k_idx_s < cfg.keep_first)
                idx_valid_ts = idx_valid_ts & recent_ts
            if cfg.chunk:
                idx_valid_ts = idx_valid_ts & (k_idx_s // cfg.chunk == q_idx_t // cfg.chunk)
        if cfg.kv_padded:
            in_range = k_idx_s < cfg.kv_len
            idx_valid_ts = in_range if idx_valid_ts is None else idx_valid_ts & in_range
        if idx_valid_ts is not None:
            valid_BNts = idx_valid_ts if valid_BNts is None else valid_BNts & idx_valid_ts
    if valid_BNts is not None:
        logits_BNts = jnp.where(valid_BNts, logits_BNts, _F32(MASKED_LOGIT))
    return logits_BNts, valid_BNts


def _forward_step(cfg: _Config, bias_fn, tensors, i, q_block, index_mask: bool):
    """The ``fori_loop`` body of `_forward` for query block ``i``: one key block ``j``.

    Updates the running row maximum ``m``, normaliser ``denom`` and unnormalised output
    ``acc`` (float32, ``[b, h, bq(, d)]``) with key block ``j``'s scores.
    """
    k_BNSH, v_BNSH, kpos_BS, mask, consts, c_k_BNS = tensors
    q_BNtH, qpos_Bt, c_q_BNt = q_block

    def body(j, carry):
        m_BNt, denom_BNt, acc_BNtH = carry
        kv_j = _key_block(cfg.k_block_len, j, k_BNSH, v_BNSH, kpos_BS, c_k_BNS)
        k_BNsH, v_BNsH, kpos_Bs, c_k_BNs = kv_j
        fox = None if c_k_BNs is None else (c_q_BNt, c_k_BNs)
        logits_BNts, valid_BNts = _logits(
            cfg, bias_fn, consts, q_BNtH, k_BNsH, qpos_Bt, kpos_Bs, mask, i, j, index_mask, fox
        )
        m_new_BNt = jnp.maximum(m_BNt, jnp.max(logits_BNts, axis=-1))
        correction_BNt = jnp.exp(m_BNt - m_new_BNt)
        p_BNts = jnp.exp(logits_BNts - m_new_BNt[..., None])
        if valid_BNts is not None:
            p_BNts = jnp.where(valid_BNts, p_BNts, _F32(0.0))
        denom_BNt = denom_BNt * correction_BNt + jnp.sum(p_BNts, axis=-1)
        pv_BNtH = jnp.einsum(
            "BNts,BNsH->BNtH", p_BNts.astype(v_BNSH.dtype), v_BNsH, preferred_element_type=_F32
        )
        acc_BNtH = acc_BNtH * correction_BNt[..., None] + pv_BNtH
        return m_new_BNt, denom_BNt, acc_BNtH

    return body


def _forward(cfg: _Config, bias_fn, q_BNTH, k_BNSH, v_BNSH, qpos_BT, kpos_BS, mask, consts, extras):
    """Output ``[b, h, nq*bq, d]`` (v.dtype) and float32 log-sum-exp ``[b, h, nq*bq]``.

    Query block ``i`` visits key blocks ``[start, end)`` (`_kv_start`, `_kv_end`): those cut
    by the window's (or chunk's) lower edge and by the diagonal with the index mask, those
    in between (`_kv_full`) without it; with StreamingLLM's ``keep_first`` also ``[0,
    first)`` (`_first_blocks`), masked. ``extras = (sinks [h] or None, (c_q [b, h, nq*bq],
    c_k [b, h, nk*bk]) or None)``: the sink seeds the running max ``m = s_h`` and
    denominator ``l = 1``.
    """
    b, h, _, d = q_BNTH.shape
    q_block_len = cfg.q_block_len
    sinks_N, fox = extras
    c_q_BNT, c_k_BNS = (None, None) if fox is None else fox
    tensors = (k_BNSH, v_BNSH, kpos_BS, mask, consts, c_k_BNS)

    def query_block(i):
        q_block = (
            _block(q_BNTH, i, q_block_len, 2),
            _block(qpos_BT, i, q_block_len, 1),
            None if c_q_BNT is None else _block(c_q_BNT, i, q_block_len, 2),
        )
        masked = _forward_step(cfg, bias_fn, tensors, i, q_block, True)
        unmasked = _forward_step(cfg, bias_fn, tensors, i, q_block, False)
        if sinks_N is None:
            m0_BNt = jnp.full((b, h, q_block_len), MASKED_LOGIT, _F32)
            denom0_BNt = jnp.zeros((b, h, q_block_len), _F32)
        else:  # the sink column: exp(s_h - m) = 1 with m = s_h, and no value
            m0_BNt = jnp.broadcast_to(sinks_N[None, :, None], (b, h, q_block_len))
            denom0_BNt = jnp.ones((b, h, q_block_len), _F32)
        carry = (m0_BNt, denom0_BNt, jnp.zeros((b, h, q_block_len, d), _F32))
        start, end = _kv_start(cfg, i), _kv_end(cfg, i)
        if cfg.keep_first:  # StreamingLLM: the first keys' blocks before the window
            carry = lax.fori_loop(0, _first_blocks(cfg, i), masked, carry)
        lo, hi = _split(start, *_kv_full(cfg, i), end)
        if cfg.local:  # blocks cut by the window's (or chunk's) lower edge
            carry = lax.fori_loop(start, lo, masked, carry)
        carry = lax.fori_loop(lo, hi, unmasked, carry)
        m_BNt, denom_BNt, acc_BNtH = lax.fori_loop(hi, end, masked, carry)
        seen_BNt = denom_BNt > 0
        l_safe_BNt = jnp.where(seen_BNt, denom_BNt, _F32(1.0))
        out_BNtH = (acc_BNtH / l_safe_BNt[..., None]).astype(v_BNSH.dtype)
        lse_BNt = jnp.where(seen_BNt, m_BNt + jnp.log(l_safe_BNt), _F32(0.0))
        return out_BNtH, lse_BNt

    out_BNTH, lse_BNT = lax.map(query_block, jnp.arange(cfg.nq))  # [nq, b, h, bq, (d)]
    out_BNTH = jnp.moveaxis(out_BNTH, 0, 2).reshape((b, h, cfg.nq * q_block_len, d))
    lse_BNT = jnp.moveaxis(lse_BNT, 0, 2).reshape((b, h, cfg.nq * q_block_len))
    return out_BNTH, lse_BNT


def _key_block(k_block_len: int, j, k_BNSH, v_BNSH, kpos_BS, c_k_BNS) -> tuple:
    """Key block ``j``: its keys and values ``[b, h, bk, d]``, positions ``[b, bk]`` and FoX
    prefix sums ``[b, h, bk]`` (None without FoX)."""

    def cut(x, axis):
        return _block(x, j, k_block_len, axis)

    c_k_BNs = None if c_k_BNS is None else cut(c_k_BNS, 2)
    return cut(k_BNSH, 2), cut(v_BNSH, 2), cut(kpos_BS, 1), c_k_BNs


def _backward_step(cfg: _Config, bias_fn, tensors, j, kv_j, index_mask: bool):
    """The ``fori_loop`` body of `_backward` for key block ``j``: one query block ``i``.

    Accumulates dK_j, dV_j (float32) and the bias-parameter gradients, and adds this block's
    contribution to the rows of dQ.
    """
    q_BNTH, g_BNTH, lse_BNT, delta_BNT, qpos_BT, mask, consts, c_q_BNT = tensors
    k_BNsH, v_BNsH, kpos_Bs, c_k_BNs = kv_j
    q_block_len = cfg.q_block_len

    def body(i, carry):
        dk_BNsH, dv_BNsH, dq_BNTH, dconsts, dfox = carry
        q_BNtH = _block(q_BNTH, i, q_block_len, 2)
        g_BNtH = _block(g_BNTH, i, q_block_len, 2)
        lse_BNt = _block(lse_BNT, i, q_block_len, 2)
        delta_BNt = _block(delta_BNT, i, q_block_len, 2)
        qpos_Bt = _block(qpos_BT, i, q_block_len, 1)
        fox = None if c_q_BNT is None else (_block(c_q_BNT, i, q_block_len, 2), c_k_BNs)
        logits_BNts, valid_BNts = _logits(
            cfg, bias_fn, consts, q_BNtH, k_BNsH, qpos_Bt, kpos_Bs, mask, i, j, index_mask, fox
        )
        p_BNts = jnp.exp(logits_BNts - lse_BNt[..., None])
        if valid_BNts is not None:
            p_BNts = jnp.where(valid_BNts, p_BNts, _F32(0.0))
        dv_BNsH = dv_BNsH + jnp.einsum(
            "BNts,BNtH->BNsH", p_BNts.astype(g_BNTH.dtype), g_BNtH, preferred_element_type=_F32
        )
        dp_BNts = jnp.einsum("BNtH,BNsH->BNts", g_BNtH, v_BNsH, preferred_element_type=_F32)
        ds_BNts = p_BNts * (dp_BNts - delta_BNt[..., None])  # d loss / d logits (incl. the bias)
        dk_BNsH = dk_BNsH + jnp.einsum(
            "BNts,BNtH->BNsH", ds_BNts.astype(q_BNTH.dtype), q_BNtH, preferred_element_type=_F32
        )
        dq_BNtH = jnp.einsum(
            "BNts,BNsH->BNtH", ds_BNts.astype(k_BNsH.dtype), k_BNsH, preferred_element_type=_F32
        )
        dq_BNTH = _add_to_block(dq_BNTH, i, q_block_len, dq_BNtH)
        if consts:
            _, bias_vjp = jax.vjp(lambda *c: bias_fn(qpos_Bt, kpos_Bs, *c).astype(_F32), *consts)
            grads = bias_vjp(_sum_to(ds_BNts, jax.eval_shape(bias_fn, qpos_Bt, kpos_Bs, *consts)))
            dconsts = tuple(a + gc for a, gc in zip(dconsts, grads, strict=True))
        if dfox is not None:  # logit (i, j) += c_q[i] - c_k[j]: row sums, minus column sums
            dc_q_BNT, dc_k_BNs = dfox
            dc_q_BNT = _add_to_block(dc_q_BNT, i, q_block_len, jnp.sum(ds_BNts, axis=-1))
            dfox = (dc_q_BNT, dc_k_BNs - jnp.sum(ds_BNts, axis=-2))
        return dk_BNsH, dv_BNsH, dq_BNTH, dconsts, dfox

    return body


def _backward(
    cfg: _Config,
    bias_fn,
    q_BNTH,
    k_BNSH,
    v_BNSH,
    qpos_BT,
    kpos_BS,
    mask,
    consts,
    extras,
    out_BNTH,
    lse_BNT,
    g_BNTH,
):
    """FlashAttention-2 backward: key blocks outside, query blocks inside, dq accumulated.

    Key block ``j`` visits query blocks ``[start, end)`` (`_q_start`, `_q_end`), the same
    (query block, key block) pairs as `_forward`; with StreamingLLM's ``keep_first`` a key
    block holding one of the first keys also visits the query blocks past ``end``. Returns
    the gradients of q, k, v, the bias parameters and ``extras`` (sinks, FoX prefix sums).
    """
    sinks_N, fox = extras
    c_q_BNT, c_k_BNS = (None, None) if fox is None else fox
    # D_i = rowsum(dO * O) = sum_j P_ij dP_ij, the softmax Jacobian's diagonal correction.
    delta_BNT = jnp.sum(g_BNTH.astype(_F32) * out_BNTH.astype(_F32), axis=-1)
    g_BNTH = g_BNTH.astype(v_BNSH.dtype)
    tensors = (q_BNTH, g_BNTH, lse_BNT, delta_BNT, qpos_BT, mask, consts, c_q_BNT)

    def key_block(carry, j):  # a lax.scan body over key blocks
        dq_BNTH, dconsts, dc_q_BNT = carry
        kv_j = _key_block(cfg.k_block_len, j, k_BNSH, v_BNSH, kpos_BS, c_k_BNS)
        zeros = jnp.zeros(kv_j[0].shape, _F32)
        start, end = _q_start(cfg, j), _q_end(cfg, j)
        lo, hi = _split(start, *_q_full(cfg, j), end)
        dfox = None if dc_q_BNT is None else (dc_q_BNT, jnp.zeros(kv_j[3].shape, _F32))
        carry = (zeros, zeros, dq_BNTH, dconsts, dfox)
        # Query blocks on the diagonal (and, with a window or chunk, those cut by its far
        # edge) need the index mask; those in between do not; the rest are skipped.
        masked = _backward_step(cfg, bias_fn, tensors, j, kv_j, True)
        unmasked = _backward_step(cfg, bias_fn, tensors, j, kv_j, False)
        carry = lax.fori_loop(start, lo, masked, carry)
        carry = lax.fori_loop(lo, hi, unmasked, carry)
        if cfg.local:
            carry = lax.fori_loop(hi, end, masked, carry)
        if cfg.keep_first:  # StreamingLLM: later queries still see this block's first keys
            past = jnp.maximum(end, start)
            carry = lax.fori_loop(past, jnp.where(j < cfg.nk_first, cfg.nq, past), masked, carry)
        dk_BNsH, dv_BNsH, dq_BNTH, dconsts, dfox = carry
        dc_q_BNT, dc_k_BNs = (None, None) if dfox is None else dfox
        return (dq_BNTH, dconsts, dc_q_BNT), (dk_BNsH * _F32(cfg.scale), dv_BNsH, dc_k_BNs)

    dq0_BNTH = jnp.zeros(q_BNTH.shape, _F32)
    dconsts0 = tuple(jnp.zeros_like(c) for c in consts)
    dc_q0_BNT = None if c_q_BNT is None else jnp.zeros(c_q_BNT.shape, _F32)
    (dq_BNTH, dconsts, dc_q_BNT), (dk_BNSH, dv_BNSH, dc_k_BNS) = lax.scan(
        key_block, (dq0_BNTH, dconsts0, dc_q0_BNT), jnp.arange(cfg.nk)
    )
    dk_BNSH = jnp.moveaxis(dk_BNSH, 0, 2).reshape(k_BNSH.shape)
    dv_BNSH = jnp.moveaxis(dv_BNSH, 0, 2).reshape(v_BNSH.shape)
    dq_BNTH = dq_BNTH * _F32(cfg.scale)
    dsinks_N = None
    if sinks_N is not None:  # d l / d s_h = -sum_i p_sink(i) D_i, p_sink(i) = exp(s_h - lse_i)
        p_sink_BNT = jnp.exp(sinks_N[None, :, None] - lse_BNT)
        dsinks_N = -jnp.sum(p_sink_BNT * delta_BNT, axis=(0, 2))
    dfox = None
    if fox is not None:
        dfox = (dc_q_BNT, jnp.moveaxis(dc_k_BNS, 0, 2).reshape(c_k_BNS.shape))
    return (
        dq_BNTH.astype(q_BNTH.dtype),
        dk_BNSH.astype(k_BNSH.dtype),
        dv_BNSH.astype(v_BNSH.dtype),
        dconsts,
        (dsinks_N, dfox),
    )


def _sum_to(x: Array, target: jax.ShapeDtypeStruct) -> Array:
    """Sum ``x`` over the axes where the bias broadcast (size 1 in ``target``)."""
    axes = tuple(a for a, (n, t) in enumerate(zip(x.shape, target.shape, strict=True)) if t != n)
    x = jnp.sum(x, axis=axes, keepdims=True) if axes else x
    return x.astype(target.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention_vjp(static, q, k, v, qpos, kpos, mask, consts, extras):
    cfg, bias_fn = static
    return _forward(cfg, bias_fn, q, k, v, qpos, kpos, mask, consts, extras)[0]


def _attention_fwd(static, q, k, v, qpos, kpos, mask, consts, extras):
    cfg, bias_fn = static
    out, lse = _forward(cfg, bias_fn, q, k, v, qpos, kpos, mask, consts, extras)
    return out, (q, k, v, qpos, kpos, mask, consts, extras, out, lse)


def _attention_bwd(static, res, g):
    cfg, bias_fn = static
    q, k, v, qpos, kpos, mask, consts, extras, out, lse = res
    dq, dk, dv, dconsts, dextras = _backward(
        cfg, bias_fn, q, k, v, qpos, kpos, mask, consts, extras, out, lse, g
    )
    return dq, dk, dv, None, None, None, dconsts, dextras


_attention_vjp.defvjp(_attention_fwd, _attention_bwd)


def _attention(cfg, bias_fn, q, k, v, qpos, kpos, mask, consts, extras=(None, None)):
    return _attention_vjp((cfg, bias_fn), q, k, v, qpos, kpos, mask, consts, extras)


# --------------------------------------------------------------------------- checks / helpers


def _convert_bias_fn(bias_fn, qpos_block, kpos_block, batch: int, heads: int):
    """``bias_fn`` with the arrays it closes over hoisted out (`jax.closure_convert`), so the
    custom VJP can differentiate them: ``(converted, consts)``, or ``(None, ())``.

    Checks that it returns ``[batch, heads, bq, bk]`` (broadcastable, 4 axes) for position
    blocks ``qpos_block [b, bq]`` and ``kpos_block [b, bk]``.
    """
    if bias_fn is None:
        return None, ()
    converted, consts = jax.closure_convert(bias_fn, qpos_block, kpos_block)
    consts = tuple(consts)
    bias_shape = jax.eval_shape(converted, qpos_block, kpos_block, *consts).shape
    q_block_len, k_block_len = qpos_block.shape[1], kpos_block.shape[1]
    if len(bias_shape) != 4:
        raise ValueError(
            f"bias_fn must return [batch, heads, bq, bk] (4 axes); got shape {bias_shape} "
            f"for position blocks of {q_block_len} queries and {k_block_len} keys"
        )
    check_broadcastable("bias_fn(...)", bias_shape, (batch, heads, q_block_len, k_block_len))
    return converted, consts


def _pad_axis(x: Array, axis: int, size: int, fill) -> Array:
    extra = size - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    if fill == "edge":
        return jnp.pad(x, widths, mode="edge")
    return jnp.pad(x, widths, constant_values=fill)


def _check_inputs(q, k, v, q_positions, k_positions) -> tuple[Array, Array]:
    """Check the arguments; return the positions as int32 ``[batch or 1, length]``."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if jnp.ndim(x) != 4:
            raise ValueError(f"{name} must be [batch, length, heads, head_dim]; got {jnp.shape(x)}")
    if q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:] or v.shape != k.shape:
        raise ValueError(
            f"q {q.shape}, k {k.shape}, v {v.shape}: q and k must agree on batch, heads and "
            "head_dim, and v must have the shape of k ([batch, length, heads, head_dim])"
        )
    batch = q.shape[0]
    q_positions = as_batched_positions(
        q_positions, name="q_positions", length=q.shape[1], batch=batch
    )
    k_positions = as_batched_positions(
        k_positions, name="k_positions", length=k.shape[1], batch=batch
    )
    return q_positions, k_positions
