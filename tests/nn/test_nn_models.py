"""Tests of the NNX layers and models: numpy references, jit vs eager, dtypes, causality,
padding, permutation symmetry, relative-position invariance, parameter counts.

The numpy reference below re-implements the forward pass of the paper (Vaswani et al. 2017:
embeddings * sqrt(d_model) + positions, blocks of attention and feed-forward with Add & Norm,
tied output projection) in float64 from the modules' parameters; the positional encodings in
it are written from their closed forms, independently of `flaxformer_lite.core`.
"""

from __future__ import annotations

from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tiny_models import tiny_model_config

from flaxformer_lite.core import chunked_attention
from flaxformer_lite.nn.encodings import get_positional_encoding, positional_encoding_names
from flaxformer_lite.nn.layers import EncoderBlock, MultiHeadAttention, TokenEmbedding
from flaxformer_lite.nn.model_config import ModelConfig
from flaxformer_lite.nn.models import Decoder, DecoderOnlyLM, Encoder, EncoderDecoder

NAMES = positional_encoding_names()
CORE = ("none", "sinusoidal", "learned", "rope", "alibi")
V, D, H, F = 32, 16, 2, 32
B, S, T = 2, 8, 6  # batch, source length, target length


def small_cfg(name="none", **kw):
    """`tiny_model_config` with this module's shapes and a 16-row learned table."""
    shapes = dict(vocab_size=V, d_model=D, num_heads=H, d_ff=F)
    return tiny_model_config(name, options={"learned": {"max_length": 16}}, **(shapes | kw))


def _tokens(seed, length, batch=B):
    return np.random.default_rng(seed).integers(0, V, (batch, length)).astype(np.int32)


def _positions(length, offsets=(0, 3)):
    return (np.arange(length)[None, :] + np.asarray(offsets)[:, None]).astype(np.int32)


# ----------------------------------------------------------------------- numpy reference


def _np(v):
    return np.asarray(v[...], np.float64)


def np_dense(lin, x):
    y = x @ _np(lin.kernel)
    return y if lin.bias is None else y + _np(lin.bias)


