"""Scoring: one loop that runs any evaluation protocol (`flaxformer_lite.evaluation.protocols`)
over a model and accumulates per-position sums and per-block sums.

Every protocol's batches carry what each target is (`data.corpus.Split`): the bytes of text it
covers, so bits per byte has one formula for byte-level and tokenized splits alike -- summed
``-log2 p`` of the scored tokens over the bytes they cover (the unit lm-evaluation-harness
calls ``bits_per_byte``) -- and its statistics block (`evaluation.blocks`), so every statistic
can be recomputed from the rows' blocks and paired over seeds and data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from flaxformer_lite.core import attention
from flaxformer_lite.evaluation.blocks import BlockSums
from flaxformer_lite.evaluation.eval_config import PROTOCOLS
from flaxformer_lite.evaluation.metrics import summarize
from flaxformer_lite.evaluation.protocols import Context, TaskLength, Windows
from flaxformer_lite.evaluation.step import Evaluator, rebuild_model
from flaxformer_lite.nn.generate import generate
from flaxformer_lite.nn.model_config import ModelConfig

# (batch index, batch size, length) -> int32 positions [batch, length]
PositionFn = Callable[[int, int, int], np.ndarray]
Protocol = Windows | Context | TaskLength
_SUMS = ("loss_sum", "correct_sum", "count", "bytes")


def arange_positions(index: int, batch: int, length: int) -> np.ndarray:
    """Positions ``0..length-1`` for every row (the default scheme)."""
    del index
    return np.broadcast_to(np.arange(length, dtype=np.int32)[None, :], (batch, length))


def score(
    model: nnx.Module,
    protocol: Protocol,
    data: Any,
    *,
    batch_size: int = 8,
    positions_fn: PositionFn = arange_positions,
    incremental: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Score ``model`` under ``protocol`` on ``data`` (a `data.corpus.Split`, or a task).

    Args:
      model: a causal LM called as ``model(tokens, positions, deterministic=True)``.
      protocol: a `Windows`, `Context` or `TaskLength` value.
      data: what the protocol reads (a corpus split; a task for `TaskLength`).
      batch_size: windows (examples) per batch; the last batch is padded, so one compile.
      positions_fn: the positions of each batch (default ``0..T-1``).
      incremental: score token by token through the KV cache (each target sees exactly its
        prefix; needed where the encoding reads the current length: dynamic NTK).
      progress: a bar of the batches.

    Returns:
      Corpus protocols: `metrics.summarize` 's metrics (``loss``, ``bits_per_byte``,
      ``perplexity``, ``accuracy``, ``tokens``, ``loss_by_position`` over the protocol's
      columns, ``scored_bytes``, ``bucket_loss``), ``num_scored_tokens``, the protocol's
      fields (``eval_length``, ``protocol``, ...) and ``blocks`` (per-block sums, each block
      with the file of its first target). `TaskLength`: ``exact_match``, ``accuracy``,
      ``num_scored_tokens``, its fields and ``blocks``.
    """
    task = isinstance(protocol, TaskLength)
    generating = task and protocol.mode == "generate"
    evaluator = None if generating else Evaluator(model, incremental=incremental)
    sums: dict[str, Any] = dict.fromkeys(_SUMS, 0.0)
    blocks = BlockSums(protocol.block_size, protocol.block_unit)
    exact = 0.0
    total = protocol.count(data)
    bar = tqdm(total=total, desc=protocol.describe(), unit="win", disable=not progress, leave=False)
    with bar:  # closed also when interrupted: the interrupt's message gets a line of its own
        for index, batch in enumerate(protocol.batches(data, batch_size)):
            batch = dict(batch)
            block, rows = batch.pop("block"), int(batch.pop("rows", batch_size))
            where = {k: batch.pop(k) for k in ("target_position", "target_offset") if k in batch}
            target_bytes = batch.pop("target_bytes", None)
            seq = batch["inputs"].shape[1]
            batch["positions"] = positions_fn(index, batch_size, seq)
            if generating:
                out = _generated(model, protocol, data, batch)
            else:
                out = evaluator(batch)
            mask = batch["loss_mask"] > 0
            for k in ("loss_sum", "correct_sum", "count"):
                if k in out:
                    sums[k] = sums[k] + out[k][protocol.columns]
            if "target_position" in where:
                blocks.note_positions(block[mask], where["target_position"][mask])
            if "token_loss" in out:
                blocks.add("loss", block[mask], out["token_loss"][mask])
            blocks.add("correct", block[mask], out["token_correct"][mask])
            blocks.add("count", block[mask], np.ones(int(mask.sum())))
            if target_bytes is not None:
                sums["bytes"] = sums["bytes"] + (target_bytes * mask).sum(axis=0)[protocol.columns]
                blocks.add("bytes", block[mask], target_bytes[mask])
            if task:
                hits = np.asarray(data.exact_match(out["predictions"], batch), np.float64)[:rows]
                exact += float(hits.sum())
                blocks.add("exact", block[:rows, 0], hits)
                blocks.add("examples", block[:rows, 0], np.ones(rows))
            bar.update(min(batch_size, total - index * batch_size))
    if task:
        count = float(np.sum(sums["count"]))
        result = {
            "exact_match": exact / protocol.num_examples,
            "accuracy": float(np.sum(sums["correct_sum"])) / max(count, 1.0),
            "num_scored_tokens": int(count),
            "blocks": blocks.to_dict(),
        }
        return result | protocol.fields(data)
    result = summarize(
        sums["loss_sum"],
        sums["correct_sum"],
        sums["count"],
        byte_sum=sums["bytes"],
        train_length=getattr(protocol, "train_length", None),
    )
    result.update(
        num_scored_tokens=result["tokens"],
        blocks=blocks.to_dict(getattr(data, "document_of", None)),
        **protocol.fields(data),
    )
    return result


