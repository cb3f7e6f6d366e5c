"""What the listener's tests share: models registered for real (an iris logistic regression, one that answers only
once the test lets it: a gate that runs until a signal), a listener process and its /health, deliveries signed as
MLflow signs them, and a wait on a state of the registry or the listener."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from conftest import start_cli
from mlflow import MlflowClient
from registry_fixtures import iris_frames

from consistency_gate.mlops.webhooks import DELIVERY, SIGNATURE, TIMESTAMP

SECRET = "a-webhook-secret"


def delivery(kind: str, data: dict, secret: str = SECRET, at: float | None = None, delivery_id: str | None = None):
    """A delivery signed as MLflow signs one (its own code), as (headers, body)."""
    from mlflow.webhooks.delivery import _generate_hmac_signature

    entity, action = kind.rsplit(".", 1)
    body = json.dumps({"entity": entity, "action": action, "timestamp": "now", "data": data})
    delivery_id, stamp = delivery_id or str(uuid.uuid4()), str(int(at if at is not None else time.time()))
    headers = {DELIVERY: delivery_id, TIMESTAMP: stamp, SIGNATURE: _generate_hmac_signature(secret, delivery_id, stamp,
                                                                                           body)}  # fmt: skip
    return headers, body.encode()


def register(client: MlflowClient, name: str, poor: bool = False) -> str:
    """Log and register a logistic regression of the iris set (``poor``: on one column only); its version."""
    import mlflow
    from mlflow.models import infer_signature
    from sklearn.linear_model import LogisticRegression

    x, y = iris_frames()
    fitted = x[["sepal_width"]].assign(sepal_length=0, petal_length=0, petal_width=0)[x.columns] if poor else x
    model = LogisticRegression(max_iter=500, C=0.9 + 0.01 * len(client.search_model_versions(f"name='{name}'")))
    model.fit(fitted, y)
    with mlflow.start_run(experiment_id=_training(client)):
        info = mlflow.sklearn.log_model(
            model, name="model", registered_model_name=name, signature=infer_signature(x, model.predict_proba(x)),
            pip_requirements=["scikit-learn"], pyfunc_predict_fn="predict_proba", serialization_format="cloudpickle",
        )  # fmt: skip
    return str(info.registered_model_version)


def register_waiting(client: MlflowClient, name: str, release: Path) -> str:
    """Register a model whose gate runs until the file ``release`` exists (its predictions wait for it), then
    answers as a logistic regression of the iris set (as :func:`register`'s: it passes a gate against them); its
    version."""
    import mlflow
    import numpy as np
    from mlflow.models import infer_signature
    from sklearn.linear_model import LogisticRegression

    class Waits(mlflow.pyfunc.PythonModel):
        def __init__(self, release: str, model: LogisticRegression) -> None:
            self.release, self.model = release, model

        def predict(self, context, model_input, params=None):
            import os
            import time

            import pandas as pd

            while not os.path.exists(self.release):  # the test's signal, not a clock
                time.sleep(0.05)
            return pd.DataFrame(self.model.predict_proba(model_input), columns=list(self.model.classes_))

    x, y = iris_frames()
    fitted = LogisticRegression(max_iter=500).fit(x, y)
    with mlflow.start_run(experiment_id=_training(client)):
        info = mlflow.pyfunc.log_model(
            name="model", python_model=Waits(str(release), fitted), registered_model_name=name,
            pip_requirements=["pandas", "scikit-learn"], signature=infer_signature(x, np.zeros((2, 3))),
        )  # fmt: skip
    return str(info.registered_model_version)


def watched_registry(root: Path, uri: str, names: tuple[str, ...], watch: str) -> MlflowClient:
    """MLflow pointed at ``uri``; v1 of each model registered and made @champion; the evaluation set, a gate config
    and the watch config (``watch``, YAML; ``eval.csv`` and ``gate.yaml`` beside it) written in ``root``."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    mlflow.set_experiment("training")
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    for name in names:
        client.set_registered_model_alias(name, "champion", register(client, name))
    x, y = iris_frames()
    x.assign(label=y, id=[f"s{i}" for i in range(len(x))]).to_csv(root / "eval.csv", index=False)
    (root / "gate.yaml").write_text("rules:\n  - {metric: con, min: 0.9}\n")
    (root / "watch.yaml").write_text(watch)
    return client


def _training(client: MlflowClient) -> str:
    found = client.get_experiment_by_name("training")
    return found.experiment_id if found else client.create_experiment("training")


def until(condition, what: str, bound_s: float = 600):  # noqa: ANN001, ANN202
    """Wait for ``condition()`` (a state of the registry or the listener, polled); the bound only ends a test
    that hangs."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.1)
    raise AssertionError(f"never: {what}")


def gate_runs(client: MlflowClient, name: str, version: str, decided_only: bool = True) -> list:
    """The gate runs of ``name`` v``version``: named so at their start (a decided one leads its name with the
    verdict), or with the version in their params; ``decided_only``: those that decided (the gate records)."""
    experiment = client.get_experiment_by_name(f"consistency-gate/{name}")
    runs = {
        run.info.run_id: run
        for query in (f"attributes.run_name = 'gate {name} v{version}'", f"params.candidate_version = '{version}'")
        for run in client.search_runs([experiment.experiment_id], filter_string=query)
    }
    verdicts = ("passed", "failed")
    return [r for r in runs.values() if not decided_only or r.data.tags.get("consistency_gate.verdict") in verdicts]


def champion(client: MlflowClient, name: str) -> str:
    return str(client.get_model_version_by_alias(name, "champion").version)


class Listener:
    """`consistency-gate watch` in a process of its own; its output and /health."""

    def __init__(self, config: Path, uri: str, port: int, *extra: str, secret: str | None = SECRET) -> None:
        self.config, self.uri, self.port, self.extra = config, uri, port, extra
        self.url = f"http://127.0.0.1:{port}"
        self.env = {**os.environ, "CONSISTENCY_GATE_WEBHOOK_SECRET": secret or ""}

    def start(self, register: bool = True) -> Listener:
        args = ["watch", "--config", self.config, "--port", str(self.port), "--tracking-uri", self.uri, *self.extra]
        args += ["--register", f"{self.url}/webhook"] if register else []
        self.proc = start_cli(*args, env=self.env)
        self.out: list[str] = []
        self.err: list[str] = []
        for line in self.proc.stderr:  # its own signal that it listens
            self.err.append(line)
            if line.startswith("listening on "):
                for pipe, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):  # never left to fill
                    threading.Thread(target=lambda p=pipe, kept=lines: kept.extend(p), daemon=True).start()
                return self
        raise AssertionError(f"watch ended (exit {self.proc.wait()}): {''.join(self.err)[-3000:]}")

    def stop(self) -> str:
        """SIGTERM; what it printed on stdout."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=600)
        return "".join(self.out)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def health(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/health", timeout=30) as response:
            return json.loads(response.read())

    def did(self, words: str, after: float = 0.0) -> dict | None:
        """The listener's last outcome (since ``after``) of the job ``words``, or that begins with ``words``."""
        done = (d for d in reversed(self.health()["done"]) if d["at"] > after)
        return next((d for d in done if d["job"] == words or d["said"].startswith(words)), None)

    def holds(self, name: str) -> bool:
        return self.health()["leases"][name]["held"]

    def post(self, headers: dict, body: bytes) -> int:
        request = urllib.request.Request(f"{self.url}/webhook", body, {**headers, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code
