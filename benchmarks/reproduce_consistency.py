"""Paper 003's comparison at CPU scale: consistency of SingleBase, the ensemble baselines and DynSnap.

    python benchmarks/reproduce_consistency.py [--quick] [--json FILE] [--seed S]

Data: scikit-learn's bundled digits (no download). As in paper 003 (Appendix I), three
class-imbalanced training sets D1 <= D2 <= D3 are drawn from the training pool: D1 has 80%
of each class's share and D2 100%, both without class 9; D3 adds class 9. The test set is
independent and holds only the classes all three know. Each method trains one model (or
ensemble) per generation; the report gives ACC averaged over generations, CON and ACC-CON
averaged over the three pairs, and kappa (training epochs relative to one SingleBase run,
and measured time relative to SingleBase's).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pandas as pd

from consistency_gate.core.evaluation import Evaluation
from consistency_gate.ensembles.config import RemediationConfig, TrainSettings
from consistency_gate.ensembles.remediation import fit_ensemble
from consistency_gate.report.tables import table

METHODS = {
    "SingleBase": "singlebase",
    "ExtBagging": "extbagging",
    "MCDropout": "mcdropout",
    "Snapshot": "snapshot",
    "DynSnap-cyc": "dynsnap-cyc",
    "DynSnap-step": "dynsnap-step",
}
SHARE = [1.0, 0.9, 0.8, 0.95, 0.45, 0.3, 0.4, 0.1, 0.85, 0.75]  # per-class share, as the paper's CIFAR10 setup


def generations(seed: int):
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = digits.data.astype(np.float32), digits.target
    rng = np.random.default_rng(seed)
    test_idx, pool = [], []
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(y == c))
        if c != 9:
            test_idx += list(idx[:40])
        pool.append(idx[40:])
    sets = []
    for gen, (frac, classes) in enumerate([(0.8, range(9)), (1.0, range(9)), (1.0, range(10))]):
        rows = np.concatenate([pool[c][: max(5, int(len(pool[c]) * SHARE[c] * frac))] for c in classes])
        sets.append((f"G{gen + 1}", x[rows], y[rows]))
    test_idx = np.array(test_idx)
    return sets, x[test_idx], y[test_idx]


def _train(method: str, x, y, m: int, n: int, epochs: int, seed: int):
    settings = TrainSettings(method=method, m=m, n_snapshots=n, epochs=epochs, seed=seed)
    config = RemediationConfig(
        data=None, recipe="mlp", recipe_options={"hidden": [64], "dropout": 0.1}, combination="avg", settings=settings
    )
    return fit_ensemble(x, y, [f"px{i}" for i in range(x.shape[1])], config, quiet=True)


def _generations(method: str, gens, x_test, y_test, m: int, n: int, epochs: int, seed: int) -> dict:
    """Train one model per generation; ACC mean, CON / ACC-CON means over pairs, kappa, seconds."""
    t0 = time.perf_counter()
    outputs, kappas = [], []
    for g, (_, x, y) in enumerate(gens):
        ensemble, build = _train(method, x, y, m, n, epochs, seed * 100 + g)
        outputs.append(pd.DataFrame(ensemble.predict_proba(x_test), columns=ensemble.classes))
        kappas.append(build.kappa)
    seconds = (time.perf_counter() - t0) / len(gens)
    evaluation = Evaluation([g[0] for g in gens], [list(o.columns) for o in outputs], ks=(1,))
    evaluation.add(pd.Series(y_test.astype(str)), outputs)
    report = evaluation.generations_report()
    return {
        "acc": report["acc_mean"],
        "con": report["con_mean"],
        "acc_con": report["acc_con_mean"],
        "kappa": float(np.mean(kappas)),
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="m=10, N=5, 20 epochs (under 15 minutes on 2 cores)")
    parser.add_argument("--json", dest="json_path", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="independent repetitions (seeds) to average")
    args = parser.parse_args()
    m, n, epochs = (10, 5, 20) if args.quick else (20, 10, 40)
    runs: dict[str, list[dict]] = {name: [] for name in METHODS}
    for repeat in range(args.repeats):
        seed = args.seed + repeat
        gens, x_test, y_test = generations(seed)
        if repeat == 0:
            sizes = [len(g[1]) for g in gens]
            print(
                f"digits: generations of {sizes} samples, test {len(x_test)}; m={m}, N={n}, epochs={epochs}, "
                f"{args.repeats} repeats"
            )
            _train("singlebase", gens[0][1], gens[0][2], m, n, epochs, seed)  # warm-up, not timed
        for name, method in METHODS.items():
            runs[name].append(_generations(method, gens, x_test, y_test, m, n, epochs, seed))
        print(f"  repeat {repeat + 1} of {args.repeats} done")
    single = np.mean([r["seconds"] for r in runs["SingleBase"]])
    results = {
        name: {
            "acc": float(np.mean([r["acc"] for r in rs])),
            "con": float(np.mean([r["con"] for r in rs])),
            "acc_con": float(np.mean([r["acc_con"] for r in rs])),
            "kappa": float(np.mean([r["kappa"] for r in rs])),
            "kappa_time": float(np.mean([r["seconds"] for r in rs]) / single),
            "seconds_per_generation": float(np.mean([r["seconds"] for r in rs])),
        }
        for name, rs in runs.items()
    }
    rows = [
        [k, 100 * v["acc"], 100 * v["con"], 100 * v["acc_con"], v["kappa"], v["kappa_time"]] for k, v in results.items()
    ]
    print()
    print(table(rows, ["method", "ACC %", "CON %", "ACC-CON %", "kappa (epochs)", "kappa (time)"]))
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(
                {"methods": results, "settings": {"m": m, "N": n, "epochs": epochs, "seed": args.seed}}, fh, indent=2
            )


if __name__ == "__main__":
    main()
