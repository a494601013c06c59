"""Synthetic-task evaluation: exact match of the answer at each task length.

Teacher-forced (the argmax at each answer position given the true prefix) or generated
(greedy decoding of the answer from the prompt alone, through the KV cache).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from flax import nnx

from flaxformer_lite.evaluation.blocks import DEFAULT_BLOCK_EXAMPLES, BlockSums
from flaxformer_lite.evaluation.corpus import PositionFn, arange_positions
from flaxformer_lite.evaluation.step import Evaluator
from flaxformer_lite.nn.generate import generate

TASK_MODES = ("teacher_forced", "generate")


def evaluate_task(
    model: nnx.Module,
    task: Any,
    lengths: Iterable[int],
    *,
    num_examples: int = 256,
    batch_size: int = 32,
    seed: int = 0,
    positions_fn: PositionFn = arange_positions,
    mode: str = "teacher_forced",
) -> list[dict[str, Any]]:
    """`evaluate_task_length` at every task length in ``lengths`` (the same model)."""
    return [
        evaluate_task_length(
            model,
            task,
            length,
            num_examples=num_examples,
            batch_size=batch_size,
            seed=seed,
            positions_fn=positions_fn,
            mode=mode,
        )
        for length in lengths
    ]


def evaluate_task_length(
    model: nnx.Module,
    task: Any,
    length: int,
    *,
    num_examples: int = 256,
    batch_size: int = 32,
    seed: int = 0,
    positions_fn: PositionFn = arange_positions,
    mode: str = "teacher_forced",
    incremental: bool = False,
    block_examples: int = DEFAULT_BLOCK_EXAMPLES,
) -> dict[str, Any]:
    """Exact-match accuracy (every answer token right) of a synthetic task at one length.

    Examples are drawn from ``np.random.default_rng([seed, length])`` so every model sees the
    same examples at a given length. ``mode="teacher_forced"`` (default): predictions are
    the argmax at each answer position given the true prefix. ``mode="generate"``: the
    answer is decoded greedily from the prompt alone (`generate_predictions`); the row then
    carries ``"mode": "generate"``. For one example the two agree on exact match (greedy
    decoding reproduces the answer iff every teacher-forced answer argmax is right); the
    per-token ``accuracy`` differs after a first error. ``incremental``: teacher-forced
    scoring token by token through the KV cache (see `evaluation.step.Evaluator`).
    """
    if mode not in TASK_MODES:
        raise ValueError(f"mode={mode!r} is not known; allowed: {list(TASK_MODES)}")
    evaluator = Evaluator(model, incremental=incremental) if mode == "teacher_forced" else None
    rng = np.random.default_rng([seed, length])
    exact, correct, count, done, index = 0.0, 0.0, 0.0, 0, 0
    blocks = BlockSums(block_examples, "examples")
    while done < num_examples:
        batch = task.sample(rng, batch_size, length)
        n = min(batch_size, num_examples - done)
        t = batch["inputs"].shape[1]
        batch = dict(batch, positions=positions_fn(index, batch_size, t))
        if evaluator is None:
            predictions = generate_predictions(model, task, batch, length)
        else:
            predictions = evaluator(batch)["predictions"]
        hits = np.asarray(task.exact_match(predictions, batch), np.float64)[:n]
        mask = batch["loss_mask"][:n]
        right = ((predictions[:n] == batch["targets"][:n]) * mask).sum(axis=1)
        exact += float(hits.sum())
        correct += float(right.sum())
        count += float(mask.sum())
        ids = (done + np.arange(n)) // block_examples
        blocks.add("exact", ids, hits)
        blocks.add("examples", ids, np.ones(n))
        blocks.add("correct", ids, right)
        blocks.add("count", ids, mask.sum(axis=1))
        done += n
        index += 1
    row = {
        "eval_length": length,
        "protocol": "task",
        "exact_match": exact / num_examples,
        "accuracy": correct / max(count, 1.0),
        "examples": num_examples,
        "num_scored_tokens": int(count),
        "blocks": blocks.to_dict(),
    }
    return row if mode == "teacher_forced" else row | {"mode": mode}


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
    if not 1 <= a <= t or mask[:, : t - a].any() or not mask[:, t - a :].all():
        raise ValueError(
            f"mode='generate' needs the answer to be the last answer_length={a} targets of "
            f"every sequence (loss_mask 1 there, 0 before); task {getattr(task, 'name', task)!r} "
            f"at length={length} does not mark it so (a padded batch?)"
        )
    tokens = generate(model, inputs[:, : t - a + 1], max_new_tokens=a, positions=batch["positions"])
    predictions = np.zeros(inputs.shape, np.int32)
    predictions[:, t - a :] = np.asarray(tokens)
    return predictions
