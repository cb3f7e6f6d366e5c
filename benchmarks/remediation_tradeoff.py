"""Single-model remediation against ensembles: what each repair buys and what it costs.

    python benchmarks/remediation_tradeoff.py [--quick] [--seeds 5] [--recipes mlp cnn] [--json FILE]

Data: scikit-learn's bundled digits (no download), per seed a new split: 1,000 training samples, the
rest (797) to evaluate. Generation 1 is a SingleBase model of the recipe (``mlp`` on the 64 pixels,
``cnn`` on 1x8x8 images); generation 2 is trained on the same data by each method below, and compared
with generation 1 on the evaluation samples:

- SingleBase retrain (a new seed: the regression to repair);
- focal-distillation FD-KL and FD-LM toward generation 1 (alpha 1, beta 5, temperature 4;
  generation 1 gives probabilities, so its logits are their logarithms);
- ensemble-distillation (one student of a DynSnap-cyc ensemble, temperature 4);
- DynSnap-cyc and ExtBagging ensembles of m members.

Per method and recipe: ACC, CON, CtoI (the negative flip rate), relative NFR (CtoI / (ACC_1 x
(1 - ACC_2))), kappa (training time over one SingleBase run of the same seed) and the serving
latency over one model's (predict 40,000 rows on one thread, alternately, median of 9). Each figure is
the mean over seeds with a 95% t interval. The claim tested: a single distilled model keeps most of
the ensemble's consistency gain at one model's serving cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd
from intervals import format_interval

from consistency_gate.core.evaluation import Evaluation
from consistency_gate.ensembles.config import Distillation, RemediationConfig, TrainSettings
from consistency_gate.ensembles.distillation import logits_of
from consistency_gate.ensembles.remediation import fit_ensemble
from consistency_gate.report.text import table

METHODS = {  # name -> (method, distillation term or None for the method's default)
    "SingleBase retrain": ("singlebase", None),
    "focal-distillation KL": ("focal-distillation", Distillation(loss="kl")),
    "focal-distillation LM": ("focal-distillation", Distillation(loss="lm")),
    "ensemble-distillation": ("ensemble-distillation", None),
    "DynSnap-cyc": ("dynsnap-cyc", None),
    "ExtBagging": ("extbagging", None),
}
RECIPES = {"mlp": {"hidden": [64]}, "cnn": {"image_shape": [1, 8, 8]}}
FIGURES = ("acc", "con", "ctoi", "rel_nfr", "kappa", "latency")


def digits_split(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    x, y = digits.data[order].astype(np.float32), digits.target[order]
    return x[:1000], y[:1000], x[1000:], y[1000:]


def train(recipe: str, method: str, x, y, seed: int, size: dict, distillation=None, teacher=None):
    """The model of ``method`` and its training seconds."""
    settings = TrainSettings(method=method, seed=seed, distillation=distillation, **size)
    config = RemediationConfig(None, recipe=recipe, recipe_options=RECIPES[recipe], settings=settings)
    started = time.perf_counter()
    model, _ = fit_ensemble(x, y, [f"px{i}" for i in range(x.shape[1])], config, quiet=True, teacher=teacher)
    return model, time.perf_counter() - started


def compare(previous, candidate, x, y) -> dict:
    """ACC, CON, CtoI and relative NFR of ``candidate`` against ``previous`` on (x, y)."""
    frames = [pd.DataFrame(m.predict_proba(x), columns=m.classes) for m in (previous, candidate)]
    evaluation = Evaluation(["previous", "candidate"], [list(f.columns) for f in frames], ks=(1,))
    evaluation.add(pd.Series(y.astype(str)), frames)
    metrics = evaluation.result().metrics
    return {
        key: metrics[name]
        for key, name in (("acc", "acc_candidate"), ("con", "con"), ("ctoi", "ctoi"), ("rel_nfr", "rel_nfr"))
    }


def latency_ratio(model, single, x, repeats: int = 9) -> float:
    """Median predict time of ``model`` over ``single``'s on ``x`` tiled to 40,000 rows (a batch long
    enough to time), on one torch thread (threads contend on a shared machine), alternately, after
    one untimed call of each."""
    import torch

    x = np.tile(x, (int(np.ceil(40_000 / len(x))), 1))[:40_000]
    times: dict[int, list[float]] = {id(model): [], id(single): []}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model.predict_proba(x), single.predict_proba(x)
        for _ in range(repeats):
            for m in (single, model):
                started = time.perf_counter()
                m.predict_proba(x)
                times[id(m)].append(time.perf_counter() - started)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(times[id(model)]) / statistics.median(times[id(single)])


def one_seed(recipe: str, seed: int, size: dict) -> dict[str, dict]:
    """Every method's figures for one split and seed."""
    x, y, x_eval, y_eval = digits_split(seed)
    one = {**size, "m": 1}
    gen1, _ = train(recipe, "singlebase", x, y, seed, one)
    retrain, one_run = train(recipe, "singlebase", x, y, seed + 1, one)
    teacher = logits_of(gen1.predict_proba(x))  # generation 1 on the training samples, classes in order
    out = {}
    for name, (method, distillation) in METHODS.items():
        if method == "singlebase":
            model, seconds = retrain, one_run
        else:
            members = size if method in ("dynsnap-cyc", "extbagging", "ensemble-distillation") else one
            fd_teacher = teacher if method == "focal-distillation" else None
            model, seconds = train(recipe, method, x, y, seed + 1, members, distillation, fd_teacher)
        out[name] = {
            **compare(gen1, model, x_eval, y_eval),
            "kappa": seconds / one_run,
            "latency": latency_ratio(model, retrain, x_eval),
        }
    return out


PAIRED = ("acc", "con", "ctoi", "rel_nfr")


def summary_rows(runs: list[dict], figures: tuple[str, ...], paired: bool = False) -> list[list[str]]:
    """A row per method: each figure's mean over seeds and 95% t interval; with ``paired``, of the
    per-seed difference from the SingleBase retrain (the retrain's own row left out)."""
    rows = []
    for name in METHODS:
        if paired and name == "SingleBase retrain":
            continue
        cells = []
        for key in figures:
            values = [
                None if run[name][key] is None else run[name][key] - (run["SingleBase retrain"][key] if paired else 0)
                for run in runs
            ]
            cells.append(format_interval(values, 2 if key in ("kappa", "latency") else 4, signed=paired))
        rows.append([name, *cells])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 seeds, 8 epochs, 3 members (a smoke run)")
    parser.add_argument("--seeds", type=int, default=None, help="default 5 (3 with --quick)")
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--json", help="also write the per-seed figures to this file")
    args = parser.parse_args()
    seeds = args.seeds or (3 if args.quick else 5)
    size = {"epochs": 8, "m": 3, "n_snapshots": 2} if args.quick else {"epochs": 20, "m": 5, "n_snapshots": 4}
    started = time.perf_counter()
    results: dict[str, list[dict]] = {}
    for recipe in args.recipes:
        runs = [one_seed(recipe, 100 * s, size) for s in range(seeds)]
        results[recipe] = runs
        print(f"\ndigits, recipe {recipe}: {seeds} seeds, {size}; mean [95% t interval] against generation 1")
        print(
            table(summary_rows(runs, FIGURES), ["method", "ACC", "CON", "CtoI", "rel NFR", "kappa (time)", "latency x"])
        )
        print("paired with the SingleBase retrain of the same seed: method - retrain [95% t interval]")
        print(table(summary_rows(runs, PAIRED, paired=True), ["method", "ACC", "CON", "CtoI", "rel NFR"]))
    print(f"\n{time.perf_counter() - started:.0f} s in all")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
