"""Encodings that **bias** the attention logits: ALiBi, T5, KERPLE and FIRE (hook ``bias``).

Each is one NNX module, its options and one registry entry; the formulas are pure functions
in `flaxformer_lite.core.attention_bias`. Bias modules return float32 ``[batch, heads, q_len,
kv_len]``. Like every encoding here, each stack (encoder, decoder) owns one instance shared by
its layers, as T5 shares its relative-bias table.

* ``alibi``: a fixed linear distance penalty per head (Press et al. 2022);
* ``t5``: a learned scalar per (log-spaced distance bucket, head) (Raffel et al. 2020);
* ``kerple_log`` / ``kerple_power``: ``-r1 log(1 + r2 |i-j|)`` / ``-r1 |i-j|^r2`` with learned
  ``r1, r2`` per head (Chi et al. 2022);
* ``fire``: an MLP of ``psi(|i-j|) / psi(max(L, i))`` with learned MLP, ``c`` and ``L``
  (Li et al. 2024).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from flaxformer_lite.base.checks import ConfigError, check_positive_int, fail, is_int, is_number
from flaxformer_lite.core import attention_bias
from flaxformer_lite.core.positions import relative_positions
from flaxformer_lite.nn.encodings.base import EncodingOptions, ModelDims, PositionalEncoding
from flaxformer_lite.nn.encodings.registry import EncodingSpec, NoOptions, register

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class ALiBiOptions(EncodingOptions):
    """Options of ALiBi (defaults: the paper's slopes)."""

    # "official": Press et al.'s get_slopes (= BLOOM); "mpt": MPT's build_mpt_alibi_tensor
    slopes: str = "official"
    max_bias: float = 8.0  # the largest exponent: slopes run from 2^(-max_bias/n) (MPT's
    # alibi_bias_max)
    # position interpolation (Al-Khateeb et al. 2023, arXiv 2310.13017): the training length L
    # (None: none; the evaluation variant "alibi_pi" needs it) and the length L' evaluated at
    # (None: L); slopes m_h * min(1, L / L')
    pi_train_length: int | None = None
    pi_eval_length: int | None = None

    def check(self, dims: ModelDims, path: str) -> None:
        if self.slopes not in attention_bias.ALIBI_SLOPES:
            fail(f"{path}.slopes", self.slopes, f"allowed: {list(attention_bias.ALIBI_SLOPES)}")
        if not is_number(self.max_bias) or not 0 < self.max_bias < math.inf:
            fail(f"{path}.max_bias", self.max_bias, "must be a finite number > 0")
        for name in ("pi_train_length", "pi_eval_length"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value <= 0):
                fail(f"{path}.{name}", value, "must be a positive int or None")
        if self.pi_eval_length is not None and self.pi_train_length is None:
            fail(
                f"{path}.pi_train_length",
                None,
                f"pi_eval_length={self.pi_eval_length} scales the slopes by L / L': set the "
                "training length L",
            )


class ALiBiEncoding(PositionalEncoding):
    """ALiBi (Press et al. 2022, arXiv 2108.12409): a linear distance penalty per head, with
    the slopes of `attention_bias.alibi_slopes` ("official") or
    `attention_bias.mpt_alibi_slopes` ("mpt"), up to ``max_bias``.

    With ``pi_train_length`` L and ``pi_eval_length`` L' (position interpolation, Al-Khateeb
    et al. 2023, arXiv 2310.13017) the slopes are ``m_h * min(1, L / L')``
    (`attention_bias.alibi_interpolated_slopes`): the evaluation variant ``"alibi_pi"``
    (`alibi_at_length`) sets L' to the evaluation length, training-free."""

    hook = "bias"

    def __init__(self, dims: ModelDims, options: ALiBiOptions, *, rngs: nnx.Rngs):
        del rngs
        self.num_heads = dims.num_heads
        self.slopes = options.slopes
        self.max_bias = options.max_bias
        self.pi_train_length = options.pi_train_length
        self.pi_eval_length = options.pi_eval_length

    def slope_values(self) -> Array:
        """float32 ``[heads]`` (interpolated when ``pi_eval_length`` is set)."""
        fn = (
            attention_bias.mpt_alibi_slopes if self.slopes == "mpt" else attention_bias.alibi_slopes
        )
        slopes = fn(self.num_heads, max_bias=self.max_bias)
        if self.pi_eval_length is None:
            return slopes
        return attention_bias.alibi_interpolated_slopes(
            slopes, train_length=self.pi_train_length, eval_length=self.pi_eval_length
        )

    def bias(self, q_positions: Array, k_positions: Array, *, causal: bool) -> Array:
        slopes = self.slope_values()
        return attention_bias.alibi_bias(q_positions, k_positions, slopes, causal=causal)


ALIBI_EVAL_VARIANTS = ("alibi_pi",)  # EvalConfig.rope_scalings names them beside RoPE's


def alibi_at_length(options: ALiBiOptions, variant: str, eval_length: int) -> ALiBiOptions:
    """ALiBi's options for evaluating at ``eval_length`` under ``variant`` ``"alibi_pi"``:
    position interpolation, slopes ``m_h * min(1, L / eval_length)`` with ``L`` =
    ``pi_train_length`` (Al-Khateeb et al. 2023, arXiv 2310.13017). Same (no) parameters."""
    if variant not in ALIBI_EVAL_VARIANTS:
        raise ValueError(f"variant={variant!r}; ALiBi's allowed: {list(ALIBI_EVAL_VARIANTS)}")
    if options.pi_train_length is None:
        raise ValueError(
            "ModelConfig.positional_options.pi_train_length=None: the 'alibi_pi' evaluation "
            "variant scales the slopes by L / L'; set the training length L"
        )
    eval_length = check_positive_int("eval_length", eval_length)
    return dataclasses.replace(options, pi_eval_length=eval_length)


def alibi_unscaled_at(options: ALiBiOptions, variant: str, eval_length: int) -> bool:
    """Whether `alibi_at_length` leaves the model exactly as it is: its slopes are not
    interpolated already and ``eval_length <= pi_train_length`` (`core.attention_bias.
    alibi_interpolated_slopes` keeps the slopes there)."""
    return (
        variant in ALIBI_EVAL_VARIANTS
        and options.pi_eval_length is None
        and options.pi_train_length is not None
        and eval_length <= options.pi_train_length
    )


def _alibi_label(options: ALiBiOptions) -> str:
    """``"+pi"`` when the slopes are interpolated, else ``""``."""
    return "" if options.pi_eval_length is None else "+pi"


KERPLE_EPS = 0.01  # lower clamp of r1 and r2 (chijames/KERPLE ``self.eps = 1e-2``)
KERPLE_POWER_MAX = 2.0  # upper clamp of the power kernel's exponent r2
KERPLE_KERNELS = ("log", "power")
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


@dataclasses.dataclass(frozen=True)
class T5Options(EncodingOptions):
    """Options of the T5 relative bias (T5: 32 buckets, max distance 128 with inputs of 512)."""

    num_buckets: int = 32  # buckets (half per direction when bidirectional)
    max_distance: int = 128  # distances >= this share their side's last bucket

    def check(self, dims: ModelDims, path: str) -> None:
        n, d = self.num_buckets, self.max_distance
        if not is_int(n) or n < 4 or n % 2:
            fail(f"{path}.num_buckets", n, "must be an even int >= 4 (half per direction)")
        if not is_int(d) or d <= n // 2:
            fail(f"{path}.max_distance", d, f"must be an int > num_buckets // 2 = {n // 2}")


class T5RelativeBias(PositionalEncoding):
    """T5 relative attention bias (Raffel et al. 2020; flaxformer ``RelativePositionBiases``).

    A learned table ``[num_buckets, heads]`` (logical axes ``("relpos_buckets",
    "heads")``, init normal with std ``1/sqrt(num_buckets)`` like flaxformer's embedding
    init); the bias of query i and key j is the row of bucket
    `attention_bias.t5_relative_position_bucket` ``(q_pos - k_pos)``: causal bucketing under
    causal attention, bidirectional (half the buckets per direction) otherwise.
    """

    hook = "bias"

    def __init__(self, dims: ModelDims, options: T5Options, *, rngs: nnx.Rngs):
        self.num_buckets = options.num_buckets
        self.max_distance = options.max_distance
        init = nnx.initializers.variance_scaling(
            1.0, "fan_in", "truncated_normal", in_axis=0, out_axis=1
        )
        self.table = nnx.Param(
            init(rngs.params(), (options.num_buckets, dims.num_heads), jnp.dtype(dims.param_dtype)),
            logical_axes=("relpos_buckets", "heads"),
        )

    def bias(self, q_positions: Array, k_positions: Array, *, causal: bool) -> Array:
        rel_BTS = relative_positions(q_positions, k_positions)
        buckets_BTS = attention_bias.t5_relative_position_bucket(
            rel_BTS,
            bidirectional=not causal,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )
        values_BTSN = jnp.take(self.table[...].astype(jnp.float32), buckets_BTS, axis=0)
        return jnp.transpose(values_BTSN, (0, 3, 1, 2))


class KerpleBias(PositionalEncoding):
    """KERPLE (Chi et al. 2022, arXiv 2205.09921; chijames/KERPLE), two kernels:

    * ``"log"``:   ``-r1_h * log(1 + r2_h * |i - j|)``   (r1 init U(0, 2), r2 init U(0, 1));
    * ``"power"``: ``-r1_h * |i - j|^r2_h``              (r1 init U(0, 1), r2 init U(0, 2));

    as the reference initialises them, then clamped into the box ``r1 >= 0.01``, ``r2 >=
    0.01`` and, for power, ``r2 <= 2`` (the kernel is conditionally positive definite only for
    ``0 < r2 <= 2``). The parameters carry the box as ``bounds`` metadata and the training
    step projects them back into it after every update (`flaxformer_lite.nn.constraints`), as
    the reference clamps them in place before each forward pass, so a stored parameter never
    drifts outside. The forward pass clamps too (straight-through, `_clamp`), which only
    matters for parameters set by hand. Parameters ``[heads]``, logical axis ``("heads",)``.
    The same ``|i - j|`` form serves causal and bidirectional attention.
    """

    hook = "bias"

    def __init__(self, dims: ModelDims, options: EncodingOptions, *, kernel: str, rngs: nnx.Rngs):
        del options
        if kernel not in KERPLE_KERNELS:
            raise ValueError(f"KERPLE kernel={kernel!r}; allowed: {list(KERPLE_KERNELS)}")
        self.kernel = kernel
        r2_max = KERPLE_POWER_MAX if kernel == "power" else None
        self.r2_max = r2_max
        r1_scale, r2_scale = (2.0, 1.0) if kernel == "log" else (1.0, 2.0)
        shape, dtype = (dims.num_heads,), jnp.dtype(dims.param_dtype)
        r1 = jax.random.uniform(rngs.params(), shape, dtype) * r1_scale
        r2 = jax.random.uniform(rngs.params(), shape, dtype) * r2_scale
        r1_box, r2_box = (KERPLE_EPS, None), (KERPLE_EPS, r2_max)
        self.r1 = nnx.Param(jnp.clip(r1, *r1_box), logical_axes=("heads",), bounds=r1_box)
        self.r2 = nnx.Param(jnp.clip(r2, *r2_box), logical_axes=("heads",), bounds=r2_box)

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
            if self.kernel == "log"
            else attention_bias.kerple_power_bias
        )
        return fn(q_positions, k_positions, r1, r2)


