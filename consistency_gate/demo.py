"""``consistency-gate demo``: two generations of a digits classifier, registered in a local
SQLite MLflow store, gated end to end. No server, no download (scikit-learn ships the data).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd

MODEL_NAME = "digits-classifier"


DEMO_REMEDIATION = """
remediation:                 # when the single candidate fails, train and gate a DynSnap ensemble
  recipe: mlp
  recipe_options: {{hidden: [64]}}
  data: {train}
  label_column: label
  method: dynsnap-cyc
  m: 10
  N: 5
  epochs: 20
  seed: 1
"""


# the demo's CtoI rule decides on its interval: the candidate must be *shown* to flip at most 2%
DEFAULT_CTOI_RULE = "- {metric: ctoi, max: 0.02, unless: clearly-better}"
DEMO_CTOI_RULE = "- {metric: ctoi, max: 0.02, decide: upper, unless: clearly-better}"
DEFAULT_HEADER = "# consistency-gate: default gate configuration."
DEMO_HEADER = (
    "# consistency-gate demo: the default rules, its CtoI rule decided on its upper bound, and a remediation: block."
)


def demo_config_text(train: Path) -> str:
    """The packaged default config, its CtoI rule deciding on the upper bound of its 95% interval,
    and a remediation block training on ``train``.

    >>> text = demo_config_text(Path("train.csv"))
    >>> [line.split("#")[0].strip() for line in text.splitlines() if "ctoi" in line][-1]
    '- {metric: ctoi, max: 0.02, decide: upper, unless: clearly-better}'
    >>> text.splitlines()[0]
    '# consistency-gate demo: the default rules, its CtoI rule decided on its upper bound, and a remediation: block.'
    """
    from consistency_gate.gate.config import default_config_text

    default = default_config_text()
    if DEFAULT_CTOI_RULE not in default:
        raise AssertionError("the default config's CtoI rule changed; update DEFAULT_CTOI_RULE")
    text = default.replace(DEFAULT_CTOI_RULE, DEMO_CTOI_RULE).replace(DEFAULT_HEADER, DEMO_HEADER, 1)
    return text + DEMO_REMEDIATION.format(train=train)


def prepare(workdir: Path, seed: int = 0) -> tuple[str, Path, Path]:
    """Train and register generation 1 (alias @champion) and generation 2; write the data files.

    Returns the tracking URI, the evaluation file and a gate config (the default rules plus
    a remediation block training on ``train.csv``). Generation 2 is retrained on another
    resample of the data with another learner: about as accurate, but it flips many answers.

    Example::

        uri, data, config = prepare(Path("consistency-gate-demo"))
    """
    import mlflow
    import sklearn
    from mlflow import MlflowClient
    from mlflow.models import infer_signature
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from consistency_gate.mlops import registry, tracking

    workdir.mkdir(parents=True, exist_ok=True)
    for stale in ("mlflow.db", "mlartifacts", "eval.csv", "train.csv", "gate.yaml", "report.json"):
        target = workdir / stale
        shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    uri = f"sqlite:///{(workdir / 'mlflow.db').resolve()}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)

    digits = load_digits()
    features = pd.DataFrame(digits.data, columns=[f"px{i}" for i in range(digits.data.shape[1])])
    labels = pd.Series(digits.target).map(lambda d: f"digit-{d}")
    x_pool, x_eval, y_pool, y_eval = train_test_split(
        features, labels, test_size=600, random_state=seed, stratify=labels
    )
    rng = np.random.default_rng(seed)
    generations = [
        make_pipeline(StandardScaler(), LogisticRegression(max_iter=300, C=0.05)),
        make_pipeline(
            StandardScaler(), MLPClassifier(hidden_layer_sizes=(16,), solver="lbfgs", max_iter=80, random_state=seed)
        ),
    ]
    tracking.use_experiment(f"{MODEL_NAME}-training", uri)
    for number, model in enumerate(generations, start=1):
        rows = rng.choice(len(x_pool), size=len(x_pool) // 2, replace=False)
        model.fit(x_pool.iloc[rows], y_pool.iloc[rows])
        with mlflow.start_run(run_name=f"generation {number}"):
            info = mlflow.sklearn.log_model(
                model,
                name="model",
                signature=infer_signature(x_eval, model.predict_proba(x_eval)),
                pip_requirements=[f"scikit-learn=={sklearn.__version__}"],  # skips slow inference
            )
        registry.register_version(info.model_uri, MODEL_NAME)
    MlflowClient().set_registered_model_alias(MODEL_NAME, "champion", "1")
    eval_path = workdir / "eval.csv"
    x_eval.assign(label=y_eval.to_numpy(), id=[f"eval-{i:04d}" for i in range(len(x_eval))]).to_csv(
        eval_path, index=False
    )
    train_path = workdir / "train.csv"
    x_pool.assign(label=y_pool.to_numpy()).to_csv(train_path, index=False)
    config_path = workdir / "gate.yaml"
    config_path.write_text(demo_config_text(train_path.resolve()))
    return uri, eval_path, config_path
