"""Positional encodings as pure functions of explicit integer positions (no Flax, no state).

Positions are int arrays ``[batch, length]`` (``[length]`` is accepted and treated as one
row shared by the batch). Everything is computed from the positions, never sliced from a
fixed table, so any length works. Angles and biases are float32: bfloat16 has an 8-bit
mantissa and cannot tell position 256 from 257.

Three hook points (DESIGN.md §3): an encoding is **added** to token embeddings
(`sinusoidal`), **rotates** queries and keys (`apply_rope`), or **biases** attention logits
(`alibi_bias`). The learned table lives in `flaxformer_lite.encodings` because it has
parameters.

Beyond those: T5 buckets (`t5_relative_position_bucket`), xPos (`apply_xpos`), KERPLE
(`kerple_log_bias`, `kerple_power_bias`), FIRE's normalised distance
(`fire_normalized_distance`), randomized positions (`randomized_positions`), partial rotary
(`rotary_dim_for`) and RoPE context extension (`rope_scaled_inv_frequencies`: PI, NTK,
dynamic NTK, YaRN). Learned parameters live in the NNX modules, not here.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
ROPE_LAYOUTS = ("half", "interleaved")


def as_batched_positions(positions: Array) -> Array:
    """Positions as int32 ``[batch, length]``; a ``[length]`` array becomes ``[1, length]``."""
    positions = jnp.asarray(positions)
    if not jnp.issubdtype(positions.dtype, jnp.integer):
        raise ValueError(f"positions must be integers; got dtype {positions.dtype}")
    if positions.ndim == 1:
        positions = positions[None, :]
    if positions.ndim != 2:
        raise ValueError(f"positions must be [batch, length] or [length]; got {positions.shape}")
    return positions.astype(jnp.int32)


def sinusoidal(positions: Array, dim: int, *, base: float = 10000.0) -> Array:
    """Sinusoidal encoding of Vaswani et al. 2017, §3.5, in the original interleaved layout.

    ``PE[p, 2i] = sin(p / base^(2i/dim))`` and ``PE[p, 2i+1] = cos(p / base^(2i/dim))``:
    sine on even dimensions, cosine on odd ones. For an odd ``dim`` the last (cosine)
    column is dropped.

    Args:
      positions: int ``[batch, length]`` or ``[length]``.
      dim: encoding width (the model's ``d_model``).
      base: wavelength base, 10000 in the paper.

    Returns:
      float32 ``positions.shape + (dim,)``.
    """
    _check_positive_int("dim", dim)
    _check_positive_float("base", base)
    positions = jnp.asarray(positions)
    if not jnp.issubdtype(positions.dtype, jnp.integer):
        raise ValueError(f"positions must be integers; got dtype {positions.dtype}")
    half = (dim + 1) // 2
    # 1 / base^(2i/dim) for i = 0..half-1, in float64 on the host, then float32.
    inv_freq = jnp.asarray(base ** (-2.0 * np.arange(half) / dim), dtype=jnp.float32)
    angles = _outer(positions, inv_freq)  # [..., half]
    pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [..., half, 2]
    return pe.reshape((*positions.shape, 2 * half))[..., :dim]


def rope_inv_frequencies(rotary_dim: int, *, base: float = 10000.0) -> Array:
    """RoPE frequencies ``theta_i = base^(-2i/rotary_dim)``, float32 ``[rotary_dim // 2]``.

    Su et al. 2021, "RoFormer" (arXiv 2104.09864), Eq. 15.
    """
    _check_positive_int("rotary_dim", rotary_dim)
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even (dimensions rotate in pairs); got {rotary_dim}")
    _check_positive_float("base", base)
    return jnp.asarray(base ** (-2.0 * np.arange(rotary_dim // 2) / rotary_dim), jnp.float32)


def rope_angles(positions: Array, inv_freq: Array) -> Array:
    """Rotation angles ``p * theta_i`` in float32: ``[batch, length, pairs]``.

    ``inv_freq`` is ``[pairs]`` (shared) or ``[batch or 1, pairs]`` (one set per row, e.g.
    dynamic NTK scaling).
    """
    positions = as_batched_positions(positions)
    inv_freq = jnp.asarray(inv_freq, jnp.float32)
    if inv_freq.ndim == 2:
        return positions.astype(jnp.float32)[:, :, None] * inv_freq[:, None, :]
    return _outer(positions, inv_freq)


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
    cos = jnp.cos(angles)[:, :, None, :]  # [b, l, 1, pairs]
    sin = jnp.sin(angles)[:, :, None, :]
    rot, rest = x[..., :rotary_dim].astype(jnp.float32), x[..., rotary_dim:]
    if layout == "half":
        x1, x2 = rot[..., :pairs], rot[..., pairs:]
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    if layout == "half":
        rotated = jnp.concatenate([y1, y2], axis=-1)
    else:
        rotated = jnp.stack([y1, y2], axis=-1).reshape(rot.shape)
    return jnp.concatenate([rotated.astype(x.dtype), rest], axis=-1)


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
    angles = rope_angles(positions, rope_inv_frequencies(rotary_dim, base=base))
    if angles.shape[1] != x.shape[1]:
        raise ValueError(f"positions length {angles.shape[1]} != x length {x.shape[1]}")
    return apply_rotary(x, angles, layout=layout)


def alibi_slopes(num_heads: int) -> Array:
    """Per-head ALiBi slopes ``m_h``, float32 ``[num_heads]`` (Press et al. 2022, §3).

    For ``n`` a power of two the slopes are geometric with first term and ratio
    ``2^(-8/n)``. Otherwise, as in the official ``get_slopes``: the slopes for the nearest
    lower power of two ``p``, followed by every other slope of ``2p`` heads (indices 0, 2,
    4, ...) until there are ``n``. E.g. -log2 of the 12-head slopes is
    ``[1, 2, ..., 8, 0.5, 1.5, 2.5, 3.5]``.
    """
    _check_positive_int("num_heads", num_heads)
    return jnp.asarray(_alibi_slopes_list(num_heads), dtype=jnp.float32)


def _alibi_slopes_list(n: int) -> list[float]:
    def geometric(p: int) -> list[float]:
        start = 2.0 ** (-8.0 / p)
        return [start ** (i + 1) for i in range(p)]

    p = 2 ** math.floor(math.log2(n))
    if p == n:
        return geometric(n)
    return geometric(p) + geometric(2 * p)[0::2][: n - p]


def relative_positions(q_positions: Array, k_positions: Array) -> Array:
    """``q_pos[i] - k_pos[j]`` as int32 ``[batch, q_len, kv_len]`` (positive: key in the past)."""
    q_positions = as_batched_positions(q_positions)
    k_positions = as_batched_positions(k_positions)
    return q_positions[:, :, None] - k_positions[:, None, :]


def alibi_bias(
    q_positions: Array, k_positions: Array, slopes: Array, *, causal: bool = True
) -> Array:
    """ALiBi logit bias (Press et al. 2022, "Train Short, Test Long", arXiv 2108.12409).

    Causal: ``-m_h * (i - j)`` (entries with key j after query i are positive but are
    removed by the causal mask). Bidirectional (``causal=False``): ``-m_h * |i - j|``.
    Computed from the true positions, so it is valid with padding and cached decoding
    (the official code's keys-only form relies on softmax shift-invariance instead).

    Args:
      q_positions: int ``[batch, q_len]`` (or ``[q_len]``).
      k_positions: int ``[batch, kv_len]`` (or ``[kv_len]``).
      slopes: float ``[heads]``, e.g. `alibi_slopes`.
      causal: choose the causal or the symmetric form.

    Returns:
      float32 ``[batch, heads, q_len, kv_len]``.
    """
    rel = relative_positions(q_positions, k_positions).astype(jnp.float32)
    if not causal:
        rel = jnp.abs(rel)
    slopes = jnp.asarray(slopes, dtype=jnp.float32)
    if slopes.ndim != 1:
        raise ValueError(f"slopes must be [heads]; got shape {slopes.shape}")
    return -slopes[None, :, None, None] * rel[:, None, :, :]


# --------------------------------------------------------------- T5 relative-position buckets


def t5_relative_position_bucket(
    relative_position: Array,
    *,
    bidirectional: bool,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Array:
    """T5 relative-position buckets (Raffel et al. 2020, §2.1; flaxformer
    ``RelativePositionBiases._relative_position_bucket``).

    **Sign convention**: ``relative_position = q_pos - k_pos``, as returned by
    `relative_positions` (positive: the key is in the past). T5's code takes
    ``memory_position - query_position``, the negative of ours, and negates it first.

    With ``B`` buckets per side (``num_buckets // 2`` if bidirectional, else ``num_buckets``)
    and ``max_exact = B // 2``, a distance ``n >= 0`` goes to

    * bucket ``n`` if ``n < max_exact`` (one bucket per distance), else
    * ``max_exact + floor(log(n / max_exact) / log(max_distance / max_exact) * (B - max_exact))``
      capped at ``B - 1`` (log-spaced up to ``max_distance``; every ``n >= max_distance``
      shares the last bucket).

    Bidirectional: keys in the past or at the query (``q - k >= 0``) use buckets ``[0, B)``
    with ``n = q - k``; keys in the future use ``[B, 2B)`` with ``n = k - q``.
    Causal (``bidirectional=False``): ``n = max(q - k, 0)``, all ``num_buckets`` describe the
    past and future keys share bucket 0 (the causal mask removes them anyway).

    The log-spaced boundaries are integer thresholds computed on the host in float64, so a
    distance whose formula value is a whole number (e.g. ``n = 16``, ``B = 16``:
    ``max_exact + 2``) lands in the right bucket on every backend; flaxformer adds float32
    ``eps`` inside the log for the same purpose.

    Args:
      relative_position: int array of any shape, ``q_pos - k_pos``.
      bidirectional: bidirectional (encoder) or causal (decoder) bucketing.
      num_buckets: total buckets (T5: 32).
      max_distance: distances from here on share the last bucket of their side (T5: 128).

    Returns:
      int32 buckets in ``[0, num_buckets)``, same shape as ``relative_position``.
    """
    relative_position = jnp.asarray(relative_position)
    if not jnp.issubdtype(relative_position.dtype, jnp.integer):
        raise ValueError(f"relative_position must be integers; got dtype {relative_position.dtype}")
    _check_positive_int("num_buckets", num_buckets)
    _check_positive_int("max_distance", max_distance)
    side = num_buckets // 2 if bidirectional else num_buckets
    if side < 2:
        raise ValueError(
            f"num_buckets={num_buckets} is too small: need >= {4 if bidirectional else 2} "
            f"(bidirectional={bidirectional})"
        )
    max_exact = side // 2
    if max_distance <= max_exact:
        raise ValueError(
            f"max_distance={max_distance} must exceed the exact range max_exact={max_exact} "
            f"(num_buckets={num_buckets}, bidirectional={bidirectional})"
        )
    rel = relative_position.astype(jnp.int32)
    if bidirectional:
        offset = jnp.where(rel < 0, jnp.int32(side), jnp.int32(0))
        n = jnp.abs(rel)
    else:
        offset = jnp.zeros_like(rel)
        n = jnp.maximum(rel, 0)
    thresholds = _t5_log_thresholds(max_exact, side, max_distance)
    if thresholds.size:
        th = jnp.asarray(thresholds, jnp.int32).reshape((1,) * n.ndim + thresholds.shape)
        passed = (n[..., None] >= th).astype(jnp.int32).sum(axis=-1)
    else:
        passed = jnp.zeros_like(n)
    bucket = jnp.where(n < max_exact, n, max_exact + passed)
    return (offset + bucket).astype(jnp.int32)


def _t5_log_thresholds(max_exact: int, side: int, max_distance: int) -> np.ndarray:
    """Smallest distance reaching log bucket ``max_exact + k``, for k = 1..side-max_exact-1.

    ``floor(log(n/e) / log(D/e) * (side - e)) >= k  <=>  n >= e * (D/e)^(k / (side - e))``.
    """
    k = np.arange(1, side - max_exact, dtype=np.float64)
    t = max_exact * (max_distance / max_exact) ** (k / (side - max_exact))
    nearest = np.round(t)
    t = np.where(np.abs(t - nearest) <= 1e-9 * t, nearest, np.ceil(t))
    return t.astype(np.int64)


# ------------------------------------------------------------------------------------ xPos


def xpos_zeta(rotary_dim: int) -> Array:
    """xPos per-pair decay base ``zeta_i = (2i + 0.4 d) / (1.4 d)``, float32 ``[d // 2]``.

    Sun et al. 2022, "A Length-Extrapolatable Transformer" (arXiv 2212.10554), Eq. 9;
    ``d = rotary_dim``. All ``zeta_i < 1``; high-frequency pairs (small i) decay fastest.
    """
    _check_positive_int("rotary_dim", rotary_dim)
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even (dimensions rotate in pairs); got {rotary_dim}")
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
    positions = as_batched_positions(positions)
    angles = rope_angles(positions, rope_inv_frequencies(rotary_dim, base=base))
    if angles.shape[1] != x.shape[1]:
        raise ValueError(f"positions length {angles.shape[1]} != x length {x.shape[1]}")
    rotated = apply_rotary(x.astype(jnp.float32), angles, layout=layout)
    center = jnp.asarray(center, jnp.int32)
    center = center.reshape((1, 1)) if center.ndim == 0 else center.reshape((-1, 1))
    exponent = (positions - center).astype(jnp.float32) / jnp.float32(scale_base)  # [b, l]
    if inverse:
        exponent = -exponent
    log_zeta = jnp.log(xpos_zeta(rotary_dim))
    scale = jnp.exp(exponent[:, :, None] * log_zeta[None, None, :])  # [b, l, pairs]
    if layout == "half":
        scale = jnp.concatenate([scale, scale], axis=-1)
    else:
        scale = jnp.repeat(scale, 2, axis=-1)
    scaled = rotated[..., :rotary_dim] * scale[:, :, None, :]
    return jnp.concatenate([scaled, rotated[..., rotary_dim:]], axis=-1).astype(x.dtype)


# ---------------------------------------------------------------------------------- KERPLE


def kerple_log_bias(q_positions: Array, k_positions: Array, r1: Array, r2: Array) -> Array:
    """KERPLE logarithmic kernel bias ``-r1_h * log(1 + r2_h * |i - j|)``.

    Chi et al. 2022, "KERPLE" (arXiv 2205.09921), Eq. for the log variant; reference
    chijames/KERPLE ``ParallelKerpleLog``. ``r1, r2``: float ``[heads]``, positive (the
    module clamps them). Returns float32 ``[batch, heads, q_len, kv_len]``.
    """
    d, r1, r2 = _abs_distance_and_heads(q_positions, k_positions, r1, r2)
    return -r1 * jnp.log1p(r2 * d)


def kerple_power_bias(q_positions: Array, k_positions: Array, r1: Array, r2: Array) -> Array:
    """KERPLE power kernel bias ``-r1_h * |i - j|^r2_h`` (``r1 > 0``, ``0 < r2 <= 2``).

    Chi et al. 2022 (arXiv 2205.09921); reference ``ParallelKerplePower``. The value (and the
    gradient with respect to ``r2``) is 0 at distance 0. Returns float32
    ``[batch, heads, q_len, kv_len]``.
    """
    d, r1, r2 = _abs_distance_and_heads(q_positions, k_positions, r1, r2)
    positive = d > 0
    safe = jnp.where(positive, d, jnp.float32(1.0))  # avoids 0^r2's log(0) in the gradient
    return -r1 * jnp.where(positive, safe**r2, jnp.float32(0.0))


def _abs_distance_and_heads(
    q_positions: Array, k_positions: Array, r1: Array, r2: Array
) -> tuple[Array, Array, Array]:
    """``|i - j|`` as float32 ``[b, 1, q, k]`` and per-head params as ``[1, heads, 1, 1]``."""
    d = jnp.abs(relative_positions(q_positions, k_positions)).astype(jnp.float32)[:, None]
    out = []
    for name, r in (("r1", r1), ("r2", r2)):
        r = jnp.asarray(r, jnp.float32)
        if r.ndim != 1:
            raise ValueError(f"{name} must be [heads]; got shape {r.shape}")
        out.append(r[None, :, None, None])
    return d, out[0], out[1]


# ------------------------------------------------------------------------------------ FIRE


def fire_normalized_distance(
    q_positions: Array,
    k_positions: Array,
    *,
    c: Array | float,
    threshold: Array | float,
    eps: float = 1e-6,
) -> Array:
    """FIRE's progressively normalised distance ``psi(|i - j|) / (psi(max(L, i)) + eps)``.

    Li et al. 2024, "Functional Interpolation for Relative Positions Improves Long Context
    Transformers" (arXiv 2310.04418), Eq. 3-4, with ``psi(x) = log(c x + 1)``, ``i`` the
    query position, ``j`` the key position and ``L = threshold``. The paper states it for
    causal attention (``i >= j``); the absolute value makes it defined for bidirectional
    attention too, symmetric in past and future (as in the public implementations, which
    take ``|c (i - j)|``). ``eps`` as in those implementations (keeps ``i = 0`` finite).

    Args:
      q_positions, k_positions: int ``[batch, len]`` (or ``[len]``).
      c: positive scalar (learned; init 0.1). threshold: positive scalar L (learned; init 512).

    Returns:
      float32 ``[batch, q_len, kv_len]``, in ``[0, 1)`` for ``0 <= j <= i``.
    """
    rel = jnp.abs(relative_positions(q_positions, k_positions)).astype(jnp.float32)
    c = jnp.asarray(c, jnp.float32)
    threshold = jnp.asarray(threshold, jnp.float32)
    i = as_batched_positions(q_positions).astype(jnp.float32)[:, :, None]  # [b, q, 1]
    numerator = jnp.log1p(c * rel)
    denominator = jnp.log1p(c * jnp.maximum(threshold, i)) + jnp.float32(eps)
    return numerator / denominator


# ------------------------------------------------------------------- randomized positions


def randomized_positions(key: Array, batch: int, length: int, *, max_position: int) -> Array:
    """Randomized positions (Ruoss et al. 2023, arXiv 2305.16843), int32 ``[batch, length]``.

    Each row is ``length`` distinct values drawn uniformly without replacement from
    ``[0, max_position)``, sorted ascending: the first ``length`` entries of a random
    permutation, per row (rows are independent; the DeepMind code draws one row per batch).
    Deterministic for a given ``key``. Works with every encoding: they all read positions.

    Args:
      key: a JAX PRNG key.
      batch, length: output shape (static ints).
      max_position: exclusive upper bound, ``>= length`` (2048 in the paper's code).
    """
    _check_positive_int("batch", batch)
    _check_positive_int("length", length)
    _check_positive_int("max_position", max_position)
    if length > max_position:
        raise ValueError(
            f"length={length} distinct positions cannot be drawn from "
            f"[0, max_position={max_position}); need max_position >= length"
        )
    keys = jax.random.split(key, batch)
    row = lambda k: jnp.sort(jax.random.permutation(k, max_position)[:length])
    return jax.vmap(row)(keys).astype(jnp.int32)


# ------------------------------------------------ partial rotary and RoPE context extension

ROPE_SCALINGS = ("none", "pi", "ntk", "dynamic_ntk", "yarn")


def rotary_dim_for(head_dim: int, fraction: float = 1.0) -> int:
    """Rotated dimensions for partial rotary: the even number nearest ``fraction * head_dim``
    (halves round up), at least 2 and at most ``head_dim`` (GPT-NeoX ``rotary_pct``; the NoPE
    study's "rotary" uses 1/4). The frequencies then use ``rotary_dim`` in
    ``theta_i = base^(-2i/rotary_dim)``.
    """
    _check_positive_int("head_dim", head_dim)
    if not isinstance(fraction, int | float) or not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1]; got {fraction!r}")
    if head_dim < 2:
        raise ValueError(f"head_dim={head_dim} has no pair of dimensions to rotate")
    nearest = 2 * math.floor(fraction * head_dim / 2 + 0.5)
    return max(2, min(nearest, head_dim - head_dim % 2))


def ntk_scaled_base(base: float, scale: float, rotary_dim: int) -> float:
    """NTK-aware base ``b' = b * s^(d / (d - 2))`` with ``d = rotary_dim`` (bloc97 2023;
    Peng et al. 2023, arXiv 2309.00071, §3.1): the lowest frequency is interpolated by ``s``,
    the highest is kept."""
    _check_positive_float("base", base)
    _check_scale(scale)
    if rotary_dim <= 2:
        raise ValueError(f"NTK scaling needs rotary_dim > 2; got {rotary_dim}")
    return float(base) * float(scale) ** (rotary_dim / (rotary_dim - 2))


def yarn_ramp(r: np.ndarray, *, alpha: float = 1.0, beta: float = 32.0) -> np.ndarray:
    """YaRN ramp ``gamma(r)``: 0 for ``r < alpha``, 1 for ``r > beta``, linear between."""
    if not 0 <= alpha < beta:
        raise ValueError(f"need 0 <= alpha < beta; got alpha={alpha!r}, beta={beta!r}")
    return np.clip((np.asarray(r, np.float64) - alpha) / (beta - alpha), 0.0, 1.0)


def yarn_inv_frequencies(
    rotary_dim: int,
    *,
    scale: float,
    original_length: int,
    base: float = 10000.0,
    alpha: float = 1.0,
    beta: float = 32.0,
) -> Array:
    """YaRN frequencies (Peng et al. 2023, arXiv 2309.00071, Eq. 17-19), float32 ``[d // 2]``.

    ``theta'_i = (1 - gamma(r_i)) * theta_i / s + gamma(r_i) * theta_i`` with
    ``r_i = L / lambda_i``, ``lambda_i = 2 pi / theta_i`` (wavelength), ``L`` the training
    length: pairs that turn fewer than ``alpha`` times over ``L`` are interpolated (PI),
    pairs turning more than ``beta`` times are kept, a linear blend between. Computed in
    float64 on the host. (The authors' code rounds the ramp ends to whole dimension
    indices; this follows the paper's continuous ``gamma(r)``.) ``scale = 1`` gives RoPE
    exactly.
    """
    _check_scale(scale)
    _check_positive_int("original_length", original_length)
    rope_inv_frequencies(rotary_dim, base=base)  # validates rotary_dim and base
    theta = float(base) ** (-2.0 * np.arange(rotary_dim // 2) / rotary_dim)
    if scale == 1:
        return jnp.asarray(theta, jnp.float32)
    gamma = yarn_ramp(original_length * theta / (2 * math.pi), alpha=alpha, beta=beta)
    return jnp.asarray((1.0 - gamma) * theta / scale + gamma * theta, jnp.float32)


def yarn_attention_factor(scale: float) -> float:
    """YaRN's ``sqrt(1/t) = 0.1 ln(s) + 1`` (Eq. 22); queries and keys are both multiplied by
    it, so the logits scale by ``1/t``. Exactly 1 at ``s = 1``."""
    _check_scale(scale)
    return 1.0 if scale == 1 else 0.1 * math.log(scale) + 1.0


def dynamic_ntk_inv_frequencies(
    k_positions: Array, rotary_dim: int, *, original_length: int, base: float = 10000.0
) -> Array:
    """Dynamic NTK frequencies, float32 ``[batch, d // 2]``, per row from its own length.

    ``s = max(1, current_length / L)`` with ``current_length = max key position + 1`` (a
    traced value, fine under jit), then the NTK base ``b * s^(d/(d-2))``, written as
    ``theta_i * s^(-2i/(d-2))`` so that ``s = 1`` reproduces RoPE's frequencies bit for bit.
    Queries and keys of a row must share these frequencies (pass the key positions).
    """
    _check_positive_int("original_length", original_length)
    if rotary_dim <= 2:
        raise ValueError(f"NTK scaling needs rotary_dim > 2; got {rotary_dim}")
    theta = rope_inv_frequencies(rotary_dim, base=base)
    k_positions = as_batched_positions(k_positions)
    current = (k_positions.max(axis=1) + 1).astype(jnp.float32)  # [b]
    s = jnp.maximum(jnp.float32(1.0), current / jnp.float32(original_length))[:, None]
    exponent = jnp.asarray(-2.0 * np.arange(rotary_dim // 2) / (rotary_dim - 2), jnp.float32)
    factor = jnp.where(s > 1.0, s ** exponent[None, :], jnp.float32(1.0))
    return theta[None, :] * factor


def rope_scaled_inv_frequencies(
    rotary_dim: int,
    *,
    scaling: str = "none",
    scale: float = 1.0,
    base: float = 10000.0,
    original_length: int | None = None,
    alpha: float = 1.0,
    beta: float = 32.0,
    k_positions: Array | None = None,
) -> Array:
    """RoPE frequencies under a context-extension method, for `rope_angles`.

    * ``"none"``: ``theta_i = base^(-2i/d)``;
    * ``"pi"``: Position Interpolation (Chen et al. 2023, arXiv 2306.15595), positions
      times ``1/s``, i.e. ``theta_i / s``;
    * ``"ntk"``: ``theta_i`` from the base `ntk_scaled_base`;
    * ``"dynamic_ntk"``: `dynamic_ntk_inv_frequencies` (needs ``k_positions`` and
      ``original_length``; returns ``[batch, d // 2]``);
    * ``"yarn"``: `yarn_inv_frequencies` (needs ``original_length``); its attention factor
      is `yarn_attention_factor`.

    All equal plain RoPE exactly at ``scale = 1`` (dynamic NTK: when ``max key position + 1
    <= original_length``). Returns float32 ``[d // 2]`` (``[batch, d // 2]`` for dynamic NTK).
    """
    if scaling not in ROPE_SCALINGS:
        raise ValueError(f"scaling={scaling!r} is not known; allowed: {list(ROPE_SCALINGS)}")
    _check_scale(scale)
    if scaling == "none":
        return rope_inv_frequencies(rotary_dim, base=base)
    if scaling == "pi":
        theta = rope_inv_frequencies(rotary_dim, base=base)  # validates
        exact = float(base) ** (-2.0 * np.arange(rotary_dim // 2) / rotary_dim) / scale
        return theta if scale == 1 else jnp.asarray(exact, jnp.float32)
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
        )
    if k_positions is None:
        raise ValueError("scaling='dynamic_ntk' needs k_positions (the current length)")
    return dynamic_ntk_inv_frequencies(
        k_positions, rotary_dim, original_length=original_length, base=base
    )


def _check_scale(scale: float) -> None:
    if (
        isinstance(scale, bool)
        or not isinstance(scale, int | float)
        or not math.isfinite(scale)
        or scale < 1
    ):
        raise ValueError(f"scale must be a finite number >= 1; got {scale!r}")


def _outer(positions: Array, freqs: Array) -> Array:
    """``positions[..., None] * freqs`` in float32 with explicit ranks (no rank promotion)."""
    freqs = freqs.reshape((1,) * positions.ndim + freqs.shape)
    return positions.astype(jnp.float32)[..., None] * freqs


def _check_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ValueError(f"{name} must be a positive int; got {value!r}")


def _check_positive_float(name: str, value: float) -> None:
    if not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number; got {value!r}")
