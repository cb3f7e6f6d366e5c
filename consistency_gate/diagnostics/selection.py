"""Team selection over a pool of members (HDP): Q metrics, Q-pruning, HQ metrics with
focal models (Algorithm 2), the alpha filter (Algorithm 3) and the K-means filter.

All candidate teams of size 2..M are scored at once per size (no Python loop over samples).
:func:`select_teams` reports, per method, as HDP's Tables 2-3: the number of teams
considered, the number selected, their ensemble-accuracy range, and how many beat the best
single member.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np

from consistency_gate.diagnostics.diversity import METRICS, ranking_score, teams_diversity


@dataclass
class Pool:
    """Members' probabilities (M, n, p), true class ids (n,), and derived oracle outputs."""

    probs: np.ndarray
    y: np.ndarray

    def __post_init__(self) -> None:
        self.probs = np.asarray(self.probs, dtype=np.float64)
        self.oracle = self.probs.argmax(axis=2) == self.y[None, :]
        self.accuracy = self.oracle.mean(axis=1)

    @property
    def size(self) -> int:
        """The number of members in the pool."""
        return self.probs.shape[0]


def teams_of_size(m: int, size: int) -> np.ndarray:
    """(T, m) membership of every team of ``size`` members, in lexicographic order.

    >>> teams_of_size(3, 2).astype(int).tolist()
    [[1, 1, 0], [1, 0, 1], [0, 1, 1]]
    """
    combos = list(combinations(range(m), size))
    teams = np.zeros((len(combos), m), dtype=bool)
    for t, combo in enumerate(combos):
        teams[t, list(combo)] = True
    return teams


def team_accuracy(pool: Pool, teams: np.ndarray, chunk: int = 64) -> np.ndarray:
    """Accuracy of each team's averaged (AVG) ensemble.

    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 3, 60)
    >>> probs = rng.random((4, 60, 3)) + 0.8 * np.eye(3)[y][None] * rng.random((4, 1, 1))
    >>> pool = Pool(probs, y)
    >>> team_accuracy(pool, teams_of_size(4, 3)).round(3).tolist()
    [0.95, 0.967, 0.967, 1.0]
    """
    out = np.empty(len(teams))
    weights = teams / teams.sum(axis=1, keepdims=True)
    for start in range(0, len(teams), chunk):
        combined = np.tensordot(weights[start : start + chunk], pool.probs, axes=1)  # (c, n, p)
        out[start : start + chunk] = (combined.argmax(axis=2) == pool.y[None]).mean(axis=1)
    return out


def q_scores(pool: Pool, teams: np.ndarray, metric: str) -> np.ndarray:
    """Ranking scores (low = diverse) of the Q metric on each team's own negative samples.

    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 3, 60)
    >>> probs = rng.random((4, 60, 3)) + 0.8 * np.eye(3)[y][None] * rng.random((4, 1, 1))
    >>> pool = Pool(probs, y)
    >>> q_scores(pool, teams_of_size(4, 2), "ck").round(3).tolist()
    [-0.921, -0.646, -0.841, -0.814, -0.814, -0.75]
    """
    raw = teams_diversity(pool.oracle, teams)[metric]
    return np.array([np.nan if np.isnan(v) else ranking_score(metric, v) for v in raw])


def hq_scores(pool: Pool, teams: np.ndarray, metric: str) -> np.ndarray:
    """HQ scores (Algorithm 2) of teams of one size: each member as focal model, diversity on the
    focal model's negative samples, min-max scaled per focal model, then averaged with weights
    from the members' accuracy rank within the team (the most accurate weighs most).

    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 3, 60)
    >>> probs = rng.random((4, 60, 3)) + 0.8 * np.eye(3)[y][None] * rng.random((4, 1, 1))
    >>> pool = Pool(probs, y)
    >>> hq_scores(pool, teams_of_size(4, 3), "ck").round(3).tolist()
    [1.0, 0.0, 1.0, 0.0]
    """
    m = pool.size
    scaled = np.full((len(teams), m), np.nan)
    for focal in range(m):
        rows = np.flatnonzero(teams[:, focal])
        raw = teams_diversity(pool.oracle, teams[rows], negatives_of=~pool.oracle[focal])[metric]
        score = np.array([np.nan if np.isnan(v) else ranking_score(metric, v) for v in raw])
        finite = score[np.isfinite(score)]
        lo, hi = (finite.min(), finite.max()) if finite.size else (0.0, 0.0)
        scaled[rows, focal] = score * 0.0 if hi == lo else (score - lo) / (hi - lo)  # NaN stays NaN
    hq = np.empty(len(teams))
    for t, team in enumerate(teams):
        members = np.flatnonzero(team)
        ranks = np.argsort(np.argsort(pool.accuracy[members], kind="stable"), kind="stable") + 1  # 1 = least accurate
        values = scaled[t, members]
        ok = ~np.isnan(values)
        hq[t] = np.average(values[ok], weights=ranks[ok]) if ok.any() else np.nan
    return hq


