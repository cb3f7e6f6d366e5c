"""Ensemble diversity metrics on oracle outputs (HDP, Appendix C), vectorised over teams.

The oracle output of member i on sample k is 1 if it predicts the sample correctly, else 0.
Metrics are computed on the *negative samples* of a team: those at least one member gets
wrong. Pairwise metrics (Cohen's kappa CK, Yule's Q statistic QS, binary disagreement BD)
are averaged over all pairs of the team (Formula 4); Fleiss' kappa FK, Kohavi-Wolpert
variance KW and generalized diversity GD are computed on the whole team.

Raw values are reported. For ranking, low score = high diversity: :func:`ranking_score`
uses 1 - value for BD, KW and GD, as the paper does. A value is None when undefined (no
negative samples, or a zero denominator), with one exception: a pair whose Yule's Q is 0/0
(N11 * N00 = N01 * N10 = 0) counts as Q = 0, as the 004 authors' code does (it divides by
the denominator plus machine epsilon). That case is the rule in HQ metrics, not an accident:
on the focal model's negative samples the focal model is always wrong (N11 = N10 = 0), so
every pair with it would otherwise be undefined and HQ-QS NaN for every team.

CK here is HDP's Formula 1 as printed ("CK, HDP Formula 1"); its denominator
differs from Cohen's kappa (:func:`cohen_kappa` is the textbook statistic, as
:func:`sklearn.metrics.cohen_kappa_score` computes it on right/wrong outcomes).

>>> import numpy as np
>>> oracle = np.array([[1, 1, 0, 0, 1], [1, 0, 1, 0, 1]], dtype=bool)   # 2 members, 5 samples
>>> scores = team_diversity(oracle)
>>> scores["bd"], scores["qs"]       # negatives: samples 1, 2, 3 -> N11=0, N10=1, N01=1, N00=1
(0.6666666666666666, -1.0)
"""

from __future__ import annotations

from itertools import combinations

import numpy as np
from numpy.typing import ArrayLike

METRICS = ("ck", "qs", "bd", "fk", "kw", "gd")
_HIGHER_IS_MORE_DIVERSE = ("bd", "kw", "gd")


def ranking_score(metric: str, value: float | None) -> float | None:
    """Score for ranking teams, low = diverse (1 - value for BD, KW, GD).

    >>> ranking_score("bd", 0.3), ranking_score("qs", 0.3), ranking_score("qs", None)
    (0.7, 0.3, None)
    """
    if value is None:
        return None
    return 1.0 - value if metric in _HIGHER_IS_MORE_DIVERSE else value


def _div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den != 0, num / np.where(den != 0, den, 1), np.nan)


def pairwise_values(n11: ArrayLike, n10: ArrayLike, n01: ArrayLike, n00: ArrayLike) -> dict[str, np.ndarray]:
    """CK (Formula 1), QS (Formula 2) and BD (Formula 3) from the 2x2 counts (any shape).

    N11: both right, N10: only the first right, N01: only the second, N00: both wrong. QS is 0
    where its denominator is 0 (see the module docstring); CK and BD are NaN there.

    >>> v = pairwise_values(5.0, 2.0, 1.0, 2.0)
    >>> round(float(v["ck"]), 4), round(float(v["qs"]), 4), float(v["bd"])
    (0.3556, 0.6667, 0.3)
    >>> float(pairwise_values(0.0, 0.0, 3.0, 2.0)["qs"])   # a focal model that is always wrong
    0.0
    """
    ck = _div(2 * (n11 * n00 - n01 * n10), (n11 + n10) * (n01 + n00) + (n11 + n01) * (n10 + n00))
    q_den = n11 * n00 + n01 * n10
    qs = np.where(q_den == 0, 0.0, _div(n11 * n00 - n01 * n10, q_den))
    bd = _div(n01 + n10, n11 + n10 + n01 + n00)
    return {"ck": ck, "qs": qs, "bd": bd}


def cohen_kappa(n11: ArrayLike, n10: ArrayLike, n01: ArrayLike, n00: ArrayLike) -> float | None:
    """Cohen's kappa of two members' right/wrong outcomes from their 2x2 counts (None if undefined).

    The textbook statistic (observed minus chance agreement, over one minus chance agreement),
    equal to :func:`sklearn.metrics.cohen_kappa_score` on the two oracle vectors; not 004's CK.

    >>> round(cohen_kappa(5, 2, 1, 2), 4)
    0.3478
    """
    n = n11 + n10 + n01 + n00
    if n == 0:
        return None
    observed = (n11 + n00) / n
    chance = ((n11 + n10) * (n11 + n01) + (n01 + n00) * (n10 + n00)) / n**2
    return None if chance == 1 else float((observed - chance) / (1 - chance))


