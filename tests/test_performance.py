"""The speed-motivated rewrites compute exactly what the plain code computes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks import train_speed
from flaxformer_lite.core import attention
from flaxformer_lite.evaluation.step import argmax_last
from flaxformer_lite.nn.models import DecoderOnlyLM
from flaxformer_lite.train.step import init_train_state, make_train_step


def test_argmax_last_equals_argmax_including_ties():
    rng = np.random.default_rng(0)
    smooth = rng.standard_normal((3, 5, 17)).astype(np.float32)
    ties = rng.integers(0, 3, (4, 6, 9)).astype(np.float32)  # many tied maxima
    ties[0, 0] = 2.0  # a row that is all maxima: index 0
    for x in (smooth, ties):
        np.testing.assert_array_equal(argmax_last(jnp.asarray(x)), np.argmax(x, axis=-1))
    assert argmax_last(jnp.asarray(ties)).dtype == jnp.int32


def test_causal_weights_without_the_zeroing_pass_are_bitwise_the_masked_ones():
    """`attention_weights` skips the final select for a causal-only mask; the result is
    bit-for-bit the one computed with the same mask given explicitly (which selects)."""
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    q = jax.random.normal(keys[0], (2, 7, 3, 4)) * 4.0
    k = jax.random.normal(keys[1], (2, 9, 3, 4)) * 4.0
    bias = -0.5 * jnp.abs(jnp.arange(7)[:, None] - jnp.arange(9)[None, :]).astype(jnp.float32)
    causal = attention.attention_weights(q, k, bias=bias[None, None], causal=True)
    explicit = attention.attention_weights(
        q, k, bias=bias[None, None], mask=attention.causal_mask(7, 9)[None, None]
    )
    np.testing.assert_array_equal(np.asarray(causal), np.asarray(explicit))
    assert np.all(np.asarray(causal)[:, :, 0, 1:] == 0.0)


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


def test_benchmark_targets_are_judged_from_the_runs_own_medians():
    targets = train_speed.targets  # importing the benchmark configures nothing (main() does)
    med = {  # seconds per step
        "JAX float32": 0.400,
        "PyTorch float32": 0.430,  # 1.075x: below 1.1x
        "JAX bfloat16": 0.250,
        "PyTorch bfloat16 (autocast)": 0.250,  # exactly 1.0x: met
        "JAX float32 sinusoidal": 0.041,
        "PyTorch float32 sinusoidal": 0.040,  # JAX slower: missed
    }
    got = targets(med)
    assert [status for _, _, status in got] == ["missed", "met", "missed"]
    assert got[0][1].startswith("1.07x (400.0 vs 430.0 ms/step)")
    # a ratio just below its goal is printed with the digits that show it: not "1.00x missed"
    near = {"JAX bfloat16": 0.4345, "PyTorch bfloat16 (autocast)": 0.4328}  # 0.99609x
    assert targets(near)[0][1:] == ("0.996x (434.5 vs 432.8 ms/step)", "missed")
    # a contestant that did not run leaves its target out; another implementation's labels
    assert targets({"JAX float32": 0.4}) == []
    cudnn = targets({"JAX float32 (cudnn)": 0.2, "PyTorch float32": 0.3}, "cudnn")
    assert [(s, m[:5]) for _, m, s in cudnn] == [("met", "1.50x")]
    # with the rounds: the verdict stays the medians'; the spread is of paired rounds
    times = {"JAX float32": [0.40, 0.38, 0.50], "PyTorch float32": [0.43, 0.456, 0.45]}
    (_, measured, status), *_ = targets({k: sorted(v)[1] for k, v in times.items()}, "xla", times)
    # medians 0.45 / 0.40 = 1.125: met (the median of the paired rounds' ratios, 1.075, is not)
    assert status == "met"
    assert measured == "1.12x (400.0 vs 450.0 ms/step; rounds 0.90-1.20x)"
    # a contestant with fewer rounds (or one round) gives no range
    one = {"JAX float32": [0.4], "PyTorch float32": [0.43]}
    assert "rounds" not in targets(med, "xla", one)[0][1]
