"""The gate on a real SQLite MLflow store with real registered sklearn and torch models."""

import json
import os
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from conftest import read_report, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow import MlflowClient
from registry_fixtures import MODEL, build_store, check_args, sqlite_uri

from consistency_gate.errors import DataError, ModelError, TrackingError, UsageError
from consistency_gate.gate.config import parse_config
from consistency_gate.gate.run import run_gate
from consistency_gate.mlops.registry import TAG_VERDICT

LENIENT = parse_config("rules:\n  - {metric: con, min: 0.9}\n  - {metric: acc, min_delta: -0.05}\n")
STRICT = parse_config("rules:\n  - {metric: ctoi, max: 0.0}\n  - {metric: con, min: 1.0}\n")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("store"))


def _client(store):
    return MlflowClient(tracking_uri=store["uri"], registry_uri=store["uri"])


def test_passing_candidate_is_logged_tagged_and_reported(store, tmp_path):
    report = tmp_path / "report.json"
    result = run_gate(
        MODEL,
        store["data"],
        candidate="2",
        config=LENIENT,
        tracking_uri=store["uri"],
        id_column="id",
        report_path=report,
    )
    assert result.verdict == "passed" and result.exit_code == 0
    assert result.baseline["version"] == "1" and result.candidate["version"] == "2"
    saved = read_report(report)
    assert set(saved) >= {"verdict", "rules", "metrics", "run_id", "candidate", "baseline", "registered_version"}
    assert saved["registered_version"] is None
    assert all(r["held"] for r in saved["rules"])
    client = _client(store)
    tags = client.get_model_version(MODEL, "2").tags
    assert tags["consistency_gate.verdict"] == "passed"
    assert tags["consistency_gate.kind"] == "single"
    assert tags["consistency_gate.run_id"] == result.run_id
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["con"] == pytest.approx(result.metrics["con"])
    assert "ccon_at_1" in run.data.metrics
    artifacts = {a.path for a in client.list_artifacts(result.run_id, "gate")}
    assert {
        "gate/rules.json",
        "gate/flips.json",
        "gate/report.json",
        "gate/data_validation.json",
        "gate/diagnose.json",
        "gate/diagnose.md",
    } <= artifacts
    # MLflow-native: the data as the run's input, the verdict as its description, metrics on the model's page
    (dataset_input,) = run.inputs.dataset_inputs
    assert dataset_input.dataset.name == "eval.csv" and dataset_input.tags[0].value == "evaluation"
    assert run.data.tags["mlflow.note.content"].startswith("## consistency-gate: iris-clf v2 PASSED")
    model_id = client.get_model_version(MODEL, "2").source.removeprefix("models:/")
    linked = {m.key: m for m in client.get_logged_model(model_id).metrics if m.run_id == result.run_id}
    assert linked["con"].value == pytest.approx(result.metrics["con"]) and linked["con"].dataset_name == "eval.csv"
    # the logged rule table: the rule first and whole, a min_delta rule named by what it compares
    rules_file = client.download_artifacts(result.run_id, "gate/rules.json", str(tmp_path))
    rule_table = json.loads(Path(rules_file).read_text())
    assert rule_table["columns"] == [
        "rule",
        "outcome",
        "value",
        "low",
        "high",
        "bound",
        "judged on",
        "false pass",
        "note",
    ]
    assert [row[:2] for row in rule_table["data"]] == [["con >= 0.9", "held"], ["acc change >= -0.05", "held"]]
    # the HTML report: the same rules, the plots inline, the two generations' diagnosis
    page = Path(client.download_artifacts(result.run_id, "gate/report.html", str(tmp_path))).read_text()
    assert page == result.html and page.count("<img") == 3 and "Why the two generations differ" in page
    assert "<td>acc change &gt;= -0.05</td>" in page and '<td class="held">held</td>' in page
    plots = {a.path for a in client.list_artifacts(result.run_id, "gate/plots")}
    assert plots == {f"gate/plots/{p}.png" for p in ("flips_per_class", "correctness_matrix", "topk_curve")}
    flips = pd.read_csv(client.download_artifacts(result.run_id, "gate/flips.csv", str(tmp_path)))
    assert list(flips.columns) == ["flip", "id", "label", "previous_prediction", "candidate_prediction"]
    kinds = ["CtoI", "ItoC", "ItoI", "CtoC"]  # what a reviewer wants first, and the flip column first
    assert len(flips) == 150 and flips["flip"].map(kinds.index).is_monotonic_increasing
    assert (flips["flip"] == "CtoI").mean() == pytest.approx(result.metrics["ctoi"])


