"""`shadow serve` as a real process on 127.0.0.1: real HTTP requests with a candidate that is slow, raises on
some requests and kills its own process on another; the champion's answers are its own and never wait for the
candidate, nothing is lost from the capture on SIGTERM, and `shadow check` on the capture and late labels gives
the figures `compare` gives on the same samples. Bad input: a port in use, a candidate that cannot load."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from conftest import run_cli, start_cli
from mlflow import MlflowClient
from registry_fixtures import iris_frames, sqlite_uri
from watch_fixtures import until

from consistency_gate.io.capture import read_capture
from consistency_gate.io.capture_writer import JOURNAL, CaptureWriter, journal_rows
from consistency_gate.mlops import tracking
from consistency_gate.mlops.shadow_server import CandidateProcess, Shadow

pytestmark = pytest.mark.slow
MODEL = "iris-shadow"
# the candidate: answers only while the file CANDIDATE_GATE names exists (where one is named), raises on rows
# marked -2 (their first feature), ends its own process on rows marked -3 and never answers rows marked -5
UNRELIABLE = """
import os, time
import mlflow
from mlflow.models import set_model

class Unreliable(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        while os.environ.get("CANDIDATE_GATE") and not os.path.exists(os.environ["CANDIDATE_GATE"]):
            time.sleep(0.02)
        if os.environ.get("CANDIDATE_CALLS"):
            with open(os.environ["CANDIDATE_CALLS"], "a") as calls:
                calls.write(f"{len(model_input)}\\n")
        marks = set(model_input.iloc[:, 0])
        if -2 in marks:
            raise ValueError("this candidate fails on rows marked -2")
        if -3 in marks:
            os._exit(3)
        if -5 in marks:
            time.sleep(3600)
        return ["virginica" if row[2] > 4.8 else "setosa" if row[2] < 2.5 else "versicolor"
                for row in model_input.to_numpy()]

set_model(Unreliable())
"""
BROKEN = """
import mlflow
from mlflow.models import set_model

class Broken(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        raise RuntimeError("this model cannot load")

    def predict(self, context, model_input, params=None):
        return model_input

set_model(Broken())
"""
DIES = BROKEN.replace('raise RuntimeError("this model cannot load")', "import os; os._exit(7)")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """v1 a logistic regression (@champion), v2 the unreliable candidate, v3 a model that cannot load, v4 one whose
    loading ends its process."""
    from sklearn.linear_model import LogisticRegression

    root = tmp_path_factory.mktemp("shadow")
    uri = sqlite_uri(root)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    tracking.use_experiment("training", uri)
    x, y = iris_frames()
    champion = LogisticRegression(max_iter=500).fit(x, y)
    with mlflow.start_run():
        mlflow.sklearn.log_model(
            champion, name="model", registered_model_name=MODEL, serialization_format="cloudpickle"
        )
    for number, code in ((2, UNRELIABLE), (3, BROKEN), (4, DIES)):
        path = root / f"candidate{number}.py"
        path.write_text(code)
        with mlflow.start_run():
            mlflow.pyfunc.log_model(name="model", python_model=str(path), registered_model_name=MODEL)
    MlflowClient(uri).set_registered_model_alias(MODEL, "champion", "1")
    return {"uri": uri, "root": root, "x": x, "y": y, "champion": champion}


def marked(frame: pd.DataFrame) -> pd.DataFrame:
    """A request of 2, 3 or 5 rows marked for the unreliable candidate: it raises on it, ends its process on it,
    or never answers it (whether it is scored alone or with the requests that queued beside it)."""
    return frame.assign(**{frame.columns[0]: -len(frame)}) if len(frame) in (2, 3, 5) else frame


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post(port: int, frame: pd.DataFrame, request_id: str) -> tuple[dict, float]:
    body = json.dumps({"dataframe_split": frame.to_dict(orient="split", index=False)}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations",
        data=body,
        headers={"Content-Type": "application/json", "X-Request-Id": request_id},
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["X-Request-Id"] == request_id
        return json.loads(response.read()), time.perf_counter() - started


def start_server(store: dict, capture, *args: str, env: dict | None = None):  # noqa: ANN001, ANN201
    """``shadow serve`` of v1 with candidate v2 on a free port, once it says it is serving (its own signal, however
    long the models take to load on a busy machine); returns the process and its port."""
    port = free_port()
    server = start_cli("shadow", "serve", "--model", MODEL, "--candidate", "2", "--capture", capture, "--port",
                       str(port), "--tracking-uri", store["uri"], *args, env=env)  # fmt: skip
    said = []
    for line in server.stderr:
        said.append(line)
        if line.startswith("serving "):  # after saying what it loads, while it loads
            loading = [x.split(" ", 3)[2] for x in said if x.startswith("loading the ")]
            assert loading == ["champion", "candidate"], said
            return server, port
    raise AssertionError(f"the shadow server ended before serving (exit {server.wait()}): {''.join(said)[-3000:]}")


def health(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_champion_answers_alone_and_the_capture_keeps_every_request(store, tmp_path):
    capture, gate, calls = tmp_path / "capture", tmp_path / "candidate-may-answer", tmp_path / "calls"
    env = {**os.environ, "CANDIDATE_GATE": str(gate), "CANDIDATE_CALLS": str(calls)}
    server, port = start_server(store, capture, "--candidate-timeout", "600", "--drain-seconds", "600", env=env)
    try:
        sizes = [1, 2, 1, 3, 1, 1, 2, 4, 1, 1]  # 2 rows: the candidate raises; 3: it ends its process
        x, rows, sent = store["x"], 0, []
        for number, size in enumerate(sizes):  # the candidate answers nothing yet: the champion never waits for it
            frame = marked(x.iloc[rows : rows + size])
            sent.append(frame)
            said, _ = post(port, frame, f"req-{number}")
            assert said == {"predictions": store["champion"].predict(frame).tolist()}  # its own answers
            rows += size
        gate.touch()
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate()
    assert server.returncode == 0, err
    captured = pd.read_parquet(capture).set_index("id")
    ids = [f"req-{n}" if s == 1 else f"req-{n}#{i}" for n, s in enumerate(sizes) for i in range(s)]
    assert sorted(captured.index) == sorted(ids)  # every row of every request, after a stop mid-queue
    expected = pd.Series(store["champion"].predict(pd.concat(sent)), index=ids)
    assert (captured["champion"] == expected[captured.index]).all()
    failed = captured["candidate"].isna()
    assert set(captured.index[failed]) == {i for i in ids if i.split("#")[0] in ("req-1", "req-3", "req-6")}
    assert captured.loc["req-1#0", "candidate_error"].startswith("ValueError")
    assert "crashed" in captured.loc["req-3#0", "candidate_error"]
    assert captured.loc["req-7#0", "candidate"] in ("setosa", "versicolor", "virginica")  # scored after a restart
    # what queued while the candidate was held back went to it in one call (which raised on req-1's rows: then
    # one request at a time)
    assert max(int(n) for n in calls.read_text().split()) > max(sizes)

    # the labels arrive later: shadow check on the capture equals compare on the same rows
    labels = pd.DataFrame({"id": ids, "label": store["y"].iloc[:rows].to_numpy()})
    labels.to_csv(tmp_path / "labels.csv", index=False)
    proc = run_cli("shadow", "check", "--model", MODEL, "--candidate", "2", "--capture", capture, "--labels",
                   tmp_path / "labels.csv", "--tracking-uri", store["uri"], "--format", "json")  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    assert report["stream"]["candidate_failures"] == int(failed.sum())
    both = captured[~failed].assign(label=labels.set_index("id")["label"])
    for column, name in (("champion", "previous"), ("candidate", "candidate"), ("label", "labels")):
        both.reset_index()[["id", column]].rename(
            columns={column: "label" if column == "label" else "prediction"}
        ).to_csv(tmp_path / f"{name}.csv", index=False)
    proc = run_cli("compare", "--labels", tmp_path / "labels.csv", "--previous", tmp_path / "previous.csv",
                   "--candidate", tmp_path / "candidate.csv", "--id-column", "id", "--format", "json")  # fmt: skip
    compared = json.loads(proc.stdout)["metrics"]
    for key in ("con", "ctoi", "itoc", "acc_previous", "acc_candidate"):
        assert report["metrics"][key] == pytest.approx(compared[key], abs=1e-12), key


def test_a_port_in_use_and_a_candidate_that_cannot_load_are_one_line_each(store, tmp_path, monkeypatch):
    import __main__

    monkeypatch.delattr(__main__, "__file__", raising=False)  # conftest's name for an xdist worker: not a file to spawn
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_cli("shadow", "serve", "--model", MODEL, "--candidate", "2", "--capture", tmp_path / "c",
                       "--port", str(port), "--tracking-uri", store["uri"])  # fmt: skip
    assert proc.returncode == 2 and "in use" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = run_cli("shadow", "serve", "--model", MODEL, "--candidate", "3", "--capture", tmp_path / "c",
                   "--port", str(free_port()), "--tracking-uri", store["uri"])  # fmt: skip
    assert proc.returncode == 4, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "cannot be loaded" in lines[0] and "this model cannot load" in lines[0]
    assert not list((tmp_path / "c").glob("*.parquet"))
    proc = run_cli("shadow", "serve", "--model", MODEL, "--candidate", "4", "--capture", tmp_path / "c",
                   "--port", str(free_port()), "--tracking-uri", store["uri"])  # fmt: skip
    # said when it ended (its exit code), not after the load timeout ("not loaded within 300 s")
    assert proc.returncode == 4 and "process ended while loading (exit 7)" in proc.stderr, proc.stderr


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's idle scheduling class")
def test_candidate_idle_puts_the_candidate_in_the_idle_class_and_it_still_answers(store, tmp_path):
    """``--candidate-idle``: the candidate's process is in SCHED_IDLE, 10 nice steps below the server (read back
    from the kernel; 19 at most, as under ``nice -n 19``), the server's own stays in the normal class, and the
    candidate's answers reach the capture."""
    capture = tmp_path / "capture"
    server, port = start_server(store, capture, "--candidate-idle")
    try:
        idle = [pid for pid in _children(server.pid) if os.sched_getscheduler(pid) == os.SCHED_IDLE]
        below = min(19, os.getpriority(os.PRIO_PROCESS, server.pid) + 10)
        assert len(idle) == 1 and os.getpriority(os.PRIO_PROCESS, idle[0]) == below, _children(server.pid)
        assert os.sched_getscheduler(server.pid) == os.SCHED_OTHER
        frame = marked(store["x"].iloc[:1])
        said, _ = post(port, frame, "req-0")
        assert said == {"predictions": store["champion"].predict(frame).tolist()}
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate()
    assert server.returncode == 0, err
    captured = pd.read_parquet(capture).set_index("id")
    assert captured.loc["req-0", "candidate"] in ("setosa", "versicolor", "virginica"), captured


def test_a_capture_that_cannot_be_written_fails_health_and_a_killed_server_loses_no_answer(store, tmp_path):
    capture, gate = tmp_path / "capture", tmp_path / "candidate-may-answer"
    gate.touch()
    env = {**os.environ, "CANDIDATE_GATE": str(gate)}
    server, port = start_server(store, capture, "--roll-rows", "1", "--candidate-timeout", "2", env=env)
    x = store["x"]
    try:
        # the capture folder replaced by a file: /health says why, the rows wait in memory
        shutil.rmtree(capture)
        capture.write_text("not a folder")
        post(port, x.iloc[:1], "r0")
        status, body = until(lambda: (h := health(port))[0] == 503 and h, "/health failing")
        assert "cannot" in body and f"{capture}" in body, body
        capture.unlink()  # space freed: the next write takes what waited
        post(port, x.iloc[1:2], "r1")
        until(lambda: health(port)[0] == 200, "/health passing again")
        post(port, marked(x.iloc[2:7]), "r2")  # the candidate never answers 5 rows: timed out, started again
        until(lambda: {"r0", "r1", "r2#4"} <= set(pd.read_parquet(capture)["id"]), "r0..r2 written as parts")
        # the candidate held back: answered by the champion, journaled, not yet in a part
        gate.unlink()
        post(port, x.iloc[7:8], "r3")
        post(port, x.iloc[8:10], "r4")
        until(lambda: "r4#1" in {row["id"] for row in journal_rows(capture)}, "r4's group in the journal")
        candidates = until(lambda: _children(server.pid), "the candidate's process")
    finally:
        server.kill()  # kill -9: no drain, no last part
        server.communicate()
    until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in candidates), "the candidate ended with the server")
    captured = read_capture(capture).set_index("id")
    assert set(captured.index) == {"r0", "r1", *(f"r2#{i}" for i in range(5)), "r3", "r4#0", "r4#1"}
    assert captured.loc["r0", "candidate"] in ("setosa", "versicolor", "virginica")
    assert captured.loc[["r2#0", "r3", "r4#0"], "candidate"].isna().all()
    assert pd.read_parquet(capture).set_index("id").loc["r2#0", "candidate_error"].startswith("TimeoutError")
    expected = store["champion"].predict(x.iloc[:10])
    assert captured.loc[["r3", "r4#0", "r4#1"], "champion"].tolist() == expected[7:10].tolist()
    journaled = {row["id"]: row["candidate_error"] for row in journal_rows(capture)}
    assert journaled["r3"] == "not scored: the server ended before the candidate answered"
    # a writer started again on the folder (a restarted server) writes the journal as a part first
    writer = CaptureWriter(capture)
    writer.close()
    assert writer.recovered == 3 and not (capture / JOURNAL).exists()
    assert set(pd.read_parquet(capture)["id"]) == set(captured.index)


