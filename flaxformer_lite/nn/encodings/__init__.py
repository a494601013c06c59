"""Positional encodings as NNX modules behind one registry (DESIGN.md §3).

Importing this package registers every built-in encoding, one module per hook point:
`nope` (``none``), `absolute` (``add``: sinusoidal, learned), `rotary` (``rotate``: RoPE,
xPos, p-RoPE), `attention_bias` (``bias``: ALiBi, T5, KERPLE, FIRE) and `forgetting`
(``forget``: FoX). `registry` holds the specs;
`base` the contract (`PositionalEncoding`, `EncodingOptions`, `ModelDims`).
"""

# Importing a module registers its encodings: this is the registration order.
# isort: off
from flaxformer_lite.nn.encodings import nope
from flaxformer_lite.nn.encodings import absolute
from flaxformer_lite.nn.encodings import rotary
from flaxformer_lite.nn.encodings import attention_bias
from flaxformer_lite.nn.encodings import forgetting

# isort: on
from flaxformer_lite.nn.encodings.absolute import (
    LearnedEncoding,
    LearnedOptions,
    SinusoidalEncoding,
    SinusoidalOptions,
)
from flaxformer_lite.nn.encodings.attention_bias import (
    ALiBiEncoding,
    FireBias,
    FireOptions,
    KerpleBias,
    T5Options,
    T5RelativeBias,
)
from flaxformer_lite.nn.encodings.base import (
    HOOKS,
    EncodingOptions,
    ModelDims,
    PositionalEncoding,
)
from flaxformer_lite.nn.encodings.forgetting import ForgettingGates, FoxOptions
from flaxformer_lite.nn.encodings.nope import NoPositionalEncoding
from flaxformer_lite.nn.encodings.registry import (
    EncodingSpec,
    NoOptions,
    get_positional_encoding,
    positional_encoding_names,
    register,
)
from flaxformer_lite.nn.encodings.rotary import (
    RopeOptions,
    RotaryEncoding,
    XPosEncoding,
    XPosOptions,
    rope_at_length,
)

__all__ = [
    "HOOKS",
    "ALiBiEncoding",
    "EncodingOptions",
    "EncodingSpec",
    "FireBias",
    "FireOptions",
    "ForgettingGates",
    "FoxOptions",
    "KerpleBias",
    "LearnedEncoding",
    "LearnedOptions",
    "ModelDims",
    "NoOptions",
    "NoPositionalEncoding",
    "PositionalEncoding",
    "RopeOptions",
    "RotaryEncoding",
    "SinusoidalEncoding",
    "SinusoidalOptions",
    "T5Options",
    "T5RelativeBias",
    "XPosEncoding",
    "XPosOptions",
    "absolute",
    "attention_bias",
    "forgetting",
    "get_positional_encoding",
    "nope",
    "positional_encoding_names",
    "register",
    "rope_at_length",
    "rotary",
]
