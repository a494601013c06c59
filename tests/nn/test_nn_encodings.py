"""The positional-encoding registry and modules of `nn.encodings` (DESIGN.md §3, §4).

Generic tests iterate `positional_encoding_names()`, so an encoding added to the registry
is covered without editing this file. Per encoding: NoPE, T5 buckets, xPos, KERPLE, FIRE,
randomized positions, partial rotary and RoPE context extension (PI, NTK, dynamic NTK, YaRN),
each compared with an independent computation written here (numpy formula or a hand-worked
case) or an invariant the paper states, then in the models and in the registry's entries."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tiny_models import tiny_model_config

import flaxformer_lite as fl
from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.core import attention_bias, rotary
from flaxformer_lite.core.positions import randomized_positions
from flaxformer_lite.evaluation.step import rebuild_model
from flaxformer_lite.nn import encodings
from flaxformer_lite.nn.encodings import (
    EncodingSpec,
    get_positional_encoding,
    positional_encoding_names,
    register,
    registry,
)
from flaxformer_lite.nn.encodings import attention_bias as bias_encodings
from flaxformer_lite.nn.encodings import rotary as encodings_rotary
from flaxformer_lite.nn.encodings.registry import NoOptions
from flaxformer_lite.nn.models import DecoderOnlyLM, Encoder, EncoderDecoder

NAMES = positional_encoding_names()
CORE_HOOKS = {
    "none": "none",
    "sinusoidal": "add",
    "learned": "add",
    "rope": "rotate",
    "alibi": "bias",
}
B, L, D, H = 2, 6, 16, 2


def small_cfg(name, options=None, **kw):
    """`tiny_model_config` (d_model D, H heads) with a 16-row learned table; ``options``:
    the options of ``name``."""
    per_encoding = {"learned": {"max_length": 16}}
    per_encoding[name] = per_encoding.get(name, {}) | (options or {})
    return tiny_model_config(name, options=per_encoding, **kw)


POS = np.array([[0, 1, 2, 3, 4, 5], [2, 3, 4, 5, 6, 7]], np.int32)


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((B, L, D)), jnp.float32)
    q = jnp.asarray(rng.standard_normal((B, L, H, D // H)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((B, L, H, D // H)), jnp.float32)
    return x, q, k


def test_core_encodings_are_registered_at_the_design_hooks():
    for name, hook in CORE_HOOKS.items():
        assert name in NAMES
        assert get_positional_encoding(name).hook == hook, name


@pytest.mark.parametrize("name", NAMES)
def test_each_encoding_acts_at_its_declared_hook_only(name):
    spec = get_positional_encoding(name)
    assert spec.hook in encodings.HOOKS and spec.name == name
    pe = spec.build(small_cfg(name), rngs=nnx.Rngs(0))
    assert isinstance(pe, encodings.PositionalEncoding)
    assert pe.hook == spec.hook  # the layers dispatch on the module's hook
    x, q, k = _arrays()
    added = pe.add(x, POS)
    rq, rk = pe.rotate(q, k, POS, POS)
    if spec.hook == "add":
        assert added.shape == x.shape and np.abs(np.asarray(added - x)).max() > 1e-3
    else:
        np.testing.assert_array_equal(added, x)
    if spec.hook == "rotate":
        assert np.abs(np.asarray(rq - q)).max() > 1e-3 and np.abs(np.asarray(rk - k)).max() > 1e-3
    else:
        np.testing.assert_array_equal(rq, q)
        np.testing.assert_array_equal(rk, k)
    if spec.hook == "bias":
        for causal in (True,) if spec.causal_only else (True, False):
            bias = pe.bias(POS, POS, causal=causal)
            assert bias.shape == (B, H, L, L) and bias.dtype == jnp.float32
            assert np.all(np.isfinite(bias))


def test_sinusoidal_hook_adds_the_formula():
    pe = get_positional_encoding("sinusoidal").build(small_cfg("sinusoidal"), rngs=nnx.Rngs(0))
    x, _, _ = _arrays(1)
    ref = np.zeros((B, L, D))
    for j in range(D):
        angle = POS / 10000.0 ** (2 * (j // 2) / D)
        ref[..., j] = np.sin(angle) if j % 2 == 0 else np.cos(angle)
    np.testing.assert_allclose(pe.add(x, POS), np.asarray(x) + ref, atol=1e-5)
    # bf16 embeddings stay bf16 (the encoding is computed in float32 and added).
    assert pe.add(x.astype(jnp.bfloat16), POS).dtype == jnp.bfloat16


def test_learned_hook_adds_the_table_rows():
    pe = get_positional_encoding("learned").build(small_cfg("learned"), rngs=nnx.Rngs(0))
    table = np.asarray(pe.table[...])
    assert table.shape == (16, D)
    x, _, _ = _arrays(2)
    np.testing.assert_allclose(pe.add(x, POS), np.asarray(x) + table[POS], atol=1e-6)


@pytest.mark.parametrize("layout", rotary.ROPE_LAYOUTS)
def test_rope_hook_rotates_queries_and_keys_with_their_own_positions(layout):
    cfg = small_cfg("rope", {"layout": layout, "base": 500.0})
    pe = get_positional_encoding("rope").build(cfg, rngs=nnx.Rngs(0))
    _, q, k = _arrays(3)
    kpos = POS + 3
    rq, rk = pe.rotate(q, k, POS, kpos)
    np.testing.assert_array_equal(rq, rotary.apply_rope(q, POS, base=500.0, layout=layout))
    np.testing.assert_array_equal(rk, rotary.apply_rope(k, kpos, base=500.0, layout=layout))


@pytest.mark.parametrize("causal", [True, False])
def test_alibi_hook_bias_values(causal):
    pe = get_positional_encoding("alibi").build(small_cfg("alibi", num_heads=4), rngs=nnx.Rngs(0))
    bias = np.asarray(pe.bias(POS, POS, causal=causal))
    slopes = np.array([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8])  # 2^(-8/4) geometric
    rel = (POS[:, :, None] - POS[:, None, :]).astype(np.float64)
    rel = rel if causal else np.abs(rel)
    np.testing.assert_allclose(bias, -slopes[None, :, None, None] * rel[:, None], rtol=1e-6)


def test_unknown_name_lists_the_valid_names():
    with pytest.raises(ValueError, match="positional='sinusoid'") as err:
        get_positional_encoding("sinusoid")
    for name in NAMES:
        assert repr(name) in str(err.value)


def test_register_rejects_duplicates_and_unknown_hooks():
    before = positional_encoding_names()
    with pytest.raises(ValueError, match="'rope' is already registered"):
        register(EncodingSpec("rope", "rotate", encodings.RotaryEncoding))
    with pytest.raises(ValueError, match="hook='scale'"):
        register(EncodingSpec("scaled_thing", "scale", encodings.RotaryEncoding))
    assert positional_encoding_names() == before


@dataclasses.dataclass(frozen=True)
class _PlainOptions:  # frozen, but not an EncodingOptions
    base: float = 2.0


@pytest.mark.parametrize(
    "options",
    [dict, _PlainOptions, _PlainOptions(), encodings.RopeOptions()],
    ids=["dict", "not-encoding-options", "an-instance", "an-options-instance"],
)
def test_register_requires_frozen_encoding_options(options):
    before = positional_encoding_names()
    with pytest.raises(ValueError, match=r"must be a frozen dataclass subclassing EncodingOptions"):
        register(EncodingSpec("thing", "rotate", encodings.RotaryEncoding, options=options))
    assert positional_encoding_names() == before


def test_encoding_spec_has_no_old_field_names():
    """A spec declares its options only; old flat field names are not a spec field."""
    before = positional_encoding_names()
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'legacy_fields'"):
        EncodingSpec(
            "thing",
            "rotate",
            encodings.RotaryEncoding,
            options=encodings.RopeOptions,
            legacy_fields={"thing_base": "bse"},
        )
    assert positional_encoding_names() == before


def test_registration_order():
    assert NAMES == (
        "none",
        "sinusoidal",
        "learned",
        "rope",
        "xpos",
        "p_rope",
        "alibi",
        "t5",
        "kerple_log",
        "kerple_power",
        "fire",
        "fox",
    )


@pytest.mark.parametrize("name", NAMES)
def test_factory_takes_dims_and_options(name):
    """``spec.factory(dims, options, rngs=...)`` is what ``spec.build(cfg)`` calls: the
    encoding sees the model only through `ModelDims` and its own options."""
    spec = get_positional_encoding(name)
    cfg = small_cfg(name)
    assert isinstance(cfg.positional_options, spec.options)
    if spec.options is NoOptions:
        assert spec.option_names() == ()
    built = spec.build(cfg, rngs=nnx.Rngs(0))
    direct = spec.factory(cfg.dims, cfg.positional_options, rngs=nnx.Rngs(0))
    assert type(built) is type(direct) and built.hook == direct.hook == spec.hook
    a, b = nnx.state(built, nnx.Param), nnx.state(direct, nnx.Param)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    with pytest.raises(ValueError, match=rf"positional={name!r}; this is 'thing'"):
        dataclasses.replace(spec, name="thing").build(cfg, rngs=nnx.Rngs(0))


def test_settings_record_the_exact_variant():
    cfg = small_cfg("rope", {"base": 500.0, "layout": "interleaved"})
    settings = get_positional_encoding("rope").settings(cfg.positional_options)
    assert settings == {
        "positional": "rope",
        "base": 500.0,
        "layout": "interleaved",
        "fraction": 1.0,
        "scaling": "none",
        "scale": 1.0,
        "original_length": None,
        "yarn_alpha": 1.0,
        "yarn_beta": 32.0,
        "yarn_variant": "hf",
        "yarn_truncate": True,
        "yarn_mscale": None,
        "yarn_mscale_all_dim": None,
        "attention_factor": None,
        "llama3_low_freq_factor": 1.0,
        "llama3_high_freq_factor": 4.0,
        "longrope_short_factor": None,
        "longrope_long_factor": None,
    }
    assert cfg.encoding.settings(cfg.positional_options) == settings
    none = small_cfg("none")
    assert none.encoding.settings(none.positional_options) == {"positional": "none"}
    learned = small_cfg("learned")
    assert learned.encoding.settings(learned.positional_options) == {
        "positional": "learned",
        "max_length": 16,
        "offset": 0,
    }


def test_causal_only_encoding_is_rejected_by_the_bidirectional_encoder(monkeypatch):
    spec = dataclasses.replace(
        get_positional_encoding("rope"), name="test_causal_only", causal_only=True
    )
    monkeypatch.setitem(registry._REGISTRY, spec.name, spec)
    cfg = small_cfg(spec.name)
    with pytest.raises(ValueError, match=r"positional='test_causal_only'.*causal"):
        Encoder(cfg, rngs=nnx.Rngs(0))
    DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))  # fine for causal attention


# ------------------------------------------------------------- learned table: no clamping


def _lm(name, options=None, **kw):
    return DecoderOnlyLM(small_cfg(name, options, **kw), rngs=nnx.Rngs(0))


def test_learned_beyond_its_table_raises_a_clear_error():
    model = _lm("learned", {"max_length": 8})
    ok = jnp.zeros((1, 8), jnp.int32)
    assert model(ok, np.arange(8, dtype=np.int32)).shape == (1, 8, 32)
    long = jnp.zeros((1, 9), jnp.int32)
    pos = np.arange(9, dtype=np.int32)
    with pytest.raises(ValueError, match=r"max_length=8.*length 9"):
        model(long, pos)
    with pytest.raises(ValueError, match="max_length"):  # also at trace time under jit
        nnx.jit(lambda m, t, p: m(t, p))(model, long, pos)


def test_learned_positions_past_the_table_poison_instead_of_clamping():
    model = _lm("learned", {"max_length": 8})
    tokens = jnp.zeros((1, 4), jnp.int32)
    run = nnx.jit(lambda m, t, p: m(t, p))
    inside = np.asarray(run(model, tokens, np.array([[4, 5, 6, 7]], np.int32)))
    assert np.all(np.isfinite(inside))
    past = np.asarray(run(model, tokens, np.array([[5, 6, 7, 8]], np.int32)))
    # Row 8 does not exist: NaN (which spreads through attention), not row 7 again.
    assert np.all(np.isnan(past[0, 3]))


# ------------------------------------------------- one encoding never adds another (#70)


def _param_shapes(model):
    state = nnx.state(model, nnx.Param)
    return {
        jax.tree_util.keystr(path): leaf.shape
        for path, leaf in jax.tree_util.tree_leaves_with_path(state)
    }


@pytest.mark.parametrize("model_cls", [DecoderOnlyLM, EncoderDecoder])
def test_choosing_an_encoding_adds_no_other_embedding(model_cls):
    shapes = {
        name: _param_shapes(
            nnx.eval_shape(lambda n=name: model_cls(small_cfg(n), rngs=nnx.Rngs(0)))
        )
        for name in CORE_HOOKS
    }
    none = shapes["none"]
    # The x-transformers pitfall: ALiBi must not keep an absolute embedding switched on.
    assert shapes["alibi"] == none
    assert shapes["rope"] == none
    assert shapes["sinusoidal"] == none
    extra = {k: v for k, v in shapes["learned"].items() if k not in none}
    assert {k: v for k, v in shapes["learned"].items() if k in none} == none
    n_stacks = 2 if model_cls is EncoderDecoder else 1
    assert list(extra.values()) == [(16, D)] * n_stacks
    assert all("pe" in k and "table" in k for k in extra)


NEW_ENCODINGS = ("xpos", "t5", "kerple_log", "kerple_power", "fire")


def tiny_cfg(positional_name: str, options=None, **kw) -> fl.ModelConfig:
    """`tiny_model_config` with this module's vocabulary (13) and d_ff (16); ``options``: the
    encoding's options."""
    return tiny_model_config(positional_name, options=options, vocab_size=13, d_ff=16, **kw)


