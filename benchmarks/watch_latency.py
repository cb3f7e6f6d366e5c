"""How fast the listener acts (``consistency-gate watch``): from a version's registration (its creation time in
the registry) to its gate's verdict (the event woke the reconcile, the warm worker gated it), beside the same gate
as a fresh ``consistency-gate check`` process (what the listener ran before its worker), alternating; and from a
hand move of ``@champion`` to a version nothing authorized to the alias read back where it was, with the listener
idle and while a gate runs (a model that answers only once the script lets it); the model a digits classifier
(scikit-learn's 1,797 samples, 10 classes, all of them the evaluation set). A real ``mlflow server`` (SQLite, two
workers, its webhook cache at 1 s so that the first minute's events are delivered too; MLflow's default uvicorn
backend, or gunicorn with ``--server gunicorn``) sends its webhooks to a real listener. Prints each round and the
medians, p90 and the ratio (seconds, wall clock).

    python benchmarks/watch_latency.py [--rounds 10] [--server uvicorn|gunicorn]
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
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression

MODEL, SECRET = "digits-watched", "benchmark-secret"
POOR = [f"p{i}" for i in range(16, 64)]  # a poor generation sees the top two rows of pixels only


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def started(command: list[str], env: dict, ready: callable) -> subprocess.Popen:  # noqa: ANN001
    """A process, once ``ready()`` (its own signal: a port that answers, a lease held)."""
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    while not ready():
        if proc.poll() is not None:
            raise RuntimeError(f"{command[:4]} ended (exit {proc.returncode})")
        time.sleep(0.2)
    return proc


def health(url: str) -> dict | None:
    """What ``url``/health answers (the listener's JSON; MLflow's "OK" as {}), None while nothing answers."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            text = response.read()
    except OSError:
        return None
    return json.loads(text) if text.startswith(b"{") else {}


class Waits(mlflow.pyfunc.PythonModel):
    """A model whose predictions wait for the file ``release`` (a gate that runs until the script lets it end), then
    answer as ``model`` does."""

    def __init__(self, release: str, model: LogisticRegression) -> None:
        self.release, self.model = release, model

    def predict(self, context, model_input, params=None):  # noqa: ANN001, ANN201
        while not os.path.exists(self.release):
            time.sleep(0.02)
        return pd.DataFrame(self.model.predict_proba(model_input), columns=[str(c) for c in self.model.classes_])


def register(x: pd.DataFrame, y: pd.Series, poor: bool = False, release: Path | None = None) -> str:
    """A logistic regression of the digits (``poor``: on the top two rows of pixels), or one that waits; its
    version."""
    fitted = x.assign(**{c: 0.0 for c in POOR}) if poor else x
    model = LogisticRegression(max_iter=300, C=1.0 + np.random.default_rng().random()).fit(fitted, y)
    with mlflow.start_run():
        if release is not None:
            info = mlflow.pyfunc.log_model(name="model", python_model=Waits(str(release), model),
                                           registered_model_name=MODEL, signature=infer_signature(x, np.zeros((2, 10))),
                                           pip_requirements=["pandas", "scikit-learn"])  # fmt: skip
            return str(info.registered_model_version)
        info = mlflow.sklearn.log_model(
            model, name="model", registered_model_name=MODEL, signature=infer_signature(x, model.predict_proba(x)),
            pip_requirements=["scikit-learn"], pyfunc_predict_fn="predict_proba", serialization_format="cloudpickle",
        )  # fmt: skip
    return str(info.registered_model_version)


def until(condition) -> object:  # noqa: ANN001
    while not (found := condition()):
        time.sleep(0.02)
    return found


def outcome(listener: str, job: str, after: float) -> dict | None:
    said = (health(listener) or {}).get("done", [])
    return next((d for d in reversed(said) if d["job"] == job and d["at"] > after), None)


def holder(client: MlflowClient) -> str:
    return str(client.get_model_version_by_alias(MODEL, "champion").version)


def revert_seconds(client: MlflowClient, poor: str) -> float:
    """Move @champion to ``poor`` by hand; the seconds until it is read back where it was."""
    before, begin = holder(client), time.perf_counter()
    client.set_registered_model_alias(MODEL, "champion", poor)
    until(lambda: holder(client) == before)
    return time.perf_counter() - begin


