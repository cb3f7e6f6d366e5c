"""Combining ensemble members' class probabilities (Wang et al. 2023, Sec. 4): MV, WMV, AVG, WAVG.

Every rule returns an (n, p) matrix of combined class scores whose rows sum to 1, so the
ensemble's prediction is its argmax. Tie rule: when votes (or averaged scores) tie, the
lowest class index wins, the same rule as everywhere in consistency-gate.

>>> import numpy as np
>>> probs = np.array([[[0.6, 0.4]], [[0.3, 0.7]], [[0.45, 0.55]]])   # 3 members, 1 sample
>>> combine(probs, "mv").tolist()
[[0.3333333333333333, 0.6666666666666666]]
>>> combine(probs, "wmv", weights=[0.9, 0.2, 0.2]).round(4).tolist()
[[0.6923, 0.3077]]
>>> combine(probs, "avg").round(4).tolist()
[[0.45, 0.55]]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

RULES = ("mv", "wmv", "avg", "wavg")


def combine(member_probs: np.ndarray, rule: str = "avg", weights: Sequence[float] | None = None) -> np.ndarray:
    """Combine (m, n, p) member probabilities into (n, p) ensemble scores.

    ``weights`` (one per member, e.g. validation accuracy) are used by WMV and WAVG; MV and
    AVG weigh members equally.

    >>> members = np.array([[[0.9, 0.1]], [[0.4, 0.6]], [[0.3, 0.7]]])
    >>> combine(members, "avg").round(3).tolist(), combine(members, "mv").round(3).tolist()  # mv: vote shares
    ([[0.533, 0.467]], [[0.333, 0.667]])
    """
    probs = np.asarray(member_probs, dtype=np.float64)
    if probs.ndim != 3:
        raise ValueError(f"member probabilities must have shape (members, samples, classes), got {probs.shape}")
    m, _, p = probs.shape
    if rule not in RULES:
        raise ValueError(f"unknown combination rule '{rule}'; use one of {', '.join(RULES)}")
    if rule in ("wmv", "wavg"):
        if weights is None:
            raise ValueError(f"rule '{rule}' needs one weight per member")
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (m,) or (w < 0).any() or w.sum() <= 0:
            raise ValueError(f"weights must be {m} non-negative numbers with a positive sum, got {list(w)}")
    else:
        w = np.ones(m)
    w = w / w.sum()
    if rule in ("mv", "wmv"):
        votes = np.eye(p)[probs.argmax(axis=2)]  # (m, n, p) one-hot, argmax ties -> lowest index
        return np.tensordot(w, votes, axes=1)
    return np.tensordot(w, probs, axes=1)
