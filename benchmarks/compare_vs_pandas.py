"""``compare`` end to end against the pandas script a user would write, on the same files.

    python benchmarks/compare_vs_pandas.py [--classes 100] [--rows 400000 1000000] [--repeat 3]
                                           [--formats parquet csv] [--orders in-order shuffled]
                                           [--ids int str] [--peers plain top5] [--gate]

Per format (Parquet, CSV), row order of the candidate file (in id order, or shuffled), id type
(integers, or text ``s<i>``) and size, it writes a labels file and two prediction files
(``--classes`` float32 probability columns), then times alternately, each in a fresh process
(imports included, as a CI step pays them):

- ours: the command line, ``consistency-gate compare --id-column id --k 1 --k 5 --format json``: every
  metric with its interval and bounds, top-1 and top-5, every value checked, the report printed (the
  command, not ``compare_files``: only the report's intervals import scipy);
- plain (the headline peer): the 20-line script a user writes: the three files read whole with
  pandas, ``set_index("id")``, the generations aligned to the labels, ``idxmax``, CON and the four
  flips (far fewer metrics than ours, no input checks);
- top5: the same plus top-5 accuracy and consistency with ``argpartition`` and a 5x5 broadcast;
- with ``--gate``, the prediction-file gate too: ``consistency-gate check --labels ... --previous-predictions
  ... --candidate-predictions ... --id-column id`` with the default rules and no tracking store (exit 0 or
  1), against the first peer.

Prints each case's median seconds, the ratios ours / peer (below 1: ours is faster), and where our
time goes (in this process, imports paid: ids aligned, scores read and checked, the whole compare).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

PLAIN = """
import sys
import pandas as pd
read = pd.read_parquet if sys.argv[1].endswith(".parquet") else pd.read_csv
labels, previous, candidate = (read(path).set_index("id") for path in sys.argv[1:4])
previous, candidate = previous.loc[labels.index], candidate.loc[labels.index]
y = labels["label"]
pred_p, pred_c = previous.idxmax(axis=1), candidate.idxmax(axis=1)
right_p, right_c = (pred_p == y).to_numpy(), (pred_c == y).to_numpy()
con = (pred_p == pred_c).mean()
flips = {
    "ctoc": (right_p & right_c).mean(),
    "ctoi": (right_p & ~right_c).mean(),
    "itoc": (~right_p & right_c).mean(),
    "itoi": (~right_p & ~right_c).mean(),
}
print(con, flips)
"""

TOP5 = """
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

PEERS = {"plain": PLAIN, "top5": TOP5}


def write_files(folder: Path, rows: int, classes: int, fmt: str, shuffled: bool, ids: str = "str") -> list[Path]:
    """labels and gen1 in id order, gen2 in id order or shuffled; integer or text ids."""
    names = [f"c{i}" for i in range(classes)]
    rng = np.random.default_rng(0)
    keys = np.arange(rows) * 7 + 3 if ids == "int" else np.array([f"s{i}" for i in range(rows)])
    labels = pa.table({"id": keys, "label": np.array(names)[rng.integers(0, classes, rows)]})
    tables = [labels]
    for generation in (1, 2):
        order = rng.permutation(rows) if shuffled and generation == 2 else np.arange(rows)
        scores = rng.random((rows, classes), dtype=np.float32)
        tables.append(pa.table({"id": keys[order], **{c: scores[order, i] for i, c in enumerate(names)}}))
    paths = [folder / f"{name}.{fmt}" for name in ("labels", "gen1", "gen2")]
    for path, table in zip(paths, tables, strict=True):
        if fmt == "parquet":
            pq.write_table(table, path)
        else:
            pacsv.write_csv(table, path)
    return paths


def _ours(paths: list[Path]) -> list[str]:
    """The command, as a CI step runs it."""
    labels, previous, candidate = map(str, paths)
    files = ["--labels", labels, "--previous", previous, "--candidate", candidate]
    options = ["--id-column", "id", "--k", "1", "--k", "5", "--format", "json"]
    return [sys.executable, "-m", "consistency_gate", "compare", *files, *options]


