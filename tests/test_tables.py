"""What grows by kind grows as entries of one table: a repair method added to ``ensembles.methods.METHODS``
and a flavor added to ``mlops.flavors.FLAVORS`` in this test alone are used by the gate on a real SQLite
registry, with no edit of the gate."""

import json
import os

import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient
from registry_fixtures import MODEL, build_store

from consistency_gate.ensembles import methods
from consistency_gate.ensembles.carrying import carried
from consistency_gate.ensembles.methods import METHODS, Built, Method
from consistency_gate.ensembles.repair import Repair, aligned, log_repair
from consistency_gate.errors import ModelError
from consistency_gate.gate.config import parse_config
from consistency_gate.gate.run import run_gate
from consistency_gate.mlops import flavors
from consistency_gate.mlops.flavors import FLAVORS, Flavor, class_scores

pytestmark = pytest.mark.slow  # models logged, registered and loaded back

# v3 is poor (one feature): it fails these against v1, and a repair keeping most of v1's answers passes
BOTH = ("previous", "candidate")
LENIENT = "rules:\n  - {metric: ctoi, max: 0.1}\n  - {metric: acc, min_delta: -0.1}\nks: [1]\n"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("tables"))


def _named(method, m):
    return method


def _mostly_previous(inputs, remediation):
    """A toy repair: 0.8 of the previous generation's scores, 0.2 of the candidate's, logged as a pyfunc
    carrying both generations."""
    repair = Repair("blend", weight=0.8, tuned_on="toy")
    previous, candidate, classes = aligned(inputs.base_scores, inputs.cand_scores)
    scores = pd.DataFrame(repair.apply(previous, candidate), columns=classes, index=inputs.cand_scores.index)
    pairs = ((inputs.baseline, inputs.base_scores), (inputs.candidate, inputs.cand_scores))
    info = log_repair(repair, *(carried(model, s) for model, s in pairs))
    return Built(info, scores, 2, 0.0, inputs.candidate.features, setting={"weight": 0.8, "tuned_on": "toy"})


def _claims_other_scores(inputs, remediation):
    """A toy repair whose reported scores are not what its logged model predicts."""
    built = _mostly_previous(inputs, remediation)
    return Built(built.model_info, built.scores.iloc[:, ::-1].set_axis(built.scores.columns, axis=1), 2, 0.0, None)


def _gate(store, block, **kwargs):
    config = parse_config(LENIENT + "remediation:\n  " + block + "\n", "gate.yaml")
    return run_gate(MODEL, store["data"], candidate="3", config=config, tracking_uri=store["uri"], **kwargs)


def test_a_repair_method_added_to_the_table_is_tried_first_by_cheapest_and_registered(store, monkeypatch):
    toy = Method("mostly-previous", "mostly-previous", 1, _mostly_previous, _named, previous=True, scores=BOTH)
    monkeypatch.setitem(METHODS, toy.name, toy)
    assert methods.cheapest_order("dynsnap-cyc")[0] == "mostly-previous"
    result = _gate(store, "strategy: cheapest")
    assert result.attempts[0]["method"] == "mostly-previous" and result.attempts[0]["kind"] == "mostly-previous"
    assert result.verdict == "passed" and result.ensemble["setting"] == {"weight": 0.8, "tuned_on": "toy"}
    version = MlflowClient(tracking_uri=store["uri"]).get_model_version(MODEL, result.registered_version)
    assert version.tags["consistency_gate.kind"] == "mostly-previous"
    assert version.tags["consistency_gate.replaces"] == "3"


def test_a_method_whose_needs_are_not_met_is_skipped_with_its_reason(store, monkeypatch):
    toy = Method("needs-labels", "needs-labels", 1, _mostly_previous, _named, labelled=True)
    monkeypatch.setitem(METHODS, toy.name, toy)
    result = _gate(store, "strategy: [needs-labels, blend]")
    skipped = result.attempts[0]
    assert skipped["method"] == "needs-labels" and skipped["verdict"] == "skipped" and "calibration:" in skipped["note"]
    assert result.attempts[1]["method"] == "blend"


def test_the_shared_tail_refuses_a_model_that_does_not_predict_what_was_gated(store, monkeypatch):
    toy = Method("liar", "liar", 1, _claims_other_scores, _named, previous=True, scores=BOTH)
    monkeypatch.setitem(METHODS, toy.name, toy)
    with pytest.raises(ModelError, match="the logged liar does not predict what was gated"):
        _gate(store, "strategy: [liar]")


class _LinearFlavor:
    """A flavor of MLflow's own kind (``mlflow.models.Model.log(flavor=...)``): a linear model's
    weights in a JSON file, no pickle, no pyfunc."""

    @staticmethod
    def save_model(path, mlflow_model, weights, classes, features):
        os.makedirs(path)
        with open(os.path.join(path, "weights.json"), "w") as f:
            json.dump({"weights": weights, "classes": classes, "features": features}, f)
        mlflow_model.add_flavor("toy_linear", data="weights.json")
        mlflow_model.save(os.path.join(path, "MLmodel"))


def _linear_scorer(ref, hint, tensor):
    """The toy flavor's entry: softmax of the linear model's outputs, over its classes."""
    folder = mlflow.artifacts.download_artifacts(ref.source or ref.uri)
    with open(os.path.join(folder, "weights.json")) as f:
        spec = json.load(f)
    weights = np.asarray(spec["weights"])

    def score(features):
        logits = features[spec["features"]].to_numpy(dtype=np.float64) @ weights
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return class_scores(ref, e / e.sum(axis=1, keepdims=True), spec["classes"], features.index)

    return score, ()


def test_a_flavor_added_to_the_table_is_how_the_gate_loads_its_versions(store, monkeypatch):
    monkeypatch.setitem(FLAVORS, "toy_linear", Flavor(_linear_scorer))
    assert flavors.flavor_of(["toy_linear"]) == "toy_linear"
    frame = pd.read_csv(store["data"])
    features = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
    classes = sorted(frame["label"].unique())
    rng = np.random.default_rng(0)
    onehot = np.eye(len(classes))[frame["label"].map(classes.index)]
    x = frame[features].to_numpy()
    fitted = np.linalg.lstsq(x, onehot * 4 - 2, rcond=None)[0]  # a least-squares linear classifier
    name = "toy-linear-clf"
    mlflow.set_tracking_uri(store["uri"])
    for weights in (fitted, fitted + rng.normal(0, 0.05, fitted.shape)):
        with mlflow.start_run():
            info = mlflow.models.Model.log(
                "model", _LinearFlavor, weights=weights.tolist(), classes=classes, features=features
            )
        mlflow.register_model(info.model_uri, name)
    MlflowClient(tracking_uri=store["uri"]).set_registered_model_alias(name, "champion", "1")
    config = parse_config("rules:\n  - {metric: con, min: 0.5}\nks: [1]\n", "gate.yaml")
    result = run_gate(name, store["data"], candidate="2", config=config, tracking_uri=store["uri"])
    assert result.verdict == "passed"
    expected = (x @ fitted).argmax(axis=1) == frame["label"].map(classes.index).to_numpy()
    assert result.metrics["acc_previous"] == pytest.approx(expected.mean())
