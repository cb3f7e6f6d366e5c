"""How fast the registry's own events act (``consistency-gate watch``): from a version's registration to its gate's
verdict, and from a hand move of ``@champion`` to a version nothing authorized to the alias read back where it
was. A real ``mlflow server`` (SQLite, two workers) sends its webhooks to a real listener; the script registers
``--rounds`` versions (each gated by the listener, alternately passing and failing) and after each failing one
moves ``@champion`` to it by hand. It prints each time and their medians (seconds, wall clock, 2 cores).

    python benchmarks/watch_latency.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from mlflow import MlflowClient
from mlflow.models import infer_signature
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression

MODEL, SECRET = "iris-watched", "benchmark-secret"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def started(command: list[str], env: dict, ready: callable) -> subprocess.Popen:  # noqa: ANN001
    """A process, once ``ready()`` (its own signal: a port that answers)."""
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    while not ready():
        if proc.poll() is not None:
            raise RuntimeError(f"{command[:4]} ended (exit {proc.returncode})")
        time.sleep(0.2)
    return proc


def answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
        return True
    except OSError:
        return False


def register(client: MlflowClient, x: pd.DataFrame, y: pd.Series, poor: bool) -> str:
    """A logistic regression of the iris set (``poor``: on one column), registered; its version."""
    fitted = x[["sepal_width"]].assign(sepal_length=0, petal_length=0, petal_width=0)[x.columns] if poor else x
    model = LogisticRegression(max_iter=500, C=1.0 + np.random.default_rng().random()).fit(fitted, y)
    with mlflow.start_run():
        info = mlflow.sklearn.log_model(
            model, name="model", registered_model_name=MODEL, signature=infer_signature(x, model.predict_proba(x)),
            pip_requirements=["scikit-learn"], pyfunc_predict_fn="predict_proba", serialization_format="cloudpickle",
        )  # fmt: skip
    return str(info.registered_model_version)


def done(listener: str, job: str, after: float) -> dict | None:
    """The listener's outcome of ``job`` since ``after``, from its /health."""
    with urllib.request.urlopen(f"{listener}/health", timeout=30) as response:
        said = json.loads(response.read())["done"]
    return next((d for d in reversed(said) if d["job"] == job and d["at"] > after), None)


def until(condition) -> None:  # noqa: ANN001
    while not condition():
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from cryptography.fernet import Fernet

    root = Path(tempfile.mkdtemp(prefix="watch-latency-"))
    port, listen = free_port(), free_port()
    server_env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
                  "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS": "true", "MLFLOW_WEBHOOK_ALLOWED_SCHEMES": "http,https",
                  "MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY": Fernet.generate_key().decode(),
                  "MLFLOW_WEBHOOK_CACHE_TTL": "1"}  # fmt: skip
    server = started([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                      "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination",
                      str(root / "artifacts"), "--workers", "2"], server_env,
                     lambda: answers(f"http://127.0.0.1:{port}/health"))  # fmt: skip
    uri, listener = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{listen}"
    watch = None
    try:
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment("training")
        client = MlflowClient(uri)
        iris = load_iris(as_frame=True)
        x, y = iris.data.set_axis(["sepal_length", "sepal_width", "petal_length", "petal_width"], axis=1), iris.target
        y = y.map(dict(enumerate(iris.target_names)))
        client.set_registered_model_alias(MODEL, "champion", register(client, x, y, poor=False))
        x.assign(label=y, id=[f"s{i}" for i in range(len(x))]).to_csv(root / "eval.csv", index=False)
        (root / "gate.yaml").write_text("rules:\n  - {metric: con, min: 0.9}\n")
        (root / "watch.yaml").write_text(
            f"models:\n  - {{name: {MODEL}, data: eval.csv, config: gate.yaml, id_column: id}}\n"
        )
        watch = started([sys.executable, "-m", "consistency_gate", "watch", "--config", str(root / "watch.yaml"),
                         "--port", str(listen), "--register", f"{listener}/webhook", "--tracking-uri", uri],
                        {**os.environ, "CONSISTENCY_GATE_WEBHOOK_SECRET": SECRET},
                        lambda: answers(f"{listener}/health"))  # fmt: skip
        gates, reverts = [], []
        for round_ in range(args.rounds):
            for poor in (False, True):
                champion = str(client.get_model_version_by_alias(MODEL, "champion").version)
                begin = time.time()
                version = register(client, x, y, poor)
                until(lambda v=version, b=begin: done(listener, f"gate {MODEL} v{v}", b))
                gates.append(time.time() - begin)
                if poor:  # by hand, to a version its gate failed
                    begin = time.time()
                    client.set_registered_model_alias(MODEL, "champion", version)
                    until(lambda c=champion: str(client.get_model_version_by_alias(MODEL, "champion").version) == c)
                    reverts.append(time.time() - begin)
            print(f"round {round_ + 1}: registration to verdict {gates[-2]:.1f} s, {gates[-1]:.1f} s; "
                  f"move to revert {reverts[-1]:.1f} s")  # fmt: skip
        print(f"median registration to verdict: {statistics.median(gates):.1f} s ({len(gates)} gates); "
              f"median move to revert: {statistics.median(reverts):.1f} s ({len(reverts)} moves)")  # fmt: skip
    finally:
        for proc in (watch, server):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(60)


if __name__ == "__main__":
    main()
