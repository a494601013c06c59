"""More positional encodings for the length-extrapolation studies (issue 6).

Each is one NNX module plus one registry entry (imported, hence registered, by
``import flaxformer_lite``); the formulas are pure functions in `flaxformer_lite.core`.

* ``xpos`` (rotate): RoPE + per-pair exponential decay (Sun et al. 2022); causal only;
* ``t5`` (bias): a learned scalar per (log-spaced distance bucket, head) (Raffel et al. 2020);
* ``kerple_log`` / ``kerple_power`` (bias): ``-r1 log(1 + r2 |i-j|)`` / ``-r1 |i-j|^r2``
  with learned ``r1, r2`` per head (Chi et al. 2022);
* ``fire`` (bias): an MLP of ``psi(|i-j|) / psi(max(L, i))`` with learned MLP, ``c`` and
  ``L`` (Li et al. 2024).

Bias modules return float32 ``[batch, heads, q_len, kv_len]``. Like every encoding here,
each stack (encoder, decoder) owns one instance shared by its layers, as T5 shares its
relative-bias table.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx

from flaxformer_lite.core import attention_bias, rotary
from flaxformer_lite.core.positions import relative_positions
from flaxformer_lite.nn.encodings.registry import (
    EncodingSpec,
    PositionalEncoding,
    _check_rope,
    register,
)

if TYPE_CHECKING:
    from flaxformer_lite.nn.model_config import ModelConfig

Array = jax.Array
KERPLE_EPS = 0.01  # lower clamp of r1 and r2 (chijames/KERPLE ``self.eps = 1e-2``)
KERPLE_POWER_MAX = 2.0  # upper clamp of the power variant's exponent r2
FIRE_INIT_C = 0.1  # initial c of psi(x) = log(c x + 1) (Li et al. 2024)
FIRE_EPS = 1e-6  # added to psi(max(L, i)), as in the public FIRE implementations


def _clamp(x: Array, low: float, high: float | None = None) -> Array:
    """``clip(x, low, high)`` in the forward pass, identity gradient (straight-through).

    The reference clamps the parameter tensor in place before each forward pass; a plain
    ``jnp.clip`` would instead zero the gradient of a parameter outside the box and could
    leave it stuck there. Here the used value is always inside the box and the parameter
    keeps receiving gradients.
    """
    return x + jax.lax.stop_gradient(jnp.clip(x, low, high) - x)


class XPosEncoding(PositionalEncoding):
    """xPos (Sun et al. 2022, arXiv 2212.10554; torchscale ``XPOS``): RoPE whose pair i is
    scaled by ``zeta_i^(n/B)`` on queries and ``zeta_i^(-m/B)`` on keys, ``B`` =
    ``xpos_scale_base`` (512), ``zeta_i = (2i + 0.4d)/(1.4d)``: logits decay like
    ``zeta^((n-m)/B)`` with the distance. Defined for causal attention only.

    Centring: the scale exponent uses ``n - c`` with ``c = (min + max) // 2`` of each row's
    key positions (`rotary.xpos_center`), applied to queries and keys alike. The
    logits do not depend on ``c`` (it cancels in ``zeta^((n-c) - (m-c))``); it keeps the
    factors near 1 for long or randomized positions (torchscale also centres them). Shifting
    all positions by ``s`` shifts ``c`` by exactly ``s``, so the scaled q and k are unchanged.
    Honours ``rope_fraction`` (the decay applies to the rotated pairs only, ``d`` =
    rotated dims), ``rope_base`` and ``rope_layout``; no ``rope_scaling``.
    """

    hook = "rotate"

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        del rngs
        self.base = cfg.rope_base
        self.layout = cfg.rope_layout
        self.rotary_dim = rotary.rotary_dim_for(cfg.head_dim, cfg.rope_fraction)
        self.scale_base = cfg.xpos_scale_base

    def rotate(
        self, q: Array, k: Array, q_positions: Array, k_positions: Array
    ) -> tuple[Array, Array]:
        center = rotary.xpos_center(k_positions)
        kw = dict(
            center=center,
            scale_base=self.scale_base,
            base=self.base,
            layout=self.layout,
            rotary_dim=self.rotary_dim,
        )
        q = rotary.apply_xpos(q, q_positions, inverse=False, **kw)
        k = rotary.apply_xpos(k, k_positions, inverse=True, **kw)
        return q, k


class T5RelativeBias(PositionalEncoding):
    """T5 relative attention bias (Raffel et al. 2020; flaxformer ``RelativePositionBiases``).

    A learned table ``[t5_num_buckets, heads]`` (logical axes ``("relpos_buckets",
    "heads")``, init normal with std ``1/sqrt(num_buckets)`` like flaxformer's embedding
    init); the bias of query i and key j is the row of bucket
    `attention_bias.t5_relative_position_bucket` ``(q_pos - k_pos)``: causal bucketing under
    causal attention, bidirectional (half the buckets per direction) otherwise.
    """

    hook = "bias"

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.num_buckets = cfg.t5_num_buckets
        self.max_distance = cfg.t5_max_distance
        init = nnx.initializers.variance_scaling(
            1.0, "fan_in", "truncated_normal", in_axis=0, out_axis=1
        )
        self.table = nnx.Param(
            init(rngs.params(), (cfg.t5_num_buckets, cfg.num_heads), cfg.params_dtype),
            logical_axes=("relpos_buckets", "heads"),
        )

    def bias(self, q_positions: Array, k_positions: Array, *, causal: bool) -> Array:
        rel = relative_positions(q_positions, k_positions)
        buckets = attention_bias.t5_relative_position_bucket(
            rel,
            bidirectional=not causal,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )
        values = jnp.take(self.table[...].astype(jnp.float32), buckets, axis=0)  # [b,q,k,h]
        return jnp.transpose(values, (0, 3, 1, 2))


class KerpleBias(PositionalEncoding):
    """KERPLE (Chi et al. 2022, arXiv 2205.09921; chijames/KERPLE), two variants:

    * ``"log"``:   ``-r1_h * log(1 + r2_h * |i - j|)``   (r1 init U(0, 2), r2 init U(0, 1));
    * ``"power"``: ``-r1_h * |i - j|^r2_h``              (r1 init U(0, 1), r2 init U(0, 2));

    as the reference initialises them, then clamped into the box. The values used are
    clamped to ``r1 >= 0.01``, ``r2 >= 0.01`` and, for power, ``r2 <= 2`` (the kernel is
    conditionally positive definite only for ``0 < r2 <= 2``), with a straight-through
    gradient (see `_clamp`). Parameters ``[heads]``, logical axis ``("heads",)``. The same
    ``|i - j|`` form serves causal and bidirectional attention.
    """

    hook = "bias"

    def __init__(self, cfg: ModelConfig, *, variant: str, rngs: nnx.Rngs):
        if variant not in ("log", "power"):
            raise ValueError(f"KERPLE variant={variant!r}; allowed: ['log', 'power']")
        self.variant = variant
        r2_max = KERPLE_POWER_MAX if variant == "power" else None
        self.r2_max = r2_max
        r1_scale, r2_scale = (2.0, 1.0) if variant == "log" else (1.0, 2.0)
        shape, dtype = (cfg.num_heads,), cfg.params_dtype
        r1 = jax.random.uniform(rngs.params(), shape, dtype) * r1_scale
        r2 = jax.random.uniform(rngs.params(), shape, dtype) * r2_scale
        self.r1 = nnx.Param(jnp.clip(r1, KERPLE_EPS, None), logical_axes=("heads",))
        self.r2 = nnx.Param(jnp.clip(r2, KERPLE_EPS, r2_max), logical_axes=("heads",))

    def coefficients(self) -> tuple[Array, Array]:
        """The clamped ``(r1, r2)`` actually used, float32 ``[heads]`` each."""
        r1 = _clamp(self.r1[...].astype(jnp.float32), KERPLE_EPS)
        r2 = _clamp(self.r2[...].astype(jnp.float32), KERPLE_EPS, self.r2_max)
        return r1, r2

    def bias(self, q_positions: Array, k_positions: Array, *, causal: bool) -> Array:
        del causal
        r1, r2 = self.coefficients()
        fn = (
            attention_bias.kerple_log_bias
            if self.variant == "log"
            else attention_bias.kerple_power_bias
        )
        return fn(q_positions, k_positions, r1, r2)


class FireBias(PositionalEncoding):
    """FIRE (Li et al. 2024, arXiv 2310.04418): ``b(i, j) = f_theta(psi(i - j) / psi(max(L, i)))``.

    ``psi(x) = log(c x + 1)``; ``i`` is the query position (explicit positions, so it is
    the true position even with randomized positions or an offset); ``f_theta`` is
    ``Dense(1 -> fire_mlp_width) -> ReLU -> Dense(width -> heads)``. Learned: the MLP, ``c``
    (init 0.1) and ``L = |l| * fire_threshold_init`` with ``l`` init 1 (the public
    implementations learn this multiplier; ``c`` enters as ``|c|``). The normalised distance
    is `attention_bias.fire_normalized_distance`: it uses ``|i - j|``, so under bidirectional
    attention the bias is symmetric in past and future (the paper defines FIRE for causal
    attention, where future keys are masked anyway).

    The MLP is evaluated one hidden unit at a time (a ``lax.scan`` accumulating ``width``
    elementwise terms), so the forward pass never materialises a ``[batch, q_len, kv_len,
    width]`` array (long evaluation lengths); gradients keep one term per unit. Dense
    weights and biases are initialised U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (PyTorch's
    ``nn.Linear`` default, used by the reference), so first-layer units start with a range
    of ReLU break points instead of all at 0.
    """

    hook = "bias"

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        width, heads, dtype = cfg.fire_mlp_width, cfg.num_heads, cfg.params_dtype
        self.threshold_init = cfg.fire_threshold_init

        def uniform(fan_in: int, shape: tuple[int, ...]) -> Array:
            bound = 1.0 / math.sqrt(fan_in)
            return jax.random.uniform(rngs.params(), shape, dtype, -bound, bound)

        self.w1 = nnx.Param(uniform(1, (1, width)), logical_axes=("fire_input", "fire_mlp"))
        self.b1 = nnx.Param(uniform(1, (width,)), logical_axes=("fire_mlp",))
        self.w2 = nnx.Param(uniform(width, (width, heads)), logical_axes=("fire_mlp", "heads"))
        self.b2 = nnx.Param(uniform(width, (heads,)), logical_axes=("heads",))
        self.c = nnx.Param(jnp.asarray(FIRE_INIT_C, dtype), logical_axes=())
        self.threshold_scale = nnx.Param(jnp.asarray(1.0, dtype), logical_axes=())

    def threshold(self) -> Array:
        """The learned threshold ``L`` (float32 scalar)."""
        return jnp.abs(self.threshold_scale[...].astype(jnp.float32)) * self.threshold_init

    def normalized_distance(self, q_positions: Array, k_positions: Array) -> Array:
        """The MLP's input, float32 ``[batch, q_len, kv_len]``."""
        return attention_bias.fire_normalized_distance(
            q_positions,
            k_positions,
            c=jnp.abs(self.c[...].astype(jnp.float32)),
            threshold=self.threshold(),
            eps=FIRE_EPS,
        )

    def bias(self, q_positions: Array, k_positions: Array, *, causal: bool) -> Array:
        del causal
        u = self.normalized_distance(q_positions, k_positions)[:, None]  # [b, 1, q, k]
        w1 = self.w1[...].astype(jnp.float32)[0]  # [width]
        b1 = self.b1[...].astype(jnp.float32)  # [width]
        w2 = self.w2[...].astype(jnp.float32)  # [width, heads]
        b2 = self.b2[...].astype(jnp.float32)
        out = jnp.broadcast_to(b2[None, :, None, None], (u.shape[0], b2.shape[0], *u.shape[2:]))

        def add_unit(acc: Array, unit: tuple[Array, Array, Array]) -> tuple[Array, None]:
            a, b, w = unit  # one hidden unit: relu(u a + b) w_h
            return acc + jax.nn.relu(u * a + b) * w[None, :, None, None], None

        out, _ = jax.lax.scan(add_unit, out, (w1, b1, w2))
        return out


