"""The memory's update on Spark (``engines.spark.update_memory``: joins, no collect) against the same update in
one process (``Memory.extended`` then ``Memory.update``), on the same table and answers, for N ids of P classes.

Per size it writes a memory table of N ids and a generation's answers for 1.05 N ids (5% new), then times,
alternating (median of ``--repeats``), the in-process update from the table on disk to a table on disk, and the
Spark job from the same files to a Parquet folder (local mode, every core). The first Spark run is a warm-up
(JVM start), not timed. It prints the seconds of each and their ratio, and checks that both tables hold the
same answers users see.

    python benchmarks/memory_spark.py [--ids 1000000 4000000] [--classes 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from memory_scale import confusion_of

from consistency_gate.core.memory import Memory
from consistency_gate.engines.spark import MEMORY_ADDED, MEMORY_CHANGED, spark_session, update_memory


def write_inputs(folder: Path, ids: int, classes: int) -> None:
    """The memory of ``ids`` ids, and (id, answer) files: the model users saw and the new generation."""
    rng = np.random.default_rng(0)
    names = np.char.add("item-", np.arange(int(ids * 1.05)).astype(str))
    Memory.first([f"c{i}" for i in range(classes)], names[:ids], rng.integers(0, classes, ids),
                 confusion_of(classes)).write(folder / "memory.parquet")  # fmt: skip
    for name in ("seen", "answers"):
        answers = rng.integers(0, classes, len(names)).astype(np.int32)
        pd.DataFrame({"id": names, "answer": answers}).to_parquet(folder / f"{name}.parquet", index=False)


def in_process(folder: Path, classes: int) -> list[str | None]:
    memory = Memory.read(folder / "memory.parquet")
    seen, answers = (pd.read_parquet(folder / f"{name}.parquet") for name in ("seen", "answers"))
    matrix = confusion_of(classes)
    memory = memory.extended(seen["id"], seen["answer"].to_numpy(), matrix)
    memory, _ = memory.update(answers["id"], answers["answer"].to_numpy(), matrix, 2.0, copy=False)
    memory.write(folder / "local.parquet")
    return memory.seen(answers["id"].iloc[:1000])


def on_spark(folder: Path, classes: int) -> list[str | None]:
    spark = spark_session()
    table, seen, answers = (spark.read.parquet(str(folder / f"{n}.parquet")) for n in ("memory", "seen", "answers"))
    matrix = confusion_of(classes)
    names = [f"c{i}" for i in range(classes)]
    updated = update_memory(spark, table, seen, answers, names, (matrix, matrix), 2.0)
    updated.drop(MEMORY_CHANGED, MEMORY_ADDED).write.mode("overwrite").parquet(str(folder / "spark"))
    return Memory.read(folder / "spark", names).seen(pd.read_parquet(folder / "answers.parquet")["id"].iloc[:1000])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(
        "| ids | classes | in one process: s | on Spark (local, every core): s | Spark / one process | same answers |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for ids in args.ids:
        with tempfile.TemporaryDirectory() as name:
            folder = Path(name)
            write_inputs(folder, ids, args.classes)
            on_spark(folder, args.classes)  # warm-up: the JVM, the first job's planning
            times: dict[str, list[float]] = {"local": [], "spark": []}
            answers = {}
            for _ in range(args.repeats):  # alternating, so that both see the same machine
                for key, run in (("local", in_process), ("spark", on_spark)):
                    start = time.perf_counter()
                    answers[key] = run(folder, args.classes)
                    times[key].append(time.perf_counter() - start)
        local, spark = statistics.median(times["local"]), statistics.median(times["spark"])
        same = "yes" if answers["local"] == answers["spark"] else "no"
        print(f"| {int(ids * 1.05):,} | {args.classes} | {local:.1f} | {spark:.1f} | {spark / local:.2f} | {same} |",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
