"""The contract every positional encoding follows: one module, one hook, one options dataclass.

Every encoding acts at exactly one hook point and is the identity at the other two
(DESIGN.md §3):

* ``add``    -- ``add(x, positions)`` adds a ``[batch, length, d_model]`` encoding to the
  token embeddings (sinusoidal, learned);
* ``rotate`` -- ``rotate(q, k, q_positions, k_positions)`` rotates queries and keys
  (RoPE, xPos);
* ``bias``   -- ``bias(q_positions, k_positions, causal=...)`` returns a float32 logit bias
  ``[batch, heads, q_len, kv_len]`` (ALiBi, T5, KERPLE, FIRE);
* ``forget`` -- ``log_forget(x)`` sees the attention layer's input ``x`` ``[batch, length,
  d_model]`` and returns float32 log forget gates ``[batch, length, heads]``; the layer adds
  ``c_i - c_j`` of their prefix sums ``c`` to the logits (FoX; `core.forgetting`);
* ``none``   -- no positional information (NoPE).

An encoding's own settings (RoPE's base, T5's buckets, ...) are a frozen `EncodingOptions`
dataclass declared by its registry entry, not fields of the model config; an encoding sees
the model only through `ModelDims`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
from flax import nnx

Array = jax.Array
HOOKS = ("add", "rotate", "bias", "forget", "none")


@dataclasses.dataclass(frozen=True)
class ModelDims:
    """What an encoding may know about the model it is built into."""

    d_model: int  # residual width (add-hook encodings produce [batch, length, d_model])
    num_heads: int  # attention heads (bias-hook encodings produce one bias per head)
    head_dim: int  # per-head width (rotate-hook encodings rotate pairs of it)
    param_dtype: Any = "float32"  # storage dtype of the encoding's parameters


@dataclasses.dataclass(frozen=True)
class EncodingOptions:
    """Base of every encoding's options: a frozen, hashable dataclass with defaults.

    Subclasses declare their fields with a type annotation and a comment, and override
    `check` to validate them. ``path`` in messages is where the options live, e.g.
    ``ModelConfig.positional_options`` (so an error reads
    ``ModelConfig.positional_options.base=1.0: must be a number > 1``).
    """

    def check(self, dims: ModelDims, path: str) -> None:
        """Raise a ValueError naming ``path.<field>``, the value and what is allowed."""
        del dims, path


class PositionalEncoding(nnx.Module):
    """Base class: the identity at every hook. Subclasses override the one they act at."""

    hook: ClassVar[str] = "none"
    # True: cached decoding rotates each step's new queries and keys at their own positions
    # and caches the rotated keys (Hugging Face's convention; RoPE). False: keys are cached
    # unrotated and each step rotates the whole cache with all its positions (xPos, whose key
    # scale depends on every key position). See `flaxformer_lite.core.kv_cache`.
    caches_rotated_keys: ClassVar[bool] = False

    def add(self, x: Array, positions: Array) -> Array:
        """``x``: ``[batch, length, d_model]`` embeddings; positions ``[batch, length]``."""
        del positions
        return x

    def rotate(
        self, q: Array, k: Array, q_positions: Array, k_positions: Array
    ) -> tuple[Array, Array]:
        """``q``: ``[b, q_len, heads, head_dim]``, ``k``: ``[b, kv_len, heads, head_dim]``."""
        del q_positions, k_positions
        return q, k

    def bias(self, q_positions: Array, k_positions: Array, *, causal: bool) -> Array:
        """Float32 logit bias ``[batch, heads, q_len, kv_len]`` (bias-hook encodings only)."""
        raise NotImplementedError(f"{type(self).__name__} has no attention bias")

    def log_forget(self, x: Array) -> Array:
        """Float32 log forget gates ``[batch, length, heads]`` of the attention layer's input
        ``x`` ``[batch, length, d_model]`` (forget-hook encodings only)."""
        raise NotImplementedError(f"{type(self).__name__} has no forget gates")
