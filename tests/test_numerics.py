"""Numerics: bfloat16 training stays finite for every encoding; softmax survives huge logits."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxformer_lite.core import attention
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


@pytest.mark.parametrize("implementation", ["xla", "chunked"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_softmax_of_huge_logits_is_finite_with_finite_gradients(implementation, dtype):
    """Logits of +-1e4 (from q.k and from the bias) give finite outputs equal to the hard
    attention they approximate, and finite gradients."""
    b, n, h, d = 1, 6, 2, 4
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(b, n, h, d)), dtype)
    k = jnp.asarray(rng.normal(size=(b, n, h, d)), dtype)
    v = jnp.asarray(rng.normal(size=(b, n, h, d)), dtype)
    positions = jnp.arange(n, dtype=jnp.int32)[None, :]

    def bias_fn(qp, kp):
        """+1e4 on key j = i // 2 (<= i), -1e4 elsewhere: each query sees one key only."""
        hit = kp[:, None, None, :] == qp[:, None, :, None] // 2
        return jnp.broadcast_to(
            jnp.where(hit, 1e4, -1e4).astype(jnp.float32), (b, h, qp.shape[1], kp.shape[1])
        )

    def out(q, k, v, scale):
        return attention.attend(
            q * scale,
            k,
            v,
            q_positions=positions,
            k_positions=positions,
            bias_fn=bias_fn,
            causal=True,
            implementation=implementation,
        )

    y = out(q, k, v, 1.0)
    assert y.dtype == dtype and bool(jnp.all(jnp.isfinite(y.astype(jnp.float32))))
    expected = np.asarray(v, np.float32)[:, np.arange(n) // 2]  # the one key each query sees
    np.testing.assert_allclose(np.asarray(y, np.float32), expected, atol=1e-2)

    # q.k itself huge (|logits| ~ 1e4 and beyond): still finite, gradients too.
    def loss(q, k, v):
        return out(q, k, v, 3e3).astype(jnp.float32).sum()

    grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    assert bool(jnp.all(jnp.isfinite(out(q, k, v, 3e3).astype(jnp.float32))))
    for g in grads:
        assert bool(jnp.all(jnp.isfinite(g.astype(jnp.float32))))


def test_softmax_weights_of_opposite_huge_logits():
    """attention_weights of logits exactly +1e4 / -1e4: a one-hot row, finite gradients."""
    d = 4
    q = jnp.zeros((1, 1, 1, d)).at[..., 0].set(100.0)
    k = jnp.zeros((1, 3, 1, d)).at[0, :, 0, 0].set(jnp.array([200.0, -200.0, 0.0]))
    # logits = q.k / sqrt(d) = [1e4, -1e4, 0]
    w = attention.attention_weights(q, k)
    np.testing.assert_allclose(np.asarray(w[0, 0, 0]), [1.0, 0.0, 0.0], atol=0)
    g = jax.grad(lambda q: attention.attention_weights(q, k)[0, 0, 0, 1])(q)
    assert bool(jnp.all(jnp.isfinite(g)))
