"""Training windows and evaluation windows over a 1-D byte array.

Conventions. A split is a byte array `x` of `n` bytes. A window of length `L` starting at `s` has
`inputs = x[s : s+L]` and `targets = x[s+1 : s+L+1]`: target column `j` is byte `s+j+1` and is
predicted from the `j+1` bytes `x[s : s+j+1]`. Byte 0 of the split has no context and is never a
target, so the scorable target positions are `1 .. n-1`.

Evaluation (the protocols of Press et al. 2022, "Train Short, Test Long", §4 and Appendix):

* **non-overlapping** (`stride=None` or `stride=L`): windows start at `0, L, 2L, ...`; every
  window scores all its targets. Target `p` is scored with `((p-1) mod L) + 1` bytes of context,
  so tokens at the start of a window see little context (the "early token curse").
* **sliding** (`stride=S`, `1 <= S <= L`): windows start at `0, S, 2S, ...`; window 0 scores all
  `L` targets; window `k >= 1` scores only its last `S` targets (positions `kS+L-S+1 .. kS+L`),
  each predicted from at least `L-S+1` bytes of context. `S=1` is the slowest, most
  context-rich protocol.

In both, window `k` scores the positions just after those of window `k-1`, so the windows score
every target position `1 .. n-1` exactly once (with `max_windows`, a prefix `1 .. e` of them). The
number of windows is `1 + ceil(max(0, n-1-L) / S)`. Only the last window can run past the end of
the split: its missing bytes are filled with 0 and their `loss_mask` is 0. Padding sits at the end
of the window, so a causal model's predictions for the real positions do not see it.
"""

from __future__ import annotations

import math

import numpy as np

from flaxformer_lite.base.checks import check_positive_int

PAD = 0
"""Byte used to fill the part of the last evaluation window that runs past the end of a split
(always with loss_mask 0)."""


