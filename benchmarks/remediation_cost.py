"""What remediation costs and buys, for a digits CNN.

    python benchmarks/remediation_cost.py [--quick] [--device cpu|cuda] [--repeats 9] [--json FILE]

Data: scikit-learn's bundled digits as 1x8x8 images (no download). Generation 1 and generation 2
are single CNNs (the built-in ``cnn`` recipe, SingleBase) trained with different seeds on the same
data; generation 2 is remediated with a DynSnap-cyc ensemble. Prints, as ratios measured in this
run:

- kappa: the ensemble's training time (and epochs) over one SingleBase run;
- the ensemble's predict latency over one model's, timed alternately on the evaluation set
  (median of ``--repeats`` pairs), and its size on disk over one model's;
- CON and CtoI against generation 1, before (generation 2) and after (the ensemble).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from consistency_gate.core.evaluation import Evaluation
from consistency_gate.ensembles.config import RemediationConfig, TrainSettings
from consistency_gate.ensembles.remediation import fit_ensemble
from consistency_gate.report.text import table


def _digits(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    x, y = digits.data[order].astype(np.float32), digits.target[order]
    return x[:1000], y[:1000], x[1000:], y[1000:]


def _train(method: str, x: np.ndarray, y: np.ndarray, settings: dict, seed: int, device: str):
    config = RemediationConfig(
        data=None,
        recipe="cnn",
        recipe_options={"image_shape": [1, 8, 8]},
        settings=TrainSettings(method=method, seed=seed, **settings),
    )
    started = time.perf_counter()
    ensemble, build = fit_ensemble(x, y, [f"px{i}" for i in range(x.shape[1])], config, quiet=True, device=device)
    return ensemble, build, time.perf_counter() - started


def _size(ensemble) -> int:  # noqa: ANN001 - a TorchEnsemble
    with tempfile.TemporaryDirectory() as tmp:
        ensemble.save(Path(tmp))
        return sum(f.stat().st_size for f in Path(tmp).iterdir())


def _consistency(y: np.ndarray, previous, candidate, x: np.ndarray) -> dict:  # noqa: ANN001
    frames = [pd.DataFrame(m.predict_proba(x), columns=m.classes) for m in (previous, candidate)]
    evaluation = Evaluation(["previous", "candidate"], [list(f.columns) for f in frames], ks=(1,))
    evaluation.add(pd.Series(y.astype(str)), frames)
    metrics = evaluation.result().metrics
    return {"con": metrics["con"], "ctoi": metrics["ctoi"], "acc": metrics["acc_candidate"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer epochs and members (a smoke run)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=9, help="timed predict pairs (median reported)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    epochs, m, n = (8, 4, 2) if args.quick else (30, 10, 5)
    x, y, x_eval, y_eval = _digits(args.seed)
    single = {"m": 1, "n_snapshots": 1, "epochs": epochs}
    gen1, _, _ = _train("singlebase", x, y, single, args.seed, args.device)
    gen2, _, one_run_s = _train("singlebase", x, y, single, args.seed + 1, args.device)
    ensemble, build, ensemble_s = _train(
        "dynsnap-cyc", x, y, {"m": m, "n_snapshots": n, "epochs": epochs}, args.seed + 1, args.device
    )
    single_t, ensemble_t = [], []
    for _ in range(args.repeats):  # alternate, so drift on a shared machine hits both alike
        for model, times in ((gen2, single_t), (ensemble, ensemble_t)):
            started = time.perf_counter()
            model.predict_proba(x_eval)
            times.append(time.perf_counter() - started)
    before = _consistency(y_eval, gen1, gen2, x_eval)
    after = _consistency(y_eval, gen1, ensemble, x_eval)
    figures = {
        "device": args.device,
        "members": len(ensemble.states),
        "runs": len(build.runs),
        "kappa_epochs": build.kappa,
        "kappa_time": ensemble_s / one_run_s,
        "latency_ratio": statistics.median(ensemble_t) / statistics.median(single_t),
        "single_ms_per_1000": statistics.median(single_t) * 1e6 / len(x_eval),
        "size_ratio": _size(ensemble) / _size(gen2),
        "before": before,
        "after": after,
    }
    rows = [
        ["kappa (epochs / one run)", f"{figures['kappa_epochs']:.1f}"],
        ["kappa (training time / one run)", f"{figures['kappa_time']:.1f}"],
        [f"latency ratio (ensemble / one model, median of {args.repeats})", f"{figures['latency_ratio']:.2f}"],
        ["size ratio (ensemble / one model, on disk)", f"{figures['size_ratio']:.2f}"],
        ["CON vs generation 1: before -> after", f"{before['con']:.4f} -> {after['con']:.4f}"],
        ["CtoI vs generation 1: before -> after", f"{before['ctoi']:.4f} -> {after['ctoi']:.4f}"],
        ["accuracy: generation 2 -> ensemble", f"{before['acc']:.4f} -> {after['acc']:.4f}"],
    ]
    print(
        f"digits CNN on {args.device}: DynSnap-cyc, {figures['members']} members from {figures['runs']} runs "
        f"of {epochs} epochs; {len(x_eval)} evaluation samples"
    )
    print(table(rows, ["figure", "value"]))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
