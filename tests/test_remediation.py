"""Remediation inside the gate: a failing candidate repaired by a registered DynSnap ensemble or distilled model."""

import mlflow
import pandas as pd
import pytest
from conftest import run_cli
from mlflow import MlflowClient
from registry_fixtures import MODEL, build_store, check_args

from consistency_gate.errors import DataError, UsageError
from consistency_gate.gate.config import parse_config
from consistency_gate.gate.run import run_gate

REMEDIATION = """
remediation:
  recipe: {recipe}
  recipe_options: {{hidden: [16]}}
  data: {train}
  label_column: {label}
  method: dynsnap-cyc
  m: 4
  N: 3
  epochs: 40
  lr: 0.05
  seed: 0
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("remediation")
    store = build_store(root)
    pd.read_csv(store["data"]).drop(columns=["id"]).to_csv(root / "train.csv", index=False)
    store["train"] = root / "train.csv"
    return store


def _config(store, rules, recipe="mlp", label="label"):
    return parse_config(rules + REMEDIATION.format(recipe=recipe, train=store["train"], label=label))


def _versions(store):
    client = MlflowClient(tracking_uri=store["uri"], registry_uri=store["uri"])
    return client, sorted(int(v.version) for v in client.search_model_versions(f"name='{MODEL}'"))


def _gate_v3(store, config):
    """Gate the poor version 3 with promotion asked for."""
    return run_gate(
        MODEL,
        store["data"],
        candidate="3",
        config=config,
        tracking_uri=store["uri"],
        id_column="id",
        promote=True,
        quiet=True,
    )


def test_failing_candidate_is_repaired_registered_and_promoted(store):
    config = _config(store, "rules:\n  - {metric: con, min: 0.9}\n  - {metric: acc, min_delta: -0.05}\n")
    client, before = _versions(store)
    result = _gate_v3(store, config)
    assert [r.held for r in result.rules] != [True, True]  # the single candidate failed
    assert result.ensemble["verdict"] == "passed" and result.verdict == "passed" and result.exit_code == 0
    new = result.registered_version
    assert new is not None and int(new) == max(before) + 1
    assert result.passed_version == new  # what a deploy job ships: the ensemble, not the failed candidate
    assert "Registered the ensemble as" in result.html and f"v{new}" in result.html
    tags = client.get_model_version(MODEL, new).tags
    assert tags["consistency_gate.kind"] == "ensemble" and tags["consistency_gate.verdict"] == "passed"
    assert client.get_model_version(MODEL, "3").tags["consistency_gate.verdict"] == "failed"
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == new
    gate_tags = client.get_run(result.run_id).data.tags  # the run's verdict is the report's; the candidate's apart
    assert gate_tags["consistency_gate.verdict"] == "passed"
    assert gate_tags["consistency_gate.candidate_verdict"] == "failed"
    assert gate_tags["consistency_gate.outcome"] == "remediated"
    assert gate_tags["consistency_gate.ensemble_version"] == new
    assert result.to_dict()["candidate_verdict"] == "failed" and result.to_dict()["outcome"] == "remediated"
    child = result.ensemble["run_id"]
    assert client.get_run(child).data.tags["mlflow.parentRunId"] == result.run_id
    paths = {a.path for a in client.list_artifacts(child, "ensemble")}
    assert {"ensemble/snapshots.json", "ensemble/lr_curve.png"} <= paths
    assert client.get_run(child).data.metrics["kappa"] == result.ensemble["kappa"]

    # round trip: the registered ensemble is gated like any other version, with the same numbers
    client.set_registered_model_alias(MODEL, "champion", "1")
    again = run_gate(MODEL, store["data"], candidate=new, config=config, tracking_uri=store["uri"], id_column="id")
    assert again.metrics["con"] == pytest.approx(result.ensemble["metrics"]["con"])
    assert again.verdict == "passed"
    assert client.get_model_version(MODEL, new).tags["consistency_gate.kind"] == "ensemble"
    info = mlflow.models.get_model_info(f"models:/{MODEL}/{new}")
    assert info.metadata["method"] == "dynsnap-cyc" and len(info.metadata["member_val_acc"]) == 4
    assert info.metadata["classes"] == ["setosa", "versicolor", "virginica"]


def test_both_failing_registers_nothing(store):
    config = _config(store, "rules:\n  - {metric: con, min: 1.0}\n  - {metric: ctoi, max: 0.0}\n")
    _, before = _versions(store)
    result = _gate_v3(store, config)
    assert result.verdict == "failed" and result.exit_code == 1
    assert result.ensemble["verdict"] == "failed" and result.registered_version is None
    assert _versions(store)[1] == before


@pytest.mark.parametrize(
    ("recipe", "label", "error", "text"),
    [
        ("no_such_module:build", "label", UsageError, "cannot import"),
        ("torch.nn:Identity", "label", UsageError, "returns a TrainingRecipe"),
        ("consistency_gate.ensembles.recipes:cnn", "label", UsageError, "bad options"),
        ("mlp", "species", DataError, "column 'species' not found"),
    ],
)
def test_bad_remediation_fails_before_training_and_registers_nothing(store, recipe, label, error, text):
    config = _config(store, "rules:\n  - {metric: con, min: 1.0}\n", recipe=recipe, label=label)
    _, before = _versions(store)
    with pytest.raises(error, match=text):
        run_gate(MODEL, store["data"], candidate="3", config=config, tracking_uri=store["uri"], id_column="id")
    assert _versions(store)[1] == before


@pytest.mark.parametrize(
    ("line", "text"),
    [("m: 0", "m must be"), ("N: 0", "N must be"), ("beta: 2", "beta must be"), ("m: 2\n  colour: red", "unknown key")],
)
def test_invalid_remediation_options_are_usage_errors(store, line, text):
    with pytest.raises(UsageError, match=text):
        parse_config(f"rules: []\nremediation:\n  data: {store['train']}\n  {line}\n")


@pytest.mark.parametrize("method", ["focal-distillation", "ensemble-distillation"])
def test_a_single_distilled_model_repairs_the_candidate(store, method):
    """One model in place of the failed candidate: focal distillation learns from the baseline
    (the gate predicts the training data with it), ensemble distillation from a DynSnap ensemble."""
    client, before = _versions(store)
    block = REMEDIATION.format(recipe="mlp", train=store["train"], label="label")
    block = block.replace("method: dynsnap-cyc", f"method: {method}")
    config = parse_config("rules:\n  - {metric: con, min: 0.9}\n  - {metric: acc, min_delta: -0.05}\n" + block)
    try:
        result = _gate_v3(store, config)
        assert result.ensemble["verdict"] == "passed" and result.exit_code == 0
        assert result.ensemble["kind"] == "distilled" and result.ensemble["members"] == 1
        assert result.ensemble["runs"] == (1 if method == "focal-distillation" else 3)  # 2 teacher runs + student
        new = result.registered_version
        assert int(new) == max(before) + 1 and result.passed_version == new
        assert client.get_model_version(MODEL, new).tags["consistency_gate.kind"] == "distilled"
        assert f"Registered the {method} model as" in result.html
        assert f"the {method} model v{new} PASSED in its place" in result.html
        assert mlflow.models.get_model_info(f"models:/{MODEL}/{new}").metadata["method"] == method
        # gated again against v1, the registered model gives the numbers the gate judged it on
        client.set_registered_model_alias(MODEL, "champion", "1")
        again = run_gate(MODEL, store["data"], candidate=new, config=config, tracking_uri=store["uri"], id_column="id")
        assert again.metrics["con"] == pytest.approx(result.ensemble["metrics"]["con"])
    finally:
        client.set_registered_model_alias(MODEL, "champion", "1")


def test_a_strategy_tries_methods_in_turn_and_registers_the_first_that_passes(store):
    """strategy: a list. Focal distillation with its gradient clipped to almost nothing (clip: 1e-6)
    cannot learn and fails; the DynSnap ensemble tried next passes and is registered. Each attempt
    has its nested run and its row."""
    client, before = _versions(store)
    block = REMEDIATION.format(recipe="mlp", train=store["train"], label="label")
    config = parse_config(
        "rules:\n  - {metric: con, min: 0.9}\n  - {metric: acc, min_delta: -0.05}\n"
        + block
        + "  strategy: [focal-distillation, dynsnap-cyc, ensemble-distillation]\n  distillation: {clip: 1.0e-6}\n"
    )
    try:
        result = _gate_v3(store, config)
        attempts = result.attempts
        assert [(a["method"], a["verdict"]) for a in attempts] == [
            ("focal-distillation", "failed"),
            ("dynsnap-cyc", "passed"),
        ]  # the third is never trained
        assert [a["kind"] for a in attempts] == ["distilled", "ensemble"]
        assert (
            attempts[0]["registered_version"] is None and attempts[1]["registered_version"] == result.registered_version
        )
        assert int(result.registered_version) == max(before) + 1  # one version: the one that passed
        assert result.ensemble["method"] == "dynsnap-cyc" and result.exit_code == 0
        children = client.search_runs(
            [client.get_run(result.run_id).info.experiment_id],
            f"tags.mlflow.parentRunId = '{result.run_id}'",
        )
        assert sorted(r.info.run_name for r in children) == [
            "remediation: dynsnap-cyc",
            "remediation: focal-distillation",
        ]
        assert {a["run_id"] for a in attempts} == {r.info.run_id for r in children}
        assert "Remediation attempts, in the order tried" in result.html
        assert result.to_dict()["attempts"] == attempts
        assert client.get_run(result.run_id).data.params["remediation"] == (
            "focal-distillation, dynsnap-cyc, ensemble-distillation"
        )
    finally:
        client.set_registered_model_alias(MODEL, "champion", "1")


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (
            "cheapest",
            ("blend", "rerank", "bayesian-update", "focal-distillation", "ensemble-distillation", "dynsnap-cyc"),
        ),
        ("[extbagging, focal-distillation]", ("extbagging", "focal-distillation")),
    ],
)
def test_strategy_orders(store, strategy, expected):
    config = parse_config(
        f"rules:\n  - {{metric: con, min: 0.9}}\nremediation:\n  data: {store['train']}\n  strategy: {strategy}\n"
    )
    assert config.remediation.methods == expected
    # each attempt trains its method with that method's distillation defaults
    assert config.remediation.for_method("ensemble-distillation").settings.distillation_term.temperature == 4.0


@pytest.mark.parametrize(
    ("strategy", "text"),
    [
        ("fastest", "remediation.strategy"),
        ("[dynsnap-cyc, bagging]", "method 'bagging' is unknown"),
        ("[singlebase, singlebase]", "names a method twice"),
        ("[]", "remediation.strategy"),
    ],
)
def test_bad_strategies_are_usage_errors(store, strategy, text):
    with pytest.raises(UsageError, match=text):
        parse_config(
            f"rules:\n  - {{metric: con, min: 0.9}}\nremediation:\n  data: {store['train']}\n  strategy: {strategy}\n"
        )


def test_a_strategy_checks_every_methods_settings_before_training(store):
    # N > epochs is refused for the snapshot methods only: dynsnap-step in the list makes it an error
    rule = "rules:\n  - {metric: con, min: 0.9}\n"
    block = rule + f"remediation:\n  data: {store['train']}\n  method: singlebase\n  N: 5\n  epochs: 3\n"
    parse_config(block)
    with pytest.raises(UsageError, match="N=5 snapshots need at least as many epochs"):
        parse_config(block + "  strategy: [singlebase, dynsnap-step]\n")


def test_the_cli_announces_each_attempt_and_prints_the_attempts_table(store, tmp_path):
    """Both single-model attempts fail rules no model meets: exit 1, nothing registered, and the user
    saw why each attempt started and how it ended."""
    _, before = _versions(store)
    config = tmp_path / "gate.yaml"
    block = REMEDIATION.format(recipe="mlp", train=store["train"], label="label").replace("epochs: 40", "epochs: 6")
    config.write_text(
        "rules:\n  - {metric: con, min: 1.0}\n  - {metric: ctoi, max: 0.0}\n"
        + block
        + "  strategy: [focal-distillation, ensemble-distillation]\n"
    )
    proc = run_cli(*check_args("3", store["data"], config, store["uri"], "--id-column", "id"))
    assert proc.returncode == 1, proc.stderr
    assert "The candidate failed: trying focal-distillation, ensemble-distillation in turn until one passes" in (
        proc.stderr
    )
    assert "focal-distillation: FAILED (CON " in proc.stderr and "1 member, latency " in proc.stderr
    assert "ensemble-distillation: FAILED (CON " in proc.stderr
    table = proc.stdout[proc.stdout.index("Remediation attempts, in the order tried:") :]
    assert [line.split()[0] for line in table.splitlines()[3:5]] == ["focal-distillation", "ensemble-distillation"]
    assert _versions(store)[1] == before
