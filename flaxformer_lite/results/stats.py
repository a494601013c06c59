"""Statistics of results: Student-t intervals across seeds; intervals and paired tests over
seeds and evaluation data (the seeds' spread plus a bootstrap of the evaluation files, each
with its blocks, Welch-Satterthwaite degrees of freedom); Holm correction.

``t_quantile(p, df)`` inverts the Student-t CDF by bisection. The CDF is written with the
regularized incomplete beta function (Abramowitz & Stegun 26.7.1):
``P(T <= t) = 1 - I_x(df/2, 1/2) / 2`` for ``t >= 0`` with ``x = df / (df + t^2)``, and
``I_x(a, b)`` is evaluated by its continued fraction (modified Lentz; Numerical Recipes §6.4).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import numpy as np

_EPS = 1e-15
_TINY = 1e-300
# Beyond this many degrees of freedom the t and normal quantiles agree to ~1e-8.
_NORMAL_DF = 1e9


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """Continued fraction of ``I_x(a, b)`` (converges fast for ``x < (a + 1) / (a + b + 2)``)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 100_000):
        m2 = 2 * m
        even = m * (b - m) * x / ((qam + m2) * (a + m2))
        odd = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        for aa in (even, odd):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + aa / c
            c = c if abs(c) > _TINY else _TINY
            delta = c * d
            h *= delta
        if abs(delta - 1.0) < _EPS:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b})")


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function ``I_x(a, b)`` for ``a, b > 0``, ``0 <= x <= 1``."""
    if not (a > 0 and b > 0):
        raise ValueError(f"betainc needs a > 0 and b > 0; got a={a}, b={b}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc needs 0 <= x <= 1; got x={x}")
    if x in (0.0, 1.0):
        return x
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def _normal_cdf(t: float) -> float:
    return 0.5 * math.erfc(-t / math.sqrt(2.0))


def t_cdf(t: float, df: float) -> float:
    """Student-t CDF ``P(T <= t)`` with ``df > 0`` degrees of freedom (``inf`` = normal)."""
    if not df > 0:
        raise ValueError(f"df={df} must be > 0")
    if df >= _NORMAL_DF:
        return _normal_cdf(t)
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))  # P(T > |t|)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """Student-t quantile: the ``t`` with ``P(T <= t) = p`` for ``df`` degrees of freedom.

    ``t_quantile(0.975, 10) = 2.228``; ``df = inf`` gives the normal quantile (1.960).
    Bisection on `t_cdf` to ~1e-12 relative precision.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p={p} must be in (0, 1)")
    if not df > 0:
        raise ValueError(f"df={df} must be > 0")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    cdf = _normal_cdf if df >= _NORMAL_DF else (lambda t: t_cdf(t, df))
    lo, hi = 0.0, 2.0
    while cdf(hi) < p:
        lo, hi = hi, 2.0 * hi
        if hi > 1e300:
            raise ArithmeticError(f"t_quantile({p}, {df}) overflows")
    for _ in range(400):
        mid = 0.5 * (lo + hi)
        if cdf(mid) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return 0.5 * (lo + hi)


def mean_ci(
    values: Iterable[float], *, confidence: float = 0.95
) -> tuple[float, float | None, int]:
    """Mean and Student-t confidence half-width of independent samples (e.g. one per seed).

    ``half_width = t_{(1 + confidence) / 2, n - 1} * s / sqrt(n)`` with the sample standard
    deviation ``s`` (``ddof = 1``). Returns ``(mean, half_width, n)``; ``half_width`` is None
    for ``n = 1`` (no interval from one sample). NaN samples propagate (a diverged run is a
    result, not a gap).
    """
    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        raise ValueError("mean_ci needs at least one value; got none")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence} must be in (0, 1)")
    mean = math.fsum(xs) / n
    if n == 1:
        return mean, None, 1
    var = math.fsum((x - mean) ** 2 for x in xs) / (n - 1)
    return mean, t_quantile((1.0 + confidence) / 2.0, n - 1) * math.sqrt(var) / math.sqrt(n), n