def nonpairwise_values(correct_counts: np.ndarray, size: int, mask: np.ndarray) -> dict[str, np.ndarray]:
    """FK (Formula 5), KW (Formula 6), GD (Formula 7) per team.

    ``correct_counts`` is (teams, n): l(x_k), members of the team right on sample k; ``mask``
    (teams, n) the team's negative samples.

    >>> values = nonpairwise_values(np.array([[2, 1, 0, 1]]), size=2, mask=np.array([[False, True, True, True]]))
    >>> {k: round(float(v[0]), 4) for k, v in values.items()}
    {'fk': -0.5, 'kw': 0.1667, 'gd': 0.5}
    """
    s = size
    n = mask.sum(axis=1).astype(np.float64)
    right = correct_counts.astype(np.float64)  # l(x_k) in the paper
    spread = (right * (s - right) * mask).sum(axis=1)
    p_bar = _div((right * mask).sum(axis=1), n * s)
    fk = 1 - _div(spread / s, n * (s - 1) * p_bar * (1 - p_bar))
    kw = _div(spread, n * s**2)
    fails = (s - right) * mask  # members failing each sample
    p1 = _div((fails / s).sum(axis=1), n)
    p2 = _div((fails * (fails - 1) / (s * (s - 1))).sum(axis=1), n)
    gd = 1 - _div(p2, p1)
    return {"fk": fk, "kw": kw, "gd": gd}


def team_diversity(oracle: np.ndarray, negatives_of: np.ndarray | None = None) -> dict[str, float | None]:
    """All six metrics for one team (its members are the rows of ``oracle``).

    Negative samples are where a member errs, or ``negatives_of`` (a boolean mask, e.g. the
    errors of a focal model, as in HQ metrics).

    >>> oracle = np.array([[1, 1, 0, 0, 1], [1, 0, 1, 0, 1]], dtype=bool)  # two members: right or wrong
    >>> {k: None if v is None else round(v, 4) for k, v in team_diversity(oracle).items()}
    {'ck': -0.5, 'qs': -1.0, 'bd': 0.6667, 'fk': -0.5, 'kw': 0.1667, 'gd': 0.5}
    """
    teams = np.ones((1, oracle.shape[0]), dtype=bool)
    values = teams_diversity(oracle, teams, negatives_of)
    return {k: (None if np.isnan(v[0]) else float(v[0])) for k, v in values.items()}


def teams_diversity(
    oracle: np.ndarray, teams: np.ndarray, negatives_of: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """The six metrics for many teams of one size at once: ``teams`` is (T, M) membership.

    NaN where undefined. Pairwise metrics are the mean over the team's pairs, each pair's
    counts taken over the team's negative samples.

    >>> oracle = np.array([[1, 1, 0, 0], [1, 0, 1, 0], [0, 1, 1, 1]], dtype=bool)
    >>> teams = np.array([[1, 1, 0], [0, 1, 1]], dtype=bool)  # {0, 1} and {1, 2}
    >>> teams_diversity(oracle, teams)["bd"].round(4).tolist()
    [0.6667, 1.0]
    """
    oracle = np.asarray(oracle, dtype=bool)
    teams = np.asarray(teams, dtype=bool)
    size = int(teams[0].sum())
    if size < 2 or (teams.sum(axis=1) != size).any():
        raise ValueError("every team must have the same size, at least 2")
    correct = teams.astype(np.int64) @ oracle.astype(np.int64)  # (T, n)
    mask = correct < size if negatives_of is None else np.broadcast_to(negatives_of, correct.shape)
    pairs = list(combinations(range(size), 2))
    members = np.array([np.flatnonzero(t) for t in teams])  # (T, size)
    sums = {k: np.zeros(len(teams)) for k in ("ck", "qs", "bd")}
    undefined = {k: np.zeros(len(teams), dtype=bool) for k in sums}
    o, w = oracle.astype(np.float64), (~oracle).astype(np.float64)
    for a, b in pairs:
        i, j = members[:, a], members[:, b]
        m = mask.astype(np.float64)
        n11 = (o[i] * o[j] * m).sum(1)
        n10 = (o[i] * w[j] * m).sum(1)
        n01 = (w[i] * o[j] * m).sum(1)
        n00 = (w[i] * w[j] * m).sum(1)
        for key, value in pairwise_values(n11, n10, n01, n00).items():
            undefined[key] |= np.isnan(value)
            sums[key] += np.nan_to_num(value)
    out = {k: np.where(undefined[k], np.nan, sums[k] / len(pairs)) for k in sums}
    out.update(nonpairwise_values(correct, size, mask))
    no_negatives = ~mask.any(axis=1)  # nothing to measure diversity on: every metric undefined
    return {k: np.where(no_negatives, np.nan, out[k]) for k in METRICS}
