"""No-training repairs through the gate, on a real SQLite registry: sklearn and PyTorch generations,
settings fixed, tuned on a calibration file or left at their defaults, registered as one pyfunc
version that loads and predicts the gated answers in a fresh process; bad settings are one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from conftest import read_report, run_cli
from mlflow import MlflowClient
from registry_fixtures import MODEL, build_store, check_args

from consistency_gate.gate.config import parse_config
from consistency_gate.gate.run import run_gate

pytestmark = pytest.mark.slow  # models logged, registered and loaded back

RULES = "rules:\n  - {metric: ctoi, max: 0.02}\n  - {metric: acc, min_delta: -0.02}\nks: [1]\n"
# v3 is a poor model (one feature): only the previous generation's answers meet RULES, a rollback, which
# is never registered; a repair that keeps some of its answers meets these
LENIENT = "rules:\n  - {metric: ctoi, max: 0.1}\n  - {metric: acc, min_delta: -0.1}\nks: [1]\n"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("repairs")
    store = build_store(root)
    frame = pd.read_csv(store["data"]).sample(frac=1, random_state=0)  # calibration and evaluation apart
    frame.iloc[:60].to_csv(root / "calibration.csv", index=False)
    frame.iloc[60:].to_csv(root / "eval.csv", index=False)
    return {**store, "eval": root / "eval.csv", "calibration": root / "calibration.csv"}


def _fresh_process_labels(uri: str, model_uri: str, data) -> list[str]:
    """The class a version answers for each row of ``data``, loaded in a fresh process."""
    code = (
        "import json, sys, mlflow, pandas as pd\n"
        f"mlflow.set_tracking_uri({uri!r})\n"
        f"frame = pd.read_csv({str(data)!r}).drop(columns=['label', 'id'])\n"
        f"out = mlflow.pyfunc.load_model({model_uri!r}).predict(frame)\n"
        "print(json.dumps(out.idxmax(axis=1).tolist()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("block", "setting"),
    [
        ("strategy: [rerank]\n  k: 2", {"k": 2, "tuned_on": "config"}),
        ("strategy: cheapest\n  calibration: {calibration}", {"tuned_on": "{calibration}"}),
    ],
    ids=["rerank fixed", "cheapest tuned"],
)
def test_a_repair_of_sklearn_generations_passes_and_serves_the_gated_answers(store, tmp_path, block, setting):
    config = tmp_path / "gate.yaml"
    config.write_text(LENIENT + "remediation:\n  " + block.format(calibration=store["calibration"]) + "\n")
    report_path = tmp_path / "report.json"
    proc = run_cli(*check_args("3", store["eval"], config, store["uri"], "--id-column", "id", "--report", report_path))
    report = read_report(report_path)
    assert proc.returncode == 0, proc.stderr
    assert report["candidate_verdict"] == "failed" and report["outcome"] == "remediated"
    repair = report["ensemble"]
    assert repair["kind"] == repair["method"] in ("blend", "rerank") and repair["members"] == 2
    assert repair["setting"]["tuned_on"] == setting["tuned_on"].format(calibration=store["calibration"])
    assert repair["train_seconds"] >= 0 and repair["cost"]["latency_ratio"] > 0  # time: benchmarks/remediation_cost.py
    assert report["attempts"][0]["method"] == "blend" or len(report["attempts"]) == 1  # cheapest: blend first
    assert "both generations' models in one, no training" in proc.stdout
    client = MlflowClient(tracking_uri=store["uri"])
    version = client.get_model_version(MODEL, report["registered_version"])
    assert (
        version.tags["consistency_gate.kind"] == repair["method"] and version.tags["consistency_gate.replaces"] == "3"
    )
    assert version.description.startswith(
        f"PASSED v{version.version} ({repair['method']} repair of v3) vs v1 (@champion)"
    )
    assert "Registered in place of v3, which failed." in version.description
    flips = pd.read_csv(client.download_artifacts(repair["run_id"], "gate/flips.csv", str(tmp_path)))
    served = _fresh_process_labels(store["uri"], f"models:/{MODEL}/{version.version}", store["eval"])
    gated = flips.set_index("id").loc[pd.read_csv(store["eval"])["id"], "candidate_prediction"]
    assert served == gated.astype(str).tolist()  # what was gated is what is served


def test_a_repair_of_pytorch_generations_with_tensor_inputs(store, tmp_path):
    """Two PyTorch generations (tensor signature, classes in a tag), repaired by blend at its default."""
    mlflow.set_tracking_uri(store["uri"])
    client = MlflowClient(tracking_uri=store["uri"])
    frame = pd.read_csv(store["eval"])
    x = frame.drop(columns=["label", "id"]).to_numpy(dtype="float32")
    torch.manual_seed(1)
    weak = torch.nn.Sequential(torch.nn.Linear(4, 3))  # untrained: a poor second generation
    with mlflow.start_run():
        mlflow.pytorch.log_model(
            weak, name="model", registered_model_name="iris-torch", input_example=x[:2], pip_requirements=["torch"]
        )
    client.set_model_version_tag("iris-torch", "2", "consistency_gate.classes", '["setosa", "versicolor", "virginica"]')
    client.set_registered_model_alias("iris-torch", "champion", "1")
    cfg = parse_config(
        "rules:\n  - {metric: ctoi, max: 0.2}\nks: [1]\nremediation:\n  strategy: [blend]\n  weight: 0.5\n"
    )
    result = run_gate("iris-torch", store["eval"], candidate="2", config=cfg, tracking_uri=store["uri"], id_column="id")
    setting = {"weight": 0.5, "tuned_on": "config", "combines": ["1", "2"]}
    assert result.candidate_verdict == "failed" and result.ensemble["setting"] == setting
    assert result.verdict == "passed" and result.ensemble["metrics"]["ctoi"] < result.metrics["ctoi"]
    served = mlflow.pyfunc.load_model(f"models:/iris-torch/{result.registered_version}").predict(x)
    expected = mlflow.pytorch.load_model("models:/iris-torch/1")(torch.as_tensor(x)).softmax(1).detach().numpy()
    candidate = torch.softmax(weak(torch.as_tensor(x)), 1).detach().numpy()
    assert np.allclose(served.to_numpy(), 0.5 * expected + 0.5 * candidate, atol=1e-5)


@pytest.mark.parametrize(
    ("block", "code", "message"),
    [
        ("strategy: [rerank]\n  k: 1", 2, "k (rerank) must be an integer >= 2"),
        ("strategy: [blend]\n  weight: 1.5", 2, "weight (blend) must be in [0, 1]"),
        ("strategy: [blend]\n  calibration: {bad}", 3, "label 'tulip' is not a class of any generation"),
        ("strategy: [bayesian-update]\n  calibration: {bad}", 3, "row 1: label 'tulip' is not a class of any"),
        ("strategy: [blend]\n  max_models: 0", 2, "max_models"),
    ],
    ids=["k below 2", "weight above 1", "unknown class in calibration", "unknown class, bayes", "a budget of no model"],
)
def test_bad_repair_settings_are_one_line_errors(store, tmp_path, block, code, message):
    bad = tmp_path / "bad.csv"
    pd.read_csv(store["calibration"]).assign(label="tulip").to_csv(bad, index=False)
    config = tmp_path / "gate.yaml"
    config.write_text(RULES + "remediation:\n  " + block.format(bad=bad) + "\n")
    proc = run_cli(*check_args("3", store["eval"], config, store["uri"], "--id-column", "id"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code and message in lines[-1] and "Traceback" not in proc.stderr, proc.stderr


def test_without_training_data_the_training_methods_are_skipped_not_refused(store, tmp_path):
    # w 0 is the candidate itself and k 2 keeps some of its flips: both repairs fail, then nothing can train
    block = "remediation:\n  strategy: cheapest\n  weight: 0.0\n  k: 2\n"
    cfg = parse_config("rules:\n  - {metric: ctoi, max: 0.0}\n" + block)
    result = run_gate(MODEL, store["eval"], candidate="3", config=cfg, tracking_uri=store["uri"], id_column="id")
    assert result.verdict == "failed" and result.exit_code == 1 and result.registered_version is None
    skipped = [a for a in result.attempts if a["verdict"] == "skipped"]
    assert [a["method"] for a in result.attempts[:2]] == ["blend", "rerank"]
    assert [a["method"] for a in skipped] == [
        "bayesian-update", "focal-distillation", "ensemble-distillation", "dynsnap-cyc"
    ]  # fmt: skip
    assert "calibration:" in skipped[0]["note"] and all("names no training data" in a["note"] for a in skipped[1:])


def test_a_repair_of_a_repaired_champion_counts_every_model_it_carries(tmp_path):
    """A repair promoted to @champion carries two models; a repair of the next failing candidate against it
    carries that champion's two and the candidate: three, in the report, the attempt's row and the version's
    ``consistency_gate.models`` tag (which the next repair reads), not the two of a plain pair."""
    built = build_store(tmp_path)
    client = MlflowClient(tracking_uri=built["uri"], registry_uri=built["uri"])
    gates = [  # v3 (the poor model) against v1, then v2 against the repair that replaced v3 (CON 0.90 there)
        ("3", LENIENT + "remediation:\n  strategy: [rerank]\n  k: 2\n"),
        ("2", "rules:\n  - {metric: con, min: 0.91}\nks: [1]\nremediation:\n  strategy: [blend]\n  weight: 0.7\n"),
    ]
    members = []
    for candidate, text in gates:
        config, report_path = tmp_path / "gate.yaml", tmp_path / "report.json"
        config.write_text(text)
        args = check_args(candidate, built["data"], config, built["uri"], "--report", report_path, "--promote")
        proc = run_cli(*args)
        report = read_report(report_path)
        assert proc.returncode == 0 and report["outcome"] == "remediated", proc.stdout + proc.stderr
        registered = report["registered_version"]
        assert str(client.get_model_version_by_alias(MODEL, "champion").version) == registered
        carried = client.get_model_version(MODEL, registered).tags["consistency_gate.models"]
        members.append((report["ensemble"]["members"], report["attempts"][-1]["members"], carried))
    assert members == [(2, 2, "2"), (3, 3, "3")]
    # with a budget of 1 model, no repair of the 3-model champion and a candidate is built, flattened or not:
    # each is skipped with the count it would carry, nothing is registered, and @champion stays
    champion = registered
    config.write_text(LENIENT + "remediation:\n  strategy: [blend, rerank]\n  max_models: 1\n")
    proc = run_cli(*check_args("3", built["data"], config, built["uri"], "--report", report_path, "--promote"))
    report = read_report(report_path)
    assert proc.returncode == 1 and report["registered_version"] is None, proc.stdout + proc.stderr
    assert [(a["method"], a["verdict"]) for a in report["attempts"]] == [("blend", "skipped"), ("rerank", "skipped")]
    assert all("it would carry 4 models, over the budget of 1 (max_models)" in a["note"] for a in report["attempts"])
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == champion
    # with a budget of 2, the pair repair is flattened: it combines the candidate with v2, the generation the
    # champion stands in for (2 models), and is judged against the champion itself
    config.write_text(LENIENT + "remediation:\n  strategy: [blend, rerank]\n  max_models: 2\n")
    proc = run_cli(*check_args("3", built["data"], config, built["uri"], "--report", report_path))
    report = read_report(report_path)
    first = report["attempts"][0]
    assert first["method"] == "blend" and first["verdict"] != "skipped" and first["members"] == 2, report["attempts"]
    assert f"it combines v2, the generation v{champion} stands in for, with the candidate instead" in first["note"]
    assert "would carry 4 models, over the budget of 2" in first["note"] and first["note"] in proc.stderr
    assert report["ensemble"]["setting"]["combines"] == ["2", "3"]  # blend's, or rerank's after it
    # the Bayesian update is flattened the same way: over v2 and the candidate, tuned on a held-out share
    block = "remediation:\n  strategy: [bayesian-update]\n  generations: 2\n  max_models: 2\n  tuning_share: 0.4\n"
    config.write_text(LENIENT + block)
    proc = run_cli(*check_args("3", built["data"], config, built["uri"], "--id-column", "id", "--report", report_path))
    report = read_report(report_path)
    (attempt,) = report["attempts"]
    assert attempt["method"] == "bayesian-update" and attempt["verdict"] != "skipped", (attempt, proc.stderr)
    assert attempt["members"] == 2 and f"it combines v2, the generation v{champion} stands in for" in attempt["note"]
    assert report["ensemble"]["setting"]["versions"] == ["2", "3"] and report["baseline"]["version"] == champion
    assert report["baseline"]["version"] == champion  # judged against the champion, not against v2


def test_a_share_of_the_evaluation_set_held_out_tunes_the_repair_and_is_never_judged_on(store, tmp_path):
    """``tuning_share`` without a calibration file: the Bayesian update's confusion matrices and cost ratio
    are tuned on the held-out share, and the candidate and the repair are both judged on the rest only; the
    report and the run say which samples were used for what."""
    cfg = parse_config(LENIENT + "remediation:\n  strategy: [bayesian-update]\n  tuning_share: 0.4\n")
    result = run_gate(MODEL, store["data"], candidate="3", config=cfg, tracking_uri=store["uri"], id_column="id")
    everything = pd.read_csv(store["data"])
    samples = result.to_dict()["samples"]
    client = MlflowClient(tracking_uri=store["uri"])
    held = json.loads(Path(client.download_artifacts(result.run_id, "gate/tuning_ids.json", str(tmp_path))).read_text())
    held_ids = set(held["ids"])
    assert held["held_out_by"] == samples["held_out_by"] == "id" and samples["tuning_ids"] == "gate/tuning_ids.json"
    assert samples["tuning"] == len(held_ids) >= 30 and samples["judged"] + samples["tuning"] == len(everything)
    assert result.n == samples["judged"] and result.candidate_verdict == "failed"
    (attempt,) = result.attempts
    assert attempt["method"] == "bayesian-update" and attempt["verdict"] in ("passed", "failed", "rollback"), attempt
    tuned_on = f"the evaluation set's held-out share ({len(held_ids)} samples, tuning_share 0.4)"
    assert result.ensemble["setting"]["tuned_on"] == tuned_on
    for run_id in (result.run_id, attempt["run_id"]):  # the candidate's decision and the repair's
        judged = pd.read_csv(client.download_artifacts(run_id, "gate/flips.csv", str(tmp_path / run_id)))["id"]
        assert held_ids.isdisjoint(judged.astype(str)) and len(judged) == samples["judged"]


def test_a_share_too_small_to_tune_on_skips_the_repair_that_needs_it(store, tmp_path):
    """0.1 of 90 samples is too few to tune on: nothing is held out, the candidate is judged on every
    sample, the Bayesian update is skipped with the reason (one line), nothing is registered: exit 1."""
    config = tmp_path / "gate.yaml"
    config.write_text(LENIENT + "remediation:\n  strategy: [bayesian-update]\n  tuning_share: 0.1\n")
    report_path = tmp_path / "report.json"
    proc = run_cli(*check_args("3", store["data"], config, store["uri"], "--id-column", "id", "--report", report_path))
    report = read_report(report_path)
    assert proc.returncode == 1 and report["registered_version"] is None and "Traceback" not in proc.stderr
    every = len(pd.read_csv(store["data"]))
    assert report["n"] == every == report["samples"]["judged"] and report["samples"]["tuning"] == 0
    (attempt,) = report["attempts"]
    assert attempt["verdict"] == "skipped" and "each needs at least 30" in attempt["note"]
    skip_lines = [line for line in proc.stderr.splitlines() if line.startswith("bayesian-update: skipped")]
    assert len(skip_lines) == 1 and "tuning_share 0.1" in skip_lines[0]
    assert any(w.startswith("nothing held out to tune repairs on") for w in report["warnings"])