# ----------------------------------------------------------- seeds x blocks: intervals, pairs
#
# A cell's per-block sums form a crossed ``[seeds, blocks]`` grid: every seed (a training run)
# is scored on the same blocks (the same bytes), so the blocks are not nested in the seeds.
# The blocks are grouped into sampling units -- the files of the evaluation split, each with
# all its blocks (blocks of one file are correlated: the same code, the same style); a split
# of one file has its blocks as units. The standard error of the mean over seeds of each
# seed's ratio of sums has two parts:
#
# * seeds: the sample variance of the per-seed statistics over ``S`` (``S - 1`` degrees of
#   freedom); it holds the training noise and the seed x data interaction;
# * data: the variance of the statistic over a bootstrap of the ``F`` units, one draw per
#   replicate shared by every seed (the pigeonhole bootstrap's column resampling, Owen 2007,
#   "The pigeonhole bootstrap", Ann. Appl. Stat. 1(2)), times ``F / (F - 1)`` (the bootstrap
#   variance of a mean divides by ``F``, the unbiased one by ``F - 1``: with 16 units this is
#   3 % of the variance), taken to have ``F - 1`` degrees of freedom; it holds what the
#   finite evaluation set adds, as a sample of files like these.
#
# They are added (the interaction is counted in both, so the sum errs on the wide side by at
# most that term) and the interval is ``mean ± t_{df} * se`` with Welch-Satterthwaite degrees
# of freedom (Satterthwaite 1946): Student t over seeds when the data add nothing, close to
# normal when many units dominate. Coverage in simulated studies, with blocks correlated
# within files as measured on the stdlib validation split: scripts/interval_coverage.py and
# docs/design.md §7.

BOOTSTRAP_REPLICATES = 2000
BOOTSTRAP_SEED = 20261130  # fixed: the same rows always give the same intervals


def seed_means(values: np.ndarray, counts: np.ndarray, transform=None) -> np.ndarray:
    """Per-seed ratio ``sum_b values[s, b] / sum_b counts[s, b]`` (then ``transform``, e.g.
    ``np.exp`` for perplexity from a loss), ``[seeds]``."""
    ratio = values.sum(axis=1) / counts.sum(axis=1)
    return ratio if transform is None else transform(ratio)


def unit_weights(units: np.ndarray, replicates: int, seed: int) -> np.ndarray:
    """``[R, B]`` multiplicities of the blocks in a bootstrap of their sampling units.

    ``units`` ``[B]``: a label per block (its file); each replicate draws ``F`` of the ``F``
    distinct units with replacement, and a block counts as often as its unit was drawn. One
    draw per replicate, applied to every seed (the blocks are the same data for all). With a
    distinct label per block this is the bootstrap of blocks. The same arguments give the
    same draws (cached: a report makes them for every cell and pair)."""
    draws, inverse = _unit_draws(units, replicates, seed)
    return draws[:, inverse]


