"""Encodings that **rotate** queries and keys: RoPE (with context extension) and xPos."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from flaxformer_lite.base.checks import check_positive_int, fail, is_int, is_number
from flaxformer_lite.core import rotary
from flaxformer_lite.core.positions import as_batched_positions
from flaxformer_lite.nn.encodings.base import EncodingOptions, ModelDims, PositionalEncoding
from flaxformer_lite.nn.encodings.registry import EncodingSpec, register

Array = jax.Array


def _check_rotation(dims: ModelDims, path: str, layout: str, fraction: float, name: str) -> int:
    """Checks shared by RoPE and xPos; returns the number of rotated dims."""
    if layout not in rotary.ROPE_LAYOUTS:
        fail(f"{path}.layout", layout, f"allowed values: {list(rotary.ROPE_LAYOUTS)}")
    if not is_number(fraction) or not 0.0 < fraction <= 1.0:
        fail(f"{path}.fraction", fraction, "must be a number in (0, 1]")
    if dims.head_dim < 2:
        fail(
            "ModelConfig.num_heads",
            dims.num_heads,
            f"positional={name!r} needs head_dim >= 2; got {dims.head_dim}",
        )
    if dims.head_dim % 2 and fraction == 1.0:
        fail(
            "ModelConfig.num_heads",
            dims.num_heads,
            f"positional={name!r} needs an even head_dim; d_model={dims.d_model} / "
            f"num_heads={dims.num_heads} = {dims.head_dim} (or rotate part of it: {path}"
            ".fraction < 1)",
        )
    return rotary.rotary_dim_for(dims.head_dim, fraction)


@dataclasses.dataclass(frozen=True)
class RopeOptions(EncodingOptions):
    """Options of RoPE (Su et al. 2021) and its context extensions.

    The Hugging Face names (``rope_parameters`` / ``rope_scaling``) of each field are in
    brackets; `flaxformer_lite.pretrained.hf_rope.rope_options_from_hf` maps a config.
    Fields of a scaling other than ``scaling`` are ignored (kept so evaluation-time
    variants can switch scalings), except ``attention_factor``, which only yarn and
    longrope take.
    """

    base: float = 10000.0  # frequency base; theta_i = base^(-2i/d) [rope_theta]
    layout: str = "half"  # pairing: "half" (i, i+d/2) or "interleaved" (2i, 2i+1)
    fraction: float = 1.0  # partial rotary: rotate the even dim count nearest f*head_dim
    # context extension: "none", "pi", "ntk", "dynamic_ntk", "yarn", "llama3", "longrope"
    # [rope_type: default, linear, -, dynamic, yarn, llama3, longrope]
    scaling: str = "none"
    # s >= 1 [factor]: pi, ntk, yarn, llama3 (L'/L); dynamic_ntk: HF's factor; longrope: only
    # for the default attention factor; none: 1
    scale: float = 1.0
    # training length L [original_max_position_embeddings; dynamic: max_position_embeddings]
    # (yarn, dynamic_ntk, llama3, longrope, eval scaling)
    original_length: int | None = None
    yarn_alpha: float = 1.0  # YaRN beta_slow: pairs turning < this over L are interpolated
    yarn_beta: float = 32.0  # YaRN beta_fast: pairs turning > this over L are kept
    yarn_variant: str = "hf"  # "hf": the authors' code / HF transformers; "paper": Eq. 17-22
    yarn_truncate: bool = True  # YaRN: floor/ceil the ramp's correction range [truncate]
    # YaRN attention factor m(s, yarn_mscale) / m(s, yarn_mscale_all_dim), m(s, c) = 0.1 c
    # ln(s) + 1 (DeepSeek-V2/V3) [mscale, mscale_all_dim]; both or neither; None: 0.1 ln s + 1
    yarn_mscale: float | None = None
    yarn_mscale_all_dim: float | None = None
    # yarn, longrope: the factor multiplying q and k (HF: cos and sin), instead of the
    # scaling's formula [attention_factor]; None: the formula
    attention_factor: float | None = None
    # llama3: pairs slower than L / low_freq_factor become theta/s, pairs faster than
    # L / high_freq_factor are kept, a blend between [low_freq_factor, high_freq_factor]
    llama3_low_freq_factor: float = 1.0
    llama3_high_freq_factor: float = 4.0
    # longrope: per-pair divisors of theta_i (d/2 of them) while the length <= L / beyond L
    # [short_factor, long_factor]
    longrope_short_factor: tuple[float, ...] | None = None
    longrope_long_factor: tuple[float, ...] | None = None

    def check(self, dims: ModelDims, path: str) -> None:
        if not is_number(self.base) or not self.base > 1.0:
            fail(f"{path}.base", self.base, "must be a number > 1")
        rotary_dim = _check_rotation(dims, path, self.layout, self.fraction, "rope")
        scaling, s, length = self.scaling, self.scale, self.original_length
        if scaling not in rotary.ROPE_SCALINGS:
            fail(f"{path}.scaling", scaling, f"allowed: {list(rotary.ROPE_SCALINGS)}")
        if not is_number(s) or not 1.0 <= s < math.inf:
            fail(f"{path}.scale", s, "must be a finite number >= 1")
        if scaling == "none" and s != 1.0:
            fail(f"{path}.scale", s, "must be 1.0 with scaling='none'")
        if self.yarn_variant not in rotary.YARN_VARIANTS:
            fail(
                f"{path}.yarn_variant", self.yarn_variant, f"allowed: {list(rotary.YARN_VARIANTS)}"
            )
        if length is not None and (not is_int(length) or length <= 0):
            fail(f"{path}.original_length", length, "must be a positive int or None")
        if scaling in ("yarn", "dynamic_ntk", "llama3", "longrope") and length is None:
            fail(f"{path}.original_length", None, f"scaling={scaling!r} needs the training length")
        a, b = self.yarn_alpha, self.yarn_beta
        if not (is_number(a) and is_number(b)) or not 0.0 <= a < b:
            fail(f"{path}.yarn_alpha", a, f"need numbers with 0 <= yarn_alpha < yarn_beta={b!r}")
        if scaling in ("ntk", "dynamic_ntk") and rotary_dim <= 2:
            fail(
                f"{path}.scaling",
                scaling,
                f"needs more than 2 rotated dims; fraction={self.fraction} of "
                f"head_dim={dims.head_dim} rotates {rotary_dim}",
            )
        self._check_hf_fields(path, rotary_dim)

    def _check_hf_fields(self, path: str, rotary_dim: int) -> None:
        """The fields of HF's yarn parameters, llama3 and longrope."""
        if not isinstance(self.yarn_truncate, bool):
            fail(f"{path}.yarn_truncate", self.yarn_truncate, "must be True or False")
        for name in ("yarn_mscale", "yarn_mscale_all_dim", "attention_factor"):
            value = getattr(self, name)
            if value is not None and (not is_number(value) or not 0 < value < math.inf):
                fail(f"{path}.{name}", value, "must be a finite number > 0 or None")
        if (self.yarn_mscale is None) != (self.yarn_mscale_all_dim is None):
            fail(
                f"{path}.yarn_mscale",
                self.yarn_mscale,
                f"set both yarn_mscale and yarn_mscale_all_dim (={self.yarn_mscale_all_dim!r}) "
                "or neither",
            )
        if self.attention_factor is not None and self.scaling not in ("yarn", "longrope"):
            fail(
                f"{path}.attention_factor",
                self.attention_factor,
                f"only scaling='yarn' or 'longrope' takes it; scaling={self.scaling!r}",
            )
        lo, hi = self.llama3_low_freq_factor, self.llama3_high_freq_factor
        if not is_number(lo) or not 0 < lo < math.inf:
            fail(f"{path}.llama3_low_freq_factor", lo, "must be a finite number > 0")
        if not is_number(hi) or not lo < hi < math.inf:
            fail(
                f"{path}.llama3_high_freq_factor",
                hi,
                f"must be a finite number > llama3_low_freq_factor={lo!r}",
            )
        for name in ("longrope_short_factor", "longrope_long_factor"):
            value = getattr(self, name)
            if value is None:
                if self.scaling == "longrope":
                    fail(f"{path}.{name}", None, "scaling='longrope' needs it")
                continue
            ok = isinstance(value, tuple) and all(is_number(v) and 0 < v < math.inf for v in value)
            if not ok:
                fail(f"{path}.{name}", value, "must be a tuple of finite numbers > 0")
            if self.scaling == "longrope" and len(value) != rotary_dim // 2:
                fail(
                    f"{path}.{name}",
                    value,
                    f"needs {rotary_dim // 2} entries (one per rotated pair: rotary_dim="
                    f"{rotary_dim}); got {len(value)}",
                )


