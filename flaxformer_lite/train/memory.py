"""How much memory a run needs, estimated before any work, against how much there is.

`check_memory` (called by `train_and_evaluate` and the study runner after the config and
data checks, before anything is written) refuses a run whose estimate exceeds the memory
available, with one line naming the estimate, the memory and the setting to change::

    config.data.batch_size=10000000: one training step needs ≈ 1.4 TiB (activations
    1.4 TiB, parameters + AdamW state 396.0 KiB), 21.6 GiB available (host memory,
    MemAvailable); lower config.data.batch_size, or set FLAXFORMER_LITE_MEMORY_CHECK=off
    to try anyway

The estimate, in bytes, counts every array as float32 (4 bytes; a bfloat16 model needs
less, so it errs on the high side there). With ``P`` parameters, ``B`` sequences of ``T``
tokens, ``n`` layers of width ``d``, feed-forward width ``f``, ``h`` heads and a vocabulary
of ``V``:

* parameters and optimizer state (``P`` counted from the config by arithmetic,
  `nn.param_count`: any size is answered at once): ``4 P`` for training (parameters,
  gradients and AdamW's two moments), ``3 P`` during evaluation (the training state is
  still held), times ``param_bytes`` (4 for float32 parameters);
* one training step's activations (kept for the backward pass):
  ``4 B T [n (C_D d + C_F f + C_S h T_s) + C_V V]`` with ``C_D = 18`` (residual stream,
  norms, q/k/v, attention output and projections), ``C_F = 2`` (feed-forward hidden before
  and after the nonlinearity), ``C_V = 3`` (logits, log-softmax, their gradient), and the
  attention scores: dense attention ("xla") keeps ``C_S = 3`` score-sized arrays of ``h x T``
  per token per layer (``T_s = T``); chunked or fused attention keeps none of that size,
  only ``C_S`` blocks of ``h x block_q x block_k`` per sequence at a time
  (`chunked_attention.DEFAULT_BLOCK_Q` / ``_K``);
* evaluation: every cell of the evaluation plan is one forward pass of ``eval.batch_size``
  windows of its sequence length ``T'`` (one layer's activations alive at a time):
  ``4 B' [T' (C_DE d + C_F f) + T_V C_VE V]`` with ``C_DE = 8``, ``C_VE = 2`` (logits and
  log-softmax) for the ``T_V = min(T', 512)`` positions whose logits exist at once
  (`evaluation.step.LOGIT_CHUNK`; a cell scored at each target's prefix length runs in one
  pass where its encodings allow, `evaluation.step.one_pass`, so it counts them too), plus
  the scores of one layer --
  ``2 h T'`` per token for dense attention, two ``h x block_q x block_k`` blocks per window
  for chunked (the implementation each cell uses: `evaluation.score.attention_config`,
  chunked above its threshold) -- plus, for a cell scored incrementally
  (token by token where it cannot run in one pass), its key/value cache ``2 n T' d`` per
  window (a layer with a sliding window W or chunk C holds ``min(W or C, T')`` slots
  instead of ``T'``: `ModelConfig.kv_cache_slots`). The largest cell counts.

The constants were fitted to XLA's own accounting of the compiled steps' temporary buffers
(``jit(...).lower(...).compile().memory_analysis()``) for the ``tiny`` and ``quick`` models
on CPU: training at 16 to 1024 tokens x 8 to 128 sequences, dense and chunked, within 20% of
it (-5% to +19%); evaluation of chunked windows of 8k-16k tokens -1% to +66%, of dense
windows of 16-1024 tokens +80% to 3.5x (where it is small). It ignores the corpus in memory
and XLA's fixed overheads (tens of MiB).

Available memory: on an accelerator, the first device's free memory as JAX reports it
(``bytes_limit - bytes_in_use``), for the share of the batch and state one device holds
(the batch split over the data-parallel devices, parameters over the ``fsdp`` ones); on
CPU, the host's ``MemAvailable`` (``/proc/meminfo``; else ``os.sysconf``), lowered to what
a cgroup v2 memory limit leaves, plus what this process already holds (its resident memory:
the heap a study's earlier cells freed is reused), for the whole batch and one state per
data-parallel device. ``FLAXFORMER_LITE_MEMORY_CHECK=off`` skips the check (the estimate is an
estimate).

Generation (`generation_estimate`, `check_generation_memory`: ``flaxformer-lite generate``
refuses before loading the checkpoint): the parameters and AdamW state as loaded (``3 P``),
the key/value cache of every layer for ``S = prompt_len + max_new_tokens - 1`` tokens
(``2 n S KV hd`` values and ``n S`` positions per row; a windowed or chunked layer's ring
buffer holds ``min(W or C, S)`` of them), the prompt's forward pass (prefill)
per token as in evaluation (``C_DE d + C_F f + C_VE V``) with the scores of one layer
against every slot (dense: ``C_SE h`` per query and slot; chunked: blocks), and the fed
positions and output tokens.

The setting named: the batch when one sequence would fit; otherwise the setting that makes
the estimate large -- of the model's size fields (``config.model.num_decoder_layers``,
``d_model``, ``d_ff``, ``vocab_size``, ``num_heads``) and the training length, the one whose
return to the base Transformer's value (`ModelConfig`'s default; 64 tokens) divides the
estimate the most, e.g. ``config.model.num_decoder_layers=1000000`` for a million layers,
``config.model.d_model=1000000000`` for that width, not the sequence length.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import jax

from flaxformer_lite.base.checks import ConfigError
from flaxformer_lite.base.memory import format_bytes
from flaxformer_lite.core import attention
from flaxformer_lite.core.chunked_attention import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q
from flaxformer_lite.data.data_config import DataConfig
from flaxformer_lite.evaluation.plan import EvalPlan
from flaxformer_lite.evaluation.step import LOGIT_CHUNK
from flaxformer_lite.nn import param_count
from flaxformer_lite.nn.model_config import ModelConfig
from flaxformer_lite.pretrained.load import free_memory
from flaxformer_lite.train.run_config import RunConfig
from flaxformer_lite.train.sharding import mesh_shape

ENV = "FLAXFORMER_LITE_MEMORY_CHECK"
FLOAT_BYTES = 4
C_D, C_F, C_V, C_S = 18, 2, 3, 3  # training: per token per layer (x d, x f), x V, scores
C_DE, C_VE, C_SE = 8, 2, 2  # evaluation: per token (x d, x V), score arrays of one layer


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Bytes one phase of a run needs: ``state`` (parameters and optimizer moments) and
    ``activations``; ``what`` names the phase, ``field``/``value`` the setting that scales
    the activations (the batch) and ``longest`` the setting behind the sequence length."""

    what: str
    state: int
    activations: int
    field: str
    value: Any
    longest: str

    @property
    def total(self) -> int:
        return self.state + self.activations


