"""Ledgers are checked before history or a gate uses them, on a real SQLite store: a gate's
``gate/answers.parquet`` with no rows, other columns, an id twice or bytes that are not Parquet is reported
by ``history`` as missing with the reason (never exit 6, never a figure over fewer samples), and a gate whose
history rule names a champion that ledger answered fails safe: not promoted, the rule's note says why."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote, urlparse

import pandas as pd
import pytest
from conftest import read_report, run_cli
from mlflow import MlflowClient
from registry_fixtures import iris_frames
from test_history_registry import _recipe_models, _register, gated_store

from consistency_gate.gate.config import parse_config
from consistency_gate.gate.run import run_gate
from consistency_gate.mlops import tracking

MODEL = "iris-ledgers"
PASS = parse_config("rules:\n  - {metric: acc, min: 0.5}\n")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """v1..v4 registered; gates promote v2 (run ``first``, the only ledger that holds v1's answers) and v3."""
    built = gated_store(tmp_path_factory.mktemp("ledgers"), MODEL, 4, (("2", PASS), ("3", PASS)))
    uri, runs = built["uri"], built["runs"]
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    ledger = Path(unquote(urlparse(client.get_run(runs[0]).info.artifact_uri).path)) / tracking.LEDGER
    return {"uri": uri, "data": built["data"], "first": runs[0], "ledger": ledger, "n": len(built["x"])}


def _zero_rows(frame: pd.DataFrame, path: Path) -> None:
    frame.head(0).to_parquet(path, index=False)


def _other_columns(frame: pd.DataFrame, path: Path) -> None:
    frame.rename(columns={"id": "sample"}).to_parquet(path, index=False)


def _an_id_twice(frame: pd.DataFrame, path: Path) -> None:
    pd.concat([frame, frame.head(1)]).to_parquet(path, index=False)


def _not_parquet(frame: pd.DataFrame, path: Path) -> None:
    path.write_bytes(b"these bytes are not a Parquet file")


@pytest.fixture(params=[_zero_rows, _other_columns, _an_id_twice, _not_parquet], ids=lambda f: f.__name__[1:])
def broken(request, store):
    """The first gate's ledger damaged as the parameter says, restored after the test."""
    original = store["ledger"].read_bytes()
    request.param(pd.read_parquet(store["ledger"]), store["ledger"])
    yield request.param
    store["ledger"].write_bytes(original)


REASONS = {
    _zero_rows: "holds 0 rows where its gate judged 150 samples",
    _other_columns: "has columns ['sample', 'label', 'previous', 'candidate'], not id, label, previous, candidate",
    _an_id_twice: "holds id 's0' more than once",
    _not_parquet: "is not a readable Parquet file",
}


def test_history_reports_a_damaged_ledger_as_missing_with_the_reason(store, broken):
    proc = run_cli("history", "--model", MODEL, "--tracking-uri", store["uri"], "--format", "json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout)
    assert report["missing"] == ["1"] and report["champions"] == ["1", "2", "3"]
    reason = report["missing_reasons"]["1"]
    assert reason.startswith(f"run {store['first']}: gate/answers.parquet ") and REASONS[broken] in reason
    assert [s["version"] for s in report["steps"]] == ["3"]  # v1 -> v2 is left out, not counted over no sample
    text = run_cli("history", "--model", MODEL, "--tracking-uri", store["uri"])
    assert text.returncode == 0 and f"No usable answers for v1 (run {store['first']}" in text.stdout


def test_a_history_rule_naming_a_champion_without_a_usable_ledger_fails_safe(store, broken, tmp_path):
    """v4 against v3 with ``forgotten`` over three champions (v1, v2, v3): v1's answers are in the damaged
    ledger only, so the rule cannot be measured and fails; nothing is promoted and the note says what to do."""
    config = tmp_path / "gate.yaml"
    config.write_text("rules:\n  - {metric: acc, min: 0.5}\n  - {metric: forgotten, max: 0.9, history: 3}\n")
    report_path = tmp_path / "report.json"
    args = ["check", "--model", MODEL, "--candidate", "4", "--data", store["data"], "--id-column", "id"]
    proc = run_cli(*args, "--tracking-uri", store["uri"], "--config", config, "--promote", "--report", report_path)
    report = read_report(report_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert report["verdict"] == "failed" and report["promoted"] is False and report["passed_version"] is None
    (rule,) = [r for r in report["rules"] if r["metric"] == "forgotten"]
    assert rule["held"] is False and rule["value"] is None and report["null_reasons"]["forgotten"] in rule["note"]
    note = report["null_reasons"]["forgotten"]
    assert f"metric is null: rule fails ({note})" in proc.stdout  # the rule table says why, on its row
    assert note.startswith("v1's answers are in no usable ledger (run ") and REASONS[broken] in note
    assert "gate v1 again to log its answers, or name fewer champions (history:)" in note
    client = MlflowClient(tracking_uri=store["uri"])
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == "3"


def test_with_the_ledger_whole_the_same_rule_is_measured(store, tmp_path):
    config = tmp_path / "gate.yaml"
    config.write_text("rules:\n  - {metric: acc, min: 0.5}\n  - {metric: forgotten, max: 0.9, history: 3}\n")
    result = run_gate(MODEL, store["data"], candidate="4", config=parse_config(config.read_text()),
                      tracking_uri=store["uri"], id_column="id")  # fmt: skip
    assert result.metrics["forgotten"] is not None and "forgotten" not in result.null_reasons


def test_a_promotion_no_gate_recorded_stays_in_the_chain(store):
    """v2 passes a gate that does not promote, and @champion is moved to it by hand (as after a gate killed
    at the alias move); v3's gate, against @champion, promotes. The chain is what held the alias, v1 v2 v3,
    not v2 v3 (from the promotions alone), and history counts both updates."""
    name = "iris-chain"
    x, y = iris_frames()
    for model in _recipe_models(x, y)[:3]:
        _register(model, name)
    client = MlflowClient(tracking_uri=store["uri"], registry_uri=store["uri"])
    client.set_registered_model_alias(name, "champion", "1")
    gate = dict(config=PASS, tracking_uri=store["uri"], id_column="id")
    assert run_gate(name, store["data"], candidate="2", **gate).verdict == "passed"
    client.set_registered_model_alias(name, "champion", "2")
    assert run_gate(name, store["data"], candidate="3", promote=True, **gate).promoted is True
    proc = run_cli("history", "--model", name, "--tracking-uri", store["uri"], "--format", "json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["champions"] == ["1", "2", "3"], proc.stdout + proc.stderr
    assert [(s["previous"], s["version"]) for s in report["steps"]] == [("1", "2"), ("2", "3")]