class RotaryEncoding(PositionalEncoding):
    """RoPE (Su et al. 2021, arXiv 2104.09864): rotate q and k by ``position * theta_i``.

    Honours partial rotary (``fraction``: only the first `core.rotary.rotary_dim_for`
    dimensions rotate) and context extension (``scaling``: PI, NTK, dynamic NTK, YaRN, Llama
    3, LongRoPE; see `core.rotary.rope_scaled_inv_frequencies`), each as Hugging Face
    transformers computes it. YaRN also multiplies q and k by ``sqrt(1/t) = 0.1 ln(s) + 1``
    (or the ``yarn_mscale`` ratio, or ``attention_factor``): the rotated dimensions only as
    Hugging Face does (``yarn_variant="hf"``), every dimension as the paper's logit
    temperature (``"paper"``). LongRoPE multiplies the rotated dimensions by
    `core.rotary.longrope_attention_factor` (or ``attention_factor``).

    Dynamic NTK and LongRoPE take their frequencies from the queries' positions (the
    current length: largest position + 1, per row). With a KV cache the keys are rotated
    when they are written (``caches_rotated_keys``, Hugging Face's convention): each cached
    key keeps the rotation of the step that wrote it. For plain RoPE and the static scalings
    that is the rotation a full forward pass gives; for dynamic NTK and LongRoPE beyond
    ``original_length`` it is not (the earlier keys keep the frequencies of a shorter
    length), so cached decoding there differs from a full forward pass over the tokens so
    far, exactly as Hugging Face's cached generation does. RoPE has no parameters, so a
    trained model is evaluated under a scaling by rebuilding it from
    `flaxformer_lite.nn.model_config.rope_scaling_variant` with the same state.
    """

    hook = "rotate"
    caches_rotated_keys = True
    # Dynamic NTK and LongRoPE in one pass as a cache computes them token by token: each
    # query and key at position p with the frequencies of length p + 1 (its own prefix),
    # instead of the sequence's length. Evaluation sets it (`evaluation.step.one_pass`).
    prefix_lengths = False

    def __init__(self, dims: ModelDims, options: RopeOptions, *, rngs: nnx.Rngs):
        del rngs
        self.base = options.base
        self.layout = options.layout
        self.rotary_dim = rotary.rotary_dim_for(dims.head_dim, options.fraction)
        self.scaling = options.scaling
        self.scale = options.scale
        self.original_length = options.original_length
        self.yarn_alpha = options.yarn_alpha
        self.yarn_beta = options.yarn_beta
        self.yarn_variant = options.yarn_variant
        self.yarn_truncate = options.yarn_truncate
        self.low_freq_factor = options.llama3_low_freq_factor
        self.high_freq_factor = options.llama3_high_freq_factor
        self.short_factor = options.longrope_short_factor
        self.long_factor = options.longrope_long_factor
        self.attention_factor = _attention_factor(options)
        # HF scales cos and sin (the rotated dims); the paper's temperature, the whole logit
        paper = options.scaling == "yarn" and self.yarn_variant == "paper"
        self.factor_dims = dims.head_dim if paper else self.rotary_dim

    def inv_frequencies(self, q_positions: Array) -> Array:
        """float32 ``[rotary_dim // 2]``, or ``[batch, rotary_dim // 2]`` for the scalings
        that depend on the current length (dynamic NTK, LongRoPE: from ``q_positions``)."""
        return rotary.rope_scaled_inv_frequencies(
            self.rotary_dim,
            scaling=self.scaling,
            scale=self.scale,
            base=self.base,
            original_length=self.original_length,
            alpha=self.yarn_alpha,
            beta=self.yarn_beta,
            yarn_variant=self.yarn_variant,
            yarn_truncate=self.yarn_truncate,
            low_freq_factor=self.low_freq_factor,
            high_freq_factor=self.high_freq_factor,
            short_factor=self.short_factor,
            long_factor=self.long_factor,
            positions=q_positions,  # dynamic NTK, LongRoPE: the current length is the queries'
        )

    def rotate(
        self, q: Array, k: Array, q_positions: Array, k_positions: Array
    ) -> tuple[Array, Array]:
        for name, x, pos in (("q_positions", q, q_positions), ("k_positions", k, k_positions)):
            as_batched_positions(pos, name=name, length=x.shape[1], batch=x.shape[0])
        if self.prefix_lengths and self.scaling in ("dynamic_ntk", "longrope"):
            angles_BTP, angles_BSP = (
                self._prefix_angles(q_positions),
                self._prefix_angles(k_positions),
            )
        else:
            inv_freq_P = self.inv_frequencies(q_positions)  # [pairs] or [batch or 1, pairs]
            angles_BTP = rotary.rope_angles(q_positions, inv_freq_P)
            angles_BSP = rotary.rope_angles(k_positions, inv_freq_P)
        q_BTNH = rotary.apply_rotary(q, angles_BTP, layout=self.layout)
        k_BSKH = rotary.apply_rotary(k, angles_BSP, layout=self.layout)
        if self.attention_factor != 1.0:
            q_BTNH, k_BSKH = self._scale(q_BTNH), self._scale(k_BSKH)
        return q_BTNH, k_BSKH

    def _prefix_angles(self, positions: Array) -> Array:
        """``[batch, length, pairs]`` angles, each position ``p`` at the frequencies of
        the length ``p + 1`` (each token a row of its own for `inv_frequencies`)."""
        pos_BT = as_batched_positions(positions)
        b, t = pos_BT.shape
        inv_freq_BTP = self.inv_frequencies(pos_BT.reshape(b * t, 1)).reshape(b, t, -1)
        return pos_BT.astype(jnp.float32)[..., None] * inv_freq_BTP

    def _scale(self, x: Array) -> Array:
        """``x`` with its first ``factor_dims`` dimensions (R: the rotated ones, or all of
        them for the paper variant) times the attention factor."""
        n = self.factor_dims
        scaled_BTNR = x[..., :n].astype(jnp.float32) * jnp.float32(self.attention_factor)
        return jnp.concatenate([scaled_BTNR.astype(x.dtype), x[..., n:]], axis=-1)


