"""RopeOptions for Hugging Face's RoPE scalings (llama3, longrope, YaRN's extra fields) and
`rope_options_from_hf` on example config dicts in both formats (transformers 5
``rope_parameters``; older ``rope_scaling`` + ``rope_theta``)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tiny_models import tiny_model_config

import flaxformer_lite as fl
from flaxformer_lite.core import rotary
from flaxformer_lite.nn.encodings.base import ModelDims
from flaxformer_lite.nn.encodings.rotary import RopeOptions, RotaryEncoding, rope_at_length
from flaxformer_lite.pretrained.hf_rope import rope_options_from_hf

PATH = r"ModelConfig\.positional_options"
SHORT = (1.0, 1.1, 1.2, 1.3)  # TINY: head_dim 8 -> 4 rotated pairs
LONG = (1.0, 2.0, 4.0, 8.0)


def _dims(head_dim: int) -> ModelDims:
    return ModelDims(d_model=head_dim, num_heads=1, head_dim=head_dim)


def _encoding(options: RopeOptions, head_dim: int = 8) -> RotaryEncoding:
    return RotaryEncoding(_dims(head_dim), options, rngs=nnx.Rngs(0))


# ------------------------------------------------------------------------ option validation


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"scaling": "llama4"}, r"scaling='llama4': allowed: \[.*'llama3', 'longrope'\]"),
        ({"scaling": "llama3", "scale": 8.0}, r"original_length=None: scaling='llama3' needs"),
        (
            {"scaling": "llama3", "original_length": 8, "llama3_low_freq_factor": 0.0},
            r"llama3_low_freq_factor=0\.0: must be a finite number > 0",
        ),
        (
            {"scaling": "llama3", "original_length": 8, "llama3_high_freq_factor": 1.0},
            r"llama3_high_freq_factor=1\.0: must be a finite number > llama3_low_freq_factor=1\.0",
        ),
        (
            {"scaling": "longrope", "original_length": 8, "longrope_long_factor": LONG},
            r"longrope_short_factor=None: scaling='longrope' needs it",
        ),
        (
            {
                "scaling": "longrope",
                "original_length": 8,
                "longrope_short_factor": SHORT,
                "longrope_long_factor": (1.0, 2.0),
            },
            r"longrope_long_factor=\(1\.0, 2\.0\): needs 4 entries \(one per rotated pair: "
            r"rotary_dim=8\); got 2",
        ),
        (
            {
                "scaling": "longrope",
                "original_length": 8,
                "longrope_short_factor": (1.0, 0.0, 1.0, 1.0),
                "longrope_long_factor": LONG,
            },
            r"longrope_short_factor=\(1\.0, 0\.0, 1\.0, 1\.0\): must be a tuple of finite "
            r"numbers > 0",
        ),
        ({"scaling": "longrope", "scale": 0.5}, r"scale=0\.5: must be a finite number >= 1"),
        (
            {"scaling": "yarn", "scale": 4.0, "original_length": 8, "yarn_mscale": 1.0},
            r"yarn_mscale=1\.0: set both yarn_mscale and yarn_mscale_all_dim \(=None\) or neither",
        ),
        (
            {"scaling": "yarn", "scale": 4.0, "original_length": 8, "attention_factor": -1.0},
            r"attention_factor=-1\.0: must be a finite number > 0 or None",
        ),
        (
            {"scaling": "pi", "scale": 2.0, "attention_factor": 1.2},
            r"attention_factor=1\.2: only scaling='yarn' or 'longrope' takes it; scaling='pi'",
        ),
    ],
)
def test_option_errors_name_field_value_and_allowed(options, message):
    with pytest.raises(ValueError, match=rf"{PATH}\.{message}"):
        tiny_model_config("rope", options=options)


def test_option_types_are_checked_when_read_from_a_mapping():
    with pytest.raises(ValueError, match=rf"{PATH}\.rope\.yarn_truncate='no': must be True"):
        tiny_model_config("rope", options={"yarn_truncate": "no"})
    # JSON lists become tuples, so the options stay hashable
    cfg = tiny_model_config(
        "rope",
        options={
            "scaling": "longrope",
            "original_length": 8,
            "longrope_short_factor": list(SHORT),
            "longrope_long_factor": list(LONG),
        },
    )
    assert cfg.positional_options.longrope_long_factor == LONG
    hash(cfg.positional_options)


def test_rotary_encoding_caches_rotated_keys():
    assert RotaryEncoding.caches_rotated_keys is True
    assert fl.get_positional_encoding("xpos").factory.caches_rotated_keys is False


# ------------------------------------------------------------------- the encoding itself


def test_longrope_switches_factor_lists_at_the_original_length():
    options = RopeOptions(
        scaling="longrope",
        scale=4.0,
        original_length=8,
        longrope_short_factor=SHORT,
        longrope_long_factor=LONG,
    )
    enc = _encoding(options)
    theta = np.asarray(rotary.rope_inv_frequencies(8), np.float64)
    short = np.asarray(enc.inv_frequencies(jnp.arange(8)[None]))[0]
    long = np.asarray(enc.inv_frequencies(jnp.arange(9)[None]))[0]
    np.testing.assert_allclose(short, theta / np.asarray(SHORT), rtol=1e-6)
    np.testing.assert_allclose(long, theta / np.asarray(LONG), rtol=1e-6)
    # per row: a batch with one short and one long row
    both = np.asarray(enc.inv_frequencies(jnp.asarray([[0, 1, 2], [0, 5, 12]])))
    np.testing.assert_allclose(both, np.stack([short, long]), rtol=0)
    assert enc.attention_factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(8)))
    spec = fl.get_positional_encoding("rope")
    assert spec.scores_incrementally(options)


def test_attention_factor_scales_only_the_rotated_dims():
    """HF multiplies cos and sin: a partial rotary's pass-through dims keep their scale."""
    options = RopeOptions(
        fraction=0.5, scaling="yarn", scale=4.0, original_length=8, attention_factor=1.5
    )
    enc = _encoding(options, head_dim=16)
    assert enc.rotary_dim == 8 and enc.attention_factor == 1.5
    x = jax.random.normal(jax.random.key(0), (1, 3, 2, 16))
    q, _ = enc.rotate(x, x, jnp.arange(3)[None], jnp.arange(3)[None])
    np.testing.assert_array_equal(np.asarray(q[..., 8:]), np.asarray(x[..., 8:]))
    plain = _encoding(
        RopeOptions(fraction=0.5, scaling="yarn", scale=4.0, original_length=8), head_dim=16
    )
    q0, _ = plain.rotate(x, x, jnp.arange(3)[None], jnp.arange(3)[None])
    ratio = 1.5 / rotary.yarn_attention_factor(4.0)
    np.testing.assert_allclose(np.asarray(q[..., :8]), ratio * np.asarray(q0[..., :8]), rtol=1e-5)