@functools.lru_cache(maxsize=64)
def count_parameters(model: ModelConfig) -> int:
    """Parameters of the run's `DecoderOnlyLM`, by arithmetic on the config
    (`nn.param_count.count_parameters`: nothing is built or traced)."""
    return param_count.count_parameters(model)


# The size fields an estimate grows with (`_dominant_field`), compared to these values.
_MODEL_FIELDS = ("num_decoder_layers", "d_model", "d_ff", "vocab_size", "num_heads")
_REFERENCE = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.name in _MODEL_FIELDS}
_TRAIN_LENGTH = DataConfig.__dataclass_fields__["train_length"].default


class _WhatIf:
    """A model config with some size fields replaced (not validated: only for estimates)."""

    def __init__(self, model: Any, **changes: Any):
        self._model, self._changes = model, changes

    def __getattr__(self, name: str) -> Any:
        if name in self._changes:
            return self._changes[name]
        return getattr(self._model, name)


def _dense(impl: str, keys: int, threshold: int) -> bool:
    """Whether attention over ``keys`` keys materialises the scores (`attention.attend`):
    "xla" always; "auto" at most ``threshold`` keys (an upper bound: a fused kernel, where
    it runs, needs less); "chunked" and "cudnn" never."""
    if impl == "auto":
        return attention.choose_implementation("xla", keys, keys, threshold=threshold) == "xla"
    return impl == "xla"