def _attention_factor(options: RopeOptions) -> float:
    """The factor q and k are multiplied by: yarn's and longrope's (1 for the others)."""
    if options.scaling not in ("yarn", "longrope"):
        return 1.0
    if options.attention_factor is not None:
        return float(options.attention_factor)
    if options.scaling == "yarn":
        return rotary.yarn_attention_factor(
            options.scale, mscale=options.yarn_mscale, mscale_all_dim=options.yarn_mscale_all_dim
        )
    return rotary.longrope_attention_factor(options.scale, options.original_length)


def rope_at_length(options: RopeOptions, scaling: str, eval_length: int) -> RopeOptions:
    """RoPE's options for evaluating at ``eval_length`` under the context extension ``scaling``
    (one of `core.rotary.ROPE_EVAL_SCALINGS`).

    ``s = max(1, eval_length / original_length)`` for ``"pi"``, ``"ntk"`` and ``"yarn"``;
    ``"none"`` and ``"dynamic_ntk"`` keep ``scale = 1`` (dynamic NTK takes its scale from the
    positions it sees). ``attention_factor`` (a fixed number for the trained scaling) is
    dropped when ``scaling`` differs from the options'. RoPE has no parameters: a model built
    with these options reuses the trained state.
    """
    if scaling not in rotary.ROPE_EVAL_SCALINGS:
        raise ValueError(
            f"scaling={scaling!r} is not known; allowed: {list(rotary.ROPE_EVAL_SCALINGS)}"
        )
    if options.original_length is None:
        raise ValueError(
            "ModelConfig.positional_options.original_length=None: set it to the training "
            "length to derive the scale s = eval_length / original_length"
        )
    eval_length = check_positive_int("eval_length", eval_length)
    s = max(1.0, eval_length / options.original_length)
    if scaling in ("none", "dynamic_ntk"):
        s = 1.0
    factor = options.attention_factor if scaling == options.scaling else None
    return dataclasses.replace(options, scaling=scaling, scale=float(s), attention_factor=factor)


