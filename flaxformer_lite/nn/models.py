"""Transformer models as NNX modules: Encoder, Decoder, EncoderDecoder, DecoderOnlyLM.

All models take token ids ``[batch, length]`` and int positions ``[batch, length]`` or
``[length]`` (shared by the batch); left out, they are `default_positions` ``0..L-1``
(the explicit form is needed for anything else, e.g. randomized positions). Validity
flags ``[batch, length]`` (True = real token) mark padding. Logits are float32
``[batch, length, vocab]``.

The positional encoding is built from the registry by ``cfg.positional``; each stack owns
one instance and hands it to its blocks, which call its hooks (DESIGN.md §3). A decoder with
a ``cfg.layer_pattern`` gives each layer its own encoding and attention span
(`ModelConfig.layer_kinds`): every distinct (encoding, options) is built once, shared by the
layers that use it -- the model-wide one stays ``pe``, the others are ``layer_pe[i]`` -- and
an encoding built per layer (`EncodingSpec.per_layer`) lives in its block (``blocks[i].pe``).

Dropout (``cfg.dropout_rate``, on the embeddings and each sub-layer's output) follows NNX's
modes: a model starts in eval mode (no dropout: evaluation, generation and the pretrained
parity tests call it as built); ``model.train()`` turns dropout on and ``model.eval()`` off
(`flax.nnx.Module.train`). A call's ``deterministic=True/False`` overrides the mode for that
call (the training step passes ``False``, evaluation ``True``); None follows the mode.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
from flax import nnx

from flaxformer_lite.core import attention
from flaxformer_lite.core.kv_cache import CrossKVCache, DecoderCache, KVCache, slot_positions
from flaxformer_lite.core.positions import as_batched_positions
from flaxformer_lite.nn.encodings.base import PositionalEncoding
from flaxformer_lite.nn.layers import DecoderBlock, EncoderBlock, TokenEmbedding, _norm
from flaxformer_lite.nn.model_config import ModelConfig
from flaxformer_lite.nn.schedules import ResolvedLayer

Array = jax.Array


def default_positions(tokens: Array) -> Array:
    """``0..L-1`` as int32 ``[batch, L]`` for ``tokens`` ``[batch, L]``: the positions a model
    uses when none are passed."""
    batch, length = tokens.shape
    return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32)[None, :], (batch, length))


def _positions(tokens: Array, positions: Array | None, name: str = "positions") -> Array:
    """int32 ``[batch, length]`` positions for ``tokens``: ``[length]`` or ``[batch or 1,
    length]`` broadcast, None -> `default_positions`; a ValueError naming ``name`` else."""
    if positions is None:
        return default_positions(tokens)
    positions = as_batched_positions(
        positions, name=name, length=tokens.shape[1], batch=tokens.shape[0]
    )
    return jnp.broadcast_to(positions, tokens.shape)


def _check_tokens(tokens: Array) -> None:
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(
            f"tokens must be int [batch, length]; got shape {tokens.shape} dtype {tokens.dtype}"
        )


class _Stack(nnx.Module):
    """Shared plumbing: embedding + positional encoding (+ embedding norm) + dropout, final
    norm for pre-LN."""

    def _init_stack(
        self,
        cfg: ModelConfig,
        embed: TokenEmbedding | None,
        rngs: nnx.Rngs,
        layers: tuple[ResolvedLayer, ...] = (),
    ):
        """``layers``: the decoder's resolved layers (`ModelConfig.layer_kinds`); their
        encodings other than the model-wide one are built here, once per distinct (name,
        options), in ``layer_pe`` (None when there are none)."""
        self.cfg = cfg
        self.embed = TokenEmbedding(cfg, rngs=rngs) if embed is None else embed
        # the model-wide encoding: the embeddings' add hook and the layers that inherit it;
        # one built per layer has no stack-wide instance (the identity at every hook)
        spec = cfg.encoding
        self.pe = PositionalEncoding() if spec.per_layer else spec.build(cfg, rngs=rngs)
        model_wide = (cfg.positional, cfg.positional_options)
        shared: dict[tuple, int] = {} if spec.per_layer else {model_wide: 0}
        extra, index = [], []
        for layer in layers:
            key = (layer.positional, layer.positional_options)
            if layer.encoding.per_layer:
                index.append(None)  # the block builds and owns it
                continue
            if key not in shared:
                shared[key] = len(extra) + 1
                extra.append(layer.encoding.build_with(cfg.dims, key[1], rngs=rngs))
            index.append(shared[key])
        self.layer_pe = nnx.List(extra) if extra else None
        self.layer_pe_index = tuple(index)  # per layer: 0 = pe, i = layer_pe[i-1], None = own
        # BLOOM's word_embeddings_layernorm: a norm of the embeddings before the first block
        self.embed_norm = _norm(cfg, rngs=rngs) if cfg.embedding_norm else None
        self.dropout = nnx.Dropout(cfg.dropout_rate, deterministic=True, rngs=rngs)
        self.final_norm = _norm(cfg, rngs=rngs) if cfg.norm == "pre" else None

    def layer_encoding(self, i: int) -> PositionalEncoding:
        """The positional encoding block ``i`` calls the hooks of."""
        j = self.layer_pe_index[i] if self.layer_pe_index else 0
        if j is None:
            return self.blocks[i].pe
        return self.pe if j == 0 else self.layer_pe[j - 1]

    def _embed(self, tokens: Array, positions: Array, deterministic: bool | None) -> Array:
        """Embed (scaled), add the add-hook encoding, embedding norm, dropout."""
        x_BTD = self.pe.add(self.embed.encode(tokens), positions)
        if self.embed_norm is not None:
            x_BTD = self.embed_norm(x_BTD)
        return self.dropout(x_BTD, deterministic=deterministic)

    def _finish(self, x: Array) -> Array:
        return x if self.final_norm is None else self.final_norm(x)


class Encoder(_Stack):
    """A stack of bidirectional `EncoderBlock` s (BERT-style): tokens -> ``[b, l, d_model]``."""

    def __init__(self, cfg: ModelConfig, *, embed: TokenEmbedding | None = None, rngs: nnx.Rngs):
        if cfg.encoding.causal_only:
            raise ValueError(
                f"ModelConfig.positional={cfg.positional!r} is defined only for causal "
                "attention and cannot be used in a bidirectional Encoder"
            )
        if cfg.attention_window is not None:
            raise ValueError(
                f"ModelConfig.attention_window={cfg.attention_window}: a window applies to "
                "causal self-attention only, not to a bidirectional Encoder"
            )
        if cfg.layer_pattern:
            raise ValueError(
                "ModelConfig.layer_pattern: per-layer schedules apply to causal decoder stacks "
                "(DecoderOnlyLM), not to a bidirectional Encoder"
            )
        if cfg.attention_temperature != "none":
            raise ValueError(
                f"ModelConfig.attention_temperature={cfg.attention_temperature!r}: a query "
                "factor of the position (or of the keys seen so far) is defined for causal "
                "decoder stacks, not for a bidirectional Encoder"
            )
        if cfg.encoding.per_layer:
            raise ValueError(
                f"ModelConfig.positional={cfg.positional!r} is built per decoder layer; an "
                "Encoder takes an encoding shared by its blocks"
            )
        self._init_stack(cfg, embed, rngs)
        self.blocks = nnx.List(
            [EncoderBlock(cfg, rngs=rngs) for _ in range(cfg.num_encoder_layers)]
        )

    def __call__(
        self,
        tokens: Array,
        positions: Array | None = None,
        *,
        valid: Array | None = None,
        deterministic: bool | None = None,
    ) -> Array:
        """tokens ``[b, l]``, positions ``[b, l]`` or ``[l]`` (default ``0..l-1``), valid
        ``[b, l]`` bool -> ``[b, l, d]``."""
        _check_tokens(tokens)
        positions = _positions(tokens, positions)
        mask_B1TS = None if valid is None else attention.padding_mask(valid)
        x_BTD = self._embed(tokens, positions, deterministic)
        for block in self.blocks:
            x_BTD = block(x_BTD, positions, pe=self.pe, mask=mask_B1TS, deterministic=deterministic)
        return self._finish(x_BTD)


class Decoder(_Stack):
    """A stack of causal `DecoderBlock` s, with cross-attention to an encoder if asked."""

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        cross_attention: bool = True,
        embed: TokenEmbedding | None = None,
        rngs: nnx.Rngs,
    ):
        layers = cfg.layer_kinds()
        self._init_stack(cfg, embed, rngs, layers)
        self.has_cross_attention = cross_attention
        self.blocks = nnx.List(
            [
                DecoderBlock(cfg, cross_attention=cross_attention, layer=layer, rngs=rngs)
                for layer in layers
            ]
        )

    def __call__(
        self,
        tokens: Array,
        positions: Array | None = None,
        *,
        valid: Array | None = None,
        encoded: Array | None = None,
        encoded_positions: Array | None = None,
        encoded_valid: Array | None = None,
        deterministic: bool | None = None,
    ) -> Array:
        """tokens ``[b, l]`` (+ ``encoded`` ``[b, s, d]``) -> hidden states ``[b, l, d]``.

        ``positions`` int ``[b, l]`` or ``[l]`` and ``encoded_positions`` ``[b, s]`` or
        ``[s]``; each defaults to ``0..length-1``.
        """
        _check_tokens(tokens)
        positions = _positions(tokens, positions)
        mask_B1TS = None if valid is None else attention.padding_mask(valid)
        cross_mask_B1TS = None
        if self.has_cross_attention:
            if encoded is None:
                raise ValueError("Decoder(cross_attention=True) needs `encoded` [b, s, d]")
            encoded_positions = _positions(
                encoded[..., 0], encoded_positions, name="encoded_positions"
            )
            if encoded_valid is not None:
                q_valid = jnp.ones(tokens.shape, bool) if valid is None else valid
                cross_mask_B1TS = attention.padding_mask(q_valid, encoded_valid)
        x_BTD = self._embed(tokens, positions, deterministic)
        for i, block in enumerate(self.blocks):
            x_BTD = block(
                x_BTD,
                positions,
                pe=self.layer_encoding(i),
                mask=mask_B1TS,
                encoded=encoded,
                encoded_positions=encoded_positions,
                cross_mask=cross_mask_B1TS,
                deterministic=deterministic,
            )
        return self._finish(x_BTD)

    # ------------------------------------------------------------------ cached decoding

    def init_cache(
        self, batch: int, capacity: int, *, positions: Array | None = None
    ) -> tuple[KVCache, ...]:
        """Empty self-attention caches, one per block, for ``capacity`` tokens: ``capacity``
        slots for a global layer, ``min(W or C, capacity)`` (a ring buffer) for a layer with a
        sliding window W or chunk C.

        ``positions``: the positions the tokens will have, int ``[batch, capacity]`` or
        ``[capacity]`` (default ``0..capacity-1``); see `flaxformer_lite.core.kv_cache`.
        """
        positions = slot_positions(batch, capacity, positions)
        return tuple(
            block.self_attention.init_cache(
                batch, capacity, positions=positions, dtype=self.cfg.compute_dtype
            )
            for block in self.blocks
        )

    def cross_cache(
        self, encoded: Array, encoded_positions: Array, encoded_valid: Array | None = None
    ) -> tuple[CrossKVCache, ...]:
        """Each block's cross-attention keys/values of ``encoded`` ``[b, s, d]`` (computed
        once per source); ``encoded_positions`` int ``[b, s]`` or ``[s]``, ``encoded_valid``
        bool ``[b, s]``."""
        if not self.has_cross_attention:
            raise ValueError("Decoder(cross_attention=False) has no cross-attention to cache")
        encoded_positions = as_batched_positions(
            encoded_positions,
            name="encoded_positions",
            length=encoded.shape[1],
            batch=encoded.shape[0],
        )
        encoded_positions = jnp.broadcast_to(encoded_positions, encoded.shape[:2])
        return tuple(
            block.cross_attention.cross_cache(encoded, encoded_positions, encoded_valid)
            for block in self.blocks
        )

    def decode_step(
        self, tokens: Array, positions: Array, cache: DecoderCache
    ) -> tuple[Array, DecoderCache]:
        """`__call__` for ``l`` new tokens ``[b, l]`` at positions ``[b, l]`` (or ``[l]``)
        through the cache: returns hidden states ``[b, l, d]`` and the updated cache.

        Prefill a prompt with ``l = prompt length``, then decode with ``l = 1``. The states
        equal those of `__call__` over every token written so far (inference: no dropout).
        """
        _check_tokens(tokens)
        positions = _positions(tokens, positions).astype(jnp.int32)
        if len(cache.self_attention) != len(self.blocks):
            raise ValueError(
                f"cache has {len(cache.self_attention)} layers; the decoder has {len(self.blocks)}"
            )
        if self.has_cross_attention and cache.cross_attention is None:
            raise ValueError("Decoder(cross_attention=True) needs cache.cross_attention")
        cross = cache.cross_attention or (None,) * len(self.blocks)
        x_BTD = self._embed(tokens, positions, True)
        layers = []
        for i, (block, layer_cache, layer_cross) in enumerate(
            zip(self.blocks, cache.self_attention, cross, strict=True)
        ):
            x_BTD, layer_cache = block.decode_step(
                x_BTD, positions, layer_cache, pe=self.layer_encoding(i), cross=layer_cross
            )
            layers.append(layer_cache)
        return self._finish(x_BTD), cache._replace(self_attention=tuple(layers))


class DecoderOnlyLM(nnx.Module):
    """GPT-style causal language model: tokens -> float32 next-token logits ``[b, l, vocab]``.

    ``DecoderOnlyLM(cfg, rngs=nnx.Rngs(0))`` builds it; ``model(tokens)`` with int tokens
    ``[b, l]`` returns the logits at positions ``0..l-1``, ``model(tokens, positions)`` at
    int positions ``[l]`` or ``[b, l]``. `init_cache` and `decode_step` decode with a
    key-value cache (`flaxformer_lite.generate` drives them).
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.decoder = Decoder(cfg, cross_attention=False, rngs=rngs)

    def __call__(
        self,
        tokens: Array,
        positions: Array | None = None,
        *,
        valid: Array | None = None,
        deterministic: bool | None = None,
    ) -> Array:
        """tokens int ``[b, l]``, positions int ``[b, l]`` or ``[l]`` (default ``0..l-1``),
        valid bool ``[b, l]`` (True = real token) -> float32 logits ``[b, l, vocab]``."""
        h_BTD = self.decoder(tokens, positions, valid=valid, deterministic=deterministic)
        return self.logits(h_BTD)

    def logits(self, h_BTD: Array) -> Array:
        """The decoder's final hidden states ``[b, l, d_model]`` -> float32 logits
        ``[b, l, vocab]`` (evaluation maps them a slice of positions at a time: never the
        whole ``[b, l, vocab]`` at once)."""
        return self.decoder.embed.decode(h_BTD)

    def init_cache(
        self, batch: int, capacity: int, *, positions: Array | None = None
    ) -> DecoderCache:
        """An empty `DecoderCache` for ``capacity`` tokens (prompt + generated) per row;
        ``positions`` int ``[batch, capacity]`` are the positions the slots will hold
        (default ``0..capacity-1``)."""
        return DecoderCache(self.decoder.init_cache(batch, capacity, positions=positions))

    def decode_step(
        self, tokens: Array, positions: Array, cache: DecoderCache
    ) -> tuple[Array, DecoderCache]:
        """Logits ``[b, l, vocab]`` (float32) of ``l`` new tokens ``[b, l]`` at positions
        ``[b, l]``, and the updated cache. Equal to `__call__` over all tokens so far."""
        h, cache = self.decoder.decode_step(tokens, positions, cache)
        return self.logits(h), cache