def _generated(model: nnx.Module, protocol: TaskLength, task: Any, batch: dict) -> dict:
    """The sums `Evaluator` gives, for predictions decoded greedily (no loss)."""
    predictions = generate_predictions(model, task, batch, protocol.length)
    mask = np.asarray(batch["loss_mask"], np.float32)
    correct = (predictions == np.asarray(batch["targets"])) * mask
    return {
        "correct_sum": correct.sum(axis=0),
        "count": mask.sum(axis=0),
        "predictions": predictions,
        "token_correct": correct,
    }


def generate_predictions(
    model: nnx.Module, task: Any, batch: dict[str, Any], length: int
) -> np.ndarray:
    """Predictions int32 ``[B, T]`` for a task batch by greedy decoding of the answer.

    The answer is the last ``A = task.answer_length(length)`` targets (``loss_mask`` 1 there
    and 0 before). The prompt is ``inputs[:, :T - A + 1]``; `generate` produces ``A``
    tokens at ``batch["positions"]`` (``[B, T]``, the positions of the fed tokens), written
    into the answer positions; other positions hold 0 (unscored).
    """
    inputs = np.asarray(batch["inputs"])
    mask = np.asarray(batch["loss_mask"]) > 0
    t, a = inputs.shape[1], task.answer_length(length)
    counted = mask.any(axis=1)
    if not 1 <= a <= t or mask[:, : t - a].any() or not mask[counted, t - a :].all():
        raise ValueError(
            f"mode='generate' needs the answer to be the last answer_length={a} targets of "
            f"every sequence (loss_mask 1 there, 0 before); task {getattr(task, 'name', task)!r} "
            f"at length={length} does not mark it so (a padded batch?)"
        )
    tokens = generate(model, inputs[:, : t - a + 1], max_new_tokens=a, positions=batch["positions"])
    predictions = np.zeros(inputs.shape, np.int32)
    predictions[:, t - a :] = np.asarray(tokens)
    return predictions


def evaluate_lengths(
    model: nnx.Module,
    split: Any,
    lengths: Iterable[int],
    *,
    protocol: str = "nonoverlapping",
    stride_fraction: float = 0.5,
    max_bytes: int | None = None,
    train_length: int | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """`score` at every length in ``lengths`` with one window protocol (``"nonoverlapping"``
    or ``"sliding"``, whose stride is `sliding_stride` ``(length, stride_fraction)``).

    Lengths above ``model.cfg.chunked_threshold`` keys use chunked attention (same numbers to
    float32 tolerance, ``O(length)`` memory). ``max_bytes``: score only the targets within the
    split's first ``max_bytes + 1`` bytes of text; ``train_length``: for ``bucket_loss``;
    ``kwargs`` go to `score`. A study evaluates its whole
    `flaxformer_lite.evaluation.plan.EvalPlan` instead (`flaxformer_lite.evaluation.run`).
    """
    if protocol not in PROTOCOLS[:2]:  # the context protocol: protocols.Context
        raise ValueError(f"protocol={protocol!r}; allowed: {list(PROTOCOLS[:2])}")
    results = []
    for length in lengths:
        m = rebuild_model(model, attention_config(model.cfg, length))
        stride = sliding_stride(length, stride_fraction) if protocol == "sliding" else None
        windows = Windows(length, stride, max_bytes=max_bytes, train_length=train_length)
        results.append(score(m, windows, split, **kwargs))
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