def build(cfg: fl.ModelConfig, seed: int = 0):
    return fl.get_positional_encoding(cfg.positional).build(cfg, rngs=nnx.Rngs(seed))


def logits_of(q, k):
    return np.einsum("bqhd,bkhd->bhqk", np.asarray(q, np.float64), np.asarray(k, np.float64))


def test_nope_docstring_says_causal_only():
    doc = fl.get_positional_encoding("none").factory.__doc__
    assert "causal" in doc and "permutation" in doc


def np_t5_bucket(q_minus_k, bidirectional, num_buckets, max_distance):
    """T5's algorithm in T5's own sign convention (memory - query), float64."""
    rp = -np.asarray(q_minus_k, np.int64)  # memory_position - query_position
    n = -rp
    ret = np.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0).astype(np.int64) * num_buckets
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    max_exact = num_buckets // 2
    safe_n = np.maximum(n, max_exact)  # the log branch is only used for n >= max_exact
    x = np.log(safe_n / max_exact) / np.log(max_distance / max_exact) * (num_buckets - max_exact)
    large = max_exact + np.floor(x + 1e-9).astype(np.int64)  # tolerance: exact boundaries
    large = np.minimum(large, num_buckets - 1)
    return ret + np.where(n < max_exact, n, large)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 64), (10, 20), (8, 100)])
