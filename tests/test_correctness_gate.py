"""The run's tags, exit 6 for internal errors, the cause of a data error
first, and a tracking server that refuses the gate (real SQLite stores and real `mlflow server`s)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import run_cli
from http_proxy import ForwardProxy
from mlflow import MlflowClient
from mlflow_server import MlflowServer
from registry_fixtures import MODEL, build_store, check_args

from consistency_gate import cli

COMPOSE = Path(__file__).resolve().parents[1] / "docker" / "compose.yaml"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("store"))


def _config(tmp_path, text="rules:\n  - {metric: con, min: 0.5}\n"):
    path = tmp_path / "gate.yaml"
    path.write_text(text)
    return path


# ---------------------------------------------------------------- item 8: internal errors are exit 6


def _main(argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as stop:
        cli.main([str(a) for a in argv])
    return stop.value.code, capsys.readouterr().err


def test_an_internal_error_is_exit_6_with_one_line(monkeypatch, capsys, tmp_path):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("division by zero\nsecond line")

    monkeypatch.setattr("consistency_gate.engines.local.compare_files", broken)
    args = ["compare", "--labels", tmp_path / "l.csv", "--previous", tmp_path / "p.csv", "--candidate", tmp_path / "c"]
    code, err = _main(args, capsys)
    assert code == 6
    assert err.strip().splitlines() == [err.strip()]
    assert "internal error: ZeroDivisionError: division by zero" in err and "please report it" in err
    code, err = _main(["--verbose", *args], capsys)
    assert code == 6 and "Traceback (most recent call last)" in err


def test_an_internal_error_mid_gate_never_promotes(monkeypatch, capsys, store, tmp_path):
    client = MlflowClient(tracking_uri=store["uri"], registry_uri=store["uri"])
    before = client.get_model_version_by_alias(MODEL, "champion").version

    def broken(*args, **kwargs):
        raise KeyError("a bug while logging the diagnosis")

    monkeypatch.setattr("consistency_gate.gate.run._log_diagnosis", broken)
    code, err = _main([*check_args("2", store["data"], _config(tmp_path), store["uri"]), "--promote"], capsys)
    assert code == 6 and "internal error: KeyError" in err
    assert client.get_model_version_by_alias(MODEL, "champion").version == before
    runs = client.search_runs(
        [client.get_experiment_by_name(f"consistency-gate/{MODEL}").experiment_id],
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    assert runs[0].info.status == "FAILED"


# ---------------------------------------------------------------- item 9: the real cause first


def test_a_missing_feature_column_is_reported_first_and_alone(store, tmp_path):
    data = tmp_path / "eval.csv"
    pd.read_csv(store["data"]).drop(columns=["petal_width"]).to_csv(data, index=False)
    proc = run_cli(*check_args("2", data, _config(tmp_path), store["uri"], "--id-column", "id"))
    assert proc.returncode == 3
    line = proc.stderr.strip()
    assert "feature column 'petal_width' is missing" in line and f"models:/{MODEL}/" in line
    assert "unexpected" not in line and "label" not in line


# ---------------------------------------------------------------- items 12, 13: a server that refuses


def _allowed_hosts_in_compose() -> str:
    command = shlex.split(yaml.safe_load(COMPOSE.read_text())["services"]["mlflow"]["command"])
    return command[command.index("--allowed-hosts") + 1]


@pytest.mark.slow
def test_a_server_refusing_the_host_header_is_exit_5_with_its_reason(tmp_path):
    server = MlflowServer(tmp_path, extra_args=("--allowed-hosts", "mlflow:5000")).start()
    try:
        proc = run_cli(*check_args("2", tmp_path / "eval.csv", _config(tmp_path), server.url))
    finally:
        server.kill()
    assert proc.returncode == 5, proc.stderr
    line = proc.stderr.strip()
    assert "refused the request (403: Invalid Host header" in line
    assert f"--allowed-hosts including '127.0.0.1:{server.port}'" in line
    assert "not found" not in line


@pytest.mark.slow
def test_compose_flags_let_the_gate_call_http_mlflow_5000(tmp_path):
    """The compose stack's server/gate pair: the server with compose's own --allowed-hosts, the gate
    calling http://mlflow:5000 (a forward proxy on 127.0.0.1 stands in for the compose network)."""
    server = MlflowServer(tmp_path, extra_args=("--allowed-hosts", _allowed_hosts_in_compose())).start()
    proxy = ForwardProxy(server.port).start()
    try:
        store = build_store(tmp_path, uri=server.url)
        env = {**os.environ, "HTTP_PROXY": proxy.url, "http_proxy": proxy.url, "NO_PROXY": "", "no_proxy": ""}
        proc = run_cli(
            *check_args("2", store["data"], _config(tmp_path), "http://mlflow:5000", "--id-column", "id"), env=env
        )
    finally:
        proxy.stop()
        server.kill()
    assert proc.returncode == 0, proc.stderr
    assert "PASSED" in proc.stdout