def test_kill_9_under_load_loses_at_most_the_last_group_and_sigterm_none(store, tmp_path):
    """4 clients sending requests one after another; the server killed with SIGKILL while they send. The journal
    holds requests 1..m, each whole (the groups appended before the kill), and what was answered and is missing is
    the rest: the last group, the end of each client's requests, counted. Started again on the folder under the
    same load and stopped with SIGTERM: every request answered is in the capture."""
    import threading

    capture, gate = tmp_path / "capture", tmp_path / "candidate-may-answer"
    journal_file = capture / JOURNAL
    env = {**os.environ, "CANDIDATE_GATE": str(gate)}  # the candidate holds back: requests stay provisional
    x = store["x"]

    def load(port: int, run: str, stop: threading.Event) -> list[list[str]]:
        answered: list[list[str]] = [[] for _ in range(4)]

        def client(k: int) -> None:
            for n in range(100_000):
                if stop.is_set():
                    return
                try:
                    post(port, x.iloc[n % 150 : n % 150 + 1], f"{run}-c{k}-{n}")
                except OSError:  # the server is gone
                    return
                answered[k].append(f"{run}-c{k}-{n}")

        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        until(lambda: min(map(len, answered)) >= 25, "25 requests answered to each client")
        return answered, threads

    server, port = start_server(store, capture, env=env)
    stop = threading.Event()
    try:
        answered, threads = load(port, "a", stop)
        # a kill after 100 requests are in the journal (its own lines: a signal, not a clock), so that what is kept
        # is never nothing: the last group (20 ms) held 7 requests when a busy machine killed it sooner
        until(lambda: journal_file.exists() and journal_file.read_text().count("\n") >= 100, "100 journaled")
    finally:
        server.kill()  # SIGKILL while the clients send
        server.communicate()
    for thread in threads:
        thread.join()
    journal = [json.loads(line) for line in journal_file.read_text().splitlines() if line.endswith("}")]
    numbers = sorted(entry["request"] for entry in journal)
    assert numbers == list(range(1, len(numbers) + 1))  # every group before the last is there, whole
    kept = {row["id"] for row in journal_rows(capture)}
    lost = [i for client in answered for i in client if i not in kept]
    for client in answered:  # what is lost is the end of each client's requests: nothing before a kept one
        flags = [i in kept for i in client]
        assert flags == sorted(flags, reverse=True), (client, lost)
    assert len(kept) == len(numbers) >= 100, (len(lost), len(kept))
    print(f"kill -9 under 4 clients: {len(kept)} requests journaled, {len(lost)} answered in the last group lost")

    gate.touch()  # the candidate answers from now on
    server, port = start_server(store, capture, env=env)  # the journal written as a part first
    try:
        answered, threads = load(port, "b", stop)
        stop.set()
        for thread in threads:
            thread.join()
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate()
    assert server.returncode == 0, err
    captured = set(read_capture(capture)["id"])
    assert {i for client in answered for i in client} <= captured and kept <= captured