def _scores(m: ModelConfig, batch: int, queries: int, keys: int, impl: str, per_token: int) -> int:
    """Bytes of the attention scores of one layer, ``queries`` against ``keys``: ``per_token``
    arrays of ``h x keys`` per query when dense, else ``per_token`` blocks of
    ``h x block_q x block_k``."""
    if _dense(impl, keys, m.chunked_threshold):
        return FLOAT_BYTES * per_token * batch * queries * m.num_heads * keys
    blocks = min(queries, DEFAULT_BLOCK_Q) * min(keys, DEFAULT_BLOCK_K)
    return FLOAT_BYTES * per_token * batch * m.num_heads * blocks


def training_estimate(run: RunConfig, batch: int | None = None, copies: int = 1) -> Estimate:
    """One training step of ``batch`` sequences (default ``data.batch_size``) with ``copies``
    training states (one per data-parallel device sharing the memory)."""
    m, length = run.model, run.data.train_length
    batch = run.data.batch_size if batch is None else batch
    state, activations = _training_bytes(m, length, batch, count_parameters(m), copies)
    return Estimate(
        "one training step",
        state,
        activations,
        "config.data.batch_size",
        run.data.batch_size,
        f"config.data.train_length={length}",
    )


def _training_bytes(m: Any, length: int, batch: int, params: int, copies: int) -> tuple[int, int]:
    """``(state, activations)`` of one training step (`training_estimate`)."""
    state = 4 * params * m.params_dtype.itemsize * copies
    per_token = m.num_decoder_layers * (C_D * m.d_model + C_F * m.d_ff) + C_V * m.vocab_size
    # dense scores are kept for the backward pass, every layer; chunked, one block at a time
    dense = _dense(m.attention_impl, length, m.chunked_threshold)
    layers = m.num_decoder_layers if dense else 1
    scores = layers * _scores(m, batch, length, length, m.attention_impl, C_S)
    return state, FLOAT_BYTES * batch * length * per_token + scores


def _dominant_field(run: RunConfig, *, training: bool) -> tuple[str, Any, str] | None:
    """``(field, value, why)`` of the size setting whose return to its reference value
    (`_REFERENCE`, ``train_length`` 64) divides one sequence's estimate the most (training:
    state and activations; evaluation: the parameters' state only, the activations are the
    evaluation length's); None when no setting is above its reference."""
    m, length = run.model, run.data.train_length
    encoding = param_count.encoding_params(m)  # fixed: only the size fields vary

    def measure(model: Any, length: int) -> int:
        params = param_count.count_parameters(model, encoding=encoding)
        if not training:
            return params
        return sum(_training_bytes(model, length, 1, params, 1))

    now = measure(m, length)
    best = None
    candidates = [(f"config.model.{f}", f, getattr(m, f), _REFERENCE[f]) for f in _MODEL_FIELDS]
    if training:
        candidates.append(("config.data.train_length", None, length, _TRAIN_LENGTH))
    for path, name, value, reference in candidates:
        if value <= reference:
            continue
        if name is None:
            smaller = measure(m, reference)
        else:
            smaller = measure(_WhatIf(m, **{name: reference}), length)
        factor = now / max(smaller, 1)
        if best is None or factor > best[0]:
            name = path.rpartition(".")[2]
            best = (factor, path, value, f"{factor:.3g}x what it is at {name}={reference}")
    if best is None or best[0] < 1.5:
        return None
    return best[1:]