def rope_unscaled_at(options: RopeOptions, scaling: str, eval_length: int) -> bool:
    """Whether `rope_at_length` (``scaling`` at ``eval_length``) leaves a model with
    ``options`` exactly as it is: the model has no scaling of its own (``scaling="none"``, no
    ``attention_factor``) and either ``scaling`` is ``"none"`` or ``eval_length <=
    original_length``, where PI, NTK and YaRN have ``s = 1`` and dynamic NTK sees no length
    past the original, all plain RoPE exactly (`core.rotary.rope_scaled_inv_frequencies`;
    YaRN's attention factor is 1 at ``s = 1``). ``eval_length``: the longest sequence scored
    (dynamic NTK reads the positions, not the cell's nominal length). Evaluation then repeats
    the model's own numbers instead of scoring them again."""
    if scaling not in rotary.ROPE_EVAL_SCALINGS:
        return False
    unscaled = options.scaling == "none" and options.attention_factor is None
    within = options.original_length is not None and eval_length <= options.original_length
    return unscaled and (scaling == "none" or within)


@dataclasses.dataclass(frozen=True)
class PRopeOptions(RopeOptions):
    """Options of p-RoPE (Barbero et al. 2024, arXiv 2410.06205, §6): RoPE's, plus the
    fraction ``p`` of its pairs that rotate, the highest-frequency ones."""

    p: float = 0.75  # fraction of the rotated pairs kept rotating (1: RoPE, 0: NoPE)

    def check(self, dims: ModelDims, path: str) -> None:
        super().check(dims, path)
        if not is_number(self.p) or not 0.0 <= self.p <= 1.0:
            fail(f"{path}.p", self.p, "must be a number in [0, 1] (1: RoPE, 0: no rotation)")


