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
from flaxformer_lite.evaluation.metrics import LN2, summarize
from flaxformer_lite.evaluation.protocols import Context, TaskLength, Windows
from flaxformer_lite.evaluation.step import Evaluator, rebuild_model
from flaxformer_lite.nn.generate import generate
from flaxformer_lite.nn.model_config import ModelConfig

# (batch index, batch size, length) -> int32 positions [batch, length]
PositionFn = Callable[[int, int, int], np.ndarray]
Protocol = Windows | Context | TaskLength


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
    compiler_options: dict[str, Any] | None = None,
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
      compiler_options: of the jitted step, as ``jax.jit`` takes them (e.g. oneDNN products
        on CPU, `train.cpu_matmul`); None: XLA's default.

    Returns:
      Corpus protocols: `metrics.summarize` 's metrics (``loss``, ``bits_per_byte``,
      ``perplexity``, ``accuracy``, ``tokens``, ``loss_by_position`` over the protocol's
      columns, ``scored_bytes``, ``bucket_loss``), ``num_scored_tokens``, the protocol's
      fields (``eval_length``, ``protocol``, ...) and ``blocks`` (per-block sums, each block
      with the file of its first target). `TaskLength`: ``exact_match``, ``accuracy``,
      ``num_scored_tokens``, its fields and ``blocks``.
    """
    generating = isinstance(protocol, TaskLength) and protocol.mode == "generate"
    if not generating:
        evaluator = Evaluator(model, incremental=incremental, compiler_options=compiler_options)
    tally = _Tally(protocol, data)
    total = protocol.count(data)
    bar = tqdm(total=total, desc=protocol.describe(), unit="win", disable=not progress, leave=False)
    with bar:  # closed also when interrupted: the interrupt's message gets a line of its own
        for index, batch in enumerate(protocol.batches(data, batch_size)):
            batch = dict(batch)
            targets = {k: batch.pop(k) for k in _TARGET_FIELDS if k in batch}
            batch["positions"] = positions_fn(index, batch_size, batch["inputs"].shape[1])
            out = _generated(model, protocol, data, batch) if generating else evaluator(batch)
            tally.add(out, batch, targets)
            bar.update(min(batch_size, total - index * batch_size))
    return tally.result()


_SUMS = ("loss_sum", "correct_sum", "count", "bytes")  # per position: `_Tally.sums`
# what a protocol's batch says of its targets, beside the model's inputs
_TARGET_FIELDS = ("block", "rows", "target_position", "target_offset", "target_bytes", "key")


class _Tally:
    """The sums of one `score` call: per position (over the protocol's columns) and per
    statistics block, and a task's exact matches."""

    def __init__(self, protocol: Protocol, data: Any):
        self.protocol, self.data = protocol, data
        self.task = isinstance(protocol, TaskLength)
        self.sums: dict[str, Any] = dict.fromkeys(_SUMS, 0.0)
        self.blocks = BlockSums(protocol.block_size, protocol.block_unit)
        self.exact = 0.0
        self.key: dict[str, float] | None = None  # the key targets' sums, if the protocol has them

    def add(self, out: dict[str, Any], batch: dict[str, Any], targets: dict[str, Any]) -> None:
        """Add one batch's evaluator output ``out`` (its targets described by ``targets``)."""
        columns, block = self.protocol.columns, targets["block"]
        mask = batch["loss_mask"] > 0
        ids = block[mask]
        for k in ("loss_sum", "correct_sum", "count"):
            if k in out:
                self.sums[k] = self.sums[k] + out[k][columns]
        if "target_position" in targets:
            self.blocks.note_positions(ids, targets["target_position"][mask])
        if "token_loss" in out:
            self.blocks.add("loss", ids, out["token_loss"][mask])
        self.blocks.add("correct", ids, out["token_correct"][mask])
        self.blocks.add("count", ids, np.ones(ids.shape[0]))
        if "target_bytes" in targets:
            nbytes = targets["target_bytes"]
            self.sums["bytes"] = self.sums["bytes"] + (nbytes * mask).sum(axis=0)[columns]
            self.blocks.add("bytes", ids, nbytes[mask])
        if "key" in targets:
            self._add_key(out, mask, ids, targets)
        if self.task:
            rows = int(targets["rows"])
            hits = np.asarray(self.data.exact_match(out["predictions"], batch), np.float64)[:rows]
            self.exact += float(hits.sum())
            self.blocks.add("exact", block[:rows, 0], hits)
            self.blocks.add("examples", block[:rows, 0], np.ones(rows))

    def _add_key(self, out: dict, mask: np.ndarray, ids: np.ndarray, targets: dict) -> None:
        """Add the key targets' loss, count and bytes (`protocols.Context.key_near`)."""
        key = targets["key"][mask]
        nbytes = targets["target_bytes"][mask] if "target_bytes" in targets else np.ones_like(key)
        parts = {"key_loss": out["token_loss"][mask], "key_count": 1.0, "key_bytes": nbytes}
        self.key = self.key or dict.fromkeys(parts, 0.0)
        for field, value in parts.items():
            self.blocks.add(field, ids, key * value)
            self.key[field] += float(np.sum(key * value))

    def result(self) -> dict[str, Any]:
        """The metrics, the protocol's fields and the blocks."""
        fields = self.protocol.fields(self.data)
        s = self.sums
        if self.task:
            count = float(np.sum(s["count"]))
            return {
                "exact_match": self.exact / self.protocol.num_examples,
                "accuracy": float(np.sum(s["correct_sum"])) / max(count, 1.0),
                "num_scored_tokens": int(count),
                "blocks": self.blocks.to_dict(),
            } | fields
        train_length = getattr(self.protocol, "train_length", None)
        out = summarize(
            s["loss_sum"],
            s["correct_sum"],
            s["count"],
            byte_sum=s["bytes"],
            train_length=train_length,
        )
        out["num_scored_tokens"] = out["tokens"]
        if self.key is not None:  # bits per key byte: None where the split has no key target
            k = self.key
            out["key_targets"] = round(k["key_count"])
            out["key_bits_per_byte"] = (
                k["key_loss"] / LN2 / k["key_bytes"] if k["key_bytes"] else None
            )
        out["blocks"] = self.blocks.to_dict(getattr(self.data, "document_of", None))
        return out | fields


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

    Lengths above `attention_config`'s threshold use chunked attention (same numbers to
    float32 tolerance, ``O(length)`` memory). ``max_bytes``: score only the targets of the
    split's first ``max_bytes`` bytes of text; ``train_length``: for ``bucket_loss``;
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
    """``cfg`` with the attention implementation for scoring sequences of ``keys`` tokens:
    chunked above ``cfg.chunked_threshold`` or `core.attention.FORWARD_CHUNKED_THRESHOLD`,
    whichever is lower (`core.attention.choose_implementation`; evaluation is a forward pass
    alone, where chunking pays from fewer keys than in training)."""
    threshold = min(cfg.chunked_threshold, attention.FORWARD_CHUNKED_THRESHOLD)
    impl = attention.choose_implementation(cfg.attention_impl, keys, keys, threshold=threshold)
    if impl == "auto" and threshold < keys <= cfg.chunked_threshold:
        return cfg.replace(chunked_threshold=threshold)  # "auto" decides per call: tell it
    return cfg.replace(attention_impl=impl)
