"""`consistency-gate watch` on a registry that sends no webhooks: a `sqlite:///` store and no server, read every
second (`--poll`). The same records as with webhooks: each version gated once (a version older than @champion's
gated but not promoted; the version a person authorized onto @champion is the baseline, not gated), a hand move
reverted in a run, no secret needed; a watch without --poll there polls and says so; --register there is one
line, exit 2."""

from __future__ import annotations

import os

import pytest
from conftest import run_cli
from mlflow_server import free_port
from registry_fixtures import sqlite_uri
from watch_fixtures import Listener, champion, gate_runs, register, until, watched_registry

MODEL = "iris-polled"
pytestmark = pytest.mark.slow  # a listener process and its gates


@pytest.fixture(scope="module")
def polled(tmp_path_factory):
    root = tmp_path_factory.mktemp("poll")
    uri = sqlite_uri(root)
    client = watched_registry(
        root,
        uri,
        (MODEL,),
        f"models:\n  - {{name: {MODEL}, data: eval.csv, config: gate.yaml, id_column: id, since: all}}\n",
    )
    listener = Listener(root / "watch.yaml", uri, free_port(), "--poll", "1", secret=None).start(register=False)
    try:
        yield {"client": client, "uri": uri, "root": root, "listener": listener}
    finally:
        listener.stop()


def test_a_polled_registry_gets_its_versions_gated_once_and_its_alias_guarded(polled):
    client, listener = polled["client"], polled["listener"]
    assert "polling every 1 s" in listener.health()["mode"]
    version = register(client, MODEL)
    done = until(lambda: listener.did(f"gate {MODEL} v{version}"), "the poll gated the new version")
    assert "passed" in done["said"] and "promoted" in done["said"] and champion(client, MODEL) == version
    assert len(gate_runs(client, MODEL, version, decided_only=False)) == 1
    assert (
        client.get_model_version(MODEL, version).tags["consistency_gate.started_by"]
        == ("registry: a reconcile (the timer)")
        or "the lease taken" in client.get_model_version(MODEL, version).tags["consistency_gate.started_by"]
    )
    poor = register(client, MODEL, poor=True)
    until(lambda: listener.did(f"gate {MODEL} v{poor}"), "the poor version gated")
    client.set_registered_model_alias(MODEL, "champion", poor)  # by hand
    until(lambda: listener.did(f"REVERTED @champion v{poor} -> v{version}"), "the poll's revert")
    assert champion(client, MODEL) == version
    assert client.get_model_version(MODEL, poor).description.split("\n\n")[1].startswith("REVERTED: @champion")


def test_a_version_older_than_the_champion_is_gated_late_but_not_promoted(polled):
    client, listener = polled["client"], polled["listener"]
    listener.stop()
    older, newer = register(client, MODEL), register(client, MODEL)
    proc = run_cli("authorize", "--model", MODEL, "--version", newer, "--reason", "a hotfix", "--tracking-uri",
                   polled["uri"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    listener.start(register=False)
    older_done = until(lambda: listener.did(f"gate {MODEL} v{older}"), "the older version gated")
    assert older_done["said"].endswith(f"not promoted: v{older} is older than v{newer}, which @champion holds")
    idle = until(lambda: (r := listener.health()["last_reconcile"] or {}).get("missing") == [] and r, "nothing left")
    assert idle["model"] == MODEL and champion(client, MODEL) == newer  # the authorized champion is the baseline
    assert listener.did(f"gate {MODEL} v{newer}") is None and not gate_runs(client, MODEL, newer, decided_only=False)


def test_a_store_without_webhooks_is_polled_and_register_there_is_refused(polled, tmp_path):
    env = {**os.environ, "CONSISTENCY_GATE_WEBHOOK_SECRET": ""}
    args = ("watch", "--config", polled["root"] / "watch.yaml", "--tracking-uri", polled["uri"])
    proc = run_cli(*args, "--register", "http://127.0.0.1:1/webhook", env=env)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        f"error: --register: {polled['uri']} is a store written directly, and MLflow sends webhooks from a tracking "
        "server (mlflow server) only, so it cannot deliver a webhook; leave --register out: watch polls it"
    )
    proc = run_cli(*args, "--port", str(polled["listener"].port), env=env)  # polls, then finds the port taken
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0].endswith(
        "(mlflow server) only: polling it every 30 s (--poll SECONDS to choose)"
    )
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: port {polled['listener'].port} is in use")


def test_a_watch_config_whose_data_lacks_its_columns_is_refused_before_listening(polled, tmp_path):
    data = polled["root"] / "eval.csv"
    (tmp_path / "watch.yaml").write_text(f"models:\n  - {{name: {MODEL}, data: {data}, id_column: sample}}\n")
    proc = run_cli("watch", "--config", tmp_path / "watch.yaml", "--tracking-uri", polled["uri"], "--poll", "5")
    assert proc.returncode == 3
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"error: {data}: no column 'sample' (the id_column of '{MODEL}' in the watch config); its columns: "
        )
    )