def test_t5_buckets_match_numpy_reference(bidirectional, num_buckets, max_distance):
    rel = np.arange(-400, 401)
    got = attention_bias.t5_relative_position_bucket(
        jnp.asarray(rel),
        bidirectional=bidirectional,
        num_buckets=num_buckets,
        max_distance=max_distance,
    )
    want = np_t5_bucket(rel, bidirectional, num_buckets, max_distance)
    np.testing.assert_array_equal(np.asarray(got), want)
    assert got.dtype == jnp.int32
    assert int(got.min()) >= 0 and int(got.max()) == num_buckets - 1


def test_t5_buckets_hand_worked():
    # Bidirectional, 32 buckets: 16 per side, exact below 8, then 8 + floor(2 log2(n / 8)).
    rel = [0, 1, 7, 8, 11, 12, 16, 22, 23, 90, 91, 127, 128, 5000, -1, -7, -16, -1000]
    bi = [0, 1, 7, 8, 8, 9, 10, 10, 11, 14, 15, 15, 15, 15, 17, 23, 26, 31]
    # Causal, 32 buckets: exact below 16, then 16 + floor(16/3 log2(n / 16)); future -> 0.
    causal = [0, 1, 7, 8, 11, 12, 16, 18, 18, 29, 29, 31, 31, 31, 0, 0, 0, 0]
    kw = dict(num_buckets=32, max_distance=128)
    got_bi = attention_bias.t5_relative_position_bucket(jnp.array(rel), bidirectional=True, **kw)
    got_c = attention_bias.t5_relative_position_bucket(jnp.array(rel), bidirectional=False, **kw)
    assert got_bi.tolist() == bi
    assert got_c.tolist() == causal


def test_t5_module_bias_reads_table_with_our_sign_convention():
    cfg = tiny_cfg("t5", {"num_buckets": 8, "max_distance": 16})
    pe = build(cfg)
    table = np.arange(16, dtype=np.float32).reshape(8, 2)  # bucket b, head h -> 2b + h
    pe.table[...] = jnp.asarray(table)
    pos = jnp.array([[0, 1, 2, 3, 9]])
    bias_c = np.asarray(pe.bias(pos, pos, causal=True))
    bias_b = np.asarray(pe.bias(pos, pos, causal=False))
    assert bias_c.shape == (1, 2, 5, 5)
    # query at 9, key at 0: q - k = 9 (past). Causal: 8 buckets, exact below 4,
    # 4 + floor(log(9/4) / log(4) * 4) = 4 + 2 = 6. Bidirectional: 4 per side, exact below
    # 2, 2 + floor(log(9/2) / log(8) * 2) = 2 + 1 = 3.
    assert bias_c[0, 1, 4, 0] == 2 * 6 + 1
    assert bias_b[0, 1, 4, 0] == 2 * 3 + 1
    # query at 1, key at 3: q - k = -2 (future). Causal: bucket 0; bidirectional:
    # 4 + (2 + floor(log(2/2)...)) = 4 + 2 = 6.
    assert bias_c[0, 0, 1, 3] == 0
    assert bias_b[0, 0, 1, 3] == 2 * 6
    # Diagonal (distance 0) is bucket 0 in both.
    np.testing.assert_array_equal(np.diagonal(bias_b[0, 1]), np.ones(5))


def test_t5_config_validation():
    with pytest.raises(
        ConfigError, match=r"ModelConfig\.positional_options\.num_buckets=5: must be an even int"
    ):
        tiny_cfg("t5", {"num_buckets": 5})
    with pytest.raises(
        ConfigError,
        match=r"ModelConfig\.positional_options\.max_distance=8: must be an int > "
        r"num_buckets // 2 = 8",
    ):
        tiny_cfg("t5", {"num_buckets": 16, "max_distance": 8})
    assert tiny_cfg("t5", {"num_buckets": 16, "max_distance": 9}).positional_options == (
        encodings.T5Options(num_buckets=16, max_distance=9)
    )


