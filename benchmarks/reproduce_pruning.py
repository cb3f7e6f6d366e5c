"""HDP: does hierarchical diversity pruning (HQ) select better teams than Q pruning?

    python benchmarks/reproduce_pruning.py [--splits 10] [--metrics ck qs bd fk kw gd] [--raw-kmeans] [--json FILE]

Data: scikit-learn's bundled digits, per split (seeded) cut in three: 40% trains a pool of 12 members of
different families and seeds (logistic regressions, k-NN, trees, forests, naive Bayes, SVMs, MLPs), 30%
scores the teams and selects them (Q with the mean threshold, HQ with the alpha filter, HQ with alpha and
K-means), 30% is held out to measure each selected team's ensemble accuracy (AVG). Every team of 2..12
members is a candidate (4,083 teams). Per metric and method, over the splits (mean and 95% t interval):
the teams selected, the held-out accuracy range and its minimum (the worst case), and the share of teams
above the best single member (the member most accurate on the selection part, measured held out). As a
baseline for the minimum, a random subset of teams of the same size as HQ (alpha+K)'s selection (a
smaller set has a higher minimum by chance). ``--raw-kmeans`` clusters raw (score, accuracy) values as
004's code does, instead of min-max scaled ones.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from intervals import format_interval

from consistency_gate.diagnostics.diversity import METRICS
from consistency_gate.diagnostics.selection import Pool, team_accuracy, team_selections
from consistency_gate.report.text import table

METHODS = ("Q", "HQ (alpha)", "HQ (alpha+K)", "random, as many as HQ (alpha+K)")


def pool_members(seed: int) -> list:
    """Twelve scikit-learn classifiers of different families and seeds."""
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.ensemble import ExtraTreesClassifier, RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.naive_bayes import GaussianNB
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC
    from sklearn.tree import DecisionTreeClassifier

    def scaled(model):
        return make_pipeline(StandardScaler(), model)

    return [
        scaled(LogisticRegression(C=0.05, max_iter=2000)),
        scaled(LogisticRegression(C=1.0, max_iter=2000)),
        KNeighborsClassifier(3),
        KNeighborsClassifier(9),
        DecisionTreeClassifier(max_depth=8, random_state=seed),
        DecisionTreeClassifier(max_depth=None, random_state=seed + 1),
        RandomForestClassifier(30, max_depth=6, random_state=seed),
        ExtraTreesClassifier(30, random_state=seed),
        GaussianNB(),
        scaled(CalibratedClassifierCV(SVC(C=1.0, random_state=seed), ensemble=False)),  # SVC's probabilities
        scaled(MLPClassifier((32,), max_iter=300, random_state=seed)),
        scaled(MLPClassifier((64,), max_iter=300, random_state=seed + 1)),
    ]


def one_split(seed: int, metrics: list[str], scale: bool) -> dict:
    """Every metric's and method's figures on one three-way split."""
    import warnings

    from sklearn.datasets import load_digits
    from sklearn.exceptions import ConvergenceWarning

    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    x, y = digits.data[order], digits.target[order]
    a, b = int(0.4 * len(y)), int(0.7 * len(y))
    members = pool_members(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for model in members:
            model.fit(x[:a], y[:a])
    select = Pool(np.stack([m.predict_proba(x[a:b]) for m in members]), y[a:b])
    held_out = Pool(np.stack([m.predict_proba(x[b:]) for m in members]), y[b:])
    best_single = float(held_out.accuracy[int(np.argmax(select.accuracy))])
    rng = np.random.default_rng(seed + 7)
    out = {}
    teams = None
    for metric in metrics:
        chosen = team_selections(select, metric, scale=scale)
        if teams is None:
            teams = chosen.teams
            accuracy = team_accuracy(held_out, teams)
        masks = dict(chosen.masks)
        random = np.zeros(len(teams), dtype=bool)
        random[rng.choice(len(teams), int(masks["HQ (alpha+K)"].sum()), replace=False)] = True
        masks["random, as many as HQ (alpha+K)"] = random
        out[metric] = {
            name: {
                "selected": int(mask.sum()),
                "acc_min": float(accuracy[mask].min()) if mask.any() else None,
                "acc_max": float(accuracy[mask].max()) if mask.any() else None,
                "share_above_best": float((accuracy[mask] > best_single).mean()) if mask.any() else None,
            }
            for name, mask in masks.items()
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--splits", type=int, default=10)
    parser.add_argument("--metrics", nargs="+", default=list(METRICS), choices=list(METRICS))
    parser.add_argument("--raw-kmeans", action="store_true", help="cluster raw values, as 004's code")
    parser.add_argument("--json", help="also write the per-split figures to this file")
    args = parser.parse_args()
    started = time.perf_counter()
    splits = [one_split(seed, args.metrics, scale=not args.raw_kmeans) for seed in range(args.splits)]
    scaling = "raw" if args.raw_kmeans else "min-max scaled"
    print(f"digits, 12-member pool, {args.splits} splits, K-means on {scaling} values; mean [95% t interval]")
    header = ["metric", "method", "teams selected", "held-out acc min", "held-out acc max", "share > best single"]
    rows = []
    for metric in args.metrics:
        for method in METHODS:
            figures = [split[metric][method] for split in splits]
            rows.append(
                [metric.upper(), method]
                + [format_interval([f["selected"] for f in figures], digits=0)]
                + [format_interval([f[key] for f in figures]) for key in ("acc_min", "acc_max")]
                + [format_interval([f["share_above_best"] for f in figures])]
            )
            if method == METHODS[-1]:
                hq = [split[metric]["HQ (alpha+K)"]["acc_min"] for split in splits]
                q = [split[metric]["Q"]["acc_min"] for split in splits]
                rnd = [split[metric][METHODS[-1]]["acc_min"] for split in splits]
                diff_q = [h - o for h, o in zip(hq, q, strict=True) if h is not None and o is not None]
                diff_r = [h - o for h, o in zip(hq, rnd, strict=True) if h is not None and o is not None]
                rows.append([metric.upper(), "worst case: HQ (alpha+K) - Q", "", format_interval(diff_q), "", ""])
                rows.append([metric.upper(), "worst case: HQ (alpha+K) - random", "", format_interval(diff_r), "", ""])
    print(table(rows, header))
    print(f"\n{time.perf_counter() - started:.0f} s in all")
    if args.json:
        Path(args.json).write_text(json.dumps(splits, indent=2))


if __name__ == "__main__":
    main()
