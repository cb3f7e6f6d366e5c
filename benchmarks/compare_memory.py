"""Peak memory of ``compare`` on files in id order: constant in the number of rows?

    python benchmarks/compare_memory.py [--classes 100] [--rows 100000 1000000] [--formats parquet csv] [--shuffled]
                                        [--one-row-group | --row-group-rows N] [--dtype float32|float64]

Writes a labels file and two prediction files (``--classes`` probability columns, float32, rows in
id order) per size and format into a temporary folder, then runs ``compare_files`` (all metrics,
top-1 and top-5) on each in a fresh process and reads its peak resident memory
(``ru_maxrss``). Prints each case's peak RSS and time, and per format the ratio of the largest
size's peak to the smallest's: streaming in chunks keeps it near 1 (the target is at most 1.3 from
100,000 to 1,000,000 rows). Parquet is read by row batches with pyarrow's ``pre_buffer`` off:
with it on, pyarrow keeps each row group's read buffers and the peak grew 2.2x over the same range.
``--one-row-group`` writes each Parquet file as ``pq.write_table`` and ``DataFrame.to_parquet`` do by default
(one row group of up to 1,048,576 rows), ``--row-group-rows N`` in row groups of N rows; ``--dtype`` the
scores' type. ``--shuffled`` writes the candidate's rows in a random order instead: a file whose scores pass 256 MB is
then reordered through a temporary file, and the peak stays about that of files in id order. The script
prints the growth of the peak per added row either way; from 100,000 rows most of it is the readers
reaching their steady state (from 1,000,000 to 3,000,000 shuffled rows it is about 16 bytes a row).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

MEASURE = """
import resource, sys
from consistency_gate.engines.local import compare_files
compare_files(sys.argv[1], sys.argv[2], sys.argv[3], id_column="id", ks=[1, 5])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def write_files(
    folder: Path,
    rows: int,
    classes: int,
    fmt: str,
    shuffled: bool = False,
    seed: int = 0,
    one_group: bool = False,
    group_rows: int | None = None,
    dtype: str = "float32",
) -> list[Path]:
    """labels, gen1, gen2 in id order (gen2 in a random order with ``shuffled``), scores of ``dtype``,
    written in slices of 100,000 rows (the writer's memory stays small); a Parquet file in row groups of
    100,000 rows, of ``group_rows``, or with ``one_group`` as ``DataFrame.to_parquet`` and
    ``pq.write_table`` write by default: one row group of up to 1,048,576 rows."""
    names = [f"c{i}" for i in range(classes)]
    rng = np.random.default_rng(seed)
    order = rng.permutation(rows) if shuffled else np.arange(rows)
    paths = [folder / f"{name}_{rows}.{fmt}" for name in ("labels", "gen1", "gen2")]
    writers: list = [None, None, None]
    for start in range(0, rows, 100_000):
        ids = np.arange(start, min(rows, start + 100_000))
        tables = [pa.table({"id": ids, "label": np.array(names)[rng.integers(0, classes, len(ids))]})]
        for generation_ids in (ids, order[start : start + len(ids)]):
            scores = rng.random((len(ids), classes), dtype=np.float32).astype(dtype)
            tables.append(pa.table({"id": generation_ids, **{c: scores[:, i] for i, c in enumerate(names)}}))
        for i, table in enumerate(tables):
            if writers[i] is None:
                writers[i] = (
                    pq.ParquetWriter(paths[i], table.schema)
                    if fmt == "parquet"
                    else pacsv.CSVWriter(paths[i], table.schema)
                )
            writers[i].write_table(table)
    for writer in writers:
        writer.close()
    if (one_group or group_rows) and fmt == "parquet":  # the writer's default row group: up to 1,048,576 rows
        # in a process of its own: Linux keeps a process's peak RSS across fork and exec, so the measuring
        # child would start at this process's peak
        size = f"row_group_size={group_rows}" if group_rows else ""
        rewrite = (
            f"import sys, pyarrow.parquet as pq\nfor p in sys.argv[1:]: pq.write_table(pq.read_table(p), p, {size})"
        )
        subprocess.run([sys.executable, "-c", rewrite, *map(str, paths)], check=True)
    return paths


def peak_rss_mb(paths: list[Path]) -> tuple[float, float]:
    """Peak resident memory (MB) and seconds of ``compare_files`` on the files, in a fresh process."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", MEASURE, *map(str, paths)], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"compare failed: {proc.stderr.strip().splitlines()[-1]}")
    return int(proc.stdout.strip().splitlines()[-1]) / 1024, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--formats", nargs="+", default=["parquet", "csv"], choices=["parquet", "csv"])
    parser.add_argument("--shuffled", action="store_true", help="the candidate's rows in a random order")
    parser.add_argument(
        "--one-row-group", action="store_true", help="Parquet as DataFrame.to_parquet writes it: one row group"
    )
    parser.add_argument("--row-group-rows", type=int, default=None, help="Parquet in row groups of this many rows")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32", help="the scores' type")
    args = parser.parse_args()
    order = "candidate shuffled" if args.shuffled else "ids in order"
    with tempfile.TemporaryDirectory(prefix="compare-memory-") as tmp:
        groups = (
            "one row group per file" if args.one_row_group else f"row groups of {args.row_group_rows or 100_000:,} rows"
        )
        print(
            f"compare_files, {order}, {args.classes} {args.dtype} classes, {groups}, top-1 and top-5; "
            "peak RSS of a fresh process"
        )
        for fmt in args.formats:
            peaks = []
            for rows in args.rows:
                paths = write_files(
                    Path(tmp), rows, args.classes, fmt, args.shuffled, one_group=args.one_row_group,
                    group_rows=args.row_group_rows, dtype=args.dtype,
                )  # fmt: skip
                peak, seconds = peak_rss_mb(paths)
                peaks.append(peak)
                print(f"  {fmt:8s} {rows:>10,} rows  peak RSS {peak:8.0f} MB  {seconds:6.1f} s")
                for path in paths:
                    path.unlink()
            if len(peaks) < 2:  # one size: no growth to print
                continue
            added = (peaks[-1] - peaks[0]) * 2**20 / (args.rows[-1] - args.rows[0])
            print(
                f"  {fmt:8s} peak RSS ratio {args.rows[-1]:,} / {args.rows[0]:,} rows: {peaks[-1] / peaks[0]:.2f}"
                f" ({added:,.0f} bytes per added row)"
            )


if __name__ == "__main__":
    main()
