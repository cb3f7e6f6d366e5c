"""``compare`` end to end against the pandas script a user would write, on the same files.

    python benchmarks/compare_vs_pandas.py [--classes 100] [--rows 100000 1000000] [--repeat 3]
                                           [--formats parquet csv] [--orders in-order shuffled]

Per format (Parquet, CSV), row order of the candidate file (in id order, or shuffled) and size, it
writes a labels file and two prediction files (``--classes`` float32 probability columns, string
ids ``s<i>``), then times alternately, each in a fresh process (imports included, as a CI step
pays them):

- ours: ``compare_files(..., id_column="id", ks=[1, 5])``: every metric, intervals, top-1 and top-5;
- pandas: the files read whole, the candidate aligned by id, then CON, the four flips and top-5
  accuracy and consistency with numpy (fewer metrics than ours, no input checks).

Prints each case's median seconds and the ratio ours / pandas (below 1: ours is faster).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

OURS = """
import sys
from consistency_gate.engines.local import compare_files
compare_files(sys.argv[1], sys.argv[2], sys.argv[3], id_column="id", ks=[1, 5])
"""

PANDAS = """
import sys
import numpy as np
import pandas as pd
read = pd.read_parquet if sys.argv[1].endswith(".parquet") else pd.read_csv
labels, previous, candidate = (read(path) for path in sys.argv[1:4])
previous = previous.set_index("id").reindex(labels["id"])
candidate = candidate.set_index("id").reindex(labels["id"])
classes = np.array(previous.columns)
p, c = previous.to_numpy(), candidate[previous.columns].to_numpy()
y = labels["label"].to_numpy()
right_p, right_c = classes[p.argmax(1)] == y, classes[c.argmax(1)] == y
con = (p.argmax(1) == c.argmax(1)).mean()
flips = {k: np.mean(a & b) for k, (a, b) in {"ctoc": (right_p, right_c), "ctoi": (right_p, ~right_c),
         "itoc": (~right_p, right_c), "itoi": (~right_p, ~right_c)}.items()}
top_p, top_c = np.argpartition(-p, 5, axis=1)[:, :5], np.argpartition(-c, 5, axis=1)[:, :5]
truth = pd.Categorical(y, categories=classes).codes[:, None]
cacc5 = ((top_p == truth).any(1).mean(), (top_c == truth).any(1).mean())
ccon5 = (top_p[:, :, None] == top_c[:, None, :]).any(axis=(1, 2)).mean()
"""


def write_files(folder: Path, rows: int, classes: int, fmt: str, shuffled: bool) -> list[Path]:
    """labels and gen1 in id order, gen2 in id order or shuffled; string ids."""
    names = [f"c{i}" for i in range(classes)]
    rng = np.random.default_rng(0)
    ids = np.array([f"s{i}" for i in range(rows)])
    labels = pa.table({"id": ids, "label": np.array(names)[rng.integers(0, classes, rows)]})
    tables = [labels]
    for generation in (1, 2):
        order = rng.permutation(rows) if shuffled and generation == 2 else np.arange(rows)
        scores = rng.random((rows, classes), dtype=np.float32)
        tables.append(pa.table({"id": ids[order], **{c: scores[order, i] for i, c in enumerate(names)}}))
    paths = [folder / f"{name}.{fmt}" for name in ("labels", "gen1", "gen2")]
    for path, table in zip(paths, tables, strict=True):
        if fmt == "parquet":
            pq.write_table(table, path)
        else:
            pacsv.write_csv(table, path)
    return paths


def _seconds(script: str, paths: list[Path]) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", script, *map(str, paths)], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed: {proc.stderr.strip().splitlines()[-1]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--formats", nargs="+", default=["parquet", "csv"], choices=["parquet", "csv"])
    parser.add_argument("--orders", nargs="+", default=["in-order", "shuffled"], choices=["in-order", "shuffled"])
    args = parser.parse_args()
    print(f"{args.classes} classes; median of {args.repeat} alternating runs, each in a fresh process")
    print(f"{'format':>8} {'order':>9} {'rows':>10}  {'ours (s)':>8}  {'pandas (s)':>10}  {'ratio':>6}")
    with tempfile.TemporaryDirectory(prefix="compare-vs-pandas-") as tmp:
        for fmt in args.formats:
            for order in args.orders:
                for rows in args.rows:
                    paths = write_files(Path(tmp), rows, args.classes, fmt, order == "shuffled")
                    times: dict[str, list[float]] = {"ours": [], "pandas": []}
                    for _ in range(args.repeat):
                        times["ours"].append(_seconds(OURS, paths))
                        times["pandas"].append(_seconds(PANDAS, paths))
                    ours, pandas = statistics.median(times["ours"]), statistics.median(times["pandas"])
                    print(f"{fmt:>8} {order:>9} {rows:>10,}  {ours:>8.2f}  {pandas:>10.2f}  {ours / pandas:>6.2f}")


if __name__ == "__main__":
    main()
