"""Parameter counts of the models in `flaxformer_lite.nn.models`, by arithmetic on the config.

`count_parameters` gives the number of ``nnx.Param`` elements a model of a `ModelConfig` has,
equal to tracing it (``nnx.eval_shape`` and summing the parameter sizes; the tests compare the
two over a grid of configs) but in microseconds for any size: ``num_decoder_layers=10**6`` or
``d_model=10**9`` are counted, not built. With ``d`` = ``d_model``, ``H`` heads of width
``hd`` (``head_size``, else ``d // H``), ``KV`` key/value heads, ``f`` = ``d_ff``, ``V`` =
``vocab_size``:

* attention: query ``d x H hd``, key and value ``d x KV hd`` each, output ``H hd x d``, with
  biases ``H hd + 2 KV hd`` (``qkv_bias``) and ``d`` (``out_bias``), and with ``qk_norm``
  a norm over ``hd`` each for queries and keys; ``H`` sink logits for a self-attention
  with attention sinks (``attention_sinks``, a decoder layer's ``sinks``);
* feed-forward: ``wi`` ``d x f``, ``wo`` ``f x d``, and ``wu`` ``d x f`` when gated, with
  biases ``f`` per input projection and ``d`` (``ffn_bias``);
* a norm: ``scale`` ``d`` and, for a LayerNorm with ``norm_bias``, ``bias`` ``d``;
* a block: self-attention and feed-forward with a norm each, two with ``sandwich_norm`` (+
  cross-attention and its norm(s) in an encoder-decoder's decoder); the parallel residual has
  the same modules;
* a stack: its blocks, the positional encoding's own parameters (the registry entry's
  ``num_params``; an encoding without one is traced alone, which is cheap), the embedding
  norm (``embedding_norm``) and the final norm (pre-LN); a decoder with a ``layer_pattern``
  also each other distinct (encoding, options) of its layers once, and an encoding built
  per layer (``EncodingSpec.per_layer``) once per layer using it;
* the token embedding ``V x d`` (shared by an encoder-decoder's stacks) and, untied, the
  head ``d x V`` with its bias ``V`` (``head_bias``).

The config is read with ``getattr`` and today's defaults, so this also counts a config object
of an older version (no ``norm_type``, ``ffn_gated``, ``num_kv_heads``, per-projection biases).
"""

from __future__ import annotations

import math
from typing import Any

MODELS = ("decoder_only", "encoder_decoder")


def _bias(cfg: Any, projection: str) -> bool:
    """Whether ``projection`` ("qkv", "out", "ffn", "head") has a bias: its own field or
    ``use_bias``."""
    value = getattr(cfg, f"{projection}_bias", None)
    return bool(getattr(cfg, "use_bias", True) if value is None else value)


def norm_params(cfg: Any, dim: int | None = None) -> int:
    """One norm over ``dim`` (default ``d_model``): LayerNorm scale (+ bias), RMSNorm (and
    Gemma's) scale."""
    d = cfg.d_model if dim is None else dim
    layer_norm = getattr(cfg, "norm_type", "layer") == "layer"
    return 2 * d if layer_norm and getattr(cfg, "norm_bias", True) else d


def head_width(cfg: Any) -> int:
    """``head_size``, else ``d_model // num_heads`` (read field by field, as everywhere here)."""
    return getattr(cfg, "head_size", None) or cfg.d_model // cfg.num_heads


def attention_params(cfg: Any) -> int:
    """One `MultiHeadAttention`: query, key, value and output projections (+ biases), and
    the query / key norms (``qk_norm``)."""
    d, heads = cfg.d_model, cfg.num_heads
    kv_heads = getattr(cfg, "num_kv_heads", None) or heads
    hd = head_width(cfg)
    q, kv = heads * hd, kv_heads * hd
    n = d * q + 2 * d * kv + q * d
    if _bias(cfg, "qkv"):
        n += q + 2 * kv
    if _bias(cfg, "out"):
        n += d
    if getattr(cfg, "qk_norm", False):
        n += 2 * norm_params(cfg, hd)
    return n


def ffn_params(cfg: Any) -> int:
    """One `FeedForward`: ``wi`` (+ ``wu`` when gated) and ``wo`` (+ biases)."""
    d, f = cfg.d_model, cfg.d_ff
    bias = _bias(cfg, "ffn")
    inputs = 2 if getattr(cfg, "ffn_gated", False) else 1
    return inputs * (d * f + (f if bias else 0)) + f * d + (d if bias else 0)


def block_params(cfg: Any, *, cross_attention: bool = False) -> int:
    """One decoder (or encoder) block: attention + feed-forward, a norm each; + the
    cross-attention and its norm when ``cross_attention``."""
    sublayers = 3 if cross_attention else 2
    attention = (2 if cross_attention else 1) * attention_params(cfg)
    norms = 2 if getattr(cfg, "sandwich_norm", False) else 1
    return attention + ffn_params(cfg) + sublayers * norms * norm_params(cfg)


