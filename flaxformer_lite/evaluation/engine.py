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

import functools
import itertools
import math
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from flaxformer_lite.base import faults
from flaxformer_lite.nn.generate import generate
from flaxformer_lite.nn.model_config import ModelConfig
from flaxformer_lite.train.step import make_eval_step, split_model

# (window index, batch size, length) -> int32 positions [batch, length]
PositionFn = Callable[[int, int, int], np.ndarray]
LN2 = math.log(2.0)
TASK_MODES = ("teacher_forced", "generate")


def arange_positions(index: int, batch: int, length: int) -> np.ndarray:
    """Positions ``0..length-1`` for every row (the default scheme)."""
    del index
    return np.broadcast_to(np.arange(length, dtype=np.int32)[None, :], (batch, length))


def rebuild_model(model: nnx.Module, cfg: ModelConfig) -> nnx.Module:
    """The same parameters under another config that changes no parameter shape (e.g. the
    attention implementation or RoPE scaling): returns a new module sharing ``model``'s state."""
    graphdef_new, _ = nnx.split(nnx.eval_shape(lambda: type(model)(cfg, rngs=nnx.Rngs(0))))
    _, state = nnx.split(model)
    return nnx.merge(graphdef_new, state)


def for_length(
    model: nnx.Module, variant: Callable[[ModelConfig, int], ModelConfig] | None, length: int
) -> nnx.Module:
    """``model`` under ``variant(model.cfg, length)`` (itself when the config is unchanged)."""
    if variant is None:
        return model
    cfg = variant(model.cfg, length)
    return model if cfg == model.cfg else rebuild_model(model, cfg)


@functools.lru_cache(maxsize=32)
def _jitted_eval_step(graphdef: nnx.GraphDef):
    """One jitted eval step per model structure, so repeated evaluations (periodic
    validation, several lengths, several tasks) reuse its compilations."""
    return jax.jit(make_eval_step(graphdef))


class _Evaluator:
    """Jit-compiled per-position sums for one model, one compile per batch shape."""

    def __init__(self, model: nnx.Module):
        graphdef, self.params, self.rest = split_model(model)
        self.step = _jitted_eval_step(graphdef)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        faults.hit("eval_batch")  # test-only kill point (flaxformer_lite.base.faults)
        out = self.step(self.params, self.rest, {k: jnp.asarray(v) for k, v in batch.items()})
        return jax.device_get(out)


def summarize(
    loss_sum: np.ndarray,
    correct_sum: np.ndarray,
    count: np.ndarray,
    *,
    train_length: int | None = None,
) -> dict[str, Any]:
    """Aggregate per-position sums (float ``[length]``) into the reported metrics.

    ``loss`` is mean nats per scored token, ``bits_per_byte = loss / ln 2`` (tokens are bytes),
    ``perplexity = exp(loss)``. ``loss_by_position[t]`` is the mean loss of targets at window
    offset ``t`` (``t + 1`` tokens of context; NaN where none were scored). With
    ``train_length`` L, ``bucket_loss`` averages the positions in ``[0, L), [L, 2L), [2L, 4L),
    ...`` (the buckets where the failure modes of extrapolation show).
    """
    tokens = float(count.sum())
    if tokens == 0:
        raise ValueError("no target was scored (empty evaluation)")
    loss = float(loss_sum.sum() / tokens)
    with np.errstate(invalid="ignore", divide="ignore"):
        by_pos = np.where(count > 0, loss_sum / np.maximum(count, 1), np.nan)
    out: dict[str, Any] = {
        "loss": loss,
        "bits_per_byte": loss / LN2,
        "perplexity": math.exp(min(loss, 700.0)),
        "accuracy": float(correct_sum.sum() / tokens),
        "tokens": int(tokens),
        "loss_by_position": [None if math.isnan(v) else float(v) for v in by_pos],
    }
    if train_length:
        out["bucket_loss"] = bucket_losses(loss_sum, count, train_length)
    return out


def bucket_losses(loss_sum: np.ndarray, count: np.ndarray, train_length: int) -> dict[str, float]:
    """Mean loss over window offsets ``[0, L)``, ``[L, 2L)``, ``[2L, 4L)``, ... up to the length."""
    length = loss_sum.shape[0]
    edges = [0, train_length]
    while edges[-1] < length:
        edges.append(min(2 * edges[-1], length))
    buckets = {}
    for lo, hi in itertools.pairwise(edges):
        n = float(count[lo:hi].sum())
        if n > 0:
            buckets[f"[{lo},{hi})"] = float(loss_sum[lo:hi].sum() / n)
    return buckets


