"""Rotary positional formulas: queries and keys are **rotated** (DESIGN.md §3).

RoPE (Su et al. 2021) in the rotate-half and interleaved layouts, partial rotary
(`rotary_dim_for`), xPos (Sun et al. 2022: RoPE with a per-pair decay) and RoPE context
extension (`rope_scaled_inv_frequencies`: PI, NTK, dynamic NTK, YaRN, Llama 3, LongRoPE),
each as Hugging Face transformers computes it (``ROPE_INIT_FUNCTIONS`` in
``transformers/modeling_rope_utils.py``; tests/core/rope_goldens.json pins them).
Angles are float32: bfloat16 cannot tell position 256 from 257.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from flaxformer_lite.base.checks import check_positive_int, check_positive_number, is_number
from flaxformer_lite.core.positions import as_batched_positions, scaled_positions

Array = jax.Array
ROPE_LAYOUTS = ("half", "interleaved")


def _theta(rotary_dim: int, base: float) -> np.ndarray:
    """Validated float64 host ``theta_i = base^(-2i/rotary_dim)``, ``[rotary_dim // 2]``: the
    one place the scalings' frequencies start from (they rescale it in float64, then round)."""
    _check_rotary_dim(rotary_dim)
    check_positive_number("base", base)
    return float(base) ** (-2.0 * np.arange(rotary_dim // 2) / rotary_dim)


def rope_inv_frequencies(rotary_dim: int, *, base: float = 10000.0) -> Array:
    """RoPE frequencies ``theta_i = base^(-2i/rotary_dim)``, float32 ``[rotary_dim // 2]``.

    Su et al. 2021, "RoFormer" (arXiv 2104.09864), Eq. 15.
    """
    return jnp.asarray(_theta(rotary_dim, base), jnp.float32)


def rope_angles(positions: Array, inv_freq: Array) -> Array:
    """Rotation angles ``p * theta_i`` in float32: ``[batch, length, pairs]``.

    ``inv_freq`` is ``[pairs]`` (shared) or ``[batch or 1, pairs]`` (one set per row, e.g.
    dynamic NTK scaling).
    """
    positions = as_batched_positions(positions)
    inv_freq = jnp.asarray(inv_freq, jnp.float32)
    if inv_freq.ndim == 2:
        return positions.astype(jnp.float32)[:, :, None] * inv_freq[:, None, :]
    return scaled_positions(positions, inv_freq)


def apply_rotary(x: Array, angles: Array, *, layout: str = "half") -> Array:
    """Rotate pairs of the last axis of ``x`` by ``angles``.

    Args:
      x: ``[batch, length, heads, head_dim]``; only the first ``2 * angles.shape[-1]``
        dimensions are rotated, the rest pass through (partial rotary).
      angles: float32 ``[batch or 1, length, rotary_dim // 2]``.
      layout: ``"half"`` pairs dimension i with i + rotary_dim/2 (GPT-NeoX, HF LLaMA);
        ``"interleaved"`` pairs 2i with 2i+1 (RoFormer Eq. 34, GPT-J, Meta LLaMA). The two are
        the same rotation up to a fixed permutation of the rotated dimensions.

    Returns:
      Same shape and dtype as ``x``; the rotation itself is computed in float32.
    """
    if layout not in ROPE_LAYOUTS:
        raise ValueError(f"layout={layout!r} is not known; allowed: {list(ROPE_LAYOUTS)}")
    if x.ndim != 4:
        raise ValueError(f"x must be [batch, length, heads, head_dim]; got shape {x.shape}")
    pairs = angles.shape[-1]
    rotary_dim = 2 * pairs
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"{pairs} rotation pairs do not fit head_dim={x.shape[-1]}")
    cos_BT1P = jnp.cos(angles)[:, :, None, :]
    sin_BT1P = jnp.sin(angles)[:, :, None, :]
    rot_BTNR, rest_BTNU = x[..., :rotary_dim].astype(jnp.float32), x[..., rotary_dim:]
    if layout == "half":
        x1_BTNP, x2_BTNP = rot_BTNR[..., :pairs], rot_BTNR[..., pairs:]
    else:
        x1_BTNP, x2_BTNP = rot_BTNR[..., 0::2], rot_BTNR[..., 1::2]
    y1_BTNP = x1_BTNP * cos_BT1P - x2_BTNP * sin_BT1P
    y2_BTNP = x2_BTNP * cos_BT1P + x1_BTNP * sin_BT1P
    if layout == "half":
        rotated_BTNR = jnp.concatenate([y1_BTNP, y2_BTNP], axis=-1)
    else:
        rotated_BTNR = jnp.stack([y1_BTNP, y2_BTNP], axis=-1).reshape(rot_BTNR.shape)
    return jnp.concatenate([rotated_BTNR.astype(x.dtype), rest_BTNU], axis=-1)


def apply_rope(
    x: Array,
    positions: Array,
    *,
    base: float = 10000.0,
    layout: str = "half",
    rotary_dim: int | None = None,
) -> Array:
    """Rotary position embedding (Su et al. 2021, arXiv 2104.09864).

    Each pair of dimensions is rotated by angle ``p * theta_i`` with
    ``theta_i = base^(-2i/rotary_dim)``, so ``<rope(q, m), rope(k, n)>`` depends on the
    positions only through ``m - n``.

    Args:
      x: queries or keys ``[batch, length, heads, head_dim]``.
      positions: int ``[batch, length]`` or ``[length]``.
      base: frequency base (10000 in the paper).
      layout: ``"half"`` (default) or ``"interleaved"``; see `apply_rotary`.
      rotary_dim: rotate only the first ``rotary_dim`` dimensions (even); default all.

    Returns:
      ``x`` rotated, same shape and dtype.
    """
    rotary_dim = x.shape[-1] if rotary_dim is None else rotary_dim
    positions = as_batched_positions(positions, length=jnp.shape(x)[1], batch=jnp.shape(x)[0])
    angles = rope_angles(positions, rope_inv_frequencies(rotary_dim, base=base))
    return apply_rotary(x, angles, layout=layout)


# ------------------------------------------------------------------------------------ xPos


def xpos_zeta(rotary_dim: int) -> Array:
    """xPos per-pair decay base ``zeta_i = (2i + 0.4 d) / (1.4 d)``, float32 ``[d // 2]``.

    Sun et al. 2022, "A Length-Extrapolatable Transformer" (arXiv 2212.10554), Eq. 9;
    ``d = rotary_dim``. All ``zeta_i < 1``; high-frequency pairs (small i) decay fastest.
    """
    _check_rotary_dim(rotary_dim)
    i = np.arange(rotary_dim // 2, dtype=np.float64)
    return jnp.asarray((2 * i + 0.4 * rotary_dim) / (1.4 * rotary_dim), jnp.float32)


def xpos_center(positions: Array) -> Array:
    """Per-row centre ``(min + max) // 2`` of int positions, int32 ``[batch, 1]``.

    Shifting every position by ``s`` shifts the centre by exactly ``s``.
    """
    positions = as_batched_positions(positions)
    lo = positions.min(axis=1, keepdims=True)
    hi = positions.max(axis=1, keepdims=True)
    return (lo + hi) // 2


def apply_xpos(
    x: Array,
    positions: Array,
    *,
    center: Array | int = 0,
    inverse: bool = False,
    scale_base: float = 512.0,
    base: float = 10000.0,
    layout: str = "half",
    rotary_dim: int | None = None,
) -> Array:
    """xPos (Sun et al. 2022, arXiv 2212.10554): RoPE, then pair i times ``zeta_i^e``.

    ``e = (n - center) / scale_base`` for queries and ``-(m - center) / scale_base`` for keys
    (``inverse=True``), so a query at ``n`` and a key at ``m`` score
    ``zeta^((n - m) / scale_base)`` times their RoPE logit: an exponential decay with the
    distance, independent of ``center``. The centre only keeps the factors near 1 (torchscale
    ``XPOS`` centres its scale positions likewise, around ``-length // 2``): uncentred,
    ``zeta_0^(n/512)`` at ``n = 16384`` is ``e^-40``. The rotation uses the true positions.

    Args:
      x: queries or keys ``[batch, length, heads, head_dim]``.
      positions: int ``[batch, length]`` or ``[length]``.
      center: int scalar or ``[batch, 1]`` (e.g. `xpos_center` of the key positions); pass
        the same value for queries and keys.
      inverse: False for queries (``zeta^e``), True for keys (``zeta^-e``).
      scale_base: 512 in the paper; ``math.inf`` switches the decay off (plain RoPE).
      base, layout, rotary_dim: as in `apply_rope`.

    Returns:
      ``x`` rotated and scaled, same shape and dtype (computed in float32).
    """
    if not isinstance(scale_base, int | float) or not scale_base > 0:
        raise ValueError(f"scale_base must be > 0 (inf: no decay); got {scale_base!r}")
    rotary_dim = x.shape[-1] if rotary_dim is None else rotary_dim
    positions = as_batched_positions(positions, length=jnp.shape(x)[1], batch=jnp.shape(x)[0])
    angles_BTP = rope_angles(positions, rope_inv_frequencies(rotary_dim, base=base))
    rotated_BTNH = apply_rotary(x.astype(jnp.float32), angles_BTP, layout=layout)
    center = jnp.asarray(center, jnp.int32)
    center = center.reshape((1, 1)) if center.ndim == 0 else center.reshape((-1, 1))
    exponent_BT = (positions - center).astype(jnp.float32) / jnp.float32(scale_base)
    if inverse:
        exponent_BT = -exponent_BT
    log_zeta_P = jnp.log(xpos_zeta(rotary_dim))
    scale_BTP = jnp.exp(exponent_BT[:, :, None] * log_zeta_P[None, None, :])
    if layout == "half":
        scale_BTR = jnp.concatenate([scale_BTP, scale_BTP], axis=-1)
    else:
        scale_BTR = jnp.repeat(scale_BTP, 2, axis=-1)
    scaled_BTNR = rotated_BTNH[..., :rotary_dim] * scale_BTR[:, :, None, :]
    return jnp.concatenate([scaled_BTNR, rotated_BTNH[..., rotary_dim:]], axis=-1).astype(x.dtype)


# ------------------------------------------------ partial rotary and RoPE context extension

ROPE_EVAL_SCALINGS = ("none", "pi", "ntk", "dynamic_ntk", "yarn")  # derivable from a length
ROPE_SCALINGS = (*ROPE_EVAL_SCALINGS, "llama3", "longrope")


def rotary_dim_for(head_dim: int, fraction: float = 1.0) -> int:
    """Rotated dimensions for partial rotary: the even number nearest ``fraction * head_dim``
    (halves round up), at least 2 and at most ``head_dim`` (GPT-NeoX ``rotary_pct``; the NoPE
    study's "rotary" uses 1/4). The frequencies then use ``rotary_dim`` in
    ``theta_i = base^(-2i/rotary_dim)``.
    """
    check_positive_int("head_dim", head_dim)
    if not isinstance(fraction, int | float) or not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1]; got {fraction!r}")
    if head_dim < 2:
        raise ValueError(f"head_dim={head_dim} has no pair of dimensions to rotate")
    nearest = 2 * math.floor(fraction * head_dim / 2 + 0.5)
    return max(2, min(nearest, head_dim - head_dim % 2))


def p_rope_pairs(head_dim: int, fraction: float) -> int:
    """How many pairs p-RoPE rotates: ``int(fraction * head_dim // 2)`` (Hugging Face
    ``_compute_proportional_rope_parameters``, ``rope_angles``), the highest-frequency ones."""
    check_positive_int("head_dim", head_dim)
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise ValueError(f"fraction must be a number in [0, 1]; got {fraction!r}")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be a number in [0, 1]; got {fraction!r}")
    return int(fraction * head_dim // 2)


def p_rope_inv_frequencies(head_dim: int, *, fraction: float, base: float = 10000.0) -> Array:
    """p-RoPE frequencies, float32 ``[head_dim // 2]`` (Barbero et al. 2024, "Round and Round
    We Go! What makes Rotary Positional Encodings useful?", arXiv 2410.06205, §6).

    RoPE's spectrum over the whole head, ``theta_i = base^(-2i/head_dim)``, keeping the
    highest-frequency pairs ``i < n = `p_rope_pairs` `` and setting the others to 0: those
    pairs are not rotated (angle 0) and carry no position, so they are free to carry
    semantic information at any distance. This is Hugging Face's ``proportional`` rope type
    (Gemma 4, ``partial_rotary_factor``), not NeoX's partial rotary (`rotary_dim_for`), which
    rotates fewer dims with the full spectrum respread over them. ``fraction = 1`` is RoPE;
    ``fraction = 0`` rotates nothing (NoPE).
    """
    n = p_rope_pairs(head_dim, fraction)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (dimensions rotate in pairs); got {head_dim}")
    check_positive_number("base", base)
    pairs = np.arange(head_dim // 2)
    theta = np.where(pairs < n, float(base) ** (-2.0 * pairs / head_dim), 0.0)
    return jnp.asarray(theta, jnp.float32)


def keep_highest_frequencies(inv_freq: Array, pairs: int) -> Array:
    """``inv_freq`` (``[P]`` or ``[batch, P]``) with the pairs from ``pairs`` on set to 0 (not
    rotated): p-RoPE's truncation applied to any RoPE scaling's frequencies."""
    inv_freq = jnp.asarray(inv_freq, jnp.float32)
    keep = jnp.arange(inv_freq.shape[-1]) < pairs
    return jnp.where(keep, inv_freq, jnp.float32(0.0))


def ntk_scaled_base(base: float, scale: float, rotary_dim: int) -> float:
    """NTK-aware base ``b' = b * s^(d / (d - 2))`` with ``d = rotary_dim`` (bloc97 2023;
    Peng et al. 2023, arXiv 2309.00071, §3.1): the lowest frequency is interpolated by ``s``,
    the highest is kept."""
    check_positive_number("base", base)
    _check_scale(scale)
    if rotary_dim <= 2:
        raise ValueError(f"NTK scaling needs rotary_dim > 2; got {rotary_dim}")
    return float(base) * float(scale) ** (rotary_dim / (rotary_dim - 2))


YARN_VARIANTS = ("hf", "paper")


def yarn_ramp(r: np.ndarray, *, alpha: float = 1.0, beta: float = 32.0) -> np.ndarray:
    """The paper's YaRN ramp ``gamma(r)``: 0 for ``r < alpha``, 1 for ``r > beta``, linear
    between (Peng et al. 2023, Eq. 18)."""
    if not 0 <= alpha < beta:
        raise ValueError(f"need 0 <= alpha < beta; got alpha={alpha!r}, beta={beta!r}")
    return np.clip((np.asarray(r, np.float64) - alpha) / (beta - alpha), 0.0, 1.0)


def yarn_correction_range(
    rotary_dim: int,
    *,
    original_length: int,
    base: float,
    beta_fast: float,
    beta_slow: float,
    truncate: bool = True,
) -> tuple[float, float]:
    """The pair-index range YaRN blends over, as the authors' code and Hugging Face
    transformers compute it (``find_correction_range`` in ``_compute_yarn_parameters``).

    ``corr(n) = d ln(L / (2 pi n)) / (2 ln b)`` is the (fractional) pair index whose
    wavelength fits ``n`` times into ``L``; ``low = max(floor(corr(beta_fast)), 0)``,
    ``high = min(ceil(corr(beta_slow)), d - 1)`` (``truncate=False``: without floor and
    ceil, HF's ``truncate`` field), ``high += 0.001`` when they are equal.
    """

    def corr(n: float) -> float:
        return rotary_dim * math.log(original_length / (n * 2 * math.pi)) / (2 * math.log(base))

    low, high = corr(beta_fast), corr(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    return float(low), float(high) + (0.001 if low == high else 0.0)


def yarn_inv_frequencies(
    rotary_dim: int,
    *,
    scale: float,
    original_length: int,
    base: float = 10000.0,
    alpha: float = 1.0,
    beta: float = 32.0,
    variant: str = "hf",
    truncate: bool = True,
) -> Array:
    """YaRN frequencies (Peng et al. 2023, arXiv 2309.00071), float32 ``[d // 2]``.

    ``theta'_i = theta_i / s * ramp_i + theta_i * (1 - ramp_i)``: pairs that turn few times
    over the training length ``L`` are interpolated (PI), fast ones kept, a blend between.
    ``alpha`` / ``beta`` are the slow / fast turn counts (the code's ``beta_slow = 1`` and
    ``beta_fast = 32``). Two ways to place the ramp:

    * ``variant="hf"`` (default): as the authors' code and Hugging Face transformers
      (``_compute_yarn_parameters``) ship it -- linear in the pair index ``i`` between the
      correction dimensions (`yarn_correction_range`; ``truncate=False`` keeps them
      fractional, HF's ``truncate`` field), ``ramp_i = clip((i - low) / (high - low), 0,
      1)``; this is the YaRN people use and compare with;
    * ``variant="paper"``: Eq. 17-19, linear in ``r_i = L / lambda_i`` (``lambda_i = 2 pi /
      theta_i``), ``ramp_i = 1 - gamma(r_i)`` with `yarn_ramp`. The two give frequencies
      that differ by up to ~80 % for small head dims (docs/encodings.md).

    Computed in float64 on the host. ``scale = 1`` gives RoPE exactly (HF does too, up to
    float32 rounding: its ramp then blends ``theta`` with itself).
    """
    _check_scale(scale)
    check_positive_int("original_length", original_length)
    if variant not in YARN_VARIANTS:
        raise ValueError(f"variant={variant!r} is not known; allowed: {list(YARN_VARIANTS)}")
    theta = _theta(rotary_dim, base)
    if scale == 1:
        return jnp.asarray(theta, jnp.float32)
    if variant == "hf":
        low, high = yarn_correction_range(
            rotary_dim,
            original_length=original_length,
            base=base,
            beta_fast=beta,
            beta_slow=alpha,
            truncate=truncate,
        )
        ramp = np.clip((np.arange(rotary_dim // 2) - low) / (high - low), 0.0, 1.0)
    else:
        ramp = 1.0 - yarn_ramp(original_length * theta / (2 * math.pi), alpha=alpha, beta=beta)
    return jnp.asarray(theta / scale * ramp + theta * (1.0 - ramp), jnp.float32)


def yarn_attention_factor(
    scale: float, *, mscale: float | None = None, mscale_all_dim: float | None = None
) -> float:
    """YaRN's ``sqrt(1/t) = 0.1 ln(s) + 1`` (Eq. 22); queries and keys are both multiplied by
    it, so the logits scale by ``1/t``. Exactly 1 at ``s = 1``. Hugging Face multiplies the
    rotary cos and sin by it, so only the rotated dimensions of a partial rotary are scaled
    (``variant="hf"``); the paper's temperature divides the whole logit (``"paper"``).

    With ``mscale`` and ``mscale_all_dim`` (DeepSeek-V2/V3 configs), HF's
    ``_compute_yarn_parameters`` uses ``m(s, mscale) / m(s, mscale_all_dim)`` with ``m(s, c)
    = 0.1 c ln(s) + 1`` (1 for ``s <= 1``); as there, both must be given and non-zero, else
    the plain formula applies.
    """
    _check_scale(scale)

    def m(c: float) -> float:
        return 1.0 if scale <= 1 else 0.1 * c * math.log(scale) + 1.0

    if mscale and mscale_all_dim:
        return float(m(float(mscale)) / m(float(mscale_all_dim)))
    return m(1.0)


def dynamic_ntk_inv_frequencies(
    positions: Array,
    rotary_dim: int,
    *,
    original_length: int,
    base: float = 10000.0,
    factor: float = 1.0,
) -> Array:
    """Dynamic NTK frequencies, float32 ``[batch, d // 2]``, per row from its current length.

    The current length ``n`` of a row is its largest position + 1 -- pass the positions of
    the tokens whose outputs are computed now (the queries): for a forward pass over a
    sequence that is its length, and for a cached decoding step the length so far, never the
    cache's capacity (that would make the prompt's logits depend on how many tokens will
    follow). For ``n > L``, Hugging Face's ``_compute_dynamic_ntk_parameters``: base
    ``b * (factor * n / L - (factor - 1))^(d/(d-2))``, written as ``theta_i *
    s^(-2i/(d-2))`` with ``s = factor * n / L - (factor - 1)``; for ``n <= L`` plain RoPE, bit
    for bit. ``factor = 1`` gives ``s = n / L``. A traced value: fine under jit. ``L`` is HF's
    ``max_position_embeddings`` (not ``original_max_position_embeddings``).

    Hugging Face's ``dynamic_rope_update`` takes ``n`` over the whole batch and keeps the
    frequencies of the longest ``n`` seen until ``n`` drops below ``L``; this is stateless and
    per row. The two agree on every forward pass of a fresh module and whenever ``n`` only
    grows (cached generation).
    """
    check_positive_int("original_length", original_length)
    _check_scale(factor)
    if rotary_dim <= 2:
        raise ValueError(f"NTK scaling needs rotary_dim > 2; got {rotary_dim}")
    theta_P = rope_inv_frequencies(rotary_dim, base=base)
    positions = as_batched_positions(positions)
    current_B1 = (positions.max(axis=1) + 1).astype(jnp.float32)[:, None]
    length = jnp.float32(original_length)
    s_B1 = jnp.float32(factor) * current_B1 / length - jnp.float32(factor - 1.0)
    exponent_P = jnp.asarray(-2.0 * np.arange(rotary_dim // 2) / (rotary_dim - 2), jnp.float32)
    scaled_BP = jnp.where(current_B1 > length, s_B1, jnp.float32(1.0)) ** exponent_P[None, :]
    return theta_P[None, :] * jnp.where(current_B1 > length, scaled_BP, jnp.float32(1.0))


def llama3_inv_frequencies(
    rotary_dim: int,
    *,
    scale: float,
    original_length: int,
    base: float = 10000.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
) -> Array:
    """Llama 3.1's frequencies, float32 ``[d // 2]`` (Meta, "The Llama 3 Herd of Models",
    arXiv 2407.21783, and its reference ``apply_scaling``; Hugging Face
    ``_compute_llama3_parameters``).

    With wavelengths ``lambda_i = 2 pi / theta_i``: pairs slower than ``L / low_freq_factor``
    are interpolated (``theta_i / s``), pairs faster than ``L / high_freq_factor`` kept, and
    the band between blended, ``(1 - g) theta_i / s + g theta_i`` with ``g = (L / lambda_i -
    low_freq_factor) / (high_freq_factor - low_freq_factor)`` (continuous at both edges).
    ``L`` = ``original_length`` (HF ``original_max_position_embeddings``, 8192 for Llama
    3.1), ``s`` = ``scale`` (HF ``factor``, 8). Computed in float64 on the host; ``s = 1`` gives
    RoPE exactly.
    """
    _check_scale(scale)
    check_positive_int("original_length", original_length)
    check_positive_number("low_freq_factor", low_freq_factor)
    if not is_number(high_freq_factor) or not high_freq_factor > low_freq_factor:
        raise ValueError(
            f"high_freq_factor must be a number > low_freq_factor={low_freq_factor!r}; "
            f"got {high_freq_factor!r}"
        )
    theta = _theta(rotary_dim, base)
    wavelen = 2 * math.pi / theta
    low_wavelen = original_length / low_freq_factor
    high_wavelen = original_length / high_freq_factor
    smooth = (original_length / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * theta / scale + smooth * theta
    out = np.where(wavelen > low_wavelen, theta / scale, theta)
    out = np.where((wavelen >= high_wavelen) & (wavelen <= low_wavelen), blended, out)
    return jnp.asarray(out, jnp.float32)


def longrope_inv_frequencies(
    positions: Array,
    rotary_dim: int,
    *,
    original_length: int,
    short_factor: tuple[float, ...],
    long_factor: tuple[float, ...],
    base: float = 10000.0,
) -> Array:
    """LongRoPE frequencies, float32 ``[batch, d // 2]``, per row from its current length.

    Ding et al. 2024, "LongRoPE" (arXiv 2402.13753), as Phi-3 ships it: Hugging Face
    ``_compute_longrope_parameters`` and the ``longrope`` branch of ``dynamic_rope_update``.
    ``theta_i / long_factor[i]`` when the current length ``n`` (largest position + 1, as in
    `dynamic_ntk_inv_frequencies`: pass the positions of the tokens computed now) exceeds
    ``L`` = ``original_length`` (HF ``original_max_position_embeddings``), else ``theta_i /
    short_factor[i]`` -- the short factors apply at every length up to ``L``, so this is
    not plain RoPE there unless they are all 1. Each factor list has ``d // 2`` entries.
    HF takes ``n`` over the whole batch; here each row has its own (the same for rows of one
    length). The attention factor is `longrope_attention_factor`, the same at every length.
    """
    check_positive_int("original_length", original_length)
    theta = _theta(rotary_dim, base)
    pairs = rotary_dim // 2
    tables = []
    for name, factors in (("short_factor", short_factor), ("long_factor", long_factor)):
        f = np.asarray(factors, np.float64)
        if f.shape != (pairs,) or not np.all(np.isfinite(f)) or not np.all(f > 0):
            raise ValueError(
                f"{name} must hold {pairs} finite numbers > 0 (rotary_dim // 2); got {factors!r}"
            )
        tables.append(jnp.asarray(theta / f, jnp.float32))
    positions = as_batched_positions(positions)
    current = positions.max(axis=1) + 1  # [b]
    return jnp.where((current > original_length)[:, None], tables[1][None], tables[0][None])


def longrope_attention_factor(scale: float, original_length: int) -> float:
    """LongRoPE's attention factor ``sqrt(1 + ln(s) / ln(L))`` (1 for ``s = 1``), by which
    Hugging Face multiplies the rotary cos and sin (``_compute_longrope_parameters``; Phi-3).

    ``s`` = HF ``factor`` (``max_position_embeddings / original_max_position_embeddings``
    when the config has none), ``L`` = ``original_length``. The same at every length.
    """
    _check_scale(scale)
    check_positive_int("original_length", original_length)
    if scale == 1:
        return 1.0
    if original_length < 2:
        raise ValueError(f"original_length must be >= 2 for scale > 1; got {original_length}")
    return math.sqrt(1 + math.log(scale) / math.log(original_length))


def rope_scaled_inv_frequencies(
    rotary_dim: int,
    *,
    scaling: str = "none",
    scale: float = 1.0,
    base: float = 10000.0,
    original_length: int | None = None,
    alpha: float = 1.0,
    beta: float = 32.0,
    yarn_variant: str = "hf",
    yarn_truncate: bool = True,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    short_factor: tuple[float, ...] | None = None,
    long_factor: tuple[float, ...] | None = None,
    positions: Array | None = None,
) -> Array:
    """RoPE frequencies under a context-extension method, for `rope_angles`.

    * ``"none"``: ``theta_i = base^(-2i/d)`` (HF ``default``);
    * ``"pi"``: Position Interpolation (Chen et al. 2023, arXiv 2306.15595), positions
      times ``1/s``, i.e. ``theta_i / s`` (HF ``linear``);
    * ``"ntk"``: ``theta_i`` from the base `ntk_scaled_base` (no HF counterpart);
    * ``"dynamic_ntk"``: `dynamic_ntk_inv_frequencies` (HF ``dynamic``; needs
      ``positions``, those of the tokens computed now, and ``original_length``; ``scale`` is
      Hugging Face's ``factor``; returns ``[batch, d // 2]``);
    * ``"yarn"``: `yarn_inv_frequencies` (HF ``yarn``; needs ``original_length``;
      ``yarn_variant`` "hf" or "paper", ``yarn_truncate``); its attention factor is
      `yarn_attention_factor`;
    * ``"llama3"``: `llama3_inv_frequencies` (HF ``llama3``; needs ``original_length``;
      ``low_freq_factor``, ``high_freq_factor``);
    * ``"longrope"``: `longrope_inv_frequencies` (HF ``longrope``; needs ``positions``,
      ``original_length``, ``short_factor`` and ``long_factor``; returns ``[batch, d // 2]``);
      its attention factor is `longrope_attention_factor`.

    All but LongRoPE equal plain RoPE exactly at ``scale = 1`` (dynamic NTK: while ``max
    position + 1 <= original_length``). Returns float32 ``[d // 2]`` (``[batch, d // 2]`` for
    dynamic NTK and LongRoPE).
    """
    if scaling not in ROPE_SCALINGS:
        raise ValueError(f"scaling={scaling!r} is not known; allowed: {list(ROPE_SCALINGS)}")
    _check_scale(scale)
    if scaling == "none":
        return rope_inv_frequencies(rotary_dim, base=base)
    if scaling == "pi":
        return jnp.asarray(_theta(rotary_dim, base) / scale, jnp.float32)  # exact at s = 1
    if scaling == "ntk":
        return rope_inv_frequencies(rotary_dim, base=ntk_scaled_base(base, scale, rotary_dim))
    if original_length is None:
        raise ValueError(f"scaling={scaling!r} needs original_length (the training length)")
    if scaling == "yarn":
        return yarn_inv_frequencies(
            rotary_dim,
            scale=scale,
            original_length=original_length,
            base=base,
            alpha=alpha,
            beta=beta,
            variant=yarn_variant,
            truncate=yarn_truncate,
        )
    if scaling == "llama3":
        return llama3_inv_frequencies(
            rotary_dim,
            scale=scale,
            original_length=original_length,
            base=base,
            low_freq_factor=low_freq_factor,
            high_freq_factor=high_freq_factor,
        )
    if positions is None:
        raise ValueError(f"scaling={scaling!r} needs positions (the current length)")
    if scaling == "longrope":
        if short_factor is None or long_factor is None:
            raise ValueError("scaling='longrope' needs short_factor and long_factor")
        return longrope_inv_frequencies(
            positions,
            rotary_dim,
            original_length=original_length,
            short_factor=short_factor,
            long_factor=long_factor,
            base=base,
        )
    return dynamic_ntk_inv_frequencies(
        positions, rotary_dim, original_length=original_length, base=base, factor=scale
    )


def _check_rotary_dim(rotary_dim: int) -> None:
    check_positive_int("rotary_dim", rotary_dim)
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even (dimensions rotate in pairs); got {rotary_dim}")


def _check_scale(scale: float) -> None:
    if (
        isinstance(scale, bool)
        or not isinstance(scale, int | float)
        or not math.isfinite(scale)
        or scale < 1
    ):
        raise ValueError(f"scale must be a finite number >= 1; got {scale!r}")
