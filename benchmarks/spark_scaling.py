"""`compare` on Spark (local mode, 1 and 2 partitions) vs the in-process path, on the same data.

    python benchmarks/spark_scaling.py [--n 200000] [--p 100]

Prints samples/s of each path, the ratios to in-process, and the driver's memory: the Python
driver's peak RSS and the JVM heap in use after the runs. The first Spark run is a warm-up
(JVM start), not timed, and the metric kernels are compiled before any timing.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from consistency_gate.core.kernels import precompile
from consistency_gate.engines.local import compare_files
from consistency_gate.engines.spark import compare_spark, spark_session


def write(root: Path, n: int, p: int) -> tuple[Path, Path, Path]:
    rng = np.random.default_rng(0)
    classes = [f"c{i}" for i in range(p)]
    y = rng.integers(0, p, n)
    ids = np.array([f"s{i}" for i in range(n)])
    files = []
    for name, boost in (("prev", 1.0), ("cand", 0.8)):
        scores = rng.random((n, p), dtype=np.float32)
        scores[np.arange(n), y] += boost
        path = root / f"{name}.parquet"
        pd.DataFrame(scores, columns=classes).assign(id=ids).to_parquet(path, index=False)
        files.append(path)
    labels = root / "labels.parquet"
    pd.DataFrame({"id": ids, "label": np.array(classes)[y]}).to_parquet(labels, index=False)
    return labels, files[0], files[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--p", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = write(Path(tmp), args.n, args.p)
        precompile()  # numba compiles (or loads its cache) outside the timings
        t0 = time.perf_counter()
        local = compare_files(*files, id_column="id")
        local_s = time.perf_counter() - t0
        compare_spark(*files, id_column="id", partitions=1)  # warm-up: JVM start
        timings = {}
        for partitions in (1, 2):
            t0 = time.perf_counter()
            result = compare_spark(*files, id_column="id", partitions=partitions)
            timings[partitions] = time.perf_counter() - t0
            worst = max(abs(result.metrics[k] - v) for k, v in local.metrics.items() if v is not None)
            assert worst < 1e-9, f"spark differs from in-process by {worst}"
        runtime = spark_session()._jvm.java.lang.Runtime.getRuntime()
        heap_mb = (runtime.totalMemory() - runtime.freeMemory()) / 2**20
    print(f"n = {args.n:,} samples x p = {args.p} classes (Parquet, joined on id); results agree to 1e-9")
    print(f"in-process:           {args.n / local_s:12,.0f} samples/s  ({local_s:6.2f} s)")
    for partitions, seconds in timings.items():
        print(
            f"spark, {partitions} partition(s): {args.n / seconds:12,.0f} samples/s  ({seconds:6.2f} s, "
            f"{seconds / local_s:5.1f}x in-process time)"
        )
    print(
        f"driver: Python peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB, "
        f"JVM heap in use {heap_mb:,.0f} MB"
    )


if __name__ == "__main__":
    main()
