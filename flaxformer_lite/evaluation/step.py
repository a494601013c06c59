"""The jit-compiled evaluation step over a split NNX model, and the per-token loss it shares
with training (`flaxformer_lite.train.step` builds the training step on `token_losses`).

The model is split into a static ``graphdef`` and array state: ``params`` (the ``nnx.Param``
leaves) and ``rest`` (everything else, e.g. dropout RNG counters). Batches are dicts of
``inputs`` / ``targets`` int32 ``[batch, length]``, ``loss_mask`` float32 ``[batch, length]``
(1 = this target counts) and ``positions`` int32 ``[batch, length]``.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from flaxformer_lite.base import faults

Array = jax.Array


def split_model(model: nnx.Module) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
    """``(graphdef, params, rest)``: parameters apart from all other state."""
    return nnx.split(model, nnx.Param, ...)


def token_losses(logits: Array, targets: Array) -> tuple[Array, Array]:
    """Per-token cross-entropy in nats and 0/1 correctness, both float32 ``[batch, length]``."""
    logits = logits.astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    correct = (argmax_last(logits) == targets).astype(jnp.float32)
    return ce, correct


def argmax_last(x: Array) -> Array:
    """``jnp.argmax(x, axis=-1)`` (the first index of the maximum) for rows without NaN.

    One max, one compare-and-select and one integer min: XLA:CPU runs these as plain
    vectorised reductions, while ``argmax``'s (value, index) reduction is a slow variadic one
    (docs/performance.md §Accuracy). A row containing NaN gives the row size.
    """
    top = jnp.max(x, axis=-1, keepdims=True)
    index = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.min(jnp.where(x == top, index, x.shape[-1]), axis=-1)


def forward(graphdef, params, rest, batch, *, deterministic: bool):
    """Logits of ``batch`` and the model's updated non-parameter state."""
    model = nnx.merge(graphdef, params, rest)
    logits = model(batch["inputs"], batch["positions"], deterministic=deterministic)
    _, _, new_rest = split_model(model)
    return logits, new_rest


# Target positions whose logits exist at once when a model scores a window: a model with
# ``logits`` (`nn.models.DecoderOnlyLM`) maps its decoder's final hidden states to the
# vocabulary this many positions at a time, so a window of T tokens holds
# ``[batch, LOGIT_CHUNK, vocab]`` logits, not ``[batch, T, vocab]`` (SmolLM2's 49,152 tokens
# at 16k: 3.2 GB per window; Gemma 3's 262,144: 17 GB).
LOGIT_CHUNK = 512


def make_eval_step(graphdef: nnx.GraphDef, *, logit_chunk: int = LOGIT_CHUNK):
    """``eval_step(params, rest, batch) -> sums``: per-position sums over the batch.

    Returns ``loss_sum``, ``correct_sum`` and ``count`` (float32 ``[length]``: summed over the
    batch, only counted targets), ``predictions`` (int32 ``[batch, length]``, argmax) and the
    per-target ``token_loss`` / ``token_correct`` (float32 ``[batch, length]``, 0 where not
    counted) from which the per-block sums are made. A model with a ``logits`` method over
    its ``decoder``'s hidden states (`nn.models.DecoderOnlyLM`) is scored ``logit_chunk``
    positions at a time (`LOGIT_CHUNK`; the same numbers).
    """

    def eval_step(params, rest, batch):
        model = nnx.merge(graphdef, params, rest)
        if not hasattr(model, "logits"):
            logits = model(batch["inputs"], batch["positions"], deterministic=True)
            return _sums(*_per_token(logits, batch["targets"]), batch)
        h_BTD = model.decoder(batch["inputs"], batch["positions"], deterministic=True)
        return _sums(*_chunked_per_token(model.logits, h_BTD, batch["targets"], logit_chunk), batch)

    return eval_step


def _per_token(logits: Array, targets: Array) -> tuple[Array, Array, Array]:
    """Cross-entropy, correctness (float32) and the argmax (int32), each ``[batch, length]``."""
    ce, correct = token_losses(logits, targets)
    return ce, correct, argmax_last(logits).astype(jnp.int32)


def _chunked_per_token(
    head, h_BTD: Array, targets: Array, chunk: int
) -> tuple[Array, Array, Array]:
    """`_per_token` of ``head(h_BTD)`` computed ``chunk`` positions at a time (`jax.lax.map`:
    one chunk's logits alive at once; the last chunk padded)."""
    b, t, d = h_BTD.shape
    if t <= chunk:
        return _per_token(head(h_BTD), targets)
    n = -(-t // chunk)
    pad = n * chunk - t
    h_NBCD = jnp.pad(h_BTD, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, d).swapaxes(0, 1)
    y_NBC = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, n, chunk).swapaxes(0, 1)
    outs = jax.lax.map(lambda xs: _per_token(head(xs[0]), xs[1]), (h_NBCD, y_NBC))
    return tuple(o.swapaxes(0, 1).reshape(b, n * chunk)[:, :t] for o in outs)


