"""A pipeline step: retrain a generation, register it, and gate it with the Python API.

    python pipelines/retrain_and_gate.py train --workdir DIR [--seed S]   # train + register only
    python pipelines/retrain_and_gate.py gate  --workdir DIR              # gate the latest version
    python pipelines/retrain_and_gate.py all   --workdir DIR [--promote]  # both (the default)

It trains on scikit-learn's bundled digits so it runs anywhere; replace `train_generation`
with your own training. The store is `DIR/mlflow.db` unless MLFLOW_TRACKING_URI is set. Training
never sets an alias: with `--promote` the gate moves @champion to the version that passed, so the
first generation becomes @champion only when it passes the single-model rules (e.g. accuracy). The
exit code is the gate's.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

MODEL = "digits-classifier"


def tracking_uri(workdir: Path) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(workdir / 'mlflow.db').resolve()}"


def train_generation(workdir: Path, seed: int) -> str:
    """Retrain on a fresh resample, register a new version, write eval.csv; returns the version."""
    import mlflow
    import numpy as np
    import pandas as pd
    import sklearn
    from mlflow.models import infer_signature
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from consistency_gate.mlops import tracking

    workdir.mkdir(parents=True, exist_ok=True)
    uri = tracking_uri(workdir)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    digits = load_digits()
    x = pd.DataFrame(digits.data, columns=[f"px{i}" for i in range(digits.data.shape[1])])
    y = pd.Series(digits.target).map(lambda d: f"digit-{d}")
    x_pool, x_eval, y_pool, y_eval = train_test_split(x, y, test_size=600, random_state=0, stratify=y)
    rows = np.random.default_rng(seed).choice(len(x_pool), size=len(x_pool) // 2, replace=False)
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=300, C=0.05))
    model.fit(x_pool.iloc[rows], y_pool.iloc[rows])
    tracking.use_experiment(f"{MODEL}-training", uri)
    with mlflow.start_run(run_name=f"retrain seed {seed}"):
        info = mlflow.sklearn.log_model(
            model,
            name="model",
            registered_model_name=MODEL,
            signature=infer_signature(x_eval, model.predict_proba(x_eval)),
            pip_requirements=[f"scikit-learn=={sklearn.__version__}"],
        )
    x_eval.assign(label=y_eval.to_numpy(), id=[f"eval-{i:04d}" for i in range(len(x_eval))]).to_csv(
        workdir / "eval.csv", index=False
    )
    return str(info.registered_model_version)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", nargs="?", choices=["train", "gate", "all"], default="all")
    parser.add_argument("--workdir", type=Path, default=Path("gate-work"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--config", default=None)
    parser.add_argument("--report", default=None)
    parser.add_argument("--promote", action="store_true")
    args = parser.parse_args(argv)
    if args.step in ("train", "all"):
        print(f"registered {MODEL} v{train_generation(args.workdir, args.seed)}")
    if args.step == "train":
        return 0
    from consistency_gate.errors import GateError
    from consistency_gate.gate.run import run_gate
    from consistency_gate.report.verdict import verdict_table

    try:
        result = run_gate(
            MODEL,
            args.workdir / "eval.csv",
            id_column="id",
            config=args.config,
            tracking_uri=tracking_uri(args.workdir),
            report_path=args.report,
            promote=args.promote,
        )
    except GateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(verdict_table(result.to_dict()))
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