def test_failing_candidate_fails_and_promote_does_not_move_alias(store):
    result = run_gate(MODEL, store["data"], candidate="3", config=STRICT, tracking_uri=store["uri"], promote=True)
    assert result.verdict == "failed" and result.exit_code == 1 and not result.promoted
    client = _client(store)
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == "1"
    assert client.get_model_version(MODEL, "3").tags["consistency_gate.verdict"] == "failed"
    failed = [r for r in result.rules if r.held is False]
    assert failed and all(r.value is not None for r in failed)
    # the run's first tags are the verdict and the failed rules (the UI lists tags in the order
    # they were first set), before the owner tags
    run = client.get_run(result.run_id)
    keys = [key for key in run.data.tags if key.startswith("consistency_gate.")]
    assert keys[:3] == ["consistency_gate.verdict", "consistency_gate.failed_rules", "consistency_gate.outcome"]
    assert run.data.tags["consistency_gate.failed_rules"] == ", ".join(dict.fromkeys(r.rule.metric for r in failed))
    # the version page says what it was gated against and why it failed; a person's own
    # description stays below the gate's paragraph, which the next gate replaces
    description = client.get_model_version(MODEL, "3").description
    assert description.startswith("FAILED v3 vs v1 (@champion) on eval.csv (150 samples): ")
    assert f"{failed[0].rule.describe()} failed" in description
    assert description.endswith(f" consistency-gate run {result.run_id}.")
    client.update_model_version(MODEL, "3", description=f"{description}\n\nTrained on the March data.")
    again = run_gate(MODEL, store["data"], candidate="3", config=STRICT, tracking_uri=store["uri"])
    description = client.get_model_version(MODEL, "3").description
    assert again.run_id in description and result.run_id not in description
    assert description.endswith("\n\nTrained on the March data.") and description.count("consistency-gate run ") == 1


def test_promote_on_pass_moves_alias(tmp_path):
    store = build_store(tmp_path)
    result = run_gate(MODEL, store["data"], candidate="2", config=LENIENT, tracking_uri=store["uri"], promote=True)
    assert result.promoted
    assert str(_client(store).get_model_version_by_alias(MODEL, "champion").version) == "2"
    # a what-if gate of the production version against an older one leaves its tags as they are
    tags = dict(_client(store).get_model_version(MODEL, "2").tags)
    what_if = run_gate(MODEL, store["data"], candidate="2", baseline="3", config=STRICT, tracking_uri=store["uri"])
    assert what_if.verdict == "failed" and _client(store).get_model_version(MODEL, "2").tags == tags
    assert any("a side comparison, so v2's tags are left as they were" in w for w in what_if.warnings)


def test_first_generation_checks_only_single_model_rules(store):
    config = parse_config("rules:\n  - {metric: acc, min: 0.9}\n  - {metric: con, min: 0.99}\n")
    with pytest.raises(DataError, match="column 'id' is not numeric"):
        run_gate("iris-torch", store["data"], config=config, tracking_uri=store["uri"])
    result = run_gate("iris-torch", store["data"], config=config, tracking_uri=store["uri"], id_column="id")
    assert result.first_generation and result.baseline is None
    assert [r.held for r in result.rules] == [True, None]
    assert "first generation" in result.rules[1].note
    assert result.verdict == "passed"
    assert set(result.metrics) == {"acc_candidate", "cacc_candidate@1", "cacc_candidate@5"}
    assert result.metrics["cacc_candidate@5"] is None  # k=5 of 3 classes: not applicable, said
    assert result.null_reasons["cacc_candidate@5"].startswith("not applicable: k=5 is larger than the 3 classes")
    assert result.cost == {} and "cost" not in result.timings  # no rule, no repair and no --cost asked for it


