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

from flaxformer_lite.core import absolute, attention_bias, rotary
from flaxformer_lite.core.positions import as_batched_positions

if TYPE_CHECKING:
    from flaxformer_lite.nn.model_config import ModelConfig

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
    """NoPE: no positional information at all (Kazemnejad et al. 2023, arXiv 2305.19466).

    Only meaningful with causal attention: the causal mask is what lets a token infer its
    position (e.g. by counting the keys it sees). Without it self-attention is
    permutation-equivariant, so a bidirectional Encoder with NoPE cannot tell word order.
    """

    hook = "none"

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        del cfg, rngs


class SinusoidalEncoding(PositionalEncoding):
    """Fixed sinusoids added to the embeddings (Vaswani et al. 2017, §3.5); see
    `absolute.sinusoidal` for the layout (sin on even dims, cos on odd dims)."""

    hook = "add"

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        del rngs
        self.d_model = cfg.d_model
        self.base = cfg.sinusoidal_base

    def add(self, x: Array, positions: Array) -> Array:
        pe = absolute.sinusoidal(positions, self.d_model, base=self.base)
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
    """RoPE (Su et al. 2021, arXiv 2104.09864): rotate q and k by ``position * theta_i``.

    Honours partial rotary (``rope_fraction``: only the first `rotary.rotary_dim_for`
    dimensions rotate) and context extension at evaluation time (``rope_scaling``: PI, NTK,
    dynamic NTK, YaRN; see `rotary.rope_scaled_inv_frequencies`). YaRN also multiplies
    q and k (all head dimensions) by ``sqrt(1/t) = 0.1 ln(s) + 1``. RoPE has no parameters,
    so a trained model is evaluated under a scaling by rebuilding it from
    ``rope_scaling_variant(cfg, eval_length, scaling)`` with the same state.
    """

    hook = "rotate"

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        del rngs
        self.base = cfg.rope_base
        self.layout = cfg.rope_layout
        self.rotary_dim = rotary.rotary_dim_for(cfg.head_dim, cfg.rope_fraction)
        self.scaling = cfg.rope_scaling
        self.scale = cfg.rope_scale
        self.original_length = cfg.rope_original_length
        self.yarn_alpha = cfg.yarn_alpha
        self.yarn_beta = cfg.yarn_beta
        yarn = cfg.rope_scaling == "yarn"
        self.attention_factor = rotary.yarn_attention_factor(cfg.rope_scale) if yarn else 1.0

    def rotate(
        self, q: Array, k: Array, q_positions: Array, k_positions: Array
    ) -> tuple[Array, Array]:
        inv_freq = rotary.rope_scaled_inv_frequencies(
            self.rotary_dim,
            scaling=self.scaling,
            scale=self.scale,
            base=self.base,
            original_length=self.original_length,
            alpha=self.yarn_alpha,
            beta=self.yarn_beta,
            k_positions=k_positions,
        )
        for x, pos in ((q, q_positions), (k, k_positions)):
            if as_batched_positions(pos).shape[1] != x.shape[1]:
                raise ValueError(f"positions shape {pos.shape} does not match x {x.shape}")
        q = rotary.apply_rotary(q, rotary.rope_angles(q_positions, inv_freq), layout=self.layout)
        k = rotary.apply_rotary(k, rotary.rope_angles(k_positions, inv_freq), layout=self.layout)
        if self.attention_factor != 1.0:
            factor = jnp.float32(self.attention_factor)
            q = (q.astype(jnp.float32) * factor).astype(q.dtype)
            k = (k.astype(jnp.float32) * factor).astype(k.dtype)
        return q, k


class ALiBiEncoding(PositionalEncoding):
    """ALiBi (Press et al. 2022, arXiv 2108.12409): a linear distance penalty per head."""

    hook = "bias"

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        del rngs
        self.num_heads = cfg.num_heads

    def bias(self, q_positions: Array, k_positions: Array, *, causal: bool) -> Array:
        slopes = attention_bias.alibi_slopes(self.num_heads)
        return attention_bias.alibi_bias(q_positions, k_positions, slopes, causal=causal)


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
    if cfg.rope_layout not in rotary.ROPE_LAYOUTS:
        raise ValueError(
            f"ModelConfig.rope_layout={cfg.rope_layout!r}: allowed values: "
            f"{list(rotary.ROPE_LAYOUTS)}"
        )
    f = cfg.rope_fraction
    if isinstance(f, bool) or not isinstance(f, int | float) or not 0.0 < f <= 1.0:
        raise ValueError(f"ModelConfig.rope_fraction={f!r}: must be a number in (0, 1]")
    if cfg.head_dim % 2 and f == 1.0:
        raise ValueError(
            f"ModelConfig.positional={cfg.positional!r} needs an even head_dim; d_model="
            f"{cfg.d_model} / num_heads={cfg.num_heads} = {cfg.head_dim}"
        )
    if cfg.head_dim < 2:
        raise ValueError(
            f"ModelConfig.positional={cfg.positional!r} needs head_dim >= 2; got {cfg.head_dim}"
        )
    _check_rope_scaling(cfg)


