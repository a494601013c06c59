"""The jit train step (`train.step`): bfloat16 training stays finite for every encoding."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from flaxformer_lite.nn.encodings import positional_encoding_names
from flaxformer_lite.nn.models import DecoderOnlyLM
from flaxformer_lite.train.optim import learning_rate_schedule, make_optimizer
from flaxformer_lite.train.run_config import OptimConfig
from flaxformer_lite.train.step import init_train_state, make_train_step

STEPS, BATCH, LENGTH = 4, 2, 16
# Less LLVM optimisation: halves the compile time of each step; the HLO, and with it the
# dtypes of every operation, is the same.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _batch(step: int) -> dict[str, jax.Array]:
    rng = np.random.default_rng([7, step])
    tokens = rng.integers(0, 256, size=(BATCH, LENGTH + 1))
    return {
        "inputs": jnp.asarray(tokens[:, :-1], jnp.int32),
        "targets": jnp.asarray(tokens[:, 1:], jnp.int32),
        "loss_mask": jnp.ones((BATCH, LENGTH), jnp.float32),
        "positions": jnp.broadcast_to(jnp.arange(LENGTH, dtype=jnp.int32), (BATCH, LENGTH)),
    }


@pytest.mark.parametrize("positional", positional_encoding_names())
def test_bfloat16_training_stays_finite(positional, tiny_config):
    """A few AdamW steps of a tiny decoder LM computing and storing everything in bfloat16
    (a high learning rate, no clipping): every metric and parameter stays finite, and the
    loss starts where a uniform guess over 256 bytes is."""
    cfg = tiny_config(
        positional,
        options={"learned": {"max_length": LENGTH}, "rope": {"original_length": LENGTH}},
        vocab_size=256,
        num_encoder_layers=0,
        norm="pre",
        max_position=LENGTH,
        dtype="bfloat16",
        param_dtype="bfloat16",
    )
    model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
    optim = OptimConfig(learning_rate=3e-2, warmup_steps=0, clip_norm=0.0)
    tx = make_optimizer(optim, STEPS)
    graphdef, state = init_train_state(model, tx)
    step = jax.jit(make_train_step(graphdef, tx, learning_rate_schedule(optim, STEPS)))
    step = step.lower(state, _batch(0)).compile(compiler_options=FAST_COMPILE)
    losses = []
    for t in range(STEPS):
        state, metrics = step(state, _batch(t))
        metrics = {k: float(v) for k, v in metrics.items()}
        assert all(math.isfinite(v) for v in metrics.values()), (t, metrics)
        losses.append(metrics["loss"])
    assert abs(losses[0] - math.log(256)) < 1.0, losses
    leaves = jax.tree.leaves(state["params"])
    assert {x.dtype for x in leaves} == {jnp.dtype(jnp.bfloat16)}  # really trained in bf16
    for x in leaves:
        assert bool(jnp.all(jnp.isfinite(x.astype(jnp.float32))))


def test_train_step_donates_the_whole_state(tiny_config):
    """Every state buffer is donated: the step updates parameters and moments in place."""
    cfg = tiny_config("alibi", vocab_size=256, num_encoder_layers=0)
    tx = optax.adamw(1e-3)
    graphdef, state = init_train_state(DecoderOnlyLM(cfg, rngs=nnx.Rngs(0)), tx)
    step = jax.jit(make_train_step(graphdef, tx, optax.constant_schedule(1e-3)), donate_argnums=0)
    batch = {
        "inputs": jnp.zeros((2, 8), jnp.int32),
        "targets": jnp.ones((2, 8), jnp.int32),
        "loss_mask": jnp.ones((2, 8), jnp.float32),
        "positions": jnp.broadcast_to(jnp.arange(8, dtype=jnp.int32), (2, 8)),
    }
    old = [x for x in jax.tree.leaves(state) if isinstance(x, jax.Array)]
    new_state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    assert old and all(x.is_deleted() for x in old)
    assert not any(x.is_deleted() for x in jax.tree.leaves(new_state))
