"""Confidence intervals and the paired test behind a verdict, from counts alone.

Every function takes counts (or sums) that :class:`~consistency_gate.core.counts.ConsistencyCounts`
merges, so one pass, a stream of chunks and a Spark job give the same intervals.

- Proportions (ACC, CON, flips, CCON-k, CACC-k, BTC, BEC): Wilson score intervals
  (:func:`wilson`), or exact Clopper-Pearson (:func:`clopper_pearson`).
- A paired difference of proportions (candidate ACC minus previous ACC = ItoC - CtoI):
  Newcombe's method 10 (:func:`newcombe_paired`), and the exact McNemar test on the
  discordant pairs (:func:`mcnemar_exact`).
- Means of per-sample values (Pearson, cosine, Com): a normal interval from the sum and
  the sum of squares (:func:`mean_interval`).
- The relative negative flip rate: the delta method on the log scale (:func:`rel_nfr_interval`).

>>> [round(v, 4) for v in wilson(18, 600, 0.95)]
[0.0191, 0.0469]
>>> round(mcnemar_exact(9, 2), 4)
0.0654
"""

from __future__ import annotations

import functools
import math

METHODS = ("wilson", "clopper-pearson")


@functools.cache
def z_value(level: float) -> float:
    """The two-sided normal quantile of a confidence level (1.96 for 0.95).

    >>> round(z_value(0.95), 3)
    1.96
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"a confidence level is in (0, 1), got {level}")
    from scipy.stats import norm

    return float(norm.ppf(0.5 + level / 2))


def wilson(k: int, n: int, level: float) -> tuple[float, float] | None:
    """Wilson score interval of the proportion ``k / n``; None when ``n`` is 0.

    >>> wilson(0, 10, 0.95)[0], round(wilson(0, 10, 0.95)[1], 4)
    (0.0, 0.2775)
    """
    if n <= 0:
        return None
    z = z_value(level)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def clopper_pearson(k: int, n: int, level: float) -> tuple[float, float] | None:
    """Exact (Clopper-Pearson) interval of the proportion ``k / n``; None when ``n`` is 0.

    >>> [round(v, 4) for v in clopper_pearson(3, 10, 0.95)]
    [0.0667, 0.6525]
    """
    if n <= 0:
        return None
    from scipy.stats import beta

    alpha = 1 - level
    low = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return low, high


def proportion(k: int, n: int, level: float, method: str = "wilson") -> tuple[float, float] | None:
    """The interval of ``k / n`` by ``method`` (``wilson`` or ``clopper-pearson``).

    >>> [round(v, 4) for v in proportion(3, 40, 0.95)], [round(v, 4) for v in proportion(3, 40, 0.95, METHODS[1])]
    ([0.0258, 0.1986], [0.0157, 0.2039])
    >>> proportion(0, 0, 0.95) is None
    True
    """
    if method == "wilson":
        return wilson(k, n, level)
    if method == "clopper-pearson":
        return clopper_pearson(k, n, level)
    raise ValueError(f"interval method must be one of {', '.join(METHODS)}, got {method!r}")


def newcombe_paired(n11: int, n10: int, n01: int, n00: int, level: float) -> tuple[float, float] | None:
    """Newcombe's method 10 (1998) for the paired difference p2 - p1 of two proportions measured
    on the same samples: p1 = (n11 + n10) / n (the first right), p2 = (n11 + n01) / n.

    With the previous generation first, p2 - p1 is candidate ACC minus previous ACC, (ItoC - CtoI) / n.

    >>> [round(v, 4) for v in newcombe_paired(5, 2, 1, 2, 0.95)]
    [-0.3831, 0.2092]
    """
    n = n11 + n10 + n01 + n00
    if n == 0:
        return None
    p1, p2 = (n11 + n10) / n, (n11 + n01) / n
    l1, u1 = wilson(n11 + n10, n, level)
    l2, u2 = wilson(n11 + n01, n, level)
    product = (n11 + n10) * (n01 + n00) * (n11 + n01) * (n10 + n00)
    phi = (n11 * n00 - n10 * n01) / math.sqrt(product) if product else 0.0
    delta = math.sqrt(max(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))
    epsilon = math.sqrt(max(0.0, (u2 - p2) ** 2 - 2 * phi * (u2 - p2) * (p1 - l1) + (p1 - l1) ** 2))
    difference = p2 - p1
    return max(-1.0, difference - delta), min(1.0, difference + epsilon)


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value on the discordant pairs (``b`` one way, ``c`` the other):
    a binomial test of ``b`` out of ``b + c`` against 1/2; 1.0 when there are none.

    >>> mcnemar_exact(0, 0), round(mcnemar_exact(0, 6), 4)
    (1.0, 0.0312)
    """
    if b + c == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(b, b + c, 0.5).pvalue)