class PRotaryEncoding(RotaryEncoding):
    """p-RoPE (Barbero et al. 2024, "Round and Round We Go! What makes Rotary Positional
    Encodings useful?", arXiv 2410.06205, §6): RoPE whose lowest-frequency pairs do not
    rotate. Of RoPE's ``P = rotary_dim / 2`` pairs (with its scalings, at their frequencies),
    the ``n = int(p * rotary_dim // 2)`` highest-frequency ones (`core.rotary.p_rope_pairs`)
    keep their frequencies; the others get frequency 0 (angle 0: unrotated), so they carry
    no position and can carry meaning at any distance (Hugging Face's "proportional" rope).
    ``p = 1`` is RoPE, ``p = 0`` rotates nothing. No parameters; the RoPE scalings apply.
    """

    def __init__(self, dims: ModelDims, options: PRopeOptions, *, rngs: nnx.Rngs):
        super().__init__(dims, options, rngs=rngs)
        self.kept_pairs = rotary.p_rope_pairs(self.rotary_dim, options.p)

    def inv_frequencies(self, q_positions: Array) -> Array:
        """RoPE's frequencies with the pairs from ``kept_pairs`` on set to 0."""
        inv_freq = super().inv_frequencies(q_positions)
        return rotary.keep_highest_frequencies(inv_freq, self.kept_pairs)


