"""Positional encodings as NNX modules behind one registry (DESIGN.md §3).

Every encoding acts at exactly one hook point and is the identity at the other two:

* ``add``    -- ``add(x, positions)`` adds a ``[batch, length, d_model]`` encoding to the
  token embeddings (sinusoidal, learned);
* ``rotate`` -- ``rotate(q, k, q_positions, k_positions)`` rotates queries and keys
  (RoPE);
* ``bias``   -- ``bias(q_positions, k_positions, causal=...)`` returns a float32 logit bias
  ``[batch, heads, q_len, kv_len]`` (ALiBi);
* ``none``   -- no positional information (NoPE; only meaningful with causal attention,
  which breaks the permutation symmetry of self-attention).

Models ask the registry for the encoding named in the config and call the hooks; they never
branch on an encoding's name. Adding an encoding is one class, one `register` call and its
tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from flaxformer_lite import positional

if TYPE_CHECKING:
    from flaxformer_lite.config import ModelConfig

Array = jax.Array
HOOKS = ("add", "rotate", "bias", "none")


class PositionalEncoding(nnx.Module):
    """Base class: the identity at every hook. Subclasses override the one they act at."""

    hook: ClassVar[str] = "none"

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


class NoPositionalEncoding(PositionalEncoding):
    """NoPE: no positional information at all (Kazemnejad et al. 2023, arXiv 2305.19466)."""

    hook = "none"

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        del cfg, rngs


class SinusoidalEncoding(PositionalEncoding):
    """Fixed sinusoids added to the embeddings (Vaswani et al. 2017, §3.5); see
    `positional.sinusoidal` for the layout (sin on even dims, cos on odd dims)."""

    hook = "add"

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        del rngs
        self.d_model = cfg.d_model
        self.base = cfg.sinusoidal_base

    def add(self, x: Array, positions: Array) -> Array:
        pe = positional.sinusoidal(positions, self.d_model, base=self.base)
        return (x.astype(jnp.float32) + pe).astype(x.dtype)


class LearnedEncoding(PositionalEncoding):
    """A trained table ``[max_length, d_model]`` added to the embeddings (GPT-2, BERT).

    It cannot encode a position it has no row for. JAX clamps out-of-range gathers silently
    (the last row would be reused), which would make an extrapolation study a lie, so:

    * a sequence longer than the table is a ``ValueError`` when the model is traced;
    * a position value past the table (e.g. an offset under jit) gathers NaN rows, which
      poison the output visibly instead of clamping.

    Studies that evaluate beyond the training length size the table for the longest
    evaluation length; rows past the training length are then never trained.
    """

    hook = "add"

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.max_length = cfg.max_length
        init = nnx.initializers.normal(stddev=0.02)
        self.table = nnx.Param(
            init(rngs.params(), (cfg.max_length, cfg.d_model), cfg.params_dtype),
            logical_axes=("position", "embed"),
        )

    def add(self, x: Array, positions: Array) -> Array:
        length = positions.shape[-1]
        if length > self.max_length:
            raise ValueError(
                f"learned positional table has max_length={self.max_length} rows but the "
                f"sequence has length {length}; set ModelConfig.max_length >= {length} "
                "(rows beyond the training length stay untrained)"
            )
        table = self.table[...].astype(jnp.float32)
        pe = jnp.take(table, positions, axis=0, mode="fill", fill_value=jnp.nan)
        return (x.astype(jnp.float32) + pe).astype(x.dtype)


class RotaryEncoding(PositionalEncoding):
    """RoPE (Su et al. 2021, arXiv 2104.09864): rotate q and k by ``position * theta_i``."""

    hook = "rotate"

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        del rngs
        self.base = cfg.rope_base
        self.layout = cfg.rope_layout

    def rotate(
        self, q: Array, k: Array, q_positions: Array, k_positions: Array
    ) -> tuple[Array, Array]:
        q = positional.apply_rope(q, q_positions, base=self.base, layout=self.layout)
        k = positional.apply_rope(k, k_positions, base=self.base, layout=self.layout)
        return q, k


class ALiBiEncoding(PositionalEncoding):
    """ALiBi (Press et al. 2022, arXiv 2108.12409): a linear distance penalty per head."""

    hook = "bias"

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        del rngs
        self.num_heads = cfg.num_heads

    def bias(self, q_positions: Array, k_positions: Array, *, causal: bool) -> Array:
        slopes = positional.alibi_slopes(self.num_heads)
        return positional.alibi_bias(q_positions, k_positions, slopes, causal=causal)


# ----------------------------------------------------------------------------- registry


@dataclasses.dataclass(frozen=True)
class EncodingSpec:
    """A registry entry: how to build an encoding and what it needs from the config.

    Attributes:
      name: the config name (``ModelConfig.positional``).
      hook: where it acts, one of `HOOKS`.
      factory: ``factory(cfg, rngs=...)`` returns the `PositionalEncoding` module.
      variant_fields: ``ModelConfig`` fields that define the exact variant; recorded in
        every results row (papers disagree on what "rotary" means).
      check: optional extra validation of a config, raising ``ValueError``.
      causal_only: the encoding is defined only for causal self-attention (e.g. xPos).
      summary: one line for listings and docs.
    """

    name: str
    hook: str
    factory: Callable[..., PositionalEncoding]
    variant_fields: tuple[str, ...] = ()
    check: Callable[[ModelConfig], None] | None = None
    causal_only: bool = False
    summary: str = ""

    def build(self, cfg: ModelConfig, *, rngs: nnx.Rngs) -> PositionalEncoding:
        return self.factory(cfg, rngs=rngs)

    def validate(self, cfg: ModelConfig) -> None:
        if self.check is not None:
            self.check(cfg)

    def variant(self, cfg: ModelConfig) -> dict[str, Any]:
        """The exact variant, e.g. ``{"positional": "rope", "rope_base": 10000.0, ...}``."""
        return {"positional": self.name} | {f: getattr(cfg, f) for f in self.variant_fields}


_REGISTRY: dict[str, EncodingSpec] = {}


def register(spec: EncodingSpec) -> EncodingSpec:
    """Add an encoding to the registry (names are unique)."""
    if spec.hook not in HOOKS:
        raise ValueError(f"EncodingSpec.hook={spec.hook!r}; allowed: {list(HOOKS)}")
    if spec.name in _REGISTRY:
        raise ValueError(f"positional encoding {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def positional_encoding_names() -> tuple[str, ...]:
    """Registered names, in registration order."""
    return tuple(_REGISTRY)


def get_positional_encoding(name: str) -> EncodingSpec:
    """The registry entry for ``name``; an unknown name lists the valid ones."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"ModelConfig.positional={name!r} is not a known positional encoding; "
            f"allowed: {list(_REGISTRY)}"
        ) from None