def mean_interval(
    total: float, total_sq: float, count: int, level: float, bounds: tuple[float, float] = (-1.0, 1.0)
) -> tuple[float, float] | None:
    """Normal interval of a mean from the sum and sum of squares of ``count`` values, clipped to
    ``bounds``; None for fewer than two values.

    >>> [round(v, 4) for v in mean_interval(3.0, 5.0, 4, 0.95)]
    [-0.1883, 1.0]
    """
    if count < 2:
        return None
    mean = total / count
    variance = max(0.0, (total_sq - count * mean * mean) / (count - 1))
    half = z_value(level) * math.sqrt(variance / count)
    return max(bounds[0], mean - half), min(bounds[1], mean + half)


def rel_nfr_interval(ctoc: int, ctoi: int, itoc: int, itoi: int, level: float) -> tuple[float, float] | None:
    """Interval of rel_nfr = CtoI / (ACC_previous x (1 - ACC_candidate)), a function of the four
    flip proportions: the delta method on the log scale (multinomial covariance). Without a
    negative flip the lower bound is 0 and the upper bound the Wilson upper bound of CtoI over the
    estimated denominator. None when the denominator is 0.

    >>> [round(v, 3) for v in rel_nfr_interval(500, 20, 30, 50, 0.95)]  # estimate 0.33
    [0.231, 0.471]
    """
    n = ctoc + ctoi + itoc + itoi
    a, w = ctoc + ctoi, ctoi + itoi  # previous right; candidate wrong
    if n == 0 or a == 0 or w == 0:
        return None
    denominator = (a / n) * (w / n)
    if ctoi == 0:
        return 0.0, wilson(0, n, level)[1] / denominator
    p = [ctoc / n, ctoi / n, itoc / n, itoi / n]
    pa, pw = a / n, w / n
    # gradient of log g = log p_ci - log(p_cc + p_ci) - log(p_ci + p_ii)
    grad = [-1 / pa, 1 / p[1] - 1 / pa - 1 / pw, 0.0, -1 / pw]
    variance = sum(grad[i] * grad[j] * ((p[i] if i == j else 0.0) - p[i] * p[j]) for i in range(4) for j in range(4))
    half = z_value(level) * math.sqrt(max(0.0, variance) / n)
    estimate = (ctoi / n) / denominator
    return estimate * math.exp(-half), estimate * math.exp(half)


def samples_needed(rate: float, threshold: float, at_most: bool, level: float, limit: int = 10**9) -> int | None:
    """The smallest evaluation-set size at which a proportion measured at ``rate`` is shown to be
    at most (``at_most``) or at least ``threshold``: the Wilson bound on that side crosses it.
    None when no size can show it (the rate is on the wrong side of the threshold, or it needs
    more than ``limit`` samples).

    >>> samples_needed(0.01, 0.02, at_most=True, level=0.95)
    753
    >>> samples_needed(0.03, 0.02, at_most=True, level=0.95) is None
    True
    """
    if (at_most and rate >= threshold) or (not at_most and rate <= threshold):
        return None

    def shown(n: int) -> bool:
        z = z_value(level)
        centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
        half = z / (1 + z * z / n) * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n))
        return centre + half <= threshold if at_most else centre - half >= threshold

    if not shown(limit):
        return None
    low, high = 1, limit  # shown(high); the bound narrows as n grows
    while low < high:
        middle = (low + high) // 2
        if shown(middle):
            high = middle
        else:
            low = middle + 1
    return low
