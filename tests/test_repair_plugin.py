"""Repairs are plug-ins: a repair of our own (tests/toy_repair.py, one module and one entry) is named in a gate
config, gated end to end on a real SQLite registry, described in its own words in the report, the run and the
version, and served; its options are checked by its own model; a setting no one else knows is never guessed at."""

import json

import mlflow
import pandas as pd
import pytest
from conftest import read_report, run_cli
from mlflow import MlflowClient
from registry_fixtures import MODEL, build_store, check_args

from consistency_gate.ensembles.methods import METHODS, Built, resolve
from consistency_gate.errors import UsageError
from consistency_gate.gate.config import parse_config
from consistency_gate.report.verdict import verdict_markdown, verdict_table


@pytest.fixture(autouse=True)
def _methods_as_shipped():
    """A method of our own registers itself in the process's table: each test leaves the table as it found it,
    so that other tests in this worker see the methods the package ships."""
    shipped = dict(METHODS)
    yield
    METHODS.clear()
    METHODS.update(shipped)


LENIENT = "rules:\n  - {metric: ctoi, max: 0.1}\n  - {metric: acc, min_delta: -0.1}\nks: [1]\n"
TOY = 'remediation:\n  strategy: ["toy_repair:ABSTAIN"]\n  options:\n    abstain: {margin: 0.7}\n'


@pytest.mark.slow  # models logged, registered and loaded back
def test_a_repair_of_our_own_is_gated_registered_and_described_in_its_own_words(tmp_path):
    store = build_store(tmp_path)
    config = tmp_path / "gate.yaml"
    config.write_text(LENIENT + TOY)
    report_path = tmp_path / "report.json"
    proc = run_cli(*check_args("3", store["data"], config, store["uri"], "--id-column", "id", "--report", report_path))
    report = read_report(report_path)  # the schema knows what a method of our own reports
    assert proc.returncode == 0, proc.stderr
    assert report["candidate_verdict"] == "failed" and report["outcome"] == "remediated"
    repair = report["ensemble"]
    deferred = repair["setting"]["deferred"]
    assert repair["method"] == repair["kind"] == "abstain" and repair["setting"]["margin"] == 0.7 and deferred > 0
    title = f"abstain repair (margin 0.7: {deferred} answers deferred)"
    assert repair["described"] == {"noun": "abstain repair", "title": title, "served": "the abstain repair (2 models)"}
    assert f"Remediation: {title}: PASSED" in proc.stdout
    assert f"FAILED; the abstain repair v{report['registered_version']} PASSED in its place" in proc.stdout
    client = MlflowClient(tracking_uri=store["uri"])
    version = client.get_model_version(MODEL, report["registered_version"])
    assert version.tags["consistency_gate.kind"] == "abstain" and version.tags["consistency_gate.replaces"] == "3"
    assert version.description.startswith(f"PASSED v{version.version} (abstain repair of v3) vs v1 (@champion)")
    run = client.get_run(report["run_id"])
    assert title in run.data.tags["mlflow.note.content"]  # the run's description
    mlflow.set_tracking_uri(store["uri"])
    frame = pd.read_csv(store["data"])
    served = mlflow.pyfunc.load_model(f"models:/{MODEL}/{version.version}").predict(frame.drop(columns=["label", "id"]))
    flips = pd.read_csv(client.download_artifacts(repair["run_id"], "gate/flips.csv", str(tmp_path)))
    gated = flips.set_index("id").loc[frame["id"], "candidate_prediction"].astype(str)
    assert served.idxmax(axis=1).tolist() == gated.tolist()  # what was gated is what serves