def test_serving_cost_is_measured_when_asked(store):
    config = parse_config("rules:\n  - {metric: acc, min: 0.9}\n")
    result = run_gate("iris-torch", store["data"], config=config, tracking_uri=store["uri"], id_column="id", cost=True)
    assert set(result.cost) == {"latency_ms_per_1000", "size_mb", "members", "latency_ratio", "size_ratio"}
    assert result.cost["latency_ratio"] == 1.0 and result.timings["cost"] > 0
    ruled = parse_config("rules:\n  - {metric: acc, min: 0.9}\n  - {metric: latency_ratio, max: 2}\n")
    result = run_gate("iris-torch", store["data"], config=ruled, tracking_uri=store["uri"], id_column="id")
    assert result.cost["latency_ratio"] == 1.0 and [r.held for r in result.rules] == [True, True]


def test_torch_candidate_against_sklearn_baseline(store, tmp_path):
    # the torch model registered under the sklearn model's name as a new version
    client = _client(store)
    src = client.get_model_version("iris-torch", "1")
    mv = client.create_model_version(MODEL, src.source, run_id=src.run_id)
    client.set_model_version_tag(MODEL, mv.version, "consistency_gate.classes", '["setosa", "versicolor", "virginica"]')
    result = run_gate(
        MODEL, store["data"], candidate=mv.version, config=LENIENT, tracking_uri=store["uri"], id_column="id"
    )
    assert result.metrics["pearson"] is not None and result.metrics["acc_candidate"] > 0.8


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"model": "no-such-model"}, ModelError, "not found"),
        ({"candidate": "99"}, ModelError, "version '99'"),
        ({"baseline": "@staging"}, ModelError, "alias '@staging' is not set"),
        ({"candidate": "\u00b2"}, ModelError, "version '\u00b2' of model 'iris-clf': expected a number or @alias"),
    ],
)
def test_registry_errors(store, kwargs, error, text):
    args = {"model": MODEL, "candidate": "2", "config": LENIENT, "tracking_uri": store["uri"], **kwargs}
    with pytest.raises(error, match=text):
        run_gate(args.pop("model"), store["data"], **args)


def test_data_errors(store, tmp_path):
    frame = pd.read_csv(store["data"])
    cases = {
        "nolabel.csv": (frame.drop(columns=["label"]), "column 'label' not found"),
        "nofeature.csv": (frame.drop(columns=["petal_width"]), "petal_width"),
        "empty.csv": (frame.iloc[:0], "no rows"),
        # a text cell makes the column text: a data error (exit 3), not the model's (GX's type check fails)
        "badtype.csv": (
            frame.assign(sepal_length=["long"] + list(frame["sepal_length"][1:])),
            "feature column 'sepal_length' is not numeric",
        ),
        "badlabel.csv": (
            frame.assign(label=["tulip"] + list(frame["label"][1:])),
            r"1 of \d+ labels are no class of the models \('tulip'\); their classes are 'setosa', 'versicolor', "
            "'virginica': write the labels as the models name their classes",
        ),
        "nolabel3.csv": (frame.assign(label=list(frame["label"][:2]) + [None] + list(frame["label"][3:])), "row 3, "),
    }
    for name, (data, text) in cases.items():
        data.to_csv(tmp_path / name, index=False)
        with pytest.raises(DataError, match=text):
            run_gate(MODEL, tmp_path / name, candidate="2", config=LENIENT, tracking_uri=store["uri"])


def test_validation_failure_is_logged_and_run_failed(store, tmp_path):
    frame = pd.read_csv(store["data"]).drop(columns=["petal_width"])
    frame.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(DataError):
        run_gate(MODEL, tmp_path / "bad.csv", candidate="2", config=LENIENT, tracking_uri=store["uri"])
    runs = mlflow.search_runs(experiment_names=[f"consistency-gate/{MODEL}"], order_by=["start_time DESC"])
    run_id = runs.iloc[0]["run_id"]
    assert runs.iloc[0]["status"] == "FAILED"
    assert runs.iloc[0]["tags.consistency_gate.verdict"] == "error"  # never decided: not "pending"
    validation = json.loads(mlflow.artifacts.load_text(f"runs:/{run_id}/gate/data_validation.json"))
    assert validation["success"] is False


