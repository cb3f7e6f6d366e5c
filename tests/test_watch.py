"""`consistency-gate watch`: a real `mlflow server` delivers its webhooks to a real listener process. A new version
is gated and promoted; a hand move of @champion to an ungated version is reverted and reported; the gate's own
promotion, a rollback and a person's `authorize` are left; forged, stale and replayed deliveries change nothing;
what happens while the listener is down is caught by its reconcile; the race of a move made between a gate's
re-read and its own move is reported. The checks of a delivery (signature, age, replay) against MLflow's own
signing code."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from conftest import run_cli, start_cli
from http_proxy import ForwardProxy
from mlflow import MlflowClient
from mlflow_server import MlflowServer, free_port
from registry_fixtures import check_args, iris_frames

from consistency_gate.errors import UsageError
from consistency_gate.mlops.webhooks import DELIVERY, SIGNATURE, TIMESTAMP, Deliveries, Rejected

MODEL, GUARDED = "iris-watched", "iris-guarded"  # gated and guarded by the listener; guarded only (gated in CI)
SECRET = "a-webhook-secret"


def _delivery(kind: str, data: dict, secret: str = SECRET, at: float | None = None, delivery: str | None = None):
    """A delivery signed as MLflow signs one (its own code), as (headers, body)."""
    from mlflow.webhooks.delivery import _generate_hmac_signature

    entity, action = kind.rsplit(".", 1)
    body = json.dumps({"entity": entity, "action": action, "timestamp": "now", "data": data})
    delivery, stamp = delivery or str(uuid.uuid4()), str(int(at if at is not None else time.time()))
    headers = {DELIVERY: delivery, TIMESTAMP: stamp, SIGNATURE: _generate_hmac_signature(secret, delivery, stamp, body)}
    return headers, body.encode()


def test_a_delivery_is_taken_only_signed_fresh_and_new():
    deliveries = Deliveries(SECRET, clock=lambda: 1_800_000_000.0)
    headers, body = _delivery("model_version.created", {"name": "m", "version": "7"}, at=1_800_000_000 - 10)
    event = deliveries.accept(headers, body)
    assert (event.kind, event.model, event.version) == ("model_version.created", "m", "7")
    for bad, status, words in (
        (_delivery("model_version.created", {"name": "m", "version": "7"}, "another", at=1_800_000_000), 401,
         "signature"),
        (_delivery("model_version.created", {"name": "m", "version": "7"}, at=1_800_000_000 - 301), 400, "stale"),
        ((headers, body), 409, "seen before"),
        (({**headers, SIGNATURE: ""}, body), 401, "not a signed"),
        (_delivery("model_version.created", {"version": "7"}, at=1_800_000_000), 400, "not an MLflow registry"),
    ):  # fmt: skip
        with pytest.raises(Rejected, match=words) as raised:
            deliveries.accept(*bad)
        assert raised.value.status == status
    tampered = _delivery("model_version_alias.created", {"name": "m", "alias": "champion", "version": "9"},
                         at=1_800_000_000)  # fmt: skip
    with pytest.raises(Rejected, match="signature"):
        deliveries.accept(tampered[0], tampered[1].replace(b'"9"', b'"3"'))
    with pytest.raises(UsageError, match="secret is empty"):
        Deliveries("")


def test_a_watch_config_names_what_is_wrong_in_one_line(tmp_path):
    from consistency_gate.gate.watch import load_watch_config

    (tmp_path / "w.yaml").write_text("models:\n  - {name: m, data: eval.csv, promotes: true}\n")
    with pytest.raises(UsageError, match=r"w.yaml: models.0.promotes: Extra inputs are not permitted"):
        load_watch_config(tmp_path / "w.yaml")
    (tmp_path / "w.yaml").write_text("models:\n  - {name: m, data: eval.csv}\n")
    assert load_watch_config(tmp_path / "w.yaml").models[0].data == tmp_path / "eval.csv"


def test_the_compose_stack_runs_the_listener_beside_a_server_that_can_reach_it():
    import yaml

    services = yaml.safe_load((Path(__file__).resolve().parents[1] / "docker" / "compose.yaml").read_text())["services"]
    settings = services["mlflow"]["environment"]
    assert settings["MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS"] == "true"
    assert "http" in settings["MLFLOW_WEBHOOK_ALLOWED_SCHEMES"].split(",")
    assert "MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY" in settings
    command = services["watch"]["command"]
    assert command[0] == "watch" and command[command.index("--register") + 1] == "http://watch:8787/webhook"
    assert "CONSISTENCY_GATE_WEBHOOK_SECRET" in services["watch"]["environment"]


# ------------------------------------------------------------ a real server delivering to a real listener


def _register(client: MlflowClient, name: str, poor: bool = False) -> str:
    """Log and register a logistic regression of the iris set (``poor``: on one column only); its version."""
    import mlflow
    from mlflow.models import infer_signature
    from sklearn.linear_model import LogisticRegression

    x, y = iris_frames()
    fitted = x[["sepal_width"]].assign(sepal_length=0, petal_length=0, petal_width=0)[x.columns] if poor else x
    model = LogisticRegression(max_iter=500, C=0.9 + 0.01 * len(client.search_model_versions(f"name='{name}'")))
    model.fit(fitted, y)
    with mlflow.start_run(experiment_id=client.get_experiment_by_name("training").experiment_id):
        info = mlflow.sklearn.log_model(
            model, name="model", registered_model_name=name, signature=infer_signature(x, model.predict_proba(x)),
            pip_requirements=["scikit-learn"], pyfunc_predict_fn="predict_proba", serialization_format="cloudpickle",
        )  # fmt: skip
    return str(info.registered_model_version)


def _until(condition, what: str):  # noqa: ANN001, ANN202
    """Wait for ``condition()`` (a state of the registry or the listener, polled); the bound only ends a test
    that hangs."""
    for _ in range(3000):
        if result := condition():
            return result
        time.sleep(0.1)
    raise AssertionError(f"never: {what}")


class Listener:
    """`consistency-gate watch` in a process of its own, registering its webhook; its /health."""

    def __init__(self, root, server: MlflowServer, port: int) -> None:
        self.root, self.server, self.port = root, server, port
        self.url = f"http://127.0.0.1:{port}"

    def start(self) -> Listener:
        self.proc = start_cli("watch", "--config", self.root / "watch.yaml", "--port", str(self.port),
                              "--register", f"{self.url}/webhook", "--tracking-uri", self.server.url,
                              env={**os.environ, "CONSISTENCY_GATE_WEBHOOK_SECRET": SECRET})  # fmt: skip
        said = []
        for line in self.proc.stderr:  # its own signal that it listens
            said.append(line)
            if line.startswith("listening on "):
                return self
        raise AssertionError(f"watch ended (exit {self.proc.wait()}): {''.join(said)[-3000:]}")

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=600)
        return out

    def health(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/health", timeout=30) as response:
            return json.loads(response.read())

    def did(self, words: str, after: float = 0.0) -> dict | None:
        """The listener's last outcome (since ``after``) of the job ``words``, or that begins with ``words``."""
        done = (d for d in reversed(self.health()["done"]) if d["at"] > after)
        return next((d for d in done if d["job"] == words or d["said"].startswith(words)), None)

    def post(self, headers: dict, body: bytes) -> int:
        request = urllib.request.Request(f"{self.url}/webhook", body, {**headers, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """A tracking server that sends webhooks to private addresses over http, its key shared by its workers, with no
    retry of a delivery; two models (v1 @champion each); the listener started on them."""
    import mlflow
    from cryptography.fernet import Fernet

    root = tmp_path_factory.mktemp("watch")
    env = {
        "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS": "true", "MLFLOW_WEBHOOK_ALLOWED_SCHEMES": "http,https",
        "MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY": Fernet.generate_key().decode(), "MLFLOW_WEBHOOK_CACHE_TTL": "1",
        "MLFLOW_WEBHOOK_REQUEST_MAX_RETRIES": "0",  # an event sent while the listener is down is lost: reconciled
    }  # fmt: skip
    server = MlflowServer(root, env=env).start()
    try:
        mlflow.set_tracking_uri(server.url)
        mlflow.set_registry_uri(server.url)
        mlflow.set_experiment("training")
        client = MlflowClient(tracking_uri=server.url, registry_uri=server.url)
        for name in (MODEL, GUARDED):
            client.set_registered_model_alias(name, "champion", _register(client, name))
        x, y = iris_frames()
        x.assign(label=y, id=[f"s{i}" for i in range(len(x))]).to_csv(root / "eval.csv", index=False)
        (root / "gate.yaml").write_text("rules:\n  - {metric: con, min: 0.9}\n")
        (root / "watch.yaml").write_text(
            f"reconcile_every_s: 3600\nmodels:\n"
            f"  - {{name: {MODEL}, data: eval.csv, config: gate.yaml, id_column: id}}\n"
            f"  - {{name: {GUARDED}, data: eval.csv, config: gate.yaml, id_column: id, gate: false}}\n"
        )
        listener = Listener(root, server, free_port()).start()
        try:
            yield {"server": server, "client": client, "root": root, "listener": listener}
        finally:
            listener.stop()
    finally:
        server.kill()


def _champion(client: MlflowClient, name: str = MODEL) -> str:
    return str(client.get_model_version_by_alias(name, "champion").version)


@pytest.mark.slow  # a server, a listener and its gates
def test_a_new_version_is_gated_and_promoted_by_the_registrys_event(watched):
    client, listener = watched["client"], watched["listener"]
    started = time.perf_counter()
    version = _register(client, MODEL)
    done = _until(lambda: listener.did(f"gate {MODEL} v{version}"), "the listener gated the new version")
    watched["gate_seconds"] = time.perf_counter() - started
    assert "passed" in done["said"] and "promoted" in done["said"], done
    assert _champion(client) == version
    tags = client.get_model_version(MODEL, version).tags
    assert tags["consistency_gate.started_by"].startswith("registry: model_version.created (delivery ")
    run = client.get_run(tags["consistency_gate.run_id"])
    assert run.data.tags["consistency_gate.started_by"] == tags["consistency_gate.started_by"]
    guarded = _until(lambda: listener.did(f"guard {MODEL} v{version}"), "the guard saw the gate's promotion")
    assert guarded["said"].startswith(f"@champion on v{version}: left"), guarded


@pytest.mark.slow  # a server, a listener and its gates
def test_a_hand_move_to_an_ungated_version_is_reverted_and_said(watched):
    client, listener = watched["client"], watched["listener"]
    champion = _champion(client)
    poor = _register(client, MODEL, poor=True)  # gated by the listener, failed: never authorized
    _until(lambda: listener.did(f"gate {MODEL} v{poor}"), "the listener gated the poor version")
    started = time.perf_counter()
    client.set_registered_model_alias(MODEL, "champion", poor)  # by hand
    done = _until(lambda: listener.did(f"REVERTED @champion v{poor} -> v{champion}"), "the revert")
    _until(lambda: _champion(client) == champion, "@champion back")
    watched["revert_seconds"] = time.perf_counter() - started
    run = client.search_runs(
        [client.get_experiment_by_name(f"consistency-gate/{MODEL}").experiment_id],
        filter_string=f"attributes.run_name = 'REVERTED @champion v{poor} -> v{champion}'",
    )[0]
    report = json.loads(Path(client.download_artifacts(run.info.run_id, "gate/report.json")).read_text())
    assert report["kind"] == "revert" and report["promoted"] is True and report["event"]["version"] == poor
    assert client.get_model_version(MODEL, poor).description.startswith("REVERTED: @champion was moved to v")
    assert done["job"] == f"guard {MODEL} v{poor}"


@pytest.mark.slow  # a server, a listener and its gates
def test_a_rollback_and_an_authorization_are_left_where_they_put_the_alias(watched):
    client, listener, uri = watched["client"], watched["listener"], watched["server"].url
    champion = _champion(client)
    proc = run_cli("rollback", "--model", MODEL, "--tracking-uri", uri, "--reason", "test")
    assert proc.returncode == 0, proc.stderr
    restored = _champion(client)
    assert restored != champion
    left = _until(lambda: listener.did(f"guard {MODEL} v{restored}"), "the guard saw the rollback")
    assert "left" in left["said"] and _champion(client) == restored
    poor = next(v.version for v in client.search_model_versions(f"name='{MODEL}'")
                if v.description and v.description.startswith("REVERTED"))  # fmt: skip
    proc = run_cli("authorize", "--model", MODEL, "--version", poor, "--reason", "an emergency", "--by", "ops",
                   "--tracking-uri", uri)  # fmt: skip
    assert proc.returncode == 0 and f"v{restored} -> v{poor}: authorized, read back" in proc.stdout, proc.stderr
    _until(lambda: (d := listener.did(f"guard {MODEL} v{poor}")) and "left" in d["said"], "the guard left it")
    assert _champion(client) == poor
    assert client.get_model_version(MODEL, poor).tags["consistency_gate.authorized_by"] == "ops: an emergency"
    proc = run_cli("authorize", "--model", MODEL, "--version", restored, "--reason", "over", "--tracking-uri", uri)
    assert proc.returncode == 0 and _champion(client) == restored, proc.stderr
    _until(lambda: (d := listener.did(f"guard {MODEL} v{restored}")) and d["at"] > left["at"], "the guard saw it back")


@pytest.mark.slow  # a server, a listener and its gates
def test_forged_stale_and_replayed_deliveries_change_nothing(watched):
    client, listener = watched["client"], watched["listener"]
    before, done = _champion(client), len(listener.health()["done"])
    move = {"name": MODEL, "alias": "champion", "version": "1"}
    assert listener.post(*_delivery("model_version_alias.created", move, secret="forged")) == 401
    assert listener.post(*_delivery("model_version_alias.created", move, at=time.time() - 600)) == 400
    headers, body = _delivery("model_version.created", {"name": "not-watched", "version": "1"})
    assert listener.post(headers, body) == 200 and listener.post(headers, body) == 409
    health = listener.health()
    assert len(health["done"]) == done and health["queue"] == 0 and health["healthy"] and _champion(client) == before
    assert health["last_event"]["model"] == "not-watched"
    assert [r["status"] for r in health["rejected"][-3:]] == [401, 400, 409]  # what was refused, and why


@pytest.mark.slow  # a server, a listener and its gates
def test_what_happens_while_the_listener_is_down_is_caught_by_its_reconcile(watched):
    client, listener = watched["client"], watched["listener"]
    champion = _champion(client)
    listener.stop()
    new = _register(client, MODEL)
    poor = next(v.version for v in client.search_model_versions(f"name='{MODEL}'")
                if v.version not in (champion, new) and "consistency_gate.authorized_by" not in v.tags)  # fmt: skip
    client.set_registered_model_alias(MODEL, "champion", poor)  # by hand, unseen
    listener.start()
    _until(lambda: listener.did(f"REVERTED @champion v{poor} -> v{champion}"), "the reconcile's revert")
    gated = _until(lambda: listener.did(f"gate {MODEL} v{new}"), "the reconcile's gate")
    assert "passed" in gated["said"] and _champion(client) == new
    assert client.get_model_version(MODEL, new).tags["consistency_gate.started_by"] == "registry: a reconcile"


@pytest.mark.slow  # a server, a listener and its gates
def test_a_move_between_a_gates_re_read_and_its_own_is_seen_and_said(watched, tmp_path):
    """The race of docs/gate.md: someone moves @champion of the guarded model to v3 without the lock just before
    a CI gate's own move to v2 reaches the registry; the gate's move overwrites it; the guard says so on v3."""
    client, listener, server = watched["client"], watched["listener"], watched["server"]
    second, third = _register(client, GUARDED), _register(client, GUARDED, poor=True)
    direct = MlflowClient(tracking_uri=server.url, registry_uri=server.url)
    moved: list[str] = []

    def fail(method: str, path: str) -> None:
        if method == "POST" and path.endswith("registered-models/alias") and not moved:
            moved.append("another")
            direct.set_registered_model_alias(GUARDED, "champion", third)  # before the gate's move reaches it

    proxy = ForwardProxy(server.port, fail=fail).start()
    try:
        args = check_args(second, watched["root"] / "eval.csv", watched["root"] / "gate.yaml", server.url)
        args = (args[0], "--model", GUARDED, *args[3:], "--id-column", "id", "--promote")
        proc = run_cli(*args, env=proxy.env(retries="0"), process=False)
    finally:
        proxy.stop()
    assert proc.returncode == 0 and moved == ["another"] and _champion(client, GUARDED) == second, proc.stderr
    said = _until(lambda: listener.did(f"guard {GUARDED} v{third}"), "the guard saw the move to v3")
    assert said["said"].startswith(f"UNAUTHORIZED MOVE: @champion was moved to v{third}")
    assert (
        f"overwritten by v{second}"
        in client.get_model_version(GUARDED, third).tags["consistency_gate.unauthorized_move"]
    )


@pytest.mark.slow  # a server, a listener and its gates
def test_the_listener_says_a_model_that_is_not_registered_in_one_line(watched, tmp_path):
    data = watched["root"] / "eval.csv"
    (tmp_path / "watch.yaml").write_text(f"models:\n  - {{name: no-such-model, data: {data}}}\n")
    proc = run_cli("watch", "--config", tmp_path / "watch.yaml", "--tracking-uri", watched["server"].url,
                   env={**os.environ, "CONSISTENCY_GATE_WEBHOOK_SECRET": SECRET})  # fmt: skip
    assert proc.returncode == 4 and "model 'no-such-model' is not registered" in proc.stderr.strip().splitlines()[-1]
    (tmp_path / "missing.yaml").write_text(f"models:\n  - {{name: {MODEL}, data: {tmp_path / 'none.csv'}}}\n")
    proc = run_cli("watch", "--config", tmp_path / "missing.yaml", "--tracking-uri", watched["server"].url,
                   env={**os.environ, "CONSISTENCY_GATE_WEBHOOK_SECRET": SECRET})  # fmt: skip
    assert proc.returncode == 3 and "none.csv: the evaluation data" in proc.stderr.strip().splitlines()[-1]
    no_secret = {**os.environ, "CONSISTENCY_GATE_WEBHOOK_SECRET": ""}
    proc = run_cli("watch", "--config", tmp_path / "watch.yaml", env=no_secret)
    assert proc.returncode == 2 and "CONSISTENCY_GATE_WEBHOOK_SECRET" in proc.stderr.strip().splitlines()[-1]
    print(json.dumps({k: round(v, 1) for k, v in watched.items() if k.endswith("_seconds")}))


@pytest.mark.slow  # a server, a listener and its gates
def test_an_event_handled_while_the_tracking_server_is_down_moves_nothing_and_says_why(watched):
    """The module's last test: the server stays down (nothing could move the alias while it is)."""
    listener, server = watched["listener"], watched["server"]
    server.kill()
    move, posted = {"name": MODEL, "alias": "champion", "version": "1"}, time.time()  # as if it had moved to v1
    assert listener.post(*_delivery("model_version_alias.created", move)) == 200
    failed = _until(lambda: listener.did(f"guard {MODEL} v1", after=posted), "the guard tried")
    assert failed["said"].startswith("error: the tracking server does not answer"), failed
    assert "nothing was moved" in failed["said"] and listener.health()["healthy"]