def embedding_params(cfg: Any) -> int:
    """The token embedding and, untied, the output head (+ its bias)."""
    v, d = cfg.vocab_size, cfg.d_model
    n = v * d
    if not getattr(cfg, "tie_embeddings", True):
        n += d * v + (v if _bias(cfg, "head") else 0)
    return n


def encoding_params(cfg: Any) -> int:
    """The model-wide positional encoding's own parameters (one stack's): its registry
    entry's ``num_params(dims, options)``, else the encoding module traced alone."""
    return _spec_params(cfg.encoding, cfg.dims, cfg.positional_options)


def layer_encoding_params(cfg: Any) -> int:
    """A decoder's encoding parameters beyond the model-wide encoding's, from its
    ``layer_pattern``: each other distinct (encoding, options) of its layers once, an
    encoding built per layer (``EncodingSpec.per_layer``) once per layer using it; minus the
    model-wide encoding when that one is built per layer (the stack then holds none)."""
    pattern_kinds = getattr(cfg, "pattern_kinds", None)
    if pattern_kinds is None:  # a config of a version without layer patterns
        return 0
    spec, n_layers = cfg.encoding, cfg.num_decoder_layers
    kinds = pattern_kinds()
    model_wide = (cfg.positional, cfg.positional_options)
    n = -encoding_params(cfg) if spec.per_layer else 0
    seen = set() if spec.per_layer else {model_wide}
    for j, kind in enumerate(kinds):
        uses = n_layers // len(kinds) + (j < n_layers % len(kinds))  # layers cycling to kind j
        key = (kind.positional, kind.positional_options)
        if uses == 0 or (key in seen and not kind.encoding.per_layer):
            continue
        count = _spec_params(kind.encoding, cfg.dims, kind.positional_options)
        if kind.encoding.per_layer:
            n += uses * count
        else:
            seen.add(key)
            n += count
    return n


def layer_attention_params(cfg: Any) -> int:
    """A decoder's self-attention parameters beyond `attention_params`, per layer
    (``ModelConfig.layer_kinds``): ``H`` sink logits for a layer with attention sinks, ``H``
    SSMax factors for a layer with ``temperature="ssmax"``."""
    pattern_kinds = getattr(cfg, "pattern_kinds", None)
    if pattern_kinds is None:  # a config of a version without layer patterns
        return 0
    kinds, n_layers = pattern_kinds(), cfg.num_decoder_layers
    n = 0
    for j, layer in enumerate(kinds):
        uses = n_layers // len(kinds) + (j < n_layers % len(kinds))  # layers cycling to kind j
        per_layer = cfg.num_heads if getattr(layer, "sinks", False) else 0
        per_layer += cfg.num_heads if getattr(layer, "temperature", "none") == "ssmax" else 0
        n += uses * per_layer
    return n


def _spec_params(spec: Any, dims: Any, options: Any) -> int:
    if spec.num_params is not None:
        return int(spec.num_params(dims, options))
    return _traced_params(spec, dims, options)


def _traced_encoding_params(cfg: Any) -> int:
    return _traced_params(cfg.encoding, cfg.dims, cfg.positional_options)


def _traced_params(spec: Any, dims: Any, options: Any) -> int:
    import jax
    from flax import nnx

    abstract = nnx.eval_shape(lambda: spec.build_with(dims, options, rngs=nnx.Rngs(0)))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def stack_params(cfg: Any, layers: int, *, cross_attention: bool, encoding: int) -> int:
    """One `Encoder` / `Decoder` stack without its token embedding: ``layers`` blocks, the
    encoding's ``encoding`` parameters, the embedding norm and the final norm (pre-LN)."""
    n = layers * block_params(cfg, cross_attention=cross_attention) + encoding
    if getattr(cfg, "embedding_norm", False):
        n += norm_params(cfg)
    if getattr(cfg, "norm", "post") == "pre":
        n += norm_params(cfg)
    return n


def count_parameters(cfg: Any, model: str = "decoder_only", *, encoding: int | None = None) -> int:
    """Parameters of a ``model`` ("decoder_only": `DecoderOnlyLM`; "encoder_decoder":
    `EncoderDecoder`) of ``cfg``; ``encoding``: the encoding's parameter count if known
    (default `encoding_params`); the decoder adds `layer_encoding_params`."""
    if model not in MODELS:
        raise ValueError(f"model={model!r}; allowed: {list(MODELS)}")
    enc = encoding_params(cfg) if encoding is None else encoding
    dec = enc + layer_encoding_params(cfg) + layer_attention_params(cfg)
    n = embedding_params(cfg)
    if model == "encoder_decoder":
        n += stack_params(cfg, cfg.num_encoder_layers, cross_attention=False, encoding=enc)
        if getattr(cfg, "attention_sinks", False):  # the encoder's self-attention sinks
            n += cfg.num_encoder_layers * cfg.num_heads
        n += stack_params(cfg, cfg.num_decoder_layers, cross_attention=True, encoding=dec)
    else:
        n += stack_params(cfg, cfg.num_decoder_layers, cross_attention=False, encoding=dec)
    return n
