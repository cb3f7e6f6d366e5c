"""How large a population one machine's memory update holds: the time and the peak resident memory of a gate's
update of the memory of what users saw (``consistency_gate.core.memory``), from a table and a population on
disk to a table on disk, for N ids and P classes.

Per size it writes a memory table of N ids (as a previous gate would have) and a population of 1.05 N ids (5%
new) with 8 float features, then in a process of its own measures what a gate does with them: read the table,
stream the population through :class:`~consistency_gate.ensembles.memory.Population` (200,000 rows a batch)
and score each batch (a linear model in numpy, standing in for the candidate: its cost is the model's, not the
memory's), add the ids the memory lacks, multiply in the answers for every id, write the table back. It prints
the seconds and the peak resident set size of that process (``ru_maxrss``), against the target of 2 GB for 10
million ids.

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
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from consistency_gate.core.ids import as_text
from consistency_gate.core.memory import ANSWER, Memory
from consistency_gate.ensembles.memory import Population

GOOD = 0.8  # each generation's accuracy: its confusion matrix has GOOD on the diagonal
FEATURES = 8  # the population's columns besides the id


def confusion_of(classes: int) -> np.ndarray:
    """A generation's confusion matrix: GOOD on the diagonal, the rest shared evenly."""
    off = (1 - GOOD) / (classes - 1)
    return np.full((classes, classes), off) + np.eye(classes) * (GOOD - off)


def _names(start: int, stop: int) -> pa.Array:
    return as_text(np.char.add("item-", np.arange(start, stop).astype(str)))


def write_inputs(folder: Path, ids: int, classes: int) -> None:
    """A memory of ``ids`` ids as a previous gate leaves it, and a population of 5% more, in row groups."""
    rng = np.random.default_rng(0)
    memory = Memory.first([f"c{i}" for i in range(classes)], _names(0, ids), rng.integers(0, classes, ids),
                          confusion_of(classes))  # fmt: skip
    memory.write(folder / "memory.parquet")
    del memory
    schema = pa.schema([("id", pa.string()), *((f"x{j}", pa.float32()) for j in range(FEATURES))])
    with pq.ParquetWriter(folder / "population.parquet", schema) as writer:
        for start in range(0, int(ids * 1.05), 1_000_000):
            stop = min(start + 1_000_000, int(ids * 1.05))
            features = rng.standard_normal((stop - start, FEATURES), dtype=np.float32)
            writer.write_table(pa.Table.from_arrays([_names(start, stop), *features.T], schema=schema))


def one_update(folder: Path, classes: int) -> dict:
    """What a gate does with them: read the table, stream and score the population, extend, update, write."""
    start = time.perf_counter()
    memory = Memory.read(folder / "memory.parquet")
    weights = np.random.default_rng(1).standard_normal((FEATURES, classes)).astype(np.float32)
    features = pd.DataFrame({"id": ["item-0"], **{f"x{j}": [0.0] for j in range(FEATURES)}})
    ids, answers = [], []
    for batch, frame in Population(folder / "population.parquet", "id", features).batches():
        ids.append(batch)
        answers.append((frame.drop(columns="id").to_numpy(dtype=np.float32) @ weights).argmax(axis=1).astype(ANSWER))
    everyone, answers = pa.concat_arrays(ids), np.concatenate(answers)
    del ids
    new = memory.find(everyone) < 0
    matrix = confusion_of(classes)
    block = Memory.first(memory.classes, everyone.filter(pa.array(new)), answers[new], matrix)
    block, changed = block.update(everyone.filter(pa.array(new)), answers[new], matrix, 2.0, copy=False)
    memory, known = memory.update(everyone.filter(pa.array(~new)), answers[~new], matrix, 2.0, copy=False)
    del everyone, answers
    memory, changed = memory.merged(block), changed + known  # as build_memory: the beliefs held once
    size = memory.write(folder / "memory.parquet")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes
    return {"seconds": time.perf_counter() - start, "peak_bytes": peak, "rows": len(memory), "bytes": size,
            "changed": changed}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_update(Path(args.child[0]), int(args.child[1]))))
        return
    print("| ids | classes | table on disk | update: seconds | peak resident memory | within 2 GB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for ids in args.ids:
        with tempfile.TemporaryDirectory() as folder:
            write_inputs(Path(folder), ids, args.classes)
            child = [sys.executable, __file__, "--child", folder, str(args.classes)]
            out = json.loads(subprocess.run(child, capture_output=True, text=True, check=True).stdout)
        peak = out["peak_bytes"] / 2**30
        print(f"| {out['rows']:,} | {args.classes} | {out['bytes'] / 2**20:,.0f} MB | {out['seconds']:.1f} | "
              f"{peak:.2f} GB | {'yes' if peak <= 2 else 'no'} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
