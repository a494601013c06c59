"""Positional encodings as NNX modules behind one registry (DESIGN.md §3).

Importing this package registers every built-in encoding.
"""

from flaxformer_lite.nn.encodings import attention_bias  # noqa: F401  (registers xpos, t5, kerple_*, fire)
from flaxformer_lite.nn.encodings.registry import (  # noqa: F401  (the public registry API)
    HOOKS,
    ROPE_VARIANT_FIELDS,
    ALiBiEncoding,
    EncodingSpec,
    LearnedEncoding,
    NoPositionalEncoding,
    PositionalEncoding,
    RotaryEncoding,
    SinusoidalEncoding,
    encoding_row_name,
    get_positional_encoding,
    positional_encoding_names,
    register,
    rope_scaling_variant,
)
