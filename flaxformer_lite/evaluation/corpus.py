"""Length-extrapolation evaluation: one trained model scored at many sequence lengths.

Protocols (Press et al. 2022, "Train Short, Test Long", §4):

* ``nonoverlapping`` -- the split is cut into windows of the evaluation length ``L'``; every
  target is scored once, with ``1..L'`` tokens of context (early tokens of a window see
  little: the "early token curse").
* ``sliding`` -- windows of length ``L'`` advance by a stride ``S``; each target is still
  scored exactly once, but (after the first window) with at least ``L' - S`` tokens of context.

Both score the same first ``max_tokens`` targets of the split at every length, so the
numbers at different lengths are directly comparable. The same model code as in training is
used; positions are explicit, so nothing special happens past the training length (a learned
table must be sized for the longest length by the config).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from flaxformer_lite.core import attention
from flaxformer_lite.evaluation.blocks import DEFAULT_BLOCK_TOKENS, BlockSums
from flaxformer_lite.evaluation.eval_config import PROTOCOLS
from flaxformer_lite.evaluation.metrics import summarize
from flaxformer_lite.evaluation.step import Evaluator, rebuild_model
from flaxformer_lite.nn.model_config import ModelConfig

# (window index, batch size, length) -> int32 positions [batch, length]
PositionFn = Callable[[int, int, int], np.ndarray]


def arange_positions(index: int, batch: int, length: int) -> np.ndarray:
    """Positions ``0..length-1`` for every row (the default scheme)."""
    del index
    return np.broadcast_to(np.arange(length, dtype=np.int32)[None, :], (batch, length))


def evaluate_length(
    model: nnx.Module,
    split: Any,
    length: int,
    *,
    stride: int | None = None,
    max_tokens: int | None = None,
    batch_size: int = 8,
    train_length: int | None = None,
    positions_fn: PositionFn = arange_positions,
    progress: bool = False,
    incremental: bool = False,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
) -> dict[str, Any]:
    """Score ``model`` on windows of ``length`` tokens of a ``split``: a byte split, or a
    `flaxformer_lite.data.tokens.TokenSplit` (then bits per byte divide by the bytes of text
    the scored tokens cover, and blocks are byte ranges of that text).

    Args:
      model: a causal LM called as ``model(tokens, positions, deterministic=True)``.
      split: a `flaxformer_lite.data` split (``eval_batches``).
      length: window length L'.
      stride: None for non-overlapping windows, else the sliding-window stride S (1..L').
      max_tokens: score the first ``max_tokens`` targets of the split; None (or 0): every
        target of the split (bytes ``1 .. n-1``).
      batch_size: windows per batch (the last batch is padded, so one compile per length).
      train_length: the training length, for ``bucket_loss``.
      positions_fn: positions of each batch (default ``0..L'-1``).
      incremental: score token by token through the KV cache (each target sees exactly
        its prefix; needed where the encoding reads the current length: dynamic NTK).

    Returns:
      `summarize` 's metrics plus ``eval_length``, ``protocol``, ``stride``, ``windows``,
      ``num_scored_tokens`` and ``blocks`` (per-block sums over target bytes ``p`` of the
      split, block ``p // block_tokens``, with the file of each block's first target;
      `flaxformer_lite.evaluation.blocks`).
    """
    evaluator = Evaluator(model, incremental=incremental)
    max_bytes = max_tokens + 1 if max_tokens else None
    step = length if stride is None else stride
    batches = split.eval_batches(
        length, batch_size, stride=stride, max_bytes=max_bytes, pad_batch=True
    )
    total = split.num_eval_windows(length, stride=stride, max_bytes=max_bytes)
    sums = {k: np.zeros(length, np.float64) for k in ("loss_sum", "correct_sum", "count")}
    blocks = BlockSums(block_tokens, "target bytes")
    bar = tqdm(total=total, desc=f"eval L'={length}", unit="win", disable=not progress, leave=False)
    with bar:  # closed also when interrupted: the interrupt's message gets a line of its own
        for index, batch in enumerate(batches):
            # a token split (`data.tokens.TokenSplit`) says what bytes each target covers
            target_bytes = batch.pop("target_bytes", None)
            target_offset = batch.pop("target_offset", None)
            batch = dict(batch, positions=positions_fn(index, batch_size, length))
            out = evaluator(batch)
            for k in ("loss_sum", "correct_sum", "count"):
                sums[k] += out[k]
            # window w starts at byte w * step; its column j predicts byte w * step + j + 1
            windows = index * batch_size + np.arange(batch_size)
            target = windows[:, None] * step + np.arange(length)[None, :] + 1
            if target_offset is not None:  # blocks are byte ranges of the text
                target = target_offset
            ids = target // block_tokens
            mask = batch["loss_mask"] > 0
            # positions in the split's data (bytes, or tokens of a token split)
            data_position = windows[:, None] * step + np.arange(length)[None, :] + 1
            blocks.note_positions(ids[mask], data_position[mask])
            blocks.add("loss", ids[mask], out["token_loss"][mask])
            blocks.add("correct", ids[mask], out["token_correct"][mask])
            blocks.add("count", ids[mask], np.ones(int(mask.sum())))
            if target_bytes is not None:
                sums["bytes"] = sums.get("bytes", 0.0) + (target_bytes * mask).sum(axis=0)
                blocks.add("bytes", ids[mask], target_bytes[mask])
            bar.update(min(batch_size, total - index * batch_size))
    byte_sum = sums.pop("bytes", None)
    result = summarize(**sums, train_length=train_length, byte_sum=byte_sum)
    result.update(
        eval_length=length,
        protocol="nonoverlapping" if stride in (None, length) else "sliding",
        stride=step,
        windows=total,
        num_scored_tokens=result["tokens"],
        blocks=blocks.to_dict(getattr(split, "document_of", None)),
    )
    return result


def evaluate_lengths(
    model: nnx.Module,
    split: Any,
    lengths: Iterable[int],
    *,
    protocol: str = "nonoverlapping",
    stride_fraction: float = 0.5,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """`evaluate_length` at every length in ``lengths`` with one protocol.

    Lengths above ``model.cfg.chunked_threshold`` keys use chunked attention (same numbers to
    float32 tolerance, ``O(length)`` memory). ``kwargs`` go to `evaluate_length`. For
    ``protocol="sliding"`` the stride is `sliding_stride` ``(length, stride_fraction)``. A
    study evaluates its whole `flaxformer_lite.evaluation.plan.EvalPlan` instead
    (`flaxformer_lite.evaluation.run.evaluate_plan`).
    """
    if protocol not in PROTOCOLS[:2]:  # the context protocol: evaluation.context
        raise ValueError(f"protocol={protocol!r}; allowed: {list(PROTOCOLS[:2])}")
    results = []
    for length in lengths:
        m = rebuild_model(model, attention_config(model.cfg, length))
        stride = sliding_stride(length, stride_fraction) if protocol == "sliding" else None
        results.append(evaluate_length(m, split, length, stride=stride, **kwargs))
    return results


def sliding_stride(length: int, stride_fraction: float) -> int:
    """The sliding-window stride at ``length``: ``max(1, round(length * stride_fraction))``."""
    return max(1, round(length * stride_fraction))


def attention_config(cfg: ModelConfig, keys: int) -> ModelConfig:
    """``cfg`` with the attention implementation for sequences of ``keys`` tokens: chunked
    above ``cfg.chunked_threshold`` (`core.attention.choose_implementation`)."""
    impl = attention.choose_implementation(
        cfg.attention_impl, keys, keys, threshold=cfg.chunked_threshold
    )
    return cfg.replace(attention_impl=impl)
