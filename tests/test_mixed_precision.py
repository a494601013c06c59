"""mixed_precision.dense: bf16 operands, float32 accumulation, float32 parameter gradients."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxformer_lite.core import mixed_precision
from flaxformer_lite.nn.models import DecoderOnlyLM, default_positions


def _inputs(seed=0, shape=(2, 5, 8), d_out=6):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    k = rng.standard_normal((shape[-1], d_out)).astype(np.float32)
    b = rng.standard_normal((d_out,)).astype(np.float32)
    g = rng.standard_normal((*shape[:-1], d_out)).astype(np.float32)
    return x, k, b, g


def _bf16_round(a):
    return np.asarray(jnp.asarray(a, jnp.bfloat16).astype(jnp.float32))


def test_float32_is_the_plain_product():
    x, k, b, _ = _inputs()
    y = mixed_precision.dense(jnp.asarray(x), jnp.asarray(k), jnp.asarray(b))
    np.testing.assert_allclose(y, x @ k + b, rtol=1e-6, atol=1e-6)
    assert y.dtype == jnp.float32


def test_bf16_forward_rounds_once_after_a_float32_sum():
    x, k, b, _ = _inputs(1)
    y = mixed_precision.dense(jnp.asarray(x, jnp.bfloat16), jnp.asarray(k), jnp.asarray(b))
    assert y.dtype == jnp.bfloat16
    # reference: the bf16-rounded operands multiplied and summed in float64, plus the
    # float32 bias, rounded once to bf16
    ref = _bf16_round(_bf16_round(x).astype(np.float64) @ _bf16_round(k) + b)
    np.testing.assert_allclose(np.asarray(y, np.float32), ref, rtol=1e-2, atol=1e-2)
    assert np.mean(np.asarray(y, np.float32) == ref) > 0.9  # mostly the same bf16 number


def test_bf16_gradients_are_float32_sums_of_bf16_operands():
    x, k, b, g = _inputs(2)
    xb = jnp.asarray(x, jnp.bfloat16)

    def f(x, k, b):
        return mixed_precision.dense(x, k, b)

    _, vjp = jax.vjp(f, xb, jnp.asarray(k), jnp.asarray(b))
    dx, dk, db = vjp(jnp.asarray(g, jnp.bfloat16))
    assert dx.dtype == jnp.bfloat16 and dk.dtype == jnp.float32 and db.dtype == jnp.float32
    xr, kr, gr = (_bf16_round(a).astype(np.float64) for a in (x, k, g))
    lead = (0, 1)
    np.testing.assert_allclose(dk, np.tensordot(xr, gr, axes=(lead, lead)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(db, gr.sum(axis=lead), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(dx, np.float32), _bf16_round(gr @ kr.T), rtol=1e-2, atol=1e-2
    )


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match=r"x \[\.\.\., d_in\] and kernel \[d_in, d_out\]"):
        mixed_precision.dense(jnp.ones((2, 3)), jnp.ones((4, 5)))
    with pytest.raises(ValueError, match="bias shape"):
        mixed_precision.dense(jnp.ones((2, 3)), jnp.ones((3, 5)), jnp.ones((4,)))


def test_bf16_train_step_has_no_bf16_output_matmul(tiny_config):
    """Every product in a bf16 model's loss gradient accumulates in float32 (the fast CPU
    path): no ``dot_general`` with bf16 operands and a bf16 result."""
    cfg = tiny_config("rope", vocab_size=256, num_encoder_layers=0, norm="pre", dtype="bfloat16")
    model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tokens = jnp.zeros((2, 8), jnp.int32)

    def loss(params):
        m = nnx.merge(graphdef, params, rest)
        return m(tokens, default_positions(tokens)).mean()

    text = jax.jit(jax.grad(loss)).lower(params).as_text()
    dots = [line for line in text.splitlines() if "dot_general" in line]
    assert len(dots) >= 10
    bad = [d for d in dots if re.search(r"-> tensor<[^>]*bf16>", d)]
    assert not bad, bad[:3]
