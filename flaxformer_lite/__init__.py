"""flaxformer_lite: Transformers as pure JAX functions and thin Flax NNX modules.

Layers; a folder may import the ones listed after it, never one before it
(tests/test_architecture.py pins this)::

    cli/           the flaxformer-lite command; a study's cells, then its report (`run_study`)
    report/        tables, plots and REPORT.md from results rows alone
    study/         sweeps and the study runner (peers with report/; neither imports the other)
    results/       results rows: made, stored and merged; comparability, statistics, tests
    train/         run config, jit-compiled steps, the loop, checkpoints, metrics, sharding
    evaluation/    the evaluation plan and its execution (protocols, per-position loss, tasks)
    pretrained/    Hugging Face causal LMs: config mapping, safetensors weights, tokenizers
    data/          byte corpora, synthetic tasks, windows (numpy only; imports only base/)
    nn/            Flax NNX: the encoding registry and encodings, layers, models, generation
    core/          pure functions of arrays: attention, positional formulas, KV cache
    base/          standard-library helpers: argument checks, atomic writes, fault hooks

The pure core imports no Flax: arrays in, arrays out, with the ``[batch, length, heads,
head_dim]`` layout and explicit int positions ``[batch, length]``.

This module is the public API. The engine (`train_and_evaluate`, `evaluate_lengths`,
`run_study`) imports orbax, tensorboardX and matplotlib, so it is loaded on first use.
"""

from flaxformer_lite.core.absolute import sinusoidal
from flaxformer_lite.core.attention import (
    attend,
    attention_weights,
    causal_mask,
    dot_product_attention,
    mask_from_positions,
    padding_mask,
)
from flaxformer_lite.core.attention_bias import alibi_bias, alibi_slopes
from flaxformer_lite.core.chunked_attention import chunked_attention
from flaxformer_lite.core.positions import randomized_positions, relative_positions
from flaxformer_lite.core.rotary import apply_rope
from flaxformer_lite.nn import schedules
from flaxformer_lite.nn.encodings import (
    EncodingOptions,
    EncodingSpec,
    PositionalEncoding,
    get_positional_encoding,
    positional_encoding_names,
    register,
)
from flaxformer_lite.nn.generate import generate
from flaxformer_lite.nn.model_config import ModelConfig, encoding_row_name, rope_scaling_variant
from flaxformer_lite.nn.models import (
    Decoder,
    DecoderOnlyLM,
    Encoder,
    EncoderDecoder,
    default_positions,
)
from flaxformer_lite.nn.schedules import LayerKind

__version__ = "0.1.0"

__all__ = [
    "Decoder",
    "DecoderOnlyLM",
    "Encoder",
    "EncoderDecoder",
    "EncodingOptions",
    "EncodingSpec",
    "LayerKind",
    "ModelConfig",
    "PositionalEncoding",
    "__version__",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "attend",
    "attention_weights",
    "causal_mask",
    "chunked_attention",
    "default_positions",
    "dot_product_attention",
    "encoding_row_name",
    "evaluate_lengths",
    "generate",
    "get_positional_encoding",
    "mask_from_positions",
    "padding_mask",
    "positional_encoding_names",
    "randomized_positions",
    "register",
    "relative_positions",
    "rope_scaling_variant",
    "run_study",
    "schedules",
    "sinusoidal",
    "train_and_evaluate",
]

# Loaded on first use for import cost only (the engine pulls in orbax, tensorboardX,
# matplotlib); nothing below imports this module, so there is no cycle to avoid.
_LAZY = {
    "train_and_evaluate": "flaxformer_lite.train.loop",
    "evaluate_lengths": "flaxformer_lite.evaluation.score",
    "run_study": "flaxformer_lite.cli.pipeline",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'flaxformer_lite' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
