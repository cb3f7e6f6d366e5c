"""Never a wrong promotion. Bad input, stale baselines, a lost response and credentials,
against real SQLite stores and a real `mlflow server` on 127.0.0.1 (behind a dropping proxy)."""

from __future__ import annotations

import json
import math
import socket
import time
import warnings
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from conftest import read_report, run_cli
from http_proxy import ForwardProxy
from mlflow import MlflowClient
from mlflow_server import MlflowServer
from registry_fixtures import MODEL, build_store, check_args

from consistency_gate.errors import DataError, ModelError, UsageError, redact_credentials
from consistency_gate.gate import config as gate_config
from consistency_gate.gate import rules
from consistency_gate.mlops import promotion, registry, tracking


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One real `mlflow server` and its store for the tests behind a faulty proxy (each starts from
    v1 as @champion: see ``_served``); killed after the module."""
    root = tmp_path_factory.mktemp("served")
    server = MlflowServer(root, gunicorn=True).start()
    try:
        yield server, build_store(root, uri=server.url)
    finally:
        server.kill()


def _served(served) -> tuple[MlflowServer, dict, MlflowClient]:
    """The shared server, its store and a client, with v1 @champion again (a test before may have
    promoted v2)."""
    server, store = served
    client = MlflowClient(tracking_uri=server.url, registry_uri=server.url)
    client.set_registered_model_alias(MODEL, "champion", "1")
    return server, store, client


def _client(store) -> MlflowClient:
    return MlflowClient(tracking_uri=store["uri"], registry_uri=store["uri"])


def _champion(client) -> str:
    return str(client.get_model_version_by_alias(MODEL, "champion").version)


def _one_error_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return lines[-1]


# ---------------------------------------------------------------- item 1: a gate with no rule


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "no rules"),
        ("rules: []\n", "no rules"),
        ("rules:\n  - {metric: con, min: .nan}\n", "finite"),
        ("rules:\n  - {metric: acc, min_delta: -.inf}\n", "finite"),
    ],
)
def test_no_rule_or_a_non_finite_threshold_is_a_usage_error_and_never_promotes(store, tmp_path, text, expected):
    config = tmp_path / "gate.yaml"
    config.write_text(text)
    before = _champion(_client(store))
    proc = run_cli(*check_args("3", store["data"], config, store["uri"], "--promote"))
    assert proc.returncode == 2, proc.stderr
    assert expected in _one_error_line(proc)
    assert _champion(_client(store)) == before
    assert "consistency_gate.verdict" not in _client(store).get_model_version(MODEL, "3").tags


def test_rule_checks_its_own_threshold():
    with pytest.raises(UsageError, match="finite"):
        rules.Rule("con", "min", math.nan)
    with pytest.raises(UsageError, match="kind"):
        rules.Rule("con", "atleast", 0.5)


# ---------------------------------------------------------------- item 2: stale baseline, the lock


def test_promotion_refused_when_the_alias_moved_since_the_comparison(store):
    client = _client(store)
    before = _champion(client)
    moved = promotion.promote(client, MODEL, "champion", "2", expected="3", owner="test")
    assert not moved.promoted and moved.exit_code == 4
    assert moved.holds == before and "gate v2 again against the new baseline" in moved.reason
    assert _champion(client) == before
    # a rollback refused the same way says what a rollback does next, not "gate v1 again"
    back = promotion.move_back(client, MODEL, "3", "1", "test")
    assert back.refused and "run rollback again" in back.reason and "gate v" not in back.reason
    assert f"{MODEL}{promotion.LOCK_SUFFIX}" not in {m.name for m in client.search_registered_models()}


def test_promotion_lock_waits_for_a_live_holder_and_clears_a_dead_one(store):
    client = _client(store)
    lock = f"{MODEL}{promotion.LOCK_SUFFIX}"
    live = {promotion.TAG_LOCK_OWNER: "other", promotion.TAG_LOCK_EXPIRES: str(time.time() + 600)}
    client.create_registered_model(lock, tags={**live, tracking.TAG_HOST: socket.gethostname(), tracking.TAG_PID: "1"})
    try:
        held = promotion.promotion_lock(client, MODEL, "me", wait_s=0.5)
        with pytest.raises(ModelError, match="another gate has held the promotion lock"), held:
            pass  # pid 1 lives: the holder is alive
        client.set_registered_model_tag(lock, promotion.TAG_LOCK_EXPIRES, str(time.time() - 1))
        with promotion.promotion_lock(client, MODEL, "me", wait_s=0.5):
            assert client.get_registered_model(lock).tags[promotion.TAG_LOCK_OWNER] == "me"
        assert lock not in {m.name for m in client.search_registered_models()}  # released by its owner
    finally:
        if lock in {m.name for m in client.search_registered_models()}:
            client.delete_registered_model(lock)


def test_a_dead_holders_lock_is_taken_over_at_once(store, monkeypatch):
    """A gate SIGKILLed while holding the lock blocked every promotion of the model
    for its 10-minute lease; a holder whose process is gone, or whose gate run ended, is taken over."""
    import subprocess
    import sys

    waits: list[float] = []
    monkeypatch.setattr(promotion.time, "sleep", waits.append)  # the lock's own pauses between tries
    client = _client(store)
    lock = f"{MODEL}{promotion.LOCK_SUFFIX}"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    ended = client.create_run(client.get_experiment_by_name("training").experiment_id)
    client.set_terminated(ended.info.run_id, "KILLED")
    host, pid, owner = tracking.TAG_HOST, tracking.TAG_PID, promotion.TAG_LOCK_OWNER
    holders = [
        {owner: "killed-gate", host: socket.gethostname(), pid: gone.stdout.strip()},  # its process is gone
        {owner: ended.info.run_id, host: "another-host", pid: "1"},  # its gate run ended
    ]
    try:
        for tags in holders:
            client.create_registered_model(lock, tags={**tags, promotion.TAG_LOCK_EXPIRES: str(time.time() + 600)})
            waits.clear()
            with promotion.promotion_lock(client, MODEL, "me", wait_s=5):
                assert client.get_registered_model(lock).tags[promotion.TAG_LOCK_OWNER] == "me"
            assert len(waits) <= 1  # claimed at its next try: it never waits out a holder that is gone
    finally:
        if lock in {m.name for m in client.search_registered_models()}:
            client.delete_registered_model(lock)


# ---------------------------------------------------------------- item 3: a lost response


def _con_config(tmp_path) -> Path:
    config = tmp_path / "gate.yaml"
    config.write_text("rules:\n  - {metric: con, min: 0.5}\n")
    return config


@pytest.mark.slow
def test_a_lost_alias_response_does_not_hide_the_promotion(served, tmp_path):
    server, store, client = _served(served)
    proxy = None
    try:
        proxy = ForwardProxy(
            server.port, drop=lambda method, path: method == "POST" and path.endswith("registered-models/alias")
        ).start()
        config = _con_config(tmp_path)
        env = proxy.env()
        report = tmp_path / "report.json"
        proc = run_cli(
            *check_args("2", store["data"], config, server.url, "--id-column", "id", "--promote", "--report", report),
            env=env,
            process=False,
        )
        assert proxy.dropped, "the proxy dropped no alias response"
        assert _champion(client) == "2"  # the registry moved the alias; the gate must say so
        assert proc.returncode == 0, proc.stderr
        written = read_report(report)
        assert written["promoted"] is True and written["promotion"]["holds"] == "2"
        run = client.get_run(written["run_id"])
        assert run.data.tags["consistency_gate.promoted"] == "True" and run.info.status == "FINISHED"
    finally:
        if proxy is not None:
            proxy.stop()


@pytest.mark.slow
def test_faults_after_the_alias_moved_are_warnings_never_an_error(served, tmp_path):
    """The promotion is the gate's last act. With MLflow's retries off, the proxy drops
    the first read-back of the alias, the report.json logged after the move and the run's end: the
    alias moved, so the gate says promoted (read back), exit 0, the report's fault a warning, and the
    run's end retried (it had ended: a lost answer)."""
    server, store, client = _served(served)
    proxy = None
    after_move: list[str] = []

    def drop(method: str, path: str) -> bool:
        if method == "POST" and path.endswith("registered-models/alias"):
            after_move.append("moved")
            return False
        if not after_move:
            return False
        for kind, hit in (
            ("read-back", method == "GET" and "registered-models/alias" in path),
            ("report", method == "PUT" and path.endswith("gate/report.json")),
            ("end", method == "POST" and path.endswith("runs/update")),
        ):
            if hit and kind not in after_move:
                after_move.append(kind)
                return True
        return False

    try:
        proxy = ForwardProxy(server.port, drop=drop).start()
        config = _con_config(tmp_path)
        env = proxy.env(retries="0")
        report = tmp_path / "report.json"
        proc = run_cli(
            *check_args("2", store["data"], config, server.url, "--id-column", "id", "--promote", "--report", report),
            env=env,
            process=False,
        )
        assert set(after_move) == {"moved", "read-back", "report", "end"}, (after_move, proxy.dropped)
        assert _champion(client) == "2"
        assert proc.returncode == 0, proc.stderr[-3000:]
        written = read_report(report)
        assert written["verdict"] == "passed" and written["promoted"] is True and written["promotion"]["holds"] == "2"
        assert any("could not record the move" in w for w in written["warnings"]), written["warnings"]
        run = client.get_run(written["run_id"])  # its end, retried, found the run ended: no warning
        assert run.info.status == "FINISHED" and not any("could not be ended" in w for w in written["warnings"])
        tags = run.data.tags
        assert tags["consistency_gate.verdict"] == "passed"  # logged before the alias moved
        # what the run could record of the move: the outcome, or unknown (logged before the move); never "not
        # promoted" for a version @champion holds
        logged = client.download_artifacts(written["run_id"], "gate/report.json", str(tmp_path))
        logged = json.loads(Path(logged).read_text())
        assert tags["consistency_gate.promoted"] in ("True", "unknown") and logged["promoted"] in (True, None)
        if logged["promoted"] is None:
            assert logged["passed_version"] is None and "read @champion" in logged["promotion"]["reason"]
    finally:
        if proxy is not None:
            proxy.stop()


