"""Live traffic on a real SQLite store: `shadow check` on a capture and late labels (its figures equal
`compare` on the same samples), its promotion and its rollback on reject, `rollback` by hand and what
`history` then shows, and bad input, one line and its exit code each, nothing moved."""

from __future__ import annotations

import json
import re
import threading
import time

import numpy as np
import pandas as pd
import pytest
from conftest import read_report, run_cli
from mlflow import MlflowClient
from test_history_registry import gated_store
from watch_fixtures import until

from consistency_gate.gate.rules import Rule
from consistency_gate.gate.shadow import check_stream

MODEL = "iris-live"
EASY = "rules:\n  - {metric: ctoi, max: 0.3}\n  - {metric: acc, min: 0.3}\n"
STRICT = "rules:\n  - {metric: con, min: 0.99}\n"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """v1 @champion, v2 and v3 registered; no gate yet."""
    root = tmp_path_factory.mktemp("live")
    return {**gated_store(root, MODEL, 3, ()), "root": root}


def capture_of(store: dict, champion: int, candidate: int, folder, labelled: int | None = None):
    """What a shadow server would have captured serving the iris rows (one request a second) with
    ``champion`` and ``candidate`` (0-based models), and the labels of the first ``labelled`` requests, each
    arriving a minute after its request."""
    x, y = store["x"], store["y"]
    start = pd.Timestamp("2026-11-27T10:00:00Z")
    times = start + pd.to_timedelta(np.arange(len(x)), unit="s")
    ids = [f"r{i}" for i in range(len(x))]
    served = pd.DataFrame(
        {
            "id": ids,
            "time": times,
            "champion": store["models"][champion].predict(x),
            "candidate": store["models"][candidate].predict(x),
        }
    )
    folder.mkdir(exist_ok=True)
    half = len(served) // 2
    served.iloc[:half].to_parquet(folder / "part-000.parquet")  # rolled files, as the server writes them
    served.iloc[half:].to_parquet(folder / "part-001.parquet")
    n = len(x) if labelled is None else labelled
    labels = pd.DataFrame({"id": ids[:n], "label": y.iloc[:n].to_numpy(), "time": times[:n] + pd.Timedelta(minutes=1)})
    labels.to_csv(folder.parent / f"{folder.name}-labels.csv", index=False)
    return served, folder.parent / f"{folder.name}-labels.csv"


def rules_file(folder, name: str, text: str):  # noqa: ANN001, ANN201 - a pytest tmp_path and a Path
    """A config of ``text`` written to ``folder/name.yaml``."""
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


def champion(store: dict) -> str:
    """The version @champion holds."""
    return str(MlflowClient(store["uri"]).get_model_version_by_alias(MODEL, "champion").version)


def history_of(store: dict) -> dict:
    """``consistency-gate history --format json`` of the model."""
    return json.loads(run_cli("history", "--model", MODEL, "--tracking-uri", store["uri"], "--format", "json").stdout)


def shadow(store: dict, *args: str):
    return run_cli("shadow", "check", "--model", MODEL, "--tracking-uri", store["uri"], *args)


