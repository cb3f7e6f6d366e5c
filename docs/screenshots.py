"""Retake the MLflow UI screenshots of docs/mlflow-ui.md from a fresh demo, in a real browser.

Runs ``consistency-gate demo`` in a temporary folder, serves its SQLite store with a real
``mlflow server`` on 127.0.0.1, and has headless Chromium photograph:

- ``docs/mlflow-ui-runs.png``: the gate experiment's runs, each named after its verdict;
- ``docs/mlflow-ui-gate-run.png``: the gate run's page (the verdict as its description, the dataset);
- ``docs/mlflow-ui-report.png``: the run's ``gate/report.html`` artifact as the UI shows it;
- ``docs/mlflow-ui-rules-table.png``: the rule table artifact ``gate/rules.json``;
- ``docs/mlflow-ui-model-metrics.png``: the candidate's logged model page with the consistency metrics;
- ``docs/mlflow-ui-version.png``: the candidate's registered version page (the gate's description, its tags);
- ``docs/mlflow-ui-versions.png``: the registered model's versions table (each description led by its verdict).

Not a test and not run by CI: it needs Chromium (``apt-get install chromium``) and about a minute.
Look at the pictures afterwards; a page that had not finished loading shows as a spinner.

    python docs/screenshots.py [--out docs] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = "digits-classifier"


def main() -> None:
    """Run the demo, serve its store, photograph the pages into ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--keep", action="store_true", help="keep the temporary demo folder")
    parser.add_argument("--wait-ms", type=int, default=20000, help="virtual time Chromium gives each page")
    args = parser.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        sys.exit("error: no Chromium found; install it (Debian: apt-get install chromium) and run again")

    args.out.mkdir(parents=True, exist_ok=True)
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    work = Path(tempfile.mkdtemp(prefix="cg-screens-"))
    subprocess.run([sys.executable, "-m", "consistency_gate", "demo"], cwd=work, check=True, capture_output=True)
    db = work / "consistency-gate-demo" / "mlflow.db"
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)]
        + ["--backend-store-uri", f"sqlite:///{db}", "--workers", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_for(port)
        pages = _pages(base, f"sqlite:///{db}")
        for name, (url, height) in pages.items():
            target = args.out / name
            subprocess.run(
                [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
                + [f"--window-size=1400,{height}", f"--virtual-time-budget={args.wait_ms}"]
                + [f"--screenshot={target}", url],
                check=True,
                capture_output=True,
                timeout=180,
            )
            print(f"{target}  <-  {url}")
    finally:
        server.terminate()
        server.wait(timeout=30)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def _pages(base: str, uri: str) -> dict[str, tuple[str, int]]:
    """The UI addresses to photograph (and each page's height), read from the demo's store."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment = client.get_experiment_by_name(f"consistency-gate/{MODEL}")
    (gate_run,) = client.search_runs(
        [experiment.experiment_id], filter_string="tags.consistency_gate.outcome != ''", max_results=1
    )
    report = json.loads(Path(client.download_artifacts(gate_run.info.run_id, "gate/report.json")).read_text())
    candidate = client.get_model_version(MODEL, report["candidate"]["version"])
    model_id = candidate.model_id or candidate.source.removeprefix("models:/")
    model_experiment = client.get_logged_model(model_id).experiment_id
    run = f"{base}/#/experiments/{experiment.experiment_id}/runs/{gate_run.info.run_id}"
    ml = "?workflowType=machine_learning"  # the UI's "Model training" view (its default is GenAI)
    return {
        "mlflow-ui-runs.png": (f"{base}/#/experiments/{experiment.experiment_id}{ml}", 700),
        "mlflow-ui-gate-run.png": (run + ml, 1500),
        "mlflow-ui-report.png": (f"{run}/artifacts/gate/report.html{ml}", 1500),
        "mlflow-ui-rules-table.png": (f"{run}/artifacts/gate/rules.json{ml}", 800),
        "mlflow-ui-model-metrics.png": (f"{base}/#/experiments/{model_experiment}/models/{model_id}{ml}", 1300),
        "mlflow-ui-version.png": (f"{base}/#/models/{MODEL}/versions/{candidate.version}", 900),
        "mlflow-ui-versions.png": (f"{base}/#/models/{MODEL}", 700),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(port: int, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    sys.exit(f"error: mlflow server did not start on port {port} within {timeout:.0f} s")


if __name__ == "__main__":
    main()