class EncoderDecoder(nnx.Module):
    """The original Transformer (Vaswani et al. 2017): an Encoder and a cross-attending
    Decoder sharing one token embedding (and the output projection when tied)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        embed = TokenEmbedding(cfg, rngs=rngs)
        self.encoder = Encoder(cfg, embed=embed, rngs=rngs)
        self.decoder = Decoder(cfg, cross_attention=True, embed=embed, rngs=rngs)

    def encode(
        self,
        src: Array,
        src_positions: Array | None = None,
        *,
        src_valid=None,
        deterministic: bool | None = None,
    ) -> Array:
        """src ``[b, s]``, src_positions ``[b, s]`` or ``[s]`` (default ``0..s-1``) ->
        encoder states ``[b, s, d]``."""
        _check_tokens(src)
        src_positions = _positions(src, src_positions, name="src_positions")
        return self.encoder(src, src_positions, valid=src_valid, deterministic=deterministic)

    def __call__(
        self,
        src: Array,
        tgt: Array,
        *,
        src_positions: Array | None = None,
        tgt_positions: Array | None = None,
        src_valid: Array | None = None,
        tgt_valid: Array | None = None,
        deterministic: bool | None = None,
    ) -> Array:
        """src ``[b, s]``, tgt ``[b, t]`` (+ positions ``[b, len]`` or ``[len]``, default
        ``0..len-1``; validity) -> logits ``[b, t, vocab]``."""
        _check_tokens(src)
        _check_tokens(tgt)
        src_positions = _positions(src, src_positions, name="src_positions")
        tgt_positions = _positions(tgt, tgt_positions, name="tgt_positions")
        encoded_BSD = self.encode(
            src, src_positions, src_valid=src_valid, deterministic=deterministic
        )
        h_BTD = self.decoder(
            tgt,
            tgt_positions,
            valid=tgt_valid,
            encoded=encoded_BSD,
            encoded_positions=src_positions,
            encoded_valid=src_valid,
            deterministic=deterministic,
        )
        return self.decoder.embed.decode(h_BTD)

    def init_cache(
        self,
        src: Array,
        src_positions: Array | None = None,
        *,
        capacity: int,
        src_valid: Array | None = None,
        positions: Array | None = None,
    ) -> DecoderCache:
        """Encode ``src`` ``[b, s]`` once and return a `DecoderCache` holding every decoder
        block's cross-attention keys/values and empty self-attention caches of ``capacity``
        target tokens (planned target ``positions`` ``[b, capacity]``, default
        ``0..capacity-1``); ``src_positions`` ``[b, s]`` or ``[s]`` (default ``0..s-1``)."""
        _check_tokens(src)
        src_positions = _positions(src, src_positions, name="src_positions")
        encoded = self.encode(src, src_positions, src_valid=src_valid)
        return DecoderCache(
            self.decoder.init_cache(src.shape[0], capacity, positions=positions),
            self.decoder.cross_cache(encoded, src_positions, src_valid),
        )

    def decode_step(
        self, tokens: Array, positions: Array, cache: DecoderCache
    ) -> tuple[Array, DecoderCache]:
        """Target logits ``[b, l, vocab]`` of ``l`` new target tokens ``[b, l]`` at positions
        ``[b, l]``, and the updated cache. Equal to `__call__` over the source and all
        target tokens so far."""
        h, cache = self.decoder.decode_step(tokens, positions, cache)
        return self.decoder.embed.decode(h), cache


def _show_init_signature(cls: type) -> None:
    """Make ``help(cls)`` / `inspect.signature` show ``cls.__init__``'s arguments: NNX's
    metaclass constructs modules through a ``(*args, **kwargs)`` ``__call__``, which would
    otherwise be what they show."""
    init = inspect.signature(cls.__init__)
    cls.__signature__ = init.replace(parameters=list(init.parameters.values())[1:])


for _cls in (Encoder, Decoder, DecoderOnlyLM, EncoderDecoder):
    _show_init_signature(_cls)
