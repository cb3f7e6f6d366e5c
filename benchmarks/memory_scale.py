"""How large a population one machine's memory update holds: the time and the peak resident memory of a gate's
update of the memory of what users saw (``consistency_gate.core.memory``), from a table on disk to a table on
disk, for N ids and P classes.

Per size it writes a memory table of N ids (as a previous gate would have), then in a process of its own
measures what a gate does with it: read the table, add the ids it lacks (5% new), multiply in a generation's
answers for every id, write the table back. The answers are random (the update's cost does not depend on
them). It prints the seconds and the peak resident set size of that process (``ru_maxrss``), against the
target of 2 GB for 10 million ids.

    python benchmarks/memory_scale.py [--ids 1000000 10000000] [--classes 10]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from consistency_gate.core.memory import Memory

GOOD = 0.8  # each generation's accuracy: its confusion matrix has GOOD on the diagonal


def _confusion(classes: int) -> np.ndarray:
    off = (1 - GOOD) / (classes - 1)
    return np.full((classes, classes), off) + np.eye(classes) * (GOOD - off)


def write_table(path: Path, ids: int, classes: int) -> None:
    """A memory of ``ids`` ids as a previous gate leaves it."""
    rng = np.random.default_rng(0)
    names = np.char.add("item-", np.arange(ids).astype(str)).astype(object)
    memory = Memory.first([f"c{i}" for i in range(classes)], names, rng.integers(0, classes, ids), _confusion(classes))
    memory.write(path)


def one_update(path: Path, ids: int, classes: int) -> dict:
    """What a gate does with the table: read, extend by 5% new ids, update every id, write; in this process."""
    start = time.perf_counter()
    memory = Memory.read(path)
    rng = np.random.default_rng(1)
    everyone = np.char.add("item-", np.arange(int(ids * 1.05)).astype(str)).astype(object)
    matrix = _confusion(classes)
    memory = memory.extended(everyone, rng.integers(0, classes, len(everyone)), matrix)
    memory, changed = memory.update(everyone, rng.integers(0, classes, len(everyone)), matrix, 2.0)
    size = memory.write(path)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes
    return {"seconds": time.perf_counter() - start, "peak_bytes": peak, "rows": len(memory), "bytes": size,
            "changed": changed}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_update(Path(args.child[0]), int(args.child[1]), int(args.child[2]))))
        return
    print("| ids | classes | table on disk | update: seconds | peak resident memory | within 2 GB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for ids in args.ids:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "memory.parquet"
            write_table(path, ids, args.classes)
            child = [sys.executable, __file__, "--child", str(path), str(ids), str(args.classes)]
            out = json.loads(subprocess.run(child, capture_output=True, text=True, check=True).stdout)
        peak = out["peak_bytes"] / 2**30
        print(f"| {out['rows']:,} | {args.classes} | {out['bytes'] / 2**20:,.0f} MB | {out['seconds']:.1f} | "
              f"{peak:.2f} GB | {'yes' if peak <= 2 else 'no'} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