def np_rope_half(x, pos, base=10000.0):
    """Rotate-half RoPE in numpy: x [b, l, h, d], pos [b, l]."""
    d = x.shape[-1]
    theta = base ** (-2.0 * np.arange(d // 2) / d)
    ang = pos[:, :, None, None] * theta
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate(
        [x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)], -1
    )


def test_xpos_matches_numpy_reference():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 4, 2, 8)).astype(np.float32)
    pos = np.array([[0, 5, 100, 700]])
    d = 8
    zeta = (np.arange(0, d, 2) + 0.4 * d) / (1.4 * d)  # torchscale's scale buffer
    for inverse, sign in ((False, 1.0), (True, -1.0)):
        got = rotary.apply_xpos(jnp.asarray(x), jnp.asarray(pos), center=0, inverse=inverse)
        scale = zeta[None, None, :] ** (sign * pos[:, :, None] / 512.0)
        scale = np.concatenate([scale, scale], -1)[:, :, None, :]
        want = np_rope_half(x.astype(np.float64), pos) * scale
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [None, 4])
def test_xpos_without_decay_is_rope_exactly(layout, rotary_dim):
    x = jax.random.normal(jax.random.key(1), (2, 5, 2, 8))
    pos = jnp.array([[0, 1, 2, 3, 4], [7, 30, 31, 200, 900]])
    got = rotary.apply_xpos(
        x, pos, center=3, scale_base=math.inf, layout=layout, rotary_dim=rotary_dim
    )
    want = rotary.apply_rope(x, pos, layout=layout, rotary_dim=rotary_dim)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_xpos_logits_are_relative_and_decay():
    cfg = tiny_cfg("xpos", num_heads=1)
    pe = build(cfg)
    q = jax.random.normal(jax.random.key(2), (1, 6, 1, 16))
    k = jax.random.normal(jax.random.key(3), (1, 6, 1, 16))
    pos = jnp.array([[0, 1, 2, 5, 9, 20]])
    ref = logits_of(*pe.rotate(q, k, pos, pos))
    shifted = logits_of(*pe.rotate(q, k, pos + 1000, pos + 1000))
    np.testing.assert_allclose(shifted, ref, rtol=1e-3, atol=2e-3)
    # The centre cancels: an explicit centre of 0 gives the same logits.
    q0 = rotary.apply_xpos(q, pos, center=0)
    k0 = rotary.apply_xpos(k, pos, center=0, inverse=True)
    np.testing.assert_allclose(logits_of(q0, k0), ref, rtol=1e-4, atol=1e-4)
    # Against plain RoPE, each pair's contribution is damped by zeta_i^((n - m)/512).
    qr, kr = rotary.apply_rope(q, pos), rotary.apply_rope(k, pos)
    zeta = np.asarray(rotary.xpos_zeta(16), np.float64)
    qr, kr = np.asarray(qr, np.float64), np.asarray(kr, np.float64)
    p = np.asarray(pos[0], np.float64)
    per_pair = qr[0, :, 0, None, :] * kr[0, None, :, 0, :]  # [q, k, d]
    damp = zeta[None, None, :] ** ((p[:, None, None] - p[None, :, None]) / 512.0)
    want = (per_pair * np.concatenate([damp, damp], -1)).sum(-1)
    np.testing.assert_allclose(ref[0, 0], want, rtol=1e-4, atol=1e-4)


def test_xpos_is_causal_only():
    cfg = tiny_cfg("xpos")
    assert fl.get_positional_encoding("xpos").causal_only
    with pytest.raises(ValueError, match="only for causal"):
        fl.Encoder(cfg, rngs=nnx.Rngs(0))
    # xPos has no context-extension scaling: not an option, and no evaluation-time variant
    with pytest.raises(
        ValueError, match=r"no option\(s\) \['scale', 'scaling'\] for positional='xpos'"
    ):
        tiny_cfg("xpos", {"scaling": "pi", "scale": 2.0})
    assert not fl.get_positional_encoding("xpos").rope_scaling
    with pytest.raises(ValueError, match="positional='xpos' has no evaluation-time variant"):
        fl.rope_scaling_variant(cfg, 32, "pi")
    with pytest.raises(
        ConfigError,
        match=r"ModelConfig\.positional_options\.scale_base=0\.0: must be a finite number > 0",
    ):
        tiny_cfg("xpos", {"scale_base": 0})


@pytest.mark.parametrize("name", ["kerple_log", "kerple_power"])
def test_kerple_matches_numpy_and_depends_only_on_distance(name):
    pe = build(tiny_cfg(name, num_heads=4))
    r1 = np.asarray(pe.r1[...], np.float64)
    r2 = np.asarray(pe.r2[...], np.float64)
    assert np.all(r1 >= np.float32(0.01)) and np.all(r2 >= np.float32(0.01))
    if name == "kerple_power":
        assert np.all(r2 <= 2.0)
    pos = np.array([[0, 3, 4, 10, 250]])
    got = np.asarray(pe.bias(jnp.asarray(pos), jnp.asarray(pos), causal=True))
    d = np.abs(pos[0][:, None] - pos[0][None, :]).astype(np.float64)
    if name == "kerple_log":
        want = -r1[:, None, None] * np.log(1 + r2[:, None, None] * d)
    else:
        want = -r1[:, None, None] * d ** r2[:, None, None]
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)
    shifted = pe.bias(jnp.asarray(pos + 777), jnp.asarray(pos + 777), causal=True)
    np.testing.assert_array_equal(np.asarray(shifted), got)
    bidi = np.asarray(pe.bias(jnp.asarray(pos), jnp.asarray(pos), causal=False))
    np.testing.assert_array_equal(bidi[0], np.swapaxes(bidi[0], -1, -2))


def test_kerple_clamps_with_straight_through_gradient():
    pe = build(tiny_cfg("kerple_power", num_heads=2))
    pe.r1[...] = jnp.array([-1.0, 0.5])
    pe.r2[...] = jnp.array([5.0, 0.001])
    r1, r2 = pe.coefficients()
    np.testing.assert_allclose(np.asarray(r1), [0.01, 0.5], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(r2), [2.0, 0.01], rtol=1e-6)
    pos = jnp.arange(5)[None]

    def loss(model):
        return model.bias(pos, pos, causal=True).sum()

    grads = nnx.grad(loss)(pe)
    g1, g2 = np.asarray(grads.r1[...]), np.asarray(grads.r2[...])
    assert np.all(np.isfinite(g1)) and np.all(np.isfinite(g2))  # 0^r2 at distance 0
    assert np.all(g1 != 0) and np.all(g2 != 0)  # outside the box, still a gradient


def np_fire(pe, qp, kp):
    w1, b1 = np.asarray(pe.w1[...], np.float64), np.asarray(pe.b1[...], np.float64)
    w2, b2 = np.asarray(pe.w2[...], np.float64), np.asarray(pe.b2[...], np.float64)
    c = abs(float(pe.c[...]))
    big_l = abs(float(pe.threshold_scale[...])) * pe.threshold_init
    psi = lambda x: np.log(c * x + 1.0)
    i = qp[:, None].astype(np.float64)
    u = psi(np.abs(qp[:, None] - kp[None, :])) / (psi(np.maximum(big_l, i)) + 1e-6)
    hidden = np.maximum(u[..., None] * w1[0] + b1, 0.0)  # [q, k, width]
    return np.moveaxis(hidden @ w2 + b2, -1, 0), u  # [heads, q, k]


