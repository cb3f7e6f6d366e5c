"""`consistency-gate check` on prediction files, without a registry: the same rules, verdict, report and
exit codes as the gate of registered models, and the same run on a real SQLite store when a tracking URI
is given."""

import os
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest
from conftest import read_report, run_cli
from mlflow import MlflowClient

from consistency_gate.engines.local import compare_files

RULES = "rules:\n  - {metric: con, min: 0.5}\n  - {metric: ctoi, max: 0.05, decide: upper}\nks: [1, 2]\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    rng = np.random.default_rng(3)
    n, classes = 400, ["cat", "dog", "eel"]
    y = rng.integers(0, 3, n)
    ids = [f"s{i}" for i in range(n)]
    a, b = rng.random((n, 3)), rng.random((n, 3))
    a[np.arange(n), y] += 0.8
    b[np.arange(n), y] += 0.5
    region = np.where(rng.random(n) < 0.3, "north", "south")
    pd.DataFrame({"id": ids, "label": np.array(classes)[y], "region": region}).to_csv(root / "labels.csv", index=False)
    pd.DataFrame(a, columns=classes).assign(id=ids).to_csv(root / "gen1.csv", index=False)
    shuffled = pd.DataFrame(b, columns=classes[::-1]).assign(id=ids).sample(frac=1, random_state=0)
    shuffled.to_parquet(root / "gen2.parquet", index=False)
    (root / "gate.yaml").write_text(RULES)
    return root


def _args(root, *extra):
    return (
        "check",
        "--labels",
        root / "labels.csv",
        "--previous-predictions",
        root / "gen1.csv",
        "--candidate-predictions",
        root / "gen2.parquet",
        "--id-column",
        "id",
        "--config",
        root / "gate.yaml",
        *extra,
    )


def _env_without_tracking():
    """This process's environment less MLFLOW_TRACKING_URI (the file gate reads it where it logs, not on import)."""
    return {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}


def test_files_gate_like_models_without_a_registry(files, tmp_path):
    report = tmp_path / "report.json"
    proc = run_cli(*_args(files, "--report", report), cwd=tmp_path, env=_env_without_tracking(), process=False)
    saved = read_report(report)
    expected = compare_files(
        files / "labels.csv", files / "gen1.csv", files / "gen2.parquet", id_column="id", ks=[1, 2]
    )
    ctoi_upper = expected.bounds["ctoi"][1]  # the one-sided 95% bound the rule decides on
    assert proc.returncode == (0 if ctoi_upper <= 0.05 and expected.metrics["con"] >= 0.5 else 1), proc.stderr
    assert saved["metrics"] == pytest.approx(expected.metrics)
    assert saved["intervals"]["ctoi"] == pytest.approx(expected.intervals["ctoi"])
    assert saved["tests"]["mcnemar_p"] == pytest.approx(expected.tests["mcnemar_p"])
    assert saved["run_id"] is None and saved["promoted"] is False and saved["confidence"] == 0.95
    assert [r["compared"] for r in saved["rules"]] == pytest.approx([expected.metrics["con"], ctoi_upper])
    assert saved["candidate"] == {"name": "predictions", "version": None, "predictions": str(files / "gen2.parquet")}
    assert f"Gate predictions {files / 'gen2.parquet'} against {files / 'gen1.csv'} on 400 samples" in proc.stdout
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()  # nothing logged


def test_a_files_gate_that_logs_nothing_keeps_no_samples_and_imports_no_mlflow(files, tmp_path, monkeypatch):
    """Without a tracking store or an HTML page nothing logs or draws the flip table: the gate keeps
    no per-sample predictions (0.6 s at 400,000 rows), and does not load MLflow (0.7 s of import)."""
    import subprocess
    import sys

    from consistency_gate.gate import files as file_gate

    def no_flip_table(*args):
        raise AssertionError("a flip table made for nothing")

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(file_gate, "flip_table", no_flip_table)
    paths = files / "labels.csv", files / "gen1.csv", files / "gen2.parquet"
    result = file_gate.run_file_gate(*paths, id_column="id", config=files / "gate.yaml")
    assert result.verdict in ("passed", "failed")  # and no flip table was made
    probe = (
        "import sys\n"
        "from consistency_gate import cli\n"
        f"args = {[str(a) for a in _args(files)]!r}\n"
        "try:\n    cli.main(args)\nexcept SystemExit as exit:\n    print(exit.code, 'mlflow' in sys.modules)\n"
    )
    env = _env_without_tracking()
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert proc.stdout.splitlines()[-1] in ("0 False", "1 False"), proc.stdout + proc.stderr


