"""RoPE (`core.rotary`) against the rotation matrix and the reference implementations of its
context extensions.

The rotation: the matrix of Su et al. 2021 (Eq. 15/34) in float64 numpy, both pairings,
partial rotary dims, logits that depend only on the offset, float32 angles, clear errors on
bad arguments. The extensions as their reference implementations ship them: YaRN's default is
the authors' code / Hugging Face transformers' ``_compute_yarn_parameters`` (ramp linear in the
pair index between the truncated correction dimensions; the attention factor on the rotated
dimensions only). `hf_yarn` below is a numpy transcription of that function, written from its
definition, in float32 as torch computes it; dynamic NTK follows
``_compute_dynamic_ntk_parameters`` the same way."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tiny_models import tiny_model_config

import flaxformer_lite as fl
from flaxformer_lite.core import absolute, attention, attention_bias, rotary


def hf_yarn(head_dim, fraction, base, factor, original, beta_fast=32.0, beta_slow=1.0):
    """``(inv_freq float32 [dim // 2], attention_factor)`` as Hugging Face computes them."""
    dim = int(head_dim * fraction)

    def correction_dim(n):
        return (dim * math.log(original / (n * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    pos_freqs = np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (np.float32(factor) * pos_freqs)
    keep = 1 - ramp  # HF's inv_freq_extrapolation_factor
    inv_freq = interpolation * (1 - keep) + extrapolation * keep
    attention = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return inv_freq.astype(np.float32), attention


def hf_dynamic_ntk(head_dim, base, factor, original, seq_len):
    dim = head_dim
    seq_len = seq_len if seq_len > original else original
    base = base * ((factor * seq_len / original) - (factor - 1)) ** (dim / (dim - 2))
    return (1.0 / base ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim)).astype(
        np.float32
    )


YARN_CASES = [  # head_dim, fraction, base, s, L
    (16, 1.0, 10000.0, 16.0, 64),
    (64, 1.0, 10000.0, 4.0, 512),
    (64, 0.5, 10000.0, 8.0, 256),
    (128, 1.0, 500000.0, 32.0, 4096),
    (32, 0.25, 10000.0, 2.0, 128),
]


@pytest.mark.parametrize(("head_dim", "fraction", "base", "s", "big_l"), YARN_CASES)
def test_yarn_frequencies_equal_hugging_face(head_dim, fraction, base, s, big_l):
    want, factor = hf_yarn(head_dim, fraction, base, s, big_l)
    rotary_dim = rotary.rotary_dim_for(head_dim, fraction)
    assert rotary_dim == int(head_dim * fraction)
    got = rotary.yarn_inv_frequencies(rotary_dim, scale=s, original_length=big_l, base=base)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-6)
    assert rotary.yarn_attention_factor(s) == pytest.approx(factor, rel=1e-12)


def test_yarn_kept_fraction_at_head_dim_16_and_length_64():
    """A worked case: the share of each pair's frequency that is kept (1) rather
    than interpolated (0): HF [1, 0.67, 0.33, 0, ...], the paper's ramp [0.30, 0.07, 0, ...]."""
    theta = 1e4 ** (-2.0 * np.arange(8) / 16)
    for variant, kept in (
        ("hf", [1.0, 2 / 3, 1 / 3, 0, 0, 0, 0, 0]),
        ("paper", [0.30, 0.07, 0, 0, 0, 0, 0, 0]),
    ):
        got = rotary.yarn_inv_frequencies(16, scale=16.0, original_length=64, variant=variant)
        share = (np.asarray(got, np.float64) - theta / 16) / (theta - theta / 16)
        np.testing.assert_allclose(share, kept, atol=0.01, err_msg=variant)


def _rotated_logits(cfg, q, k, positions):
    pe = cfg.encoding.build(cfg, rngs=nnx.Rngs(0))
    qr, kr = pe.rotate(q, k, positions, positions)
    return np.einsum("bqhd,bkhd->bhqk", np.asarray(qr, np.float64), np.asarray(kr, np.float64))


def _hf_logits(q, k, positions, inv_freq, attention, rotary_dim):
    """HF: cos and sin times the attention factor, rotate-half on the rotated dims only."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    angles = np.asarray(positions, np.float64)[0][:, None] * np.asarray(inv_freq, np.float64)
    emb = np.concatenate([angles, angles], -1)[None, :, None, :]
    cos, sin = np.cos(emb) * attention, np.sin(emb) * attention

    def rope(x):
        rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
        half = rotary_dim // 2
        rotate_half = np.concatenate([-rot[..., half:], rot[..., :half]], -1)
        return np.concatenate([rot * cos + rotate_half * sin, rest], -1)

    return np.einsum("bqhd,bkhd->bhqk", rope(q), rope(k))


@pytest.mark.parametrize(("head_dim", "fraction", "base", "s", "big_l"), YARN_CASES[:3])
def test_yarn_logits_equal_hugging_face(head_dim, fraction, base, s, big_l):
    cfg = tiny_model_config(
        "rope",
        options={
            "fraction": fraction,
            "base": base,
            "scaling": "yarn",
            "scale": s,
            "original_length": big_l,
        },
        d_model=head_dim * 2,
        num_heads=2,
    )
    q = jax.random.normal(jax.random.key(0), (1, 12, 2, head_dim))
    k = jax.random.normal(jax.random.key(1), (1, 12, 2, head_dim))
    positions = jnp.arange(0, 12 * 37, 37)[None]  # far apart: every pair turns
    inv_freq, attention = hf_yarn(head_dim, fraction, base, s, big_l)
    want = _hf_logits(q, k, positions, inv_freq, attention, int(head_dim * fraction))
    np.testing.assert_allclose(_rotated_logits(cfg, q, k, positions), want, rtol=2e-4, atol=2e-4)


def test_paper_yarn_scales_every_dimension_and_has_its_own_label():
    options = {"fraction": 0.5, "scaling": "yarn", "scale": 4.0, "original_length": 16}
    hf = tiny_model_config("rope", options=options)
    paper = tiny_model_config("rope", options=options | {"yarn_variant": "paper"})
    assert fl.encoding_row_name(hf) == "rope+yarn"
    assert fl.encoding_row_name(paper) == "rope+yarn_paper"
    x = jnp.ones((1, 3, 2, 8))
    pos = jnp.zeros((1, 3), jnp.int32)  # no rotation: only the factor acts
    factor = rotary.yarn_attention_factor(4.0)
    for cfg, scaled_dims in ((hf, 4), (paper, 8)):
        q, _ = cfg.encoding.build(cfg, rngs=nnx.Rngs(0)).rotate(x, x, pos, pos)
        want = np.where(np.arange(8) < scaled_dims, factor, 1.0)
        np.testing.assert_allclose(np.asarray(q)[0, 0, 0], want, rtol=1e-6)


def test_yarn_variant_is_validated():
    with pytest.raises(ValueError, match=r"positional_options\.yarn_variant='eq17'"):
        tiny_model_config("rope", options={"yarn_variant": "eq17"})


@pytest.mark.parametrize(("factor", "seq_len"), [(1.0, 8), (1.0, 40), (2.0, 40), (4.0, 200)])
def test_dynamic_ntk_equals_hugging_face(factor, seq_len):
    positions = jnp.arange(seq_len)[None]
    got = rotary.dynamic_ntk_inv_frequencies(
        positions, 16, original_length=16, base=10000.0, factor=factor
    )
    want = hf_dynamic_ntk(16, 10000.0, factor, 16, seq_len)
    np.testing.assert_allclose(np.asarray(got)[0], want, rtol=2e-6)


def test_dynamic_ntk_scale_comes_from_the_queries_not_the_keys():
    """A cache holds planned slots past the current token: the scale is the queries'."""
    cfg = tiny_model_config("rope", options={"scaling": "dynamic_ntk", "original_length": 4})
    pe = cfg.encoding.build(cfg, rngs=nnx.Rngs(0))
    q = jax.random.normal(jax.random.key(0), (1, 1, 2, 8))
    k = jax.random.normal(jax.random.key(1), (1, 20, 2, 8))
    q_pos, k_pos = jnp.array([[3]]), jnp.arange(20)[None]  # current length 4 = L: plain RoPE
    got_q, got_k = pe.rotate(q, k, q_pos, k_pos)
    plain = tiny_model_config("rope")
    want_q, want_k = plain.encoding.build(plain, rngs=nnx.Rngs(0)).rotate(q, k, q_pos, k_pos)
    np.testing.assert_array_equal(np.asarray(got_q), np.asarray(want_q))
    np.testing.assert_array_equal(np.asarray(got_k), np.asarray(want_k))


def _batch(seed, b, t, vocab=32):
    rng = np.random.default_rng(seed)
    seq = rng.integers(0, vocab, (b, t + 1)).astype(np.int32)
    return {
        "inputs": seq[:, :-1],
        "targets": seq[:, 1:],
        "loss_mask": np.ones((b, t), np.float32),
        "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(),
    }


@pytest.mark.parametrize("name", ["rope", "alibi", "learned", "xpos"])
def test_incremental_scoring_equals_one_pass_for_length_independent_encodings(name):
    from flaxformer_lite.evaluation.step import Evaluator

    model = fl.DecoderOnlyLM(tiny_model_config(name), rngs=nnx.Rngs(2))
    batch = _batch(0, 2, 12)
    one_pass, incremental = Evaluator(model)(batch), Evaluator(model, incremental=True)(batch)
    for key in ("loss_sum", "correct_sum", "count"):
        np.testing.assert_allclose(incremental[key], one_pass[key], rtol=2e-5, atol=2e-5)


def test_dynamic_ntk_is_scored_as_cached_decoding_with_hf_convention():
    """Incremental scoring of a dynamic-NTK window is cached decoding, one target per step,
    with Hugging Face's convention (each cached key keeps the rotation of the step that wrote
    it; tests/pretrained pins it against transformers' own cached generation). With 2 layers:
    it equals a teacher-forced `decode_step` loop; up to L the targets see plain RoPE; beyond
    L it differs both from one pass over the window (static NTK at the window's scale) and
    from recomputing each prefix (which re-rotates every key and re-runs deeper layers)."""
    from flaxformer_lite.evaluation.step import Evaluator, rebuild_model, token_losses

    cfg = tiny_model_config(
        "rope", options={"scaling": "dynamic_ntk", "original_length": 4}, num_decoder_layers=2
    )
    model = fl.DecoderOnlyLM(cfg, rngs=nnx.Rngs(2))
    batch = _batch(1, 2, 12)
    got = Evaluator(model, incremental=True)(batch)["loss_sum"]
    inputs, targets = jnp.asarray(batch["inputs"]), jnp.asarray(batch["targets"])
    cache = model.init_cache(2, 12)
    stepwise = []
    for o in range(12):
        logits, cache = model.decode_step(
            inputs[:, o : o + 1], batch["positions"][:, o : o + 1], cache
        )
        ce, _ = token_losses(logits, targets[:, o : o + 1])
        stepwise.append(float(ce.sum()))
    np.testing.assert_allclose(got, stepwise, rtol=1e-5, atol=1e-5)

    def prefix(o: int) -> float:  # the target at offset o scored by recomputing its prefix
        full = model(inputs[:, : o + 1], batch["positions"][:, : o + 1])
        return float(token_losses(full[:, -1:], targets[:, o : o + 1])[0].sum())

    # up to L the targets see plain RoPE (s = 1) ...
    plain = rebuild_model(model, cfg.replace(positional_options={"original_length": 4}))
    np.testing.assert_allclose(got[:4], Evaluator(plain)(batch)["loss_sum"][:4], rtol=1e-5)
    np.testing.assert_allclose(got[3], prefix(3), rtol=1e-5)
    # ... while one pass gives every target the window's scale 12 / 4 (static NTK), and a
    # per-prefix recompute rotates every key at the current scale
    one_pass = Evaluator(model)(batch)["loss_sum"]
    assert not np.allclose(got, one_pass, atol=1e-4)
    assert not np.allclose(got[[7, 11]], [prefix(7), prefix(11)], atol=1e-4)


@pytest.mark.parametrize(
    "positional, options",
    [
        ("rope", {"scaling": "dynamic_ntk", "original_length": 4, "scale": 2.0}),
        ("p_rope", {"scaling": "dynamic_ntk", "original_length": 4, "p": 0.5}),
        (
            "rope",
            {
                "scaling": "longrope",
                "original_length": 4,
                "longrope_short_factor": (1.0, 1.5, 2.0, 3.0),
                "longrope_long_factor": (2.0, 4.0, 8.0, 16.0),
            },
        ),
    ],
)
def test_one_pass_at_each_prefix_length_equals_token_by_token_scoring(positional, options):
    """Evaluation scores length-dependent scalings in one pass (`evaluation.step.one_pass`:
    each query and key at position p with the frequencies of length p + 1) with the numbers
    of the token-by-token scan through the cache, on 2 layers and 12 tokens past L = 4."""
    import jax

    from flaxformer_lite.evaluation import step

    cfg = tiny_model_config(positional, options=options, num_decoder_layers=2)
    model = fl.DecoderOnlyLM(cfg, rngs=nnx.Rngs(2))
    batch = _batch(3, 2, 12)
    graphdef, params, rest = step.split_model(model)
    scanned = jax.jit(step.make_incremental_eval_step(graphdef))(params, rest, batch)
    evaluator = step.Evaluator(model, incremental=True)
    # one pass, not the token-by-token step
    assert evaluator.step is not step._jitted_step(step.make_incremental_eval_step, graphdef)
    got = evaluator(batch)
    for key in ("token_loss", "token_correct", "loss_sum"):
        np.testing.assert_allclose(got[key], np.asarray(scanned[key]), rtol=2e-5, atol=2e-5)
    # the window's own length (one pass without prefix lengths) gives other numbers
    assert not np.allclose(step.Evaluator(model)(batch)["loss_sum"], got["loss_sum"], atol=1e-4)


def test_the_study_scores_dynamic_ntk_incrementally():
    from configs import extrapolation_lm
    from flaxformer_lite.train.run_config import RunConfig

    c = extrapolation_lm.get_config("tiny")
    c.model.positional = "rope"
    c.eval.rope_scalings = ("pi", "dynamic_ntk")
    cells = RunConfig.from_config(c).eval_plan().cells
    assert {cell.label.variant for cell in cells if cell.incremental} == {"dynamic_ntk"}


def np_rope(x, positions, *, base=10000.0, layout="half", rotary_dim=None):
    """Rotate x [b, l, h, d] by explicit block rotation matrices built per position."""
    x = np.asarray(x, np.float64)
    b, length, _, d = x.shape
    r = d if rotary_dim is None else rotary_dim
    positions = np.asarray(positions, np.float64).reshape(-1, length)
    positions = np.broadcast_to(positions, (b, length))
    out = x.copy()
    for bi in range(b):
        for li in range(length):
            rot = np.eye(d)
            for i in range(r // 2):
                a = positions[bi, li] * base ** (-2 * i / r)
                u, w = (i, i + r // 2) if layout == "half" else (2 * i, 2 * i + 1)
                rot[u, u], rot[u, w] = np.cos(a), -np.sin(a)
                rot[w, u], rot[w, w] = np.sin(a), np.cos(a)
            out[bi, li] = x[bi, li] @ rot.T
    return out


def _x(seed, shape=(2, 5, 3, 8), dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


ROPE_POSITIONS = np.array([[0, 1, 2, 7, 300], [5, 6, 40, 41, 99]], np.int32)


@pytest.mark.parametrize("layout", rotary.ROPE_LAYOUTS)
@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_rope_matches_rotation_matrix(layout, base):
    x = _x(0)
    y = rotary.apply_rope(jnp.asarray(x), ROPE_POSITIONS, base=base, layout=layout)
    assert y.shape == x.shape and y.dtype == jnp.float32
    ref = np_rope(x, ROPE_POSITIONS, base=base, layout=layout)
    np.testing.assert_allclose(y, ref, atol=2e-4)
    # A rotation preserves norms; position 0 is the identity.
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    np.testing.assert_allclose(y[0, 0], x[0, 0], atol=1e-6)


def test_rope_half_and_interleaved_are_the_same_rotation_under_a_permutation():
    d = 8
    perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])  # 0 2 4 6 1 3 5 7
    x = _x(1, (2, 5, 3, d))
    half = rotary.apply_rope(jnp.asarray(x[..., perm]), ROPE_POSITIONS, layout="half")
    inter = rotary.apply_rope(jnp.asarray(x), ROPE_POSITIONS, layout="interleaved")
    np.testing.assert_allclose(half, np.asarray(inter)[..., perm], atol=1e-5)
    # Without the permutation the two layouts differ (the equality is not trivial).
    plain_half = rotary.apply_rope(jnp.asarray(x), ROPE_POSITIONS, layout="half")
    assert np.abs(np.asarray(plain_half) - np.asarray(inter)).max() > 0.1


@pytest.mark.parametrize("layout", rotary.ROPE_LAYOUTS)
def test_rope_partial_rotary_dim_leaves_the_rest_untouched(layout):
    x = _x(2, (2, 5, 3, 12))
    y = np.asarray(rotary.apply_rope(jnp.asarray(x), ROPE_POSITIONS, layout=layout, rotary_dim=4))
    np.testing.assert_array_equal(y[..., 4:], x[..., 4:])
    ref = np_rope(x, ROPE_POSITIONS, layout=layout, rotary_dim=4)  # theta_i = base^(-2i/4)
    np.testing.assert_allclose(y, ref, atol=2e-4)
    assert np.abs(y[..., :4] - x[..., :4]).max() > 0.1


@pytest.mark.parametrize("layout", rotary.ROPE_LAYOUTS)
def test_rope_logits_depend_only_on_the_offset(layout):
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.standard_normal((2, 6, 2, 16)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((2, 6, 2, 16)), jnp.float32)
    pos = np.array([[0, 1, 2, 3, 4, 5], [3, 9, 10, 20, 21, 50]], np.int32)

    def logits(p):
        qr = rotary.apply_rope(q, p, layout=layout)
        kr = rotary.apply_rope(k, p, layout=layout)
        return np.asarray(attention.attention_logits(qr, kr)[0])

    base = logits(pos)
    for shift in (1, 17, 1000):
        np.testing.assert_allclose(logits(pos + shift), base, atol=2e-3)
    # Relative, not absolute: changing one offset does change the logits.
    other = pos.copy()
    other[:, 0] += 1
    assert np.abs(logits(other) - base).max() > 1e-2


def test_rope_angles_are_float32_for_bf16_inputs():
    x = jnp.asarray(_x(4, (1, 2, 1, 8)), jnp.bfloat16)
    pos = np.array([[256, 257]], np.int32)  # 257 is not representable in bf16
    y = rotary.apply_rope(x, pos)
    assert y.dtype == jnp.bfloat16
    ref = np_rope(np.asarray(x, np.float64), pos)
    np.testing.assert_allclose(np.asarray(y, np.float64), ref, atol=3e-2)
    rounded = np_rope(np.asarray(x, np.float64), np.array([[256, 256]]))
    assert np.abs(rounded[0, 1] - ref[0, 1]).max() > 0.1  # rounding the position is visible


def test_rope_inv_frequencies_closed_form():
    np.testing.assert_allclose(
        rotary.rope_inv_frequencies(8),
        [1.0, 0.1, 0.01, 0.001],  # 10000^(-2i/8) = 10^(-i), rtol=1e-6
    )
    np.testing.assert_allclose(rotary.rope_inv_frequencies(4, base=100.0), [1.0, 0.1], rtol=1e-6)


def test_invalid_arguments_raise_clear_errors():
    x = jnp.zeros((1, 3, 1, 8))
    with pytest.raises(ValueError, match=r"rotary_dim must be even.*got 3"):
        rotary.apply_rope(x, np.arange(3), rotary_dim=3)
    with pytest.raises(ValueError, match="layout='zigzag'"):
        rotary.apply_rope(x, np.arange(3), layout="zigzag")
    with pytest.raises(ValueError, match="do not fit head_dim=8"):
        rotary.apply_rope(x, np.arange(3), rotary_dim=10)
    with pytest.raises(ValueError, match="dim=0: must be a positive int"):
        absolute.sinusoidal(np.arange(3), 0)
    with pytest.raises(ValueError, match="num_heads=0: must be a positive int"):
        attention_bias.alibi_slopes(0)
    with pytest.raises(ValueError, match=r"base=.*: must be a finite number > 0"):
        absolute.sinusoidal(np.arange(3), 4, base=-1.0)


# --------------------------------------------------------------------------------- p-RoPE


def np_proportional_inv_freq(head_dim, fraction, base):
    """Hugging Face ``_compute_proportional_rope_parameters`` (factor 1), transcribed."""
    rope_angles = int(fraction * head_dim // 2)
    rotated = 1.0 / base ** (np.arange(0, 2 * rope_angles, 2) / head_dim)
    return np.concatenate([rotated, np.zeros(head_dim // 2 - rope_angles)])


@pytest.mark.parametrize(
    "head_dim,fraction,base", [(64, 0.25, 1e6), (16, 0.5, 1e4), (10, 0.3, 1e4), (8, 1.0, 500.0)]
)
def test_p_rope_frequencies_keep_the_highest_and_zero_the_rest(head_dim, fraction, base):
    got = rotary.p_rope_inv_frequencies(head_dim, fraction=fraction, base=base)
    want = np_proportional_inv_freq(head_dim, fraction, base)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    n = rotary.p_rope_pairs(head_dim, fraction)
    full = rotary.rope_inv_frequencies(head_dim, base=base)
    np.testing.assert_allclose(got[:n], full[:n], rtol=1e-6)  # RoPE's own highest frequencies


def test_p_rope_is_not_neox_partial_rotary():
    """p-RoPE keeps RoPE's top frequencies over the whole head; NeoX's partial rotary rotates
    fewer dims but spreads the full spectrum (down to base^-(1 - 2/r)) over them."""
    p = rotary.p_rope_inv_frequencies(64, fraction=0.25, base=1e4)
    neox = rotary.rope_inv_frequencies(rotary.rotary_dim_for(64, 0.25), base=1e4)
    assert int((np.asarray(p) > 0).sum()) == neox.shape[0] == 8
    assert float(p[7]) == pytest.approx(1e4 ** (-14 / 64))
    assert float(neox[7]) == pytest.approx(1e4 ** (-14 / 16))


def test_p_rope_unrotated_pairs_carry_no_position():
    """Rotated with p-RoPE's frequencies, the pairs (i, i + d/2) with i >= n are unchanged, so
    their share of the logit does not depend on the positions at all; fraction 1 is RoPE."""
    head_dim, n = 16, 2
    x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 5, 2, head_dim)), jnp.float32)
    pos = jnp.arange(5) * 7
    inv = rotary.p_rope_inv_frequencies(head_dim, fraction=0.25)
    assert rotary.p_rope_pairs(head_dim, 0.25) == n
    y = rotary.apply_rotary(x, rotary.rope_angles(pos, inv))
    half = head_dim // 2
    kept = np.r_[n:half, half + n : head_dim]
    np.testing.assert_array_equal(np.asarray(y)[..., kept], np.asarray(x)[..., kept])
    assert float(jnp.max(jnp.abs(y - x))) > 0.1  # the first pairs did rotate
    full = rotary.p_rope_inv_frequencies(head_dim, fraction=1.0)
    np.testing.assert_allclose(full, rotary.rope_inv_frequencies(head_dim), rtol=1e-7)
    np.testing.assert_array_equal(rotary.p_rope_inv_frequencies(head_dim, fraction=0.0), 0.0)
    kept_dynamic = rotary.keep_highest_frequencies(jnp.ones((2, half)), n)
    np.testing.assert_array_equal(kept_dynamic[:, :n], 1.0)
    np.testing.assert_array_equal(kept_dynamic[:, n:], 0.0)


def test_p_rope_argument_errors():
    with pytest.raises(ValueError, match=r"fraction must be a number in \[0, 1\]; got 1.5"):
        rotary.p_rope_inv_frequencies(16, fraction=1.5)
    with pytest.raises(ValueError, match="head_dim must be even"):
        rotary.p_rope_inv_frequencies(15, fraction=0.5)
    with pytest.raises(ValueError, match=r"base=0.0: must be a finite number > 0"):
        rotary.p_rope_inv_frequencies(16, fraction=0.5, base=0.0)