def _sums(
    ce: Array, correct: Array, predictions: Array, batch: dict[str, Array]
) -> dict[str, Array]:
    mask = batch["loss_mask"].astype(jnp.float32)
    return {
        "loss_sum": (ce * mask).sum(axis=0),
        "correct_sum": (correct * mask).sum(axis=0),
        "count": mask.sum(axis=0),
        "predictions": predictions,
        "token_loss": ce * mask,  # [batch, length]: for per-block sums (evaluation.blocks)
        "token_correct": correct * mask,
    }


@functools.lru_cache(maxsize=64)
def _jitted_step(make, graphdef: nnx.GraphDef, options: tuple = ()):
    """One jitted ``make(graphdef)`` (`make_eval_step` or `make_incremental_eval_step`) per
    model structure (and compiler options, as sorted items), so repeated evaluations
    (periodic validation, several lengths, several tasks) reuse its compilations."""
    return jax.jit(make(graphdef), compiler_options=dict(options) or None)


class Evaluator:
    """Jit-compiled per-position sums for one model, one compile per batch shape;
    ``incremental=True`` scores each target at its own prefix's length: in one pass where
    the model's encodings allow it (`one_pass`), else token by token
    (`make_incremental_eval_step`). ``compiler_options``: as ``jax.jit`` takes them (the
    driver's choice of CPU products, ``train.cpu_matmul``; None: XLA's default)."""

    def __init__(
        self,
        model: nnx.Module,
        *,
        incremental: bool = False,
        compiler_options: dict[str, Any] | None = None,
    ):
        if incremental and (prefix := one_pass(model)) is not None:
            model, incremental = prefix, False  # the same numbers in one pass
        graphdef, self.params, self.rest = split_model(model)
        make = make_incremental_eval_step if incremental else make_eval_step
        self.step = _jitted_step(make, graphdef, tuple(sorted((compiler_options or {}).items())))

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        faults.hit("eval_batch")  # test-only kill point (flaxformer_lite.base.faults)
        out = self.step(self.params, self.rest, {k: jnp.asarray(v) for k, v in batch.items()})
        return jax.device_get(out)


def one_pass(model: nnx.Module) -> nnx.Module | None:
    """``model`` (a new module sharing its state) scoring in one pass what token-by-token
    scoring gives: every encoding that reads the current length (dynamic NTK, LongRoPE:
    `EncodingSpec.scores_incrementally`) takes each token's own prefix length
    (``prefix_lengths``, as a KV cache rotates each key when it is written). None when some
    such encoding has no ``prefix_lengths`` (a registered one of a user): then score token
    by token (`make_incremental_eval_step`)."""
    cfg = getattr(model, "cfg", None)
    if cfg is None or not hasattr(cfg, "pattern_kinds"):
        return None
    reading = [
        k.encoding
        for k in cfg.pattern_kinds()
        if k.encoding.scores_incrementally(k.positional_options)
    ]
    if not all(hasattr(spec.factory, "prefix_lengths") for spec in reading):
        return None
    copy = nnx.merge(*nnx.split(model))
    copy.set_attributes(prefix_lengths=True, raise_if_not_found=False)
    return copy


def rebuild_model(model: nnx.Module, cfg: Any) -> nnx.Module:
    """The same parameters under another config that changes no parameter shape (e.g. the
    attention implementation or RoPE scaling): a new module sharing ``model``'s state;
    ``model`` itself when the config is unchanged."""
    if cfg == model.cfg:
        return model
    _, state = nnx.split(model)
    graphdef_new, abstract = nnx.split(nnx.eval_shape(lambda: type(model)(cfg, rngs=nnx.Rngs(0))))
    if {p for p, _ in nnx.to_flat_state(abstract)} == {p for p, _ in nnx.to_flat_state(state)}:
        return nnx.merge(graphdef_new, state)
    # A module holding a plain array attribute (e.g. a registered encoding's constants) is
    # only an array when built for real (an abstract build leaves a tracer where it was):
    # build the model under the new config, then give it ``model``'s state.
    rebuilt = type(model)(cfg, rngs=nnx.Rngs(0))
    nnx.update(rebuilt, state)
    return rebuilt


def make_incremental_eval_step(graphdef: nnx.GraphDef):
    """`make_eval_step`'s sums, computed token by token through the model's KV cache.

    Each target's logits come from a decoding step that has seen exactly the tokens before
    it, so an encoding whose output depends on the current length (dynamic NTK) gives every
    target the scale of its own prefix, as in generation. For every other encoding the
    result equals `make_eval_step`'s to float32 tolerance (tested). Costs one decoding step
    per token (``O(length^2)`` work per window, like attention itself, but sequential).
    Needs a model with ``init_cache(batch, capacity, positions=)`` and ``decode_step``
    (a `DecoderOnlyLM`).
    """

    def eval_step(params, rest, batch):
        model = nnx.merge(graphdef, params, rest)
        tokens, positions = batch["inputs"], batch["positions"]
        cache = model.init_cache(tokens.shape[0], tokens.shape[1], positions=positions)

        def step(cache, xs):  # one token's loss: no [length, vocab] logits are stacked
            token, position, target = xs
            logits, cache = model.decode_step(token[:, None], position[:, None], cache)
            return cache, _per_token(logits[:, 0], target)

        xs = (tokens.T, positions.T, batch["targets"].T)
        _, outs = jax.lax.scan(step, cache, xs)
        return _sums(*(o.swapaxes(0, 1) for o in outs), batch)

    return eval_step
