"""Hugging Face causal LMs as `DecoderOnlyLM`: config mapping, safetensors weights, tokenizers.

``load_pretrained("gpt2")``, ``load_pretrained("path/to/folder")`` or
``load_pretrained("model.gguf")`` (llama.cpp's format: `flaxformer_lite.pretrained.gguf`)
returns the model, its `ModelConfig`, its tokenizer and its provenance. Supported families
and what each maps: `flaxformer_lite.pretrained.families`; the reading rules for untrusted
folders: `flaxformer_lite.pretrained.files`.

Layer: may import base, core, nn and data; train (a run config may name a pretrained model
to evaluate), results, study and cli import it.
"""

from flaxformer_lite.pretrained.families import FAMILIES, family_of, model_config
from flaxformer_lite.pretrained.files import (
    PretrainedError,
    content_hash,
    file_stats,
    read_config,
    weight_files,
)
from flaxformer_lite.pretrained.generation import generate_ids
from flaxformer_lite.pretrained.load import (
    Checkpoint,
    MissingModelError,
    Pretrained,
    PretrainedInfo,
    load_pretrained,
    missing_models_message,
    open_checkpoint,
    resolve,
    training_length,
)
from flaxformer_lite.pretrained.tokenizer import Tokenizer, load_tokenizer, tokenizer_files

__all__ = [
    "FAMILIES",
    "Checkpoint",
    "MissingModelError",
    "Pretrained",
    "PretrainedError",
    "PretrainedInfo",
    "Tokenizer",
    "content_hash",
    "family_of",
    "file_stats",
    "generate_ids",
    "load_pretrained",
    "load_tokenizer",
    "missing_models_message",
    "model_config",
    "open_checkpoint",
    "read_config",
    "resolve",
    "tokenizer_files",
    "training_length",
    "weight_files",
]