def evaluation_estimate(
    run: RunConfig, plan: EvalPlan | None = None, batch: int | None = None, copies: int = 1
) -> Estimate:
    """The largest cell of the run's evaluation plan, ``batch`` windows at a time (default
    ``eval.batch_size``)."""
    plan = run.eval_plan() if plan is None else plan
    batch = plan.batch_size if batch is None else batch
    m = run.model
    state = 3 * count_parameters(m) * m.params_dtype.itemsize * copies
    best, worst = None, -1
    for cell in (plan.quick, *plan.cells):
        if cell.na is not None:
            continue
        seq, cm = cell.sequence_length, cell.model
        per_token = C_DE * cm.d_model + C_F * cm.d_ff
        logit_rows = min(seq, LOGIT_CHUNK)  # token by token holds fewer: this bounds both
        need = FLOAT_BYTES * batch * (seq * per_token + logit_rows * C_VE * cm.vocab_size)
        need += _scores(cm, batch, seq, seq, cm.attention_impl, C_SE)
        if cell.incremental:  # the key/value cache of every layer
            need += FLOAT_BYTES * batch * 2 * cm.kv_cache_slots(seq) * cm.d_model
        if need > worst:
            best, worst = cell, need
    assert best is not None  # the quick cell is always evaluable
    what = f"evaluating {best.sequence_length}-token sequences ({best.protocol}, "
    what += f"{best.label.encoding})"
    longest = (
        "config.eval.context_multiples"
        if best.protocol == "context"
        else "config.eval.length_multiples"
    )
    if best.protocol == "context":
        value = run.eval.context_multiples
    elif plan.kind == "task" or best is not plan.quick:
        value = run.eval.length_multiples
    else:
        longest, value = "config.data.train_length", run.data.train_length
    return Estimate(
        what, state, worst, "config.eval.batch_size", plan.batch_size, f"{longest}={value}"
    )


def generation_estimate(
    model: ModelConfig, *, prompt_len: int, max_new_tokens: int, batch: int = 1
) -> Estimate:
    """``nn.generate.generate`` of ``batch`` rows of ``prompt_len`` tokens continued by
    ``max_new_tokens`` with a model of ``model`` restored with its AdamW state
    (`train.restore.load_trained_model`); ``field`` is ``--max_new_tokens``, ``longest``
    the prompt."""
    m = model
    slots = prompt_len + max_new_tokens - 1  # the last token is never fed back
    kv_heads = getattr(m, "num_kv_heads", None) or m.num_heads
    state = 3 * count_parameters(m) * m.params_dtype.itemsize
    cache = FLOAT_BYTES * batch * m.kv_cache_slots(slots) * (2 * kv_heads * m.head_dim + 1)
    prefill = (
        FLOAT_BYTES * batch * prompt_len * (C_DE * m.d_model + C_F * m.d_ff + C_VE * m.vocab_size)
    )
    scores = _scores(m, batch, prompt_len, slots, m.attention_impl, C_SE)
    fed = 4 * batch * (2 * slots + max_new_tokens)  # positions (and their copy), output
    what = f"generating {max_new_tokens} tokens after a {prompt_len}-token prompt"
    return Estimate(
        what,
        state,
        cache + prefill + scores + fed,
        "--max_new_tokens",
        max_new_tokens,
        f"the prompt={prompt_len} tokens",
    )


