"""Against a real tracking server: four gates at once, and the same inputs twice."""

import json

import mlflow
import pytest
from conftest import start_cli
from mlflow import MlflowClient
from mlflow_server import MlflowServer
from registry_fixtures import MODEL, build_store

pytestmark = pytest.mark.slow  # a real mlflow server per module


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("reliability")
    server = MlflowServer(root, gunicorn=True).start()
    store = build_store(root, uri=server.url)
    client = MlflowClient(tracking_uri=server.url, registry_uri=server.url)
    mlflow.set_experiment("training")
    for source_version in ("2", "3"):  # v4 is a copy of v2 (passes), v5 of v3 (fails)
        model = mlflow.sklearn.load_model(f"models:/{MODEL}/{source_version}")
        with mlflow.start_run():
            mlflow.sklearn.log_model(
                model, name="model", registered_model_name=MODEL, pip_requirements=["scikit-learn"]
            )
    config = root / "gate.yaml"
    config.write_text("rules:\n  - {metric: con, min: 0.9}\n  - {metric: acc, min_delta: -0.05}\n")
    yield {"server": server, "store": store, "client": client, "config": config, "root": root}
    server.kill()


def _gate(served, version, *extra):
    return start_cli(
        "check",
        "--model",
        MODEL,
        "--candidate",
        version,
        "--data",
        served["store"]["data"],
        "--id-column",
        "id",
        "--config",
        served["config"],
        "--tracking-uri",
        served["server"].url,
        "--format",
        "json",
        "--quiet",
        *extra,
    )


def test_four_gates_at_once(served):
    """v2 and v4 pass against @champion, v3 and v5 fail; all four ask to be promoted at once.
    Of the gates that compared against the same baseline, exactly one moves the alias; a passing
    gate that finds it moved reports why and exits 4; every report says what the registry holds."""
    client = served["client"]
    procs = {v: _gate(served, v, "--promote") for v in ("2", "3", "4", "5")}
    results, codes = {}, {}
    for version, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode in (0, 1, 4), err
        assert out.lstrip().startswith("{"), out[:2000] + err[-2000:]
        results[version], codes[version] = json.loads(out), proc.returncode
    assert {v: r["verdict"] for v, r in results.items()} == {"2": "passed", "3": "failed", "4": "passed", "5": "failed"}
    for version, report in results.items():
        tags = client.get_model_version(MODEL, version).tags
        assert tags["consistency_gate.verdict"] == report["verdict"]
        assert tags["consistency_gate.run_id"] == report["run_id"]
        run = client.get_run(report["run_id"])
        assert run.info.status == "FINISHED"
        assert run.data.params["candidate_version"] == version
        assert run.data.tags["consistency_gate.verdict"] == report["verdict"]
        assert run.data.tags["consistency_gate.promoted"] == str(report["promoted"])
    promoted = [v for v, r in results.items() if r["promoted"]]
    assert promoted, "no passing gate promoted"
    baselines = [results[v]["baseline"]["version"] for v in promoted]
    assert len(baselines) == len(set(baselines)), f"two promotions over the same baseline: {baselines}"
    champion = str(client.get_model_version_by_alias(MODEL, "champion").version)
    assert champion in promoted
    for version in ("2", "4"):
        if version not in promoted:  # it compared against a baseline that moved before it promoted
            report = results[version]
            assert codes[version] == 4
            assert report["promotion"]["holds"] != report["baseline"]["version"]
            assert "again against the new baseline" in report["promotion"]["reason"]
    for version in ("3", "5"):
        assert codes[version] == 1 and results[version]["promotion"] is None


def test_same_inputs_twice_same_verdict_and_metrics(served):
    first, second = (_gate(served, "3") for _ in range(2))
    a, b = (json.loads(p.communicate(timeout=600)[0]) for p in (first, second))
    assert a["verdict"] == b["verdict"] and a["metrics"] == b["metrics"] and a["rules"] == b["rules"]
    assert a["run_id"] != b["run_id"]
