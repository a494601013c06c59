"""Autoregressive generation with a key-value cache, compiled as one ``jax.lax`` loop.

`generate` prefills the prompt into a `flaxformer_lite.core.kv_cache.DecoderCache` in one
forward pass, then decodes one token per iteration of a ``lax.while_loop`` (no Python loop
per token). The logits it samples from equal those of one full forward pass over the tokens
it feeds (prompt + continuation without its last token), for every registered positional
encoding: rotations and biases see the true query and key positions, added encodings the
position being generated (see `flaxformer_lite.core.kv_cache`).

Example::

    tokens = generate(model, prompt, max_new_tokens=200)                   # greedy
    tokens = generate(model, prompt, max_new_tokens=200, temperature=0.8,
                      top_k=40, rng=jax.random.key(0))                     # sampling
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from flaxformer_lite.base.checks import check_positive_int
from flaxformer_lite.core.positions import as_batched_positions
from flaxformer_lite.nn.models import DecoderOnlyLM, EncoderDecoder

Array = jax.Array


def generate(
    model: DecoderOnlyLM | EncoderDecoder,
    prompt: Any,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    rng: Array | None = None,
    stop_byte: int | None = None,
    positions: Any = None,
    src: Any = None,
    src_positions: Any = None,
    src_valid: Any = None,
    return_lengths: bool = False,
) -> Array | tuple[Array, Array]:
    """Continue ``prompt`` by ``max_new_tokens`` tokens per row.

    Args:
      model: a `DecoderOnlyLM`, or an `EncoderDecoder` (then ``prompt`` is the decoder's
        start tokens, e.g. the one start/BOS byte the model was trained with, and ``src``
        is the source it attends to).
      prompt: int ``[batch, prompt_len]``, ``prompt_len >= 1``; every row has the same
        length (no padding).
      max_new_tokens: number of tokens to generate, >= 1.
      temperature: 0 for greedy decoding (argmax); > 0 samples from
        ``softmax(logits / temperature)``.
      top_k: sample only among the ``top_k`` most likely tokens (None: all).
      rng: a ``jax.random`` key, required when ``temperature > 0``; step ``t`` uses
        ``fold_in(rng, t)``, so a key reproduces its samples.
      stop_byte: optional token id. A row that emits it has finished: it keeps emitting
        ``stop_byte`` (so everything after a row's first ``stop_byte`` is ``stop_byte``
        padding), and decoding stops early once every row has finished.
      positions: int ``[batch, prompt_len + max_new_tokens - 1]`` (or without the batch
        axis), the positions of the tokens fed to the model: the prompt, then each
        generated token but the last. Default ``0, 1, 2, ...``.
      src, src_positions, src_valid: EncoderDecoder only: source tokens int ``[batch, s]``,
        their positions (default ``0..s-1``) and validity flags bool ``[batch, s]``.
      return_lengths: also return the number of tokens of each row up to and including its
        first ``stop_byte`` (``max_new_tokens`` for a row that never emitted it).

    Returns:
      int32 ``[batch, max_new_tokens]`` (and int32 ``[batch]`` lengths).

    Raises:
      ValueError: on bad arguments, or when the model's positional encoding cannot encode
        the positions generation needs (a learned table with fewer than
        ``prompt_len + max_new_tokens - 1`` rows: the last generated token is never fed
        back, so it needs no row).
    """
    encoder_decoder = isinstance(model, EncoderDecoder)
    if not encoder_decoder and not isinstance(model, DecoderOnlyLM):
        raise ValueError(
            f"model must be a DecoderOnlyLM or an EncoderDecoder; got {type(model).__name__}"
        )
    cfg = model.cfg
    prompt = _int_array("prompt", prompt, rank=2)
    batch, prompt_len = prompt.shape
    if batch < 1 or prompt_len < 1:
        raise ValueError(f"prompt has shape {prompt.shape}; need [batch >= 1, prompt_len >= 1]")
    max_new_tokens = check_positive_int("max_new_tokens", max_new_tokens)
    temperature = _check_temperature(temperature)
    if temperature > 0 and rng is None:
        raise ValueError(f"temperature={temperature} samples: pass rng=jax.random.key(seed)")
    if top_k is not None and (
        isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= cfg.vocab_size
    ):
        raise ValueError(f"top_k={top_k!r}: must be None or an int in [1, {cfg.vocab_size}]")
    if stop_byte is not None and (
        isinstance(stop_byte, bool)
        or not isinstance(stop_byte, int | np.integer)
        or not 0 <= stop_byte < cfg.vocab_size
    ):
        raise ValueError(
            f"stop_byte={stop_byte!r}: must be None or an int in [0, {cfg.vocab_size})"
        )
    capacity = prompt_len + max_new_tokens - 1  # tokens fed: the last one is never fed back
    positions = _fed_positions(positions, batch, capacity)
    _check_positions_encodable(model, capacity)
    src_args = None
    if encoder_decoder:
        src_args = _source_args(src, src_positions, src_valid, batch)
    elif src is not None or src_positions is not None or src_valid is not None:
        raise ValueError("src / src_positions / src_valid are for an EncoderDecoder only")

    graphdef, state = nnx.split(model)
    greedy = temperature == 0
    key = jax.random.key(0) if rng is None else rng
    tokens, lengths = _generate_jit(
        graphdef,
        state,
        prompt,
        positions,
        key,
        jnp.float32(temperature if not greedy else 1.0),
        src_args,
        max_new_tokens=max_new_tokens,
        greedy=greedy,
        top_k=top_k,
        stop_byte=None if stop_byte is None else int(stop_byte),
    )
    return (tokens, lengths) if return_lengths else tokens


def sample_logits(
    logits: Array, key: Array, *, temperature: Array | float, top_k: int | None, greedy: bool
) -> Array:
    """One token per row from float logits ``[batch, vocab]`` -> int32 ``[batch]``.

    Greedy: argmax. Otherwise a categorical draw from ``softmax(logits / temperature)``,
    restricted to the ``top_k`` largest logits when given (exactly ``top_k`` candidates;
    ties at the boundary resolved by `jax.lax.top_k`).
    """
    logits = logits.astype(jnp.float32)
    if greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    scaled = logits / jnp.asarray(temperature, jnp.float32)
    if top_k is None:
        return jax.random.categorical(key, scaled, axis=-1).astype(jnp.int32)
    values, indices = jax.lax.top_k(scaled, top_k)  # [batch, k] each
    choice = jax.random.categorical(key, values, axis=-1)  # [batch]
    return jnp.take_along_axis(indices, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)


@functools.partial(
    jax.jit, static_argnames=("graphdef", "max_new_tokens", "greedy", "top_k", "stop_byte")
)
def _generate_jit(
    graphdef,
    state,
    prompt: Array,
    positions: Array,
    key: Array,
    temperature: Array,
    src_args: tuple[Array, Array, Array] | None,
    *,
    max_new_tokens: int,
    greedy: bool,
    top_k: int | None,
    stop_byte: int | None,
):
    model = nnx.merge(graphdef, state)
    batch, prompt_len = prompt.shape
    capacity = positions.shape[1]
    if src_args is None:
        cache = model.init_cache(batch, capacity, positions=positions)
    else:
        src, src_positions, src_valid = src_args
        cache = model.init_cache(
            src, src_positions, capacity=capacity, src_valid=src_valid, positions=positions
        )
    logits, cache = model.decode_step(prompt, positions[:, :prompt_len], cache)  # prefill
    pad = 0 if stop_byte is None else stop_byte
    out = jnp.full((batch, max_new_tokens), pad, jnp.int32)
    done = jnp.zeros((batch,), bool)
    lengths = jnp.full((batch,), max_new_tokens, jnp.int32)

    def emit(step, logits, out, done, lengths):
        """Choose token ``step`` of every row from its logits ``[batch, vocab]``."""
        token = sample_logits(
            logits,
            jax.random.fold_in(key, step),
            temperature=temperature,
            top_k=top_k,
            greedy=greedy,
        )
        if stop_byte is not None:
            token = jnp.where(done, stop_byte, token)
            stops = ~done & (token == stop_byte)
            lengths = jnp.where(stops, step + 1, lengths)
            done = done | stops
        out = jax.lax.dynamic_update_slice(out, token[:, None], (0, step))
        return token, out, done, lengths

    def cond(carry):
        step, _, _, done, _, _ = carry
        keep_going = step < max_new_tokens - 1  # the last token is emitted after the loop
        if stop_byte is not None:
            keep_going = keep_going & ~jnp.all(done)
        return keep_going

    def body(carry):
        step, logits, out, done, lengths, cache = carry
        token, out, done, lengths = emit(step, logits, out, done, lengths)
        position = jax.lax.dynamic_slice_in_dim(positions, prompt_len + step, 1, axis=1)
        logits, cache = model.decode_step(token[:, None], position, cache)
        return step + 1, logits[:, -1], out, done, lengths, cache

    carry = (jnp.zeros((), jnp.int32), logits[:, -1], out, done, lengths, cache)
    step, logits, out, done, lengths, _ = jax.lax.while_loop(cond, body, carry)
    # The last token (or, after an early stop, a stop byte over the padding).
    _, out, _, lengths = emit(step, logits, out, done, lengths)
    return out, lengths


def _int_array(name: str, value: Any, *, rank: int) -> Array:
    array = jnp.asarray(value)
    if array.ndim != rank or not jnp.issubdtype(array.dtype, jnp.integer):
        raise ValueError(
            f"{name} must be an int array of rank {rank}; got shape {array.shape} "
            f"dtype {array.dtype}"
        )
    return array.astype(jnp.int32)


def _check_temperature(temperature: Any) -> float:
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, int | float | np.floating)
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise ValueError(f"temperature={temperature!r}: must be a finite number >= 0")
    return float(temperature)


def _fed_positions(positions: Any, batch: int, capacity: int) -> Array:
    if positions is None:
        return jnp.broadcast_to(jnp.arange(capacity, dtype=jnp.int32)[None, :], (batch, capacity))
    try:
        positions = as_batched_positions(positions, name="positions", length=capacity, batch=batch)
    except ValueError as err:  # the prompt, then each generated token but the last, is fed
        raise ValueError(f"{err} (length = prompt_len + max_new_tokens - 1)") from None
    return jnp.broadcast_to(positions.astype(jnp.int32), (batch, capacity))


def _check_positions_encodable(model: nnx.Module, length: int) -> None:
    """Refuse, before anything is traced, to feed more tokens than the model's encoding can
    encode (its registry capacity, e.g. a learned table's rows): inside the loop such a
    table would gather NaN rows."""
    cfg = model.cfg
    capacity = cfg.encoding.capacity(cfg.positional_options)
    if capacity is not None and length > capacity:
        name = cfg.encoding.capacity_field
        field = f"ModelConfig.positional_options.{name}"
        value = getattr(cfg.positional_options, name, capacity)
        encodes = "" if value == capacity else f", which encodes {capacity} positions"
        raise ValueError(
            f"generate: prompt_len + max_new_tokens - 1 = {length} tokens are fed to the "
            f"model, more than its positional encoding can encode ({cfg.positional!r}: "
            f"{field}={value}{encodes})"
        )


def _source_args(src: Any, src_positions: Any, src_valid: Any, batch: int):
    if src is None:
        raise ValueError("an EncoderDecoder needs src (int [batch, src_len])")
    src = _int_array("src", src, rank=2)
    if src.shape[0] != batch or src.shape[1] < 1:
        raise ValueError(f"src has shape {src.shape}; need [batch={batch}, src_len >= 1]")
    if src_positions is None:
        src_positions = jnp.arange(src.shape[1], dtype=jnp.int32)
    src_positions = as_batched_positions(
        src_positions, name="src_positions", length=src.shape[1], batch=batch
    )
    src_positions = jnp.broadcast_to(src_positions.astype(jnp.int32), src.shape)
    if src_valid is None:
        src_valid = jnp.ones(src.shape, bool)
    src_valid = jnp.asarray(src_valid)
    if src_valid.shape != src.shape:
        raise ValueError(f"src_valid shape {src_valid.shape} must equal src shape {src.shape}")
    return src, src_positions, src_valid.astype(bool)