class _Tables(HTMLParser):
    """Every <table> of a page as rows of cell texts (header row first)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.images = 0

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.tables[-1][-1].append("")
        elif tag == "img" and dict(attrs)["src"].startswith("data:image/png;base64,"):
            self.images += 1

    def handle_data(self, data):
        if self.tables and self.tables[-1] and self.tables[-1][-1]:
            self.tables[-1][-1][-1] += data.strip()


def test_files_gate_html_report_holds_real_tables(files, tmp_path):
    report = tmp_path / "report.json"
    args = _args(files, "--report", report, "--format", "html")
    proc = run_cli(*args, cwd=tmp_path, env=_env_without_tracking(), process=False)
    assert proc.returncode in (0, 1), proc.stderr
    saved = read_report(report)
    page = _Tables()
    page.feed(proc.stdout)
    assert proc.stdout.startswith("<!doctype html>") and page.images == 3
    rules, metrics, classes, *_ = page.tables
    assert rules[0] == ["rule", "value", "outcome", "false pass", "note"]
    outcome = {True: "held", False: "FAILED", None: "skipped"}
    assert [(row[0], row[2]) for row in rules[1:]] == [
        (f"{r['quantity']} {r['condition']}", outcome[r["held"]]) for r in saved["rules"]
    ]
    shown = {row[0]: float(row[1]) for row in metrics[1:] if row[1] != "null"}
    assert shown == pytest.approx({k: v for k, v in saved["metrics"].items() if v is not None}, abs=5e-5)
    # the classes with the most negative flips: CtoI counts that add up to the report's share
    assert classes[0] == ["class", "samples", "CtoI", "ItoC", "CtoI share of class"]
    ctoi = [int(row[2]) for row in classes[1:]]
    assert ctoi == sorted(ctoi, reverse=True) and sum(ctoi) == round(saved["metrics"]["ctoi"] * saved["n"])


def test_files_gate_logs_the_same_run_with_a_tracking_uri(files, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = tmp_path / "sliced.yaml"
    config.write_text("slices: [region]\n" + RULES.replace("decide: upper}", "decide: upper, per_slice: true}"))
    report = tmp_path / "report.json"
    env = {**_env_without_tracking(), "MLFLOW_TRACKING_URI": uri}  # $MLFLOW_TRACKING_URI is a tracking URI too
    proc = run_cli(*_args(files, "--report", report, "--name", "nightly-clf", "--config", config), env=env)
    assert proc.returncode in (0, 1), proc.stderr
    saved = read_report(report)
    assert {s["value"] for s in saved["slices"]} == {"north", "south"}
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(saved["run_id"])
    assert run.info.status == "FINISHED"
    assert run.info.experiment_id == client.get_experiment_by_name("consistency-gate/nightly-clf").experiment_id
    assert run.data.params["candidate_predictions"] == str(files / "gen2.parquet")
    assert run.data.tags["consistency_gate.verdict"] == saved["verdict"]
    assert run.data.tags["consistency_gate.candidate_verdict"] == saved["candidate_verdict"]
    assert run.data.tags["mlflow.note.content"].startswith("## ")  # the verdict as the run's description
    assert f"consistency-gate: nightly-clf {files / 'gen2.parquet'}" in run.data.tags["mlflow.note.content"]
    assert run.data.metrics["ctoi"] == pytest.approx(saved["metrics"]["ctoi"])
    assert run.data.metrics["interval/ctoi_high"] == pytest.approx(saved["intervals"]["ctoi"][1])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "gate")}
    assert {"gate/rules.json", "gate/slices.json", "gate/flips.json", "gate/flips.csv", "gate/report.json"} <= artifacts
    assert "gate/report.html" in artifacts
    flips = pd.read_csv(client.download_artifacts(run.info.run_id, "gate/flips.csv", str(tmp_path)))
    assert len(flips) == 400 and flips["flip"].iloc[0] == "CtoI" and flips["id"].is_unique
    assert (flips["flip"] == "CtoI").mean() == pytest.approx(saved["metrics"]["ctoi"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--model", "m"), "--model cannot be combined with --labels"),
        (("--promote",), "--promote cannot be combined"),
        (("--engine", "spark"), "--engine spark cannot be combined"),
    ],
)
def test_mixed_options_are_usage_errors(files, extra, message):
    proc = run_cli(*_args(files, *extra), env=_env_without_tracking(), process=False)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert "--name" not in proc.stderr  # no word about an option that was not given


def test_missing_file_option_remediation_and_bad_data(files, tmp_path):
    args = list(_args(files))
    partial = args[:5] + args[7:]  # no --candidate-predictions
    proc = run_cli(*partial, env=_env_without_tracking(), process=False)
    assert proc.returncode == 2 and "missing --candidate-predictions" in proc.stderr
    remediation = tmp_path / "remediate.yaml"
    remediation.write_text(RULES + "remediation:\n  data: train.csv\n")
    proc = run_cli(*_args(files, "--config", remediation), env=_env_without_tracking(), process=False)
    assert proc.returncode == 2 and "remediation trains and registers models" in proc.stderr
    bad = tmp_path / "labels.csv"
    pd.read_csv(files / "labels.csv").rename(columns={"label": "truth"}).to_csv(bad, index=False)
    proc = run_cli(*_args(files)[:2], bad, *_args(files)[3:], env=_env_without_tracking(), process=False)
    assert proc.returncode == 3 and "column 'label' not found" in proc.stderr


def test_files_gate_writes_an_error_report_on_every_error(files, tmp_path):
    """The file gate shares the registry gate's session: an error report for exit codes >= 2, run or no run."""
    short = tmp_path / "short.csv"
    pd.read_csv(files / "gen1.csv").iloc[:-1].to_csv(short, index=False)
    report = tmp_path / "report.json"
    args = list(_args(files, "--report", report))
    args[args.index(files / "gen1.csv")] = short  # a sample short: its id is missing
    proc = run_cli(*args, env=_env_without_tracking(), process=False)
    saved = read_report(report)
    assert proc.returncode == 3 and saved["exit_code"] == 3, proc.stderr
    assert saved["verdict"] == "error" and "is missing" in saved["error"] and saved["run_id"] is None
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    missing_config = _args(files, "--report", report, "--tracking-uri", uri, "--config", tmp_path / "none.yaml")
    proc = run_cli(*missing_config, env=_env_without_tracking(), process=False)
    assert proc.returncode == 2 and read_report(report)["exit_code"] == 2, proc.stderr


