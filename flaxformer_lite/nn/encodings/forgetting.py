"""The encoding that **forgets**: forgetting attention (FoX, hook ``forget``).

Lin et al. 2025, "Forgetting Transformer: Softmax Attention with a Forget Gate" (ICLR 2025,
arXiv 2503.02130): each head has a scalar forget gate per token computed from the attention
layer's input, ``f_t = sigmoid(w_h . x_t + b_h)``, and the logit of query ``i`` for key ``j
<= i`` gets ``sum_{k=j+1..i} log f_k = c_i - c_j`` with ``c`` the prefix sum of ``log f``
(`flaxformer_lite.core.forgetting`): a learned, data-dependent decay, and no other position.
The module returns the log gates; the attention layer takes their prefix sums and passes them
to `core.attention.attend` (``forget_prefix``), whose chunked path adds ``c_q[i] - c_k[j]``
block by block, and keeps them per key in the KV cache (`core.kv_cache.continue_prefix`).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from flaxformer_lite.base.checks import fail, is_number
from flaxformer_lite.core import forgetting
from flaxformer_lite.nn.encodings.base import EncodingOptions, ModelDims, PositionalEncoding
from flaxformer_lite.nn.encodings.registry import EncodingSpec, register

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class FoxOptions(EncodingOptions):
    """Options of forgetting attention."""

    # b_h at initialisation: f = sigmoid(5) ~ 0.993, little forgetting at first
    # (x-transformers DataDependentAlibi, bias_init=5)
    gate_bias_init: float = 5.0

    def check(self, dims: ModelDims, path: str) -> None:
        value = self.gate_bias_init
        if not is_number(value) or not -math.inf < value < math.inf:
            fail(f"{path}.gate_bias_init", value, "must be a finite number")


class ForgettingGates(PositionalEncoding):
    """FoX's forget gates of one decoder layer: ``w`` ``[d_model, heads]`` (normal, std
    ``d_model ** -0.5``; logical axes ``("embed", "heads")``) and ``b`` ``[heads]``
    (``gate_bias_init``). Causal self-attention only; built per layer."""

    hook = "forget"

    def __init__(self, dims: ModelDims, options: FoxOptions, *, rngs: nnx.Rngs):
        dtype = jnp.dtype(dims.param_dtype)
        init = nnx.initializers.normal(stddev=dims.d_model**-0.5)
        self.w = nnx.Param(
            init(rngs.params(), (dims.d_model, dims.num_heads), dtype),
            logical_axes=("embed", "heads"),
        )
        self.b = nnx.Param(
            jnp.full((dims.num_heads,), options.gate_bias_init, dtype), logical_axes=("heads",)
        )

    def log_forget(self, x: Array) -> Array:
        """``log f_t = log sigmoid(x_t . w_h + b_h)``, float32 ``[batch, length, heads]`` from
        the layer input ``x`` ``[batch, length, d_model]`` (`forgetting.log_forget_gates`)."""
        return forgetting.log_forget_gates(x, self.w[...], self.b[...])


register(
    EncodingSpec(
        "fox",
        "forget",
        ForgettingGates,
        options=FoxOptions,
        causal_only=True,
        per_layer=True,
        num_params=lambda dims, options: dims.d_model * dims.num_heads + dims.num_heads,
        summary="forgetting attention: a learned data-dependent decay (Lin et al. 2025)",
    )
)
