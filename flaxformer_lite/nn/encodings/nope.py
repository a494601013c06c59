"""NoPE: no positional encoding at all (hook ``none``)."""

from __future__ import annotations

from flax import nnx

from flaxformer_lite.nn.encodings.base import EncodingOptions, ModelDims, PositionalEncoding
from flaxformer_lite.nn.encodings.registry import EncodingSpec, register


class NoPositionalEncoding(PositionalEncoding):
    """NoPE: no positional information at all (Kazemnejad et al. 2023, arXiv 2305.19466).

    Only meaningful with causal attention: the causal mask is what lets a token infer its
    position (e.g. by counting the keys it sees). Without it self-attention is
    permutation-equivariant, so a bidirectional Encoder with NoPE cannot tell word order.
    """

    hook = "none"

    def __init__(self, dims: ModelDims, options: EncodingOptions, *, rngs: nnx.Rngs):
        del dims, options, rngs


register(
    EncodingSpec(
        "none",
        "none",
        NoPositionalEncoding,
        num_params=lambda dims, options: 0,
        summary="NoPE: no positions",
    )
)
