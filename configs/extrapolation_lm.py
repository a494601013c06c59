r"""Length extrapolation of a decoder-only byte LM: train at length L, evaluate at L x {1..16}.

Usage (installed as ``flaxformer_lite.configs.extrapolation_lm``: by name, or by this path)::

    flaxformer-lite study --config=extrapolation_lm:quick --workdir=runs/quick
    flaxformer-lite train --config=configs/extrapolation_lm.py:tiny --workdir=runs/tiny \
        --config.model.positional=rope

Presets (measured wall times: docs/results.md; every study scores the whole validation split
unless ``eval.max_bytes`` caps it):
  tiny    seconds; what the tests use (evaluation capped to 2048 targets: a smoke preset).
  dev     a few minutes on 2 CPU cores: quick's model for RoPE and ALiBi, 300 steps each, scored
          on the first 65,536 bytes of the validation split (``eval.max_bytes``) at L x {1, 2,
          4, 8}: to try a change end to end before a real study, not to cite.
  quick   the README's main job: 5 encodings x 1 seed on the embedded stdlib corpus, 1000 steps
          each, non-overlapping windows at L x {1, 2, 4, 8, 16}.
  cpu     the citeable CPU study: the same 5 encodings x 5 seeds, non-overlapping and
          context-controlled protocols (16,384 context targets: the cost driver), intervals
          over seeds and validation files, paired tests.
  cpu_best_lr
          cpu at each encoding's best learning rate on validation (the `lr` study: 1e-2 for
          all five), beside cpu's common rate 3e-3.
  families
          cpu's protocols for the newer families (T5, xPos, KERPLE log and power, FIRE), RoPE
          with YaRN at evaluation and randomized RoPE, 3 seeds: does any use context beyond L?
  all     every encoding family in the library (+ randomized positions, + RoPE scaling rows
          PI / NTK / dynamic NTK / YaRN at evaluation, + windowed attention, + StreamingLLM's
          first 4 keys beside that window), 1 seed.
  lr      quick's model and training at each peak learning rate of LEARNING_RATES (1e-3,
          3e-3 = quick's, 1e-2, 3e-2) x the 5 encodings, 1 seed: 20 runs, 4 x quick's cost
          (the rate does not change a step's cost). The report picks each encoding's best rate
          on validation at 1x and tabulates the study there.
  scaling three model sizes (SCALING_SIZES: 34k, 216k = quick's, 826k parameters with RoPE)
          x the 5 encodings x 2 seeds, 2000 steps each (4.1M training bytes, 0.45 epochs of
          the stdlib training split; quick: 2.0M, 0.23), non-overlapping (the whole
          validation split) and context (4,096 targets, c = L x {1, 4, 16}) protocols: 30
          runs. The report tabulates and plots the extrapolation gap (4x and 16x minus 1x)
          against parameters.
  modern  designs of recent models beside RoPE, ALiBi and NoPE (docs/encodings.md): the
          encodings rope, alibi, none, p_rope (p-RoPE) and fox (forgetting attention), each
          plain, as gpt-oss (sliding-window layers of W = L / 4 alternating with global ones,
          every layer with attention sinks) and with SSMax; evaluation rows for YaRN, ALiBi
          with position interpolation and the training-free temperatures logn and llama4
          (floor scale L). quick's model and training, cpu's two protocols (the context
          protocol also scores its key targets: bits per key byte), 5 seeds: 75 runs. The
          designs are swept as ``sweep.model_sizes`` (rows' ``model_size``: plain, gpt_oss,
          ssmax).
  modern_best_lr
          modern at each design's best peak rate on validation (the `modern_lr` study: 1e-2 for
          all 15), with p-RoPE rotating only the pairs that turn a full circle within L
          (`p_rope_within`: p = 3/8 here; modern's p = 0.75 trains as RoPE at this size).
  modern_lr
          modern's 15 designs at each peak rate of MODERN_LEARNING_RATES (3e-3 = modern's,
          1e-2, 3e-2), seed 0, non-overlapping windows at L x {1, ..., 16} without evaluation
          variants: 45 runs, each about a training's cost. The report picks each design's best
          rate on validation at 1x.
  wikitext103_bytes
          a byte-level study on WikiText-103 raw for one accelerator (L = 512 bytes, 25M
          parameters, to 16k bytes). Not the ALiBi paper's setting (a word-level 247M model at
          L = 512 words, 205 epochs): docs/results.md compares the two setting by setting.
          By arithmetic ~176 MFLOP per training token (6 x 25M parameters + attention) x
          16,384 tokens per step x 50,000 steps = 1.4e17 FLOP per run.

The sweep (``config.sweep``) lists the runs as data: every encoding x every seed, plus the
encodings also trained on randomized positions (``sweep.randomized``), at each learning rate
(``sweep.learning_rates``) and model size (``sweep.model_sizes``) when those are given; the
runner expands it (`flaxformer_lite.study.sweeps.expand_sweep`).
"""

