"""Hugging Face causal-LM families: ``config.json`` -> `ModelConfig`, checkpoint -> parameters.

One `Family` per architecture, each a transcription of transformers'
``models/<family>/modeling_<family>.py`` (the reference; tests/pretrained/ pins every family
against logits that transformers computed):

========  =====================  ==========  ==============================================
family    architectures          encoding    what differs from the library's defaults
========  =====================  ==========  ==============================================
gpt2      GPT2LMHeadModel        learned     pre-LN, tanh GELU, Conv1D weights ``[in, out]``,
                                             fused q|k|v
opt       OPTForCausalLM         learned     positions offset by 2, ReLU, pre- or post-LN
xglm      XGLMForCausalLM        sinusoidal  fairseq sinusoids ``[sin | cos]``, offset 2,
                                             embeddings x sqrt(d)
gpt_neox  GPTNeoXForCausalLM     rope        partial rotary, parallel residual, fused per-head
                                             q|k|v, exact GELU, untied head
llama     LlamaForCausalLM,      rope        RMSNorm, SwiGLU, grouped-query attention, no
          MistralForCausalLM                 biases, HF RoPE scalings
qwen2     Qwen2ForCausalLM       rope        as llama, with q/k/v biases
bloom     BloomForCausalLM       alibi       LayerNorm on the embeddings, fused per-head
                                             q|k|v, tanh GELU
mpt       MptForCausalLM         alibi       MPT's ALiBi slopes, no biases, exact GELU
gemma3_   Gemma3ForCausalLM      rope        a layer pattern (5 sliding-window layers, RoPE
text                                         base 1e4, then 1 global, base 1e6, scalings on
                                             the global ones), Gemma's RMSNorm (1 + w), q/k
                                             norms, sandwich norms, head_dim apart from d /
                                             heads, query_pre_attn_scalar, tanh GeGLU,
                                             embeddings x sqrt(d), GQA, tied head
========  =====================  ==========  ==============================================

How documents are joined when a model scores a corpus (`Family.separator`, `Family.bos`; applied
by `flaxformer_lite.pretrained.load.Checkpoint`), as each family's models saw them in pretraining
and as transformers' tokenizer of the family encodes a text:

===========  ==================================  ============================================
family       separator between documents         token before each document (never scored)
===========  ==================================  ============================================
gpt2, qwen2  ``<|endoftext|>``                    none (the separator starts the split)
gpt_neox,
mpt
opt          ``</s>`` (eos)                      ``</s>`` (bos_token_id; OPT's tokenizer
                                                 prepends it): the separator itself
xglm         ``</s>`` (eos)                      none (XGLM's tokenizer prepends ``</s>``,
                                                 the separator)
bloom        ``</s>`` (eos: no ``<|endoftext|>``)  none
llama        ``<|endoftext|>`` if the tokenizer  the tokenizer's own choice: its BOS when it
             has it (SmolLM), else eos           adds one by default (Llama, Mistral:
                                                 ``<s>``; a GGUF file's ``add_bos_token``)
gemma3_text  eos (``<eos>``)                     ``<bos>`` (bos_token_id; Gemma needs it)
===========  ==================================  ============================================

A config field that would change the model's function and that the library does not
implement is refused in one line that names the family, the field and its value; fields
that do not change the function (dropout, initialisation, token ids, dtypes) are ignored.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from flaxformer_lite.base.checks import is_number
from flaxformer_lite.nn.model_config import ModelConfig
from flaxformer_lite.nn.schedules import LayerKind
from flaxformer_lite.pretrained.files import CheckpointFiles, PretrainedError
from flaxformer_lite.pretrained.hf_rope import rope_options_from_hf

Weights = Iterator[tuple[str, np.ndarray]]
# HF activation names (transformers.activations.ACT2FN) -> ModelConfig.activation
_ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu_exact",
    "gelu_new": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "gelu_fast": "gelu",
    "silu": "silu",
    "swish": "silu",
}


@dataclasses.dataclass(frozen=True)
class Family:
    """How one Hugging Face architecture maps onto `DecoderOnlyLM`.

    Attributes:
      name: the family (``"gpt2"``).
      model_types: ``config.json`` ``model_type`` values it reads.
      architectures: the ``architectures`` entries it loads (causal-LM heads only).
      encoding: the positional encoding its models use (for listings).
      config: ``config(fields) -> ModelConfig``.
      weights: ``weights(files, cfg)`` yields ``(parameter path, array)`` for every parameter
        of the model, paths as in ``nnx.to_flat_state`` joined by dots.
      prefixes: base-model prefixes a checkpoint may or may not store (``"transformer."``).
      buffers: regular expressions of stored tensors that are not parameters (causal-mask
        buffers, cached rotary frequencies): read by nothing and not an error.
      separator: the token between documents (module docstring): ``"endoftext"`` (the
        tokenizer's ``<|endoftext|>`` when it has one, else the eos token) or ``"eos"``.
      bos: the token before each document: ``"none"``, ``"bos_token"`` (the config's
        ``bos_token_id``) or ``"tokenizer"`` (the one its tokenizer adds by default, if any).
    """

    name: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    encoding: str
    config: Callable[[Fields], ModelConfig]
    weights: Callable[[CheckpointFiles, ModelConfig], Weights]
    prefixes: tuple[str, ...] = ()
    buffers: tuple[str, ...] = ()
    separator: str = "endoftext"
    bos: str = "none"

    def is_buffer(self, name: str) -> bool:
        return any(re.fullmatch(p, name) for p in self.buffers)


class Fields:
    """A ``config.json`` dict read by one family: typed getters whose errors name the family
    and the field, and `refuse` for values the library does not implement."""

    def __init__(self, family: str, config: Mapping[str, Any]):
        self.family = family
        self.config = config

    def get(self, name: str, default: Any = None) -> Any:
        value = self.config.get(name, default)
        return default if value is None else value

    def int(self, name: str, default: int | None = None) -> int:
        value = self.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise PretrainedError(
                f"{self.family} config.json: {name}={value!r} must be a positive int"
            )
        return value

    def float(self, name: str, default: float | None = None) -> float:
        value = self.get(name, default)
        if not is_number(value) or not 0 < value < math.inf:
            raise PretrainedError(
                f"{self.family} config.json: {name}={value!r} must be a finite positive number"
            )
        return float(value)

    def number(self, name: str) -> float | None:
        """A finite number, or None when the field is absent or null."""
        value = self.config.get(name)
        if value is not None and (not is_number(value) or not math.isfinite(value)):
            raise PretrainedError(
                f"{self.family} config.json: {name}={value!r} must be a finite number or null"
            )
        return None if value is None else float(value)

    def bool(self, name: str, default: bool) -> bool:
        value = self.get(name, default)
        if not isinstance(value, bool):
            raise PretrainedError(f"{self.family} config.json: {name}={value!r} must be a bool")
        return value

    def activation(self, name: str, default: str) -> str:
        value = self.get(name, default)
        if not isinstance(value, str) or value not in _ACTIVATIONS:
            raise PretrainedError(
                f"{self.family} config.json: {name}={value!r} is not supported; supported: "
                f"{sorted(_ACTIVATIONS)}"
            )
        return _ACTIVATIONS[value]

    def refuse(self, name: str, allowed: Callable[[Any], bool], default: Any, why: str) -> None:
        """Refuse ``name`` unless ``allowed(value)`` (``why`` says what is supported)."""
        value = self.config.get(name, default)
        if not allowed(value):
            raise PretrainedError(
                f"{self.family} config.json: {name}={value!r} is not supported ({why})"
            )

    def heads(self, d_model: int, num_heads: int) -> int:
        """``head_dim``; refuses a ``head_dim`` field that differs from d_model / heads."""
        if d_model % num_heads:
            raise PretrainedError(
                f"{self.family} config.json: hidden size {d_model} is not divisible by "
                f"{num_heads} heads"
            )
        head_dim = d_model // num_heads
        self.refuse(
            "head_dim",
            lambda v: v in (None, head_dim),
            None,
            f"the library's head_dim is d_model / num_heads = {head_dim}",
        )
        return head_dim


def _base(fields: Fields, **kwargs: Any) -> ModelConfig:
    """A decoder-only config with the settings every family shares: no dropout, no
    encoder, float32 (the loader changes dtypes), ``vocab_size``; unless the family says
    otherwise, pre-LN, unscaled embeddings and a head tied as ``tie_word_embeddings`` says."""
    kwargs.setdefault("vocab_size", fields.int("vocab_size"))
    kwargs.setdefault("norm", "pre")
    kwargs.setdefault("scale_embeddings", False)
    kwargs.setdefault("tie_embeddings", fields.bool("tie_word_embeddings", True))
    return ModelConfig(num_encoder_layers=0, dropout_rate=0.0, **kwargs)


def _t(x: np.ndarray) -> np.ndarray:
    """A torch ``nn.Linear`` weight ``[out, in]`` as an ``nnx.Linear`` kernel ``[in, out]``."""
    return np.asarray(x).T


def _head(files: CheckpointFiles, cfg: ModelConfig, name: str = "lm_head.weight") -> Weights:
    if cfg.tie_embeddings:
        return
    yield "decoder.embed.head.kernel", _t(files.get(name))


def _norm(files: CheckpointFiles, src: str, dst: str, *, bias: bool = True) -> Weights:
    yield f"{dst}.scale", files.get(f"{src}.weight")
    if bias:
        yield f"{dst}.bias", files.get(f"{src}.bias")


def _linear(
    files: CheckpointFiles, src: str, dst: str, *, bias: bool, conv1d: bool = False
) -> Weights:
    """A torch ``nn.Linear`` (``conv1d``: GPT-2's ``Conv1D``, stored ``[in, out]``)."""
    weight = files.get(f"{src}.weight")
    yield f"{dst}.kernel", weight if conv1d else _t(weight)
    if bias:
        yield f"{dst}.bias", files.get(f"{src}.bias")


def _split_heads_qkv(files: CheckpointFiles, src: str, dst: str, cfg: ModelConfig) -> Weights:
    """A fused projection ``[heads * 3 * head_dim, d]`` laid out per head as ``[q | k | v]``
    (GPT-NeoX ``query_key_value``, BLOOM ``query_key_value``) -> query, key, value."""
    h, hd, d = cfg.num_heads, cfg.head_dim, cfg.d_model
    weight = np.asarray(files.get(f"{src}.weight")).reshape(h, 3, hd, d)
    bias = np.asarray(files.get(f"{src}.bias")).reshape(h, 3, hd)
    for i, part in enumerate(("query", "key", "value")):
        yield f"{dst}.{part}.kernel", weight[:, i].reshape(h * hd, d).T
        yield f"{dst}.{part}.bias", bias[:, i].reshape(h * hd)


def _split_thirds(files: CheckpointFiles, src: str, dst: str, *, axis: int, bias: bool) -> Weights:
    """A fused ``[q | k | v]`` projection -> query, key, value: GPT-2's Conv1D ``c_attn``
    (``[d, 3 d]``: split along axis 1, already ``[in, out]``) or MPT's ``Wqkv`` (``[3 d, d]``:
    split along axis 0, transposed)."""
    weights = np.split(np.asarray(files.get(f"{src}.weight")), 3, axis=axis)
    biases = np.split(np.asarray(files.get(f"{src}.bias")), 3) if bias else (None,) * 3
    for part, w, b in zip(("query", "key", "value"), weights, biases, strict=True):
        yield f"{dst}.{part}.kernel", w.T if axis == 0 else w
        if bias:
            yield f"{dst}.{part}.bias", b


# -------------------------------------------------------------------------------- GPT-2


def _gpt2_config(f: Fields) -> ModelConfig:
    f.refuse("scale_attn_weights", lambda v: v is True, True, "attention must scale by 1/sqrt(d)")
    f.refuse("scale_attn_by_inverse_layer_idx", lambda v: not v, False, "layer-scaled attention")
    f.refuse("add_cross_attention", lambda v: not v, False, "decoder-only models only")
    d, h = f.int("n_embd"), f.int("n_head")
    f.heads(d, h)
    return _base(
        f,
        d_model=d,
        num_heads=h,
        d_ff=f.int("n_inner", 4 * d),
        num_decoder_layers=f.int("n_layer"),
        norm_epsilon=f.float("layer_norm_epsilon", 1e-5),
        activation=f.activation("activation_function", "gelu_new"),
        head_bias=False,
        positional="learned",
        positional_options={"max_length": f.int("n_positions")},
    )


def _gpt2_weights(files: CheckpointFiles, cfg: ModelConfig) -> Weights:
    yield "decoder.embed.embed.embedding", files.get("wte.weight")
    yield "decoder.pe.table", files.get("wpe.weight")
    for i in range(cfg.num_decoder_layers):
        src, dst = f"h.{i}", f"decoder.blocks.{i}"
        yield from _norm(files, f"{src}.ln_1", f"{dst}.self_attention_norm.norm")
        att = f"{dst}.self_attention"
        yield from _split_thirds(files, f"{src}.attn.c_attn", att, axis=1, bias=True)
        yield from _linear(files, f"{src}.attn.c_proj", f"{att}.out", bias=True, conv1d=True)
        yield from _norm(files, f"{src}.ln_2", f"{dst}.ffn_norm.norm")
        yield from _linear(files, f"{src}.mlp.c_fc", f"{dst}.ffn.wi", bias=True, conv1d=True)
        yield from _linear(files, f"{src}.mlp.c_proj", f"{dst}.ffn.wo", bias=True, conv1d=True)
    yield from _norm(files, "ln_f", "decoder.final_norm")
    yield from _head(files, cfg)


# ---------------------------------------------------------------------------------- OPT


def _opt_config(f: Fields) -> ModelConfig:
    d = f.int("hidden_size")
    f.refuse(
        "word_embed_proj_dim",
        lambda v: v in (None, d),
        d,
        f"projected embeddings; only word_embed_proj_dim == hidden_size ({d})",
    )
    f.refuse("layer_norm_elementwise_affine", lambda v: v is not False, True, "affine norms only")
    f.refuse("_remove_final_layer_norm", lambda v: not v, False, "the final norm is required")
    h = f.int("num_attention_heads")
    f.heads(d, h)
    bias = f.bool("enable_bias", True)
    return _base(
        f,
        d_model=d,
        num_heads=h,
        d_ff=f.int("ffn_dim"),
        num_decoder_layers=f.int("num_hidden_layers"),
        norm="pre" if f.bool("do_layer_norm_before", True) else "post",
        norm_epsilon=1e-5,  # torch.nn.LayerNorm's default; OPT has no field for it
        activation=f.activation("activation_function", "relu"),
        use_bias=bias,
        head_bias=False,
        positional="learned",
        # OPTLearnedPositionalEmbedding: 2 extra rows, position p reads row p + 2
        positional_options={"max_length": f.int("max_position_embeddings") + 2, "offset": 2},
    )


def _opt_weights(files: CheckpointFiles, cfg: ModelConfig) -> Weights:
    bias = cfg.use_bias
    yield "decoder.embed.embed.embedding", files.get("decoder.embed_tokens.weight")
    yield "decoder.pe.table", files.get("decoder.embed_positions.weight")
    yield from _fairseq_layers(files, cfg, "decoder.layers", bias=bias)
    if cfg.norm == "pre":
        yield from _norm(files, "decoder.final_layer_norm", "decoder.final_norm")
    yield from _head(files, cfg)


def _fairseq_layers(
    files: CheckpointFiles, cfg: ModelConfig, prefix: str, *, bias: bool
) -> Weights:
    """The decoder layers of fairseq's layout (OPT, XGLM): ``{prefix}.{i}.self_attn.
    {q,k,v,out}_proj``, ``self_attn_layer_norm``, ``fc1``, ``fc2``, ``final_layer_norm``."""
    for i in range(cfg.num_decoder_layers):
        src, dst = f"{prefix}.{i}", f"decoder.blocks.{i}"
        att = f"{dst}.self_attention"
        for hf, ours in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
            yield from _linear(files, f"{src}.self_attn.{hf}", f"{att}.{ours}", bias=bias)
        yield from _linear(files, f"{src}.self_attn.out_proj", f"{att}.out", bias=bias)
        yield from _norm(files, f"{src}.self_attn_layer_norm", f"{dst}.self_attention_norm.norm")
        yield from _linear(files, f"{src}.fc1", f"{dst}.ffn.wi", bias=bias)
        yield from _linear(files, f"{src}.fc2", f"{dst}.ffn.wo", bias=bias)
        yield from _norm(files, f"{src}.final_layer_norm", f"{dst}.ffn_norm.norm")


# --------------------------------------------------------------------------------- XGLM


def _xglm_config(f: Fields) -> ModelConfig:
    d, h = f.int("d_model"), f.int("attention_heads")
    f.heads(d, h)
    return _base(
        f,
        d_model=d,
        num_heads=h,
        d_ff=f.int("ffn_dim"),
        num_decoder_layers=f.int("num_layers"),
        norm_epsilon=1e-5,
        activation=f.activation("activation_function", "gelu"),
        head_bias=False,
        scale_embeddings=f.bool("scale_embedding", True),
        positional="sinusoidal",
        # XGLMSinusoidalPositionalEmbedding: fairseq's table, position p reads row p + 2
        positional_options={"variant": "fairseq", "offset": 2},
    )


def _xglm_weights(files: CheckpointFiles, cfg: ModelConfig) -> Weights:
    yield "decoder.embed.embed.embedding", files.get("embed_tokens.weight")
    yield from _fairseq_layers(files, cfg, "layers", bias=True)
    yield from _norm(files, "layer_norm", "decoder.final_norm")
    yield from _head(files, cfg)


# ----------------------------------------------------------------------------- GPT-NeoX


def _neox_config(f: Fields) -> ModelConfig:
    d, h = f.int("hidden_size"), f.int("num_attention_heads")
    head_dim = f.heads(d, h)
    f.refuse("attention_bias", lambda v: v is not False, True, "q/k/v biases are required")
    return _base(
        f,
        d_model=d,
        num_heads=h,
        d_ff=f.int("intermediate_size"),
        num_decoder_layers=f.int("num_hidden_layers"),
        norm_epsilon=f.float("layer_norm_eps", 1e-5),
        activation=f.activation("hidden_act", "gelu"),
        head_bias=False,
        tie_embeddings=f.bool("tie_word_embeddings", False),
        residual="parallel" if f.bool("use_parallel_residual", True) else "sequential",
        positional="rope",
        positional_options=rope_options_from_hf(f.config, head_dim=head_dim),
    )


def _neox_weights(files: CheckpointFiles, cfg: ModelConfig) -> Weights:
    yield "decoder.embed.embed.embedding", files.get("embed_in.weight")
    yield from _neox_layers(files, cfg, "layers", "attention")
    yield from _norm(files, "final_layer_norm", "decoder.final_norm")
    yield from _head(files, cfg, "embed_out.weight")


def _neox_layers(files: CheckpointFiles, cfg: ModelConfig, prefix: str, attention: str) -> Weights:
    """The decoder layers of GPT-NeoX's layout (also BLOOM's): ``{prefix}.{i}.
    input_layernorm``, ``{attention}.query_key_value`` (fused per head) and ``.dense``,
    ``post_attention_layernorm``, ``mlp.dense_h_to_4h``, ``mlp.dense_4h_to_h``."""
    for i in range(cfg.num_decoder_layers):
        src, dst = f"{prefix}.{i}", f"decoder.blocks.{i}"
        att = f"{dst}.self_attention"
        yield from _norm(files, f"{src}.input_layernorm", f"{dst}.self_attention_norm.norm")
        yield from _split_heads_qkv(files, f"{src}.{attention}.query_key_value", att, cfg)
        yield from _linear(files, f"{src}.{attention}.dense", f"{att}.out", bias=True)
        yield from _norm(files, f"{src}.post_attention_layernorm", f"{dst}.ffn_norm.norm")
        yield from _linear(files, f"{src}.mlp.dense_h_to_4h", f"{dst}.ffn.wi", bias=True)
        yield from _linear(files, f"{src}.mlp.dense_4h_to_h", f"{dst}.ffn.wo", bias=True)


# ---------------------------------------------------------------- Llama, Mistral, Qwen2


def _llama_config(f: Fields, *, qwen2: bool = False) -> ModelConfig:
    d, h = f.int("hidden_size"), f.int("num_attention_heads")
    head_dim = f.heads(d, h)
    kv = f.int("num_key_value_heads", h)
    if qwen2:
        f.refuse("use_sliding_window", lambda v: not v, False, "Qwen2's per-layer sliding window")
        qkv_bias, out_bias, ffn_bias, window = True, False, False, None
    else:
        qkv_bias = out_bias = f.bool("attention_bias", False)
        ffn_bias = f.bool("mlp_bias", False)
        window = f.config.get("sliding_window")  # Mistral: each query sees the last W keys
        if window is not None:
            window = f.int("sliding_window")
    return _base(
        f,
        d_model=d,
        num_heads=h,
        num_kv_heads=kv,
        d_ff=f.int("intermediate_size"),
        num_decoder_layers=f.int("num_hidden_layers"),
        norm_type="rms",
        norm_epsilon=f.float("rms_norm_eps", 1e-6),
        activation=f.activation("hidden_act", "silu"),
        ffn_gated=True,
        use_bias=False,
        qkv_bias=qkv_bias,
        out_bias=out_bias,
        ffn_bias=ffn_bias,
        head_bias=False,
        tie_embeddings=f.bool("tie_word_embeddings", False),
        attention_window=window,
        positional="rope",
        positional_options=rope_options_from_hf(f.config, head_dim=head_dim),
    )


def _llama_weights(files: CheckpointFiles, cfg: ModelConfig) -> Weights:
    yield "decoder.embed.embed.embedding", files.get("embed_tokens.weight")
    qkv_bias = cfg.use_bias if cfg.qkv_bias is None else cfg.qkv_bias
    out_bias = cfg.use_bias if cfg.out_bias is None else cfg.out_bias
    ffn_bias = cfg.use_bias if cfg.ffn_bias is None else cfg.ffn_bias
    for i in range(cfg.num_decoder_layers):
        src, dst = f"layers.{i}", f"decoder.blocks.{i}"
        att = f"{dst}.self_attention"
        for hf, ours in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
            yield from _linear(files, f"{src}.self_attn.{hf}", f"{att}.{ours}", bias=qkv_bias)
        yield from _linear(files, f"{src}.self_attn.o_proj", f"{att}.out", bias=out_bias)
        yield from _norm(
            files, f"{src}.input_layernorm", f"{dst}.self_attention_norm.norm", bias=False
        )
        yield from _norm(
            files, f"{src}.post_attention_layernorm", f"{dst}.ffn_norm.norm", bias=False
        )
        for hf, ours in (("gate_proj", "wi"), ("up_proj", "wu"), ("down_proj", "wo")):
            yield from _linear(files, f"{src}.mlp.{hf}", f"{dst}.ffn.{ours}", bias=ffn_bias)
    yield from _norm(files, "norm", "decoder.final_norm", bias=False)
    yield from _head(files, cfg)


# -------------------------------------------------------------------------------- BLOOM


def _bloom_config(f: Fields) -> ModelConfig:
    f.refuse(
        "apply_residual_connection_post_layernorm",
        lambda v: not v,
        False,
        "only the residual taken before the norm",
    )
    d = f.int("hidden_size", f.get("n_embed"))
    h = f.int("n_head")
    f.heads(d, h)
    return _base(
        f,
        d_model=d,
        num_heads=h,
        d_ff=4 * d,
        num_decoder_layers=f.int("n_layer"),
        norm_epsilon=f.float("layer_norm_epsilon", 1e-5),
        activation="gelu",  # bloom_gelu_forward: the tanh form
        head_bias=False,
        embedding_norm=True,  # word_embeddings_layernorm
        positional="alibi",
        positional_options={"slopes": "official"},  # build_alibi_tensor = Press et al.'s
    )


def _bloom_weights(files: CheckpointFiles, cfg: ModelConfig) -> Weights:
    yield "decoder.embed.embed.embedding", files.get("word_embeddings.weight")
    yield from _norm(files, "word_embeddings_layernorm", "decoder.embed_norm")
    yield from _neox_layers(files, cfg, "h", "self_attention")
    yield from _norm(files, "ln_f", "decoder.final_norm")
    yield from _head(files, cfg)


# ---------------------------------------------------------------------------------- MPT


def _mpt_config(f: Fields) -> ModelConfig:
    attn = f.get("attn_config", {})
    if not isinstance(attn, Mapping):
        raise PretrainedError(f"mpt config.json: attn_config={attn!r} must be an object")
    sub = Fields("mpt", attn)
    sub.refuse("alibi", lambda v: v is True, False, "only ALiBi MPT models (attn_config.alibi)")
    sub.refuse("clip_qkv", lambda v: v is None, None, "q/k/v clipping")
    sub.refuse("qk_ln", lambda v: not v, False, "query/key layer norms")
    sub.refuse("prefix_lm", lambda v: not v, False, "causal models only")
    d, h = f.int("d_model"), f.int("n_heads")
    head_dim = f.heads(d, h)
    scale = sub.number("softmax_scale")
    sub.refuse(
        "softmax_scale",
        lambda v: scale is None or abs(scale - head_dim**-0.5) < 1e-12,
        None,
        "attention scaled by 1/sqrt(head_dim)",
    )
    f.refuse("logit_scale", lambda v: v is None, None, "scaled logits")
    bias = not f.bool("no_bias", True)
    # transformers' MptMLP is 4 x d_model whatever expansion_ratio says
    f.refuse("expansion_ratio", lambda v: v == 4, 4, "transformers' MptMLP is 4 x d_model")
    return _base(
        f,
        d_model=d,
        num_heads=h,
        d_ff=4 * d,
        num_decoder_layers=f.int("n_layers"),
        norm_epsilon=f.float("layer_norm_epsilon", 1e-5),
        norm_bias=bias,
        activation="gelu_exact",  # MptMLP: nn.GELU(approximate="none")
        use_bias=bias,
        head_bias=False,
        positional="alibi",
        positional_options={"slopes": "mpt", "max_bias": sub.float("alibi_bias_max", 8.0)},
    )


def _mpt_weights(files: CheckpointFiles, cfg: ModelConfig) -> Weights:
    bias = cfg.use_bias
    yield "decoder.embed.embed.embedding", files.get("wte.weight")
    for i in range(cfg.num_decoder_layers):
        src, dst = f"blocks.{i}", f"decoder.blocks.{i}"
        att = f"{dst}.self_attention"
        yield from _norm(files, f"{src}.norm_1", f"{dst}.self_attention_norm.norm", bias=bias)
        yield from _split_thirds(files, f"{src}.attn.Wqkv", att, axis=0, bias=bias)
        yield from _linear(files, f"{src}.attn.out_proj", f"{att}.out", bias=bias)
        yield from _norm(files, f"{src}.norm_2", f"{dst}.ffn_norm.norm", bias=bias)
        yield from _linear(files, f"{src}.ffn.up_proj", f"{dst}.ffn.wi", bias=bias)
        yield from _linear(files, f"{src}.ffn.down_proj", f"{dst}.ffn.wo", bias=bias)
    yield from _norm(files, "norm_f", "decoder.final_norm", bias=bias)
    yield from _head(files, cfg)


# ------------------------------------------------------------------------- Gemma 3 (text)

_GEMMA3_TYPES = ("sliding_attention", "full_attention")


def _gemma3_layer_types(f: Fields, layers: int) -> list[str]:
    """``layer_types``, or the older ``sliding_window_pattern`` (layer i slides unless
    ``(i + 1) % pattern == 0``, default 6), as ``Gemma3TextConfig.__post_init__``."""
    types = f.config.get("layer_types")
    if types is None:
        pattern = f.config.get("sliding_window_pattern", f.config.get("_sliding_window_pattern"))
        pattern = 6 if pattern is None else pattern
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern <= 0:
            raise PretrainedError(
                f"{f.family} config.json: sliding_window_pattern={pattern!r} must be a positive int"
            )
        return [_GEMMA3_TYPES[(i + 1) % pattern == 0] for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or set(types) - set(_GEMMA3_TYPES):
        raise PretrainedError(
            f"{f.family} config.json: layer_types={types!r} must list one of "
            f"{list(_GEMMA3_TYPES)} per layer (num_hidden_layers={layers})"
        )
    return types


def _gemma3_rope(f: Fields, head_dim: int) -> dict[str, Any]:
    """The RoPE options of each layer type, read as ``Gemma3TextConfig.
    convert_rope_params_to_dict`` does: ``rope_parameters`` per layer type (transformers 5),
    or ``rope_theta`` (global layers, default 1e6), ``rope_local_base_freq`` (sliding
    layers, default 1e4) and ``rope_scaling`` (global layers only)."""
    params = f.config.get("rope_parameters") or {}
    if not isinstance(params, Mapping) or not all(isinstance(v, Mapping) for v in params.values()):
        raise PretrainedError(
            f"{f.family} config.json: rope_parameters={params!r} must map layer types "
            f"{list(_GEMMA3_TYPES)} to RoPE parameters"
        )
    per_type = {t: dict(params.get(t) or {"rope_type": "default"}) for t in _GEMMA3_TYPES}
    if f.config.get("rope_scaling"):
        per_type["full_attention"].update(f.config["rope_scaling"])
    defaults = {
        "full_attention": ("rope_theta", 1e6),
        "sliding_attention": ("rope_local_base_freq", 1e4),
    }
    for layer_type, (field, default) in defaults.items():
        theta = f.config.get(field)
        per_type[layer_type].setdefault("rope_theta", default if theta is None else theta)
    common = {
        k: f.config[k]
        for k in ("max_position_embeddings", "original_max_position_embeddings", "model_type")
        if k in f.config
    }
    return {
        t: rope_options_from_hf(common | {"rope_parameters": p}, head_dim=head_dim)
        for t, p in per_type.items()
    }


def _gemma3_config(f: Fields) -> ModelConfig:
    f.refuse("use_bidirectional_attention", lambda v: not v, False, "causal models only")
    f.refuse("attn_logit_softcapping", lambda v: v is None, None, "attention logit soft-capping")
    f.refuse("final_logit_softcapping", lambda v: v is None, None, "final logit soft-capping")
    f.refuse("attention_bias", lambda v: not v, False, "q/k/v/o projection biases")
    d, h = f.int("hidden_size"), f.int("num_attention_heads")
    head_dim = f.int("head_dim", 256)  # Gemma3TextConfig's default
    layers = f.int("num_hidden_layers")
    types = _gemma3_layer_types(f, layers)
    # the shortest prefix of the layer types that cycles to all of them (6 for 5:1)
    period = next(
        p for p in range(1, layers + 1) if all(t == types[i % p] for i, t in enumerate(types))
    )
    rope = _gemma3_rope(f, head_dim)
    window = f.int("sliding_window", 4096) if "sliding_attention" in types else None
    kinds = {
        "sliding_attention": LayerKind(
            window=window,
            positional="rope",
            positional_options=rope["sliding_attention"],
            name="gemma3.local",
        ),
        "full_attention": LayerKind(
            positional="rope", positional_options=rope["full_attention"], name="gemma3.global"
        ),
    }
    return _base(
        f,
        d_model=d,
        num_heads=h,
        num_kv_heads=f.int("num_key_value_heads", h),
        head_size=head_dim,
        d_ff=f.int("intermediate_size"),
        num_decoder_layers=layers,
        norm_type="gemma_rms",
        norm_epsilon=f.float("rms_norm_eps", 1e-6),
        activation=f.activation("hidden_activation", "gelu_pytorch_tanh"),
        ffn_gated=True,
        use_bias=False,
        qk_norm=True,
        sandwich_norm=True,
        query_pre_attn_scalar=f.float("query_pre_attn_scalar", 256),
        scale_embeddings=True,  # Gemma3TextScaledWordEmbedding: x sqrt(hidden), compute dtype
        positional="rope",
        positional_options=rope["full_attention"],
        layer_pattern=tuple(kinds[t] for t in types[:period]),
    )


def _gemma3_weights(files: CheckpointFiles, cfg: ModelConfig) -> Weights:
    yield "decoder.embed.embed.embedding", files.get("embed_tokens.weight")
    for i in range(cfg.num_decoder_layers):
        src, dst = f"layers.{i}", f"decoder.blocks.{i}"
        att = f"{dst}.self_attention"
        for hf, ours in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
            yield from _linear(files, f"{src}.self_attn.{hf}", f"{att}.{ours}", bias=False)
        yield from _linear(files, f"{src}.self_attn.o_proj", f"{att}.out", bias=False)
        yield from _norm(files, f"{src}.self_attn.q_norm", f"{att}.q_norm", bias=False)
        yield from _norm(files, f"{src}.self_attn.k_norm", f"{att}.k_norm", bias=False)
        for hf, ours in (
            ("input_layernorm", "self_attention_norm.norm"),
            ("post_attention_layernorm", "self_attention_norm.post_norm"),
            ("pre_feedforward_layernorm", "ffn_norm.norm"),
            ("post_feedforward_layernorm", "ffn_norm.post_norm"),
        ):
            yield from _norm(files, f"{src}.{hf}", f"{dst}.{ours}", bias=False)
        for hf, ours in (("gate_proj", "wi"), ("up_proj", "wu"), ("down_proj", "wo")):
            yield from _linear(files, f"{src}.mlp.{hf}", f"{dst}.ffn.{ours}", bias=False)
    yield from _norm(files, "norm", "decoder.final_norm", bias=False)
    yield from _head(files, cfg)


FAMILIES: tuple[Family, ...] = (
    Family(
        "gpt2",
        ("gpt2",),
        ("GPT2LMHeadModel",),
        "learned",
        _gpt2_config,
        _gpt2_weights,
        prefixes=("transformer.",),
        buffers=(r"h\.\d+\.attn\.(bias|masked_bias)", r"lm_head\.weight"),
    ),
    Family(
        "opt",
        ("opt",),
        ("OPTForCausalLM",),
        "learned",
        _opt_config,
        _opt_weights,
        prefixes=("model.",),
        buffers=(r"lm_head\.weight",),
        separator="eos",
        bos="bos_token",
    ),
    Family(
        "xglm",
        ("xglm",),
        ("XGLMForCausalLM",),
        "sinusoidal",
        _xglm_config,
        _xglm_weights,
        prefixes=("model.",),
        buffers=(r"embed_positions\.weights?", r"lm_head\.weight"),
        separator="eos",
    ),
    Family(
        "gpt_neox",
        ("gpt_neox",),
        ("GPTNeoXForCausalLM",),
        "rope",
        _neox_config,
        _neox_weights,
        prefixes=("gpt_neox.",),
        buffers=(r"layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)",),
    ),
    Family(
        "llama",
        ("llama", "mistral"),
        ("LlamaForCausalLM", "MistralForCausalLM"),
        "rope",
        _llama_config,
        _llama_weights,
        prefixes=("model.",),
        buffers=(r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"lm_head\.weight"),
        bos="tokenizer",
    ),
    Family(
        "qwen2",
        ("qwen2",),
        ("Qwen2ForCausalLM",),
        "rope",
        lambda f: _llama_config(f, qwen2=True),
        _llama_weights,
        prefixes=("model.",),
        buffers=(r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"lm_head\.weight"),
    ),
    Family(
        "bloom",
        ("bloom",),
        ("BloomForCausalLM",),
        "alibi",
        _bloom_config,
        _bloom_weights,
        prefixes=("transformer.",),
        buffers=(r"lm_head\.weight",),
    ),
    Family(
        "mpt",
        ("mpt",),
        ("MptForCausalLM",),
        "alibi",
        _mpt_config,
        _mpt_weights,
        prefixes=("transformer.",),
        buffers=(r"lm_head\.weight",),
    ),
    Family(
        "gemma3_text",
        ("gemma3_text",),
        ("Gemma3ForCausalLM",),
        "rope",
        _gemma3_config,
        _gemma3_weights,
        prefixes=("model.",),
        buffers=(r"lm_head\.weight",),
        bos="bos_token",
    ),
)


def family_of(config: Mapping[str, Any], *, where: str = "config.json") -> Family:
    """The `Family` of a ``config.json`` dict, from its ``model_type`` (and, if given, its
    ``architectures``); one line naming what is supported otherwise."""
    model_type = config.get("model_type")
    for family in FAMILIES:
        if isinstance(model_type, str) and model_type in family.model_types:
            archs = config.get("architectures") or list(family.architectures)
            if not isinstance(archs, list) or not set(map(str, archs)) & set(family.architectures):
                raise PretrainedError(
                    f"{where}: architectures={archs!r} is not a causal LM of the "
                    f"{family.name} family; supported: {list(family.architectures)}"
                )
            return family
    supported = sorted(t for f in FAMILIES for t in f.model_types)
    raise PretrainedError(
        f"{where}: model_type={model_type!r} is not supported; supported: {supported}"
    )


def model_config(config: Mapping[str, Any], *, where: str = "config.json") -> ModelConfig:
    """The `ModelConfig` of a Hugging Face ``config.json`` dict (float32, no dropout)."""
    family = family_of(config, where=where)
    try:
        return family.config(Fields(family.name, config))
    except PretrainedError:
        raise
    except ValueError as e:  # a ModelConfig / RoPE refusal: keep its one line, add the family
        raise PretrainedError(f"{family.name} {where}: {e}") from None
