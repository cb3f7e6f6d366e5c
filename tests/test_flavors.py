"""Gradient-boosted trees as tabular teams register them (MLflow's lightgbm, xgboost and sklearn
flavors, estimators and Boosters, binary and multiclass), gated from CSV and Parquet with float32
columns, gaps and a category column, on a real SQLite store; the gate's numbers against an
independent recomputation from the models' own probabilities."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from gbdt_fixtures import credit_frame, fit, register, write_data
from registry_fixtures import sqlite_uri

from consistency_gate.errors import DataError
from consistency_gate.gate.run import run_gate
from consistency_gate.io.casts import cast_to_signature

pytest.importorskip("lightgbm")
pytest.importorskip("xgboost")

# (library, what is logged, the flavor it is logged with, classes)
# each flavor binary and multiclass, estimators and Boosters
CASES = [
    ("lightgbm", "classifier", "lightgbm", 2),
    ("lightgbm", "booster", "lightgbm", 3),
    ("xgboost", "booster", "xgboost", 2),
    ("xgboost", "classifier", "xgboost", 3),
    ("lightgbm", "classifier", "sklearn", 3),
    ("xgboost", "classifier", "sklearn", 2),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("gbdt")
    uri = sqlite_uri(root)
    data, fitted = {}, {}
    for classes in (2, 3):
        months = [credit_frame(2000, seed, classes) for seed in (1, 2)]
        x_eval, y_eval = credit_frame(1500, 3, classes)
        folder = root / f"classes{classes}"
        folder.mkdir()
        data[classes] = (write_data(folder, x_eval, y_eval), x_eval, y_eval)
        for library, what, flavor, n_classes in CASES:
            if n_classes != classes:
                continue
            name = f"{flavor}-{library}-{what}-{classes}"
            models = [fit(library, what, x, y, seed) for seed, (x, y) in enumerate(months, start=1)]
            for model, (x, _) in zip(models, months, strict=True):
                register(uri, name, flavor, model, x, sorted(months[0][1].unique()))
            from mlflow import MlflowClient

            MlflowClient(uri).set_registered_model_alias(name, "champion", "1")
            fitted[name] = models
    return uri, data, fitted


def _probabilities(model, x: pd.DataFrame) -> np.ndarray:
    """The model's own class probabilities, by its library's API (no consistency-gate code)."""
    if hasattr(model, "predict_proba"):
        return model.predict_proba(x)
    if type(model).__module__.startswith("xgboost"):
        import xgboost

        out = model.predict(xgboost.DMatrix(x, enable_categorical=True))
    else:
        out = model.predict(x)
    return out if out.ndim == 2 else np.column_stack([1 - out, out])


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
@pytest.mark.parametrize(("library", "what", "flavor", "classes"), CASES)
def test_every_logging_path_is_gated_with_exact_numbers(store, library, what, flavor, classes, fmt):
    uri, data, fitted = store
    paths, x_eval, y_eval = data[classes]
    name = f"{flavor}-{library}-{what}-{classes}"
    result = run_gate(name, paths[fmt], candidate="2", tracking_uri=uri, quiet=True)
    assert result.verdict in ("passed", "failed")
    names = np.array(sorted(y_eval.unique()))
    previous, candidate = (names[_probabilities(m, x_eval).argmax(axis=1)] for m in fitted[name])
    truth = y_eval.to_numpy()
    expected = {
        "acc_previous": np.mean(previous == truth),
        "acc_candidate": np.mean(candidate == truth),
        "con": np.mean(previous == candidate),
        "ctoi": np.mean((previous == truth) & (candidate != truth)),
        "itoc": np.mean((previous != truth) & (candidate == truth)),
    }
    for key, value in expected.items():
        assert result.metrics[key] == pytest.approx(value, abs=1e-9), key


def test_a_booster_without_class_names_is_refused_in_one_line(store, tmp_path):
    import lightgbm
    import mlflow

    uri, data, _ = store
    paths, x_eval, y_eval = data[2]
    booster = lightgbm.LGBMClassifier(n_estimators=3, verbose=-1).fit(x_eval, y_eval).booster_
    mlflow.set_tracking_uri(uri)
    with mlflow.start_run():
        mlflow.lightgbm.log_model(
            booster, name="model", registered_model_name="unnamed-booster", pip_requirements=["lightgbm"]
        )
    from consistency_gate.errors import ModelError
    from consistency_gate.mlops.registry import ModelRef
    from consistency_gate.mlops.scoring import load_model

    with pytest.raises(ModelError, match="a LightGBM Booster needs its class names: set the model version tag"):
        load_model(ModelRef("unnamed-booster", "1"))


def test_csv_columns_are_cast_to_the_signature_types():
    frame = pd.DataFrame(
        {"income": [1.5, np.nan], "term": [1.0, 2.0], "gap": [1.0, np.nan], "branch": ["n", "s"], "n": [1, 2]}
    )
    types = {"income": "float", "term": "long", "gap": "long", "branch": "string", "n": "double"}
    cast = cast_to_signature(frame, types, categorical=["branch"])
    assert [str(t) for t in cast.dtypes] == ["float32", "int64", "float64", "category", "float64"]
    assert np.isnan(cast["income"].iloc[1]) and np.isnan(cast["gap"].iloc[1])
    assert cast_to_signature(cast, types, ["branch"]) is cast  # nothing left to cast: no copy
    parquet = pd.DataFrame({"branch": pd.Categorical(["n", None])})
    text = cast_to_signature(parquet, {"branch": "string"})["branch"]
    assert text.dtype == object and text.iloc[0] == "n" and pd.isna(text.iloc[1])


def test_a_model_that_takes_no_missing_values_names_the_column_and_row(tmp_path):
    import mlflow
    from mlflow import MlflowClient
    from mlflow.models import infer_signature
    from sklearn.linear_model import LogisticRegression

    uri = sqlite_uri(tmp_path)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    mlflow.set_experiment("training")
    x, y = credit_frame(300, 1)
    x = x[["income", "debt"]].fillna(0.0)
    for c in (1.0, 0.5):
        with mlflow.start_run():
            model = LogisticRegression(C=c).fit(x, y)
            mlflow.sklearn.log_model(
                model, name="model", signature=infer_signature(x), registered_model_name="no-gaps",
                serialization_format="cloudpickle", pip_requirements=["scikit-learn"],
            )  # fmt: skip
    MlflowClient(uri).set_registered_model_alias("no-gaps", "champion", "1")
    holes = x.assign(label=y.to_numpy())
    holes.loc[7, "debt"] = np.nan
    holes.to_csv(tmp_path / "eval.csv", index=False)
    with pytest.raises(DataError, match=r"feature column 'debt', row 8 holds nan .* does not take missing"):
        run_gate("no-gaps", tmp_path / "eval.csv", candidate="2", tracking_uri=uri, quiet=True)


BINARY = "lightgbm-lightgbm-classifier-2"


def _config(text: str, tmp_path):
    from consistency_gate.gate.config import load_config

    path = tmp_path / "gate.yaml"
    path.write_text(
        "rules:\n  - {metric: ctoi, max: 0.03, decide: upper}\n  - {metric: acc, min_delta: -0.01}\n" + text
    )
    return load_config(path)


def test_a_binary_threshold_decides_every_metric(store, tmp_path):
    uri, data, fitted = store
    paths, x_eval, y_eval = data[2]
    cfg = _config("decision: {positive: good, threshold: 0.3}\n", tmp_path)
    result = run_gate(BINARY, paths["csv"], candidate="2", config=cfg, tracking_uri=uri, quiet=True)
    assert result.to_dict()["decision"] == {"positive": "good", "threshold": 0.3, "configured": True}
    truth = y_eval.to_numpy()
    previous, candidate = (np.where(m.predict_proba(x_eval)[:, 1] >= 0.3, "good", "bad") for m in fitted[BINARY])
    assert result.metrics["acc_candidate"] == pytest.approx(np.mean(candidate == truth), abs=1e-12)
    assert result.metrics["ctoi"] == pytest.approx(np.mean((previous == truth) & (candidate != truth)), abs=1e-12)
    assert result.metrics["con"] == pytest.approx(np.mean(previous == candidate), abs=1e-12)
    default = run_gate(BINARY, paths["csv"], candidate="2", config=_config("", tmp_path), tracking_uri=uri, quiet=True)
    assert default.to_dict()["decision"] == {"positive": "good", "threshold": 0.5, "configured": False}
    assert default.metrics["acc_candidate"] != result.metrics["acc_candidate"]


def test_a_decision_block_on_a_multiclass_model_is_a_usage_error(store, tmp_path):
    from consistency_gate.errors import UsageError

    uri, data, _ = store
    cfg = _config("decision: {positive: good, threshold: 0.3}\n", tmp_path)
    with pytest.raises(UsageError, match="decision: applies to binary models, and these have 3 classes"):
        run_gate("xgboost-xgboost-classifier-3", data[3][0]["csv"], candidate="2", config=cfg, tracking_uri=uri)


@pytest.mark.slow  # a fresh process loads the registered repair
def test_cheapest_registers_a_binary_repair_that_predicts_the_same_in_a_fresh_process(store, tmp_path):
    import subprocess
    import sys

    uri, data, _ = store
    paths, x_eval, _ = data[2]
    calibration = write_data(tmp_path, *credit_frame(1500, 4))["csv"]
    cfg = _config(f"remediation:\n  strategy: cheapest\n  calibration: {calibration}\n", tmp_path)
    result = run_gate(BINARY, paths["csv"], candidate="2", config=cfg, tracking_uri=uri, quiet=True)
    assert result.candidate_verdict == "failed" and result.verdict == "passed"
    attempt = result.attempts[-1]
    assert attempt["verdict"] == "passed" and attempt["method"] == "blend"
    assert 0 < attempt["itoc_kept"] <= 1 and result.metrics["ctoi"] > attempt["ctoi"]
    assert result.ensemble["metrics"]["con"] < 1.0  # not the previous generation's answers: no rollback
    version = result.registered_version
    script = (
        "import sys, mlflow, pandas as pd\n"
        f"mlflow.set_tracking_uri({uri!r})\n"
        f"m = mlflow.pyfunc.load_model('models:/{BINARY}/{version}')\n"
        f"x = pd.read_csv({str(paths['csv'])!r}).drop(columns=['label'])\n"
        "sys.stdout.write(m.predict(x.astype({'income': 'float32', 'debt': 'float32', 'age': 'float32'})).to_json())\n"
    )
    fresh = pd.read_json(
        __import__("io").StringIO(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                                 check=True).stdout)
    )  # fmt: skip
    from consistency_gate.mlops.registry import ModelRef
    from consistency_gate.mlops.scoring import load_model, predict

    here = predict(load_model(ModelRef(BINARY, version)), pd.read_csv(paths["csv"]), ("label",))
    np.testing.assert_allclose(fresh[here.columns].to_numpy(), here.to_numpy(), atol=1e-9)


def test_a_repair_that_answers_as_the_previous_generation_is_a_rollback_not_registered(store, tmp_path):
    uri, data, _ = store
    versions_before = len(__import__("mlflow").MlflowClient(uri).search_model_versions(f"name='{BINARY}'"))
    cfg = _config("remediation:\n  strategy: [blend, rerank]\n  weight: 1.0\n", tmp_path)
    result = run_gate(BINARY, data[2][0]["parquet"], candidate="2", config=cfg, tracking_uri=uri, quiet=True)
    blend, rerank = result.attempts
    assert blend["verdict"] == "rollback" and "equal the previous generation's" in blend["note"]
    assert blend["registered_version"] is None
    assert rerank["verdict"] == "skipped" and "rerank needs k < the number of classes" in rerank["note"]
    assert result.verdict == "failed" and result.registered_version is None and result.passed_version is None
    assert len(__import__("mlflow").MlflowClient(uri).search_model_versions(f"name='{BINARY}'")) == versions_before


def test_what_a_pyfunc_returns_is_read_as_scores_or_labels():
    from consistency_gate.errors import ModelError
    from consistency_gate.mlops.flavors import pyfunc_output
    from consistency_gate.mlops.registry import ModelRef

    ref, index = ModelRef("m", "1", tags={"consistency_gate.classes": '["no", "yes"]'}), pd.RangeIndex(2)
    pipeline = [{"label": "POSITIVE", "score": 0.98}, {"label": "NEGATIVE", "score": 0.7}]  # transformers
    assert pyfunc_output(ref, pipeline, None, index, None).attrs["label_only"].startswith("it answers with {label")
    frame = pd.DataFrame({"label": ["yes", "no"], "score": [0.9, 0.8]})
    assert pyfunc_output(ref, frame, None, index, None).tolist() == ["yes", "no"]
    assert pyfunc_output(ref, np.array([1.0, 0.0]), None, index, None).tolist() == ["1", "0"]  # whole: labels
    p = pyfunc_output(ref, np.array([0.8, 0.1]), None, index, None)  # P(positive) of a binary model
    assert p.columns.tolist() == ["no", "yes"] and p["yes"].tolist() == [0.8, 0.1]
    logits = pyfunc_output(ref, np.array([[2.0, -1.0], [0.0, 0.0]]), None, index, None)
    assert logits.to_numpy().sum(axis=1).tolist() == pytest.approx([1.0, 1.0])
    with pytest.raises(ModelError, match="one score per sample .* but 3 classes are named"):
        three = ModelRef("m", "1", tags={"consistency_gate.classes": '["a", "b", "c"]'})
        pyfunc_output(three, np.array([0.8, 0.1]), None, index, None)


def test_a_pytorch_model_with_one_output_gives_p_positive(tmp_path):
    import mlflow
    import torch
    from mlflow.models import infer_signature

    from consistency_gate.mlops.registry import ModelRef
    from consistency_gate.mlops.scoring import load_model, predict

    uri = sqlite_uri(tmp_path)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("training")
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1)  # one logit: a binary model
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    with mlflow.start_run():
        info = mlflow.pytorch.log_model(
            net, name="model", signature=infer_signature(x, net(torch.as_tensor(x)).detach().numpy()),
            input_example=x[:2], pip_requirements=["torch"],
        )  # fmt: skip
    ref = ModelRef(info.model_uri, "", tags={"consistency_gate.classes": '["no", "yes"]'}, source=info.model_uri)
    scores = predict(load_model(ref), pd.DataFrame(x), ())
    expected = torch.sigmoid(net(torch.as_tensor(x))).detach().numpy()[:, 0]
    np.testing.assert_allclose(scores["yes"].to_numpy(), expected, atol=1e-6)
    np.testing.assert_allclose(scores["no"].to_numpy(), 1 - expected, atol=1e-6)
