"""mixed_precision.dense: bf16 operands, float32 accumulation, float32 parameter gradients;
float32 kernel gradients as one untransposed product."""

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


def test_float32_gradients_match_float64_numpy():
    """The custom float32 gradient (2-D kernel product over the flattened leading axes)
    against numpy in float64, for 3-D and 2-D inputs, with and without a bias, with
    ``d_in`` larger (8 -> 6: on CPU the product taken the other way round) and smaller
    (5 -> 6) than ``d_out``."""
    for shape, use_bias in (((2, 5, 8), True), ((7, 8), False), ((3, 4, 5), True)):
        x, k, b, g = _inputs(3, shape=shape)
        bias = jnp.asarray(b) if use_bias else None
        _, vjp = jax.vjp(
            lambda x, k, b: mixed_precision.dense(x, k, b), jnp.asarray(x), jnp.asarray(k), bias
        )
        dx, dk, db = vjp(jnp.asarray(g))
        assert dx.dtype == dk.dtype == jnp.float32
        lead = tuple(range(len(shape) - 1))
        x64, k64, g64 = (a.astype(np.float64) for a in (x, k, g))
        np.testing.assert_allclose(dx, g64 @ k64.T, rtol=1e-5, atol=1e-5)
        dk64 = np.tensordot(x64, g64, axes=(lead, lead))
        np.testing.assert_allclose(dk, dk64, rtol=1e-5, atol=1e-5)
        if use_bias:
            np.testing.assert_allclose(db, g64.sum(axis=lead), rtol=1e-5, atol=1e-5)
        else:
            assert db is None


@pytest.mark.parametrize("d_in, d_out", [(16, 48), (48, 16)])
def test_float32_kernel_gradient_is_one_untransposed_product(d_in, d_out):
    """Autodiff of the plain ``x @ kernel`` makes XLA:CPU copy ``g`` into a
    transposed buffer and contract its second axis (Eigen's slowest form); the custom
    gradient contracts the first axis of both operands, with the narrower operand on the
    left: the product's result is ``[16, 48]`` both for a ``16 -> 48`` layer
    (``[d_in, d_out]``) and for a ``48 -> 16`` one (``[d_out, d_in]``, then transposed).
    Checked on the compiled CPU program (the layouts are XLA's choice)."""
    if jax.default_backend() != "cpu":
        pytest.skip("the layout this test checks is XLA:CPU's")
    x, k, b, g = (jnp.asarray(a) for a in _inputs(4, shape=(4, 32, d_in), d_out=d_out))

    def loss(x, k, b, g):
        return jnp.vdot(mixed_precision.dense(x, k, b), g)

    text = jax.jit(jax.grad(loss, argnums=1)).lower(x, k, b, g).compile().as_text()
    dots = [line for line in text.splitlines() if re.search(r"= f32\[\d+,\d+\]\{1,0\} dot\(", line)]
    assert len(dots) == 1, text
    assert "= f32[16,48]{1,0} dot(" in dots[0], dots
    assert "lhs_contracting_dims={0}, rhs_contracting_dims={0}" in dots[0], dots


def test_float32_dense_layer_is_nnx_linear_forward_and_close_backward(tiny_config):
    """The model's dense layer in float32: the forward value of ``nnx.Linear`` bit for bit
    (the same product and bias add), the input gradient too; the kernel gradient sums the
    same products in another order (float32 rounding only)."""
    from flaxformer_lite.nn import layers

    cfg = tiny_config("rope", vocab_size=256, num_encoder_layers=0, norm="pre")
    dense = layers._dense(cfg, 8, 6, ("embed", "mlp"), rngs=nnx.Rngs(0))
    x, _, _, g = _inputs(5)
    x, g = jnp.asarray(x), jnp.asarray(g)

    graphdef, state = nnx.split(dense)

    def run(call):
        def f(x, state):
            return call(nnx.merge(graphdef, state), x)

        y, vjp = jax.vjp(f, x, state)
        dx, dstate = vjp(g)
        grads = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(dstate)}
        assert len(grads) == 2, grads
        dkernel = next(v for p, v in grads.items() if "kernel" in p)
        dbias = next(v for p, v in grads.items() if "bias" in p)
        return y, dx, dkernel, dbias

    ours = run(lambda m, x: m(x))
    plain = run(lambda m, x: nnx.Linear.__call__(m, x))
    for name, a, b in zip(("y", "dx", "dkernel", "dbias"), ours, plain, strict=True):
        if name == "dkernel":
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)


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