def test_a_candidate_restart_that_fails_is_tried_again_and_a_stop_keeps_a_hung_request(store, tmp_path, monkeypatch):
    import __main__

    monkeypatch.delattr(__main__, "__file__", raising=False)  # conftest's name for an xdist worker: not a file to spawn
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.delenv("CANDIDATE_GATE", raising=False)
    # a registry that cannot be reached: one line, its password never said
    secret = "http://alice:s3cretPW@127.0.0.1:9"
    unreachable = CandidateProcess(f"models:/{MODEL}/2", secret, None, timeout_s=5)
    said, error = unreachable.score(store["x"].iloc[:1])
    assert said is None and error.startswith("not scored: candidate models:/") and "s3cretPW" not in error, error
    # a restart that fails (the model away for a moment), then one that works
    model = tmp_path / "model"
    mlflow.pyfunc.save_model(model, python_model=str(store["root"] / "candidate2.py"))
    candidate = CandidateProcess(str(model), store["uri"], None, timeout_s=1)
    candidate.start()
    x = store["x"]
    assert "crashed" in candidate.score(marked(x.iloc[:3]))[1]  # its process ends
    model.rename(tmp_path / "away")
    assert "cannot be loaded" in candidate.score(x.iloc[:1])[1]
    (tmp_path / "away").rename(model)
    said, error = candidate.score(x.iloc[:1])
    assert error is None and said[0] in ("setosa", "versicolor", "virginica")
    # stopped while the candidate hangs on a request: every request answered is in the capture
    shadow = Shadow(candidate, CaptureWriter(tmp_path / "capture"), None)
    for number, rows in enumerate((slice(0, 5), slice(5, 6), slice(6, 7))):
        frame = marked(x.iloc[rows])
        shadow.submit(f"q{number}", time.time(), frame, store["champion"].predict(frame))
    shadow.drain(0)
    candidate.stop()
    captured = read_capture(tmp_path / "capture")
    assert set(captured["id"]) == {*(f"q0#{i}" for i in range(5)), "q1", "q2"}


