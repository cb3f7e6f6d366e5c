"""Builds real MLflow stores with registered models for the gate tests (no mocks)."""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

MODEL = "iris-clf"


def sqlite_uri(folder: Path, name: str = "mlflow.db") -> str:
    """The URI of a new, empty SQLite store at ``folder / name``: a copy of one MLflow created and
    migrated once in this test process (:func:`_empty_store`), where creating each store anew runs
    MLflow's migrations again (about 1.4 CPU-seconds a store). The copy is the file MLflow wrote."""
    path = Path(folder) / name
    if not path.exists():
        shutil.copyfile(_empty_store(), path)
    return f"sqlite:///{path}"


@functools.cache
def _empty_store() -> Path:
    from mlflow import MlflowClient

    folder = Path(tempfile.mkdtemp(prefix="empty-mlflow-store-"))
    atexit.register(shutil.rmtree, folder, True)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri, registry_uri=uri).search_experiments()  # creates and migrates the tables
    return folder / "mlflow.db"


def check_args(candidate: str, data, config, uri: str, *extra) -> tuple:
    """Arguments of `consistency-gate check` on the test model."""
    return (
        "check",
        "--model",
        MODEL,
        "--candidate",
        candidate,
        "--data",
        data,
        "--config",
        config,
        "--tracking-uri",
        uri,
        *extra,
    )


def iris_frames(seed: int = 0):
    from sklearn.datasets import load_iris

    iris = load_iris()
    x = pd.DataFrame(iris.data, columns=["sepal_length", "sepal_width", "petal_length", "petal_width"])
    y = pd.Series(np.array(iris.target_names)[iris.target])
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    return x.iloc[order].reset_index(drop=True), y.iloc[order].reset_index(drop=True)


def build_store(root: Path, uri: str | None = None, predict_fn: str = "predict") -> dict:
    """A SQLite store with model iris-clf: v1 (@champion), v2 (near copy), v3 (poor), and torch model
    iris-torch (v1) with its classes in a version tag. Returns the URIs and the evaluation file.
    ``predict_fn`` is the sklearn versions' pyfunc method (``predict_proba`` for ``--engine spark``)."""
    import mlflow
    import torch
    from mlflow import MlflowClient
    from mlflow.models import infer_signature
    from sklearn.linear_model import LogisticRegression

    from consistency_gate.mlops import tracking

    uri = uri or sqlite_uri(root)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    tracking.use_experiment("training", uri)
    x, y = iris_frames()
    models = [
        LogisticRegression(max_iter=500, C=1.0).fit(x, y),
        LogisticRegression(max_iter=500, C=0.9).fit(x, y),
        LogisticRegression(max_iter=500, C=1.0).fit(
            x[["sepal_width"]].assign(sepal_length=0, petal_length=0, petal_width=0)[x.columns], y
        ),
    ]
    signature = infer_signature(x, models[0].predict_proba(x))
    for model in models:
        with mlflow.start_run():
            mlflow.sklearn.log_model(
                model,
                name="model",
                registered_model_name=MODEL,
                signature=signature,
                pip_requirements=["scikit-learn"],
                pyfunc_predict_fn=predict_fn,
                # loads without skops (MLflow's default, which imports every scikit-learn estimator:
                # about 2.5 CPU-seconds in each gate process a test starts); the pipelines, the demo and
                # the README's examples register in the default format
                serialization_format="cloudpickle",
            )
    client = MlflowClient()
    client.set_registered_model_alias(MODEL, "champion", "1")

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    xt = torch.tensor(x.to_numpy(), dtype=torch.float32)
    yt = torch.tensor(pd.Categorical(y, categories=["setosa", "versicolor", "virginica"]).codes, dtype=torch.long)
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    for _ in range(150):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xt), yt).backward()
        opt.step()
    with mlflow.start_run():
        mlflow.pytorch.log_model(
            net,
            name="model",
            registered_model_name="iris-torch",
            pip_requirements=["torch"],
            input_example=x.to_numpy(dtype="float32")[:2],
        )
    client.set_model_version_tag(
        "iris-torch", "1", "consistency_gate.classes", json.dumps(["setosa", "versicolor", "virginica"])
    )
    data = root / "eval.csv"
    x.assign(label=y, id=[f"s{i}" for i in range(len(x))]).to_csv(data, index=False)
    return {"uri": uri, "data": data, "root": root}