def _unit_draws(units: np.ndarray, replicates: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(draws, inverse)``: ``[R, F]`` multiplicities of the ``F`` distinct units in each
    replicate and ``[B]`` the unit index of each block (`unit_weights` is
    ``draws[:, inverse]``). Read-only, cached."""
    units = np.asarray(units)
    return _cached_draws(units.tobytes(), units.dtype.str, units.shape, replicates, seed)


@functools.lru_cache(maxsize=16)  # a few distinct block layouts per report
def _cached_draws(raw: bytes, dtype: str, shape, replicates: int, seed: int):
    units = np.frombuffer(raw, dtype=dtype).reshape(shape)
    _, inverse = np.unique(units, return_inverse=True)
    inverse = inverse.reshape(-1)
    n_units = int(inverse.max()) + 1
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(n_units, np.full(n_units, 1.0 / n_units), size=replicates)
    draws = draws.astype(np.float64)
    for a in (draws, inverse):
        a.flags.writeable = False
    return draws, inverse


def num_units(units: np.ndarray) -> int:
    """Distinct sampling units among the blocks' labels."""
    return int(np.unique(np.asarray(units)).shape[0])


def effective_units(units: np.ndarray) -> float:
    """Kish's effective number of sampling units, ``(sum n)^2 / sum n^2`` over the units' block
    counts ``n`` (Kish 1965, *Survey Sampling*): the number of equal units that would
    give the mean of the blocks the same variance. ``units``: ``[blocks]`` labels (any dtype),
    each block's unit (its file); returns a float in ``[1, number of units]``. ``[0, 0, 1]`` ->
    1.8; equal units -> their number. Unequal file sizes make it smaller than `num_units`, and
    the intervals' coverage lower than nominal (docs/design.md §7)."""
    _, counts = np.unique(np.asarray(units), return_counts=True)
    n = counts.astype(np.float64)
    return float(n.sum() ** 2 / (n**2).sum())


def _replicate_means(values, counts, draws, inverse, transform=None) -> np.ndarray:
    """The statistic (mean over seeds of each seed's ratio over the drawn blocks) for every
    replicate, ``[R]``: the blocks' sums are added per unit first (``[S, F]``), so each
    replicate costs ``F``, not ``B``, products."""
    n_units = draws.shape[1]

    def per_unit(x):  # [S, B] -> [S, F]
        out = np.zeros((x.shape[0], n_units))
        np.add.at(out, (slice(None), inverse), x)
        return out

    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        ratio = (draws @ per_unit(values).T) / (draws @ per_unit(counts).T)  # [R, S]
        return (ratio if transform is None else transform(ratio)).mean(axis=1)


def _standard_error(per_seed: np.ndarray, replicates: np.ndarray, n_units: int):
    """``(se, df)`` of a mean over seeds from its two parts (the module's comment above):
    ``per_seed`` ``[S]`` the statistic of each seed, ``replicates`` ``[R]`` the statistic over
    draws of ``n_units`` units. NaN when either holds a non-finite value (a diverged run)."""
    if not (np.isfinite(per_seed).all() and np.isfinite(replicates).all()):
        return math.nan, math.nan
    n = per_seed.size
    parts = []  # (variance of the mean, degrees of freedom)
    if n > 1:
        parts.append((float(np.var(per_seed, ddof=1)) / n, n - 1))
    if n_units > 1:
        correction = n_units / (n_units - 1)  # the bootstrap's 1/F variance -> 1/(F - 1)
        parts.append((correction * float(np.var(replicates, ddof=1)), n_units - 1))
    var = math.fsum(v for v, _ in parts)
    if var <= 0.0:
        return 0.0, math.inf
    df = var * var / math.fsum(v * v / d for v, d in parts)
    return math.sqrt(var), df


def _half_width(se: float, df: float, confidence: float) -> float:
    if not math.isfinite(se):
        return math.nan
    if se == 0.0:
        return 0.0
    return t_quantile((1.0 + confidence) / 2.0, df) * se


def bootstrap_interval(
    values: np.ndarray,
    counts: np.ndarray,
    *,
    confidence: float = 0.95,
    replicates: int = BOOTSTRAP_REPLICATES,
    seed: int = BOOTSTRAP_SEED,
    transform=None,
    units: np.ndarray | None = None,
) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean over seeds of each seed's ratio of sums and its
    ``confidence`` interval ``mean ± t_df * se``, with ``se`` from the seeds' spread and a
    bootstrap of the blocks shared by every seed (the module's comment above).

    Args:
      values: ``[seeds, blocks]`` per-block sums (e.g. loss in bits); counts: ``[seeds,
        blocks]`` per-block weights (scored targets). The blocks are the same data for every
        seed, so the interval covers both training noise and the finite evaluation set (with
        one seed, the evaluation set only).
      transform: applied to each seed's ratio before the mean over seeds (``np.exp``:
        perplexity from a loss in nats).
      units: ``[blocks]`` the sampling unit of each block (its file); None: every block its
        own unit.

    A non-finite value anywhere (a diverged run) gives NaN ends: no interval, not a partial one.
    """
    values, counts = np.asarray(values, np.float64), np.asarray(counts, np.float64)
    _check_grid(values, counts)
    _check_settings(confidence, replicates)
    units = _check_units(units, values.shape[1])
    per_seed = seed_means(values, counts, transform)
    mean = float(per_seed.mean())
    draws, inverse = _unit_draws(units, replicates, seed)
    reps = _replicate_means(values, counts, draws, inverse, transform)
    se, df = _standard_error(per_seed, reps, num_units(units))
    half = _half_width(se, df, confidence)
    return mean, mean - half, mean + half


def paired_difference(
    values_a: np.ndarray,
    counts_a: np.ndarray,
    values_b: np.ndarray,
    counts_b: np.ndarray,
    *,
    confidence: float = 0.95,
    replicates: int = BOOTSTRAP_REPLICATES,
    seed: int = BOOTSTRAP_SEED,
    transform=None,
    units: np.ndarray | None = None,
) -> dict[str, float]:
    """Paired difference ``a - b`` of the seed-mean ratios, over the same seeds and blocks.

    Both inputs are ``[seeds, blocks]`` with matching rows (the same seeds: same data order)
    and columns (the same evaluation blocks). The seeds' part of the standard error is the
    spread of the per-seed differences; the blocks' part comes from the *same* block draws
    applied to ``a`` and ``b``, so what the two share (which bytes are hard) cancels;
    ``units`` as in `bootstrap_interval`. Returns
    ``{"delta", "low", "high", "p"}``: the observed difference, its ``mean ± t_df * se``
    interval and the two-sided p-value of Welch's statistic ``delta / se`` on ``df``
    Welch-Satterthwaite degrees of freedom. Identical inputs give ``delta = 0, p = 1``; a
    difference with no spread at all (the same shift in every block and seed) gives ``p = 0``;
    a non-finite value (a diverged run) gives NaN interval ends and ``p = NaN``: not tested.
    """
    arrays = [np.asarray(x, np.float64) for x in (values_a, counts_a, values_b, counts_b)]
    _check_grid(arrays[0], arrays[1])
    _check_grid(arrays[2], arrays[3])
    if arrays[0].shape != arrays[2].shape:
        raise ValueError(
            f"paired inputs need the same [seeds, blocks]; got {arrays[0].shape} and "
            f"{arrays[2].shape}"
        )
    _check_settings(confidence, replicates)
    va, ca, vb, cb = arrays
    units = _check_units(units, va.shape[1])
    per_seed = seed_means(va, ca, transform) - seed_means(vb, cb, transform)
    delta = float(per_seed.mean())
    draws, inverse = _unit_draws(units, replicates, seed)
    reps = _replicate_means(va, ca, draws, inverse, transform) - _replicate_means(
        vb, cb, draws, inverse, transform
    )
    se, df = _standard_error(per_seed, reps, num_units(units))
    half = _half_width(se, df, confidence)
    if not (math.isfinite(delta) and math.isfinite(se)):
        p = math.nan
    elif se == 0.0:
        p = 1.0 if delta == 0.0 else 0.0
    else:
        p = min(1.0, 2.0 * t_cdf(-abs(delta) / se, df))
    return {"delta": delta, "low": delta - half, "high": delta + half, "p": p}


def holm(p_values: Iterable[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (Holm 1979), in the input order.

    Sorted ascending, ``p_(i)`` becomes ``max_{j <= i} min(1, (m - j + 1) p_(j))``; reject
    where the adjusted value is below alpha. Controls the family-wise error rate. A NaN
    p-value (a comparison that could not be made: a diverged run) stays NaN and is not
    counted in the family ``m``.
    """
    ps = [float(p) for p in p_values]
    tested = sorted((i for i, p in enumerate(ps) if not math.isnan(p)), key=lambda i: ps[i])
    m = len(tested)
    adjusted = [math.nan] * len(ps)
    running = 0.0
    for rank, i in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def _check_settings(confidence: float, replicates: int) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence} must be in (0, 1)")
    if isinstance(replicates, bool) or not isinstance(replicates, int) or replicates < 2:
        raise ValueError(f"replicates={replicates!r} must be an int >= 2 (a variance needs two)")


def _check_grid(values: np.ndarray, counts: np.ndarray) -> None:
    if values.ndim != 2 or values.shape != counts.shape or 0 in values.shape:
        raise ValueError(
            f"need [seeds, blocks] values and counts of one shape; got {values.shape} and "
            f"{counts.shape}"
        )
    if (counts.sum(axis=1) <= 0).any():
        raise ValueError("every seed needs a positive total count")


def _check_units(units: np.ndarray | None, n_blocks: int) -> np.ndarray:
    if units is None:
        return np.arange(n_blocks)
    units = np.asarray(units)
    if units.shape != (n_blocks,):
        raise ValueError(
            f"units must give one label per block: shape ({n_blocks},); got {units.shape}"
        )
    return units