def test_files_gate_run_is_named_after_its_verdict_and_logs_the_report_once(files, tmp_path):
    from consistency_gate.gate.config import parse_config
    from consistency_gate.gate.files import run_file_gate

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = parse_config(RULES)
    result = run_file_gate(
        files / "labels.csv", files / "gen1.csv", files / "gen2.parquet", id_column="id", config=cfg, tracking_uri=uri
    )
    run = MlflowClient(tracking_uri=uri).get_run(result.run_id)
    failed = [r.rule.metric for r in result.rules if r.held is False]
    prefix = result.outcome.upper() + (" " + ", ".join(dict.fromkeys(failed)) if failed else "")
    assert run.info.run_name == f"{prefix}: predictions (prediction files)"
    assert run.info.status == "FINISHED"


def test_a_class_name_with_a_newline_cannot_break_the_text_reports_lines(tmp_path):
    """A class named "cat\\nFAKE ..." is shown with its escape in every table of the text report (the rules,
    the slices by true class, the classes with the most flips), as the Markdown and HTML reports escape it."""
    rng = np.random.default_rng(0)
    n, classes = 300, ["cat\nFAKE: PASSED", "dog"]
    y = rng.integers(0, 2, n)
    a, b = rng.random((n, 2)), rng.random((n, 2))
    a[np.arange(n), y] += 0.6
    b[np.arange(n), y] += 0.3
    pd.DataFrame({"label": np.array(classes, dtype=object)[y]}).to_csv(tmp_path / "labels.csv", index=False)
    for name, scores in (("gen1.csv", a), ("gen2.csv", b)):
        pd.DataFrame(scores, columns=classes).to_csv(tmp_path / name, index=False)
    (tmp_path / "gate.yaml").write_text("slices: [true_class]\nrules:\n  - {metric: con, min: 0.99}\n")
    proc = run_cli(
        "check", "--labels", tmp_path / "labels.csv", "--previous-predictions", tmp_path / "gen1.csv",
        "--candidate-predictions", tmp_path / "gen2.csv", "--config", tmp_path / "gate.yaml",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "cat\\nFAKE: PASSED" in proc.stdout
    assert not [line for line in proc.stdout.splitlines() if line.startswith("FAKE")], proc.stdout