def _gate(paths: list[Path]) -> list[str]:
    """The prediction-file gate, as a CI step runs it (default rules; no tracking store: nothing logged)."""
    labels, previous, candidate = map(str, paths)
    files = ["--labels", labels, "--previous-predictions", previous, "--candidate-predictions", candidate]
    return [sys.executable, "-m", "consistency_gate", "check", *files, "--id-column", "id"]


def _peer(script: str, paths: list[Path]) -> list[str]:
    return [sys.executable, "-c", script, *map(str, paths)]


def _seconds(command: list[str], passed: tuple[int, ...] = (0,)) -> float:
    """Seconds of ``command``, in a fresh process without a tracking store; ``passed``: its exit codes
    that are no error (a gate exits 1 when it fails)."""
    start = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    if proc.returncode not in passed:
        sys.exit(f"failed: {proc.stderr.strip().splitlines()[-1]}")
    return time.perf_counter() - start


def split(paths: list[Path]) -> str:
    """Where our time goes, in this process (imports already paid): the ids aligned, the scores of
    both files read and checked one after the other, and the whole compare, whose reading overlaps
    its metrics (a thread reads each file's next chunk)."""
    from consistency_gate.engines.local import compare_files
    from consistency_gate.io import matrices
    from consistency_gate.io import predictions as io
    from consistency_gate.io.alignment import row_order

    sources = [io.inspect_prediction_file(path, "id") for path in paths[1:]]
    sources = [replace(s, classes=tuple(sorted(s.classes))) for s in sources]  # the canonical class order
    start = time.perf_counter()
    order = row_order(paths[0], sources, "id")
    aligned = time.perf_counter()
    for source, alignment in zip(sources, order, strict=True):
        for _ in matrices.score_chunks(source, alignment=alignment):
            pass
    read = time.perf_counter()
    compare_files(*paths, id_column="id", ks=[1, 5])
    whole = time.perf_counter() - read
    return f"ids {aligned - start:.2f} s, scores {read - aligned:.2f} s; compare in all {whole:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--rows", type=int, nargs="+", default=[400_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--formats", nargs="+", default=["parquet", "csv"], choices=["parquet", "csv"])
    parser.add_argument("--orders", nargs="+", default=["in-order", "shuffled"], choices=["in-order", "shuffled"])
    parser.add_argument("--ids", nargs="+", default=["int", "str"], choices=["int", "str"])
    parser.add_argument("--peers", nargs="+", default=["plain", "top5"], choices=list(PEERS))
    parser.add_argument("--gate", action="store_true", help="also time the prediction-file gate (check)")
    args = parser.parse_args()
    print(f"{args.classes} classes; median of {args.repeat} alternating runs, each in a fresh process")
    peers = "  ".join(f"{peer + ' (s)':>10}  {'ratio':>6}" for peer in args.peers)
    gate = f"  {'check (s)':>9}  {'ratio':>6}" if args.gate else ""
    print(f"{'format':>8} {'order':>9} {'ids':>4} {'rows':>10}  {'ours (s)':>8}  {peers}{gate}  where ours goes")
    with tempfile.TemporaryDirectory(prefix="compare-vs-pandas-") as tmp:
        for fmt in args.formats:
            for order in args.orders:
                for ids in args.ids:
                    for rows in args.rows:
                        paths = write_files(Path(tmp), rows, args.classes, fmt, order == "shuffled", ids)
                        times: dict[str, list[float]] = {"ours": [], "check": [], **{p: [] for p in args.peers}}
                        for _ in range(args.repeat):
                            times["ours"].append(_seconds(_ours(paths)))
                            for peer in args.peers:
                                times[peer].append(_seconds(_peer(PEERS[peer], paths)))
                            if args.gate:
                                times["check"].append(_seconds(_gate(paths), passed=(0, 1)))
                        ours = statistics.median(times["ours"])
                        shown = "  ".join(
                            f"{statistics.median(times[p]):>10.2f}  {ours / statistics.median(times[p]):>6.2f}"
                            for p in args.peers
                        )
                        if args.gate:
                            check, first = statistics.median(times["check"]), statistics.median(times[args.peers[0]])
                            shown += f"  {check:>9.2f}  {check / first:>6.2f}"
                        print(
                            f"{fmt:>8} {order:>9} {ids:>4} {rows:>10,}  {ours:>8.2f}  {shown}  {split(paths)}",
                            flush=True,
                        )


if __name__ == "__main__":
    main()