def test_yarn_mscale_and_truncate():
    got = rotary.yarn_attention_factor(40.0, mscale=1.0, mscale_all_dim=1.0)
    assert got == 1.0
    m = lambda c: 0.1 * c * math.log(16.0) + 1.0
    got = rotary.yarn_attention_factor(16.0, mscale=0.707, mscale_all_dim=1.0)
    assert got == pytest.approx(m(0.707) / m(1.0), rel=1e-12)
    assert rotary.yarn_attention_factor(16.0, mscale=0.707) == pytest.approx(m(1.0))
    lo_t, hi_t = rotary.yarn_correction_range(
        64, original_length=4096, base=150000.0, beta_fast=32, beta_slow=1
    )
    lo, hi = rotary.yarn_correction_range(
        64, original_length=4096, base=150000.0, beta_fast=32, beta_slow=1, truncate=False
    )
    assert lo_t == math.floor(lo) and hi_t == math.ceil(hi) and lo != int(lo)


def test_llama3_bands():
    """Slow pairs divided by s, fast pairs kept, the band between blended continuously."""
    d, length, s = 64, 2048, 8.0
    theta = np.asarray(rotary.rope_inv_frequencies(d, base=5e5), np.float64)
    got = np.asarray(rotary.llama3_inv_frequencies(d, scale=s, original_length=length, base=5e5))
    wavelen = 2 * np.pi / theta
    fast, slow = wavelen < length / 4, wavelen > length
    assert fast.any() and slow.any() and (~fast & ~slow).any()
    np.testing.assert_allclose(got[fast], theta[fast], rtol=1e-7)
    np.testing.assert_allclose(got[slow], theta[slow] / s, rtol=1e-7)
    mid = ~fast & ~slow
    assert np.all((got[mid] <= theta[mid] * (1 + 1e-7)) & (got[mid] >= theta[mid] / s * (1 - 1e-7)))
    one = rotary.llama3_inv_frequencies(d, scale=1.0, original_length=length, base=5e5)
    np.testing.assert_allclose(np.asarray(one), theta, rtol=1e-7)


