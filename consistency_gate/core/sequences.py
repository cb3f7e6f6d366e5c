"""Confidence sequences: bounds on a share of the samples that hold at every look at a growing stream at once.

A gate that checks live traffic again after every batch of labels, with the fixed-sample bounds of
:mod:`consistency_gate.core.intervals`, passes a model exactly at a rule's threshold far more often
than ``1 - confidence``: each look is another chance for the bound to dip under it (about 20% over
50 looks at 95%). A confidence sequence holds at every look together: a model exactly at the threshold
passes at *any* of the checks with probability at most ``1 - confidence``, however often it is checked
and whenever the checks stop (anytime-valid; "Howard et al. 2021" in docs/references.md).

The bound here is the one-sided conjugate mixture of Robbins: for a share ``p0``, the likelihood of the
``k`` hits in ``n`` samples averaged over a uniform prior on ``[0, p0]``, divided by their likelihood at
``p0``, is a nonnegative supermartingale under every true share at or above ``p0``, so by Ville's
inequality it reaches ``1 / alpha`` with probability at most ``alpha``, ever. The upper bound is the
largest ``p0`` it has not rejected. It reads counts alone, like every interval of the product, so the
counts of a stream, of its chunks merged, or of a Spark job give the same bound.

>>> round(float(upper(18, 600, 0.95)), 4), round(float(lower(18, 600, 0.95)), 4)
(0.0545, 0.0108)
"""

from __future__ import annotations

import math

import numpy as np

BISECTIONS = 60  # halvings of [k/n, 1]: the bound to about 1e-18


def log_mixture(k: np.ndarray, n: np.ndarray, p0: np.ndarray) -> np.ndarray:
    """The log of the one-sided mixture statistic against a share ``p0`` after ``k`` hits in ``n``
    samples: how much more likely the counts are under a share below ``p0`` (uniform on ``[0, p0]``)
    than at ``p0``. Its exponential is the wealth of a bet that the share is below ``p0``.

    Parameters
    ----------
    k, n : array-like
        Hits and samples so far (``0 <= k <= n``).
    p0 : array-like
        The share tested, in ``(0, 1)``.

    Returns
    -------
    numpy.ndarray
        ``log M``: the bound rejects ``p0`` (it is too high) once this reaches ``log(1 / alpha)``.

    Example
    -------
    >>> round(float(log_mixture(0, 300, 0.02)), 3)  # no hit in 300: p0 = 0.02 is doubtful
    4.263
    """
    from scipy.special import betainc, betaln

    k, n, p0 = (np.asarray(v, dtype=float) for v in (k, n, p0))
    mass = betaln(k + 1, n - k + 1) + np.log(betainc(k + 1, n - k + 1, p0))
    return mass - (k + 1) * np.log(p0) - (n - k) * np.log1p(-p0)


def _checked(k: np.ndarray, n: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    if not 0.5 < level < 1.0:
        raise ValueError(f"a one-sided confidence level is in (0.5, 1), got {level}")
    k, n = np.broadcast_arrays(np.asarray(k, dtype=float), np.asarray(n, dtype=float))
    if np.any(n < 0) or np.any(k < 0) or np.any(k > n):
        raise ValueError("counts must satisfy 0 <= k <= n")
    return k, n


def upper(k: int | np.ndarray, n: int | np.ndarray, level: float) -> np.ndarray:
    """The anytime-valid one-sided upper bound at ``level`` of a share after ``k`` hits in ``n`` samples
    (1 with no sample): the largest share the mixture has not rejected, by bisection on ``[k / n, 1]``,
    where the statistic grows with ``p0``.

    Parameters
    ----------
    k, n : int or array-like
        Hits and samples so far.
    level : float
        One-sided confidence, in (0.5, 1): the bound is under the true share at some look with
        probability at most ``1 - level``.

    Returns
    -------
    numpy.ndarray
        The bound, of the broadcast shape of ``k`` and ``n``.

    Example
    -------
    >>> [round(float(u), 4) for u in upper([0, 5, 200], [100, 500, 10_000], 0.95)]
    [0.044, 0.0279, 0.0247]
    """
    k, n = _checked(k, n, level)
    full = (n == 0) | (k >= n)
    kk, nn = np.where(full, 0.0, k), np.where(n == 0, 1.0, n)
    low, high = kk / nn, np.ones_like(kk)
    threshold = math.log(1 / (1 - level))
    for _ in range(BISECTIONS):
        mid = (low + high) / 2
        rejected = log_mixture(kk, nn, mid) >= threshold
        high, low = np.where(rejected, mid, high), np.where(rejected, low, mid)
    return np.where(full, 1.0, high)


def lower(k: int | np.ndarray, n: int | np.ndarray, level: float) -> np.ndarray:
    """The anytime-valid one-sided lower bound: one minus the upper bound of the misses (0 with no sample).

    >>> float(lower(0, 50, 0.95)), round(float(lower(600, 600, 0.95)), 4)
    (0.0, 0.9925)
    """
    k, n = _checked(k, n, level)
    return np.where(n == 0, 0.0, 1.0 - upper(n - k, n, level))


def paired_lower(gained: int, lost: int, n: int, level: float) -> float:
    """An anytime-valid lower bound of a paired difference of two shares, ``(gained - lost) / n`` (the
    candidate's accuracy minus the previous one's is ItoC - CtoI): the lower bound of one share minus the
    upper bound of the other, each at half the error (a union bound, valid at every look together).

    >>> round(paired_lower(30, 10, 1000, 0.95), 4)
    -0.0098
    """
    half = 1 - (1 - level) / 2
    return float(lower(gained, n, half) - upper(lost, n, half))


def samples_needed(rate: float, threshold: float, at_most: bool, level: float, limit: int = 10**8) -> int | None:
    """The fewest samples at which a stream whose share runs at ``rate`` has its bound cross ``threshold``:
    the upper bound under it for ``share <= threshold`` (``at_most``), the lower bound over it otherwise;
    the same crossing decides the other way for a share on the far side. None when the rate is the
    threshold, or no size up to ``limit`` crosses. The expected count ``rate * n`` is used, so this is
    a typical size, not a guarantee: a stream crosses sooner or later about as often.

    >>> samples_needed(0.01, 0.02, at_most=True, level=0.95), samples_needed(0.02, 0.02, True, 0.95)
    (1301, None)
    """
    if rate == threshold:
        return None
    if not at_most:
        rate, threshold = 1 - rate, 1 - threshold

    def crossed(n: int) -> bool:
        k = min(round(rate * n), n)
        if rate < threshold:
            return bool(upper(k, n, level) <= threshold)
        return bool(lower(k, n, level) > threshold)

    high = 1
    while not crossed(high):
        if high >= limit:
            return None
        high = min(2 * high, limit)
    low = high // 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if crossed(mid) else (mid, high)
    return high