def alpha_filter(
    scores_by_size: dict[int, np.ndarray], teams_by_size: dict[int, np.ndarray], fraction: float = 0.1
) -> tuple[dict[int, np.ndarray], int]:
    """Algorithm 3: per size, skip teams holding a pruned group, prune the ``fraction`` least diverse
    (highest score) of the rest, keep the others. Returns kept masks per size and the number of
    teams whose diversity was computed.

    >>> teams = {2: teams_of_size(3, 2), 3: teams_of_size(3, 3)}
    >>> kept, considered = alpha_filter({2: np.array([0.1, 0.9, 0.5]), 3: np.array([0.3])}, teams, fraction=0.34)
    >>> {size: mask.tolist() for size, mask in kept.items()}, considered
    ({2: [True, False, True], 3: [False]}, 3)
    """
    pruned: list[np.ndarray] = []
    kept: dict[int, np.ndarray] = {}
    considered = 0
    for size in sorted(teams_by_size):
        teams, scores = teams_by_size[size], scores_by_size[size]
        alive = np.ones(len(teams), dtype=bool)
        for group in pruned:
            alive &= ~(teams[:, group].all(axis=1))
        considered += int(alive.sum())
        candidates = np.flatnonzero(alive)
        n_prune = int(fraction * len(candidates))
        order = candidates[np.argsort(-np.nan_to_num(scores[candidates], nan=np.inf), kind="stable")]
        drop = order[:n_prune]
        pruned += [np.flatnonzero(teams[i]) for i in drop]
        mask = alive.copy()
        mask[drop] = False
        kept[size] = mask
    return kept, considered


def kmeans_filter(scores: np.ndarray, accuracy: np.ndarray, iterations: int = 100, scale: bool = True) -> np.ndarray:
    """K-means with K=2 on (score, accuracy), initial centroids (low score, high accuracy) and
    (high score, low accuracy); keep teams scoring below the smallest score of the low-accuracy
    cluster. With ``scale`` (the default) both features are min-max scaled first so neither axis
    dominates (scikit-learn's KMeans); ``scale=False`` clusters the raw values, as 004's code does
    (HQ scores lie in [0, 1] already, accuracies in a much narrower band, so the score decides).

    >>> kmeans_filter(np.array([0.1, 0.2, 0.8, 0.9]), np.array([0.9, 0.88, 0.7, 0.72])).tolist()
    [True, True, False, False]
    """
    from sklearn.cluster import KMeans

    ok = np.isfinite(scores)
    keep = np.zeros(len(scores), dtype=bool)
    pts = np.column_stack([scores[ok], accuracy[ok]])
    if len(np.unique(pts, axis=0)) < 2:  # fewer than two distinct teams: nothing to split
        keep[ok] = True
        return keep
    if scale:
        span = pts.max(axis=0) - pts.min(axis=0)
        span[span == 0] = 1
        pts = (pts - pts.min(axis=0)) / span
    centroids = np.array([[pts[:, 0].min(), pts[:, 1].max()], [pts[:, 0].max(), pts[:, 1].min()]])
    label = KMeans(n_clusters=2, init=centroids, n_init=1, max_iter=iterations).fit(pts).labels_
    low_acc = label == 1
    threshold = scores[ok][low_acc].min() if low_acc.any() else np.inf
    keep[np.flatnonzero(ok)] = scores[ok] < threshold if low_acc.any() else True
    return keep


@dataclass
class Selections:
    """Every team of size 2..max (``teams``: membership rows, by size), their accuracy and HQ score
    on the pool they were judged on, and per method the mask of the teams it selects (applicable to
    the same teams on other data, such as a held-out split); ``considered``: the teams the alpha
    filter scored."""

    teams: np.ndarray
    accuracy: np.ndarray
    hq: np.ndarray
    masks: dict[str, np.ndarray]
    considered: int


