"""Hugging Face causal LMs as `DecoderOnlyLM`: config mapping, safetensors weights, tokenizers.

``load_pretrained("gpt2")`` or ``load_pretrained("path/to/folder")`` returns the model, its
`ModelConfig`, its tokenizer and its provenance. Supported families and what each maps:
`flaxformer_lite.pretrained.families`; the reading rules for untrusted folders:
`flaxformer_lite.pretrained.files`.

Layer: may import base, core, nn and data; train (a run config may name a pretrained model
to evaluate), results, study and cli import it.
"""

from flaxformer_lite.pretrained.families import FAMILIES, family_of, model_config
from flaxformer_lite.pretrained.files import PretrainedError, read_config
from flaxformer_lite.pretrained.load import Pretrained, PretrainedInfo, load_pretrained, resolve
from flaxformer_lite.pretrained.tokenizer import Tokenizer, load_tokenizer

__all__ = [
    "FAMILIES",
    "Pretrained",
    "PretrainedError",
    "PretrainedInfo",
    "Tokenizer",
    "family_of",
    "load_pretrained",
    "load_tokenizer",
    "model_config",
    "read_config",
    "resolve",
]
