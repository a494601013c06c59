"""Pure, jit-compiled training and evaluation steps over a split NNX model (DESIGN.md §6).

The model is split once into a static ``graphdef`` and array state: ``params`` (the
``nnx.Param`` leaves, which the optimizer updates) and ``rest`` (everything else, e.g. the
dropout RNG counters). A training state is the plain dict::

    {"step": int32 [], "params": State, "rest": State, "opt_state": optax state}

Batches are dicts of ``inputs`` / ``targets`` int32 ``[batch, length]``, ``loss_mask``
float32 ``[batch, length]`` (1 = this target counts) and ``positions`` int32
``[batch, length]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

Array = jax.Array
TrainState = dict[str, Any]


def split_model(model: nnx.Module) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
    """``(graphdef, params, rest)``: parameters apart from all other state."""
    return nnx.split(model, nnx.Param, ...)


def init_train_state(model: nnx.Module, tx: optax.GradientTransformation):
    """``(graphdef, state)`` with step 0 and fresh optimizer moments."""
    graphdef, params, rest = split_model(model)
    state = {
        "step": jnp.zeros((), jnp.int32),
        "params": params,
        "rest": rest,
        "opt_state": tx.init(params),
    }
    return graphdef, state


def token_losses(logits: Array, targets: Array) -> tuple[Array, Array]:
    """Per-token cross-entropy in nats and 0/1 correctness, both float32 ``[batch, length]``."""
    logits = logits.astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    correct = (argmax_last(logits) == targets).astype(jnp.float32)
    return ce, correct


def argmax_last(x: Array) -> Array:
    """``jnp.argmax(x, axis=-1)`` (the first index of the maximum) for rows without NaN.

    One max, one compare-and-select and one integer min: XLA:CPU runs these as plain
    vectorised reductions, while ``argmax``'s (value, index) reduction took ~2 ms of the
    quick-preset train step (docs/performance.md). A row containing NaN gives the row size.
    """
    top = jnp.max(x, axis=-1, keepdims=True)
    index = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.min(jnp.where(x == top, index, x.shape[-1]), axis=-1)


def _forward(graphdef, params, rest, batch, *, deterministic: bool):
    model = nnx.merge(graphdef, params, rest)
    logits = model(batch["inputs"], batch["positions"], deterministic=deterministic)
    _, _, new_rest = split_model(model)
    return logits, new_rest


def make_train_step(
    graphdef: nnx.GraphDef, tx: optax.GradientTransformation, schedule: optax.Schedule
) -> Callable[[TrainState, dict[str, Array]], tuple[TrainState, dict[str, Array]]]:
    """A pure ``train_step(state, batch) -> (state, metrics)``; jit it with the state donated.

    Metrics (float32 scalars): ``loss`` (mean nats over counted targets), ``accuracy``,
    ``grad_norm`` (global L2 norm before clipping) and ``learning_rate`` (of this step).
    """

    def loss_fn(params, rest, batch):
        logits, new_rest = _forward(graphdef, params, rest, batch, deterministic=False)
        ce, correct = token_losses(logits, batch["targets"])
        mask = batch["loss_mask"].astype(jnp.float32)
        denom = jnp.maximum(mask.sum(), 1.0)
        loss = (ce * mask).sum() / denom
        return loss, ((correct * mask).sum() / denom, new_rest)

    def train_step(state: TrainState, batch: dict[str, Array]):
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        (loss, (accuracy, rest)), grads = grad_fn(state["params"], state["rest"], batch)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {
            "loss": loss,
            "accuracy": accuracy,
            "grad_norm": optax.tree.norm(grads),
            "learning_rate": jnp.asarray(schedule(state["step"]), jnp.float32),
        }
        new_state = {
            "step": state["step"] + 1,
            "params": params,
            "rest": rest,
            "opt_state": opt_state,
        }
        return new_state, metrics

    return train_step


def make_eval_step(graphdef: nnx.GraphDef):
    """``eval_step(params, rest, batch) -> sums``: per-position sums over the batch.

    Returns ``loss_sum``, ``correct_sum`` and ``count`` (float32 ``[length]``: summed over the
    batch, only counted targets) and ``predictions`` (int32 ``[batch, length]``, argmax).
    """

    def eval_step(params, rest, batch):
        logits, _ = _forward(graphdef, params, rest, batch, deterministic=True)
        ce, correct = token_losses(logits, batch["targets"])
        mask = batch["loss_mask"].astype(jnp.float32)
        return {
            "loss_sum": (ce * mask).sum(axis=0),
            "correct_sum": (correct * mask).sum(axis=0),
            "count": mask.sum(axis=0),
            "predictions": jnp.argmax(logits, axis=-1).astype(jnp.int32),
        }

    return eval_step