def _check_rope(cfg: ModelConfig) -> None:
    if cfg.rope_layout not in positional.ROPE_LAYOUTS:
        raise ValueError(
            f"ModelConfig.rope_layout={cfg.rope_layout!r}: allowed values: "
            f"{list(positional.ROPE_LAYOUTS)}"
        )
    if cfg.head_dim % 2:
        raise ValueError(
            f"ModelConfig.positional='rope' needs an even head_dim; d_model={cfg.d_model} / "
            f"num_heads={cfg.num_heads} = {cfg.head_dim}"
        )


register(EncodingSpec("none", "none", NoPositionalEncoding, summary="NoPE: no positions"))
register(
    EncodingSpec(
        "sinusoidal",
        "add",
        SinusoidalEncoding,
        variant_fields=("sinusoidal_base",),
        summary="fixed sinusoids added to the embeddings (Vaswani et al. 2017)",
    )
)
register(
    EncodingSpec(
        "learned",
        "add",
        LearnedEncoding,
        variant_fields=("max_length",),
        summary="trained absolute table added to the embeddings",
    )
)
register(
    EncodingSpec(
        "rope",
        "rotate",
        RotaryEncoding,
        variant_fields=("rope_base", "rope_layout"),
        check=_check_rope,
        summary="rotary embedding of queries and keys (Su et al. 2021)",
    )
)
register(
    EncodingSpec(
        "alibi",
        "bias",
        ALiBiEncoding,
        summary="linear distance bias on the logits (Press et al. 2022)",
    )
)