def check_generation_memory(
    model: ModelConfig,
    *,
    prompt_len: int,
    max_new_tokens: int,
    batch: int = 1,
    available: tuple | None = None,
) -> None:
    """Raise `ConfigError` when `generation_estimate` exceeds the memory available (one
    line: the estimate, the memory and the setting to change: ``--max_new_tokens`` when a
    single new token would fit, else the prompt or the model); skipped as `check_memory`."""
    if os.environ.get(ENV, "").strip().lower() in ("off", "0", "false", "no"):
        return
    free, where, _ = available_memory() if available is None else available
    if free is None:
        return
    est = generation_estimate(
        model, prompt_len=prompt_len, max_new_tokens=max_new_tokens, batch=batch
    )
    if est.total <= free:
        return
    one = generation_estimate(model, prompt_len=prompt_len, max_new_tokens=1, batch=batch)
    if one.total <= free:
        head, change = f"--max_new_tokens={max_new_tokens}", "lower --max_new_tokens"
    elif one.state < free and one.activations >= one.state:
        head, change = f"the prompt ({prompt_len} tokens)", "give a shorter prompt"
    else:
        head, change = "the model", "generate on a machine with more memory"
    raise ConfigError(
        f"{head}: {est.what} needs ≈ {format_bytes(est.total)} (key/value cache, prompt "
        f"pass and output {format_bytes(est.activations)}, parameters + AdamW state "
        f"{format_bytes(est.state)}), {format_bytes(free)} available ({where}); {change}, or "
        f"set {ENV}=off to try anyway"
    )


def available_memory() -> tuple[int | None, str, bool]:
    """``(bytes, where, per_device)``: the memory free for a run, where it was read, and
    whether it is one accelerator's (else the host's, shared by every CPU device)."""
    return (*free_memory(), jax.local_devices()[0].platform != "cpu")


def check_memory(
    run: RunConfig, plan: EvalPlan | None = None, *, available: tuple | None = None
) -> None:
    """Raise `ConfigError` when training or evaluating ``run`` needs more memory than there
    is (see the module docstring; a pretrained model's run is only evaluated, so only its
    evaluation counts); the message gives the estimate, the memory available
    and the setting to change. ``available``: `available_memory` 's answer (default: asked
    now). Skipped when ``FLAXFORMER_LITE_MEMORY_CHECK=off`` or the memory is unknown."""
    if os.environ.get(ENV, "").strip().lower() in ("off", "0", "false", "no"):
        return
    free, where, per_device = available_memory() if available is None else available
    if free is None:
        return
    data, fsdp = _ways(run)

    def training(batch: int | None = None) -> Estimate:
        if per_device:  # one device: its share of the batch, its shard of the state
            batch = -(-run.data.batch_size // data) if batch is None else batch
            est = training_estimate(run, batch)
            return dataclasses.replace(est, state=-(-est.state // fsdp))
        # CPU devices share the host: the whole batch, one state per data-parallel device
        return training_estimate(run, batch, copies=data)

    def evaluation(batch: int | None = None) -> Estimate:  # on one device, unsharded batch
        est = evaluation_estimate(run, plan, batch, copies=1 if per_device else data)
        return dataclasses.replace(est, state=-(-est.state // fsdp)) if per_device else est

    # a pretrained model's run trains nothing: its training length is its context
    for phase in (evaluation,) if run.pretrained.source else (training, evaluation):
        est = phase()
        if est.total <= free:
            continue
        one = phase(1)
        if one.total > free or est.value == 1:  # even one sequence does not fit
            field, value = est.longest.split("=", 1)
            change = f"lower {field} or the model size (config.model.*)"
            # the model's size, unless evaluation's activations (its length) dominate
            in_training = phase is training
            dominant = None
            if in_training or one.state >= one.activations:
                dominant = _dominant_field(run, training=in_training)
            if dominant is not None and dominant[0] != "config.data.train_length":
                field, value, why = dominant
                change = f"lower {field} (the estimate is {why})"
        else:
            field, value = est.field, est.value
            change = f"lower {est.field}"
        raise ConfigError(
            f"{field}={value}: {est.what} needs ≈ {format_bytes(est.total)} (activations "
            f"{format_bytes(est.activations)}, parameters + AdamW state "
            f"{format_bytes(est.state)}), {format_bytes(free)} available ({where}); {change}, "
            f"or set {ENV}=off to try anyway"
        )


def _ways(run: RunConfig) -> tuple[int, int]:
    """``(data, fsdp)``: how many devices split the batch and the parameters."""
    try:
        return mesh_shape(run.mesh, jax.device_count())
    except ConfigError:  # reported by the mesh check
        return 1, 1