def test_fire_matches_numpy_reference_and_normalises_by_query_position():
    cfg = tiny_cfg("fire", {"mlp_width": 8, "threshold_init": 6.0}, num_heads=2)
    pe = build(cfg)
    pe.c[...] = jnp.asarray(0.7)
    pe.threshold_scale[...] = jnp.asarray(-1.0)  # L = |l| * 6 = 6
    pos = np.array([0, 2, 4, 6, 10, 14, 40])
    got = np.asarray(pe.bias(jnp.asarray(pos)[None], jnp.asarray(pos)[None], causal=True))
    want, u = np_fire(pe, pos, pos)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    got_u = np.asarray(pe.normalized_distance(jnp.asarray(pos)[None], jnp.asarray(pos)[None]))
    np.testing.assert_allclose(got_u[0], u, rtol=1e-5)
    # Same distance 4 everywhere below. Queries 4 and 6 are <= L = 6: both normalised by
    # psi(6), same value; queries 10 and 14 are normalised by psi(10) and psi(14).
    assert got_u[0, 2, 0] == pytest.approx(got_u[0, 3, 1], rel=1e-6)
    psi = lambda x: math.log(0.7 * x + 1)
    assert got_u[0, 2, 0] == pytest.approx(psi(4) / psi(6), rel=1e-5)
    assert got_u[0, 4, 3] == pytest.approx(psi(4) / psi(10), rel=1e-5)
    assert got_u[0, 5, 4] == pytest.approx(psi(4) / psi(14), rel=1e-5)
    # Bidirectional uses |i - j|: symmetric where both positions are below L.
    bidi = np.asarray(pe.bias(jnp.asarray(pos)[None], jnp.asarray(pos)[None], causal=False))
    np.testing.assert_allclose(bidi[0, :, :4, :4], np.swapaxes(bidi[0, :, :4, :4], -1, -2))


def test_fire_initial_parameters():
    pe = build(tiny_cfg("fire"))
    assert float(pe.c[...]) == pytest.approx(0.1)
    assert float(pe.threshold()) == pytest.approx(512.0)
    assert pe.w1[...].shape == (1, 32) and pe.w2[...].shape == (32, 2)
    assert pe.w2.get_metadata()["logical_axes"] == ("fire_mlp", "heads")
    with pytest.raises(
        ConfigError, match=r"ModelConfig\.positional_options\.mlp_width=0: must be a positive int"
    ):
        tiny_cfg("fire", {"mlp_width": 0})


def test_randomized_positions_sorted_unique_in_range_and_deterministic():
    key = jax.random.key(7)
    p = np.asarray(randomized_positions(key, 64, 10, max_position=50))
    assert p.shape == (64, 10) and p.dtype == np.int32
    assert np.all(np.diff(p, axis=1) > 0)  # sorted and unique
    assert p.min() >= 0 and p.max() < 50
    again = np.asarray(randomized_positions(key, 64, 10, max_position=50))
    np.testing.assert_array_equal(p, again)
    other = np.asarray(randomized_positions(jax.random.key(8), 64, 10, max_position=50))
    assert not np.array_equal(p, other)
    assert len({tuple(row) for row in p}) > 60  # rows are drawn independently
    full = randomized_positions(key, 2, 12, max_position=12)
    np.testing.assert_array_equal(np.asarray(full), np.tile(np.arange(12), (2, 1)))


def test_randomized_positions_are_uniform_subsets():
    p = np.asarray(randomized_positions(jax.random.key(0), 4000, 4, max_position=16))
    counts = np.bincount(p.ravel(), minlength=16) / 4000  # each value in a row w.p. 4/16
    np.testing.assert_allclose(counts, 0.25, atol=0.03)
    with pytest.raises(ValueError, match="max_position"):
        randomized_positions(jax.random.key(0), 1, 5, max_position=4)


def test_randomized_positions_config_fields():
    cfg = tiny_cfg("rope", randomized_positions=True, max_position=4096)
    assert cfg.max_position == 4096
    with pytest.raises(ValueError, match="max_position=0"):
        tiny_cfg("rope", max_position=0)
    with pytest.raises(ValueError, match="randomized_positions='yes'"):
        tiny_cfg("rope", randomized_positions="yes")
    with pytest.raises(ConfigError, match=r"max_position=128.*positional_options\.max_length=64\)"):
        tiny_cfg("learned", randomized_positions=True, max_position=128)
    tiny_cfg("learned", randomized_positions=True, max_position=64)


def test_rotary_dim_for_rounding():
    assert rotary.rotary_dim_for(64, 0.25) == 16
    assert rotary.rotary_dim_for(64, 0.5) == 32
    assert rotary.rotary_dim_for(6, 0.5) == 4  # 3 -> nearest even, halves round up
    assert rotary.rotary_dim_for(10, 0.3) == 4  # 3 -> 4
    assert rotary.rotary_dim_for(8, 0.1) == 2  # at least one pair
    assert rotary.rotary_dim_for(5, 1.0) == 4  # never more than head_dim
    with pytest.raises(ValueError, match="fraction"):
        rotary.rotary_dim_for(8, 0.0)


def test_partial_rotary_rotates_only_the_first_dims():
    cfg = tiny_cfg("rope", {"fraction": 0.25}, d_model=32, num_heads=2)  # head_dim 16 -> 4
    pe = build(cfg)
    assert pe.rotary_dim == 4
    q = jax.random.normal(jax.random.key(0), (1, 5, 2, 16))
    pos = jnp.array([[0, 3, 9, 27, 81]])
    q_rot, _ = pe.rotate(q, q, pos, pos)
    np.testing.assert_array_equal(np.asarray(q_rot[..., 4:]), np.asarray(q[..., 4:]))
    want = np_rope_half(np.asarray(q[..., :4], np.float64), np.asarray(pos))
    np.testing.assert_allclose(np.asarray(q_rot[..., :4]), want, rtol=1e-5, atol=1e-5)
    spec = fl.get_positional_encoding("rope")
    settings = spec.settings(cfg.positional_options)
    assert settings["fraction"] == 0.25 and settings["scaling"] == "none"
    with pytest.raises(ConfigError, match=r"ModelConfig\.positional_options\.fraction=1\.5"):
        tiny_cfg("rope", {"fraction": 1.5})


