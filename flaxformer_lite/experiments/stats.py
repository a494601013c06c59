"""Confidence intervals across seeds: Student-t quantiles without scipy.

``t_quantile(p, df)`` inverts the Student-t CDF by bisection. The CDF is written with the
regularized incomplete beta function (Abramowitz & Stegun 26.7.1):
``P(T <= t) = 1 - I_x(df/2, 1/2) / 2`` for ``t >= 0`` with ``x = df / (df + t^2)``, and
``I_x(a, b)`` is evaluated by its continued fraction (modified Lentz; Numerical Recipes §6.4).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

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
