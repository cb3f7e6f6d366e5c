"""Throughput of every consistency metric (top-5 included) against reading the score matrices once.

For each number of classes p, on the same batches of float32 scores: the time of all metrics
through :class:`ConsistencyCounts` (top-1 and top-5 of both generations, the flips, Pearson and
cosine) against the time of reading both matrices once (``np.max`` over each row: one
vectorised pass, the least any metric pass can cost), alternating batch by batch; prints the
ratio (the target is at most 2) and the throughput. The metrics run with numba's default
thread count (one per core) and, with ``--one-thread``, also on one thread, as ``np.max`` uses
one core. n shrinks as p grows so that every p reads the same number of scores.

    python benchmarks/metrics_throughput.py                      # p = 10, 100, 1,000, 10,000
    python benchmarks/metrics_throughput.py --p 1000 --scores 1e9  # n = 1,000,000 at p = 1,000
"""

from __future__ import annotations

import argparse
import resource
import time

import numba
import numpy as np

from consistency_gate.core.counts import ConsistencyCounts, Outputs

KS = (1, 5)


def batches(n: int, p: int, rows: int, seed: int = 0):
    """(y, a, b) batches of at most ``rows`` rows: b agrees with a on about half the rows."""
    rng = np.random.default_rng(seed)
    for start in range(0, n, rows):
        size = min(rows, n - start)
        y = rng.integers(0, p, size)
        a = rng.random((size, p), dtype=np.float32)
        b = rng.random((size, p), dtype=np.float32)
        a[np.arange(size), y] += 0.5
        b[np.arange(size), (y + rng.integers(0, 2, size)) % p] += 0.5
        yield y, a, b


def measure(n: int, p: int, rows: int) -> tuple[float, float, dict]:
    """Seconds of the metric pass and of the read-once pass over the same n x p batches."""
    counts = ConsistencyCounts(ks=KS)
    t_metrics = t_read = 0.0
    for y, a, b in batches(n, p, rows):
        t0 = time.perf_counter()
        a.max(axis=1)
        b.max(axis=1)
        t1 = time.perf_counter()
        counts.update(*_outputs(y, a, b))
        t2 = time.perf_counter()
        t_read += t1 - t0
        t_metrics += t2 - t1
    values, _ = counts.compute()
    return t_metrics, t_read, values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--p", type=int, nargs="+", default=[10, 100, 1_000, 10_000])
    parser.add_argument("--scores", type=float, default=2e8, help="scores per matrix (n = scores / p)")
    parser.add_argument("--batch-scores", type=float, default=2e7, help="scores per batch and matrix")
    parser.add_argument("--one-thread", action="store_true", help="also time the metrics on one thread")
    args = parser.parse_args()

    for p in args.p:  # numba compiles (or loads its cache) outside the timings
        ConsistencyCounts(ks=KS).update(*_outputs(*next(batches(10, max(p, KS[-1]), 10))))
    threads = [numba.config.NUMBA_NUM_THREADS] + ([1] if args.one_thread else [])
    print(f"{args.scores:,.0f} float32 scores per matrix, k = {KS}; ratio = metrics / read once (target <= 2)")
    print(f"{'p':>7} {'n':>11} {'threads':>7} {'metrics s':>10} {'read s':>8} {'ratio':>6} {'samples/s':>12}")
    for p in args.p:
        n = int(args.scores // p)
        rows = max(1, int(args.batch_scores // p))
        for count in threads:
            numba.set_num_threads(count)
            t_metrics, t_read, values = measure(n, p, rows)
            print(
                f"{p:>7,} {n:>11,} {count:>7} {t_metrics:>10.2f} {t_read:>8.2f} "
                f"{t_metrics / t_read:>6.2f} {n / t_metrics:>12,.0f}"
            )
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak_mb:,.0f} MB; last p: con = {values['con']:.4f}, ccon@5 = {values['ccon@5']:.4f}")


def _outputs(y: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple:
    """update()'s arguments as compare gives them for two generations: both top lists and the pair's
    per-row sums from one pass over each row pair."""
    return y, *Outputs.pair_from_scores(a, b, np.arange(a.shape[1]), KS[-1])


if __name__ == "__main__":
    main()
