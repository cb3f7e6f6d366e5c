"""Peak memory of a registry gate against the prediction-file gate on the same rows.

    python benchmarks/gate_memory.py [--rows 200000] [--features 20] [--workdir DIR]

Two scikit-learn generations (logistic regressions on generated data) are registered in a SQLite store and
gated by `consistency-gate check --model ... --data eval.parquet`; their predictions on the same rows are
written as prediction files and gated by `consistency-gate check --labels --previous-predictions
--candidate-predictions`, logged to the same store. Each command runs in a fresh process; its peak resident
memory is the process's own (``ru_maxrss`` of the child), measured twice, alternating. Target: the
registry gate within 1.5x the prediction-file gate's peak.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd


def prepare(folder: Path, rows: int, features: int) -> dict[str, str]:
    """The store with v1 (@champion) and v2, the evaluation file, and both generations' prediction files."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.models import infer_signature
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression

    x, y = make_classification(rows, features, n_informative=8, n_classes=4, random_state=0)
    frame = pd.DataFrame(x.astype(np.float32), columns=[f"f{i}" for i in range(features)])
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    mlflow.set_experiment("training")
    names = [f"c{c}" for c in range(4)]
    labels = np.array(names)[y]
    fit = slice(0, 20_000)
    for version, c in enumerate((1.0, 0.05), start=1):
        model = LogisticRegression(C=c, max_iter=300).fit(frame.iloc[fit], labels[fit])
        with mlflow.start_run():
            mlflow.sklearn.log_model(
                model, name="model", registered_model_name="mem", pip_requirements=["scikit-learn"],
                signature=infer_signature(frame.head(), model.predict_proba(frame.head())),
                serialization_format="cloudpickle",
            )  # fmt: skip
        scores = pd.DataFrame(model.predict_proba(frame), columns=model.classes_)
        scores.assign(id=np.arange(rows).astype(str)).to_parquet(folder / f"gen{version}.parquet", index=False)
    MlflowClient().set_registered_model_alias("mem", "champion", "1")
    ids = np.arange(rows).astype(str)
    frame.assign(label=labels, id=ids).to_parquet(folder / "eval.parquet", index=False)
    pd.DataFrame({"id": ids, "label": labels}).to_parquet(folder / "labels.parquet", index=False)
    return {"uri": uri, "folder": str(folder)}


def peak_mb(args: list[str]) -> tuple[float, float]:
    """A command's peak resident memory (MB) and wall time (s), in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "consistency_gate", *args], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if after <= before:  # ru_maxrss of children is the largest so far: a smaller process does not show
        raise RuntimeError("run the larger command first or in its own benchmark process")
    return after / 1024, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--which", choices=["registry", "files"], default=None, help="one command (internal)")
    args = parser.parse_args()
    folder = args.workdir or Path(tempfile.mkdtemp(prefix="gate-memory-"))
    if args.which is None:  # each measurement in a benchmark process of its own: ru_maxrss only grows
        store = prepare(folder, args.rows, args.features)
        print(f"{args.rows:,} rows x {args.features} features, store {store['uri']}")
        peaks: dict[str, list[float]] = {"registry": [], "files": []}
        for _ in range(2):
            for which in ("registry", "files"):
                command = [sys.executable, __file__, "--which", which, "--workdir", str(folder)]
                out = subprocess.run(command, capture_output=True, text=True, check=True).stdout.split()
                peaks[which].append(float(out[0]))
                print(f"  {which}: peak {float(out[0]):.0f} MB in {float(out[1]):.1f} s", flush=True)
        registry, files = (statistics.median(peaks[k]) for k in ("registry", "files"))
        print(f"registry gate {registry:.0f} MB, prediction-file gate {files:.0f} MB: {registry / files:.2f}x")
        return
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    if args.which == "registry":
        command = ["check", "--model", "mem", "--candidate", "2", "--data", str(folder / "eval.parquet")]
        command += ["--id-column", "id", "--tracking-uri", uri, "--quiet"]
    else:
        command = ["check", "--labels", str(folder / "labels.parquet"), "--id-column", "id"]
        command += ["--previous-predictions", str(folder / "gen1.parquet")]
        command += ["--candidate-predictions", str(folder / "gen2.parquet"), "--tracking-uri", uri, "--quiet"]
    mb, seconds = peak_mb(command)
    print(mb, seconds)


if __name__ == "__main__":
    main()