def _np_gelu_tanh(x):
    x = np.asarray(x, np.float64)
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def test_is_low_precision_names_floats_narrower_than_float32():
    """The one test of "low precision" that `elementwise_in_float32` and `attention.attend`
    share: bfloat16 and float16 are, float32 / float64 and integers / booleans are not."""
    assert [
        mixed_precision.is_low_precision(d)
        for d in (jnp.bfloat16, jnp.float16, jnp.float32, np.float64, jnp.int8, jnp.int32, bool)
    ] == [True, True, False, False, False, False, False]


def test_elementwise_in_float32_rounds_once():
    """A bf16 activation through `elementwise_in_float32`: GELU evaluated in float32 and
    rounded once, so every value is within half a bf16 ulp (+1 % for float32 error) of the
    float64 GELU of the same bf16 input; the op-by-op bf16 chain it replaces is not.
    Float32 (and integer) input is ``fn(x)`` itself; gradients come back in the input dtype."""
    x = jnp.asarray(np.linspace(-6, 6, 4001), jnp.bfloat16)
    out = mixed_precision.elementwise_in_float32(jax.nn.gelu, x)
    assert out.dtype == jnp.bfloat16
    ref = _np_gelu_tanh(np.asarray(x, np.float32))
    big = np.abs(ref) > 1e-3
    half_ulp = 2.0 ** (np.floor(np.log2(np.abs(ref[big]))) - 8)
    err = np.abs(np.asarray(out, np.float64)[big] - ref[big])
    assert (err <= half_ulp * 1.01).all(), (err / half_ulp).max()
    chain = np.abs(np.asarray(jax.nn.gelu(x), np.float64)[big] - ref[big])
    assert (chain > half_ulp * 1.01).sum() > 100  # what rounding at every op costs

    x32 = jnp.asarray(np.linspace(-3, 3, 11), jnp.float32)
    np.testing.assert_array_equal(
        mixed_precision.elementwise_in_float32(jax.nn.gelu, x32), jax.nn.gelu(x32)
    )
    ints = jnp.arange(5)
    np.testing.assert_array_equal(
        mixed_precision.elementwise_in_float32(lambda a: a * 2, ints), ints * 2
    )
    dx = jax.grad(lambda x: mixed_precision.elementwise_in_float32(jax.nn.gelu, x).sum())(x)
    assert dx.dtype == jnp.bfloat16


def test_bf16_feed_forward_takes_its_activation_in_float32(tiny_config):
    """The model's feed-forward block in bf16: ``wo(round(gelu(float32(wi(x)))))``, not the
    GELU chain in bf16 (the two differ on this input)."""
    from flaxformer_lite.nn import layers

    cfg = tiny_config(
        "rope", vocab_size=256, num_encoder_layers=0, dtype="bfloat16", activation="gelu"
    )
    ff = layers.FeedForward(cfg, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(7).standard_normal((2, 9, cfg.d_model)), jnp.bfloat16)
    h = ff.wi(x)
    ours = ff(x)
    assert ours.dtype == jnp.bfloat16
    expected = ff.wo(jax.nn.gelu(h.astype(jnp.float32)).astype(jnp.bfloat16))
    np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(expected, np.float32))
    old = ff.wo(jax.nn.gelu(h))
    assert not np.array_equal(np.asarray(ours, np.float32), np.asarray(old, np.float32))


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
