"""Ten retrains as CI runs them: each generation registered in a real SQLite store and gated with
`check --promote` and the packaged default config; the chain @champion held and its negative flips equal a
recomputation from the versions' own predictions, and `history` says the same."""

from __future__ import annotations

import json

import mlflow
import numpy as np
import pandas as pd
import pytest
from conftest import run_cli
from mlflow import MlflowClient
from registry_fixtures import sqlite_uri

pytestmark = pytest.mark.slow  # ten models registered and gated

NAME = "digits-retrained"
GENERATIONS = 10


def _retrains():
    """Ten generations of a small recipe on growing data (30% of the pool, then up to all of it), each with
    another seed and regularisation, as a team retrains; and the evaluation set."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    x, y = load_digits(return_X_y=True)
    x = pd.DataFrame(x / 16.0, columns=[f"p{i}" for i in range(x.shape[1])])
    order = np.random.default_rng(0).permutation(len(x))
    pool, held_out = order[:1400], order[1400:]
    models = []
    for t in range(GENERATIONS):
        rows = np.random.default_rng(t).permutation(pool)[: int(len(pool) * (0.3 + 0.7 * t / (GENERATIONS - 1)))]
        models.append(LogisticRegression(C=0.05 + 0.02 * t, max_iter=300).fit(x.iloc[rows], y[rows]))
    return models, x.iloc[held_out].reset_index(drop=True), y[held_out]


def test_ten_retrains_through_check_promote_deploy_what_a_recomputation_says(tmp_path):
    uri = sqlite_uri(tmp_path)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    mlflow.set_experiment("training")
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    models, x, y = _retrains()
    data = tmp_path / "eval.csv"
    x.assign(label=y, id=[f"t{i}" for i in range(len(y))]).to_csv(data, index=False)
    held = []  # the version @champion holds after each gate
    for model in models:
        with mlflow.start_run():
            info = mlflow.sklearn.log_model(
                model, name="model", registered_model_name=NAME, pip_requirements=["scikit-learn"],
                serialization_format="cloudpickle",
            )  # fmt: skip
        version = str(info.registered_model_version)
        proc = run_cli(
            "check", "--model", NAME, "--candidate", version, "--data", data, "--id-column", "id",
            "--tracking-uri", uri, "--promote", "--quiet",
        )  # fmt: skip
        assert proc.returncode in (0, 1), proc.stderr[-2000:]
        champion = str(client.get_model_version_by_alias(NAME, "champion").version)
        assert (champion == version) == (proc.returncode == 0)  # promoted exactly when it passed
        held.append(champion)
    # the recomputation: each version's own predictions, the chain of champions in the order they were held
    right = {str(v + 1): m.predict(x) == y for v, m in enumerate(models)}
    chain = list(dict.fromkeys(held))
    flips = [int((right[a] & ~right[b]).sum()) for a, b in zip(chain, chain[1:], strict=False)]
    report = json.loads(run_cli("history", "--model", NAME, "--tracking-uri", uri, "--format", "json").stdout)
    assert report["champions"] == chain and 3 <= len(chain) < GENERATIONS, chain  # some pass, some do not
    assert [s["negative_flips"] for s in report["steps"]] == flips
    assert report["cumulative_negative_flips"] == sum(flips)
    assert report["steps"][-1]["accuracy"] == pytest.approx(right[chain[-1]].mean())
    # every gate passed what it promoted, and the others kept the champion
    verdicts = {v: client.get_model_version(NAME, v).tags.get("consistency_gate.verdict") for v in right}
    assert all(verdicts[v] == "passed" for v in chain[1:])
    assert all(verdicts[v] == "failed" for v in right if v not in chain)
