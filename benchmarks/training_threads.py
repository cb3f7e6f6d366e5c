"""Training time of small recipes with the picked CPU thread count against torch's default.

    python benchmarks/training_threads.py [--repeat 5] [--epochs 10] [--busy 2]

Data: scikit-learn's bundled digits (no download). One SingleBase run of the built-in ``mlp``
(64 hidden units) and ``cnn`` (1x8x8 images) recipes, alternately with ``threads: null`` (picked:
one thread for networks under a million parameters) and ``threads: 0`` (torch's default, one per
core); prints each one's median seconds and the ratio picked / default. torch's threads contend with
whatever else runs on the machine: ``--busy N`` keeps N other processes spinning on the CPU meanwhile
(a CI runner shared with other jobs), stopped when the script ends.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time

import numpy as np
import torch

from consistency_gate.ensembles.config import RemediationConfig, TrainSettings
from consistency_gate.ensembles.remediation import fit_ensemble


def _seconds(recipe: str, options: dict, threads: int | None, epochs: int, x: np.ndarray, y: np.ndarray) -> float:
    settings = TrainSettings(method="singlebase", epochs=epochs, threads=threads, seed=0)
    config = RemediationConfig(data=None, recipe=recipe, recipe_options=options, settings=settings)
    start = time.perf_counter()
    fit_ensemble(x, y, [f"px{i}" for i in range(x.shape[1])], config, quiet=True, device="cpu")
    return time.perf_counter() - start


def _spin() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--busy", type=int, default=0, help="other processes spinning on the CPU meanwhile")
    args = parser.parse_args()
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for process in spinners:
        process.start()
    try:
        _measure(args)
    finally:
        for process in spinners:
            process.terminate()


def _measure(args: argparse.Namespace) -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = digits.data.astype(np.float32), digits.target
    print(
        f"torch's default: {torch.get_num_threads()} threads; {len(y)} samples, {args.epochs} epochs per run; "
        f"{args.busy} other busy processes"
    )
    print(f"{'recipe':>8}  {'picked (s)':>10}  {'default (s)':>11}  {'ratio':>6}")
    for recipe, options in (("mlp", {"hidden": [64]}), ("cnn", {"image_shape": [1, 8, 8]})):
        times: dict[int | None, list[float]] = {None: [], 0: []}
        for i in range(args.repeat + 1):
            for threads in (None, 0):
                seconds = _seconds(recipe, options, threads, args.epochs, x, y)
                if i:  # the first round warms both up
                    times[threads].append(seconds)
        picked, default = statistics.median(times[None]), statistics.median(times[0])
        print(f"{recipe:>8}  {picked:>10.2f}  {default:>11.2f}  {picked / default:>6.2f}")


if __name__ == "__main__":
    main()