def test_a_label_only_model_is_gated_on_what_labels_allow(store):
    class HardLabels(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input, params=None):
            return ["setosa"] * len(model_input)

    for _ in range(2):
        with mlflow.start_run(experiment_id=mlflow.get_experiment_by_name("training").experiment_id):
            mlflow.pyfunc.log_model(  # pip_requirements: not inferred (a subprocess reloading the model)
                name="model", python_model=HardLabels(), registered_model_name="hard-only", pip_requirements=[]
            )
    _client(store).set_registered_model_alias("hard-only", "champion", "1")
    cfg = parse_config("rules:\n  - {metric: ctoi, max: 0.5}\n")
    result = run_gate("hard-only", store["data"], candidate="2", config=cfg, tracking_uri=store["uri"], quiet=True)
    truth = pd.read_csv(store["data"])["label"]
    assert result.verdict == "passed"
    assert result.metrics["acc_candidate"] == pytest.approx((truth == "setosa").mean())
    assert result.metrics["con"] == 1.0 and result.metrics["ctoi"] == 0.0
    assert result.metrics["pearson"] is None and result.metrics["cosine"] is None
    assert "hard labels" in result.null_reasons["pearson"]
    said = [w for w in result.warnings if "class labels only" in w]
    assert len(said) == 1 and "top-k, Pearson and cosine are null" in said[0]
    assert "models:/hard-only/1 (" in said[0] and "models:/hard-only/2 (" in said[0]


def test_repairs_of_a_label_only_candidate_are_skipped_with_the_reason(store):
    class FirstClass(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input, params=None):
            return np.where(model_input["petal_length"] > 2.5, "versicolor", "setosa")

    with mlflow.start_run(experiment_id=mlflow.get_experiment_by_name("training").experiment_id):
        info = mlflow.pyfunc.log_model(
            name="model", python_model=FirstClass(), registered_model_name=MODEL, pip_requirements=[]
        )
    cfg = parse_config("rules:\n  - {metric: ctoi, max: 0.0}\nremediation:\n  strategy: [blend, rerank]\n")
    version = str(info.registered_model_version)
    result = run_gate(MODEL, store["data"], candidate=version, config=cfg, tracking_uri=store["uri"], quiet=True)
    assert result.verdict == "failed" and result.registered_version is None
    assert [a["verdict"] for a in result.attempts] == ["skipped", "skipped"]
    assert all("gives class labels only" in a["note"] for a in result.attempts)


def test_config_errors(tmp_path):
    bad = {
        "malformed.yaml": ("rules: [ {metric: con, min: 0.9\n", "malformed YAML"),
        "unknown.yaml": ("rules:\n  - {metric: con, min: 0.9}\n  - {metric: bogus, max: 1}\n", "line 3"),
        "delta.yaml": ("rules:\n  - {metric: con, min_delta: 0.1}\n", "min_delta applies"),
        "key.yaml": ("rulez: []\n", "unknown key 'rulez'"),
    }
    for name, (text, expected) in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(UsageError, match=expected):
            run_gate(MODEL, tmp_path / "x.csv", config=tmp_path / name, tracking_uri="sqlite:///unused.db")


def test_unreachable_server_fails_fast():
    with pytest.raises(TrackingError, match="unreachable"):
        run_gate(MODEL, "eval.csv", config=LENIENT, tracking_uri="http://127.0.0.1:9")


def test_verbose_tracebacks_keep_the_password_out(tmp_path):
    (tmp_path / "eval.csv").write_text("x,label\n1,a\n")
    uri = "http://alice:s3cretPW@127.0.0.1:9"
    proc = run_cli("--verbose", "check", "--model", MODEL, "--data", tmp_path / "eval.csv", "--tracking-uri", uri)
    assert proc.returncode == 5 and "Traceback" in proc.stderr, proc.stderr[-2000:]
    assert "s3cretPW" not in proc.stderr + proc.stdout and "alice:***@" in proc.stderr