def test_the_requests_answered_within_batch_s_are_scored_in_one_call(store, tmp_path, monkeypatch):
    """The candidate is called once for the requests answered within ``batch_s`` (here: until the stop hurries it),
    not once per request: its CPU per request is a batch's, on the cores the champion shares."""
    import __main__

    monkeypatch.delattr(__main__, "__file__", raising=False)  # conftest's name for an xdist worker: not a file to spawn
    monkeypatch.delenv("CANDIDATE_GATE", raising=False)
    monkeypatch.setenv("CANDIDATE_CALLS", str(tmp_path / "calls"))  # the candidate notes each call's rows
    model = tmp_path / "model"
    mlflow.pyfunc.save_model(model, python_model=str(store["root"] / "candidate2.py"))
    candidate = CandidateProcess(str(model), store["uri"], None, timeout_s=600)
    candidate.start()
    shadow = Shadow(candidate, CaptureWriter(tmp_path / "capture"), None, batch_s=3600)
    x = store["x"]
    for number in range(20):
        shadow.submit(f"q{number}", time.time(), x.iloc[[number]], store["champion"].predict(x.iloc[[number]]))
    assert shadow.drain(600) == 0
    candidate.stop()
    assert (tmp_path / "calls").read_text().split() == ["20"]
    captured = read_capture(tmp_path / "capture").set_index("id").loc[[f"q{n}" for n in range(20)]]
    assert captured["candidate"].isin(["setosa", "versicolor", "virginica"]).all(), captured
