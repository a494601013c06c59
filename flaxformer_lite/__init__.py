"""flaxformer_lite: Transformers as pure JAX functions and thin Flax NNX modules.

Layers (an upper layer may import a lower one, never the reverse)::

    experiments  -> train / evaluate -> data -> models, layers, encodings -> attention, positional

The pure core (`attention`, `positional`) imports no Flax: arrays in, arrays out, with the
``[batch, length, heads, head_dim]`` layout and explicit int positions ``[batch, length]``.
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
from flaxformer_lite.core.positions import randomized_positions, relative_positions
from flaxformer_lite.core.rotary import apply_rope
from flaxformer_lite.nn.encodings import (
    EncodingSpec,
    PositionalEncoding,
    encoding_row_name,
    get_positional_encoding,
    positional_encoding_names,
    register,
    rope_scaling_variant,
)
from flaxformer_lite.nn.model_config import ModelConfig
from flaxformer_lite.nn.models import (
    Decoder,
    DecoderOnlyLM,
    Encoder,
    EncoderDecoder,
    default_positions,
)

__version__ = "0.1.0"

__all__ = [
    "Decoder",
    "DecoderOnlyLM",
    "Encoder",
    "EncoderDecoder",
    "EncodingSpec",
    "ModelConfig",
    "PositionalEncoding",
    "__version__",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "attend",
    "attention_weights",
    "causal_mask",
    "default_positions",
    "dot_product_attention",
    "encoding_row_name",
    "get_positional_encoding",
    "mask_from_positions",
    "padding_mask",
    "positional_encoding_names",
    "randomized_positions",
    "register",
    "relative_positions",
    "rope_scaling_variant",
    "sinusoidal",
]

# The engine imports orbax, tensorboardX and the data layer: load it on first use only.
_LAZY = {
    "train_and_evaluate": "flaxformer_lite.train.loop",
    "evaluate_lengths": "flaxformer_lite.evaluation.engine",
    "run_study": "flaxformer_lite.experiments.runner",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'flaxformer_lite' has no attribute {name!r}")