def evaluate_length(
    model: nnx.Module,
    split: Any,
    length: int,
    *,
    stride: int | None = None,
    max_tokens: int = 65536,
    batch_size: int = 8,
    train_length: int | None = None,
    positions_fn: PositionFn = arange_positions,
    progress: bool = False,
) -> dict[str, Any]:
    """Score ``model`` on windows of ``length`` tokens of a byte ``split``.

    Args:
      model: a causal LM called as ``model(tokens, positions, deterministic=True)``.
      split: a `flaxformer_lite.data` split (``eval_batches``).
      length: window length L'.
      stride: None for non-overlapping windows, else the sliding-window stride S (1..L').
      max_tokens: score the first ``max_tokens`` targets of the split.
      batch_size: windows per batch (the last batch is padded, so one compile per length).
      train_length: the training length, for ``bucket_loss``.
      positions_fn: positions of each batch (default ``0..L'-1``).

    Returns:
      `summarize` 's metrics plus ``eval_length``, ``protocol``, ``stride`` and ``windows``.
    """
    evaluator = _Evaluator(model)
    batches = split.eval_batches(
        length, batch_size, stride=stride, max_bytes=max_tokens + 1, pad_batch=True
    )
    total = split.num_eval_windows(length, stride=stride, max_bytes=max_tokens + 1)
    sums = {k: np.zeros(length, np.float64) for k in ("loss_sum", "correct_sum", "count")}
    bar = tqdm(total=total, desc=f"eval L'={length}", unit="win", disable=not progress, leave=False)
    for index, batch in enumerate(batches):
        batch = dict(batch, positions=positions_fn(index, batch_size, length))
        out = evaluator(batch)
        for k in sums:
            sums[k] += out[k]
        bar.update(min(batch_size, total - index * batch_size))
    bar.close()
    result = summarize(**sums, train_length=train_length)
    result.update(
        eval_length=length,
        protocol="nonoverlapping" if stride in (None, length) else "sliding",
        stride=length if stride is None else stride,
        windows=total,
    )
    return result


def evaluate_lengths(
    model: nnx.Module,
    split: Any,
    lengths: Iterable[int],
    *,
    protocol: str = "nonoverlapping",
    stride_fraction: float = 0.5,
    variant: Callable[[ModelConfig, int], ModelConfig] | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """`evaluate_length` at every length in ``lengths`` with one protocol.

    ``variant(cfg, length)`` may return a different config for a length (same parameters),
    e.g. chunked attention for long inputs or RoPE scaling; ``kwargs`` go to
    `evaluate_length`. For ``protocol="sliding"`` the stride is
    ``max(1, round(length * stride_fraction))``.
    """
    if protocol not in ("nonoverlapping", "sliding"):
        raise ValueError(f"protocol={protocol!r}; allowed: ['nonoverlapping', 'sliding']")
    results = []
    for length in lengths:
        m = for_length(model, variant, length)
        stride = None
        if protocol == "sliding":
            stride = max(1, round(length * stride_fraction))
        results.append(evaluate_length(m, split, length, stride=stride, **kwargs))
    return results


def evaluate_task(
    model: nnx.Module,
    task: Any,
    lengths: Iterable[int],
    *,
    num_examples: int = 256,
    batch_size: int = 32,
    seed: int = 0,
    positions_fn: PositionFn = arange_positions,
    variant: Callable[[ModelConfig, int], ModelConfig] | None = None,
    mode: str = "teacher_forced",
) -> list[dict[str, Any]]:
    """Exact-match accuracy (every answer token right) of a synthetic task at each length.

    Examples are drawn from ``np.random.default_rng([seed, length])`` so every model sees the
    same examples at a given length. ``mode="teacher_forced"`` (default): predictions are
    the argmax at each answer position given the true prefix. ``mode="generate"``: the
    answer is decoded greedily from the prompt alone (`generate_predictions`); rows then
    carry ``"mode": "generate"``. For one example the two agree on exact match (greedy
    decoding reproduces the answer iff every teacher-forced answer argmax is right); the
    per-token ``accuracy`` differs after a first error.
    """
    if mode not in TASK_MODES:
        raise ValueError(f"mode={mode!r} is not known; allowed: {list(TASK_MODES)}")
    results = []
    for length in lengths:
        m = for_length(model, variant, length)
        evaluator = _Evaluator(m) if mode == "teacher_forced" else None
        rng = np.random.default_rng([seed, length])
        exact, correct, count, done, index = 0.0, 0.0, 0.0, 0, 0
        while done < num_examples:
            batch = task.sample(rng, batch_size, length)
            n = min(batch_size, num_examples - done)
            t = batch["inputs"].shape[1]
            batch = dict(batch, positions=positions_fn(index, batch_size, t))
            if evaluator is None:
                predictions = generate_predictions(m, task, batch, length)
            else:
                predictions = evaluator(batch)["predictions"]
            exact += float(np.asarray(task.exact_match(predictions, batch))[:n].sum())
            mask = batch["loss_mask"][:n]
            correct += float(((predictions[:n] == batch["targets"][:n]) * mask).sum())
            count += float(mask.sum())
            done += n
            index += 1
        row = {
            "eval_length": length,
            "protocol": "task",
            "exact_match": exact / num_examples,
            "accuracy": correct / max(count, 1.0),
            "examples": num_examples,
        }
        results.append(row if mode == "teacher_forced" else row | {"mode": mode})
    return results


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