@pytest.mark.slow
def test_a_shadow_promotion_and_a_rollback_that_their_runs_cannot_record_are_said_as_they_happened(served, tmp_path):
    """After the alias moved, every upload of the run's report.json answers 503 (MLflow's retries off): the
    shadow check and the rollback say the move as read back (exit 0, --report promoted true, a warning),
    never "became unreachable" with the alias moved unseen."""
    server, store, client = _served(served)
    frame = pd.read_csv(store["data"])
    capture = tmp_path / "capture.csv"
    times = pd.date_range("2026-11-27T10:00:00Z", periods=len(frame), freq="s")
    answers = {"champion": frame["label"], "candidate": frame["label"]}
    pd.DataFrame({"id": frame["id"], "time": times, **answers}).to_csv(capture, index=False)
    labels = tmp_path / "labels.csv"
    frame[["id", "label"]].to_csv(labels, index=False)
    moved: list[str] = []

    def fail(method: str, path: str) -> int | None:
        if method == "POST" and path.endswith("registered-models/alias"):
            moved.append(path)
        return 503 if moved and method == "PUT" and path.endswith("gate/report.json") else None

    proxy = ForwardProxy(server.port, fail=fail).start()
    try:
        report = tmp_path / "shadow.json"
        proc = run_cli("shadow", "check", "--model", MODEL, "--candidate", "2", "--capture", capture, "--labels",
                       labels, "--config", _con_config(tmp_path), "--promote", "--tracking-uri", server.url,
                       "--report", report, env=proxy.env(retries="0"), process=False)  # fmt: skip
        assert moved and proxy.failed, "the proxy failed no upload after the move"
        assert proc.returncode == 0, proc.stderr[-3000:]
        written = read_report(report)
        assert written["promoted"] is True and _champion(client) == "2"
        assert any("could not record the move" in w for w in written["warnings"]), written
        assert "warning: @champion holds v2" in proc.stdout

        moved.clear()
        report = tmp_path / "rollback.json"
        proc = run_cli("rollback", "--model", MODEL, "--tracking-uri", server.url, "--report", report,
                       env=proxy.env(retries="0"), process=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        written = read_report(report)
        assert written["promoted"] is True and _champion(client) == "1"
        assert any("could not record the move" in w for w in written["warnings"]), written
        assert "warning: @champion holds v1" in proc.stderr
    finally:
        proxy.stop()


# answers the store gives a gate when another gate did the same thing at the same moment (MLflow's
# store reads a colliding lock to word its refusal, and the holder may delete it in between; two gates
# logging the same evaluation data both insert it, and the unique key refuses the later)
RACES = {
    "lock released while refused": (
        "registered-models/create",
        (404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": f"Registered Model {MODEL}.lock not found"}),
    ),
    "dataset logged by another gate": (
        "runs/log-inputs",
        (400, {"error_code": "BAD_REQUEST", "message": "(sqlite3.IntegrityError) UNIQUE constraint failed: datasets"}),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("race", list(RACES))
def test_an_answer_another_gate_caused_at_the_same_moment_is_tried_again(served, tmp_path, race):
    """Four gates at once exited 6 in both ways. The proxy gives the gate's first such request the
    store's answer in that race; the gate tries again, passes and promotes."""
    endpoint, answer = RACES[race]
    server, store, client = _served(served)
    proxy = None
    calls: list[str] = []

    def fail(method: str, path: str) -> tuple[int, dict] | None:
        if method == "POST" and path.endswith(endpoint):
            calls.append(path)
            return answer if len(calls) == 1 else None
        return None

    try:
        proxy = ForwardProxy(server.port, fail=fail).start()
        report = tmp_path / "report.json"
        args = check_args("2", store["data"], _con_config(tmp_path), server.url, "--promote", "--report", report)
        proc = run_cli(*args, "--id-column", "id", env=proxy.env(retries="0"), process=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert len(calls) >= 2 and read_report(report)["promoted"] is True
        assert _champion(client) == "2"
    finally:
        if proxy is not None:
            proxy.stop()


@pytest.mark.slow
def test_a_run_whose_create_response_was_lost_is_found_and_ended(served, tmp_path):
    """The proxy drops the first runs/create response of each gate. With MLflow's
    retries the client creates a second run; without them the gate exits 5. Either way no run is left
    RUNNING: the lost one carries the gate session's tag from its creation and the gate ends it."""
    server, store, client = _served(served)
    proxy = None
    creates: list[str] = []

    def drop(method: str, path: str) -> bool:
        if method == "POST" and path.endswith("runs/create"):
            creates.append(path)
            return len(creates) == 1
        return False

    try:
        proxy = ForwardProxy(server.port, drop=drop).start()
        config = _con_config(tmp_path)
        for retries, code in (("7", 0), ("0", 5)):
            creates.clear()
            proc = run_cli(
                *check_args("2", store["data"], config, server.url, "--id-column", "id"),
                env=proxy.env(retries),
                process=False,
            )
            assert proc.returncode == code, proc.stderr[-3000:]
            assert proxy.dropped, "the proxy dropped no create response"
            experiment = client.get_experiment_by_name(f"consistency-gate/{MODEL}")
            runs = client.search_runs([experiment.experiment_id])
            assert [r.info.run_id for r in runs if r.info.status == "RUNNING"] == [], retries
            lost = [r for r in runs if "lost" in r.data.tags.get(tracking.TAG_ERROR, "")]
            assert lost and all(r.info.status == "FAILED" for r in lost), retries
    finally:
        if proxy is not None:
            proxy.stop()


@pytest.mark.slow
def test_a_503_at_the_alias_look_up_or_move_is_exit_5(served, tmp_path):
    """A 503 answering the baseline alias look-up was exit 6 ("a bug") with no report, and a
    503 answering the alias move was exit 4 ("the baseline moved"); both are the server failing: 5."""
    server, store, client = _served(served)
    proxy = None
    failing = {"target": ""}

    def fail(method: str, path: str) -> int | None:
        if failing["target"] == "lock":  # the promotion lock cannot be taken: the move is never asked for
            return 503 if method == "POST" and path.endswith("registered-models/create") else None
        hit = {"look-up": method == "GET", "move": method == "POST"}.get(failing["target"], False)
        return 503 if hit and "registered-models/alias" in path else None

    try:
        proxy = ForwardProxy(server.port, fail=fail).start()
        config = _con_config(tmp_path)
        env = proxy.env(retries="0")
        for target in ("look-up", "move", "lock"):
            failing["target"] = target
            report = tmp_path / f"{target}.json"
            args = check_args("2", store["data"], config, server.url, "--promote", "--report", report)
            proc = run_cli(*args, env=env, process=False)
            assert proc.returncode == 5, (target, proc.stderr[-2000:])
            assert "Traceback" not in proc.stderr and _champion(client) == "1", target
            written = read_report(report)
            assert written.get("promoted") is not True, target
            assert written.get("exit_code", 5) == 5 and "503" in json.dumps(written), target
    finally:
        if proxy is not None:
            proxy.stop()


@pytest.mark.slow
def test_an_outage_longer_than_the_read_back_window_is_an_unknown_promotion(served, tmp_path):
    """The alias moved, then the registry answered no read-back for longer than the gate
    reads it back (2 s here, 30 s by default): ``promoted`` is null (unknown), never false; exit 5, the
    report and the run's tag say unknown and what to do, while @champion holds v2."""
    server, store, client = _served(served)
    proxy = None
    moved: list[str] = []

    def fail(method: str, path: str) -> int | None:
        if method == "POST" and path.endswith("registered-models/alias"):
            moved.append(path)
        return 503 if moved and method == "GET" and "registered-models/alias" in path else None

    try:
        proxy = ForwardProxy(server.port, fail=fail).start()
        report = tmp_path / "report.json"
        args = check_args("2", store["data"], _con_config(tmp_path), server.url, "--promote", "--report", report)
        proc = run_cli(
            *args,
            "--id-column",
            "id",
            env={**proxy.env(retries="0"), "CONSISTENCY_GATE_READ_BACK_S": "2"},
            process=False,
        )
        assert moved and _champion(client) == "2"
        assert proc.returncode == 5, proc.stderr[-2000:]
        written = read_report(report)
        assert written["promoted"] is None and written["promotion"]["holds"] == "unknown"
        assert "whether it moved is unknown" in written["promotion"]["reason"]
        assert "Promotion unknown" in proc.stdout and "error: asked the registry" in proc.stderr
        run = client.get_run(written["run_id"])
        assert run.data.tags["consistency_gate.promoted"] == "unknown" and run.info.status == "FINISHED"
        description = client.get_model_version(MODEL, "2").description  # the registry's page says it too
        assert description.startswith("PROMOTION UNKNOWN: the move to @champion could not be read back"), description
    finally:
        if proxy is not None:
            proxy.stop()


@pytest.mark.slow
def test_an_earlier_report_the_server_will_not_give_fails_a_history_rule_and_promotes_nothing(served, tmp_path):
    """Every earlier gate's report.json answers 503 (MLflow's retries off): a rule over the last 3 champions
    cannot know them, so it fails (exit 1) and nothing moves, where a history without those gates passed it."""
    server, store, client = _served(served)
    first = run_cli(
        *check_args("2", store["data"], _con_config(tmp_path), server.url, "--id-column", "id", "--promote")
    )
    assert first.returncode == 0 and _champion(client) == "2", first.stderr[-2000:]
    config = tmp_path / "history.yaml"
    config.write_text("rules:\n  - {metric: forgotten, max: 1.0, history: 3}\n")

    def fail(method: str, path: str) -> int | None:
        return 503 if method == "GET" and path.endswith("gate/report.json") else None

    proxy = ForwardProxy(server.port, fail=fail).start()
    try:
        report = tmp_path / "report.json"
        args = check_args("3", store["data"], config, server.url, "--id-column", "id", "--promote", "--report", report)
        proc = run_cli(*args, env=proxy.env(retries="0"), process=False)
        assert proxy.failed, "the proxy failed no report"
        assert proc.returncode == 1, proc.stderr[-2000:]
        written = read_report(report)
        assert written["promoted"] is None or written["promoted"] is False
        assert "gate/report.json cannot be read" in written["null_reasons"]["forgotten"], written["null_reasons"]
        assert _champion(client) == "2"
    finally:
        proxy.stop()


@pytest.mark.slow
def test_a_move_right_after_the_gates_own_is_exit_4_and_says_what_holds_the_alias(served, tmp_path):
    """Someone moves @champion to v3 between the gate's move to v2 and its read-back: not an error of the
    registry (exit 5) but a move by another, exit 4 as the docs say, naming what the alias holds."""
    server, store, client = _served(served)
    direct = MlflowClient(tracking_uri=server.url, registry_uri=server.url)
    moved: list[str] = []

    def fail(method: str, path: str) -> None:
        if method == "POST" and path.endswith("registered-models/alias") and not moved:
            moved.append("gate")
        elif moved == ["gate"] and method == "GET" and "registered-models/alias" in path:
            moved.append("another")
            direct.set_registered_model_alias(MODEL, "champion", "3")  # before the read-back reaches the server

    proxy = ForwardProxy(server.port, fail=fail).start()
    try:
        report = tmp_path / "report.json"
        args = check_args("2", store["data"], _con_config(tmp_path), server.url, "--promote", "--report", report)
        proc = run_cli(*args, "--id-column", "id", env=proxy.env(retries="0"), process=False)
        assert moved == ["gate", "another"] and _champion(client) == "3"
        assert proc.returncode == 4, proc.stderr[-2000:]
        written = read_report(report)
        assert written["promoted"] is False and written["promotion"]["holds"] == "3"
        assert "then another gate or a person moved it to v3" in written["promotion"]["reason"]
    finally:
        proxy.stop()


# ---------------------------------------------------------------- item 5: the candidate is the baseline


def test_candidate_equal_to_baseline_is_nothing_to_decide(store, tmp_path):
    config = tmp_path / "gate.yaml"
    config.write_text("rules:\n  - {metric: con, min: 0.5}\n")
    client = _client(store)
    experiment = client.get_experiment_by_name(f"consistency-gate/{MODEL}")
    runs_before = len(client.search_runs([experiment.experiment_id])) if experiment else 0
    proc = run_cli(*check_args("1", store["data"], config, store["uri"], "--promote", "--format", "json"))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["verdict"] == "nothing to decide" and report["promoted"] is False and report["run_id"] is None
    assert "is the baseline" in report["null_reasons"]["*"]
    assert "consistency_gate.verdict" not in client.get_model_version(MODEL, "1").tags
    experiment = client.get_experiment_by_name(f"consistency-gate/{MODEL}")
    assert (len(client.search_runs([experiment.experiment_id])) if experiment else 0) == runs_before


def test_a_baseline_registered_again_as_the_candidate_is_a_warning_in_the_report_and_the_run(store, tmp_path):
    """The same logged model registered twice (the most common champion-challenger
    wiring bug) passes every consistency rule trivially; the gate says so in the report, the tables,
    the HTML and a run tag."""
    from consistency_gate.gate.run import run_gate

    built = store  # the module's store gains a version (v1 again), which no other test here gates
    client = _client(built)
    model_id = registry.logged_model_id(client.get_model_version(MODEL, "1"))
    mlflow.set_tracking_uri(built["uri"])
    mlflow.set_registry_uri(built["uri"])
    again = mlflow.register_model(f"models:/{model_id}", MODEL)
    config = gate_config.parse_config("rules:\n  - {metric: ctoi, max: 0.02}\n")
    report_path = tmp_path / "report.json"
    result = run_gate(
        MODEL, built["data"], candidate=again.version, config=config, tracking_uri=built["uri"], report_path=report_path
    )
    report = read_report(report_path)
    assert report["verdict"] == "passed" and len(report["warnings"]) == 2
    assert f"v{again.version} and the baseline v1 are the same logged model ({model_id})" in report["warnings"][0]
    assert "answered exactly as the baseline on every sample" in report["warnings"][1]
    assert "<strong>Warning:</strong> the candidate v" in result.html and "answered exactly" in result.html
    tags = client.get_run(result.run_id).data.tags
    assert "same logged model" in tags["consistency_gate.warning"]


def test_a_prediction_file_gated_against_itself_is_a_warning(tmp_path):
    # a store of its own: the URI an earlier test of this worker set (MLflow puts it in MLFLOW_TRACKING_URI) may
    # name a server that has since stopped (seen on a busy machine, where the tests ran in another order)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    labels, scores = tmp_path / "labels.csv", tmp_path / "scores.csv"
    labels.write_text("label\n" + "a\nb\n" * 20)
    scores.write_text("a,b\n" + "0.9,0.1\n0.2,0.8\n" * 20)
    config = tmp_path / "gate.yaml"
    config.write_text("ks: [1]\nrules:\n  - {metric: ctoi, max: 0.02}\n")
    proc = run_cli(
        "check", "--labels", labels, "--previous-predictions", scores, "--candidate-predictions", scores,
        "--config", config, "--name", "nightly", "--tracking-uri", store,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Warning: the candidate answered exactly as the baseline on every sample" in proc.stdout
    other = tmp_path / "other.csv"
    other.write_text("a,b\n" + "0.9,0.1\n0.3,0.7\n" * 20)  # the same labels, other scores: a real retrain
    proc = run_cli(
        "check", "--labels", labels, "--previous-predictions", scores, "--candidate-predictions", other,
        "--config", config, "--name", "nightly", "--tracking-uri", store,
    )  # fmt: skip
    assert proc.returncode == 0 and "Warning" not in proc.stdout


@pytest.mark.parametrize("option", ["--report", "--summary"])
def test_an_unwritable_report_or_summary_is_refused_before_any_work(store, tmp_path, option):
    """A --report or --summary that cannot be written was exit 6 after @champion had
    moved; now exit 2 before any run, tag or promotion."""
    config = tmp_path / "gate.yaml"
    config.write_text("rules:\n  - {metric: con, min: 0.5}\n")
    client = _client(store)
    experiment = client.get_experiment_by_name(f"consistency-gate/{MODEL}")
    runs_before = len(client.search_runs([experiment.experiment_id])) if experiment else 0
    champion = _champion(client)
    for target, why in [(tmp_path / "missing" / "out.txt", "does not exist"), (tmp_path, "is a folder")]:
        proc = run_cli(*check_args("2", store["data"], config, store["uri"], option, target, "--promote"))
        line = _one_error_line(proc)
        assert proc.returncode == 2 and f"{option} {target}" in line and why in line, line
    assert _champion(client) == champion
    experiment = client.get_experiment_by_name(f"consistency-gate/{MODEL}")
    assert (len(client.search_runs([experiment.experiment_id])) if experiment else 0) == runs_before


@pytest.mark.slow  # three promoting gates on a store of its own, one in a process of its own
def test_an_output_that_fails_after_the_promotion_is_a_warning_saying_what_moved(tmp_path):
    """--summary /dev/full, --report /dev/full and a full stdout were exit 6 "internal error ...
    nothing was promoted" while @champion had moved to v2 (and --report also left the run FAILED)."""
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    import subprocess
    import sys

    store = build_store(tmp_path)
    config = tmp_path / "gate.yaml"
    config.write_text("rules:\n  - {metric: con, min: 0.5}\n")
    client = _client(store)
    for option in ("--summary", "--report", "stdout"):
        client.set_registered_model_alias(MODEL, "champion", "1")  # each output fails after its own promotion
        extra = () if option == "stdout" else (option, "/dev/full")
        command = [*check_args("2", store["data"], config, store["uri"], *extra, "--promote")]
        if option == "stdout":  # a process of its own, its standard output a full disk
            with open("/dev/full", "w") as full:
                argv = [sys.executable, "-m", "consistency_gate", *map(str, command)]
                proc = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
        else:
            proc = run_cli(*command)
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 5 and "internal error" not in proc.stderr, proc.stderr[-2000:]
        assert last.startswith("warning: could not write ") and "v2 promoted: @champion holds v2" in last, last
        assert _champion(client) == "2"
    runs = client.search_runs([client.get_experiment_by_name(f"consistency-gate/{MODEL}").experiment_id])
    assert len(runs) == 3 and {r.info.status for r in runs} == {"FINISHED"}


# ---------------------------------------------------------------- item 7: diagnose's tracking URI


def test_diagnose_loads_registry_members_from_the_given_store(store, tmp_path):
    proc = run_cli(
        "diagnose",
        "--member",
        f"a=models:/{MODEL}/1",
        "--member",
        f"b=models:/{MODEL}/3",
        "--data",
        store["data"],
        "--train-data",  # the models predict a second set for the collusion check
        store["data"],
        "--id-column",
        "id",
        "--tracking-uri",
        store["uri"],
        "--format",
        "json",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "mlflow.db").exists()
    collusion = json.loads(proc.stdout)["collusion"]
    assert collusion["train"] == collusion["evaluated"]  # the same data gives the same numbers
    members = ("--member", f"a=models:/{MODEL}/1", "--member", f"b=models:/{MODEL}/3")
    proc = run_cli("diagnose", *members, "--data", store["data"], "--tracking-uri", "ftp://x")
    assert proc.returncode == 2 and "scheme 'ftp'" in _one_error_line(proc)
    # an alias is read by the registry's own URI parser; the two debiasing shares are named apart
    members = ("--member", f"a=models:/{MODEL}@champion", "--member", f"b=models:/{MODEL}/3")
    proc = run_cli("diagnose", *members, "--data", store["data"], "--tracking-uri", store["uri"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "debiasing share (probabilities)" in proc.stdout and "debiasing share (log-probabilities)" in proc.stdout


# ---------------------------------------------------------------- items 8, 9, 12: bad files


def test_a_csv_that_is_not_utf8_names_the_file_and_byte_offset(store, tmp_path):
    data = tmp_path / "latin1.csv"
    text = pd.read_csv(store["data"]).to_csv(index=False)
    cut = len(text) // 2
    data.write_bytes(text[:cut].encode() + b"\xe9\xff\x00garbage" + text[cut:].encode())
    config = tmp_path / "gate.yaml"
    config.write_text("rules:\n  - {metric: con, min: 0.5}\n")
    proc = run_cli(*check_args("2", data, config, store["uri"], "--id-column", "id"))
    assert proc.returncode == 3, proc.stderr
    line = _one_error_line(proc)
    assert str(data) in line and f"byte {cut}" in line and "UTF-8" in line


def test_a_csv_row_with_more_fields_than_the_header_is_a_data_error(tmp_path):
    """Pandas' chunked reader with ``usecols`` dropped the extra field without a word."""
    examples = Path(__file__).resolve().parents[1] / "consistency_gate" / "examples"
    labels = tmp_path / "labels.csv"
    lines = (examples / "labels.csv").read_text().splitlines()
    labels.write_text("\n".join([*lines[:3], lines[3] + ",stray", *lines[4:]]) + "\n")
    proc = run_cli(
        "compare", "--labels", labels, "--previous", examples / "previous.csv",
        "--candidate", examples / "candidate.csv", "--id-column", "id",
    )  # fmt: skip
    line = _one_error_line(proc)
    assert proc.returncode == 3 and str(labels) in line and "Expected 2 fields in line 4, saw 3" in line, line


def test_the_fast_csv_id_reader_agrees_with_pandas_and_leaves_errors_to_it(tmp_path):
    """read_column reads a CSV id column with pyarrow: the same text and the same missing values as
    pandas' reader (leading zeros, quoted commas, every NA marker); a file pyarrow cannot read goes
    to pandas, whose error names the byte."""
    from consistency_gate.io.predictions import iter_frames, read_column

    data = tmp_path / "ids.csv"
    ids = ["007", '"a,b"', "NA", "", "None", "<NA>", "x y", "1.0", "null", "  pad", "é"]
    data.write_text("id,score\n" + "".join(f"{i},0.5\n" for i in ids), encoding="utf-8")
    fast = read_column(data, "id")
    slow = next(iter_frames(data, ["id"], text_columns=("id",)))["id"]
    assert (
        fast.isna().tolist()
        == slow.isna().tolist()
        == [False, False, True, True, True, True] + [False, False, True] + [False, False]
    )
    assert fast[fast.notna()].tolist() == slow[slow.notna()].tolist() == ["007", "a,b", "x y", "1.0", "  pad", "é"]
    bad = tmp_path / "latin1.csv"
    bad.write_bytes(b"id,score\nok,0.5\n\xe9t\xe9,0.5\n")
    with pytest.raises(DataError, match="UTF-8"):
        read_column(bad, "id")


def test_nan_or_inf_in_a_feature_names_column_and_row(store, tmp_path):
    config = tmp_path / "gate.yaml"
    config.write_text("rules:\n  - {metric: con, min: 0.5}\n")
    for bad, shown in (("nan", "nan"), ("inf", "inf")):
        frame = pd.read_csv(store["data"])
        frame["sepal_width"] = frame["sepal_width"].astype(float)
        frame.loc[6, "sepal_width"] = float(bad)
        data = tmp_path / f"{bad}.csv"
        frame.to_csv(data, index=False)
        proc = run_cli(*check_args("2", data, config, store["uri"], "--id-column", "id"))
        assert proc.returncode == 3, proc.stderr
        line = _one_error_line(proc)
        assert str(data) in line and "'sepal_width', row 7" in line and shown in line


def test_a_model_s_numeric_warnings_are_not_printed(store, tmp_path):
    """A feature of -1e308 made scikit-learn print eight RuntimeWarnings before the gate's
    own lines. The model's scores for that row are NaN: one line saying so, naming the row (exit 4)."""
    frame = pd.read_csv(store["data"])
    frame.loc[6, "petal_length"] = -1e308
    data = tmp_path / "huge.csv"
    frame.to_csv(data, index=False)
    with warnings.catch_warnings(record=True) as caught:  # in this process: what would have been printed
        warnings.simplefilter("always")
        proc = run_cli(*check_args("2", data, _con_config(tmp_path), store["uri"], "--id-column", "id"))
    assert proc.returncode == 4 and not [w for w in caught if w.category is RuntimeWarning], caught
    assert "NaN, infinite or negative class scores (first at data row 7" in _one_error_line(proc)


def test_a_duplicated_class_header_is_a_data_error(tmp_path):
    labels = tmp_path / "labels.csv"
    labels.write_text("label\nsetosa\nversicolor\n")
    previous = tmp_path / "previous.csv"
    previous.write_text("setosa,versicolor\n0.9,0.1\n0.2,0.8\n")
    candidate = tmp_path / "candidate.csv"
    candidate.write_text("setosa,setosa\n0.9,0.1\n0.2,0.8\n")
    proc = run_cli("compare", "--labels", labels, "--previous", previous, "--candidate", candidate)
    assert proc.returncode == 3, proc.stderr
    line = _one_error_line(proc)
    assert str(candidate) in line and "'setosa'" in line and "setosa.1" not in line


def test_a_rule_on_a_k_beyond_the_class_count_is_a_usage_error(store, tmp_path):
    """ks beyond the classes are not applicable (tests/test_default_config.py); a rule on one cannot be judged."""
    config = tmp_path / "gate.yaml"
    config.write_text("ks: [1, 5]\nrules:\n  - {metric: con, min: 0.5}\n  - {metric: ccon@5, min: 0.5}\n")
    proc = run_cli(*check_args("2", store["data"], config, store["uri"], "--id-column", "id"))
    assert proc.returncode == 2, proc.stderr
    assert "line 4: rule ccon@5 >= 0.5 cannot be judged for models:/iris-clf/1: k=5 is larger than its 3 classes" in (
        _one_error_line(proc)
    )


# ---------------------------------------------------------------- items 10, 13: tracking URIs, secrets


@pytest.mark.parametrize(
    ("uri", "code", "expected"),
    [
        ("ftp://host/store", 2, "scheme 'ftp' is not one MLflow keeps a model registry in"),
        ("notauri", 2, "MLflow 3 refuses"),
        ("SQLITE_NOT_A_DB", 5, "is not an SQLite database"),
        ("postgresql://bob:s3cret@127.0.0.1:5999/mlflow", 5, "pip install psycopg[binary]"),
        ("http://bob:s3cret@127.0.0.1:9/", 5, "unreachable"),
        ("http://127.0.0.1:9/?token=s3cret", 2, "has a query (?...): MLflow appends its API path"),  # was a 405, exit 6
    ],
)
def test_unusable_tracking_uris_are_refused_in_one_line_without_secrets(store, tmp_path, uri, code, expected):
    if uri == "SQLITE_NOT_A_DB":
        (tmp_path / "notes.db").write_text("not a database\n")
        uri = f"sqlite:///{tmp_path / 'notes.db'}"
    config = tmp_path / "gate.yaml"
    config.write_text("rules:\n  - {metric: con, min: 0.5}\n")
    # its own process: no library may print the secret to stderr either
    proc = run_cli(*check_args("2", store["data"], config, uri), cwd=tmp_path, process=True)
    assert proc.returncode == code, proc.stderr
    line = _one_error_line(proc)
    assert expected in line and "s3cret" not in proc.stderr
    assert not (tmp_path / "mlruns").exists()


def test_redact_credentials_keeps_everything_but_the_password():
    text = "cannot reach https://ci:tok3n@mlflow.example.com:443/api (and postgresql://u:p%40ss@db/x)"
    assert redact_credentials(text) == (
        "cannot reach https://ci:***@mlflow.example.com:443/api (and postgresql://u:***@db/x)"
    )
    # a token without a password was printed whole
    assert redact_credentials("https://ghp_T0KEN@mlflow.example.com/x") == "https://***@mlflow.example.com/x"


def test_log_lines_of_any_library_are_redacted_in_the_cli_process():
    import subprocess
    import sys

    code = (
        "import logging; from consistency_gate.errors import redact_logs; redact_logs(); redact_logs(); "
        "logging.getLogger('mlflow.store').warning('retrying %s', 'http://alice:s3cretPW@host:5000/api')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "retrying http://alice:***@host:5000/api" in proc.stderr and "s3cretPW" not in proc.stderr


# ---------------------------------------------------------------- item 11: alias bombs, huge configs


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\nrules:\n  - {metric: con, min: 0.5}\n")
    with pytest.raises(UsageError, match="alias"):  # refused before it is expanded (a 10^9-value document)
        gate_config.load_config(bomb)
    huge = tmp_path / "huge.yaml"
    huge.write_text("rules:\n  - {metric: con, min: 0.5}\n" + "# padding\n" * 200_000)
    with pytest.raises(UsageError, match="at most"):
        gate_config.load_config(huge)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("rules:\n  - {metric: con, min: 0.5}  # caf\xe9\n".encode("latin-1"), "not UTF-8 text (byte 41"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8 text (byte 0"),
        (("rules: " + "[" * 50_000 + "]" * 50_000).encode(), "nested too deeply"),
        (("rules:\n" + "  - {metric: con, min: 0.5}\n" * 35_000).encode(), "980,007 characters"),
        (("ks: [" + "1," * 100_001 + "1]\n").encode(), "it holds more than 100,000 values"),
    ],
    ids=["latin-1", "binary", "nested", "35k-rules", "no-aliases"],
)
def test_a_config_that_is_not_one_is_a_usage_error_naming_why(tmp_path, content, expected):
    """A latin-1 or binary config and 50k nested lists were exit 6 (a bug); 35,000 rules were
    refused as an "alias expansion" after 11.8 s. Each is exit 2 in one line, in seconds."""
    config = tmp_path / "gate.yaml"
    config.write_bytes(content)
    proc = run_cli("config", "--check", config)
    line = _one_error_line(proc)
    assert proc.returncode == 2 and expected in line and str(config) in line, line


def test_bad_inputs_that_were_internal_errors_get_their_exit_codes(store, tmp_path):
    """Each of these was exit 6 ("a bug"): a UTF-8 byte-order mark on a CSV (now read as
    Excel writes it), an .npz whose y is an object array (3), a class label that reads as matplotlib
    math (plots drawn), a tracking URI that does not parse (2); and duplicate ids in the registry gate's
    evaluation data were accepted (exit 0; now 3, as compare and the file gate say)."""
    import numpy as np

    bom = b"\xef\xbb\xbf"
    (tmp_path / "labels.csv").write_bytes(bom + b"id,label\n2,b\n1,a\n3,$\\foo$\n")
    (tmp_path / "scores.csv").write_bytes(bom + b"id,a,b,$\\foo$\n1,0.9,0.1,0\n2,0.2,0.8,0\n3,0.1,0.1,0.8\n")
    (tmp_path / "other.csv").write_bytes(b"id,a,b,$\\foo$\n1,0.9,0.1,0\n2,0.7,0.3,0\n3,0.1,0.1,0.8\n")
    config = tmp_path / "gate.yaml"
    config.write_text("ks: [1]\nrules:\n  - {metric: ctoi, max: 0.5}\n")
    files = ("--labels", tmp_path / "labels.csv", "--previous-predictions", tmp_path / "scores.csv")
    proc = run_cli(
        "check", *files, "--candidate-predictions", tmp_path / "other.csv", "--id-column", "id",
        "--config", config, "--format", "html",
    )  # fmt: skip
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "$\\foo$" in proc.stdout and "data:image/png;base64" in proc.stdout  # the label, and the plots
    np.savez(tmp_path / "eval.npz", x=np.zeros((3, 4)), y=np.array(["a", None, "b"], dtype=object))
    bad_npz = run_cli(*check_args("2", tmp_path / "eval.npz", config, store["uri"]))
    assert bad_npz.returncode == 3 and "object array" in _one_error_line(bad_npz)
    bad_uri = run_cli(*check_args("2", store["data"], config, "http://[::1"))
    assert bad_uri.returncode == 2 and "not a valid URI" in _one_error_line(bad_uri)
    data = pd.read_csv(store["data"])
    data["id"] = data["id"].where(data.index != 1, data["id"].iloc[0])  # row 2 repeats row 1's id
    doubled = tmp_path / "eval.csv"
    data.to_csv(doubled, index=False)
    dup = run_cli(*check_args("2", doubled, config, store["uri"], "--id-column", "id"))
    assert dup.returncode == 3 and "appears more than once in column 'id'" in _one_error_line(dup)


# ---------------------------------------------------------------- item 14: spreadsheet formulas


def test_flip_table_csv_neutralises_formulas_and_json_keeps_raw_ids(store, tmp_path):
    frame = pd.read_csv(store["data"])
    frame["id"] = '=HYPERLINK("http://x","' + frame["id"].astype(str) + '")'
    data = tmp_path / "formula.csv"
    frame.to_csv(data, index=False)
    config = tmp_path / "gate.yaml"
    config.write_text("rules:\n  - {metric: con, min: 0.5}\n")
    report = tmp_path / "report.json"
    proc = run_cli(*check_args("3", data, config, store["uri"], "--id-column", "id", "--report", report))
    assert proc.returncode in (0, 1), proc.stderr
    run_id = read_report(report)["run_id"]
    mlflow.set_tracking_uri(store["uri"])
    csv_text = mlflow.artifacts.load_text(f"runs:/{run_id}/gate/flips.csv")
    ids = pd.read_csv(pd.io.common.StringIO(csv_text), dtype=str)["id"]
    assert len(ids) and ids.str.startswith("'=HYPERLINK(").all()
    raw = json.loads(mlflow.artifacts.load_text(f"runs:/{run_id}/gate/flips.json"))
    column = raw["columns"].index("id")
    assert all(row[column].startswith("=HYPERLINK(") for row in raw["data"])


def test_spreadsheet_safe_prefixes_only_formula_starts():
    frame = pd.DataFrame({"id": ["=1+1", "+cmd", "-2", "@SUM(A1)", "\tx", "ok", None], "n": [1, 2, 3, 4, 5, 6, 7]})
    safe = tracking.spreadsheet_safe(frame)
    assert safe["id"].tolist()[:6] == ["'=1+1", "'+cmd", "'-2", "'@SUM(A1)", "'\tx", "ok"]
    assert pd.isna(safe["id"].iloc[6]) and safe["n"].tolist() == frame["n"].tolist()
    assert frame["id"].iloc[0] == "=1+1"  # the caller's frame is untouched
