"""What the records say after faults, on real SQLite stores: an earlier gate's report that cannot be read never
lets a history rule pass on fewer champions, a promotion the records missed is still in the chain of champions
(the registry holds it), and a retried rollback is a no-op that says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import read_report, run_cli
from mlflow import MlflowClient
from test_history_registry import PASS, gated_store

from consistency_gate.gate.config import parse_config
from consistency_gate.gate.run import run_gate

pytestmark = pytest.mark.slow  # registry stores and their gate runs

DAMAGED = "iris-damaged"
KILLED = "iris-killed"


def _client(store: dict) -> MlflowClient:
    return MlflowClient(tracking_uri=store["uri"], registry_uri=store["uri"])


def _champion(store: dict, name: str) -> str:
    return str(_client(store).get_model_version_by_alias(name, "champion").version)


def _history(store: dict, name: str) -> dict:
    proc = run_cli("history", "--model", name, "--tracking-uri", store["uri"], "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_an_unreadable_earlier_report_fails_a_history_rule_and_never_promotes(tmp_path):
    store = gated_store(tmp_path, DAMAGED, 4, (("2", PASS), ("3", PASS)))
    client = _client(store)
    client.log_text(store["runs"][0], '{"verdict": "passed", "candidate": ', "gate/report.json")  # damaged
    # forgotten over 3 champions (v1, v2, v3) with a threshold any candidate meets: only a history that drops
    # the damaged gate could measure it, on fewer champions than the rule names
    rules = parse_config("rules:\n  - {metric: forgotten, max: 1.0, history: 3}\n")
    result = run_gate(DAMAGED, store["data"], candidate="4", config=rules, tracking_uri=store["uri"], promote=True,
                      id_column="id")  # fmt: skip
    assert result.verdict == "failed" and not result.promoted, result.null_reasons
    assert "gate/report.json is not JSON" in result.null_reasons["forgotten"]
    assert _champion(store, DAMAGED) == "3"
    # the same rule over one champion (the baseline) needs no history: it passes
    one = parse_config("rules:\n  - {metric: forgotten, max: 1.0, history: 1}\n")
    again = run_gate(DAMAGED, store["data"], candidate="4", config=one, tracking_uri=store["uri"], id_column="id")
    assert again.verdict == "passed"
    # history says what it could not read; a rollback without --to does not guess
    report = _history(store, DAMAGED)
    assert list(report["unreadable"]) == [store["runs"][0]]
    table = run_cli("history", "--model", DAMAGED, "--tracking-uri", store["uri"])
    assert "Not read: run " in table.stdout and "gate/report.json is not JSON" in table.stdout
    proc = run_cli("rollback", "--model", DAMAGED, "--tracking-uri", store["uri"])
    assert proc.returncode == 4 and "--to VERSION" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert _champion(store, DAMAGED) == "3"


def test_a_promotion_the_records_missed_is_in_the_chain_and_a_retried_rollback_moves_nothing(tmp_path):
    store = gated_store(tmp_path, KILLED, 3, (("2", PASS),))
    client = _client(store)
    run_id = store["runs"][0]
    # what a gate killed right after the server moved the alias leaves: its report logged before the move
    # (promotion unknown), the run ended FAILED by the next gate; the registry holds v2
    logged = json.loads(Path(client.download_artifacts(run_id, "gate/report.json", str(tmp_path))).read_text())
    pending = {
        **logged,
        "promoted": None,
        "passed_version": None,
        "promotion": {**logged["promotion"], "promoted": None, "holds": "unknown", "reason": "pending"},
    }
    client.log_dict(run_id, pending, "gate/report.json")
    client.set_tag(run_id, "consistency_gate.promoted", "unknown")
    client.set_terminated(run_id, "FAILED")
    assert _champion(store, KILLED) == "2"
    assert _history(store, KILLED)["champions"] == ["1", "2"]

    first = tmp_path / "first.json"
    proc = run_cli("rollback", "--model", KILLED, "--tracking-uri", store["uri"], "--report", first)
    assert proc.returncode == 0 and "v2 -> v1: rolled back, read back" in proc.stdout, proc.stderr
    rolled = read_report(first)
    assert rolled["verdict"] == "rolled back" and rolled["promoted"] is True
    assert client.get_run(rolled["run_id"]).data.tags["consistency_gate.verdict"] == "rolled back"
    description = client.get_model_version(KILLED, "1").description
    assert description.startswith("RESTORED v1 as @champion in place of v2: rolled back by hand.")

    again = tmp_path / "again.json"  # the same command again, as after a lost response
    proc = run_cli("rollback", "--model", KILLED, "--tracking-uri", store["uri"], "--report", again)
    assert proc.returncode == 0, proc.stderr
    assert "nothing moved (a retried rollback is a no-op)" in proc.stdout
    retried = read_report(again)
    assert retried["outcome"] == "already rolled back" and retried["rolled_back_by"] == rolled["run_id"]
    assert _champion(store, KILLED) == "1"
    assert _history(store, KILLED)["champions"] == ["1", "2", "1"]
    # the next gate's chain keeps v1 before v2
    result = run_gate(KILLED, store["data"], candidate="3", config=PASS, tracking_uri=store["uri"], promote=True,
                      id_column="id")  # fmt: skip
    assert result.promoted is True
    assert _history(store, KILLED)["champions"] == ["1", "2", "1", "3"]