@dataclasses.dataclass(frozen=True)
class XPosOptions(EncodingOptions):
    """Options of xPos (Sun et al. 2022): RoPE's rotation options plus the decay's scale."""

    base: float = 10000.0  # frequency base, as RoPE's
    layout: str = "half"  # pairing, as RoPE's
    fraction: float = 1.0  # partial rotary, as RoPE's (the decay applies to rotated pairs)
    scale_base: float = 512.0  # query pair i scaled by zeta_i^(n / scale_base)

    def check(self, dims: ModelDims, path: str) -> None:
        if not is_number(self.base) or not self.base > 1.0:
            fail(f"{path}.base", self.base, "must be a number > 1")
        _check_rotation(dims, path, self.layout, self.fraction, "xpos")
        if not is_number(self.scale_base) or not 0 < self.scale_base < math.inf:
            fail(f"{path}.scale_base", self.scale_base, "must be a finite number > 0")


class XPosEncoding(PositionalEncoding):
    """xPos (Sun et al. 2022, arXiv 2212.10554; torchscale ``XPOS``): RoPE whose pair i is
    scaled by ``zeta_i^(n/B)`` on queries and ``zeta_i^(-m/B)`` on keys, ``B`` =
    ``scale_base`` (512), ``zeta_i = (2i + 0.4d)/(1.4d)``: logits decay like
    ``zeta^((n-m)/B)`` with the distance. Defined for causal attention only.

    Centring: the scale exponent uses ``n - c`` with ``c = (min + max) // 2`` of each row's
    key positions (`core.rotary.xpos_center`), applied to queries and keys alike. The logits
    do not depend on ``c`` (it cancels in ``zeta^((n-c) - (m-c))``); it keeps the factors
    near 1 for long or randomized positions (torchscale also centres them). Shifting all
    positions by ``s`` shifts ``c`` by exactly ``s``, so the scaled q and k are unchanged.
    Honours ``fraction`` (the decay applies to the rotated pairs only, ``d`` = rotated dims),
    ``base`` and ``layout``; no context-extension scaling.
    """

    hook = "rotate"

    def __init__(self, dims: ModelDims, options: XPosOptions, *, rngs: nnx.Rngs):
        del rngs
        self.base = options.base
        self.layout = options.layout
        self.rotary_dim = rotary.rotary_dim_for(dims.head_dim, options.fraction)
        self.scale_base = options.scale_base

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
        q_BTNH = rotary.apply_xpos(q, q_positions, inverse=False, **kw)
        k_BSKH = rotary.apply_xpos(k, k_positions, inverse=True, **kw)
        return q_BTNH, k_BSKH


def _rope_label(options: RopeOptions) -> str:
    """``"+pi"``, ``"+yarn"``, ... (``"+yarn_paper"`` for the paper's YaRN); none: ``""``."""
    if options.scaling == "none":
        return ""
    paper = options.scaling == "yarn" and options.yarn_variant == "paper"
    return f"+{options.scaling}" + ("_paper" if paper else "")


for _spec in (
    EncodingSpec(
        "rope",
        "rotate",
        RotaryEncoding,
        options=RopeOptions,
        eval_variant=rope_at_length,
        eval_variants=rotary.ROPE_EVAL_SCALINGS,
        eval_identity=rope_unscaled_at,
        label_suffix=_rope_label,
        incremental=lambda options: options.scaling in ("dynamic_ntk", "longrope"),
        num_params=lambda dims, options: 0,
        summary="rotary embedding of queries and keys (Su et al. 2021)",
    ),
    EncodingSpec(
        "xpos",
        "rotate",
        XPosEncoding,
        options=XPosOptions,
        causal_only=True,
        num_params=lambda dims, options: 0,
        summary="RoPE with exponential decay of the logits with distance (Sun et al. 2022)",
    ),
    EncodingSpec(
        "p_rope",
        "rotate",
        PRotaryEncoding,
        options=PRopeOptions,
        eval_variant=rope_at_length,
        eval_variants=rotary.ROPE_EVAL_SCALINGS,
        eval_identity=rope_unscaled_at,
        label_suffix=_rope_label,
        incremental=lambda options: options.scaling in ("dynamic_ntk", "longrope"),
        num_params=lambda dims, options: 0,
        summary="RoPE whose lowest-frequency pairs do not rotate (Barbero et al. 2024)",
    ),
):
    register(_spec)
