"""The `consistency` evaluator through `mlflow.models.evaluate` (its entry point, not a direct call), on a
real SQLite store, gated with `mlflow.validate_evaluation_results`."""

import mlflow
import pandas as pd
import pytest
from mlflow import MlflowClient
from mlflow.models import MetricThreshold
from mlflow.models.evaluation.validation import ModelValidationFailedException
from registry_fixtures import MODEL, build_store

from consistency_gate.errors import UsageError
from consistency_gate.gate.config import parse_config
from consistency_gate.gate.run import run_gate
from consistency_gate.mlops.registry import logged_model_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("store"))


def _evaluate(store, candidate: str, config: dict, evaluators=("default", "consistency")):
    mlflow.set_tracking_uri(store["uri"])
    mlflow.set_registry_uri(store["uri"])
    mlflow.set_experiment("evaluate")
    data = pd.read_csv(store["data"]).drop(columns="id")
    with mlflow.start_run() as run:
        result = mlflow.models.evaluate(
            candidate,
            data,
            targets="label",
            model_type="classifier",
            evaluators=list(evaluators),
            evaluator_config={"consistency": config},
        )
    return run.info.run_id, result


def test_evaluate_logs_the_gates_metrics_beside_mlflows_and_validation_gates_on_them(store, tmp_path):
    run_id, result = _evaluate(store, f"models:/{MODEL}/3", {"baseline_model": f"models:/{MODEL}@champion"})
    # MLflow's own metrics and ours, in one result and one run
    assert "accuracy_score" in result.metrics and {"con", "ctoi", "acc_con", "ccon_at_1"} <= set(result.metrics)
    assert result.metrics["con_low"] <= result.metrics["con"] <= result.metrics["con_high"]
    logged = MlflowClient().get_run(run_id).data.metrics
    assert logged["ctoi"] == pytest.approx(result.metrics["ctoi"]) and "accuracy_score" in logged
    # the same numbers as the gate's (an independent path: check reads the CSV, scores, counts)
    config = parse_config("rules:\n  - {metric: con, min: 0.0}\n")
    gate = run_gate(MODEL, store["data"], candidate="3", config=config, tracking_uri=store["uri"], id_column="id")
    for key in ("con", "ctoi", "itoc", "acc_con", "acc_candidate", "pearson"):
        assert result.metrics[key] == pytest.approx(gate.metrics[key]), key
    assert result.metrics["accuracy_score"] == pytest.approx(gate.metrics["acc_candidate"])
    # the flip table, as an artifact of the run and of the result
    flips = result.artifacts["consistency_flips"].content
    assert (flips["flip"] == "CtoI").mean() == pytest.approx(result.metrics["ctoi"])
    assert "consistency_flips.csv" in {a.path for a in MlflowClient().list_artifacts(run_id)}
    # the metrics are linked to the evaluated model's logged model
    model_id = logged_model_id(MlflowClient().get_model_version(MODEL, "3"))
    assert "ctoi" in {m.key for m in MlflowClient().get_logged_model(model_id).metrics}

    mlflow.validate_evaluation_results({"con": MetricThreshold(threshold=0.1, greater_is_better=True)}, result)
    with pytest.raises(ModelValidationFailedException, match="ctoi"):
        mlflow.validate_evaluation_results({"ctoi": MetricThreshold(threshold=0.01, greater_is_better=False)}, result)


def test_evaluator_scores_a_torch_baseline_through_its_class_tag(store):
    _, result = _evaluate(
        store, f"models:/{MODEL}/2", {"baseline_model": "models:/iris-torch/1", "ks": [1, 2]}, ["consistency"]
    )
    assert 0.8 < result.metrics["con"] <= 1.0 and "ccon_at_2" in result.metrics and "ccon_at_5" not in result.metrics


def test_bad_evaluator_config_says_what_to_give(store):
    with pytest.raises(UsageError, match=r"baseline_model: Field required .*models:/NAME@champion"):
        _evaluate(store, f"models:/{MODEL}/2", {}, ["consistency"])
    with pytest.raises(Exception, match="alias '@nope' is not set"):
        _evaluate(store, f"models:/{MODEL}/2", {"baseline_model": f"models:/{MODEL}@nope"}, ["consistency"])
    # the one rule for k: asked beyond the classes is an error (it was dropped silently), the defaults are cut
    config = {"baseline_model": f"models:/{MODEL}@champion", "ks": [1, 5]}
    with pytest.raises(UsageError, match=r"evaluator_config ks \[5\] larger than the 3 classes"):
        _evaluate(store, f"models:/{MODEL}/2", config, ["consistency"])
