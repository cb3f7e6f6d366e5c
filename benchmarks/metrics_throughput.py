"""Throughput of every consistency metric (top-5 included) on a stream of score batches.

Prints, in one run on the same data: the time of all metrics through ConsistencyCounts,
the time of a bare ``np.argmax`` over both matrices, their ratio, and the peak RSS. The
metrics run twice: with numba's default thread count (one per core) and with one thread,
since ``np.argmax`` itself uses one core.

    python benchmarks/metrics_throughput.py              # n = 1,000,000, p = 1,000 float32
    python benchmarks/metrics_throughput.py --n 100000   # quicker
"""

from __future__ import annotations

import argparse
import resource
import time

import numba
import numpy as np

from consistency_gate.core.counts import ConsistencyCounts, Outputs


def batches(n: int, p: int, rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for start in range(0, n, rows):
        size = min(rows, n - start)
        y = rng.integers(0, p, size)
        a = rng.random((size, p), dtype=np.float32)
        b = rng.random((size, p), dtype=np.float32)
        a[np.arange(size), y] += 0.5
        b[np.arange(size), (y + rng.integers(0, 2, size)) % p] += 0.5
        yield y, a, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--p", type=int, default=1_000)
    parser.add_argument("--batch", type=int, default=20_000)
    args = parser.parse_args()

    ks = (1, 5)
    ConsistencyCounts(ks=ks).update(*_outputs(*next(batches(10, args.p, 10))))  # numba compiles outside the timings
    print(f"n = {args.n:,} x p = {args.p:,} float32, batches of {args.batch:,} rows, k = {ks}")
    for threads in dict.fromkeys((numba.config.NUMBA_NUM_THREADS, 1)):
        numba.set_num_threads(threads)
        counts = ConsistencyCounts(ks=ks)
        t_metrics = t_argmax = 0.0
        for y, a, b in batches(args.n, args.p, args.batch):
            t0 = time.perf_counter()
            a.argmax(axis=1)
            b.argmax(axis=1)
            t1 = time.perf_counter()
            counts.update(*_outputs(y, a, b))
            t2 = time.perf_counter()
            t_argmax += t1 - t0
            t_metrics += t2 - t1
        values, _ = counts.compute()
        print(f"-- metrics on {threads} thread(s)")
        print(f"all metrics (incl. top-5, Pearson, cosine): {t_metrics:8.2f} s")
        print(f"bare np.argmax over both matrices:          {t_argmax:8.2f} s")
        print(f"ratio metrics / argmax:                     {t_metrics / t_argmax:8.2f}")
        print(f"throughput:                                 {args.n / t_metrics:,.0f} samples/s")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS:                                   {peak_mb:8.0f} MB")
    print(f"check: con = {values['con']:.4f}, ccon@5 = {values['ccon@5']:.4f}, pearson = {values['pearson']:.4f}")


def _outputs(y: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple:
    columns = np.arange(a.shape[1])
    return y, Outputs.from_scores(a, columns, 5), Outputs.from_scores(b, columns, 5)


if __name__ == "__main__":
    main()