def test_rope_at_length_keeps_working_and_drops_a_fixed_attention_factor():
    options = RopeOptions(scaling="yarn", scale=4.0, original_length=8, attention_factor=1.3)
    assert rope_at_length(options, "yarn", 32).attention_factor == 1.3
    pi = rope_at_length(options, "pi", 32)
    assert (pi.scaling, pi.scale, pi.attention_factor) == ("pi", 4.0, None)
    pi.check(_dims(8), "x")
    with pytest.raises(ValueError, match=r"scaling='longrope' is not known; allowed"):
        rope_at_length(options, "longrope", 32)
    assert fl.get_positional_encoding("rope").eval_variants == rotary.ROPE_EVAL_SCALINGS


def test_models_build_and_run_with_the_new_scalings():
    for options in (
        {"scaling": "llama3", "scale": 4.0, "original_length": 4},
        {
            "scaling": "longrope",
            "scale": 2.0,
            "original_length": 4,
            "longrope_short_factor": SHORT,
            "longrope_long_factor": LONG,
        },
        {"scaling": "yarn", "scale": 2.0, "original_length": 4, "yarn_truncate": False},
    ):
        cfg = tiny_model_config("rope", options=options)
        model = fl.DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
        logits = model(jnp.zeros((1, 6), jnp.int32), jnp.arange(6)[None])
        assert logits.shape == (1, 6, 32) and bool(jnp.all(jnp.isfinite(logits)))


# -------------------------------------------------------------------- rope_options_from_hf