def team_selections(
    pool: Pool, metric: str, fraction: float = 0.1, max_size: int | None = None, scale: bool = True
) -> Selections:
    """Per method (Q with the mean threshold, HQ with the alpha filter, HQ with alpha and K-means,
    ``scale`` as :func:`kmeans_filter`) the teams it selects, judged on ``pool``.

    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 3, 60)
    >>> probs = rng.random((4, 60, 3)) + 0.8 * np.eye(3)[y][None] * rng.random((4, 1, 1))
    >>> chosen = team_selections(Pool(probs, y), "ck")
    >>> len(chosen.teams), {name: int(mask.sum()) for name, mask in chosen.masks.items()}, chosen.considered
    (11, {'Q': 6, 'HQ (alpha)': 11, 'HQ (alpha+K)': 3}, 11)
    """
    m = pool.size
    if m < 3:
        raise ValueError("team selection needs a pool of at least 3 members")
    top = min(max_size or m, m)
    teams_by_size = {s: teams_of_size(m, s) for s in range(2, top + 1)}
    acc_by_size = {s: team_accuracy(pool, t) for s, t in teams_by_size.items()}
    q = np.concatenate([q_scores(pool, t, metric) for t in teams_by_size.values()])
    hq = {s: hq_scores(pool, t, metric) for s, t in teams_by_size.items()}
    kept, considered = alpha_filter(hq, teams_by_size, fraction)
    with_k = []
    for s in teams_by_size:
        mask = np.zeros(len(teams_by_size[s]), dtype=bool)
        idx = np.flatnonzero(kept[s])
        mask[idx] = kmeans_filter(hq[s][idx], acc_by_size[s][idx], scale=scale)
        with_k.append(mask)
    masks = {
        "Q": q < np.nanmean(q),
        "HQ (alpha)": np.concatenate([kept[s] for s in teams_by_size]),
        "HQ (alpha+K)": np.concatenate(with_k),
    }
    teams = np.concatenate(list(teams_by_size.values()))
    accuracy = np.concatenate(list(acc_by_size.values()))
    return Selections(teams, accuracy, np.concatenate(list(hq.values())), masks, considered)


def select_teams(
    pool: Pool, metrics: tuple[str, ...] = METRICS, fraction: float = 0.1, max_size: int | None = None
) -> dict:
    """Run every selection method on the pool; returns the rows of a 004-style table and the
    per-team scores (for the diversity-vs-accuracy plot).

    >>> rng = np.random.default_rng(0)
    >>> y = rng.integers(0, 3, 60)
    >>> probs = rng.random((4, 60, 3)) + 0.8 * np.eye(3)[y][None] * rng.random((4, 1, 1))
    >>> pool = Pool(probs, y)
    >>> result = select_teams(pool, metrics=("ck",))
    >>> [(row["method"], row["teams_selected"]) for row in result["rows"]]
    [('Baseline', 11), ('Q-CK', 6), ('HQ-CK (alpha)', 11), ('HQ-CK (alpha+K)', 3)]
    """
    best_single = float(pool.accuracy.max())
    rows, scatter = [], {}
    for metric in metrics:
        chosen = team_selections(pool, metric, fraction, max_size)
        acc, masks = chosen.accuracy, chosen.masks
        if not rows:
            rows.append(_row("Baseline", len(acc), acc, best_single))
        name = metric.upper()
        rows.append(_row(f"Q-{name}", len(acc), acc[masks["Q"]], best_single))
        rows.append(_row(f"HQ-{name} (alpha)", chosen.considered, acc[masks["HQ (alpha)"]], best_single))
        rows.append(
            _row(f"HQ-{name} (alpha+K)", int(masks["HQ (alpha)"].sum()), acc[masks["HQ (alpha+K)"]], best_single)
        )
        sizes = chosen.teams.sum(axis=1)
        scatter[metric] = {"hq": chosen.hq.tolist(), "acc": acc.tolist(), "size": sizes.tolist()}
    return {"best_single": best_single, "rows": rows, "scatter": scatter}


def _row(method: str, considered: int, accs: np.ndarray, best_single: float) -> dict:
    above = int((accs > best_single).sum())
    return {
        "method": method,
        "teams_considered": int(considered),
        "teams_selected": int(len(accs)),
        "acc_min": float(accs.min()) if len(accs) else None,
        "acc_max": float(accs.max()) if len(accs) else None,
        "above_best_single": above,
        "share_above_best_single": above / len(accs) if len(accs) else None,
    }