def _check_rope_scaling(cfg: ModelConfig) -> None:
    scaling, s, length = cfg.rope_scaling, cfg.rope_scale, cfg.rope_original_length
    if scaling not in rotary.ROPE_SCALINGS:
        raise ValueError(
            f"ModelConfig.rope_scaling={scaling!r}: allowed: {list(rotary.ROPE_SCALINGS)}"
        )
    if isinstance(s, bool) or not isinstance(s, int | float) or not 1.0 <= s < float("inf"):
        raise ValueError(f"ModelConfig.rope_scale={s!r}: must be a finite number >= 1")
    if scaling in ("none", "dynamic_ntk") and s != 1.0:
        raise ValueError(
            f"ModelConfig.rope_scale={s!r}: must be 1.0 with rope_scaling={scaling!r} "
            "(dynamic_ntk derives its scale from the current length)"
        )
    if length is not None and (
        isinstance(length, bool) or not isinstance(length, int) or length <= 0
    ):
        raise ValueError(
            f"ModelConfig.rope_original_length={length!r}: must be a positive int or None"
        )
    if scaling in ("yarn", "dynamic_ntk") and length is None:
        raise ValueError(
            f"ModelConfig.rope_original_length=None: rope_scaling={scaling!r} needs the "
            "training length"
        )
    a, b = cfg.yarn_alpha, cfg.yarn_beta
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (a, b)) or not (
        0.0 <= a < b
    ):
        raise ValueError(
            f"ModelConfig.yarn_alpha={a!r}, yarn_beta={b!r}: need numbers with 0 <= alpha < beta"
        )
    rotary_dim = rotary.rotary_dim_for(cfg.head_dim, cfg.rope_fraction)
    if scaling in ("ntk", "dynamic_ntk") and rotary_dim <= 2:
        raise ValueError(
            f"ModelConfig.rope_scaling={scaling!r} needs more than 2 rotated dims; "
            f"rope_fraction={cfg.rope_fraction} of head_dim={cfg.head_dim} rotates {rotary_dim}"
        )


def _check_learned(cfg: ModelConfig) -> None:
    if cfg.randomized_positions and cfg.max_position > cfg.max_length:
        raise ValueError(
            f"ModelConfig.max_position={cfg.max_position}: with randomized_positions the "
            f"learned table needs a row per position, so max_position must be <= "
            f"max_length={cfg.max_length}"
        )


ROPE_VARIANT_FIELDS = (
    "rope_base",
    "rope_layout",
    "rope_fraction",
    "rope_scaling",
    "rope_scale",
    "rope_original_length",
    "yarn_alpha",
    "yarn_beta",
)


def rope_scaling_variant(
    cfg: ModelConfig, eval_length: int, scaling: str | None = None
) -> ModelConfig:
    """The config that evaluates a RoPE model at ``eval_length`` under a context extension.

    ``s = max(1, eval_length / cfg.rope_original_length)`` for ``"pi"``, ``"ntk"`` and
    ``"yarn"``; ``"none"`` and ``"dynamic_ntk"`` keep ``rope_scale = 1`` (dynamic NTK takes
    its scale from the positions it sees). ``scaling`` defaults to ``cfg.rope_scaling``.
    RoPE has no parameters: build the model from the returned config and reuse the trained
    state (``nnx.update``). Name the results row with `encoding_row_name`.
    """
    scaling = cfg.rope_scaling if scaling is None else scaling
    if cfg.positional != "rope":
        raise ValueError(
            f"ModelConfig.positional={cfg.positional!r}: rope_scaling_variant needs 'rope'"
        )
    if scaling not in rotary.ROPE_SCALINGS:
        raise ValueError(f"scaling={scaling!r} is not known; allowed: {list(rotary.ROPE_SCALINGS)}")
    if cfg.rope_original_length is None:
        raise ValueError(
            "ModelConfig.rope_original_length=None: set it to the training length to derive "
            "the scale s = eval_length / rope_original_length"
        )
    if isinstance(eval_length, bool) or not isinstance(eval_length, int) or eval_length <= 0:
        raise ValueError(f"eval_length={eval_length!r}: must be a positive int")
    s = max(1.0, eval_length / cfg.rope_original_length)
    if scaling in ("none", "dynamic_ntk"):
        s = 1.0
    return cfg.replace(rope_scaling=scaling, rope_scale=float(s))


def encoding_row_name(cfg: ModelConfig) -> str:
    """The encoding's name in results rows: ``cfg.positional``, plus ``"+<scaling>"`` for a
    RoPE context extension (``"rope+pi"``, ``"rope+ntk"``, ``"rope+dynamic_ntk"``,
    ``"rope+yarn"``). The exact variant is in ``EncodingSpec.variant(cfg)``."""
    if cfg.positional == "rope" and cfg.rope_scaling != "none":
        return f"rope+{cfg.rope_scaling}"
    return cfg.positional


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
        check=_check_learned,
        summary="trained absolute table added to the embeddings",
    )
)
register(
    EncodingSpec(
        "rope",
        "rotate",
        RotaryEncoding,
        variant_fields=ROPE_VARIANT_FIELDS,
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