def test_cli_check_exit_codes_and_report(store, tmp_path):
    config = tmp_path / "gate.yaml"
    config.write_text("rules:\n  - {metric: ctoi, max: 0.0}\n  - {metric: con, min: 1.0}\n")
    proc = run_cli(*check_args("3", store["data"], config, store["uri"], "--report", tmp_path / "r.json"))
    assert proc.returncode == 1, proc.stderr
    assert "FAILED" in proc.stdout
    assert read_report(tmp_path / "r.json")["verdict"] == "failed"
    config.write_text("rules:\n  - {metric: nope, max: 0.0}\n")
    proc = run_cli(
        "check", "--model", MODEL, "--data", store["data"], "--config", config, "--tracking-uri", store["uri"]
    )
    assert proc.returncode == 2 and "unknown metric 'nope'" in proc.stderr
    proc = run_cli("check", "--model", "ghost", "--data", store["data"], "--tracking-uri", store["uri"])
    assert proc.returncode == 4 and proc.stderr.startswith("error: ")
    proc = run_cli("check", "--model", MODEL, "--data", store["data"], "--tracking-uri", "http://127.0.0.1:9")
    assert proc.returncode == 5


def test_config_default_prints_parsable_yaml():
    proc = run_cli("config", "--default")
    assert proc.returncode == 0
    assert parse_config(proc.stdout).rules


def test_gate_nests_under_a_pipeline_run(store):
    mlflow.set_tracking_uri(store["uri"])
    mlflow.set_experiment("training")
    with mlflow.start_run() as parent:
        result = run_gate(MODEL, store["data"], candidate="2", config=LENIENT, tracking_uri=store["uri"])
        assert mlflow.active_run().info.run_id == parent.info.run_id
    gate_run = _client(store).get_run(result.run_id)
    assert gate_run.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert gate_run.info.experiment_id == mlflow.get_experiment_by_name(f"consistency-gate/{MODEL}").experiment_id
    with mlflow.start_run() as after:  # the pipeline's active experiment is still its own
        assert after.info.experiment_id == parent.info.experiment_id


def test_gates_started_together_share_one_experiment(tmp_path):
    """Get-or-create of the gate's experiment from many gates at once: one experiment, no error."""
    import threading

    from consistency_gate.mlops import tracking

    uri = sqlite_uri(tmp_path)  # the store's tables exist before the race starts
    mlflow.set_tracking_uri(uri)
    barrier, ids, errors = threading.Barrier(8), [], []

    def gate() -> None:
        barrier.wait()
        try:
            ids.append(tracking.experiment_id("consistency-gate/together", uri))
        except Exception as exc:  # noqa: BLE001 - the test reports any
            errors.append(exc)

    threads = [threading.Thread(target=gate) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(ids) == 8 and len(set(ids)) == 1


def test_a_dataframe_gates_like_its_file(store):
    frame = pd.read_csv(store["data"])
    before = frame.copy()
    from_frame = run_gate(MODEL, frame, candidate="3", config=LENIENT, tracking_uri=store["uri"], id_column="id")
    from_file = run_gate(MODEL, store["data"], candidate="3", config=LENIENT, tracking_uri=store["uri"], id_column="id")
    assert from_frame.verdict == from_file.verdict and from_frame.metrics == from_file.metrics
    pd.testing.assert_frame_equal(frame, before)  # the caller's frame is left as it was
    run = _client(store).get_run(from_frame.run_id)
    assert run.data.params["data"] == "DataFrame"
    with pytest.raises(DataError, match="DataFrame: column 'species' not found"):
        run_gate(MODEL, frame, candidate="3", config=LENIENT, tracking_uri=store["uri"], label_column="species")
    with pytest.raises(UsageError, match="engine='spark' reads the evaluation data from a file"):
        run_gate(MODEL, frame, candidate="3", config=LENIENT, tracking_uri=store["uri"], engine="spark")


def test_report_schema_command_prints_the_shipped_schema():
    import jsonschema

    from consistency_gate.report.schema import SCHEMA_VERSION, report_schema

    proc = run_cli("report-schema")
    assert proc.returncode == 0, proc.stderr
    schema = json.loads(proc.stdout)
    assert schema == report_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    error = {"schema_version": SCHEMA_VERSION, "verdict": "error", "error": "x.csv: file not found", "run_id": None}
    jsonschema.validate(error, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**error, "verdict": "passed"}, schema)  # neither a gate report nor an error report


