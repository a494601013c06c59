"""Per-layer attention schedules (`ModelConfig.layer_pattern`) and the Gemma 3 options.

The spec is the float64 numpy forward pass below, written from the definitions: each layer
has its own mask (global causal, sliding window ``i - W < j <= i``, or chunk ``j // C ==
i // C``) and its own encoding (RoPE with its base, ALiBi, none), and -- in the "gemma"
architecture -- Gemma's RMSNorm ``x / sqrt(mean(x^2) + eps) * (1 + w)``, query / key norms
over ``head_dim``, sandwich norms, the scale ``query_pre_attn_scalar ** -0.5``, a head width
other than ``d_model / num_heads``, grouped-query attention and GeGLU. The model must equal
it; the chunked implementation, jit, and token-by-token cached decoding must equal the model.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.nn import param_count, schedules
from flaxformer_lite.nn.encodings import registry
from flaxformer_lite.nn.encodings.base import ModelDims, PositionalEncoding
from flaxformer_lite.nn.encodings.registry import EncodingSpec
from flaxformer_lite.nn.generate import generate
from flaxformer_lite.nn.model_config import ModelConfig, encoding_row_name, rope_scaling_variant
from flaxformer_lite.nn.models import DecoderOnlyLM, EncoderDecoder
from flaxformer_lite.nn.schedules import LayerKind

V, D, H = 32, 16, 2
L = 11  # longer than every window and chunk below

# Every combination the engine distinguishes: window + RoPE with its own base, chunk + the
# model's RoPE, global NoPE, window + ALiBi; 6 layers cycle the 4 kinds (layers 4, 5 = 0, 1).
PATTERN = (
    LayerKind(window=3, positional="rope", positional_options={"base": 100.0}),
    LayerKind(chunk=4),
    LayerKind(positional="none"),
    LayerKind(window=5, positional="alibi"),
)
ARCHS = {
    "standard": dict(norm="pre"),
    "gemma": dict(
        norm="pre",
        norm_type="gemma_rms",
        qk_norm=True,
        sandwich_norm=True,
        query_pre_attn_scalar=7.0,
        head_size=12,
        num_kv_heads=1,
        ffn_gated=True,
        activation="gelu",
        use_bias=False,
    ),
}


def cfg_of(arch="standard", pattern=PATTERN, **kw) -> ModelConfig:
    fields = dict(
        vocab_size=V,
        d_model=D,
        num_heads=H,
        d_ff=32,
        num_encoder_layers=0,
        num_decoder_layers=6,
        dropout_rate=0.0,
        positional="rope",
        layer_pattern=pattern,
    )
    return ModelConfig(**(fields | ARCHS[arch] | kw))


def randomized(model, seed=0, scale=0.3):
    """``model`` with noise on every parameter (Gemma's norm scales start at 0)."""
    state = nnx.state(model, nnx.Param)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noisy = [
        x + scale * jax.random.normal(k, x.shape, x.dtype)
        for x, k in zip(leaves, keys, strict=True)
    ]
    nnx.update(model, jax.tree.unflatten(tree, noisy))
    return model


def _tokens(seed, length=L, batch=2):
    return jnp.asarray(np.random.default_rng(seed).integers(0, V, (batch, length)), jnp.int32)


# ----------------------------------------------------------------------- numpy reference


def _np(v):
    return np.asarray(v[...], np.float64)


def np_dense(lin, x):
    y = x @ _np(lin.kernel)
    return y if lin.bias is None else y + _np(lin.bias)


def np_norm(mod, x, cfg):
    eps = cfg.norm_epsilon
    if cfg.norm_type == "layer":
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * _np(mod.scale) + _np(mod.bias)
    normed = x / np.sqrt((x**2).mean(-1, keepdims=True) + eps)
    if cfg.norm_type == "rms":
        return normed * _np(mod.scale)
    return normed * (1.0 + _np(mod.scale))  # gemma_rms


def np_rope(x, positions, base):
    """Rotate pairs (i, i + d/2) of x [b, l, h, d] by position * base^(-2i/d)."""
    d = x.shape[-1]
    theta = base ** (-2.0 * np.arange(d // 2) / d)
    a = positions[:, :, None, None].astype(np.float64) * theta
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([x1 * np.cos(a) - x2 * np.sin(a), x2 * np.cos(a) + x1 * np.sin(a)], -1)


def np_visible(length, window, chunk):
    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    mask = j <= i
    if window is not None:
        mask &= j > i - window
    if chunk is not None:
        mask &= j // chunk == i // chunk
    return mask


def np_attention(att, x, layer, cfg, positions):
    b, n, _ = x.shape
    hd, kv = cfg.head_dim, cfg.kv_heads
    q = np_dense(att.query, x).reshape(b, n, H, hd)
    k = np_dense(att.key, x).reshape(b, n, kv, hd)
    v = np_dense(att.value, x).reshape(b, n, kv, hd)
    if cfg.qk_norm:
        q, k = np_norm(att.q_norm, q, cfg), np_norm(att.k_norm, k, cfg)
    if layer.positional == "rope":
        base = layer.positional_options.base
        q, k = np_rope(q, positions, base), np_rope(k, positions, base)
    k, v = np.repeat(k, H // kv, axis=2), np.repeat(v, H // kv, axis=2)
    scale = (cfg.query_pre_attn_scalar or hd) ** -0.5
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if layer.positional == "alibi":
        slopes = 2.0 ** (-8.0 / H * np.arange(1, H + 1))
        rel = (positions[:, :, None] - positions[:, None, :]).astype(np.float64)
        logits = logits - slopes[None, :, None, None] * rel[:, None]
    mask = np_visible(n, layer.window, layer.chunk)
    logits = np.where(mask, logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
    return np_dense(att.out, np.einsum("bhqk,bkhd->bqhd", w, v).reshape(b, n, H * hd))


def np_ffn(ffn, x, cfg):
    h = np_dense(ffn.wi, x)
    if cfg.activation == "relu":
        h = np.maximum(h, 0.0)
    else:  # the tanh GELU
        h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
    if ffn.wu is not None:
        h = h * np_dense(ffn.wu, x)
    return np_dense(ffn.wo, h)


def np_sublayer(add_norm, x, f, cfg):
    y = f(np_norm(add_norm.norm, x, cfg))
    if cfg.sandwich_norm:
        y = np_norm(add_norm.post_norm, y, cfg)
    return x + y


def np_lm(model, tokens):
    cfg, dec = model.cfg, model.decoder
    tokens = np.asarray(tokens)
    positions = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
    table = _np(dec.embed.embed.embedding)
    x = table[tokens] * np.sqrt(D)
    for blk, layer in zip(dec.blocks, cfg.layer_kinds(), strict=True):
        attend = lambda h, a=blk.self_attention, lay=layer: np_attention(a, h, lay, cfg, positions)
        x = np_sublayer(blk.self_attention_norm, x, attend, cfg)
        x = np_sublayer(blk.ffn_norm, x, lambda h, f=blk.ffn: np_ffn(f, h, cfg), cfg)
    return np_norm(dec.final_norm, x, cfg) @ table.T


# ----------------------------------------------------------------------------- the model


@pytest.mark.parametrize("arch", list(ARCHS))
def test_patterned_model_matches_numpy_reference(arch):
    model = randomized(DecoderOnlyLM(cfg_of(arch), rngs=nnx.Rngs(0)))
    tokens = _tokens(1)
    logits = np.asarray(model(tokens))
    ref = np_lm(model, tokens)
    np.testing.assert_allclose(logits, ref, rtol=2e-4, atol=2e-4)
    # each layer's schedule matters: the model-wide schedule gives other logits
    plain = DecoderOnlyLM(cfg_of(arch, pattern=()), rngs=nnx.Rngs(0))
    nnx.update(plain, nnx.state(model, nnx.Param))
    assert np.abs(np.asarray(plain(tokens)) - logits).max() > 1e-2


@pytest.mark.parametrize("arch", list(ARCHS))
def test_chunked_implementation_and_jit_equal_the_plain_pass(arch):
    model = randomized(DecoderOnlyLM(cfg_of(arch), rngs=nnx.Rngs(0)))
    tokens = _tokens(2)
    eager = np.asarray(model(tokens))
    graphdef, state = nnx.split(model)
    jitted = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))(state, tokens)
    np.testing.assert_allclose(np.asarray(jitted), eager, rtol=1e-5, atol=1e-5)
    chunked_cfg = model.cfg.replace(attention_impl="chunked")
    chunked = DecoderOnlyLM(chunked_cfg, rngs=nnx.Rngs(0))
    nnx.update(chunked, nnx.state(model, nnx.Param))
    np.testing.assert_allclose(np.asarray(chunked(tokens)), eager, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("prefill", [1, 8])
def test_cached_decoding_equals_the_full_pass_token_by_token(arch, prefill):
    """A prefill shorter or longer than every window and chunk, then one token per step;
    windowed and chunked layers keep ring buffers of W or C slots."""
    model = randomized(DecoderOnlyLM(cfg_of(arch), rngs=nnx.Rngs(0)))
    tokens = _tokens(3)
    full = np.asarray(model(tokens))
    graphdef, state = nnx.split(model)

    @jax.jit
    def step(state, tok, pos, cache):
        return nnx.merge(graphdef, state).decode_step(tok, pos, cache)

    cache = model.init_cache(2, L)
    slots = [c.key.shape[1] for c in cache.self_attention]
    assert slots == [3, 4, L, 5, 3, 4]  # window 3, chunk 4, global, window 5, ...
    assert model.cfg.kv_cache_slots(L) == sum(slots)
    logits, cache = step(state, tokens[:, :prefill], jnp.arange(prefill), cache)
    out = [np.asarray(logits)]
    for t in range(prefill, L):
        logits, cache = step(state, tokens[:, t : t + 1], jnp.arange(t, t + 1), cache)
        out.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(out, axis=1), full, rtol=1e-4, atol=1e-4)


def test_generate_sizes_ring_caches_and_is_the_argmax_of_the_full_pass():
    model = randomized(DecoderOnlyLM(cfg_of("gemma"), rngs=nnx.Rngs(0)), seed=4, scale=1.0)
    prompt = _tokens(5, length=4)
    out = generate(model, prompt, max_new_tokens=9)
    fed = jnp.concatenate([prompt, out[:, :-1]], axis=1)
    logits = np.asarray(model(fed))[:, 3:]
    np.testing.assert_array_equal(np.argmax(logits, -1), np.asarray(out))


def test_unpatterned_models_keep_their_parameter_paths_and_numbers():
    """No pattern: one encoding per stack at decoder.pe, as before; a pattern whose kinds
    resolve to the model's encoding changes nothing."""
    cfg = cfg_of(pattern=(), positional="t5")
    model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
    paths = {".".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    outside = {p for p in paths if not p.startswith("decoder.blocks.")}
    assert outside == {
        "decoder.embed.embed.embedding",
        "decoder.pe.table",  # T5's bucket table, shared by the stack's blocks
        "decoder.final_norm.scale",
        "decoder.final_norm.bias",
    }
    assert not any(".pe." in p for p in paths - outside)
    same = DecoderOnlyLM(cfg.replace(layer_pattern=(LayerKind(),) * 3), rngs=nnx.Rngs(0))
    tokens = _tokens(6)
    np.testing.assert_array_equal(np.asarray(same(tokens)), np.asarray(model(tokens)))


def test_each_distinct_encoding_is_built_once_and_shared():
    """T5 tables: the model-wide one at decoder.pe, another options' at decoder.layer_pe.0,
    each shared by every layer that uses it (one gradient sums over those layers)."""
    pattern = (
        LayerKind(window=3),
        LayerKind(positional="t5", positional_options={"num_buckets": 8}),
        LayerKind(),
        LayerKind(positional="t5", positional_options={"num_buckets": 8}),
    )
    cfg = cfg_of(pattern=pattern, positional="t5")
    model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
    flat = {".".join(map(str, p)): v for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    encodings = sorted(p for p in flat if p.startswith("decoder.pe") or "layer_pe" in p)
    assert [p.split(".")[1] for p in encodings] == ["layer_pe", "pe"]
    assert model.decoder.layer_pe_index == (0, 1, 0, 1, 0, 1)
    assert model.decoder.layer_encoding(3) is model.decoder.layer_pe[0]
    assert model.decoder.layer_encoding(2) is model.decoder.pe


def test_a_per_layer_encoding_is_built_per_block(monkeypatch):
    """An `EncodingSpec.per_layer` encoding: one module (and parameters) per layer using it."""

    class Gate(PositionalEncoding):
        hook = "bias"

        def __init__(self, dims, options, *, rngs):
            self.w = nnx.Param(jax.random.normal(rngs.params(), (dims.num_heads,)))

        def bias(self, q_positions, k_positions, *, causal):
            rel = (q_positions[:, :, None] - k_positions[:, None, :]).astype(jnp.float32)
            return -jnp.abs(self.w[...])[None, :, None, None] * rel[:, None]

    spec = EncodingSpec("gate_test", "bias", Gate, per_layer=True)
    monkeypatch.setitem(registry._REGISTRY, spec.name, spec)
    pattern = (LayerKind(positional="gate_test"), LayerKind(window=3))
    model = DecoderOnlyLM(cfg_of(pattern=pattern, num_decoder_layers=4), rngs=nnx.Rngs(0))
    flat = {".".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    assert {p for p in flat if p.endswith(".pe.w")} == {
        "decoder.blocks.0.pe.w",
        "decoder.blocks.2.pe.w",
    }
    assert model.decoder.layer_pe_index == (None, 0, None, 0)
    traced = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert param_count.count_parameters(model.cfg) == traced
    everywhere = model.cfg.replace(positional="gate_test", layer_pattern=(LayerKind(window=3),))
    other = DecoderOnlyLM(everywhere, rngs=nnx.Rngs(0))
    traced = sum(x.size for x in jax.tree.leaves(nnx.state(other, nnx.Param)))
    assert param_count.count_parameters(everywhere) == traced  # no stack-wide instance
    tokens = _tokens(7)
    before = np.asarray(model(tokens))
    model.decoder.blocks[2].pe.w[...] = model.decoder.blocks[2].pe.w[...] * 5
    assert np.abs(np.asarray(model(tokens)) - before).max() > 1e-4  # block 2 reads its own
    with pytest.raises(ValueError, match="per_layer=True with hook 'add'"):
        registry.register(EncodingSpec("add_test", "add", Gate, per_layer=True))


def test_an_encoder_refuses_a_pattern():
    cfg = cfg_of(num_encoder_layers=1, pattern=(LayerKind(window=2),), positional="alibi")
    with pytest.raises(ValueError, match="layer_pattern: per-layer schedules apply to causal"):
        EncoderDecoder(cfg, rngs=nnx.Rngs(0))


# ---------------------------------------------------------------------------- resolution


def test_layer_kinds_cycle_the_pattern_and_inherit_the_model():
    cfg = cfg_of(
        pattern=(
            LayerKind(),
            LayerKind(window=4),
            LayerKind(chunk=8, positional_options={"base": 500.0}),
            LayerKind(positional="rope"),
            LayerKind(positional="none", window=2),
        ),
        num_decoder_layers=7,
        attention_window=16,
        positional_options={"base": 20.0},
    )
    kinds = cfg.layer_kinds()
    assert len(kinds) == 7
    assert [(k.window, k.chunk, k.positional) for k in kinds] == [
        (16, None, "rope"),  # everything inherited
        (4, None, "rope"),  # own window
        (None, 8, "rope"),  # a chunk replaces the model's window
        (16, None, "rope"),
        (2, None, "none"),
        (16, None, "rope"),  # cycled: layer 5 is kind 0
        (4, None, "rope"),
    ]
    bases = [k.positional_options.base for k in kinds if k.positional == "rope"]
    # the model's options, the model's, options given for the model's encoding, the named
    # encoding's defaults (not the model's), ...
    assert bases == [20.0, 20.0, 500.0, 10000.0, 20.0, 20.0]
    unpatterned = cfg.replace(layer_pattern=()).layer_kinds()
    assert {(k.window, k.chunk, k.positional_options.base) for k in unpatterned} == {
        (16, None, 20.0)
    }
    assert cfg.replace(num_decoder_layers=0).layer_kinds() == ()


@pytest.mark.parametrize(
    "pattern,message",
    [
        (
            (LayerKind(), LayerKind(), LayerKind(window=0)),
            r"layer_pattern\[2\]\.window=0: must be a positive int",
        ),
        ((LayerKind(chunk=-1),), r"layer_pattern\[0\]\.chunk=-1: must be a positive int"),
        (
            (LayerKind(window=2, chunk=3),),
            r"layer_pattern\[0\]\.chunk=3: give a window \(=2\) or a chunk, not both",
        ),
        ((LayerKind(positional="rotary"),), r"layer_pattern\[0\]\.positional='rotary': allowed"),
        (
            (LayerKind(), LayerKind(positional="sinusoidal")),
            r"layer_pattern\[1\]\.positional='sinusoidal': an encoding with hook 'add'",
        ),
        (
            (LayerKind(positional_options={"base": 1.0}),),
            r"layer_pattern\[0\]\.positional_options\.base=1\.0: must be a number > 1",
        ),
        (
            (LayerKind(positional="alibi", positional_options={"base": 5.0}),),
            r"layer_pattern\[0\]\.positional_options has no option\(s\) \['base'\]",
        ),
        (({"window": 2, "span": 3},), r"layer_pattern\[0\] has no field\(s\) \['span'\]"),
        ((3,), r"layer_pattern\[0\]=3: must be a LayerKind or a mapping"),
        ("gemma3", r"layer_pattern='gemma3': must be a tuple of LayerKind"),
    ],
)
def test_pattern_errors_name_the_field(pattern, message):
    with pytest.raises(ConfigError, match=rf"^ModelConfig\.{message}"):
        cfg_of(pattern=pattern)


def test_an_add_encoding_refuses_kinds_that_name_another_encoding():
    """Sinusoidal positions reach every layer through the embeddings: a kind naming RoPE
    would add a second encoding silently; windows alone are fine."""
    with pytest.raises(
        ConfigError,
        match=r"layer_pattern\[0\]\.positional='rope': ModelConfig\.positional='sinusoidal' adds",
    ):
        cfg_of(pattern=schedules.gemma3(window=4), positional="sinusoidal")
    cfg = cfg_of(pattern=schedules.gpt_oss(window=4), positional="sinusoidal")
    assert [k.window for k in cfg.layer_kinds()] == [4, None] * 3


def test_config_round_trips_through_dicts_json_and_config_dicts():
    import ml_collections

    cfg = cfg_of(
        "gemma", pattern=schedules.gemma3(window=4, global_options={"scaling": "pi", "scale": 2.0})
    )
    assert isinstance(
        cfg.layer_pattern[0].positional_options, registry.get_positional_encoding("rope").options
    )
    again = ModelConfig.from_mapping(cfg.to_dict())
    assert again == cfg and hash(again) == hash(cfg)
    assert ModelConfig.from_mapping(json.loads(json.dumps(cfg.to_dict()))) == cfg
    study = ml_collections.ConfigDict({"model": cfg_of(pattern=()).to_dict()})
    study.model.layer_pattern = schedules.gemma3(
        window=4, global_options={"scaling": "pi", "scale": 2.0}
    )
    fields = {k: v for k, v in study.model.to_dict().items()}
    assert ModelConfig.from_mapping(fields | ARCHS["gemma"]) == cfg


def test_named_patterns_follow_their_sources():
    """Each named pattern, cycled over 12 layers, gives the layer types of its reference
    config rule (transformers' configuration files)."""
    n = 12
    gemma = schedules.cycle(schedules.gemma3(window=512), n)
    assert [k.window is None for k in gemma] == [(i + 1) % 6 == 0 for i in range(n)]
    assert {k.positional_options["base"] for k in gemma if k.window} == {1e4}
    assert {k.positional_options["base"] for k in gemma if not k.window} == {1e6}
    cohere = schedules.cycle(schedules.cohere2(window=4096), n)
    assert [k.window is None for k in cohere] == [(i + 1) % 4 == 0 for i in range(n)]
    assert [k.positional == "none" for k in cohere] == [(i + 1) % 4 == 0 for i in range(n)]
    llama4 = schedules.cycle(schedules.llama4_irope(chunk=8192), n)
    no_rope_layers = [int((i + 1) % 4 != 0) for i in range(n)]  # Llama4TextConfig's default
    assert [int(k.positional is None) for k in llama4] == no_rope_layers
    assert [k.chunk == 8192 for k in llama4] == [bool(r) for r in no_rope_layers]
    oss = schedules.cycle(schedules.gpt_oss(), n)
    assert [k.window == 128 for k in oss] == [bool((i + 1) % 2) for i in range(n)]
    swan = schedules.cycle(schedules.swan(window=512), n)
    assert [k.positional == "none" for k in swan] == [(i + 1) % 4 == 0 for i in range(n)]
    assert set(schedules.PATTERNS) == {"gemma3", "cohere2", "llama4_irope", "gpt_oss", "swan"}
    with pytest.raises(ValueError, match="window=0: must be a positive int"):
        schedules.gemma3(window=0)


# ------------------------------------------------------------------- evaluation variants


def test_rope_scaling_applies_to_the_global_layers_only():
    cfg = cfg_of(
        pattern=schedules.gemma3(
            window=4, local_per_global=2, global_options={"original_length": 8}
        )
    )
    assert cfg.encoding_label() == "gemma3" and encoding_row_name(cfg) == "gemma3"
    assert cfg.evaluation_variants(("pi", "yarn")) == ("pi", "yarn")
    scaled = cfg.with_rope_scaling("yarn", 32)
    assert scaled.layer_pattern[:2] == cfg.layer_pattern[:2]  # sliding layers unchanged
    options = scaled.layer_pattern[2].positional_options
    assert (options.scaling, options.scale, options.base) == ("yarn", 4.0, 1e6)
    assert scaled.encoding_label() == "gemma3+yarn"
    assert scaled.encoding_label(name="gemma-3-270m") == "gemma-3-270m+yarn"
    assert rope_scaling_variant(scaled, 64) == cfg.with_rope_scaling("yarn", 64)
    assert scaled.encoding_settings()["layer_pattern"][2]["positional_options"]["scaling"] == "yarn"
    # the trained state is reused under the scaled config (RoPE has no parameters)
    model = randomized(DecoderOnlyLM(cfg, rngs=nnx.Rngs(0)))
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: DecoderOnlyLM(scaled, rngs=nnx.Rngs(0))))
    rebuilt = nnx.merge(graphdef, nnx.state(model))
    tokens = _tokens(8, length=16)
    assert np.abs(np.asarray(rebuilt(tokens)) - np.asarray(model(tokens))).max() > 1e-3


def test_rope_scaling_of_a_pattern_that_inherits_the_model_encoding():
    """gpt-oss windows over a RoPE model: the full layers are scaled (and name RoPE from then
    on), the sliding ones keep inheriting; the label names both."""
    cfg = cfg_of(pattern=schedules.gpt_oss(window=4), positional_options={"original_length": 8})
    assert cfg.encoding_label() == "rope+gpt_oss"
    scaled = cfg.with_rope_scaling("pi", 16)
    assert scaled.layer_pattern[0] == cfg.layer_pattern[0]
    assert scaled.layer_pattern[1].positional == "rope"
    assert scaled.layer_pattern[1].positional_options.scale == 2.0
    assert scaled.encoding_label() == "rope+gpt_oss+pi"
    assert [k.positional_options.scaling for k in scaled.layer_kinds()] == ["none", "pi"] * 3


def test_a_pattern_without_a_global_rope_layer_takes_no_scaling():
    cfg = cfg_of(pattern=schedules.cohere2(window=4), positional_options={"original_length": 8})
    assert cfg.evaluation_variants(("yarn",)) == ()  # its global layers are NoPE
    with pytest.raises(ValueError, match="no global layer whose encoding takes a RoPE scaling"):
        cfg.with_rope_scaling("yarn", 32)
    assert cfg.encoding_label() == "rope+cohere2"
    assert cfg.replace(positional="alibi").evaluation_variants(("yarn",)) == ()


def test_scaling_without_an_original_length_names_the_kind():
    cfg = cfg_of(pattern=schedules.gemma3(window=4))
    with pytest.raises(
        ConfigError, match=r"layer_pattern\[5\]\.positional_options\.original_length=None"
    ):
        cfg.with_rope_scaling("yarn", 32)


def test_unnamed_patterns_are_labelled_by_their_kinds():
    assert schedules.pattern_name(PATTERN) == "[rope/w3,c4,none,alibi/w5]"
    assert cfg_of().encoding_label() == "rope+[rope/w3,c4,none,alibi/w5]"
    assert schedules.pattern_name((LayerKind(name="a.x"), LayerKind())) == "[a.x,global]"
    assert dataclasses.asdict(schedules.gemma3(window=2)[0])["name"] == "gemma3.local"


def test_model_dims_follow_head_size():
    cfg = cfg_of("gemma")
    assert cfg.head_dim == 12 and cfg.dims == ModelDims(D, H, 12, cfg.params_dtype)
    assert cfg_of().head_dim == D // H
    with pytest.raises(ConfigError, match=r"head_size=0: must be a positive int"):
        cfg_of(head_size=0)
    with pytest.raises(
        ConfigError,
        match=r"num_heads=3: d_model=16 must be divisible by num_heads \(or set head_size\)",
    ):
        cfg_of(num_heads=3)
    assert cfg_of(num_heads=3, head_size=4, pattern=()).head_dim == 4
    with pytest.raises(ConfigError, match=r"sandwich_norm=True: norms around each sub-layer"):
        cfg_of(sandwich_norm=True, norm="post")
    with pytest.raises(ConfigError, match=r"query_pre_attn_scalar=0: must be a finite number > 0"):
        cfg_of(query_pre_attn_scalar=0)