LLAMA31 = {
    "model_type": "llama",
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
}
LLAMA31_V5 = {
    "model_type": "llama",
    "max_position_embeddings": 131072,
    "rope_parameters": {
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
}


@pytest.mark.parametrize("config", [LLAMA31, LLAMA31_V5], ids=["rope_scaling", "rope_parameters"])
def test_llama31_in_both_formats(config):
    got = rope_options_from_hf(config, head_dim=128)
    assert got == RopeOptions(base=500000.0, scaling="llama3", scale=8.0, original_length=8192)


def test_examples_of_every_rope_type():
    f = rope_options_from_hf
    plain = f({"rope_theta": 1e6, "max_position_embeddings": 32768}, head_dim=128)
    assert plain == RopeOptions(base=1e6)
    assert f({"rope_scaling": None}, head_dim=64) == RopeOptions()
    linear = f({"rope_scaling": {"type": "linear", "factor": 4.0}}, head_dim=64)
    assert (linear.scaling, linear.scale) == ("pi", 4.0)
    dynamic = f(
        {"max_position_embeddings": 2048, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
        head_dim=64,
    )
    assert (dynamic.scaling, dynamic.scale, dynamic.original_length) == ("dynamic_ntk", 2.0, 2048)
    qwen = f(
        {
            "max_position_embeddings": 32768,
            "rope_theta": 1e6,
            "rope_scaling": {
                "type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32768,
            },
        },
        head_dim=128,
    )
    assert (qwen.scaling, qwen.scale, qwen.original_length, qwen.yarn_variant) == (
        "yarn",
        4.0,
        32768,
        "hf",
    )
    deepseek = f(
        {
            "max_position_embeddings": 163840,
            "rope_theta": 10000,
            "rope_scaling": {
                "beta_fast": 32,
                "beta_slow": 1,
                "factor": 40,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 4096,
                "type": "yarn",
            },
        },
        head_dim=64,
    )
    assert (deepseek.yarn_mscale, deepseek.yarn_mscale_all_dim, deepseek.scale) == (1.0, 1.0, 40.0)
    assert _encoding(deepseek, 64).attention_factor == 1.0
    gpt_oss = f(
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 150000,
                "factor": 32.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 4096,
            }
        },
        head_dim=64,
    )
    assert gpt_oss.yarn_truncate is False and gpt_oss.base == 150000.0
    phi3 = f(
        {
            "model_type": "phi3",
            "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096,
            "rope_theta": 10000.0,
            "rope_scaling": {
                "type": "longrope",
                "short_factor": [1.0] * 48,
                "long_factor": [2.0] * 48,
            },
        },
        head_dim=96,
    )
    assert (phi3.scaling, phi3.original_length, phi3.scale) == ("longrope", 4096, 32.0)
    assert phi3.longrope_long_factor == (2.0,) * 48
    su = f(
        {
            "model_type": "phi3",
            "max_position_embeddings": 131072,
            "rope_scaling": {"type": "su", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48},
        },
        head_dim=96,
    )
    assert (su.scaling, su.original_length) == ("longrope", 4096)  # Phi3Config's default


def test_partial_rotary_in_every_spelling():
    f = rope_options_from_hf
    neox = {"model_type": "gpt_neox", "rotary_pct": 0.25, "rotary_emb_base": 10000}
    got = f(neox, head_dim=64)
    assert rotary.rotary_dim_for(64, got.fraction) == 16 and got.base == 10000.0
    assert f({"model_type": "gpt_neox"}, head_dim=64).fraction == 0.25  # HF's default
    phi = f({"partial_rotary_factor": 0.4, "rope_theta": 10000.0}, head_dim=80)
    assert rotary.rotary_dim_for(80, phi.fraction) == 32
    v5 = f({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}, head_dim=64)
    assert rotary.rotary_dim_for(64, v5.fraction) == 32
    # int() truncation, as HF: 0.3 * 100 = 30, 0.33 * 100 = 33 (odd, refused), 0.35 * 64 = 22.4
    trunc = f({"partial_rotary_factor": 0.35}, head_dim=64)
    assert rotary.rotary_dim_for(64, trunc.fraction) == 22
    gptj = f({"rotary_dim": 64}, head_dim=256, layout="interleaved")
    assert rotary.rotary_dim_for(256, gptj.fraction) == 64 and gptj.layout == "interleaved"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"rope_scaling": {"rope_type": "proportional"}}, r"rope_type='proportional': this RoPE"),
        ({"rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]}}, r"rope_type='mrope'"),
        (
            {"rope_scaling": {"type": "default", "mrope_section": [2, 1, 1]}},
            r"rope_parameters\.mrope_section=\[2, 1, 1\]: not supported",
        ),
        (
            {"rope_parameters": {"full_attention": {"rope_type": "default"}}},
            r"per-layer-type entries \['full_attention'\]",
        ),
        (
            {"partial_rotary_factor": 0.33},
            r"int\(head_dim=100 \* partial_rotary_factor=0\.33\) = 33 is odd: transformers then "
            r"rotates 34 dimensions with the frequencies of 33",
        ),
        (
            {"rope_scaling": {"type": "linear", "factor": 0.5}},
            r"factor=0\.5: flaxformer_lite needs",
        ),
        ({"rope_scaling": {"type": "linear"}}, r"rope_type='linear' needs rope_parameters\.factor"),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, r"max_position_embeddings=None"),
        (
            {
                "rope_scaling": {
                    "type": "llama3",
                    "factor": 8.0,
                    "original_max_position_embeddings": 8,
                }
            },
            r"rope_type='llama3' needs rope_parameters\.low_freq_factor",
        ),
        (
            {
                "rope_scaling": {
                    "type": "yarn",
                    "factor": 2.0,
                    "original_max_position_embeddings": 8,
                    "beta_fast": 1,
                    "beta_slow": 4,
                }
            },
            r"beta_slow=4, beta_fast=1: flaxformer_lite needs numbers with 0 <= beta_slow",
        ),
        (
            {
                "max_position_embeddings": 64,
                "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 50},
            },
            r"rope_parameters\.long_factor=None: must be a list of finite numbers",
        ),
        (
            {
                "max_position_embeddings": 64,
                "rope_scaling": {
                    "type": "longrope",
                    "short_factor": [1.0] * 49,
                    "long_factor": [1.0] * 49,
                    "original_max_position_embeddings": 8,
                },
            },
            r"longrope_short_factor=.*needs 50 entries",
        ),
        ({"rope_theta": 1.0}, r"rope_theta=1\.0: must be a finite number > 1"),
    ],
)
def test_refusals_are_one_line(config, message):
    with pytest.raises(ValueError, match=message) as info:
        rope_options_from_hf(config, head_dim=100)
    assert "\n" not in str(info.value)