@pytest.mark.parametrize("scaling", ["pi", "ntk", "yarn", "dynamic_ntk"])
def test_scalings_at_scale_one_equal_plain_rope_exactly(scaling):
    plain = build(tiny_cfg("rope"))
    scaled = build(tiny_cfg("rope", {"scaling": scaling, "original_length": 16}))
    q = jax.random.normal(jax.random.key(0), (2, 8, 2, 8))
    k = jax.random.normal(jax.random.key(1), (2, 8, 2, 8))
    pos = jnp.array([[0, 1, 2, 3, 4, 5, 6, 7], [3, 4, 5, 6, 7, 8, 9, 15]])  # max+1 <= 16
    for a, b in zip(plain.rotate(q, k, pos, pos), scaled.rotate(q, k, pos, pos), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    if scaling != "dynamic_ntk":
        freqs = rotary.rope_scaled_inv_frequencies(
            8, scaling=scaling, scale=1.0, original_length=16
        )
        np.testing.assert_array_equal(np.asarray(freqs), np.asarray(rotary.rope_inv_frequencies(8)))


def test_pi_interpolates_positions():
    x = jax.random.normal(jax.random.key(0), (1, 4, 1, 8))
    inv = rotary.rope_scaled_inv_frequencies(8, scaling="pi", scale=4.0)
    got = rotary.apply_rotary(x, rotary.rope_angles(jnp.array([[0, 4, 8, 40]]), inv))
    want = rotary.apply_rope(x, jnp.array([[0, 1, 2, 10]]))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_ntk_base_formula():
    d, s, b = 16, 4.0, 10000.0
    assert rotary.ntk_scaled_base(b, s, d) == pytest.approx(b * s ** (d / (d - 2)), rel=1e-12)
    got = np.asarray(rotary.rope_scaled_inv_frequencies(d, scaling="ntk", scale=s))
    theta = b ** (-2.0 * np.arange(d // 2) / d)
    want = (b * s ** (d / (d - 2))) ** (-2.0 * np.arange(d // 2) / d)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got[0] == pytest.approx(theta[0])  # the highest frequency is kept
    assert got[-1] == pytest.approx(theta[-1] / s, rel=1e-6)  # the lowest is interpolated by s


def test_paper_yarn_blend_matches_numpy_reference_at_chosen_dims():
    """The paper's variant (Eq. 17-19); the default is the authors' code (test_rope_scaling)."""
    d, s, big_l, b = 64, 4.0, 512, 10000.0
    got = np.asarray(
        rotary.rope_scaled_inv_frequencies(
            d,
            scaling="yarn",
            scale=s,
            original_length=big_l,
            alpha=1.0,
            beta=32.0,
            yarn_variant="paper",
        )
    )
    dims = np.array([0, 3, 5, 10, 15, 20, 31])
    theta = b ** (-2.0 * dims / d)
    r = big_l / (2 * math.pi / theta)  # L / wavelength
    gamma = np.clip((r - 1.0) / (32.0 - 1.0), 0.0, 1.0)
    assert gamma.max() == 1.0 and gamma.min() == 0.0 and np.any((gamma > 0) & (gamma < 1))
    want = (1 - gamma) * theta / s + gamma * theta
    np.testing.assert_allclose(got[dims], want, rtol=1e-6)
    # Hand-worked, pair 10: theta = 10^-1.25 = 0.056234, r = 512 theta / 2 pi = 4.5824,
    # gamma = 3.5824 / 31 = 0.11556, theta' = 0.88444 theta / 4 + 0.11556 theta = 0.018932.
    assert got[10] == pytest.approx(0.018932, rel=1e-4)


def test_yarn_module_applies_temperature_to_q_and_k():
    cfg = tiny_cfg("rope", {"scaling": "yarn", "scale": 4.0, "original_length": 16})
    pe = build(cfg)
    assert pe.attention_factor == pytest.approx(0.1 * math.log(4.0) + 1.0)
    q = jax.random.normal(jax.random.key(0), (1, 5, 2, 8))
    pos = jnp.arange(5)[None]
    qs, ks = pe.rotate(q, q, pos, pos)
    inv = rotary.yarn_inv_frequencies(8, scale=4.0, original_length=16)
    want = rotary.apply_rotary(q, rotary.rope_angles(pos, inv)) * pe.attention_factor
    np.testing.assert_allclose(np.asarray(qs), np.asarray(want), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ks), np.asarray(want), rtol=1e-6)


def test_dynamic_ntk_scale_follows_each_rows_length():
    pos = jnp.array([[0, 1, 2, 3, 4, 5, 6, 7], [0, 4, 8, 12, 16, 20, 24, 31]])
    got = np.asarray(rotary.dynamic_ntk_inv_frequencies(pos, 8, original_length=8))
    np.testing.assert_array_equal(got[0], np.asarray(rotary.rope_inv_frequencies(8)))
    want = np.asarray(rotary.rope_inv_frequencies(8, base=rotary.ntk_scaled_base(1e4, 4.0, 8)))
    np.testing.assert_allclose(got[1], want, rtol=1e-5)  # s = 32 / 8 = 4


def test_rope_scaling_variant_and_row_names():
    cfg = tiny_cfg("rope", {"original_length": 8})
    for scaling, scale in (("pi", 4.0), ("ntk", 4.0), ("yarn", 4.0), ("dynamic_ntk", 1.0)):
        v = fl.rope_scaling_variant(cfg, 32, scaling)
        assert (v.positional_options.scaling, v.positional_options.scale) == (scaling, scale)
        assert v.positional_options.original_length == 8
        assert v == cfg.replace(
            positional_options={"original_length": 8, "scaling": scaling, "scale": scale}
        )
        assert fl.encoding_row_name(v) == f"rope+{scaling}"
        assert fl.get_positional_encoding("rope").settings(v.positional_options)["scale"] == scale
    assert fl.rope_scaling_variant(cfg, 4, "yarn").positional_options.scale == 1.0  # never < 1
    assert fl.encoding_row_name(cfg) == "rope"
    # default: the config's own scaling, at the new length
    pi = fl.rope_scaling_variant(cfg, 16, "pi")
    assert fl.rope_scaling_variant(pi, 24).positional_options.scale == 3.0
    assert fl.rope_scaling_variant(cfg, 24) == cfg  # "none" stays plain RoPE
    with pytest.raises(ValueError, match=r"ModelConfig\.positional_options\.original_length=None"):
        fl.rope_scaling_variant(tiny_cfg("rope"), 32, "pi")
    with pytest.raises(ValueError, match=r"scaling='linear' is not known"):
        fl.rope_scaling_variant(cfg, 32, "linear")
    with pytest.raises(ValueError, match=r"eval_length=0: must be a positive int"):
        fl.rope_scaling_variant(cfg, 0, "pi")
    # RoPE scaling applies only where the spec says so; other encodings raise
    specs = [fl.get_positional_encoding(n) for n in fl.positional_encoding_names()]
    assert [spec.name for spec in specs if spec.rope_scaling] == ["rope", "p_rope", "alibi"]
    with pytest.raises(ValueError, match=r"variant='pi'; ALiBi's allowed: \['alibi_pi'\]"):
        fl.rope_scaling_variant(tiny_cfg("alibi"), 32, "pi")
    for name in ("sinusoidal", "t5"):
        with pytest.raises(ValueError, match=rf"positional='{name}' has no evaluation-time"):
            fl.rope_scaling_variant(tiny_cfg(name), 32, "pi")
        assert fl.encoding_row_name(tiny_cfg(name)) == name


def test_rope_at_length_is_the_options_level_variant():
    options = encodings.RopeOptions(base=500.0, original_length=8)
    assert encodings.rope_at_length is encodings_rotary.rope_at_length
    assert encodings.rope_at_length(options, "pi", 32) == encodings.RopeOptions(
        base=500.0, original_length=8, scaling="pi", scale=4.0
    )
    assert encodings.rope_at_length(options, "ntk", 12).scale == 1.5
    assert encodings.rope_at_length(options, "yarn", 4).scale == 1.0  # never below 1
    assert encodings.rope_at_length(options, "dynamic_ntk", 32).scale == 1.0
    cfg = tiny_cfg("rope", positional_options=options)
    assert fl.rope_scaling_variant(cfg, 32, "pi").positional_options == (
        encodings.rope_at_length(options, "pi", 32)
    )
    with pytest.raises(ValueError, match="original_length=None"):
        encodings.rope_at_length(encodings.RopeOptions(), "pi", 32)


def test_rope_scaling_config_validation():
    def bad(options, option, value, allowed):
        with pytest.raises(ConfigError) as err:
            tiny_cfg("rope", options)
        msg = str(err.value)
        assert f"ModelConfig.positional_options.{option}={value!r}: " in msg, msg
        assert allowed in msg, msg

    bad({"scaling": "linear"}, "scaling", "linear", "allowed: ['none', 'pi'")
    bad({"scaling": "pi", "scale": 0.5}, "scale", 0.5, "must be a finite number >= 1")
    bad({"scale": 2.0}, "scale", 2.0, "must be 1.0 with scaling='none'")
    bad({"scaling": "yarn", "scale": 2.0}, "original_length", None, "needs the training length")
    bad({"yarn_alpha": 4, "yarn_beta": 2}, "yarn_alpha", 4.0, "yarn_alpha < yarn_beta=2.0")


def test_scaled_rope_model_reuses_trained_state():
    cfg = tiny_cfg("rope", {"original_length": 8})
    model = fl.DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
    state = nnx.state(model)
    tokens = jnp.arange(16)[None] % 13

    def run(c, length):
        m = fl.DecoderOnlyLM(c, rngs=nnx.Rngs(1))
        nnx.update(m, state)
        t = tokens[:, :length]
        return np.asarray(nnx.jit(lambda m, t: m(t, fl.default_positions(t)))(m, t))

    plain16 = run(cfg, 16)
    # At eval length == original_length the scale is 1: YaRN is plain RoPE. Compared at
    # float32 tolerance: a length-8 and a length-16 program may round differently (jax 0.12).
    yarn8 = run(fl.rope_scaling_variant(cfg, 8, "yarn"), 8)
    np.testing.assert_allclose(yarn8, plain16[:, :8], rtol=1e-5, atol=1e-5)
    pi16 = run(fl.rope_scaling_variant(cfg, 16, "pi"), 16)
    assert not np.allclose(pi16, plain16, atol=1e-4)
    # Evaluation's route to a scaled model: the same state under the scaled config.
    rebuilt = rebuild_model(model, fl.rope_scaling_variant(cfg, 16, "pi"))
    assert rebuilt.cfg.positional_options.scale == 2.0 and rebuild_model(model, cfg) is model
    out = nnx.jit(lambda m, t: m(t, fl.default_positions(t)))(rebuilt, tokens)
    np.testing.assert_allclose(np.asarray(out), pi16, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "name,extra",
    [(n, {}) for n in NEW_ENCODINGS]
    + [
        ("rope", dict(fraction=0.5)),
        ("rope", dict(scaling="pi", scale=2.0)),
        ("rope", dict(scaling="ntk", scale=2.0)),
        ("rope", dict(scaling="dynamic_ntk", original_length=4)),
        ("rope", dict(scaling="yarn", scale=2.0, original_length=4)),
    ],
)
def test_decoder_only_lm_jit_causal_with_randomized_positions(name, extra):
    cfg = tiny_cfg(name, extra)
    model = fl.DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(0), (2, 8), 0, 13)
    pos = randomized_positions(jax.random.key(1), 2, 8, max_position=64)

    @nnx.jit
    def loss_and_logits(m, t, p):
        def loss(m):
            logits = m(t, p)
            return jnp.mean(logits**2), logits

        (value, logits), grads = nnx.value_and_grad(loss, has_aux=True)(m)
        return value, logits, grads

    _, logits, grads = loss_and_logits(model, tokens, pos)
    assert logits.shape == (2, 8, 13) and bool(jnp.isfinite(logits).all())
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))
    pe_grads = jax.tree.leaves(grads["decoder"]["pe"]) if name in NEW_ENCODINGS[1:] else []
    assert all(float(jnp.abs(g).sum()) > 0 for g in pe_grads)
    changed = tokens.at[:, 5:].set((tokens[:, 5:] + 1) % 13)
    _, logits2, _ = loss_and_logits(model, changed, pos)
    np.testing.assert_allclose(np.asarray(logits2[:, :5]), np.asarray(logits[:, :5]), atol=1e-5)
    assert not np.allclose(np.asarray(logits2[:, 5:]), np.asarray(logits[:, 5:]))
    # Positions matter: the same tokens at other positions give other logits.
    _, logits3, _ = loss_and_logits(model, tokens, pos + 3 * jnp.arange(8)[None])
    assert not np.allclose(np.asarray(logits3[:, 1:]), np.asarray(logits[:, 1:]), atol=1e-5)


@pytest.mark.parametrize("name", ["t5", "kerple_log", "fire"])
def test_bias_encodings_run_bidirectionally_in_encoder_decoder(name):
    model = fl.EncoderDecoder(tiny_cfg(name), rngs=nnx.Rngs(0))
    src = jnp.arange(10).reshape(2, 5) % 13
    tgt = jnp.arange(8).reshape(2, 4) % 13
    run = nnx.jit(
        lambda m, s, t: m(
            s, t, src_positions=fl.default_positions(s), tgt_positions=fl.default_positions(t)
        )
    )
    out = run(model, src, tgt)
    assert out.shape == (2, 4, 13) and bool(jnp.isfinite(out).all())


def test_registry_entries():
    names = fl.positional_encoding_names()
    for name in NEW_ENCODINGS:
        assert name in names
    hooks = {n: fl.get_positional_encoding(n).hook for n in NEW_ENCODINGS}
    assert hooks == {
        "xpos": "rotate",
        "t5": "bias",
        "kerple_log": "bias",
        "kerple_power": "bias",
        "fire": "bias",
    }
    for name, kernel in (("kerple_log", "log"), ("kerple_power", "power")):
        pe = build(tiny_cfg(name))
        assert isinstance(pe, bias_encodings.KerpleBias) and pe.kernel == kernel
    t5 = tiny_cfg("t5")
    assert fl.get_positional_encoding("t5").settings(t5.positional_options) == {
        "positional": "t5",
        "num_buckets": 32,
        "max_distance": 128,
    }
    options = {n: fl.get_positional_encoding(n).options for n in NEW_ENCODINGS}
    assert options == {
        "xpos": encodings.XPosOptions,
        "t5": encodings.T5Options,
        "kerple_log": encodings.NoOptions,
        "kerple_power": encodings.NoOptions,
        "fire": encodings.FireOptions,
    }
    assert fl.get_positional_encoding("rope").option_names() == (
        "base",
        "layout",
        "fraction",
        "scaling",
        "scale",
        "original_length",
        "yarn_alpha",
        "yarn_beta",
        "yarn_variant",
        "yarn_truncate",
        "yarn_mscale",
        "yarn_mscale_all_dim",
        "attention_factor",
        "llama3_low_freq_factor",
        "llama3_high_freq_factor",
        "longrope_short_factor",
        "longrope_long_factor",
    )
    assert fl.get_positional_encoding("xpos").option_names() == (
        "base",
        "layout",
        "fraction",
        "scale_base",
    )
    # every setting the old flat fields held is an option, and the spec keeps no old names
    assert {
        "base",
        "layout",
        "fraction",
        "scaling",
        "scale",
        "original_length",
        "yarn_alpha",
        "yarn_beta",
    } <= set(fl.get_positional_encoding("rope").option_names())
    assert {"num_buckets", "max_distance"} <= set(fl.get_positional_encoding("t5").option_names())
    assert not any(
        hasattr(fl.get_positional_encoding(name), "legacy_fields")
        for name in fl.positional_encoding_names()
    )
    # the classes live in their hook's module and are re-exported by the package
    assert encodings.KerpleBias is bias_encodings.KerpleBias
    assert encodings.T5RelativeBias is bias_encodings.T5RelativeBias
    assert encodings.XPosEncoding is encodings_rotary.XPosEncoding
    assert encodings.RotaryEncoding is encodings_rotary.RotaryEncoding


def test_kerple_module_takes_dims_options_and_kernel():
    dims = tiny_cfg("kerple_log", num_heads=4).dims
    for kernel in ("log", "power"):
        pe = encodings.KerpleBias(dims, encodings.NoOptions(), kernel=kernel, rngs=nnx.Rngs(0))
        assert pe.kernel == kernel and pe.r1[...].shape == pe.r2[...].shape == (4,)
    assert pe.r2_max == 2.0
    with pytest.raises(ValueError, match=r"kernel='cubic'; allowed: \['log', 'power'\]"):
        encodings.KerpleBias(dims, encodings.NoOptions(), kernel="cubic", rngs=nnx.Rngs(0))


@pytest.mark.parametrize("kernel", ["kerple_log", "kerple_power"])
def test_kerple_parameters_stay_in_their_box_after_every_update(kernel, monkeypatch):
    """The reference clamps r1, r2 in place before each forward; here the training step
    projects them back after each update (`nn.constraints`), so the stored values never
    leave the box even when an update would push them out (shown by the same steps with the
    projection switched off)."""
    import optax

    from flaxformer_lite.nn import constraints
    from flaxformer_lite.train import step as train_step

    rng = np.random.default_rng(0)
    batch = {
        "inputs": jnp.asarray(rng.integers(0, 13, (2, 8)), jnp.int32),
        "targets": jnp.asarray(rng.integers(0, 13, (2, 8)), jnp.int32),
        "loss_mask": jnp.ones((2, 8)),
        "positions": jnp.broadcast_to(jnp.arange(8), (2, 8)),
    }
    high = 2.0 if kernel == "kerple_power" else np.inf

    def coefficients(project: bool) -> list[tuple[np.ndarray, np.ndarray]]:
        if not project:
            monkeypatch.setattr(constraints, "project", lambda state: state)
        model = fl.DecoderOnlyLM(tiny_cfg(kernel), rngs=nnx.Rngs(0))
        # an update of -5 then +5 on every parameter: first below the box, then above it
        sign = {"n": 0}

        def update(grads, opt_state, params=None):
            sign["n"] += 1
            delta = -5.0 if sign["n"] == 1 else 5.0
            return jax.tree.map(lambda g: jnp.full_like(g, delta), grads), opt_state

        tx = optax.GradientTransformation(lambda params: optax.EmptyState(), update)
        graphdef, state = train_step.init_train_state(model, tx)
        out = []
        for _ in range(2):
            step = train_step.make_train_step(graphdef, tx, lambda s: 1.0)
            state, _ = step(state, batch)
            pe = state["params"]["decoder"]["pe"]
            out.append(tuple(np.asarray(pe[n].get_value()) for n in ("r1", "r2")))
        return out

    def in_box(r1, r2):
        return (r1 >= 0.01).all() and (r2 >= 0.01).all() and (r2 <= high).all()

    (low1, low2), (high1, high2) = coefficients(project=True)
    assert in_box(low1, low2) and in_box(high1, high2)
    np.testing.assert_allclose(low1, 0.01)  # clipped to the lower edge ...
    if kernel == "kerple_power":
        np.testing.assert_allclose(high2, 2.0)  # ... and to the upper one
    assert not in_box(*coefficients(project=False)[0])  # without it: out of the box
    model = fl.DecoderOnlyLM(tiny_cfg(kernel), rngs=nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    assert constraints.bounds_of(params["decoder"]["pe"]["r2"]) == (
        0.01,
        None if high == np.inf else 2.0,
    )
