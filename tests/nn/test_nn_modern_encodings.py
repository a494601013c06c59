"""p-RoPE and ALiBi with position interpolation through the encoding registry: their
frequencies, rotations and biases against numpy, their evaluation variants and labels."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tiny_models import tiny_model_config

from configs import extrapolation_lm
from flaxformer_lite.nn.encodings import get_positional_encoding
from flaxformer_lite.nn.models import DecoderOnlyLM
from flaxformer_lite.train.run_config import RunConfig

HEAD_DIM, HEADS, BASE = 8, 2, 100.0


def _build(name: str, **options):
    cfg = tiny_model_config(name, options=options)  # d_model 16, 2 heads of 8
    return cfg, cfg.encoding.build(cfg, rngs=nnx.Rngs(0))


def _numpy_rotate_half(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """RoPE's "half" layout: pair (i, i + d/2) rotated by angles[..., i]."""
    half = x.shape[-1] // 2
    cos, sin = np.cos(angles)[:, :, None, :], np.sin(angles)[:, :, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


@pytest.mark.parametrize("p", [0.0, 0.5, 0.75, 1.0])
def test_p_rope_rotates_only_the_highest_frequency_pairs(p):
    _, pe = _build("p_rope", base=BASE, p=p)
    kept = int(p * HEAD_DIM // 2)
    i = np.arange(HEAD_DIM // 2)
    theta = np.where(i < kept, BASE ** (-2.0 * i / HEAD_DIM), 0.0)
    np.testing.assert_allclose(np.asarray(pe.inv_frequencies(jnp.arange(5))), theta, rtol=1e-6)
    rng = np.random.default_rng(0)
    q = rng.normal(size=(1, 5, HEADS, HEAD_DIM)).astype(np.float32)
    k = rng.normal(size=(1, 5, HEADS, HEAD_DIM)).astype(np.float32)
    pos = np.arange(5)[None, :] + 3
    q_rot, k_rot = pe.rotate(jnp.asarray(q), jnp.asarray(k), jnp.asarray(pos), jnp.asarray(pos))
    angles = pos[..., None].astype(np.float64) * theta  # [1, 5, pairs]
    np.testing.assert_allclose(np.asarray(q_rot), _numpy_rotate_half(q, angles), atol=1e-5)
    np.testing.assert_allclose(np.asarray(k_rot), _numpy_rotate_half(k, angles), atol=1e-5)
    # the unrotated pairs are left exactly as they were
    for x, x_rot in ((q, q_rot), (k, k_rot)):
        same = np.asarray(x_rot)[..., [j for j in range(HEAD_DIM) if j % 4 >= kept]]
        np.testing.assert_array_equal(same, x[..., [j for j in range(HEAD_DIM) if j % 4 >= kept]])


def test_p_rope_at_one_is_rope_and_takes_the_rope_scalings():
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 32, (2, 9)), jnp.int32)
    pos = jnp.arange(9)
    rope = DecoderOnlyLM(tiny_model_config("rope"), rngs=nnx.Rngs(0))
    full = DecoderOnlyLM(tiny_model_config("p_rope", options={"p": 1.0}), rngs=nnx.Rngs(0))
    part = DecoderOnlyLM(tiny_model_config("p_rope"), rngs=nnx.Rngs(0))
    np.testing.assert_allclose(np.asarray(full(tokens, pos)), np.asarray(rope(tokens, pos)))
    assert not np.allclose(np.asarray(part(tokens, pos)), np.asarray(rope(tokens, pos)))
    cfg = tiny_model_config("p_rope", options={"original_length": 8})
    assert cfg.evaluation_variants(("yarn", "alibi_pi")) == ("yarn",)
    yarn = cfg.with_rope_scaling("yarn", 32)
    assert yarn.encoding_label() == "p_rope+yarn" and yarn.positional_options.scale == 4.0
    assert yarn.positional_options.p == 0.75
    with pytest.raises(ValueError, match=r"positional_options\.p=1\.5"):
        tiny_model_config("p_rope", options={"p": 1.5})


def test_alibi_interpolated_bias_equals_numpy():
    """Slopes m_h * L / L' (2 heads: 2^-4, 2^-8), the bias -m_h L / L' (i - j)."""
    _, plain = _build("alibi")
    _, pi = _build("alibi", pi_train_length=4, pi_eval_length=10)
    slopes = np.array([2.0**-4, 2.0**-8])
    np.testing.assert_allclose(np.asarray(plain.slope_values()), slopes, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(pi.slope_values()), slopes * 4 / 10, rtol=1e-6)
    q, k = np.arange(10)[None], np.arange(10)[None]
    bias = np.asarray(pi.bias(jnp.asarray(q), jnp.asarray(k), causal=True))
    ref = -(slopes * 0.4)[None, :, None, None] * (q[0][:, None] - k[0][None, :])[None, None]
    np.testing.assert_allclose(bias, ref, rtol=1e-6, atol=1e-7)
    _, short = _build("alibi", pi_train_length=16, pi_eval_length=10)  # L' <= L: unchanged
    np.testing.assert_allclose(np.asarray(short.slope_values()), slopes, rtol=1e-6)
    with pytest.raises(ValueError, match=r"positional_options\.pi_train_length=None"):
        tiny_model_config("alibi", options={"pi_eval_length": 10})


def test_alibi_pi_evaluation_rows():
    """``eval.rope_scalings=("alibi_pi",)`` adds rows "alibi+pi" whose slopes are scaled to
    each evaluation length; RoPE models take no such row; without L it is refused."""
    c = extrapolation_lm.get_config("tiny")  # L = 16, lengths 16, 32, 64
    c.model.positional = "alibi"
    c.model.positional_options.alibi.pi_train_length = 16
    c.eval.rope_scalings = ("alibi_pi",)
    plan = RunConfig.from_config(c).eval_plan()
    rows = {(x.label.variant, x.length): x for x in plan.cells}
    assert rows[("alibi_pi", 64)].label.encoding == "alibi+pi"
    assert rows[("alibi_pi", 64)].model.positional_options.pi_eval_length == 64
    assert rows[("base", 64)].label.encoding == "alibi"
    c.model.positional = "rope"
    assert {x.label.variant for x in RunConfig.from_config(c).eval_plan().cells} == {"base"}
    spec = get_positional_encoding("alibi")
    with pytest.raises(ValueError, match="pi_train_length=None"):
        spec.variant_options(spec.options(), "alibi_pi", 64)
