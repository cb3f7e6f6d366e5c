"""`consistency-gate watch` against a real `mlflow server` run with the settings docs/watch.md gives (MLflow's
default webhook cache, retries and delivery threads): the registry is the truth and events only wake the
listener. A version registered while the server's webhook cache is stale and one registered after it are each
gated once; a new version is gated by its event in seconds; a hand move of @champion during a gate is moved back
while the gate runs; two listeners gate a version once; a listener killed by PID mid-gate and restarted leaves one
gate record; a start on a busy port leaves the running listener working; forged, stale, replayed, oversized and
malformed deliveries, a burst of 200 and hung clients are answered as they should be. The checks of a delivery
(signature, age, replay) against MLflow's own signing code."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import run_cli
from mlflow_server import MlflowServer, free_port
from watch_fixtures import (
    SECRET,
    Listener,
    champion,
    delivery,
    gate_runs,
    register,
    register_waiting,
    until,
    watched_registry,
)

from consistency_gate.errors import UsageError
from consistency_gate.mlops.webhooks import SIGNATURE, Deliveries, Rejected

MODEL, GUARDED = "iris-watched", "iris-guarded"  # gated and guarded by the listener; guarded only (gated in CI)
WEBHOOK_CACHE_S = 15  # the server's MLFLOW_WEBHOOK_CACHE_TTL and the listener's webhook_cache_s (the same, as docs say)


def test_a_delivery_is_taken_only_signed_fresh_and_new():
    deliveries = Deliveries(SECRET, clock=lambda: 1_800_000_000.0)
    headers, body = delivery("model_version.created", {"name": "m", "version": "7"}, at=1_800_000_000 - 10)
    event = deliveries.accept(headers, body)
    assert (event.kind, event.model, event.version) == ("model_version.created", "m", "7")
    for bad, status, words in (
        (delivery("model_version.created", {"name": "m", "version": "7"}, "another", at=1_800_000_000), 401,
         "signature"),
        (delivery("model_version.created", {"name": "m", "version": "7"}, at=1_800_000_000 - 301), 400, "stale"),
        ((headers, body), 409, "seen before"),
        (({**headers, SIGNATURE: ""}, body), 401, "not a signed"),
        (delivery("model_version.created", {"version": "7"}, at=1_800_000_000), 400, "not an MLflow registry"),
    ):  # fmt: skip
        with pytest.raises(Rejected, match=words) as raised:
            deliveries.accept(*bad)
        assert raised.value.status == status
    tampered = delivery("model_version_alias.created", {"name": "m", "alias": "champion", "version": "9"},
                        at=1_800_000_000)  # fmt: skip
    with pytest.raises(Rejected, match="signature"):
        deliveries.accept(tampered[0], tampered[1].replace(b'"9"', b'"3"'))
    with pytest.raises(UsageError, match="secret is empty"):
        Deliveries("")


def test_a_watch_config_names_what_is_wrong_in_one_line(tmp_path):
    from consistency_gate.gate.watch import load_watch_config

    for text, words in (
        ("models:\n  - {name: m, data: eval.csv, promotes: true}\n", r"models.0.promotes: Extra inputs"),
        ("models:\n  - {name: m, data: a.csv}\n  - {name: m, data: b.csv}\n", "model 'm' is listed 2 times"),
        ("reconcile_every_s: 1.0e-9\nmodels:\n  - {name: m, data: a.csv}\n", "reconcile_every_s: Input should be"),
        ("models:\n  - {name: m, data: a.csv, since: yesterday}\n", "models.0.since"),
    ):
        (tmp_path / "w.yaml").write_text(text)
        with pytest.raises(UsageError, match=words):
            load_watch_config(tmp_path / "w.yaml")
    (tmp_path / "w.yaml").write_text("models:\n  - {name: m, data: eval.csv, since: 4}\n")
    model = load_watch_config(tmp_path / "w.yaml").models[0]
    assert model.data == tmp_path / "eval.csv" and model.since == 4


def test_the_events_the_listener_wakes_on_are_one_table():
    from consistency_gate.mlops.webhooks import EVENTS, WAKES

    assert tuple(WAKES) == EVENTS and set(WAKES.values()) == {"versions", "alias"}


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


# ------------------------------------------------------------ a real server delivering to real listeners


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """A tracking server with the settings docs/watch.md gives (MLflow's own webhook cache, 15 s instead of its
    default minute, with the listener told so as the docs say, and its retries), two models whose v1 was
    registered and made @champion just before the listener registered its webhook (so the server's workers
    cache "no webhook" for those events), and the listener."""
    from cryptography.fernet import Fernet

    root = tmp_path_factory.mktemp("watch")
    env = {"MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS": "true", "MLFLOW_WEBHOOK_ALLOWED_SCHEMES": "http,https",
           "MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY": Fernet.generate_key().decode(),
           "MLFLOW_WEBHOOK_CACHE_TTL": str(WEBHOOK_CACHE_S)}  # fmt: skip
    server = MlflowServer(root, env=env).start()
    try:
        client = watched_registry(
            root, server.url, (MODEL, GUARDED),
            f"reconcile_every_s: 3600\nwebhook_cache_s: {WEBHOOK_CACHE_S}\nmodels:\n"
            f"  - {{name: {MODEL}, data: eval.csv, config: gate.yaml, id_column: id}}\n"
            f"  - {{name: {GUARDED}, data: eval.csv, config: gate.yaml, id_column: id, gate: false}}\n",
        )  # fmt: skip
        listener = Listener(root / "watch.yaml", server.url, free_port()).start()
        try:
            yield {"server": server, "client": client, "root": root, "listener": listener}
        finally:
            listener.stop()
    finally:
        server.kill()


@pytest.mark.slow  # a server, a listener, its gates, and the server's webhook cache running out
def test_versions_registered_while_the_servers_webhook_cache_is_stale_are_each_gated_once(watched):
    """MLflow's workers cache an event's webhooks (a minute by default, WEBHOOK_CACHE_S here) and are not told of
    a new one: a version registered right after --register is not delivered. The listener reconciles once that
    cache has expired, and any later event wakes a reconcile that gates every version without a record, whatever
    its order."""
    client, listener = watched["client"], watched["listener"]
    until(lambda: (listener.health()["last_reconcile"] or {}).get("model") == MODEL, "the first reconcile done")
    early = register(client, MODEL)  # while the cache holds "no webhook": no delivery
    gated = until(lambda: listener.did(f"gate {MODEL} v{early}"), "the reconcile after the webhook cache expired")
    assert "passed" in gated["said"], gated
    woken = client.get_model_version(MODEL, early).tags["consistency_gate.started_by"]
    # a server worker that had cached "no webhook" did not deliver it; one that had cached nothing did
    stale = woken == "registry: a reconcile (the tracking server's webhook cache expired)"
    assert stale or woken.startswith("registry: a reconcile (model_version.created, delivery "), woken
    watched["stale_cache_missed_the_first_event"] = stale
    cache = "the tracking server's webhook cache expired"
    # said once on stdout when the listener's timer ran (the last wake's reason in /health can be a later one's)
    until(lambda: stale or any(cache in line for line in listener.out), "the cache expired")
    later = register(client, MODEL)  # every worker's cache has expired: delivered
    until(lambda: listener.did(f"gate {MODEL} v{later}"), "the delivered version gated")
    assert champion(client, MODEL) == later
    for version in (early, later):
        assert len(gate_runs(client, MODEL, version, decided_only=False)) == 1
    tags = client.get_model_version(MODEL, later).tags
    assert tags["consistency_gate.started_by"].startswith("registry: a reconcile (model_version.created, delivery ")
    assert len(listener.health()["done"]) == len({d["job"] + d["said"] for d in listener.health()["done"]})


@pytest.mark.slow
def test_a_new_version_is_gated_in_seconds_by_its_event(watched):
    client, listener = watched["client"], watched["listener"]
    started = time.perf_counter()
    version = register(client, MODEL)
    done = until(lambda: listener.did(f"gate {MODEL} v{version}"), "the listener gated the new version")
    watched["gate_seconds"] = time.perf_counter() - started
    assert "passed" in done["said"] and "promoted" in done["said"], done
    assert champion(client, MODEL) == version
    run = client.get_run(client.get_model_version(MODEL, version).tags["consistency_gate.run_id"])
    assert run.data.tags["consistency_gate.lease"].startswith(f"{MODEL}.consistency-gate-lease.")
    guarded = until(lambda: listener.did(f"guard {MODEL} v{version}"), "the guard saw the gate's promotion")
    assert guarded["said"].startswith(f"@champion on v{version}: left"), guarded


@pytest.mark.slow
def test_a_hand_move_during_a_gate_is_moved_back_while_the_gate_runs(watched, tmp_path):
    client, listener = watched["client"], watched["listener"]
    before = champion(client, MODEL)
    poor = register(client, MODEL, poor=True)  # gated and failed: never authorized
    until(lambda: listener.did(f"gate {MODEL} v{poor}"), "the poor version gated")
    release = tmp_path / "release"
    waiting = register_waiting(client, MODEL, release)
    until(lambda: gate_runs(client, MODEL, waiting, decided_only=False), "the gate's run started (its baseline read)")
    started = time.perf_counter()
    client.set_registered_model_alias(MODEL, "champion", poor)  # by hand, while the gate waits
    done = until(lambda: listener.did(f"REVERTED @champion v{poor} -> v{before}"), "the revert")
    watched["revert_seconds"] = time.perf_counter() - started
    assert champion(client, MODEL) == before and done["job"] == f"guard {MODEL} v{poor}"
    assert listener.health()["running"]["job"] == f"gate {MODEL} v{waiting}"  # the gate still runs
    release.touch()
    gated = until(lambda: listener.did(f"gate {MODEL} v{waiting}"), "the gate ended")
    assert gated["said"].startswith("passed") and gated["said"].endswith(": promoted"), gated
    # its promotion came after the revert, though its run started before: the guard leaves it (moves in move order)
    left = until(lambda: listener.did(f"guard {MODEL} v{waiting}"), "the guard saw the gate's promotion")
    assert left["said"].startswith(f"@champion on v{waiting}: left"), left
    assert champion(client, MODEL) == waiting
    description = client.get_model_version(MODEL, poor).description.split("\n\n")
    assert description[0].startswith("FAILED") and description[1].startswith("REVERTED: @champion was moved to v")
    revert = client.search_runs(
        [client.get_experiment_by_name(f"consistency-gate/{MODEL}").experiment_id],
        filter_string=f"attributes.run_name = 'REVERTED @champion v{poor} -> v{before}'",
    )[0]
    assert revert.data.tags["consistency_gate.moved"] == "True" and "consistency_gate.promoted" not in revert.data.tags


@pytest.mark.slow
def test_a_rollback_and_an_authorization_are_left_where_they_put_the_alias(watched):
    client, listener, uri = watched["client"], watched["listener"], watched["server"].url
    current = champion(client, MODEL)
    proc = run_cli("rollback", "--model", MODEL, "--tracking-uri", uri, "--reason", "test")
    assert proc.returncode == 0, proc.stderr
    restored = champion(client, MODEL)
    assert restored != current
    left = until(lambda: listener.did(f"guard {MODEL} v{restored}"), "the guard saw the rollback")
    assert "left" in left["said"] and champion(client, MODEL) == restored
    description = client.get_model_version(MODEL, current).description.split("\n\n")
    assert description[0].startswith("PASSED") and description[1].startswith(f"ROLLED BACK v{current}")
    poor = next(v.version for v in client.search_model_versions(f"name='{MODEL}'")
                if v.description and "REVERTED" in v.description)  # fmt: skip
    refused = run_cli("authorize", "--model", MODEL, "--version", poor, "--reason", " ", "--tracking-uri", uri)
    assert refused.returncode == 2 and "--reason" in refused.stderr and champion(client, MODEL) == restored
    proc = run_cli("authorize", "--model", MODEL, "--version", poor, "--reason", "an emergency", "--by", "ops",
                   "--tracking-uri", uri)  # fmt: skip
    assert proc.returncode == 0 and f"v{restored} -> v{poor}: authorized, read back" in proc.stdout, proc.stderr
    until(lambda: (d := listener.did(f"guard {MODEL} v{poor}")) and "left" in d["said"], "the guard left it")
    assert champion(client, MODEL) == poor
    assert client.get_model_version(MODEL, poor).tags["consistency_gate.authorized_by"] == "ops: an emergency"
    proc = run_cli("authorize", "--model", MODEL, "--version", restored, "--reason", "over", "--tracking-uri", uri)
    assert proc.returncode == 0 and champion(client, MODEL) == restored, proc.stderr
    until(lambda: (d := listener.did(f"guard {MODEL} v{restored}")) and d["at"] > left["at"], "the guard saw it back")


@pytest.mark.slow
def test_bad_deliveries_bursts_and_hung_clients_are_answered_and_change_nothing(watched):
    client, listener = watched["client"], watched["listener"]
    before, done = champion(client, MODEL), len(listener.health()["done"])
    move = {"name": MODEL, "alias": "champion", "version": "1"}
    assert listener.post(*delivery("model_version_alias.created", move, secret="forged")) == 401
    assert listener.post(*delivery("model_version_alias.created", move, at=time.time() - 600)) == 400
    headers, body = delivery("model_version.created", {"name": "not-watched", "version": "1"})
    assert listener.post(headers, body) == 200 and listener.post(headers, body) == 409
    for length in ("abc", "-5"):
        with socket.create_connection(("127.0.0.1", listener.port), timeout=30) as conn:
            conn.sendall(f"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode())
            assert conn.recv(200).startswith(b"HTTP/1.0 400")
    assert [r["status"] for r in listener.health()["rejected"][-5:]] == [401, 400, 409, 400, 400]
    assert "refused a delivery from 127.0.0.1: 400 Content-Length 'abc' is not a number of bytes\n" in listener.out
    hung = [socket.create_connection(("127.0.0.1", listener.port), timeout=30) for _ in range(20)]
    for conn in hung:  # hang up mid-request
        conn.sendall(b"POST /webhook HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
        conn.close()
    codes: list[int] = []
    burst = [delivery("model_version.created", {"name": "not-watched", "version": str(i)}) for i in range(200)]
    threads = [threading.Thread(target=lambda d=d: codes.append(listener.post(*d))) for d in burst]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert codes.count(200) == 200, sorted(set(codes))
    missing = delivery("model_version.created", {"name": MODEL, "version": "999"})
    assert listener.post(*missing) == 200
    health = until(lambda: (h := listener.health())["queue"]["gates"] == 0 and h["running"] is None and h, "idle")
    assert len([d for d in health["done"] if "error" in d["said"]]) == 0
    assert health["healthy"] and champion(client, MODEL) == before and len(health["done"]) >= done
    assert not [line for line in listener.err if "Traceback" in line or "BrokenPipe" in line], listener.err


@pytest.mark.slow
def test_a_start_on_a_busy_port_leaves_the_running_listener_working(watched):
    client, listener, server = watched["client"], watched["listener"], watched["server"]
    hooks = {h.name: (h.url, h.webhook_id) for h in client.list_webhooks()}
    proc = run_cli("watch", "--config", watched["root"] / "watch.yaml", "--port", str(listener.port), "--register",
                   "http://127.0.0.1:1/webhook", "--tracking-uri", server.url,
                   env={**os.environ, "CONSISTENCY_GATE_WEBHOOK_SECRET": "another-secret"})  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(
        f"error: port {listener.port} is in use on 127.0.0.1"
    )
    assert {h.name: (h.url, h.webhook_id) for h in client.list_webhooks()} == hooks
    version = register(client, MODEL)
    done = until(lambda: listener.did(f"gate {MODEL} v{version}"), "the running listener still gates")
    assert "passed" in done["said"] and not [r for r in listener.health()["rejected"] if "signature" in r["why"]]


@pytest.mark.slow
def test_two_listeners_and_a_listener_killed_mid_gate_gate_each_version_once(watched, tmp_path):
    """A second listener started for availability registers the webhook to itself: the events reach it, the holder
    of the lease is woken through the lease and gates. The holder killed by PID during a gate (its worker dies with
    it): the other takes the lease, ends the killed gate's run and gates the version once more: one record."""
    client, first, server = watched["client"], watched["listener"], watched["server"]
    second = Listener(watched["root"] / "watch.yaml", server.url, free_port()).start()
    try:
        version = register(client, MODEL)
        until(lambda: first.did(f"gate {MODEL} v{version}"), "the holder gated it")
        assert not second.holds(MODEL) and second.did(f"gate {MODEL} v{version}") is None
        assert len(gate_runs(client, MODEL, version, decided_only=False)) == 1
        release = tmp_path / "release"
        waiting = register_waiting(client, MODEL, release)
        until(lambda: gate_runs(client, MODEL, waiting, decided_only=False), "its gate's run started")
        first.kill()
        until(lambda: second.holds(MODEL), "the other listener took the lease")
        until(lambda: (second.health()["running"] or {}).get("job") == f"gate {MODEL} v{waiting}", "gated again")
        release.touch()
        done = until(lambda: second.did(f"gate {MODEL} v{waiting}"), "the gate ended")
        runs = gate_runs(client, MODEL, waiting, decided_only=False)
        decided = gate_runs(client, MODEL, waiting)
        assert len(runs) == 2 and len(decided) == 1, [(r.info.status, r.data.tags) for r in runs]
        killed = next(r for r in runs if r.info.run_id != decided[0].info.run_id)
        assert (
            killed.info.status == "FAILED" and "ended before it decided" in killed.data.tags["consistency_gate.error"]
        )
        tags = client.get_model_version(MODEL, waiting).tags
        assert tags["consistency_gate.run_id"] == decided[0].info.run_id and decided[0].info.run_id in done["said"]
    finally:
        second.stop()
        watched["listener"] = first.start()  # back, with its webhook, for the next test


@pytest.mark.slow
def test_an_event_handled_while_the_tracking_server_is_down_moves_nothing_and_says_why(watched):
    """The module's last test: the server stays down (nothing could move the alias while it is)."""
    listener, server = watched["listener"], watched["server"]
    until(lambda: listener.holds(MODEL), "the restarted listener holds the lease")
    print(json.dumps({k: v if isinstance(v, bool) else round(v, 1) for k, v in watched.items()
                      if k.endswith(("_seconds", "_event"))}))  # fmt: skip
    server.kill()
    move, posted = {"name": MODEL, "alias": "champion", "version": "1"}, time.time()
    assert listener.post(*delivery("model_version_alias.created", move, delivery_id=str(uuid.uuid4()))) == 200
    failed = until(lambda: listener.did(f"guard {MODEL} v1", after=posted), "the guard tried")
    assert failed["said"].startswith("error: the tracking server does not answer"), failed
    assert "nothing was moved" in failed["said"] and listener.health()["healthy"]