def check_generator(rng) -> np.random.Generator:
    """Raises a TypeError unless `rng` is a `np.random.Generator`."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"rng must be a numpy.random.Generator (e.g. np.random.default_rng(seed)), "
            f"got {type(rng).__name__}"
        )
    return rng


def sample_windows(
    data: np.ndarray, rng: np.random.Generator, batch_size: int, length: int
) -> dict[str, np.ndarray]:
    """Random training windows of `length + 1` bytes.

    Args:
      data: uint8 `[n]` with `n >= length + 1` (checked by the caller).
      rng: the generator; one call draws `batch_size` start offsets uniformly from
        `[0, n - length - 1]` with `rng.integers`, so batches are a function of its state.
    Returns:
      `inputs` int32 `[batch_size, length]`, `targets` int32 `[batch_size, length]` (inputs shifted
      by one byte), `loss_mask` float32 `[batch_size, length]` (all ones).
    """
    n = data.shape[0]
    starts = rng.integers(0, n - length, size=batch_size)
    idx = starts[:, None] + np.arange(length + 1)
    window = np.asarray(data[idx], dtype=np.int32)
    return {
        "inputs": np.ascontiguousarray(window[:, :-1]),
        "targets": np.ascontiguousarray(window[:, 1:]),
        "loss_mask": np.ones((batch_size, length), np.float32),
    }


def num_windows(num_bytes: int, length: int, stride: int) -> int:
    """Number of evaluation windows that cover targets `1 .. num_bytes-1` (module docstring)."""
    return 1 + math.ceil(max(0, num_bytes - 1 - length) / stride)


def window_arrays(
    data: np.ndarray, window_ids: np.ndarray, length: int, stride: int
) -> dict[str, np.ndarray]:
    """Evaluation windows `window_ids` (int `[b]`) of `data` (uint8 `[n]`, `n >= length + 1`).

    Returns `inputs`, `targets` int32 `[b, length]` and `loss_mask` float32 `[b, length]`. Window
    `k` starts at `k * stride`; its target column `j` is position `p = start + j + 1`, scored iff
    `lo <= p <= n - 1`, where `lo = 1` for window 0 and `lo = start + length - stride + 1`
    otherwise (module docstring).
    """
    n = data.shape[0]
    window_ids = np.asarray(window_ids, dtype=np.int64)
    starts = window_ids * stride
    idx = starts[:, None] + np.arange(length + 1)
    valid = idx < n
    window = np.asarray(data[np.minimum(idx, n - 1)], dtype=np.int32)
    window[~valid] = PAD
    target_pos = idx[:, 1:]
    lo = np.where(window_ids == 0, 1, starts + length - stride + 1)
    mask = (target_pos >= lo[:, None]) & valid[:, 1:]
    return {
        "inputs": np.ascontiguousarray(window[:, :-1]),
        "targets": np.ascontiguousarray(window[:, 1:]),
        "loss_mask": mask.astype(np.float32),
    }


def context_block_starts(
    num_bytes: int, *, max_context: int, block: int, blocks: int
) -> np.ndarray:
    """First target positions of ``blocks`` blocks of ``block`` targets, evenly spaced over
    a split of ``num_bytes`` bytes, each with at least ``max_context`` bytes before it.

    Block ``k`` starts at ``lo + floor(k * (hi - lo) / blocks)`` with ``lo = max_context`` and
    ``hi = num_bytes - block``, so the blocks cover the whole split (every file longer than
    the spacing contributes) and, the spacing being at least ``block``, never overlap.
    Deterministic: the same targets for every context length, encoding and seed. Raises a
    ValueError when the split is too small for that many blocks.
    """
    for name, value in (("max_context", max_context), ("block", block), ("blocks", blocks)):
        check_positive_int(name, value)
    lo, hi = max_context, num_bytes - block
    if hi - lo < blocks * block:
        raise ValueError(
            f"a split of {num_bytes} bytes holds at most {max(0, (hi - lo) // block)} "
            f"non-overlapping blocks of {block} targets with {max_context} bytes of context "
            f"before each; {blocks} were asked for (fewer targets or a shorter context)"
        )
    return lo + (np.arange(blocks, dtype=np.int64) * (hi - lo)) // blocks


def context_window_arrays(
    data: np.ndarray, starts: np.ndarray, context: int, block: int
) -> dict[str, np.ndarray]:
    """Context-protocol windows: for each block start ``p0`` (int ``[b]``), the inputs
    ``data[p0 - context : p0 + block - 1]`` and the targets one byte later, so the ``block``
    scored targets are bytes ``p0 .. p0 + block - 1``, the first with exactly ``context``
    bytes before it and target ``k`` with ``context + k``.

    Returns ``inputs``, ``targets`` int32 ``[b, context + block - 1]`` and ``loss_mask``
    float32 (1 on the last ``block`` columns).
    """
    starts = np.asarray(starts, np.int64)
    length = context + block - 1
    idx = (starts - context)[:, None] + np.arange(length + 1)
    if starts.size and (idx.min() < 0 or idx.max() >= data.shape[0]):
        raise ValueError(f"context windows of {context} + {block} bytes run outside the split")
    window = np.asarray(data[idx], dtype=np.int32)
    mask = np.zeros((starts.shape[0], length), np.float32)
    mask[:, context - 1 :] = 1.0
    return {
        "inputs": np.ascontiguousarray(window[:, :-1]),
        "targets": np.ascontiguousarray(window[:, 1:]),
        "loss_mask": mask,
    }


KEY_NGRAM = 8  # tokens of the match that makes a context-protocol target a key target


def copy_key_targets(
    data: np.ndarray,
    starts: np.ndarray,
    *,
    block: int,
    near: int,
    far: int,
    ngram: int = KEY_NGRAM,
) -> np.ndarray:
    """Which context-protocol targets only a long context can copy: bool ``[blocks, block]``.

    The key-token idea of LongPPL (Fang et al. 2024, "What is Wrong with Perplexity for
    Long-context Language Modeling?", arXiv 2410.23771): score the tokens whose loss falls
    with more context, chosen by a reference model. The reference here is an exact copy model:
    target ``p`` (in the block starting at ``p0``) is a key target when the ``ngram`` tokens
    ``data[p - ngram + 1 : p + 1]`` (its ``ngram - 1`` predecessors and itself) occurred before,
    wholly inside the longest context (from ``p0 - far``), but nowhere wholly inside the
    context ``near`` (from ``p0 - near``, e.g. the training length). A model that reads the
    context up to ``far`` can copy such a target from its earlier occurrence; one that reads
    only ``near`` tokens cannot. Deterministic and the same for every model and seed (no
    reference training run); exact for any token dtype (n-grams compared as rows, no hash).

    Args:
      data: the split's token ids ``[n]``.
      starts: int ``[blocks]``, the first target of each block (`context_block_starts`).
      block: targets per block.
      near, far: the short and the long context (tokens before a block's first target),
        ``ngram <= near < far``.
      ngram: the length of the copied match, the target included.
    """
    starts = np.asarray(starts, np.int64)
    check_positive_int("block", block)
    if not 1 <= ngram <= near < far:
        raise ValueError(
            f"need 1 <= ngram <= near < far; got ngram={ngram}, near={near}, far={far}"
        )
    end = int(starts.max()) + block if starts.size else 0
    if starts.size and (int(starts.min()) < far or end > data.shape[0]):
        raise ValueError(f"key targets need {far} tokens before each block inside the split")
    if end < ngram:
        return np.zeros((starts.shape[0], block), bool)
    grams = np.lib.stride_tricks.sliding_window_view(np.asarray(data[:end]), ngram)
    _, ids = np.unique(grams, axis=0, return_inverse=True)
    ids = ids.reshape(-1)
    # previous[r]: the latest r' < r with the same n-gram (-1: none); row r ends at r + ngram - 1
    order = np.argsort(ids, kind="stable")
    same = np.r_[False, ids[order][1:] == ids[order][:-1]]
    previous = np.full(ids.shape[0], -1, np.int64)
    previous[order[1:][same[1:]]] = order[:-1][same[1:]]
    targets = starts[:, None] + np.arange(block)[None, :]  # positions predicted
    rows = targets - ngram + 1  # the n-gram ending at each target starts here
    last = np.where(rows >= 0, previous[np.maximum(rows, 0)], -1)  # start of its latest copy
    return (last >= 0) & (last >= starts[:, None] - far) & (last < starts[:, None] - near)