def test_the_validation_suite_stays_small_however_wide_the_data():
    """GX runs each expectation separately: a wide set gets one table-level column check and type
    checks only where pandas' dtype does not fit, and the failures still come through GX."""
    from consistency_gate.io.validation import validate_evaluation_data

    columns = [f"f{i}" for i in range(300)]
    frame = pd.DataFrame(np.random.default_rng(0).random((40, 300)), columns=columns).assign(label=["a", "b"] * 20)
    types = dict.fromkeys(columns, "double")
    report = validate_evaluation_data(frame, "label", types, ["a", "b"])
    assert report.success and len(report.result["results"]) == 4
    bad = validate_evaluation_data(frame.drop(columns="f3").assign(f7="x"), "label", types, ["a", "b"])
    assert not bad.success and len(bad.failures) == 2
    assert bad.failures[0] == "expect_table_columns_to_match_set(exact_match=False): missing ['f3']"
    assert bad.failures[1].startswith("expect_column_values_to_be_in_type_list(column=f7): observed ")


def test_error_reports_before_the_run_starts_and_run_names_with_the_verdict(store, tmp_path):
    report = tmp_path / "r.json"
    proc = run_cli(
        "check", "--model", "ghost", "--data", store["data"], "--tracking-uri", store["uri"], "--report", report
    )
    saved = read_report(report)
    assert proc.returncode == 4 and saved == {**saved, "verdict": "error", "exit_code": 4, "run_id": None}
    assert "ghost" in saved["error"]
    result = run_gate(MODEL, store["data"], candidate="2", config=LENIENT, tracking_uri=store["uri"])
    run = _client(store).get_run(result.run_id)
    assert run.info.run_name == f"PASSED v2 vs v1 ({MODEL})"  # verdict and versions first: the list cuts the rest


