"""Team selection over a pool of members (paper 004): Q metrics, Q-pruning, HQ metrics with
focal models (Algorithm 2), the alpha filter (Algorithm 3) and the K-means filter.

All candidate teams of size 2..M are scored at once per size (no Python loop over samples).
:func:`select_teams` reports, per method, as paper 004's Tables 2-3: the number of teams
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


def kmeans_filter(scores: np.ndarray, accuracy: np.ndarray, iterations: int = 100) -> np.ndarray:
    """K-means with K=2 on (score, accuracy), initial centroids (low score, high accuracy) and
    (high score, low accuracy); keep teams scoring below the smallest score of the low-accuracy
    cluster. Features are min-max scaled so neither axis dominates (scikit-learn's KMeans).

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
    span = pts.max(axis=0) - pts.min(axis=0)
    span[span == 0] = 1
    pts = (pts - pts.min(axis=0)) / span
    centroids = np.array([[pts[:, 0].min(), pts[:, 1].max()], [pts[:, 0].max(), pts[:, 1].min()]])
    label = KMeans(n_clusters=2, init=centroids, n_init=1, max_iter=iterations).fit(pts).labels_
    low_acc = label == 1
    threshold = scores[ok][low_acc].min() if low_acc.any() else np.inf
    keep[np.flatnonzero(ok)] = scores[ok] < threshold if low_acc.any() else True
    return keep


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
    m = pool.size
    if m < 3:
        raise ValueError("team selection needs a pool of at least 3 members")
    top = min(max_size or m, m)
    teams_by_size = {s: teams_of_size(m, s) for s in range(2, top + 1)}
    acc_by_size = {s: team_accuracy(pool, t) for s, t in teams_by_size.items()}
    all_acc = np.concatenate(list(acc_by_size.values()))
    best_single = float(pool.accuracy.max())
    rows = [_row("Baseline", len(all_acc), all_acc, best_single)]
    scatter = {}
    for metric in metrics:
        q = np.concatenate([q_scores(pool, t, metric) for t in teams_by_size.values()])
        chosen = q < np.nanmean(q)
        rows.append(_row(f"Q-{metric.upper()}", len(q), all_acc[chosen], best_single))
        hq = {s: hq_scores(pool, t, metric) for s, t in teams_by_size.items()}
        kept, considered = alpha_filter(hq, teams_by_size, fraction)
        alpha_acc = np.concatenate([acc_by_size[s][kept[s]] for s in teams_by_size])
        rows.append(_row(f"HQ-{metric.upper()} (alpha)", considered, alpha_acc, best_single))
        k_acc = []
        for s in teams_by_size:
            idx = np.flatnonzero(kept[s])
            keep = kmeans_filter(hq[s][idx], acc_by_size[s][idx])
            k_acc.append(acc_by_size[s][idx][keep])
        rows.append(
            _row(
                f"HQ-{metric.upper()} (alpha+K)",
                int(sum(k.sum() for k in kept.values())),
                np.concatenate(k_acc),
                best_single,
            )
        )
        scatter[metric] = {
            "hq": np.concatenate(list(hq.values())).tolist(),
            "acc": all_acc.tolist(),
            "size": np.concatenate([[s] * len(t) for s, t in teams_by_size.items()]).tolist(),
        }
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