from __future__ import annotations

import dataclasses
import math

import ml_collections

from flaxformer_lite.nn import schedules
from flaxformer_lite.nn.model_config import ModelConfig, options_template
from flaxformer_lite.train.sizing import size_to_training_length

ENCODINGS = ("sinusoidal", "learned", "rope", "alibi", "none")
# The `all` preset: the four + NoPE and the newer encodings, ...
ALL_ENCODINGS = (*ENCODINGS, "t5", "xpos", "kerple_log", "kerple_power", "fire")
# ... and these also trained and evaluated on sorted random positions (Ruoss et al. 2023).
ALL_RANDOMIZED = ("sinusoidal", "rope")
# The `families` preset: the newer families, and RoPE for its YaRN rows (plus randomized RoPE).
FAMILIES = ("rope", "t5", "xpos", "kerple_log", "kerple_power", "fire")
# The `lr` preset's grid of peak learning rates (quick's 3e-3 the second; it brackets every
# encoding's best rate, 1e-2: docs/results.md).
LEARNING_RATES = (1e-3, 3e-3, 1e-2, 3e-2)
# The `modern_lr` preset's grid: the `lr` study's rates from modern's 3e-3 up (1e-3 was below
# 3e-3 for every basic encoding there).
MODERN_LEARNING_RATES = (3e-3, 1e-2, 3e-2)
# Each encoding's best peak rate in the `lr` study (validation, 1x): 1e-2 for all five.
BEST_LEARNING_RATE = 1e-2
# The `scaling` preset's models (d_ff = 4 d_model); parameters with RoPE (no table):
# 33,664, 216,448 (quick's model) and 826,112, a 24.5x span.
SCALING_SIZES = (
    dict(name="d32l2", d_model=32, num_heads=2, d_ff=128, num_decoder_layers=2),
    dict(name="d64l4", d_model=64, num_heads=4, d_ff=256, num_decoder_layers=4),
    dict(name="d128l4", d_model=128, num_heads=4, d_ff=512, num_decoder_layers=4),
)


# The `modern` preset: the encodings (RoPE, ALiBi, NoPE, p-RoPE, FoX) ...
MODERN_ENCODINGS = ("rope", "alibi", "none", "p_rope", "fox")