def np_layer_norm(ln, x, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * _np(ln.scale) + _np(ln.bias)


def np_softmax_masked(logits, mask):
    logits = np.where(mask, logits, -np.inf)
    live = mask.any(-1, keepdims=True)
    m = np.where(live, logits.max(-1, keepdims=True), 0.0)
    e = np.exp(logits - m)
    return np.where(live, e / np.where(live, e.sum(-1, keepdims=True), 1.0), 0.0)


def np_rope_half(x, positions, base=10000.0):
    """Rotate pairs (i, i + d/2) of x [b, l, h, d] by positions * base^(-2i/d)."""
    d = x.shape[-1]
    theta = base ** (-2.0 * np.arange(d // 2) / d)
    a = positions[:, :, None, None].astype(np.float64) * theta
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([x1 * np.cos(a) - x2 * np.sin(a), x2 * np.cos(a) + x1 * np.sin(a)], -1)


def np_mha(att, x, kv, mask, *, qpos=None, kpos=None, name="none", causal=False):
    b, lq, _ = x.shape
    q = np_dense(att.query, x).reshape(b, lq, H, D // H)
    k = np_dense(att.key, kv).reshape(b, kv.shape[1], H, D // H)
    v = np_dense(att.value, kv).reshape(b, kv.shape[1], H, D // H)
    if name == "rope":
        q, k = np_rope_half(q, qpos), np_rope_half(k, kpos)
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D // H)
    if name == "alibi":
        slopes = 2.0 ** (-8.0 / H * np.arange(1, H + 1))  # power of two heads: geometric
        rel = (qpos[:, :, None] - kpos[:, None, :]).astype(np.float64)
        rel = rel if causal else np.abs(rel)
        logits = logits - slopes[None, :, None, None] * rel[:, None]
    w = np_softmax_masked(logits, np.broadcast_to(mask, logits.shape))
    out = np.einsum("bhqk,bkhd->bqhd", w, v).reshape(b, lq, D)
    return np_dense(att.out, out)


def np_add_norm(an, x, f, norm):
    if norm == "pre":
        return x + f(np_layer_norm(an.norm, x))
    return np_layer_norm(an.norm, x + f(x))


def np_ffn(ffn, x, activation):
    h = np_dense(ffn.wi, x)
    if activation == "relu":
        h = np.maximum(h, 0.0)
    else:  # jax.nn.gelu's default tanh approximation
        h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
    return np_dense(ffn.wo, h)


def np_stack(stack, tokens, positions, valid, *, causal, encoded=None, enc_valid=None):
    cfg = stack.cfg
    name = cfg.positional
    x = _np(stack.embed.embed.embedding)[tokens] * np.sqrt(D)
    if name == "sinusoidal":
        j = np.arange(D)
        angle = positions[..., None] / 10000.0 ** (2 * (j // 2) / D)
        x = x + np.where(j % 2 == 0, np.sin(angle), np.cos(angle))
    elif name == "learned":
        x = x + _np(stack.pe.table)[positions]
    length = tokens.shape[1]
    mask = valid[:, None, :, None] & valid[:, None, None, :]
    if causal:
        mask = mask & np.tril(np.ones((length, length), bool))
    kw = dict(qpos=positions, kpos=positions, name=name, causal=causal)
    for blk in stack.blocks:
        if causal:
            attn, attn_norm = blk.self_attention, blk.self_attention_norm
        else:
            attn, attn_norm = blk.attention, blk.attention_norm
        x = np_add_norm(attn_norm, x, lambda h, a=attn: np_mha(a, h, h, mask, **kw), cfg.norm)
        if encoded is not None:
            cmask = valid[:, None, :, None] & enc_valid[:, None, None, :]
            x = np_add_norm(
                blk.cross_attention_norm,
                x,
                lambda h, a=blk.cross_attention, m=cmask: np_mha(a, h, encoded, m),
                cfg.norm,
            )
        x = np_add_norm(
            blk.ffn_norm, x, lambda h, f=blk.ffn: np_ffn(f, h, cfg.activation), cfg.norm
        )
    return np_layer_norm(stack.final_norm, x) if cfg.norm == "pre" else x


def np_decode(embed, x):
    if embed.head is None:
        return x @ _np(embed.embed.embedding).T
    return np_dense(embed.head, x)


VALID_T = np.array([[1] * T, [0, 0] + [1] * (T - 2)], bool)  # row 1 left-padded
VALID_S = np.array([[1] * S, [1] * (S - 3) + [0] * 3], bool)  # row 1 right-padded


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("name", CORE)
def test_decoder_only_lm_matches_numpy_reference(name, norm):
    # pre-LN runs use an untied head, GELU and no projection biases: more code paths covered.
    pre = norm == "pre"
    cfg = small_cfg(
        name,
        norm=norm,
        num_decoder_layers=2,
        tie_embeddings=not pre,
        activation="gelu" if pre else "relu",
        use_bias=not pre,
    )
    model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(1))
    tokens, pos = _tokens(0, T), _positions(T)
    logits = model(jnp.asarray(tokens), pos, valid=VALID_T)
    assert logits.shape == (B, T, V) and logits.dtype == jnp.float32
    ref = np_decode(model.decoder.embed, np_stack(model.decoder, tokens, pos, VALID_T, causal=True))
    np.testing.assert_allclose(np.asarray(logits)[VALID_T], ref[VALID_T], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("name", CORE)
def test_encoder_decoder_matches_numpy_reference(name, norm):
    cfg = small_cfg(name, norm=norm)
    model = EncoderDecoder(cfg, rngs=nnx.Rngs(2))
    assert model.encoder.embed is model.decoder.embed  # one shared token embedding
    src, tgt = _tokens(1, S), _tokens(2, T)
    sp, tp = _positions(S, (0, 2)), _positions(T)
    logits = model(
        jnp.asarray(src), jnp.asarray(tgt), src_positions=sp, tgt_positions=tp, src_valid=VALID_S
    )
    enc = np_stack(model.encoder, src, sp, VALID_S, causal=False)
    ones = np.ones((B, T), bool)
    dec = np_stack(model.decoder, tgt, tp, ones, causal=True, encoded=enc, enc_valid=VALID_S)
    ref = np_decode(model.decoder.embed, dec)
    np.testing.assert_allclose(logits, ref, rtol=1e-4, atol=1e-4)


def test_multihead_cross_attention_matches_numpy():
    cfg = small_cfg()
    att = MultiHeadAttention(cfg, rngs=nnx.Rngs(3))
    rng = np.random.default_rng(3)
    x, kv = rng.standard_normal((B, T, D)), rng.standard_normal((B, S, D))
    mask = rng.random((B, 1, T, S)) > 0.3
    out = att(
        jnp.asarray(x, jnp.float32),
        jnp.asarray(kv, jnp.float32),
        q_positions=_positions(T),
        kv_positions=_positions(S),
        mask=mask,
    )
    np.testing.assert_allclose(out, np_mha(att, x, kv, mask), rtol=1e-4, atol=1e-5)
    w = att.weights(
        jnp.asarray(x, jnp.float32),
        jnp.asarray(kv, jnp.float32),
        q_positions=_positions(T),
        kv_positions=_positions(S),
        mask=mask,
    )
    assert w.shape == (B, H, T, S)
    live = mask.any(-1)
    np.testing.assert_allclose(
        np.asarray(w).sum(-1)[np.broadcast_to(live, (B, H, T))], 1.0, atol=1e-5
    )


# --------------------------------------------------- every model x every encoding, jitted


def _run_encoder(m, x):
    return m(x["tgt"], x["tgt_pos"], valid=x["tgt_valid"])


def _run_decoder(m, x):
    return m(
        x["tgt"],
        x["tgt_pos"],
        valid=x["tgt_valid"],
        encoded=x["encoded"],
        encoded_positions=x["src_pos"],
        encoded_valid=x["src_valid"],
    )


def _run_encoder_decoder(m, x):
    return m(
        x["src"],
        x["tgt"],
        src_positions=x["src_pos"],
        tgt_positions=x["tgt_pos"],
        src_valid=x["src_valid"],
        tgt_valid=x["tgt_valid"],
    )


def _run_lm(m, x):
    return m(x["tgt"], x["tgt_pos"], valid=x["tgt_valid"])


KINDS = {
    "Encoder": (lambda c, r: Encoder(c, rngs=r), _run_encoder, True),
    "Decoder": (lambda c, r: Decoder(c, cross_attention=True, rngs=r), _run_decoder, False),
    "EncoderDecoder": (lambda c, r: EncoderDecoder(c, rngs=r), _run_encoder_decoder, True),
    "DecoderOnlyLM": (lambda c, r: DecoderOnlyLM(c, rngs=r), _run_lm, False),
}
JITTED = {kind: nnx.jit(run) for kind, (_, run, _) in KINDS.items()}


def _inputs():
    rng = np.random.default_rng(4)
    return {
        "src": jnp.asarray(_tokens(5, S)),
        "tgt": jnp.asarray(_tokens(6, T)),
        "src_pos": jnp.asarray(_positions(S, (0, 2))),
        "tgt_pos": jnp.asarray(_positions(T)),
        "src_valid": jnp.asarray(VALID_S),
        "tgt_valid": jnp.asarray(VALID_T),
        "encoded": jnp.asarray(rng.standard_normal((B, S, D)), jnp.float32),
    }


# Each (encoding, model) pair runs one (norm, dtype) combination, rotated so that every
# encoding meets all four combinations across the models and every model meets all four
# across consecutive encodings: full coverage with one jit compile per pair.
COMBOS = [("post", "float32"), ("pre", "bfloat16"), ("pre", "float32"), ("post", "bfloat16")]
MATRIX = [
    pytest.param(
        name, kind, *COMBOS[(i + j) % 4], id=f"{name}-{kind}-{'-'.join(COMBOS[(i + j) % 4])}"
    )
    for i, name in enumerate(NAMES)
    for j, kind in enumerate(KINDS)
]


@pytest.mark.parametrize("name,kind,norm,dtype", MATRIX)
def test_every_model_and_encoding_runs_jitted_and_matches_eager(name, kind, norm, dtype):
    build, run, bidirectional = KINDS[kind]
    if bidirectional and get_positional_encoding(name).causal_only:
        pytest.skip(f"{name} is causal-only; {kind} contains a bidirectional Encoder")
    cfg = small_cfg(name, norm=norm, dtype=dtype)
    model = build(cfg, nnx.Rngs(5))
    x = _inputs()
    eager = run(model, x)
    jitted = JITTED[kind](model, x)
    width = D if kind in ("Encoder", "Decoder") else V
    assert eager.shape == jitted.shape == (B, T, width)
    assert np.all(np.isfinite(np.asarray(jitted, np.float32)))
    if width == V:
        assert eager.dtype == jitted.dtype == jnp.float32  # logits are float32 in any dtype
    for leaf in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)):
        assert leaf.dtype == jnp.float32  # params stay float32
    if dtype == "float32":
        np.testing.assert_allclose(jitted, eager, rtol=1e-5, atol=1e-5)
        return
    # bfloat16: jit may fuse and round differently; compare to the float32 model loosely.
    e, j = np.asarray(eager, np.float32), np.asarray(jitted, np.float32)
    # (Measured: |jit - eager| <= 0.03, |bf16 - f32| <= 0.01 of the output scale.)
    np.testing.assert_allclose(j, e, atol=0.1, rtol=0.02)
    ref = np.asarray(run(build(cfg.replace(dtype="float32"), nnx.Rngs(5)), x))
    scale = np.abs(ref).max()
    assert np.abs(j - ref).max() < 0.04 * scale, np.abs(j - ref).max() / scale


# ------------------------------------------------------------------ causality and padding


@pytest.mark.parametrize("name", NAMES)
def test_lm_logits_have_zero_gradient_wrt_future_embeddings(name):
    model = DecoderOnlyLM(small_cfg(name, num_decoder_layers=2), rngs=nnx.Rngs(6))
    tokens, pos = jnp.asarray(_tokens(7, T, batch=1)), _positions(T, (1,))
    encode = TokenEmbedding.encode

    def logits(delta):  # perturb the embedded tokens, [1, T, D]
        with mock.patch.object(TokenEmbedding, "encode", lambda s, t: encode(s, t) + delta):
            return model(tokens, pos)

    jac = np.asarray(jax.jacrev(logits)(jnp.zeros((1, T, D))))[0, :, :, 0]  # [t, V, s, D]
    for t in range(T):
        assert np.all(jac[t, :, t + 1 :] == 0.0), (name, t)
        assert np.abs(jac[t, :, : t + 1]).max() > 1e-4, (name, t)  # the past matters

    # Changing the tokens after t leaves the logits up to t bit-identical.
    base = np.asarray(model(tokens, pos))
    for t in (0, 3):
        changed = tokens.at[0, t + 1 :].set((tokens[0, t + 1 :] + 5) % V)
        out = np.asarray(model(changed, pos))
        np.testing.assert_array_equal(out[0, : t + 1], base[0, : t + 1])
        assert np.abs(out[0, t + 1 :] - base[0, t + 1 :]).max() > 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_encoder_decoder_target_is_causal(name):
    if get_positional_encoding(name).causal_only:
        pytest.skip("causal-only encoding")
    model = EncoderDecoder(small_cfg(name), rngs=nnx.Rngs(7))
    src, tgt = jnp.asarray(_tokens(8, S)), jnp.asarray(_tokens(9, T))
    kw = dict(src_positions=_positions(S), tgt_positions=_positions(T))
    base = np.asarray(model(src, tgt, **kw))
    changed = tgt.at[:, 3:].set((tgt[:, 3:] + 1) % V)
    out = np.asarray(model(src, changed, **kw))
    np.testing.assert_array_equal(out[:, :3], base[:, :3])
    assert np.abs(out[:, 3:] - base[:, 3:]).max() > 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_lm_valid_positions_ignore_padding_tokens(name):
    model = DecoderOnlyLM(small_cfg(name), rngs=nnx.Rngs(8))
    tokens, pos = _tokens(10, T), _positions(T)
    other = tokens.copy()
    other[~VALID_T] = (other[~VALID_T] + 7) % V  # only the (left) padding changes
    a = np.asarray(model(jnp.asarray(tokens), pos, valid=VALID_T))
    b = np.asarray(model(jnp.asarray(other), pos, valid=VALID_T))
    np.testing.assert_allclose(a[VALID_T], b[VALID_T], rtol=0, atol=1e-6)
    # Without the flags the padding tokens are attended to and change the outputs.
    a0 = np.asarray(model(jnp.asarray(tokens), pos))
    b0 = np.asarray(model(jnp.asarray(other), pos))
    assert np.abs(a0[VALID_T] - b0[VALID_T]).max() > 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_encoder_decoder_ignores_source_padding_tokens(name):
    if get_positional_encoding(name).causal_only:
        pytest.skip("causal-only encoding")
    model = EncoderDecoder(small_cfg(name), rngs=nnx.Rngs(9))
    src, tgt = _tokens(11, S), jnp.asarray(_tokens(12, T))
    other = src.copy()
    other[~VALID_S] = (other[~VALID_S] + 3) % V
    kw = dict(src_positions=_positions(S), tgt_positions=_positions(T))
    a = np.asarray(model(jnp.asarray(src), tgt, src_valid=VALID_S, **kw))
    b = np.asarray(model(jnp.asarray(other), tgt, src_valid=VALID_S, **kw))
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    enc_a = np.asarray(model.encode(jnp.asarray(src), _positions(S), src_valid=VALID_S))
    enc_b = np.asarray(model.encode(jnp.asarray(other), _positions(S), src_valid=VALID_S))
    np.testing.assert_allclose(enc_a[VALID_S], enc_b[VALID_S], rtol=0, atol=1e-6)
    a0 = np.asarray(model(jnp.asarray(src), tgt, **kw))
    b0 = np.asarray(model(jnp.asarray(other), tgt, **kw))
    assert np.abs(a0 - b0).max() > 1e-4  # without src_valid the padding is visible


# ------------------------------------------------------------- symmetry and invariances


def _permuted(f, x, perm):
    """(f(x)[:, perm], f(x[:, perm])) for a sequence function f."""
    return np.asarray(f(x))[:, perm], np.asarray(f(x[:, perm]))


PERM = np.array([3, 0, 5, 1, 4, 2])


def test_attention_and_encoder_without_positions_are_permutation_equivariant():
    cfg = small_cfg("none")
    pe = get_positional_encoding("none").build(cfg, rngs=nnx.Rngs(0))
    pos = jnp.asarray(_positions(T))  # the same positions both times: they must not matter
    x = jnp.asarray(np.random.default_rng(10).standard_normal((B, T, D)), jnp.float32)

    att = MultiHeadAttention(cfg, rngs=nnx.Rngs(10))
    for p in (pe, None):
        want, got = _permuted(lambda h, p=p: att(h, q_positions=pos, pe=p), x, PERM)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    block = EncoderBlock(cfg, rngs=nnx.Rngs(11))
    want, got = _permuted(lambda h: block(h, pos, pe=pe), x, PERM)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    tokens = jnp.asarray(_tokens(13, T))
    enc = Encoder(cfg.replace(num_encoder_layers=2), rngs=nnx.Rngs(12))
    want, got = _permuted(lambda t: enc(t, pos), tokens, PERM)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    # Controls: with positional information the symmetry is broken.
    rope = get_positional_encoding("rope").build(small_cfg("rope"), rngs=nnx.Rngs(0))
    want, got = _permuted(lambda h: att(h, q_positions=pos, pe=rope), x, PERM)
    assert np.abs(got - want).max() > 1e-3
    enc_sin = Encoder(small_cfg("sinusoidal"), rngs=nnx.Rngs(12))
    want, got = _permuted(lambda t: enc_sin(t, pos), tokens, PERM)
    assert np.abs(got - want).max() > 1e-3


@pytest.mark.parametrize(
    "name,relative", [("none", True), ("rope", True), ("alibi", True), ("sinusoidal", False)]
)
def test_relative_encodings_are_invariant_to_shifting_all_positions(name, relative):
    model = DecoderOnlyLM(small_cfg(name), rngs=nnx.Rngs(13))
    tokens = jnp.asarray(_tokens(14, T))
    pos = _positions(T, (0, 4))
    base = np.asarray(model(tokens, pos))
    for shift in (1, 9, 100):
        shifted = np.asarray(model(tokens, pos + shift))
        if relative:
            np.testing.assert_allclose(shifted, base, rtol=1e-4, atol=1e-4)
        else:
            assert np.abs(shifted - base).max() > 1e-3

    # RoPE / ALiBi inside one attention layer: shifted positions give the same output.
    if name in ("rope", "alibi"):
        cfg = small_cfg(name)
        pe = get_positional_encoding(name).build(cfg, rngs=nnx.Rngs(0))
        att = MultiHeadAttention(cfg, rngs=nnx.Rngs(14))
        x = jnp.asarray(np.random.default_rng(15).standard_normal((B, T, D)), jnp.float32)
        out = lambda p: np.asarray(att(x, q_positions=p, pe=pe, causal=True))
        np.testing.assert_allclose(out(pos + 37), out(pos), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------ parameter counts


def expected_param_count(cfg, kind):
    """Closed form: linear i->o has i*o (+o) parameters, LayerNorm 2d, embedding V*d."""
    d, f = cfg.d_model, cfg.d_ff
    lin = lambda i, o: i * o + (o if cfg.use_bias else 0)
    mha = 4 * lin(d, d)
    ffn = lin(d, f) + lin(f, d)
    ln = 2 * d
    per_stack = (ln if cfg.norm == "pre" else 0) + (
        cfg.positional_options.max_length * d if cfg.positional == "learned" else 0
    )
    embed = cfg.vocab_size * d + (0 if cfg.tie_embeddings else lin(d, cfg.vocab_size))
    encoder = cfg.num_encoder_layers * (mha + ffn + 2 * ln) + per_stack
    if kind == "EncoderDecoder":
        decoder = cfg.num_decoder_layers * (2 * mha + ffn + 3 * ln) + per_stack
        return embed + encoder + decoder
    return embed + cfg.num_decoder_layers * (mha + ffn + 2 * ln) + per_stack


def _count(model):
    return sum(
        int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param))
    )


@pytest.mark.parametrize(
    "kind,changes",
    [
        ("EncoderDecoder", {}),
        ("EncoderDecoder", {"norm": "pre", "tie_embeddings": False, "positional": "learned"}),
        ("DecoderOnlyLM", {"norm": "pre", "use_bias": False, "positional": "learned"}),
        ("DecoderOnlyLM", {"positional": "learned", "positional_options": {"max_length": 100}}),
    ],
)
def test_parameter_count_matches_closed_form(kind, changes):
    cfg = ModelConfig(**changes)  # the base Transformer (d 512, 8 heads, d_ff 2048, 6+6)
    cls = {"EncoderDecoder": EncoderDecoder, "DecoderOnlyLM": DecoderOnlyLM}[kind]
    model = nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0)))  # nothing is allocated
    assert _count(model) == expected_param_count(cfg, kind)
    if kind == "EncoderDecoder" and not changes:
        # 256*512 + 6 * 3,152,384 + 6 * 4,204,032 (the paper's 65M adds a 37k BPE vocabulary)
        assert _count(model) == 44_269_568


# --------------------------------------------------------------------- misc. behaviours


def test_dropout_only_acts_when_not_deterministic():
    model = DecoderOnlyLM(small_cfg("sinusoidal", dropout_rate=0.5), rngs=nnx.Rngs(16))
    tokens, pos = jnp.asarray(_tokens(17, T)), _positions(T)
    a = np.asarray(model(tokens, pos))
    np.testing.assert_array_equal(np.asarray(model(tokens, pos, deterministic=True)), a)
    b = np.asarray(model(tokens, pos, deterministic=False))
    c = np.asarray(model(tokens, pos, deterministic=False))
    assert np.abs(b - a).max() > 1e-3 and np.abs(b - c).max() > 1e-3


@pytest.mark.parametrize("kind", ["DecoderOnlyLM", "EncoderDecoder"])
def test_dropout_follows_nnx_train_and_eval_modes(kind):
    """A model starts in eval mode (no dropout); ``train()`` turns dropout on and ``eval()``
    off, as for any NNX module; an explicit ``deterministic=`` overrides the mode."""
    cfg = small_cfg("sinusoidal", dropout_rate=0.5)
    tokens, pos = jnp.asarray(_tokens(17, T)), _positions(T)
    if kind == "DecoderOnlyLM":
        model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(16))

        def call(**kw):
            return np.asarray(model(tokens, pos, **kw))
    else:
        model = EncoderDecoder(cfg, rngs=nnx.Rngs(16))

        def call(**kw):
            return np.asarray(model(tokens, tokens, src_positions=pos, tgt_positions=pos, **kw))

    evaluated = call()
    np.testing.assert_array_equal(call(deterministic=True), evaluated)
    model.train()
    a, b = call(), call()
    assert np.abs(a - evaluated).max() > 1e-3 and np.abs(a - b).max() > 1e-3
    np.testing.assert_array_equal(call(deterministic=True), evaluated)  # the call overrides
    model.eval()
    np.testing.assert_array_equal(call(), evaluated)
    assert np.abs(call(deterministic=False) - evaluated).max() > 1e-3


def test_models_reject_inconsistent_inputs():
    lm = DecoderOnlyLM(small_cfg(), rngs=nnx.Rngs(0))
    tokens = jnp.asarray(_tokens(0, T))
    with pytest.raises(ValueError, match=r"positions=int32\[2, 7\]: .*\[6\] or \[2, 6\]"):
        lm(tokens, _positions(T + 1))
    with pytest.raises(ValueError, match="tokens must be int"):
        lm(tokens.astype(jnp.float32), _positions(T))
    dec = Decoder(small_cfg(), cross_attention=True, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="encoded"):
        dec(tokens, _positions(T))


def test_attention_uses_the_configs_chunked_threshold():
    """``attention_impl="auto"`` chunks above ``cfg.chunked_threshold`` keys where the fused
    kernel cannot run (here: ALiBi has a bias): T = 6 keys are chunked with a threshold of 4,
    not with a threshold of 6, and both give the plain "xla" logits."""
    tokens, pos = jnp.asarray(_tokens(0, T)), _positions(T)
    ref = np.asarray(DecoderOnlyLM(small_cfg("alibi"), rngs=nnx.Rngs(0))(tokens, pos))
    for threshold, chunked in ((4, True), (T, False)):
        cfg = small_cfg("alibi", attention_impl="auto", chunked_threshold=threshold)
        assert cfg.chunked_threshold == threshold
        model = DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))
        with mock.patch.object(
            chunked_attention, "chunked_attention", wraps=chunked_attention.chunked_attention
        ) as spy:
            out = np.asarray(model(tokens, pos))
        assert spy.called == chunked, threshold
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_models_take_length_positions_and_default_to_arange():
    """One positions convention: ``[L]`` (broadcast) or ``[B, L]``; left out, ``0..L-1``."""
    import inspect

    lm = DecoderOnlyLM(small_cfg("rope"), rngs=nnx.Rngs(3))
    tokens = jnp.asarray(_tokens(5, T))
    explicit = np.asarray(lm(tokens, jnp.broadcast_to(jnp.arange(T), (B, T))))
    np.testing.assert_allclose(np.asarray(lm(tokens)), explicit, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(lm(tokens, jnp.arange(T))), explicit, rtol=1e-6)
    for bad, shape in (
        (_positions(T + 1), r"int32\[2, 7\]"),
        (np.zeros((2, 3, T), np.int32), r"int32\[2, 3, 6\]"),
        (np.arange(T, dtype=np.float32), r"float32\[6\]"),
    ):
        with pytest.raises(
            ValueError,
            match=rf"^positions={shape}: must be integers of shape \[length\] or "
            r"\[batch, length\], here \[6\] or \[2, 6\]",
        ):
            lm(tokens, bad)
    # EncoderDecoder: default src/tgt positions equal explicit ``[len]`` ones.
    ed = EncoderDecoder(small_cfg("sinusoidal"), rngs=nnx.Rngs(4))
    src, tgt = jnp.asarray(_tokens(6, S)), jnp.asarray(_tokens(7, T))
    want = np.asarray(ed(src, tgt, src_positions=jnp.arange(S), tgt_positions=jnp.arange(T)))
    np.testing.assert_allclose(np.asarray(ed(src, tgt)), want, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"^src_positions=int32\[2, 7\]: .*\[8\] or \[2, 8\]"):
        ed(src, tgt, src_positions=_positions(S - 1))
    # help() shows the constructor, not NNX's (*args, **kwargs).
    assert str(inspect.signature(DecoderOnlyLM)) == "(cfg: 'ModelConfig', *, rngs: 'nnx.Rngs')"
    assert "model(tokens)" in DecoderOnlyLM.__doc__
