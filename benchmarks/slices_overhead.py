"""What slicing costs: the counting pass with per-slice counts against the same pass without.

For each batch of a stream (the same data for both), times the counts of all metrics alone and
the counts plus the per-slice counts (slices by the true class and by a 10-value column, as a
config with ``slices: [true_class, region]`` does), alternating which runs first, and prints the
median ratio per batch.

    python benchmarks/slices_overhead.py                  # n = 300,000, p = 100 float32
    python benchmarks/slices_overhead.py --p 1000 --n 100000
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from metrics_throughput import batches  # the same stream of score batches

from consistency_gate.core.counts import ConsistencyCounts, Outputs
from consistency_gate.core.slices import SliceCounts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=300_000)
    parser.add_argument("--p", type=int, default=100)
    parser.add_argument("--batch", type=int, default=20_000)
    args = parser.parse_args()
    ks = (1, 5)
    rng = np.random.default_rng(1)
    plain, sliced, slices = ConsistencyCounts(ks=ks), ConsistencyCounts(ks=ks), SliceCounts(ks=ks)
    warm = Outputs.from_scores(rng.random((10, args.p), dtype=np.float32), np.arange(args.p), 5)
    ConsistencyCounts(ks=ks).update(np.zeros(10, dtype=np.int64), warm, warm)  # numba compiles outside the timings
    ratios, t_plain, t_sliced = [], 0.0, 0.0
    for i, (y, a, b) in enumerate(batches(args.n, args.p, args.batch)):
        batch = (y, a, b, rng.integers(0, 10, y.size).astype(str))
        if i % 2 == 0:
            unsliced, with_slices = _unsliced(plain, batch), _sliced(sliced, slices, batch)
        else:
            with_slices, unsliced = _sliced(sliced, slices, batch), _unsliced(plain, batch)
        t_plain += unsliced
        t_sliced += with_slices
        ratios.append(with_slices / unsliced)
    assert sliced.compute() == plain.compute()
    n_slices = len(slices.parts)
    print(f"n = {args.n:,} x p = {args.p:,} float32, batches of {args.batch:,}, {n_slices} slices (true class, region)")
    print(f"counts alone:           {t_plain:8.2f} s")
    print(f"counts + slice counts:  {t_sliced:8.2f} s")
    print(f"median ratio per batch: {statistics.median(ratios):8.2f} (sliced / unsliced, alternating order)")


def _unsliced(counts: ConsistencyCounts, batch: tuple) -> float:
    y, a, b, _ = batch
    columns = np.arange(a.shape[1])
    t0 = time.perf_counter()
    counts.update(y, Outputs.from_scores(a, columns, 5), Outputs.from_scores(b, columns, 5))
    return time.perf_counter() - t0


def _sliced(counts: ConsistencyCounts, slices: SliceCounts, batch: tuple) -> float:
    y, a, b, region = batch
    columns = np.arange(a.shape[1])
    t0 = time.perf_counter()
    previous, candidate = Outputs.from_scores(a, columns, 5), Outputs.from_scores(b, columns, 5)
    values = counts.sample_values(y, previous, candidate)  # once for the count and its slices, as Evaluation does
    counts.add_values(values, (True, True))
    slices.add_values(values, (True, True), {"true_class": y, "region": region})
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