# ----------------------------------------------------------------------------- registry


def _fail(field: str, value: object, allowed: str) -> None:
    raise ValueError(f"ModelConfig.{field}={value!r}: {allowed}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_xpos(cfg: ModelConfig) -> None:
    _check_rope(cfg)
    if cfg.rope_scaling != "none":
        _fail("rope_scaling", cfg.rope_scaling, "xpos supports only 'none'")
    v = cfg.xpos_scale_base
    if not _is_number(v) or not 0 < v < math.inf:
        _fail("xpos_scale_base", v, "must be a finite number > 0")


def _check_t5(cfg: ModelConfig) -> None:
    n, d = cfg.t5_num_buckets, cfg.t5_max_distance
    if not _is_int(n) or n < 4 or n % 2:
        _fail("t5_num_buckets", n, "must be an even int >= 4 (half per direction)")
    if not _is_int(d) or d <= n // 2:
        _fail("t5_max_distance", d, f"must be an int > t5_num_buckets // 2 = {n // 2}")


def _check_fire(cfg: ModelConfig) -> None:
    w, t = cfg.fire_mlp_width, cfg.fire_threshold_init
    if not _is_int(w) or w <= 0:
        _fail("fire_mlp_width", w, "must be a positive int")
    if not _is_number(t) or not 0 < t < math.inf:
        _fail("fire_threshold_init", t, "must be a finite number > 0")


register(
    EncodingSpec(
        "xpos",
        "rotate",
        XPosEncoding,
        variant_fields=("rope_base", "rope_layout", "rope_fraction", "xpos_scale_base"),
        check=_check_xpos,
        causal_only=True,
        summary="RoPE with exponential decay of the logits with distance (Sun et al. 2022)",
    )
)
register(
    EncodingSpec(
        "t5",
        "bias",
        T5RelativeBias,
        variant_fields=("t5_num_buckets", "t5_max_distance"),
        check=_check_t5,
        summary="learned bias per log-spaced distance bucket and head (Raffel et al. 2020)",
    )
)
register(
    EncodingSpec(
        "kerple_log",
        "bias",
        lambda cfg, *, rngs: KerpleBias(cfg, variant="log", rngs=rngs),
        summary="KERPLE logarithmic kernel -r1 log(1 + r2 |i-j|) (Chi et al. 2022)",
    )
)
register(
    EncodingSpec(
        "kerple_power",
        "bias",
        lambda cfg, *, rngs: KerpleBias(cfg, variant="power", rngs=rngs),
        summary="KERPLE power kernel -r1 |i-j|^r2 (Chi et al. 2022)",
    )
)
register(
    EncodingSpec(
        "fire",
        "bias",
        FireBias,
        variant_fields=("fire_mlp_width", "fire_threshold_init"),
        check=_check_fire,
        summary="MLP of the progressively normalised log distance (Li et al. 2024)",
    )
)