def test_a_method_of_our_own_is_registered_by_name_and_its_options_checked_by_its_own_model():
    cfg = parse_config(LENIENT + TOY)
    assert cfg.remediation.methods == ("abstain",) and METHODS["abstain"] is resolve("toy_repair:ABSTAIN")
    assert cfg.remediation.for_method("abstain").own.margin == 0.7
    with pytest.raises(UsageError, match=r"line 7: remediation.options: abstain.margin: Input should be less than"):
        parse_config(LENIENT + TOY.replace("0.7", "1.5"))
    with pytest.raises(UsageError, match=r"abstain.k: unknown option of abstain \(its options: margin\)"):
        parse_config(LENIENT + TOY.replace("margin: 0.7", "k: 3"))


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ("strategy: [rerank]\n  options: {rerank: {k: 1}}", "rerank.k: Input should be greater than or equal to 2"),
        ("strategy: [blend]\n  options: {blend: {weight: 2}}", "blend.weight: Input should be less than or equal to 1"),
        ("strategy: [blend]\n  options: {blend: {k: 3}}", "blend.k: unknown option of blend (its options: weight)"),
        ("strategy: [blend]\n  options: {lend: {}}", "remediation method 'lend' is unknown; use one of blend"),
        ("strategy: [rerank]\n  k: 2\n  options: {rerank: {k: 3}}", "k: and options: rerank: k: both set rerank's k"),
        ("strategy: ['no_such_module:X']", "cannot import it (No module named 'no_such_module')"),
        ("strategy: ['json:dumps']", "remediation method 'json:dumps' is a function, not a consistency_gate"),
        ("strategy: [memory]\n  options: {memory: {decay: 0}}", "memory.decay: Input should be greater than 0"),
        (
            "strategy: [memory]\n  options: {memory: {likelihood: labels}}",
            "memory.likelihood: Input should be 'answers'",
        ),
    ],
    ids=[
        "k below 2",
        "weight above 1",
        "another's key",
        "unknown method",
        "both ways",
        "no module",
        "not a Method",
        "decay 0",
        "unknown likelihood",
    ],  # fmt: skip
)
def test_bad_options_and_methods_are_one_line_usage_errors(block, message):
    with pytest.raises(UsageError) as caught:
        parse_config(LENIENT + "remediation:\n  " + block + "\n")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_short_forms_are_the_methods_options():
    cfg = parse_config(LENIENT + "remediation:\n  strategy: cheapest\n  weight: 0.3\n  k: 4\n  cost_ratio: 2.0\n")
    own = {name: cfg.remediation.for_method(name).own.model_dump() for name in ("blend", "rerank", "bayesian-update")}
    assert own == {
        "blend": {"weight": 0.3},
        "rerank": {"k": 4},
        "bayesian-update": {"generations": None, "cost_ratio": 2.0},
    }


def test_the_verdict_reads_what_the_method_said_and_guesses_no_setting_key():
    """A setting with keys no built-in repair has (the KeyError 'k' that was exit 6) reads as its method said."""
    built = Built(None, None, 2, 0.0, None, setting={"margin": 0.5, "deferred": 7})
    ens = {
        "method": "abstain", "kind": "abstain", "verdict": "passed", "rules": [], "metrics": {}, "members": 2,
        "setting": built.setting, "described": resolve("toy_repair:ABSTAIN").describe("abstain", built).to_dict(),
        "registered_version": "4",
    }  # fmt: skip
    report = {
        "candidate": {"name": "clf", "version": "3"}, "baseline": {"version": "1"}, "n": 10, "verdict": "passed",
        "outcome": "remediated", "registered_version": "4", "null_reasons": {}, "ensemble": ens,
        "rules": [{"metric": "ctoi", "condition": "<= 0.02", "value": 0.1, "interval": None, "held": False,
                   "note": ""}],
    }  # fmt: skip
    text = verdict_table(report)
    assert "Remediation: abstain repair (margin 0.5: 7 answers deferred): PASSED" in text
    assert "Registered the abstain repair as v4 (tags consistency_gate.kind=abstain" in text
    assert "clf v3 FAILED; the abstain repair v4 PASSED in its place" in verdict_markdown(report)
    assert json.dumps(report)  # what the report holds is plain JSON
