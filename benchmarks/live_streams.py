"""Live traffic: how often a gate that looks again after every batch of labels passes a candidate exactly at its
threshold, with fixed-sample bounds and with the shadow check's anytime-valid ones, and how many labels a
decision takes against a fixed-size gate.

Two parts, in one run:

1. **Simulated streams** (10,000 per cell): negative flips drawn at exactly the rule's threshold (``ctoi <=
   t``), looked at after every ``batch`` labels up to ``--labels``. A stream *passes* when the bound is under
   the threshold at any look: the fixed-sample exact (Clopper-Pearson) one-sided 95% bound, which the gate
   uses on a fixed set, against the confidence sequence of ``shadow check``
   (:mod:`consistency_gate.core.sequences`). Both are read through their tests (the binomial tail, the
   mixture statistic), one evaluation per look.
2. **Replays** of two generations of real models, with labels arriving late: digits (scikit-learn's bundled
   set, two MLPs of different seeds and training subsets) and MNIST-1D (``pip install mnist1d``; generated,
   no download; the same MLP recipe). Requests are drawn from the test pool (with replacement, so the pool's
   CtoI is the stream's true rate); each label arrives an exponential delay (mean 200 requests) after its
   request. At the threshold equal to the pool's CtoI: the false pass of both bounds, looked at every 100
   labels (10,000 streams). At a threshold of twice it (a candidate that clearly passes): the labels the
   shadow check took to promote (median over 2,000 streams), against the size a fixed-size gate must fix in
   advance to pass it with 80% power (``consistency-gate plan``).

    python benchmarks/live_streams.py [--streams 10000] [--labels 5000] [--quick]
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import numpy as np

from consistency_gate.core import intervals as ci
from consistency_gate.core import sequences as cs

LEVEL = 0.95


def ever_passes(hits: np.ndarray, sizes: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """For counts ``hits`` (streams x looks) after ``sizes`` labels, whether each stream's fixed-sample exact
    upper bound, and its anytime-valid one, is ever at most ``threshold``."""
    fixed = ci.binomial_cdf(hits, sizes, threshold) <= 1 - LEVEL  # the exact upper bound <= t, by duality
    mixture = cs.log_mixture(hits, np.broadcast_to(sizes, hits.shape), threshold) >= math.log(1 / (1 - LEVEL))
    return fixed.any(axis=1), (mixture & (hits < sizes * threshold)).any(axis=1)


def simulated(streams: int, labels: int, rng: np.random.Generator) -> list[tuple]:
    rows = []
    for threshold in (0.02, 0.05):
        for batch in (25, 100, 500):
            looks = labels // batch
            hits = np.cumsum(rng.binomial(batch, threshold, size=(streams, looks)), axis=1)
            sizes = batch * np.arange(1, looks + 1)
            fixed, anytime = ever_passes(hits, sizes, threshold)
            rows.append((threshold, batch, looks, fixed.mean(), anytime.mean()))
    return rows


def model_pair(name: str, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two generations' answers on the test pool and its labels."""
    from sklearn.neural_network import MLPClassifier

    if name == "digits":
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        x = x / 16.0
        order = np.random.default_rng(seed).permutation(len(x))
        cut = int(0.6 * len(x))
        train, test = order[:cut], order[cut:]
        x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]
    else:
        from mnist1d.data import get_dataset_args, make_dataset

        args = get_dataset_args()
        args.num_samples, args.seed = 6000, 42
        data = make_dataset(args)
        x_train, y_train, x_test, y_test = data["x"], data["y"], data["x_test"], data["y_test"]
    half = np.random.default_rng(seed + 1).permutation(len(x_train))[: int(0.8 * len(x_train))]
    old = MLPClassifier((64,), max_iter=300, random_state=seed).fit(x_train[half], y_train[half])
    new = MLPClassifier((64,), max_iter=300, random_state=seed + 7).fit(x_train, y_train)
    return old.predict(x_test), new.predict(x_test), y_test


def replay(name: str, streams: int, labels: int, rng: np.random.Generator, batch: int = 100) -> dict:
    """False pass at the pool's CtoI and labels to a promotion at twice it, on replayed streams."""
    old, new, y = model_pair(name, 0)
    lost = (old == y) & (new != y)
    rate = float(lost.mean())
    arrivals = labels + 2000  # requests served; the first ``labels`` labels to arrive are read
    picks = rng.integers(0, len(y), size=(streams, arrivals))
    delays = rng.exponential(200, size=(streams, arrivals))
    order = np.argsort(np.arange(arrivals) + delays, axis=1)[:, :labels]  # labels in the order they arrive
    flips = np.take_along_axis(lost[picks], order, axis=1)
    hits = np.cumsum(flips, axis=1)[:, batch - 1 :: batch]
    sizes = batch * np.arange(1, hits.shape[1] + 1)
    fixed, anytime = ever_passes(hits, sizes, rate)
    loose = 2 * rate
    reached = cs.log_mixture(hits[:2000], np.broadcast_to(sizes, hits[:2000].shape), loose) >= math.log(20)
    reached &= hits[:2000] < sizes * loose
    first = np.where(reached.any(axis=1), sizes[reached.argmax(axis=1)], np.inf)  # undecided: beyond the stream
    fixed_n = ci.samples_needed(rate, loose, at_most=True, level=LEVEL)
    return {
        "data": name,
        "ctoi": rate,
        "pool": len(y),
        "fixed": fixed.mean(),
        "anytime": anytime.mean(),
        "labels_to_promote": float(np.median(first)),
        "decided": float(np.isfinite(first).mean()),
        "fixed_size": fixed_n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--labels", type=int, default=5_000)
    parser.add_argument("--data", nargs="+", default=["digits", "mnist1d"])
    parser.add_argument("--quick", action="store_true", help="1,000 streams, 2,000 labels")
    args = parser.parse_args()
    if args.quick:
        args.streams, args.labels = 1000, 2000
    warnings.filterwarnings("ignore", message="Stochastic Optimizer")  # 300 epochs are enough for a pair's answers
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    print(f"Simulated streams at the threshold ({args.streams} per cell, up to {args.labels} labels, 95%):")
    print("| threshold | labels per look | looks | false pass, fixed bounds | false pass, anytime-valid |")
    print("|---|---|---|---|---|")
    for threshold, batch, looks, fixed, anytime in simulated(args.streams, args.labels, rng):
        print(f"| ctoi <= {threshold:g} | {batch} | {looks} | {fixed:.1%} | {anytime:.1%} |")
    print(f"\nReplayed streams (labels arrive 200 requests late on average, a look every 100 labels, {args.labels}):")
    print(
        "| data | pool CtoI | false pass at it, fixed | anytime-valid | labels to promote at 2x "
        "(median, share decided) | fixed-size gate at 80% power | ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in args.data:
        r = replay(name, args.streams, args.labels, rng)
        ratio = r["labels_to_promote"] / r["fixed_size"] if r["fixed_size"] else float("nan")
        print(
            f"| {name} ({r['pool']} test samples) | {r['ctoi']:.4f} | {r['fixed']:.1%} | {r['anytime']:.1%} | "
            f"{r['labels_to_promote']:.0f} ({r['decided']:.0%}) | {r['fixed_size']} | {ratio:.2f}x |"
        )
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
