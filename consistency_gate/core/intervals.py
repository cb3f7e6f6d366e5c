"""Confidence intervals and the paired test behind a verdict, from counts alone.

Every function takes counts (or sums) that :class:`~consistency_gate.core.counts.ConsistencyCounts`
merges, so one pass, a stream of chunks and a Spark job give the same intervals.

- Proportions (ACC, CON, flips, CCON-k, CACC-k, BTC, BEC): Wilson score intervals
  (:func:`wilson`), or exact Clopper-Pearson (:func:`clopper_pearson`).
- A paired difference of proportions (candidate ACC minus previous ACC = ItoC - CtoI):
  Newcombe's method 10 (:func:`newcombe_paired`), and the exact McNemar test on the
  discordant pairs (:func:`mcnemar_exact`).
- Means of per-sample values (Pearson, cosine): a normal interval from the sum and the sum of
  squares (:func:`mean_interval`).
- Com = ACC_candidate - CtoI: MOVER on the two Wilson intervals (:func:`com_interval`).
- The relative negative flip rate, written as (1 - BEC) / ACC_previous: MOVER-R (Donner and Zou)
  on the Wilson intervals of its two proportions (:func:`rel_nfr_interval`).

A rule decided on a bound compares a *one-sided* bound at the configured confidence: each end of the
two-sided interval at level ``2 * confidence - 1`` (:func:`one_sided`), exact (Clopper-Pearson) for
proportions, so that a model exactly at the threshold passes at most ``1 - confidence`` of the time.
:func:`pass_probability` gives that chance exactly for any set size and rate, and
:func:`samples_needed` the set size at which a rule passes a model at an expected rate with a given
power (``consistency-gate plan``).

>>> [round(v, 4) for v in wilson(18, 600, 0.95)]
[0.0191, 0.0469]
>>> round(mcnemar_exact(9, 2), 4)
0.0654
"""

from __future__ import annotations

import functools
import math

import numpy as np

METHODS = ("wilson", "clopper-pearson")


