"""Gradient-boosted trees registered as a credit-risk team does (no mocks): two monthly generations of
a LightGBM or XGBoost classifier, on float32 frames with gaps (NaN), an integer category and a pandas
``category`` column, logged with MLflow's own flavors (``infer_signature`` and an input example)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd

# how a team logs a classifier: (flavor module, what is logged)
LOGGING_PATHS = (
    ("lightgbm", "classifier"),
    ("lightgbm", "booster"),
    ("xgboost", "classifier"),
    ("xgboost", "booster"),
    ("sklearn", "lightgbm"),
)


def credit_frame(n: int, seed: int, classes: int = 2) -> tuple[pd.DataFrame, pd.Series]:
    """Applicants (float32 income, debt and age with about 5% gaps, an integer term, a category
    branch) and their risk class: 'bad'/'good', or 'bad'/'fair'/'good' with ``classes=3``."""
    rng = np.random.default_rng(seed)
    x = pd.DataFrame(
        {
            "income": rng.normal(50, 15, n).astype(np.float32),
            "debt": rng.normal(20, 8, n).astype(np.float32),
            "age": rng.integers(18, 80, n).astype(np.float32),
            "term": rng.integers(0, 4, n),
            "branch": pd.Categorical(rng.choice(["east", "north", "south", "west"], n)),
        }
    )
    for column in ("income", "debt", "age"):
        x.loc[rng.random(n) < 0.05, column] = np.nan
    z = (
        0.05 * x["income"].fillna(50).to_numpy()
        - 0.1 * x["debt"].fillna(20).to_numpy()
        + 0.4 * (x["branch"] == "north").to_numpy()
        + 0.2 * x["term"].to_numpy()
        + rng.normal(0, 1, n)
    )
    names = np.array(["bad", "good"] if classes == 2 else ["bad", "fair", "good"])
    cuts = np.quantile(z, np.linspace(0, 1, classes + 1)[1:-1])
    return x, pd.Series(names[np.digitize(z, cuts)], name="label")


def fit(library: str, what: str, x: pd.DataFrame, y: pd.Series, seed: int):
    """A fitted model of ``library`` (``lightgbm`` / ``xgboost``) as ``what`` (``classifier``: the
    scikit-learn estimator; ``booster``: its Booster), on a subsample of the month's data."""
    rows = np.random.default_rng(seed).random(len(x)) < 0.8
    x, y = x[rows], y[rows]
    classes = sorted(y.unique())
    if library == "lightgbm":
        import lightgbm

        model = lightgbm.LGBMClassifier(n_estimators=30, num_leaves=15, random_state=seed, verbose=-1)
        model.fit(x, y)
        return model.booster_ if what == "booster" else model
    import xgboost

    model = xgboost.XGBClassifier(n_estimators=30, max_depth=4, random_state=seed, enable_categorical=True)
    model.fit(x, y.map({c: i for i, c in enumerate(classes)}))
    return model.get_booster() if what == "booster" else model


def register(uri: str, name: str, flavor: str, model, x: pd.DataFrame, classes: list[str]) -> str:
    """Log ``model`` with ``mlflow.<flavor>.log_model`` (signature, input example), register it as a new
    version of ``name`` with its class names as the classes tag; returns the version."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.models import infer_signature

    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    mlflow.set_experiment("training")
    signature = infer_signature(x, np.zeros((len(x), len(classes))))
    with warnings.catch_warnings(), mlflow.start_run():
        warnings.simplefilter("ignore")
        module = getattr(mlflow, flavor)
        extra = {"serialization_format": "cloudpickle"} if flavor == "sklearn" else {}
        info = module.log_model(
            model,
            name="model",
            signature=signature,
            input_example=x.head(3),
            registered_model_name=name,
            pip_requirements=[flavor],  # not inferred: that loads the model again in a subprocess (seconds each)
            **extra,
        )
    version = str(info.registered_model_version)
    MlflowClient(uri).set_model_version_tag(name, version, "consistency_gate.classes", str(classes).replace("'", '"'))
    return version


def write_data(root: Path, x: pd.DataFrame, y: pd.Series) -> dict[str, Path]:
    """The evaluation set as the team stores it: Parquet (dtypes kept) and CSV (float64, text)."""
    frame = x.assign(label=y.to_numpy())
    paths = {"parquet": root / "eval.parquet", "csv": root / "eval.csv"}
    frame.to_parquet(paths["parquet"])
    frame.to_csv(paths["csv"], index=False)
    return paths