def test_keys_hf_ignores_are_ignored_with_a_warning():
    config = {
        "rope_scaling": {"type": "linear", "factor": 2.0, "original_max_position_embeddings": 8}
    }
    with pytest.warns(UserWarning, match=r"ignores rope_parameters keys \['original_max_"):
        got = rope_options_from_hf(config, head_dim=64)
    assert got.scaling == "pi"


def test_live_rotation_matches_transformers():
    """q and k rotated by transformers (cos/sin from its rotary module, times the attention
    factor, on the first rotary dims) equal RotaryEncoding.rotate (skipped without torch)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    head_dim, n = 32, 40
    for rope in (
        {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
         "original_max_position_embeddings": 16, "partial_rotary_factor": 0.5},
        {"rope_type": "longrope", "rope_theta": 1e4, "original_max_position_embeddings": 16,
         "short_factor": [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5],
         "long_factor": [2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], "partial_rotary_factor": 0.5},
        {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
    ):  # fmt: skip
        config = {
            "hidden_size": 2 * head_dim,
            "num_attention_heads": 2,
            "head_dim": head_dim,
            "max_position_embeddings": 32,
            "rope_parameters": rope,
        }
        hf_config = transformers.LlamaConfig(**{**config, "rope_parameters": dict(rope)})
        emb = LlamaRotaryEmbedding(hf_config)
        rng = np.random.default_rng(0)
        q = rng.standard_normal((1, n, 2, head_dim)).astype(np.float32)
        k = rng.standard_normal((1, n, 2, head_dim)).astype(np.float32)
        pos = torch.arange(n)[None]
        cos, sin = emb(torch.zeros(1), pos)
        rot = cos.shape[-1]
        tq, tk = (torch.from_numpy(x).transpose(1, 2) for x in (q, k))  # [b, h, l, d]
        hq, hk = apply_rotary_pos_emb(tq[..., :rot], tk[..., :rot], cos, sin)
        want_q = torch.cat([hq, tq[..., rot:]], -1).transpose(1, 2).numpy()
        want_k = torch.cat([hk, tk[..., rot:]], -1).transpose(1, 2).numpy()
        options = rope_options_from_hf(config, head_dim=head_dim)
        got_q, got_k = _encoding(options, head_dim).rotate(
            jnp.asarray(q), jnp.asarray(k), jnp.arange(n)[None], jnp.arange(n)[None]
        )
        np.testing.assert_allclose(np.asarray(got_q), want_q, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(np.asarray(got_k), want_k, rtol=2e-5, atol=2e-5)
