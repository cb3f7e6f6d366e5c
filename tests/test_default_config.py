"""The config `config --default` prints gates every model the packaged default gates: binary, 3 and 4 classes on a
real SQLite registry (the top-k metrics of a k larger than the classes null, with the reason, in the report); the
memory and the listener with it; `config --check FILE --model M` checks a config against the model it will gate;
every docs example that writes a config from `config --default` gates a binary model."""

from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from conftest import read_report, run_cli
from docs_blocks import PAGES, runnable_blocks
from mlflow import MlflowClient
from registry_fixtures import sqlite_uri

MODELS = {"binary": 2, "three": 3, "four": 4}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two generations of a binary, a 3-class and a 4-class logistic regression (each with @champion on v1 and an
    input example), a label-only model (no predict_proba), and the evaluation set of each."""
    from mlflow.models import infer_signature
    from sklearn.datasets import load_breast_cancer, load_digits, load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import LinearSVC

    root = tmp_path_factory.mktemp("default-config")
    uri = sqlite_uri(root)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    mlflow.set_experiment("training")
    cancer, iris, digits = load_breast_cancer(), load_iris(), load_digits()
    four = digits.target < 4
    sets = {
        "binary": (cancer.data, np.array(["no", "yes"])[cancer.target]),
        "three": (iris.data, iris.target_names[iris.target]),
        "four": (digits.data[four], np.array([f"d{t}" for t in digits.target[four]])),
    }
    client = MlflowClient(tracking_uri=uri)
    for name, (x, y) in sets.items():
        frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(x.shape[1])])
        for seed in (0, 1):
            rows = np.random.default_rng(seed).permutation(len(frame))[: len(frame) // 2]
            model = LogisticRegression(max_iter=500).fit(frame.iloc[rows], y[rows])
            _log(model, name, frame, infer_signature(frame, model.predict_proba(frame)))
        client.set_registered_model_alias(name, "champion", "1")
        evaluation = frame.assign(label=y, id=[f"s{i}" for i in range(len(frame))])
        evaluation.to_csv(root / f"{name}.csv", index=False)
        evaluation.drop(columns="label").to_csv(root / f"{name}-population.csv", index=False)
    x, y = sets["three"]
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(x.shape[1])])
    _log(LinearSVC().fit(frame, y), "labels", frame, infer_signature(frame, y))
    return {"uri": uri, "root": root}


def _log(model, name, frame, signature):
    with mlflow.start_run():
        mlflow.sklearn.log_model(
            model, name="model", registered_model_name=name, signature=signature, input_example=frame.head(2),
            pip_requirements=["scikit-learn"],
        )  # fmt: skip


def _default_config(folder):
    printed = run_cli("config", "--default")
    assert printed.returncode == 0, printed.stderr
    (folder / "gate.yaml").write_text(printed.stdout)
    return folder / "gate.yaml"


@pytest.mark.parametrize("name", list(MODELS))
def test_the_printed_default_gates_binary_three_and_four_classes(store, tmp_path, name):
    config = _default_config(tmp_path)
    report = tmp_path / "report.json"
    proc = run_cli(
        "check", "--model", name, "--candidate", "2", "--data", store["root"] / f"{name}.csv", "--id-column", "id",
        "--config", config, "--tracking-uri", store["uri"], "--report", report,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    said = read_report(report)
    assert said["verdict"] in ("passed", "failed") and said["metrics"]["ccon@1"] is not None
    for key in ("ccon@5", "cacc_previous@5", "cacc_candidate@5"):  # k=5 of ks [1, 5]: said, not dropped
        assert key in said["metrics"] and said["metrics"][key] is None
        assert said["null_reasons"][key] == (
            f"not applicable: k=5 is larger than the {MODELS[name]} classes of models:/{name}/1 (its top 5 would "
            "hold every class)"
        )
    assert f"Top-k: not applicable: k=5 is larger than the {MODELS[name]} classes" in proc.stdout


def test_a_rule_on_a_k_the_model_cannot_have_is_one_line_before_the_gate_decides(store, tmp_path):
    config = _default_config(tmp_path)
    config.write_text(config.read_text() + "  - {metric: cacc@5, min: 0.9}\n")
    line = len(config.read_text().splitlines())
    expected = (
        f"error: {config}: line {line}: rule cacc@5 >= 0.9 cannot be judged for models:/binary/1: k=5 is larger "
        "than its 2 classes; use k <= 2 in the rule, or remove it\n"
    )
    checked = run_cli("config", "--check", config, "--model", "binary", "--tracking-uri", store["uri"])
    assert checked.returncode == 2 and checked.stderr == expected
    gated = run_cli(
        "check", "--model", "binary", "--candidate", "2", "--data", store["root"] / "binary.csv", "--config", config,
        "--tracking-uri", store["uri"],
    )  # fmt: skip
    assert gated.returncode == 2 and gated.stderr == expected


def test_config_check_against_a_model_says_what_applies(store, tmp_path):
    config = _default_config(tmp_path)
    alone = run_cli("config", "--check", config)
    assert alone.returncode == 0
    assert alone.stdout.splitlines()[-1].startswith("not checked against a model: the classes it answers in")
    proc = run_cli("config", "--check", config, "--model", "binary", "--candidate", "2", "--tracking-uri", store["uri"])
    assert proc.returncode == 0, proc.stderr
    assert "  models:/binary/1 (@champion): 2 classes: no, yes (its logged input example predicted)" in proc.stdout
    assert "  models:/binary/2: 2 classes: no, yes (its logged input example predicted)" in proc.stdout
    assert "  ks: not applicable: k=5 is larger than the 2 classes of models:/binary/1" in proc.stdout
    four = run_cli("config", "--check", config, "--model", "four", "--data", store["root"] / "four.csv",
                  "--tracking-uri", store["uri"])  # fmt: skip
    assert four.returncode == 0 and "2 classes" not in four.stdout
    assert "4 classes: d0, d1, d2, d3 (one row of the evaluation data predicted)" in four.stdout


def test_config_check_refuses_a_rule_on_scores_for_a_label_only_model(store, tmp_path):
    config = tmp_path / "gate.yaml"
    config.write_text("rules:\n  - {metric: ctoi, max: 0.05}\n  - {metric: pearson, min: 0.9}\nks: [1]\n")
    proc = run_cli("config", "--check", config, "--model", "labels", "--tracking-uri", store["uri"])
    assert proc.returncode == 2
    assert proc.stderr == (
        f"error: {config}: line 3: rule pearson >= 0.9 cannot be judged for models:/labels/1: it answers with class "
        "labels only, and pearson needs class scores; remove the rule, or register a model that gives class scores "
        "(predict_proba)\n"
    )
    first = "  models:/labels/1: class labels only, no class scores (its logged input example predicted)"
    config.write_text("rules:\n  - {metric: acc, min: 0.5}\nks: [1]\n")  # no @champion: a first generation
    proc = run_cli("config", "--check", config, "--model", "labels", "--tracking-uri", store["uri"])
    assert proc.returncode == 0 and first in proc.stdout and "@champion is not set" in proc.stdout


def test_the_printed_default_with_the_memory_gates_a_binary_model(store, tmp_path):
    config = _default_config(tmp_path)
    population = store["root"] / "binary-population.csv"
    config.write_text(
        config.read_text()
        + "remediation:\n  strategy: [memory]\n  tuning_share: 0.3\n"
        + f"  options:\n    memory: {{population: {population}}}\n"
    )
    report = tmp_path / "report.json"
    proc = run_cli(
        "check", "--model", "binary", "--candidate", "2", "--data", store["root"] / "binary.csv", "--id-column", "id",
        "--config", config, "--tracking-uri", store["uri"], "--report", report,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    said = read_report(report)
    assert [a["method"] for a in said["attempts"]] == ["memory"]
    assert said["null_reasons"]["ccon@5"].startswith("not applicable: k=5 is larger than the 2 classes")


def test_the_listener_gates_a_binary_model_with_the_printed_default(store, tmp_path):
    from consistency_gate.gate.watch import Watcher, load_watch_config

    config = _default_config(tmp_path)
    watch = tmp_path / "watch.yaml"
    watch.write_text(
        f"models:\n  - name: binary\n    data: {store['root'] / 'binary.csv'}\n    config: {config}\n"
        "    id_column: id\n    promote: false\n"
    )
    client = MlflowClient(tracking_uri=store["uri"])
    second = client.get_model_version("binary", "2")  # registered again: a version no other test gated
    version = client.create_model_version("binary", second.source, second.run_id, model_id=second.model_id).version
    watcher = Watcher(load_watch_config(watch), store["uri"], echo=lambda line: None)
    watcher.check()
    try:
        said = watcher.gate("binary", str(version))
    finally:
        watcher.worker.stop()
    assert said.startswith(("passed (exit 0", "failed (exit 1")), said
    tags = client.get_model_version("binary", str(version)).tags
    assert tags["consistency_gate.verdict"] in ("passed", "failed") and tags["consistency_gate.started_by"]


@pytest.mark.parametrize(
    "page", [p for p in PAGES if any("config --default > gate.yaml" in code for _, code, _ in runnable_blocks(p))],
    ids=lambda p: p.name,
)  # fmt: skip
def test_docs_examples_that_start_from_the_default_gate_a_binary_model(store, tmp_path, page):
    """Each runnable bash block that writes gate.yaml from `config --default`, run as the page gives it, then its
    gate.yaml checked against the binary model and used to gate it."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    blocks = [code for lang, code, _ in runnable_blocks(page) if lang == "bash" and "config --default >" in code]
    for number, code in enumerate(blocks):
        folder = tmp_path / str(number)
        folder.mkdir()
        proc = subprocess.run(
            ["bash", "-e", "-c", code], cwd=folder, env=env, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr
        config = folder / "gate.yaml"
        checked = run_cli("config", "--check", config, "--model", "binary", "--tracking-uri", store["uri"])
        assert checked.returncode == 0, checked.stderr
        gated = run_cli(
            "check", "--model", "binary", "--candidate", "2", "--data", store["root"] / "binary.csv", "--id-column",
            "id", "--config", config, "--tracking-uri", store["uri"], cwd=folder,
        )  # fmt: skip
        assert gated.returncode in (0, 1), f"{page.name}: {gated.stderr}"
