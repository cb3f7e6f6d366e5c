"""The gate against a real `mlflow server` process on 127.0.0.1, then with the server killed mid-gate:
its runs end FAILED when the server is back within the gate's retry budget; otherwise the gate names
the runs it left RUNNING and the next gate of the model closes them."""

import json
import os
import re
import time
from pathlib import Path

import pytest
from conftest import read_report, run_cli, start_cli
from mlflow import MlflowClient
from mlflow_server import MlflowServer
from registry_fixtures import MODEL, build_store, check_args

import consistency_gate

pytestmark = pytest.mark.slow  # a real mlflow server per module


@pytest.fixture
def server(tmp_path):
    srv = MlflowServer(tmp_path, gunicorn=True).start()
    yield srv
    srv.kill()


def test_gate_over_http_then_server_killed_mid_gate(server, tmp_path):
    store = build_store(tmp_path, uri=server.url)
    config = tmp_path / "gate.yaml"
    config.write_text("rules:\n  - {metric: con, min: 0.5}\n")

    summary = tmp_path / "summary.md"
    first = run_cli(
        *check_args("2", store["data"], config, server.url, "--id-column", "id", "--format", "markdown"),
        "--summary",
        summary,
    )
    assert first.returncode == 0, first.stderr
    http = MlflowClient(tracking_uri=server.url, registry_uri=server.url)
    # over http(s) the Markdown verdict links the run and the model versions in the MLflow UI
    assert first.stdout.strip() == summary.read_text().strip()
    experiment, run_id = re.search(
        rf"\({server.url}/#/experiments/(\w+)/runs/(\w+)\?workflowType=machine_learning\)", first.stdout
    ).groups()
    assert http.get_run(run_id).info.experiment_id == experiment
    versions = f"{server.url}/#/models/{MODEL}/versions"
    assert f"Gate [{MODEL} v2]({versions}/2) against [v1 (@champion)]({versions}/1) on" in first.stdout
    assert http.get_model_version(MODEL, "2").tags["consistency_gate.verdict"] == "passed"
    # a version number past the registry's integers was answered 500 and read as "unreachable";
    # a wrong path under the server (HTTP 404) was exit 6
    huge = run_cli(*check_args("12345678901234567890", store["data"], config, server.url))
    assert huge.returncode == 4 and "version '12345678901234567890' not found" in huge.stderr, huge.stderr[-2000:]
    wrong = run_cli(*check_args("2", store["data"], config, f"{server.url}/no/such/path"))
    assert wrong.returncode == 5 and "Traceback" not in wrong.stderr, wrong.stderr[-2000:]
    # MLflow's own "View run ... at: URL" line printed the password of the tracking URI; with its INFO
    # lines on, nothing of it is printed either
    secret = server.url.replace("http://", "http://alice:s3cretPW@")
    info = {**os.environ, "MLFLOW_LOGGING_LEVEL": "INFO"}
    chatty = run_cli(*check_args("2", store["data"], config, secret), env=info)
    assert chatty.returncode == 0 and "View run" not in chatty.stderr, chatty.stderr[-2000:]
    assert "s3cretPW" not in chatty.stderr + chatty.stdout

    # second gate, which would pass and promote v3, loses its server once its run has logged its params,
    # and the server stays away longer than the gate's budget for ending its runs
    gate, logged = _kill_mid_gate(server, store, config, tmp_path, retry_s="2")
    _, stderr = gate.communicate(timeout=120)  # a hang guard, not a measurement: the budget is 2 s of retries
    assert gate.returncode == 5, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "runs left RUNNING" in last
    report = read_report(tmp_path / "report.json")
    assert report["verdict"] == "error" and report["left_running"] == [report["run_id"]]
    assert report["run_id"] in last

    local = MlflowClient(tracking_uri=server.db, registry_uri=server.db)
    assert str(local.get_model_version_by_alias(MODEL, "champion").version) == "1"
    assert "consistency_gate.verdict" not in local.get_model_version(MODEL, "3").tags
    assert local.get_run(report["run_id"]).info.status == "RUNNING"

    # what the killed gate had logged is still there once the server is back; the next gate of any
    # model on the store (here prediction files under another name, in another experiment) finds the
    # run orphaned (its process is gone) and ends it FAILED, saying why
    server.start()
    http = MlflowClient(tracking_uri=server.url, registry_uri=server.url)
    killed = http.get_run(report["run_id"])
    assert killed.data.params == logged
    assert killed.data.params["model"] == MODEL
    examples = Path(consistency_gate.__file__).parent / "examples"
    files = ("--labels", examples / "labels.csv", "--previous-predictions", examples / "previous.csv")
    third = run_cli(
        "check", *files, "--candidate-predictions", examples / "previous.csv", "--id-column", "id",
        "--name", "other-model", "--tracking-uri", server.url, "--config", config, "--format", "json",
    )  # fmt: skip
    assert third.returncode == 0, third.stderr
    assert http.get_run(json.loads(third.stdout)["run_id"]).info.experiment_id != killed.info.experiment_id
    closed = http.get_run(report["run_id"])
    assert closed.info.status == "FAILED"
    assert closed.data.tags["consistency_gate.error"].startswith("orphaned")


def test_runs_end_failed_when_the_server_comes_back_within_the_budget(server, tmp_path):
    store = build_store(tmp_path, uri=server.url)
    config = tmp_path / "gate.yaml"
    config.write_text("rules:\n  - {metric: con, min: 0.5}\n")
    gate, _ = _kill_mid_gate(server, store, config, tmp_path, retry_s="120")
    time.sleep(3)
    server.start()
    _, stderr = gate.communicate(timeout=300)
    assert gate.returncode == 5, stderr
    assert "left RUNNING" not in stderr
    local = MlflowClient(tracking_uri=server.db, registry_uri=server.db)
    run_id = read_report(tmp_path / "report.json")["run_id"]
    run = local.get_run(run_id)
    assert run.info.status == "FAILED"
    assert "consistency_gate.error" in run.data.tags
    assert str(local.get_model_version_by_alias(MODEL, "champion").version) == "1"
    assert all(r.info.status != "RUNNING" for r in local.search_runs([run.info.experiment_id]))


def _kill_mid_gate(server, store, config, tmp_path, retry_s: str):
    """Start a gate of v3 with --promote and kill the server once its run has logged its params
    (the run and its params are two requests: waiting for the run alone races with the params)."""
    env = {**os.environ, "CONSISTENCY_GATE_END_RUN_RETRY_S": retry_s}
    args = check_args("3", store["data"], config, server.url, "--id-column", "id", "--promote")
    gate = start_cli(*args, "--report", tmp_path / "report.json", env=env)
    local = MlflowClient(tracking_uri=server.db, registry_uri=server.db)
    experiment = local.get_experiment_by_name(f"consistency-gate/{MODEL}")
    logged: dict[str, str] = {}
    deadline = time.time() + 120
    while time.time() < deadline and gate.poll() is None and not logged:
        runs = local.search_runs([experiment.experiment_id]) if experiment else []
        second = [r.data.params for r in runs if r.data.params.get("candidate_version") == "3"]
        logged = dict(second[0]) if second else {}
        experiment = experiment or local.get_experiment_by_name(f"consistency-gate/{MODEL}")
        time.sleep(0.05)
    assert gate.poll() is None, "the gate finished before the server could be killed"
    assert logged, "the gate logged no params within 120 s"
    server.kill()
    return gate, logged
