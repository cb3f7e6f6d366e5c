"""`shadow serve` as a real process on 127.0.0.1: real HTTP requests with a candidate that is slow, raises on
some requests and kills its own process on another; the champion's answers are its own and never wait for the
candidate, nothing is lost from the capture on SIGTERM, and `shadow check` on the capture and late labels gives
the figures `compare` gives on the same samples. Bad input: a port in use, a candidate that cannot load."""

from __future__ import annotations

import json
import signal
import socket
import time
import urllib.request

import mlflow
import pandas as pd
import pytest
from conftest import run_cli, start_cli
from mlflow import MlflowClient
from registry_fixtures import iris_frames, sqlite_uri

from consistency_gate.mlops import tracking

pytestmark = pytest.mark.slow
MODEL = "iris-shadow"
# the candidate: slow on every request (0.6 s), raises on a request of 2 rows, ends its own process on one of 3 rows
UNRELIABLE = """
import os, time
import mlflow
from mlflow.models import set_model

class Unreliable(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        time.sleep(0.6)
        if len(model_input) == 2:
            raise ValueError("this candidate fails on pairs")
        if len(model_input) == 3:
            os._exit(3)
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


def wait_until_up(port: int, server) -> None:  # noqa: ANN001
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert server.poll() is None, server.communicate()[1]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise AssertionError("the shadow server did not come up in 120 s")


def test_the_champion_answers_alone_and_the_capture_keeps_every_request(store, tmp_path):
    port, capture = free_port(), tmp_path / "capture"
    server = start_cli("shadow", "serve", "--model", MODEL, "--candidate", "2", "--capture", capture, "--port",
                       str(port), "--tracking-uri", store["uri"], "--candidate-timeout", "20")  # fmt: skip
    try:
        wait_until_up(port, server)
        sizes = [1, 2, 1, 3, 1, 1, 2, 4, 1, 1]  # 2 rows: the candidate raises; 3: it ends its process
        x, rows, slowest = store["x"], 0, 0.0
        for number, size in enumerate(sizes):
            frame = x.iloc[rows : rows + size]
            said, seconds = post(port, frame, f"req-{number}")
            assert said == {"predictions": store["champion"].predict(frame).tolist()}  # its own answers
            slowest, rows = max(slowest, seconds), rows + size
        assert slowest < 0.6  # the candidate takes 0.6 s a request; the champion never waits for it
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=120)
    assert server.returncode == 0, err
    captured = pd.read_parquet(capture).set_index("id")
    ids = [f"req-{n}" if s == 1 else f"req-{n}#{i}" for n, s in enumerate(sizes) for i in range(s)]
    assert sorted(captured.index) == sorted(ids)  # every row of every request, after a stop mid-queue
    expected = pd.Series(store["champion"].predict(x.iloc[:rows]), index=ids)
    assert (captured["champion"] == expected[captured.index]).all()
    failed = captured["candidate"].isna()
    assert set(captured.index[failed]) == {i for i in ids if i.split("#")[0] in ("req-1", "req-3", "req-6")}
    assert captured.loc["req-1#0", "candidate_error"].startswith("ValueError")
    assert "crashed" in captured.loc["req-3#0", "candidate_error"]
    assert captured.loc["req-7#0", "candidate"] in ("setosa", "versicolor", "virginica")  # scored after a restart

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