def modern_designs(train_length: int) -> tuple[dict, ...]:
    """... each plain, as gpt-oss (sliding-window layers of W = L / 4, shorter than L,
    alternating with global layers, all with attention sinks: a pattern of 2 for quick's 4
    layers) and with SSMax (s log n, s learned per head): ``sweep.model_sizes`` entries."""
    return (
        dict(name="plain", attention_sinks=False),
        dict(
            name="gpt_oss",
            attention_sinks=True,
            layer_pattern=schedules.gpt_oss(window=max(1, train_length // 4)),
        ),
        dict(name="ssmax", attention_temperature="ssmax"),
    )


def _model(**overrides) -> ml_collections.ConfigDict:
    """Every ModelConfig field and every encoding's options (``positional_options.<name>``),
    so any of them can be overridden from the command line and the sweep can switch
    encodings."""
    fields = dataclasses.asdict(ModelConfig(num_encoder_layers=0))
    fields["positional_options"] = options_template()
    fields.update(
        # A small GPT-style decoder: pre-LN, GELU, no dropout, tied input/output embedding.
        norm="pre",
        activation="gelu",
        dropout_rate=0.0,
        positional="alibi",
    )
    fields.update(overrides)
    return ml_collections.ConfigDict(fields)


def get_config(preset: str = "quick") -> ml_collections.ConfigDict:
    """The run config for ``preset`` (one of `PRESETS`)."""
    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r} is not known; allowed: {sorted(PRESETS)}")
    c = ml_collections.ConfigDict()
    c.study = "extrapolation_lm"  # recorded in every results row
    c.preset = preset  # recorded in every results row
    c.seed = 0  # parameter init and data order; the sweep overrides it
    c.data = ml_collections.ConfigDict(
        dict(
            source="corpus",  # byte-level language modelling
            corpus="stdlib",  # the embedded default: this Python's standard library source
            path="",  # file or folder when corpus="path"
            cache_dir="",  # corpus cache ("" = ~/.cache/flaxformer_lite or $FLAXFORMER_LITE_CACHE)
            task="",  # unused for corpora
            train_length=64,  # L
            batch_size=32,  # sequences per step
        )
    )
    c.optim = ml_collections.ConfigDict(
        dict(
            learning_rate=3e-3,  # peak; 1e-3 left these small models near bigram level
            warmup_steps=100,  # linear warm-up, then cosine
            final_lr_ratio=0.1,  # cosine ends at 10% of the peak
            weight_decay=0.1,  # on matrices only
            clip_norm=1.0,  # global-norm clipping
            b1=0.9,
            b2=0.95,
            eps=1e-8,
        )
    )
    c.train = ml_collections.ConfigDict(
        dict(
            num_steps=500,  # optimizer steps per run
            log_every=50,  # training metrics cadence
            eval_every=0,  # 0: evaluate only at the end
            checkpoint_every=250,  # checkpoint cadence (and at the end)
            keep_checkpoints=2,  # recent checkpoints kept
            progress=True,  # tqdm progress bars
            steps_per_call=1,  # optimizer steps per compiled call (the same numbers)
            cpu_matmul="auto",  # CPU products: "auto" (oneDNN where faster), "onednn", "xla"
        )
    )
    c.eval = ml_collections.ConfigDict(
        dict(
            length_multiples=(1, 2, 4, 8, 16),  # evaluation lengths = L x these
            protocols=("nonoverlapping",),  # and/or "sliding", "context" (evaluation.protocols)
            stride_fraction=0.5,  # sliding stride = eval length x this (down to 1 byte)
            sliding_stride=0,  # > 0: this stride in bytes at every length (1: stride 1)
            context_multiples=(0.5, 1, 2, 4, 8, 16),  # context protocol: c = L x these
            context_block=0,  # context protocol: S targets scored per window; 0: L / 2
            context_targets=65536,  # context protocol: the same targets at every c
            max_bytes=0,  # 0: every byte of the split, at every length; N: the first N bytes
            batch_size=8,  # windows per evaluation batch
            split="validation",  # or "test"
            num_examples=256,  # task studies only
            rope_scalings=(),  # extra rows for rope: "pi", "ntk", "dynamic_ntk", "yarn"
            temperatures=(),  # extra rows with a query temperature: "logn", "llama4"
            local_window=0,  # > 0: also rows with windowed causal attention of this many keys
            streaming_first=0,  # > 0: also rows with that window + the first k keys (StreamingLLM)
            paired_reference="alibi",  # the report's paired differences: each encoding vs this
            paired_all=False,  # ... or every pair of encodings
        )
    )
    c.mesh = ml_collections.ConfigDict(
        dict(
            data=-1,  # data-parallel devices; -1: all devices left over (1 on a CPU)
            fsdp=1,  # devices that parameters and optimizer state are sharded over
            multihost=False,  # call jax.distributed.initialize() first (one process per host)
            rules=("batch=data", "embed=fsdp"),  # logical axis -> mesh axes; others replicated
        )
    )
    c.model = _model()
    c.sweep = ml_collections.ConfigDict(
        dict(
            encodings=ENCODINGS,  # one run per encoding ...
            seeds=(0,),  # ... and per seed
            randomized=(),  # encodings also run on randomized positions (one run per seed)
            learning_rates=(),  # peak rates, one run per rate; (): optim.learning_rate
            model_sizes=(),  # dicts of model overrides with a "name", one run per size
        )
    )
    PRESETS[preset](c)
    # options relative to L (learned rows, RoPE's original length, T5, FIRE, xPos, the
    # randomized-position range), recorded in c.sizing so that an override of L resizes them
    size_to_training_length(c)
    return c


def _tiny(c: ml_collections.ConfigDict) -> None:
    c.model.update(d_model=32, num_heads=2, d_ff=64, num_decoder_layers=2)
    c.data.update(train_length=16, batch_size=8)
    c.optim.update(warmup_steps=5)
    c.train.update(num_steps=20, log_every=5, checkpoint_every=10, progress=False)
    c.eval.update(length_multiples=(1, 2, 4), max_bytes=2048, batch_size=8)


def _dev(c: ml_collections.ConfigDict) -> None:
    # A change tried end to end in minutes: two encodings that differ past L, a third of
    # quick's training, and a quarter of the stdlib validation split (263,701 bytes) per length.
    _quick(c)
    c.sweep.encodings = ("rope", "alibi")
    c.train.update(num_steps=300, checkpoint_every=300)
    c.eval.update(length_multiples=(1, 2, 4, 8), max_bytes=65536)


def _quick(c: ml_collections.ConfigDict) -> None:
    c.model.update(d_model=64, num_heads=4, d_ff=256, num_decoder_layers=4)
    c.data.update(train_length=64, batch_size=32)
    # 10 steps per compiled call: the same steps, faster for a model this small on a CPU
    # (docs/performance.md §Steps per call); 10 divides every cadence of quick and of the
    # presets built on it
    c.train.update(num_steps=1000, checkpoint_every=500, steps_per_call=10)


def _cpu(c: ml_collections.ConfigDict) -> None:
    _quick(c)
    c.sweep.seeds = (0, 1, 2, 3, 4)
    c.eval.protocols = ("nonoverlapping", "context")
    # The context protocol scores each target from a window of c + S - 1 bytes, so it costs
    # ~20x the non-overlapping protocol per target at c = 16L; 16,384 targets (16 data blocks)
    # keep it affordable on a CPU (the default is 65,536).
    c.eval.context_targets = 16384


def _cpu_best_lr(c: ml_collections.ConfigDict) -> None:
    # cpu at each encoding's best peak rate on validation: the `lr` study's grid (1e-3 ... 3e-2)
    # puts every one of the five at 1e-2 (docs/results.md, "Learning rate"), so one rate
    # serves all five here; an encoding whose best differed would need its own cell.
    _cpu(c)
    c.optim.learning_rate = BEST_LEARNING_RATE


def _families(c: ml_collections.ConfigDict) -> None:
    # Does any of the newer families use context beyond L? The cpu protocol (both protocols,
    # 16,384 context targets) for each newer family, RoPE with YaRN at evaluation (the rope rows
    # also give plain RoPE) and randomized RoPE, 3 seeds: 21 runs; FIRE trains ~4.5x slower.
    _cpu(c)
    c.sweep.encodings = FAMILIES
    c.sweep.randomized = ("rope",)
    c.sweep.seeds = (0, 1, 2)
    c.eval.rope_scalings = ("yarn",)


def _wikitext103_bytes(c: ml_collections.ConfigDict) -> None:
    # A byte-level study on WikiText-103 raw sized for one accelerator, L = 512 bytes,
    # evaluation to 32 x 512 = 16,384 bytes. Its settings against the ALiBi paper's (Press
    # et al. 2022, Table 2) and the reason for each difference: docs/results.md.
    c.data.update(corpus="wikitext103", train_length=512, batch_size=32)
    c.model.update(d_model=512, num_heads=8, d_ff=2048, num_decoder_layers=8)
    c.model.dtype = "bfloat16"  # bf16 compute, float32 parameters, softmax and loss
    c.optim.update(learning_rate=6e-4, warmup_steps=2000)
    c.train.update(num_steps=50_000, log_every=200, checkpoint_every=2000)
    c.eval.update(
        length_multiples=(1, 2, 4, 8, 16, 32),
        batch_size=4,
        protocols=("nonoverlapping", "context"),
    )
    c.sweep.seeds = (0, 1, 2)


def _all(c: ml_collections.ConfigDict) -> None:
    _quick(c)
    # every encoding also with windowed causal attention, W = L (xPos's evaluation setting),
    # and with StreamingLLM's 4 first keys beside that window
    c.eval.local_window = c.data.train_length
    c.eval.streaming_first = 4
    c.sweep.encodings = ALL_ENCODINGS
    c.sweep.randomized = ALL_RANDOMIZED
    c.eval.rope_scalings = ("pi", "ntk", "dynamic_ntk", "yarn")


def _lr(c: ml_collections.ConfigDict) -> None:
    # quick at three peak rates: is the ranking an artefact of one rate for all encodings?
    # optim.learning_rate stays 3e-3, the common rate the report compares the ranking with.
    _quick(c)
    c.sweep.learning_rates = LEARNING_RATES


def _scaling(c: ml_collections.ConfigDict) -> None:
    # Model size and training length: three sizes x 2,000 steps (twice quick's training).
    _quick(c)
    c.train.update(num_steps=2000, checkpoint_every=500)
    c.sweep.model_sizes = SCALING_SIZES
    c.sweep.seeds = (0, 1)
    c.eval.update(
        protocols=("nonoverlapping", "context"),
        context_multiples=(1, 4, 16),  # the gap table's lengths
        context_targets=4096,  # 128 windows of S = 32 targets: cheap (t interval over seeds)
    )


def _modern(c: ml_collections.ConfigDict) -> None:
    # Recent designs at cpu's size and protocols (4 layers, L = 64, evaluation to 16 L, 5
    # seeds); docs/encodings.md.
    _cpu(c)
    length = c.data.train_length
    c.sweep.encodings = MODERN_ENCODINGS
    c.sweep.model_sizes = modern_designs(length)
    c.eval.rope_scalings = ("yarn", "alibi_pi")  # rope+yarn, p_rope+yarn, alibi+pi rows
    c.eval.temperatures = ("logn", "llama4")  # training-free rows (not for SSMax's cells)
    # L of ALiBi's interpolation, and Llama 4's floor scale at L (its 8192 would leave every
    # evaluation length here untouched); set for this L (an override of L should set them)
    c.model.positional_options.alibi.pi_train_length = length
    c.model.temperature_floor_scale = float(length)


def p_rope_within(train_length: int, head_dim: int, base: float = 10000.0) -> float:
    """p-RoPE's p that keeps rotating exactly the pairs whose wavelength ``2 pi / theta_i``
    (``theta_i = base^(-2i/head_dim)``) is at most ``train_length``: those that turn a full
    circle within a training window. The slower ones change by less than a turn over L, the
    ones p-RoPE frees from position (Barbero et al. 2024, arXiv 2410.06205, §6)."""
    pairs = head_dim // 2
    within = sum(2 * math.pi * base ** (2 * i / head_dim) <= train_length for i in range(pairs))
    return within / pairs


def _modern_best_lr(c: ml_collections.ConfigDict) -> None:
    # modern at the rate the modern_lr study found best for every design (1e-2, as for the
    # basic encodings in `lr`), and a p-RoPE whose unrotated pairs are the ones that matter;
    # p is set for this L and head size (an override of either should set it too)
    _modern(c)
    c.optim.learning_rate = BEST_LEARNING_RATE
    head_dim = c.model.d_model // c.model.num_heads
    c.model.positional_options.p_rope.p = p_rope_within(c.data.train_length, head_dim)


def _modern_lr(c: ml_collections.ConfigDict) -> None:
    # The rate sweep behind modern's rate: training dominates, so no context protocol and no
    # evaluation variants (the rates are compared at 1x on validation).
    _modern(c)
    c.sweep.learning_rates = MODERN_LEARNING_RATES
    c.sweep.seeds = (0,)
    c.eval.protocols = ("nonoverlapping",)
    c.eval.rope_scalings = ()
    c.eval.temperatures = ()


PRESETS = {
    "tiny": _tiny,
    "dev": _dev,
    "quick": _quick,
    "cpu": _cpu,
    "cpu_best_lr": _cpu_best_lr,
    "families": _families,
    "all": _all,
    "wikitext103_bytes": _wikitext103_bytes,
    "lr": _lr,
    "scaling": _scaling,
    "modern": _modern,
    "modern_lr": _modern_lr,
    "modern_best_lr": _modern_best_lr,
}
