"""Tests of the positional-encoding registry and modules (DESIGN.md §3, §4).

Generic tests iterate `positional_encoding_names()`, so an encoding added to the registry
is covered without editing this file.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tiny_models import tiny_model_config

from flaxformer_lite.core import rotary
from flaxformer_lite.nn import encodings
from flaxformer_lite.nn.encodings import (
    EncodingSpec,
    get_positional_encoding,
    positional_encoding_names,
    register,
    registry,
)
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
        "alibi",
        "t5",
        "kerple_log",
        "kerple_power",
        "fire",
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
