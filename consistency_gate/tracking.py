"""Logging a gate run to MLflow so a reviewer can read it in the MLflow UI."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pandas as pd

from consistency_gate import plots

EXPERIMENT_PREFIX = "consistency-gate"


def experiment_name(model: str) -> str:
    return f"{EXPERIMENT_PREFIX}/{model}"


def experiment_id(name: str, tracking_uri: str) -> str:
    """The id of experiment ``name``, created if needed; the active experiment is left as it is.

    On a local SQLite store, a new experiment keeps its artifacts in ``mlartifacts/`` beside
    the database file (MLflow's default would be the current directory).
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    experiment = mlflow.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    location = None
    if tracking_uri.startswith("sqlite:///"):
        folder = Path(tracking_uri.removeprefix("sqlite:///")).expanduser().resolve().parent
        location = (folder / "mlartifacts").as_uri()
    try:
        return mlflow.create_experiment(name, artifact_location=location)
    except MlflowException as exc:  # gates started together: another one created it first
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return mlflow.get_experiment_by_name(name).experiment_id


def use_experiment(name: str, tracking_uri: str) -> None:
    """Make ``name`` the active experiment, creating it as :func:`experiment_id` does."""
    import mlflow

    mlflow.set_experiment(experiment_id=experiment_id(name, tracking_uri))


def mlflow_metric_name(key: str) -> str:
    """MLflow metric names cannot hold '@': ``ccon@5`` is logged as ``ccon_at_5``."""
    return key.replace("@", "_at_")


def log_metrics(metrics: dict[str, float | None], prefix: str = "") -> None:
    import mlflow

    mlflow.log_metrics({prefix + mlflow_metric_name(k): float(v) for k, v in metrics.items() if v is not None})


def log_json(payload: object, artifact_file: str) -> None:
    import mlflow

    mlflow.log_text(json.dumps(payload, indent=2, default=str), artifact_file)


def log_rules(rule_rows: list[dict]) -> None:
    import mlflow

    mlflow.log_table(pd.DataFrame(rule_rows), artifact_file="gate/rules.json")


def log_samples(samples: pd.DataFrame) -> None:
    import mlflow

    mlflow.log_table(samples.reset_index(drop=True), artifact_file="gate/flips.json")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "flips.csv"
        samples.to_csv(path, index=False)
        mlflow.log_artifact(str(path), artifact_path="gate")


def log_plots(samples: pd.DataFrame, flip_counts: tuple[int, int, int, int], metrics: dict, ks: list[int]) -> None:
    import matplotlib.pyplot as plt
    import mlflow

    figures = {
        "flips_per_class.png": plots.flips_per_class(samples),
        "correctness_matrix.png": plots.correctness_matrix(*flip_counts),
        "topk_curve.png": plots.topk_curve(metrics, ks),
    }
    with tempfile.TemporaryDirectory() as tmp:  # one upload for the three files
        for name, fig in figures.items():
            fig.savefig(Path(tmp) / name)
            plt.close(fig)
        mlflow.log_artifacts(tmp, artifact_path="gate/plots")