def test_registry_messages_name_the_store_and_what_it_holds(store, tmp_path):
    proc = run_cli("check", "--model", "ghost", "--data", store["data"], "--tracking-uri", store["uri"])
    assert proc.returncode == 4 and store["uri"] in proc.stderr and "--tracking-uri" in proc.stderr
    with pytest.raises(ModelError, match=r"version '99' not found; it has versions 1, 2.* aliases @champion \(v1\)"):
        run_gate(MODEL, store["data"], candidate="99", config=LENIENT, tracking_uri=store["uri"])
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = run_cli("check", "--model", MODEL, "--data", store["data"], cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "no tracking store given and no mlflow.db in" in proc.stderr, proc.stderr
    assert not (tmp_path / "mlflow.db").exists()  # nothing created


def test_a_model_with_history_and_no_baseline_alias_is_exit_4_not_a_first_generation(store):
    client = _client(store)
    client.delete_registered_model_alias(MODEL, "champion")
    try:
        with pytest.raises(ModelError, match=r"earlier versions \(1, 2\) but no version holds @champion.*--baseline 2"):
            run_gate(MODEL, store["data"], candidate="3", config=LENIENT, tracking_uri=store["uri"], id_column="id")
        first = run_gate(MODEL, store["data"], candidate="1", config=LENIENT, tracking_uri=store["uri"], id_column="id")
        assert first.first_generation and first.verdict == "passed"  # v1 has no history: a true first generation
    finally:
        client.set_registered_model_alias(MODEL, "champion", "1")


def test_versions_a_gate_failed_are_no_history(store):
    """A failed first generation never became @champion: its successor is a first generation too."""
    client = _client(store)
    client.delete_registered_model_alias(MODEL, "champion")
    before = {v: client.get_model_version(MODEL, v).tags.get(TAG_VERDICT) for v in ("1", "2")}
    try:
        client.set_model_version_tag(MODEL, "1", TAG_VERDICT, "failed")
        with pytest.raises(ModelError, match=r"earlier versions \(2\) but no version holds @champion"):
            run_gate(MODEL, store["data"], candidate="3", config=LENIENT, tracking_uri=store["uri"], id_column="id")
        client.set_model_version_tag(MODEL, "2", TAG_VERDICT, "failed")
        third = run_gate(MODEL, store["data"], candidate="3", config=LENIENT, tracking_uri=store["uri"], id_column="id")
        assert third.first_generation and third.baseline is None
    finally:
        for version, verdict in before.items():
            if verdict is None:
                client.delete_model_version_tag(MODEL, version, TAG_VERDICT)
            else:
                client.set_model_version_tag(MODEL, version, TAG_VERDICT, verdict)
        client.set_registered_model_alias(MODEL, "champion", "1")


def test_a_newline_in_an_input_cannot_forge_a_line(store, tmp_path):
    (tmp_path / "eval.csv").write_text("x,label\n1,a\n")
    uri = store["uri"]
    proc = run_cli("check", "--model", "clf\nFAKE: PASSED", "--data", tmp_path / "eval.csv", "--tracking-uri", uri)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 4 and lines[-1].startswith("error: ") and "clf FAKE: PASSED" in lines[-1], proc.stderr
    assert not any(line.startswith("FAKE") for line in lines + proc.stdout.splitlines())


def test_a_typo_in_a_sqlite_path_is_refused_without_creating_a_store(store, tmp_path):
    """A registry gate (and history) on a SQLite file that does not exist: exit 5 naming the path, and no empty
    store left behind (MLflow would create one, and the gate then said the model was not found: exit 4)."""
    typo = tmp_path / "mlfow.db"
    for args in (("check", "--model", MODEL, "--data", store["data"]), ("history", "--model", MODEL)):
        proc = run_cli(*args, "--tracking-uri", f"sqlite:///{typo}")
        (line,) = proc.stderr.strip().splitlines()
        assert proc.returncode == 5 and f"no such file {typo}" in line and "fix the path" in line, proc.stderr
        assert not typo.exists()


@pytest.mark.slow  # waits out SQLite's busy timeout in a process of its own
def test_a_sqlite_store_locked_by_another_process_is_one_line_exit_5(store, tmp_path):
    """Another process holds the SQLite file (a long write): the gate says so in one line, with what to do,
    exit 5 (was exit 6 and SQLAlchemy's statement; during a gate, 68 lines of MLflow's logged tracebacks)."""
    import sqlite3

    path = store["uri"].removeprefix("sqlite:///")
    holder = sqlite3.connect(path, timeout=60)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        proc = run_cli("check", "--model", MODEL, "--data", store["data"], "--tracking-uri", store["uri"], process=True)
    finally:
        holder.rollback()
        holder.close()
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 5 and "database is locked; another process is writing to the SQLite file" in line
    assert "[SQL:" not in line, line


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3_000), st.data())
def test_the_logged_schema_is_the_one_mlflow_infers_from_every_row(rows, data):
    """The dataset's schema, types from the first rows and missing values found by pandas, is MLflow's own inference
    over every value (``_infer_schema``), wherever a column's first missing value is; object columns are left to
    MLflow (None)."""
    from mlflow.types.utils import _infer_schema

    from consistency_gate.mlops.datasets import _frame_schema

    gap = data.draw(st.integers(0, rows - 1))  # the row that misses its value, in the columns that may miss one
    frame = pd.DataFrame(
        {
            "f32": np.ones(rows, np.float32),
            "f64": np.where(np.arange(rows) == gap, np.nan, 0.5),
            "i64": np.arange(rows),
            "flag": np.ones(rows, bool),
            "text": pd.Series(["a"] * rows).mask(np.arange(rows) == gap),
            "kind": pd.Categorical(["x", "y"] * (rows // 2) + ["x"] * (rows % 2)),
            "at": pd.Timestamp("2026-01-01") + pd.to_timedelta(np.arange(rows), unit="s"),
        }
    )
    assert _frame_schema(frame).to_dict() == _infer_schema(frame).to_dict()
    assert _frame_schema(frame.astype({"i64": object})) is None
