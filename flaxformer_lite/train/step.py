"""The pure, jit-compiled training step over a split NNX model (DESIGN.md §6).

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

from flaxformer_lite.evaluation.step import forward, split_model, token_losses
from flaxformer_lite.nn import constraints

Array = jax.Array
TrainState = dict[str, Any]


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


def make_train_step(
    graphdef: nnx.GraphDef, tx: optax.GradientTransformation, schedule: optax.Schedule
) -> Callable[[TrainState, dict[str, Array]], tuple[TrainState, dict[str, Array]]]:
    """A pure ``train_step(state, batch) -> (state, metrics)``; jit it with the state donated.

    Metrics (float32 scalars): ``loss`` (mean nats over counted targets), ``accuracy``,
    ``grad_norm`` (global L2 norm before clipping) and ``learning_rate`` (of this step).
    """

    def loss_fn(params, rest, batch):
        logits, new_rest = forward(graphdef, params, rest, batch, deterministic=False)
        ce, correct = token_losses(logits, batch["targets"])
        mask = batch["loss_mask"].astype(jnp.float32)
        denom = jnp.maximum(mask.sum(), 1.0)
        loss = (ce * mask).sum() / denom
        return loss, ((correct * mask).sum() / denom, new_rest)

    def train_step(state: TrainState, batch: dict[str, Array]):
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        (loss, (accuracy, rest)), grads = grad_fn(state["params"], state["rest"], batch)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        # parameters with a box (KERPLE's r1, r2) are projected back into it
        params = constraints.project(optax.apply_updates(state["params"], updates))
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


def make_multi_step(
    train_step: Callable[[TrainState, dict[str, Array]], tuple[TrainState, dict[str, Array]]],
) -> Callable[[TrainState, dict[str, Array]], tuple[TrainState, dict[str, Array]]]:
    """``multi_step(state, batches) -> (state, metrics)``: ``train_step`` once per batch of a
    stack, as one `jax.lax.scan`, so that one compiled call runs several optimizer steps.

    ``batches`` holds every batch array with a leading steps axis, e.g. ``inputs`` int32
    ``[steps, batch, length]``; each metric comes back with that axis, ``[steps]``. The steps
    are exactly ``train_step``'s, in order: on CPU the resulting parameters equal those of
    ``steps`` separate calls bit for bit (tested). It pays once per call the host time every
    call costs (flattening the state, a few hundred arrays, and dispatching it), which is a
    visible share of a small model's step (docs/performance.md §Steps per call). Jit it with
    the state donated, as the single step.
    """

    def multi_step(state: TrainState, batches: dict[str, Array]):
        return jax.lax.scan(train_step, state, batches)

    return multi_step
