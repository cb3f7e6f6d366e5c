"""The gate against a real `mlflow server` process on 127.0.0.1, then with the server killed mid-gate."""

import time

import pytest
from conftest import run_cli, start_cli
from mlflow import MlflowClient
from mlflow_server import MlflowServer
from registry_fixtures import MODEL, build_store, check_args


@pytest.fixture
def server(tmp_path):
    srv = MlflowServer(tmp_path).start()
    yield srv
    srv.kill()


def test_gate_over_http_then_server_killed_mid_gate(server, tmp_path):
    store = build_store(tmp_path, uri=server.url)
    config = tmp_path / "gate.yaml"
    config.write_text("rules:\n  - {metric: con, min: 0.5}\n")

    first = run_cli(*check_args("2", store["data"], config, server.url, "--id-column", "id"))
    assert first.returncode == 0, first.stderr
    http = MlflowClient(tracking_uri=server.url, registry_uri=server.url)
    assert http.get_model_version(MODEL, "2").tags["consistency_gate.verdict"] == "passed"

    # second gate, which would pass and promote v3, loses its server once its run has logged its params
    # (the run and its params are two requests: waiting for the run alone races with the params)
    gate = start_cli(*check_args("3", store["data"], config, server.url, "--id-column", "id", "--promote"))
    local = MlflowClient(tracking_uri=server.db, registry_uri=server.db)
    experiment = local.get_experiment_by_name(f"consistency-gate/{MODEL}")
    logged: dict[str, str] = {}
    deadline = time.time() + 120
    while time.time() < deadline and gate.poll() is None and not logged:
        runs = local.search_runs([experiment.experiment_id])
        second = [r.data.params for r in runs if r.data.params.get("candidate_version") == "3"]
        logged = dict(second[0]) if second else {}
        time.sleep(0.05)
    assert gate.poll() is None, "the gate finished before the server could be killed"
    assert logged, "the second gate logged no params within 120 s"
    server.kill()
    killed_at = time.time()
    _, stderr = gate.communicate(timeout=120)
    assert gate.returncode == 5, stderr
    assert time.time() - killed_at < 60
    assert stderr.strip().splitlines()[-1].startswith("error: ")

    assert str(local.get_model_version_by_alias(MODEL, "champion").version) == "1"
    assert "consistency_gate.verdict" not in local.get_model_version(MODEL, "3").tags
    runs = local.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"])
    assert runs[0].data.tags.get("consistency_gate.verdict") != "passed"
    assert runs[0].info.status != "FINISHED"

    # what the killed gate had logged is still there once the server is back
    server.start()
    http = MlflowClient(tracking_uri=server.url, registry_uri=server.url)
    killed = http.get_run(runs[0].info.run_id)
    assert killed.data.params == logged
    assert killed.data.params["model"] == MODEL
