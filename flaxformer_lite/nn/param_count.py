"""Parameter counts of the models in `flaxformer_lite.nn.models`, by arithmetic on the config.

`count_parameters` gives the number of ``nnx.Param`` elements a model of a `ModelConfig` has,
equal to tracing it (``nnx.eval_shape`` and summing the parameter sizes; the tests compare the
two over a grid of configs) but in microseconds for any size: ``num_decoder_layers=10**6`` or
``d_model=10**9`` are counted, not built. With ``d`` = ``d_model``, ``H`` heads of width
``hd = d // H``, ``KV`` key/value heads, ``f`` = ``d_ff``, ``V`` = ``vocab_size``:

* attention: query ``d x H hd``, key and value ``d x KV hd`` each, output ``H hd x d``, with
  biases ``H hd + 2 KV hd`` (``qkv_bias``) and ``d`` (``out_bias``);
* feed-forward: ``wi`` ``d x f``, ``wo`` ``f x d``, and ``wu`` ``d x f`` when gated, with
  biases ``f`` per input projection and ``d`` (``ffn_bias``);
* a norm: ``scale`` ``d`` and, for a LayerNorm with ``norm_bias``, ``bias`` ``d``;
* a block: self-attention and feed-forward with a norm each (+ cross-attention and its norm in
  an encoder-decoder's decoder); the parallel residual has the same modules;
* a stack: its blocks, the positional encoding's own parameters (the registry entry's
  ``num_params``; an encoding without one is traced alone, which is cheap), the embedding
  norm (``embedding_norm``) and the final norm (pre-LN);
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


def norm_params(cfg: Any) -> int:
    """One norm over ``d_model``: LayerNorm scale (+ bias), RMSNorm scale."""
    d = cfg.d_model
    rms = getattr(cfg, "norm_type", "layer") == "rms"
    return d if rms or not getattr(cfg, "norm_bias", True) else 2 * d


def attention_params(cfg: Any) -> int:
    """One `MultiHeadAttention`: query, key, value and output projections (+ biases)."""
    d, heads = cfg.d_model, cfg.num_heads
    kv_heads = getattr(cfg, "num_kv_heads", None) or heads
    hd = d // heads
    q, kv = heads * hd, kv_heads * hd
    n = d * q + 2 * d * kv + q * d
    if _bias(cfg, "qkv"):
        n += q + 2 * kv
    if _bias(cfg, "out"):
        n += d
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
    return attention + ffn_params(cfg) + sublayers * norm_params(cfg)


def embedding_params(cfg: Any) -> int:
    """The token embedding and, untied, the output head (+ its bias)."""
    v, d = cfg.vocab_size, cfg.d_model
    n = v * d
    if not getattr(cfg, "tie_embeddings", True):
        n += d * v + (v if _bias(cfg, "head") else 0)
    return n


def encoding_params(cfg: Any) -> int:
    """The positional encoding's own parameters (one stack's): its registry entry's
    ``num_params(dims, options)``, else the encoding module traced alone."""
    spec = cfg.encoding
    if spec.num_params is not None:
        return int(spec.num_params(cfg.dims, cfg.positional_options))
    return _traced_encoding_params(cfg)


def _traced_encoding_params(cfg: Any) -> int:
    import jax
    from flax import nnx

    abstract = nnx.eval_shape(lambda: cfg.encoding.build(cfg, rngs=nnx.Rngs(0)))
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
    (default `encoding_params`)."""
    if model not in MODELS:
        raise ValueError(f"model={model!r}; allowed: {list(MODELS)}")
    enc = encoding_params(cfg) if encoding is None else encoding
    n = embedding_params(cfg)
    if model == "encoder_decoder":
        n += stack_params(cfg, cfg.num_encoder_layers, cross_attention=False, encoding=enc)
        n += stack_params(cfg, cfg.num_decoder_layers, cross_attention=True, encoding=enc)
    else:
        n += stack_params(cfg, cfg.num_decoder_layers, cross_attention=False, encoding=enc)
    return n