@dataclasses.dataclass(frozen=True)
class FireOptions(EncodingOptions):
    """Options of FIRE (Li et al. 2024)."""

    mlp_width: int = 32  # hidden width of the 2-layer MLP f_theta
    threshold_init: float = 512.0  # initial threshold L of psi(max(L, i))

    def check(self, dims: ModelDims, path: str) -> None:
        check_positive_int(f"{path}.mlp_width", self.mlp_width, error=ConfigError)
        t = self.threshold_init
        if not is_number(t) or not 0 < t < math.inf:
            fail(f"{path}.threshold_init", t, "must be a finite number > 0")


class FireBias(PositionalEncoding):
    """FIRE (Li et al. 2024, arXiv 2310.04418): ``b(i, j) = f_theta(psi(i - j) / psi(max(L, i)))``.

    ``psi(x) = log(c x + 1)``; ``i`` is the query position (explicit positions, so it is
    the true position even with randomized positions or an offset); ``f_theta`` is
    ``Dense(1 -> mlp_width) -> ReLU -> Dense(width -> heads)``. Learned: the MLP, ``c``
    (init 0.1) and ``L = |l| * threshold_init`` with ``l`` init 1 (the public
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

    def __init__(self, dims: ModelDims, options: FireOptions, *, rngs: nnx.Rngs):
        width, heads = options.mlp_width, dims.num_heads
        dtype = jnp.dtype(dims.param_dtype)
        self.threshold_init = options.threshold_init

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
        u_B1TS = self.normalized_distance(q_positions, k_positions)[:, None]
        w1_W = self.w1[...].astype(jnp.float32)[0]  # W: the MLP's width
        b1_W = self.b1[...].astype(jnp.float32)
        w2_WN = self.w2[...].astype(jnp.float32)
        b2_N = self.b2[...].astype(jnp.float32)
        out_BNTS = jnp.broadcast_to(
            b2_N[None, :, None, None], (u_B1TS.shape[0], b2_N.shape[0], *u_B1TS.shape[2:])
        )

        def add_unit(acc_BNTS: Array, unit: tuple[Array, Array, Array]) -> tuple[Array, None]:
            a, b, w_N = unit  # one hidden unit: relu(u a + b) w_h
            return acc_BNTS + jax.nn.relu(u_B1TS * a + b) * w_N[None, :, None, None], None

        out_BNTS, _ = jax.lax.scan(add_unit, out_BNTS, (w1_W, b1_W, w2_WN))
        return out_BNTS


for _spec in (
    EncodingSpec(
        "alibi",
        "bias",
        ALiBiEncoding,
        options=ALiBiOptions,
        eval_variant=alibi_at_length,
        eval_variants=ALIBI_EVAL_VARIANTS,
        eval_identity=alibi_unscaled_at,
        label_suffix=_alibi_label,
        num_params=lambda dims, options: 0,
        summary="linear distance bias on the logits (Press et al. 2022)",
    ),
    EncodingSpec(
        "t5",
        "bias",
        T5RelativeBias,
        options=T5Options,
        num_params=lambda dims, options: options.num_buckets * dims.num_heads,
        summary="learned bias per log-spaced distance bucket and head (Raffel et al. 2020)",
    ),
    EncodingSpec(
        "kerple_log",
        "bias",
        lambda dims, options, *, rngs: KerpleBias(dims, options, kernel="log", rngs=rngs),
        options=NoOptions,
        num_params=lambda dims, options: 2 * dims.num_heads,  # r1, r2
        summary="KERPLE logarithmic kernel -r1 log(1 + r2 |i-j|) (Chi et al. 2022)",
    ),
    EncodingSpec(
        "kerple_power",
        "bias",
        lambda dims, options, *, rngs: KerpleBias(dims, options, kernel="power", rngs=rngs),
        options=NoOptions,
        num_params=lambda dims, options: 2 * dims.num_heads,  # r1, r2
        summary="KERPLE power kernel -r1 |i-j|^r2 (Chi et al. 2022)",
    ),
    EncodingSpec(
        "fire",
        "bias",
        FireBias,
        options=FireOptions,
        # w1 [1, w], b1 [w], w2 [w, heads], b2 [heads], c, threshold_scale
        num_params=lambda dims, options: (options.mlp_width + 1) * (dims.num_heads + 2),
        summary="MLP of the progressively normalised log distance (Li et al. 2024)",
    ),
):
    register(_spec)