@functools.cache
def z_value(level: float) -> float:
    """The two-sided normal quantile of a confidence level (1.96 for 0.95).

    >>> round(z_value(0.95), 3)
    1.96
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"a confidence level is in (0, 1), got {level}")
    from scipy.special import ndtri  # scipy.stats.norm.ppf, to the last bit

    return float(ndtri(0.5 + level / 2))


def wilson(k: int, n: int, level: float) -> tuple[float, float] | None:
    """Wilson score interval of the proportion ``k / n``; None when ``n`` is 0. Its ends are exactly 0 at
    ``k = 0`` and 1 at ``k = n`` (in floating point ``centre - half`` left 1.7e-18 there).

    >>> wilson(0, 10, 0.95)[0], round(wilson(0, 10, 0.95)[1], 4)
    (0.0, 0.2775)
    >>> wilson(0, 150, 0.95)[0], wilson(150, 150, 0.95)[1]
    (0.0, 1.0)
    """
    if n <= 0:
        return None
    z = z_value(level)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


def clopper_pearson(k: int, n: int, level: float) -> tuple[float, float] | None:
    """Exact (Clopper-Pearson) interval of the proportion ``k / n``; None when ``n`` is 0.

    >>> [round(v, 4) for v in clopper_pearson(3, 10, 0.95)]
    [0.0667, 0.6525]
    """
    if n <= 0:
        return None
    alpha = 1 - level
    low = 0.0 if k == 0 else _beta_quantile(alpha / 2, k, n - k + 1)
    high = 1.0 if k == n else _beta_quantile(1 - alpha / 2, k + 1, n - k)
    return low, high


def jeffreys(k: int, n: int, level: float) -> tuple[float, float] | None:
    """Jeffreys interval of ``k / n`` (equal tails of the Beta(k + 1/2, n - k + 1/2) posterior, from 0
    when ``k`` is 0 and to 1 when it is ``n``; Brown, Cai and DasGupta 2001): close to nominal for
    the few counts of rel_nfr's rare flips, where Wilson's lower bound is too high. None when ``n`` is 0.

    >>> [round(v, 4) for v in jeffreys(1, 1, 0.95)]
    [0.1467, 1.0]
    """
    if n <= 0:
        return None
    alpha = 1 - level
    low = 0.0 if k == 0 else _beta_quantile(alpha / 2, k + 0.5, n - k + 0.5)
    high = 1.0 if k == n else _beta_quantile(1 - alpha / 2, k + 0.5, n - k + 0.5)
    return low, high


def _beta_quantile(q: float, a: float, b: float) -> float:
    """The ``q`` quantile of Beta(a, b): ``scipy.stats.beta.ppf`` to the last bit, through
    scipy.special (``compare`` then does not import scipy.stats: 0.4 s of a fresh process)."""
    from scipy.special import betaincinv

    return float(betaincinv(a, b, q))


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
    if 2 * min(b, c) + 1 >= b + c:  # the tails X <= min(b, c) and X >= max(b, c) cover every outcome
        return 1.0
    # P(X <= min(b, c)) for X ~ Bin(b + c, 1/2), doubled (the two tails are alike): scipy.stats'
    # binomtest(b, b + c).pvalue to the last bit, without importing scipy.stats; where it underflows
    # (below 2.2e-308) this is 0, binomtest sometimes 5e-324
    return min(1.0, 2 * float(binomial_cdf(min(b, c), b + c, 0.5)))


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


def com_interval(ctoc: int, ctoi: int, itoc: int, itoi: int, level: float) -> tuple[float, float] | None:
    """Interval of Com = CtoC + ItoC - CtoI = ACC_candidate - CtoI, a difference of two proportions of
    the same samples (disjoint events, so negatively correlated): MOVER (Zou and Donner 2008) on their
    Wilson intervals. A normal interval of the mean of the per-sample values (+1, 0, -1) collapses to a
    point when nearly every sample is CtoC (64% coverage at accuracy 0.99 on 100 samples). None when
    there are no samples.

    >>> [round(v, 3) for v in com_interval(100, 0, 0, 0, 0.95)]  # every sample CtoC: still an interval
    [0.948, 1.0]
    >>> [round(v, 3) for v in com_interval(500, 20, 30, 50, 0.95)]  # estimate 0.85
    [0.81, 0.881]
    """
    n = ctoc + ctoi + itoc + itoi
    if n == 0:
        return None
    p1, p2 = (ctoc + itoc) / n, ctoi / n
    (l1, u1), (l2, u2) = wilson(ctoc + itoc, n, level), wilson(ctoi, n, level)
    spread = p1 * (1 - p1) * p2 * (1 - p2)
    corr = -p1 * p2 / math.sqrt(spread) if spread > 0 else 0.0
    below = math.sqrt(max(0.0, (p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * corr * (p1 - l1) * (u2 - p2)))
    above = math.sqrt(max(0.0, (u1 - p1) ** 2 + (p2 - l2) ** 2 - 2 * corr * (u1 - p1) * (p2 - l2)))
    return max(-1.0, p1 - p2 - below), min(1.0, p1 - p2 + above)


def rel_nfr_interval(ctoc: int, ctoi: int, itoc: int, itoi: int, level: float) -> tuple[float, float] | None:
    """Interval of rel_nfr = CtoI / (ACC_previous x (1 - ACC_candidate)), None when the denominator is 0.

    rel_nfr is the ratio q / a of two proportions: q = CtoI / (CtoI + ItoI), the share of the
    candidate's errors the previous generation got right (1 - BEC), and a = ACC_previous. Its
    interval is MOVER-R (Donner and Zou 2012) on the Jeffreys interval of q (few counts when the
    candidate is accurate) and the Wilson interval of a: it stays asymmetric and near its level when
    negative flips are rare, where the delta method on the log scale covered 85% (see
    ``benchmarks/interval_coverage.py``). q and a rise together with CtoI, so treating them as independent
    errs on the wide side.

    >>> [round(v, 3) for v in rel_nfr_interval(500, 20, 30, 50, 0.95)]  # estimate 0.33
    [0.219, 0.461]
    >>> [round(v, 3) for v in rel_nfr_interval(95, 0, 2, 3, 0.95)]  # no negative flip: from 0
    [0.0, 0.565]
    """
    n = ctoc + ctoi + itoc + itoi
    a, w = ctoc + ctoi, ctoi + itoi  # previous right; candidate wrong
    if n == 0 or a == 0 or w == 0:
        return None
    q, p = ctoi / w, a / n
    (q_low, q_high), (p_low, p_high) = jeffreys(ctoi, w, level), wilson(a, n, level)
    qp = q * p
    low_scale = p_high * (2 * p - p_high)
    low = 0.0
    if q > 0 and low_scale > 0:
        low = (qp - math.sqrt(max(0.0, qp * qp - q_low * p_high * (2 * q - q_low) * (2 * p - p_high)))) / low_scale
    high_scale = p_low * (2 * p - p_low)
    if high_scale <= 0:
        return max(0.0, low), math.inf
    high = (qp + math.sqrt(max(0.0, qp * qp - q_high * p_low * (2 * q - q_high) * (2 * p - p_low)))) / high_scale
    return max(0.0, low), high


def one_sided(level: float) -> float:
    """The two-sided level whose two ends are each a one-sided bound at ``level`` (0.95 -> 0.90).

    >>> round(one_sided(0.95), 12)
    0.9
    """
    if not 0.5 < level < 1.0:
        raise ValueError(f"a one-sided confidence level is in (0.5, 1), got {level}")
    return 2 * level - 1


def binomial_cdf(k: int | np.ndarray, n: int | np.ndarray, p: float | np.ndarray) -> np.ndarray:
    """P(X <= k) for X ~ Bin(n, p), the regularized incomplete beta through scipy.special (a gate
    then does not import scipy.stats: 0.4 s of a fresh process): the upper tail I(p; k + 1, n - k)
    complemented for p < 0.5, I(1 - p; n - k, k + 1) otherwise (1 - p is then exact). It agrees
    with ``scipy.stats.binom.cdf`` to the last bit for most arguments and within 1e-9 relative at
    millions of samples, where neither is exact (a property test compares them).

    >>> round(float(binomial_cdf(6, 600, 0.02)), 6), float(binomial_cdf(-1, 5, 0.5)), float(binomial_cdf(5, 5, 0.5))
    (0.044295, 0.0, 1.0)
    """
    from scipy.special import betainc, betaincc

    k, n, p = np.broadcast_arrays(np.floor(np.asarray(k, dtype=float)), np.asarray(n, dtype=float), p)
    out = np.where(k >= n, 1.0, 0.0)
    small = (k >= 0) & (k < n) & (p < 0.5)
    large = (k >= 0) & (k < n) & (p >= 0.5)
    out[small] = betaincc(k[small] + 1, n[small] - k[small], p[small])
    out[large] = betainc(n[large] - k[large], k[large] + 1, 1 - p[large])
    return out


def binomial_quantile(q: float, n: int | np.ndarray, p: float) -> np.ndarray:
    """The smallest k with P(Bin(n, p) <= k) >= q, for q in (0, 1): a normal guess with its skew
    term, moved a count at a time while :func:`binomial_cdf` says it is not that k (a step or two).

    >>> binomial_quantile(0.05, 600, 0.02).tolist(), binomial_quantile(0.95, np.array([10, 600]), 0.02).tolist()
    (7, [1, 18])
    """
    from scipy.special import ndtri

    n = np.asarray(n, dtype=np.int64)
    z, sd = float(ndtri(q)), np.sqrt(n * p * (1 - p))
    guess = np.floor(n * p + z * sd + (z * z - 1) * (1 - 2 * p) / 6)
    k = np.atleast_1d(np.clip(guess, 0, n).astype(np.int64))
    total = np.broadcast_to(np.atleast_1d(n), k.shape)
    while (low := np.flatnonzero(binomial_cdf(k, total, p) < q)).size:  # cdf(n) is 1: this ends
        k[low] += 1
    while (high := np.flatnonzero((k > 0) & (binomial_cdf(k - 1, total, p) >= q))).size:
        k[high] -= 1
    return k.reshape(n.shape)


def passing_count(n: int | np.ndarray, threshold: float, decide: str, level: float) -> np.ndarray:
    """For a rule ``share <= threshold`` on ``n`` samples (an int or an array of them), the largest
    count that passes it (-1 when none does), as the rule decides: ``estimate`` (count / n <=
    threshold), ``upper`` (the one-sided exact upper bound at ``level`` <= threshold) or ``lower``
    (the one-sided exact lower bound <= threshold: benefit of the doubt). Exact bounds are compared
    through their duality with binomial tails: the upper bound of k is <= t exactly when
    P(Bin(n, t) <= k) <= 1 - level.

    >>> [int(passing_count(600, 0.02, decide, 0.95)) for decide in ("estimate", "upper", "lower")]
    [12, 6, 18]
    """
    n = np.asarray(n, dtype=np.int64)
    alpha = 1 - level
    threshold += 1e-12  # the tolerance of Rule.holds
    if threshold >= 1:  # every share is at most 1
        return n
    if decide == "estimate":
        count = np.floor(n * threshold + 1e-9).astype(np.int64)
        return np.minimum(count, n)
    if decide == "upper":  # the largest k with P(X <= k; t) <= alpha
        k = binomial_quantile(alpha, n, threshold)  # smallest k with P(X <= k) >= alpha
        return np.where(binomial_cdf(k, n, threshold) <= alpha, k, k - 1)
    if decide == "lower":  # the largest k with P(X >= k; t) >= alpha, i.e. P(X <= k - 1) <= 1 - alpha
        k = binomial_quantile(1 - alpha, n, threshold)  # smallest k with P(X <= k) >= 1 - alpha
        return np.minimum(np.where(binomial_cdf(k, n, threshold) <= 1 - alpha, k + 1, k), n)
    raise ValueError(f"decide must be estimate, upper or lower, got {decide!r}")


def pass_probability(
    n: int | np.ndarray, rate: float, threshold: float, at_most: bool, decide: str, level: float
) -> np.ndarray:
    """The exact probability that a rule on a share of ``n`` samples passes when the true share is
    ``rate``: ``share <= threshold`` (``at_most``) or ``share >= threshold``, decided as ``decide``
    says at one-sided ``level``. At ``rate == threshold`` it is the rule's false-pass rate: at most
    ``1 - level`` for a strict bound (``upper`` on a max rule, ``lower`` on a min rule).

    >>> round(float(pass_probability(600, 0.02, 0.02, True, "upper", 0.95)), 4)  # false pass, <= 5%
    0.0443
    >>> round(float(pass_probability(600, 0.02, 0.02, True, "estimate", 0.95)), 2)  # a coin toss
    0.58
    """
    if not at_most:  # share >= t is (1 - share) <= 1 - t, with the bounds swapped
        rate, threshold = 1 - rate, 1 - threshold
        decide = {"upper": "lower", "lower": "upper"}.get(decide, decide)
    return binomial_cdf(passing_count(n, threshold, decide, level), n, rate)


COARSE_POINTS = 256  # samples_needed: sizes read first in a wide bracket


def samples_needed(
    rate: float,
    threshold: float,
    at_most: bool,
    level: float,
    decide: str = "upper",
    power: float = 0.8,
    limit: int = 10**7,
    coarse: bool = False,
) -> int | None:
    """The smallest evaluation-set size at which a rule on a share of the samples gives the right
    answer with probability ``power`` for a model whose true share is ``rate``: it passes when the
    rate meets the threshold, fails when it does not (the exact binomial power of the rule as it
    decides, see :func:`pass_probability`). None when no size up to ``limit`` does (a rate exactly
    at the threshold, or a strict rule's ``level`` above ``power`` there).

    The binomial is discrete, so the power is a sawtooth in the size: a set a few samples larger can
    be a point or two below ``power``. With ``coarse`` (a gate's advice, in words: "about N samples"), a
    doubling bracket of more than ``COARSE_POINTS`` sizes is first read at that many sizes, so a tooth
    that reaches ``power`` between two of them, before the first that does, is passed over: the size
    is then a little larger than the smallest, never smaller, in a fraction of the time (16,000 sizes
    cost seconds of incomplete-beta calls).

    >>> samples_needed(0.01, 0.02, at_most=True, level=0.95)
    969
    >>> samples_needed(0.03, 0.02, at_most=True, level=0.95) is None  # an upper bound never passes it
    True
    >>> samples_needed(0.03, 0.02, at_most=True, level=0.95, decide="lower")  # caught with 80% power
    1469
    """
    if not 0.0 < power < 1.0:
        raise ValueError(f"power is in (0, 1), got {power}")
    meets = rate < threshold if at_most else rate > threshold
    strict = decide == ("upper" if at_most else "lower")
    if rate == threshold or (not meets and strict):
        return None

    def first_right(sizes: np.ndarray) -> int | None:
        passes = pass_probability(sizes, rate, threshold, at_most, decide, level)
        found = np.flatnonzero((passes if meets else 1 - passes) >= power)
        return int(sizes[found[0]]) if found.size else None

    start = 1
    while start <= limit:
        stop = min(2 * start, limit + 1)
        wide = coarse and stop - start > COARSE_POINTS  # read at COARSE_POINTS sizes, then whole before the hit
        sampled = np.unique(np.linspace(start, stop - 1, COARSE_POINTS).astype(np.int64))
        hit = first_right(sampled if wide else np.arange(start, stop))
        if hit is not None and not wide:
            return hit
        if hit is not None:
            before = sampled[sampled < hit]
            return first_right(np.arange(int(before[-1]) + 1 if before.size else start, hit + 1))
        start *= 2
    return None