@pytest.mark.slow  # a registry store and its runs
def test_a_shadow_check_equals_compare_and_promotes_on_its_anytime_bounds(store, tmp_path):
    served, labels = capture_of(store, 0, 1, tmp_path / "capture")
    config = rules_file(tmp_path, "easy", EASY)
    report_path = tmp_path / "report.json"
    proc = shadow(store, "--candidate", "2", "--capture", tmp_path / "capture", "--labels", labels, "--config", config,
                  "--batch", "25", "--promote", "--report", report_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout
    report = read_report(report_path)
    assert report["decision"] == "promote" and report["promoted"] is True, report
    assert champion(store) == "2"
    # the same samples as prediction files: compare gives the same figures
    frame = served.assign(label=store["y"].to_numpy())
    for column, name in (("champion", "previous"), ("candidate", "candidate"), ("label", "labels")):
        frame[["id", column]].rename(columns={column: "prediction" if column != "label" else "label"}).to_csv(
            tmp_path / f"{name}.csv", index=False
        )
    proc = run_cli("compare", "--labels", tmp_path / "labels.csv", "--previous", tmp_path / "previous.csv",
                   "--candidate", tmp_path / "candidate.csv", "--id-column", "id", "--format", "json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    compared = json.loads(proc.stdout)["metrics"]
    for key in ("con", "ctoi", "itoc", "acc_previous", "acc_candidate", "ctoc", "itoi"):
        assert report["metrics"][key] == pytest.approx(compared[key], abs=1e-12), key
    assert report["stream"]["labelled"] == report["stream"]["requests"] == len(served)
    assert report["stream"]["decided_at_look"] is not None and report["stream"]["looks"] == len(served) // 25
    # the run: every look's figures over steps, each rule's bounds, the plot, the report
    client = MlflowClient(store["uri"])
    looks = client.get_metric_history(report["run_id"], "labelled")
    assert [m.step for m in looks] == list(range(1, len(served) // 25 + 1)) and looks[-1].value == len(served)
    assert len(client.get_metric_history(report["run_id"], "bound_upper_ctoi")) == len(looks)
    shown = {a.path for a in client.list_artifacts(report["run_id"], "shadow")}
    assert {"shadow/bounds.png", "shadow/steps.json"} <= shown
    run = client.get_run(report["run_id"])
    assert run.data.tags["consistency_gate.outcome"] == "passed" and run.info.run_name == "SHADOW PROMOTED v2 vs v1"
    note = run.data.tags["mlflow.note.content"]
    assert note.startswith("**SHADOW PROMOTED v2 vs v1**") and not re.search(r"\d\.\d{5}", note), note
    # looks are counted from 1 in the JSON, the text and the run's steps alike; the deciding look's figures
    decided = report["stream"]["decided_at_look"]
    assert report["stream"]["at_decision"]["look"] == decided == report["stream"]["steps"][decided - 1]["look"]
    at = report["stream"]["at_decision"]
    assert f"decided at look {decided} of {len(looks)}, after {at['labelled']} labels" in said
    assert client.get_model_version(MODEL, "2").description.startswith("PROMOTED v2 vs v1 by a shadow check")


@pytest.mark.slow  # a registry store and its runs
def test_an_undecided_stream_moves_nothing(store, tmp_path):
    held = champion(store)
    _, labels = capture_of(store, 0, 1, tmp_path / "few", labelled=20)
    config = rules_file(tmp_path, "strict", "rules:\n  - {metric: ctoi, max: 0.02}\n")
    report_path = tmp_path / "report.json"
    proc = shadow(store, "--candidate", "3", "--baseline", held, "--capture", tmp_path / "few", "--labels", labels,
                  "--config", config, "--promote", "--report", report_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = read_report(report_path)
    assert report["decision"] == "continue" and report["passed_version"] is None and report["promotion"] is None
    assert report["stream"]["needed"]["ctoi <= 0.02"] is None or report["stream"]["needed"]["ctoi <= 0.02"] > 0
    assert "more samples" in proc.stdout or "no estimate" in proc.stdout
    assert champion(store) == held
    assert MlflowClient(store["uri"]).get_run(report["run_id"]).info.run_name == f"SHADOW UNDECIDED v3 vs v{held}"
    # a decision to promote, not asked to move the alias, is named by its verdict: nothing was promoted
    other = "3" if held == "2" else "2"
    _, labels = capture_of(store, int(held) - 1, int(other) - 1, tmp_path / "passing")
    easy = rules_file(tmp_path, "easy", EASY)
    proc = shadow(store, "--candidate", other, "--baseline", held, "--capture", tmp_path / "passing",
                  "--labels", labels, "--config", easy, "--report", report_path)  # fmt: skip
    report = read_report(report_path)
    assert proc.returncode == 0 and report["decision"] == "promote" and report["promoted"] is False, proc.stderr
    run = MlflowClient(store["uri"]).get_run(report["run_id"])
    assert run.info.run_name == f"SHADOW PASSED v{other} vs v{held}"
    assert run.data.tags["consistency_gate.promoted"] == "False"
    assert champion(store) == held


@pytest.mark.slow  # a registry store and its runs
def test_watching_a_promoted_model_rolls_it_back_when_live_flips_break_the_rules(store, tmp_path):
    client = MlflowClient(store["uri"])
    client.set_registered_model_alias(MODEL, "champion", "2")
    _, labels = capture_of(store, 0, 1, tmp_path / "watched")
    config = rules_file(tmp_path, "strict", STRICT)
    proc = shadow(store, "--candidate", "2", "--baseline", "1", "--watch", "--capture", tmp_path / "watched",
                  "--labels", labels, "--config", config, "--format", "json")  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["decision"] == "reject" and report["rolled_back"] is True
    assert champion(store) == "1"
    assert client.get_model_version(MODEL, "2").tags["consistency_gate.rolled_back_to"] == "1"
    assert "ROLLED BACK v2 to v1" in client.get_model_version(MODEL, "2").description
    history = history_of(store)
    assert history["champions"][-2:] == ["2", "1"]


@pytest.mark.slow  # a registry store and its runs
def test_rollback_by_hand_restores_the_champion_before_and_history_shows_it(store, tmp_path):
    client = MlflowClient(store["uri"])
    client.set_registered_model_alias(MODEL, "champion", "1")
    served, labels = capture_of(store, 0, 2, tmp_path / "third")
    config = rules_file(tmp_path, "easy", EASY)
    proc = shadow(store, "--candidate", "3", "--capture", tmp_path / "third", "--labels", labels, "--config", config,
                  "--batch", "50", "--promote")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert champion(store) == "3"
    report_path = tmp_path / "rollback.json"
    proc = run_cli("rollback", "--model", MODEL, "--tracking-uri", store["uri"], "--reason", "complaints",
                   "--report", report_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "v3 -> v1" in proc.stdout
    report = read_report(report_path)
    assert report["promoted"] is True and report["promotion"]["holds"] == "1"
    assert champion(store) == "1"
    history = history_of(store)
    assert history["champions"][-3:] == ["1", "3", "1"]
    assert history["gates"][-1]["outcome"] == "rolled back"
    # a model only ever shadow-checked: no gate ledger, so no update counted, and said why; no empty plot
    plot = tmp_path / "history.png"
    proc = run_cli("history", "--model", MODEL, "--tracking-uri", store["uri"], "--plot", plot)
    assert proc.returncode == 0 and "Cumulative negative flips: none counted, no gate ledger" in proc.stdout
    assert "no update to draw" in proc.stderr and not plot.exists()


@pytest.mark.slow  # a registry store and its runs
def test_bad_live_input_is_one_line_and_its_exit_code_and_moves_nothing(store, tmp_path):
    client = MlflowClient(store["uri"])
    client.set_registered_model_alias(MODEL, "champion", "1")
    served, labels = capture_of(store, 0, 1, tmp_path / "bad")
    config = rules_file(tmp_path, "easy", EASY)
    base = ("--candidate", "2", "--config", config, "--promote")
    cases = []
    unknown = pd.read_csv(labels).assign(label="zebra")
    unknown.to_csv(tmp_path / "unknown.csv", index=False)
    cases.append((("--capture", tmp_path / "bad", "--labels", tmp_path / "unknown.csv"), 3, "not a class"))
    other = pd.read_csv(labels).assign(id=lambda f: "x" + f["id"])
    other.to_csv(tmp_path / "other.csv", index=False)
    cases.append((("--capture", tmp_path / "bad", "--labels", tmp_path / "other.csv"), 3, "no label matches"))
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    (truncated / "part-000.parquet").write_bytes((tmp_path / "bad" / "part-000.parquet").read_bytes()[:300])
    cases.append((("--capture", truncated, "--labels", labels), 3, "truncated"))
    empty = tmp_path / "empty.csv"
    empty.write_text("id,time,champion,candidate\n")  # a capture of no request
    cases.append((("--capture", empty, "--labels", labels), 3, "holds no request"))
    pearson = rules_file(tmp_path, "pearson", "rules:\n  - {metric: pearson, min: 0.9}\n")
    cases.append((("--capture", tmp_path / "bad", "--labels", labels, "--config", pearson), 2, "shadow check judges"))
    cases.append((("--capture", tmp_path / "bad", "--labels", labels, "--candidate", "9"), 4, "9"))
    for args, code, said in cases:
        proc = shadow(store, *base, *args)
        assert proc.returncode == code, (args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and said in lines[0], (args, proc.stderr)
    assert champion(store) == "1"
    proc = run_cli("rollback", "--model", "no-such-model", "--tracking-uri", store["uri"])
    assert proc.returncode == 4 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def stream(champion: list[str], candidate: list[str], label: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    times = pd.to_datetime(np.arange(len(label)), unit="s", utc=True)
    ids = [str(i) for i in range(len(label))]
    capture = pd.DataFrame({"id": ids, "time": times, "champion": champion, "candidate": candidate})
    return capture.astype({"id": "string", "champion": "string", "candidate": "string"}), pd.DataFrame(
        {"id": pd.array(ids, dtype="string"), "label": pd.array(label, dtype="string"), "time": times}
    )


def test_a_stream_is_decided_at_the_first_look_its_bounds_cross():
    rng = np.random.default_rng(0)
    label = rng.choice(["a", "b"], 3000).tolist()
    same, labels = stream(label, label, label)  # a candidate that never flips: promoted
    result = check_stream(same, labels, [Rule("ctoi", "max", 0.02)], 0.95, batch=100)
    assert result.decision == "promote" and result.decided_at is not None
    upper = result.rules[0].upper
    assert upper[result.decided_at] <= 0.02 < upper[result.decided_at - 1]
    worse = [("b" if y == "a" else "a") if i % 10 == 0 else y for i, y in enumerate(label)]  # 10% negative flips
    flips, labels = stream(label, worse, label)
    result = check_stream(flips, labels, [Rule("ctoi", "max", 0.02)], 0.95, batch=100)
    assert result.decision == "reject" and result.metrics["ctoi"] == pytest.approx(0.1, abs=0.001)
    few, labels = stream(label[:150], worse[:150], label[:150])  # 15 flips in 150: open at a loose threshold
    result = check_stream(few, labels, [Rule("ctoi", "max", 0.1)], 0.95, batch=50)
    assert result.decision == "continue" and result.needed["ctoi <= 0.1"] is None  # at the threshold: never
    failed = flips.assign(candidate=flips["candidate"].where(flips.index % 7 != 0))  # the candidate failed on some
    result = check_stream(failed, labels.iloc[:0], [Rule("con", "min", 0.5)], 0.95)
    assert result.counts["candidate_failures"] == (flips.index % 7 == 0).sum() and result.labelled == 0


def test_a_repeated_request_id_counts_once_with_its_first_answers():
    label = ["a", "b"] * 100
    capture, labels = stream(label, label, label)
    retried = capture.iloc[[5]].assign(time=capture["time"].iloc[-1] + pd.Timedelta(seconds=1), candidate="b")
    result = check_stream(pd.concat([capture, retried]), labels, [Rule("ctoi", "max", 0.5)], 0.95, batch=50)
    assert result.counts["repeated_requests"] == 1 and result.counts["requests"] == 200
    assert result.metrics["ctoi"] == 0 and result.metrics["con"] == 1  # the retry's other answer is not judged


def sagemaker_record(event: str, output: str, encoding: str = "CSV", inference: str | None = None) -> str:
    """One line of SageMaker Data Capture, as an endpoint writes it."""
    meta = {
        "eventId": event,
        "inferenceTime": "2026-11-27T10:00:00Z",
        **({"inferenceId": inference} if inference else {}),
    }
    data = {"endpointInput": {"data": "1,2", "encoding": "CSV", "mode": "INPUT"},
            "endpointOutput": {"data": output, "encoding": encoding, "mode": "OUTPUT"}}  # fmt: skip
    return json.dumps({"captureData": data, "eventMetadata": meta, "eventVersion": "0"})


def test_sagemaker_captures_of_both_variants_are_joined_by_inference_id(tmp_path):
    import base64

    from consistency_gate.errors import DataError, UsageError
    from consistency_gate.io.capture import read_sagemaker

    prod, shadow = tmp_path / "prod", tmp_path / "shadow"
    prod.mkdir(), shadow.mkdir()
    (prod / "12-00-00-000-a.jsonl").write_text(
        "\n".join(
            [
                sagemaker_record("e1", "0.9,0.1", inference="r1"),
                sagemaker_record("e2", "0.3,0.7\n0.6,0.4", inference="r2"),
            ]
        )
    )
    mlflow_json = base64.b64encode(json.dumps({"predictions": [[0.2, 0.8]]}).encode()).decode()
    (shadow / "12-00-00-000-b.jsonl").write_text(
        "\n".join(
            [
                sagemaker_record("x1", mlflow_json, "BASE64", inference="r1"),
                sagemaker_record("x2", "[[0.1, 0.9], [0.2, 0.8]]", "JSON", inference="r2"),
            ]
        )
    )
    capture = read_sagemaker(prod, shadow, ("cat", "dog"))
    assert capture[["id", "champion", "candidate"]].values.tolist() == [
        ["r1", "cat", "dog"], ["r2#0", "dog", "dog"], ["r2#1", "cat", "dog"]
    ]  # fmt: skip
    with pytest.raises(UsageError, match="class names"):
        read_sagemaker(prod, shadow, None)
    (tmp_path / "bad.jsonl").write_text('{"captureData": 1}\n')
    with pytest.raises(DataError, match="bad.jsonl, line 1: not a SageMaker Data Capture record"):
        read_sagemaker(tmp_path / "bad.jsonl", shadow, ("cat", "dog"))


def test_the_capture_rolls_on_time_and_a_part_being_written_is_not_read(tmp_path):
    from consistency_gate.io.capture import read_capture
    from consistency_gate.io.capture_writer import CaptureWriter

    writer = CaptureWriter(tmp_path, roll_rows=1000, roll_seconds=0.2)
    at = pd.Timestamp("2026-11-27T10:00:00Z")
    writer.add([{"id": "a", "time": at, "champion": "x", "candidate": "y", "candidate_error": None}])
    deadline = time.monotonic() + 10
    while not list(tmp_path.glob("part-*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.05)
    (tmp_path / ".part-00001.parquet.tmp").write_bytes(b"PAR1 half a file")  # the writer's next part, mid-write
    assert read_capture(tmp_path)["id"].tolist() == ["a"]  # read while the writer goes on
    writer.add([{"id": "b", "time": at, "champion": "x", "candidate": None, "candidate_error": "TimeoutError"}])
    writer.close()
    assert read_capture(tmp_path)["candidate"].isna().tolist() == [False, True]


def test_the_journal_writer_is_woken_once_after_a_pause_and_groups_what_comes_meanwhile(tmp_path):
    """Group commit without a wake-up per request: while the writer's thread waits out its group, the requests
    answered meanwhile only join the group (one wake-up for 100 requests, one append); once a group is empty
    the thread waits to be woken, and the next request wakes it. A stop writes everything."""
    from consistency_gate.io.capture import read_capture
    from consistency_gate.io.capture_writer import JOURNAL, CaptureWriter, journal_rows

    class CountedEvent(threading.Event):
        sets = 0

        def set(self) -> None:
            CountedEvent.sets += 1
            super().set()

    at = pd.Timestamp("2026-11-27T10:00:00Z")

    def row(i: int) -> list[dict]:
        return [{"id": f"r{i}", "time": at, "champion": "x", "candidate": None, "candidate_error": None}]

    writer = CaptureWriter(tmp_path, group_s=3600)  # the first group waits until the stop
    writer.wake = CountedEvent()
    for i in range(100):
        writer.answered(row(i))
    assert CountedEvent.sets == 1 and not (tmp_path / JOURNAL).exists() and len(writer.group) == 100
    writer.close()
    assert writer.groups == 1 and len(read_capture(tmp_path)) == 100

    writer = CaptureWriter(tmp_path / "b", group_s=0.001)
    writer.wake, CountedEvent.sets = CountedEvent(), 0
    writer.answered(row(0))
    until(lambda: writer.idle and len(journal_rows(tmp_path / "b")) == 1, "the group appended, the thread idle")
    writer.answered(row(1))  # after the pause: wakes the thread again
    until(lambda: len(journal_rows(tmp_path / "b")) == 2, "the second group appended")
    assert CountedEvent.sets == 2
    writer.close()
    assert writer.groups == 2 and len(read_capture(tmp_path / "b")) == 2


@pytest.mark.slow  # a registry store and its runs
def test_shadow_check_reads_a_sagemaker_shadow_test_capture(store, tmp_path):
    """The production and shadow variants' Data Capture, scores in the order --classes gives: the same figures
    as the same answers in a capture table."""
    client = MlflowClient(store["uri"])
    client.set_registered_model_alias(MODEL, "champion", "1")
    served, labels = capture_of(store, 0, 1, tmp_path / "table")
    classes = ["setosa", "versicolor", "virginica"]
    for variant, column in (("prod", "champion"), ("shadow", "candidate")):
        lines = []
        for row in served.itertuples():
            scores = ",".join("0.8" if c == getattr(row, column) else "0.1" for c in classes)
            meta = {"eventId": f"{variant}-{row.Index}", "inferenceId": row.id, "inferenceTime": row.time.isoformat()}
            data = {"endpointOutput": {"data": scores, "encoding": "CSV", "mode": "OUTPUT"}}
            lines.append(json.dumps({"captureData": data, "eventMetadata": meta, "eventVersion": "0"}))
        (tmp_path / f"{variant}.jsonl").write_text("\n".join(lines) + "\n")
    args = ("--candidate", "2", "--labels", labels, "--format", "json")
    proc = shadow(store, *args, "--capture", tmp_path / "prod.jsonl", "--shadow-capture", tmp_path / "shadow.jsonl",
                  "--classes", ",".join(classes))  # fmt: skip
    table = shadow(store, *args, "--capture", tmp_path / "table")
    assert proc.returncode == table.returncode and proc.returncode in (0, 1), proc.stderr
    assert json.loads(proc.stdout)["metrics"] == json.loads(table.stdout)["metrics"]


def test_shadow_serve_refuses_a_capture_under_a_file_and_a_port_out_of_range_in_one_line(tmp_path):
    taken = tmp_path / "answers.csv"
    taken.write_text("id\n")
    for capture in (taken, taken / "parts"):
        proc = run_cli("shadow", "serve", "--model", "m", "--capture", capture, "--tracking-uri", "sqlite:///none.db")
        assert proc.returncode == 2 and proc.stderr == (
            f"error: --capture {capture}: {taken} is a file, not a folder; give a folder for the capture's Parquet "
            "parts (made if it is not there)\n"
        )
    proc = run_cli("shadow", "serve", "--model", "m", "--capture", tmp_path / "c", "--port", "99999")
    assert proc.returncode == 2 and "'--port': 99999 is not in the range 0<=x<=65535" in proc.stderr