def summary(name: str, values: list[float]) -> str:
    p90 = sorted(values)[max(int(round(0.9 * len(values))) - 1, 0)]
    return f"{name}: median {statistics.median(values):.2f} s, p90 {p90:.2f} s ({len(values)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--server", choices=["uvicorn", "gunicorn"], default="uvicorn",
                        help="the tracking server: MLflow's default backend or gunicorn (--gunicorn-opts)")  # fmt: skip
    args = parser.parse_args()
    from cryptography.fernet import Fernet

    root = Path(tempfile.mkdtemp(prefix="watch-latency-"))
    port, listen = free_port(), free_port()
    server_env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
                  "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS": "true", "MLFLOW_WEBHOOK_ALLOWED_SCHEMES": "http,https",
                  "MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY": Fernet.generate_key().decode(),
                  "MLFLOW_WEBHOOK_CACHE_TTL": "1"}  # fmt: skip
    uri, listener = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{listen}"
    server = started([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                      "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination",
                      str(root / "artifacts"), "--workers", "2",
                      *(["--gunicorn-opts", "--workers 2"] if args.server == "gunicorn" else [])], server_env,
                     lambda: health(uri) is not None)  # fmt: skip
    watch = None
    try:
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment("training")
        client = MlflowClient(uri)
        digits = load_digits()
        x = pd.DataFrame(digits.data / 16, columns=[f"p{i}" for i in range(64)])
        y = pd.Series(digits.target.astype(str))
        client.set_registered_model_alias(MODEL, "champion", register(x, y))
        x.assign(label=y, id=[f"s{i}" for i in range(len(x))]).to_csv(root / "eval.csv", index=False)
        (root / "gate.yaml").write_text("rules:\n  - {metric: con, min: 0.9}\n  - {metric: acc, min: 0.5}\n")
        (root / "watch.yaml").write_text(
            f"webhook_cache_s: 1\nmodels:\n  - {{name: {MODEL}, data: eval.csv, config: gate.yaml, id_column: id}}\n"
        )
        watch = started([sys.executable, "-m", "consistency_gate", "watch", "--config", str(root / "watch.yaml"),
                         "--port", str(listen), "--register", f"{listener}/webhook", "--tracking-uri", uri],
                        {**os.environ, "CONSISTENCY_GATE_WEBHOOK_SECRET": SECRET},
                        lambda: ((health(listener) or {}).get("leases") or {}).get(MODEL, {}).get("held"))  # fmt: skip
        until(lambda: (health(listener) or {}).get("worker", {}).get("ready"))  # warm: a listener pays it once
        gates, fresh, idle, busy = [], [], [], []
        check = [sys.executable, "-m", "consistency_gate", "check", "--model", MODEL, "--data", str(root / "eval.csv"),
                 "--config", str(root / "gate.yaml"), "--id-column", "id", "--tracking-uri", uri]  # fmt: skip
        for round_ in range(args.rounds):
            begin, before = time.time(), holder(client)
            version = register(x, y)
            done = until(lambda v=version, b=begin: outcome(listener, f"gate {MODEL} v{v}", b))
            gates.append(done["at"] - client.get_model_version(MODEL, version).creation_timestamp / 1000)
            begin = time.perf_counter()  # the same gate as a fresh process (no promotion: the listener promoted it)
            subprocess.run([*check, "--candidate", version, "--baseline", before], capture_output=True, check=False)
            fresh.append(time.perf_counter() - begin)
            begin = time.time()
            poor = register(x, y, poor=True)
            failed = until(lambda v=poor, b=begin: outcome(listener, f"gate {MODEL} v{v}", b))
            assert failed["said"].startswith("failed"), failed  # a version nothing authorizes, to move to by hand
            idle.append(revert_seconds(client, poor))
            release = root / f"release-{round_}"
            waiting = register(x, y, release=release)
            until(lambda w=waiting: ((health(listener) or {}).get("running") or {}).get("job") == f"gate {MODEL} v{w}")
            busy.append(revert_seconds(client, poor))
            release.touch()
            until(lambda w=waiting, b=begin: outcome(listener, f"gate {MODEL} v{w}", b))
            print(
                f"round {round_ + 1}: registration to verdict {gates[-1]:.2f} s (a fresh check process "
                f"{fresh[-1]:.2f} s); revert {idle[-1]:.2f} s idle, {busy[-1]:.2f} s during a gate",
                flush=True,
            )
        ratio = statistics.median(g / f for g, f in zip(gates, fresh, strict=True))
        print(summary("registration to verdict", gates))
        print(summary("a fresh check process, the same gate", fresh) + f"; ratio listener / fresh {ratio:.2f}x")
        print(summary("move to revert, listener idle", idle))
        print(summary("move to revert, during a gate", busy))
    finally:
        for proc in (watch, server):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(60)


if __name__ == "__main__":
    main()
