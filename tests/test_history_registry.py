"""`consistency-gate history` on a real SQLite store with six registered generations of one
model, promoted by gates one after another (one candidate failing between them): the per-step and
cumulative figures equal a recomputation from the versions' own predictions."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import mlflow
import numpy as np
import pandas as pd
import pytest
from conftest import run_cli
from mlflow import MlflowClient
from registry_fixtures import iris_frames, sqlite_uri

from consistency_gate.gate.config import parse_config
from consistency_gate.gate.run import run_gate
from consistency_gate.mlops import tracking
from consistency_gate.report.schema import report_schema

MODEL = "iris-history"
PASS = parse_config("rules:\n  - {metric: acc, min: 0.5}\n")
FAIL = parse_config("rules:\n  - {metric: con, min: 1.0}\n")
# what each generation sees: a growing set of features and a changing regularisation, as retrains do
RECIPES = [
    (["sepal_length"], 1.0),
    (["sepal_length", "sepal_width"], 1.0),
    (["sepal_length", "petal_length"], 0.05),
    (["sepal_width", "petal_width"], 1.0),
    (["petal_length", "petal_width"], 0.02),
    (["sepal_length", "sepal_width", "petal_length", "petal_width"], 1.0),
]


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """v1..v6 registered; gates promote v2, v3, fail v4, promote v5 and v6: champions 1, 2, 3, 5, 6."""

    gates = (("2", PASS), ("3", PASS), ("4", FAIL), ("5", PASS), ("6", PASS))
    return gated_store(tmp_path_factory.mktemp("history"), MODEL, len(RECIPES), gates)


def gated_store(root: Path, name: str, versions: int, gates) -> dict:  # noqa: ANN001 - (version, config) pairs
    """A SQLite store in ``root`` with the first ``versions`` :data:`RECIPES` models registered as ``name``,
    v1 @champion, and a promoting gate of each ``(version, config)`` of ``gates`` in turn. Returns the URI,
    the models, the iris frames, the evaluation file and each gate's run id."""
    uri = sqlite_uri(root)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    tracking.use_experiment("training", uri)
    x, y = iris_frames()
    models = _recipe_models(x, y)[:versions]
    for model in models:
        _register(model, name)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.set_registered_model_alias(name, "champion", "1")
    data = root / "eval.csv"
    x.assign(label=y, id=[f"s{i}" for i in range(len(x))]).to_csv(data, index=False)
    runs = [
        run_gate(name, data, candidate=v, config=config, tracking_uri=uri, promote=True, id_column="id").run_id
        for v, config in gates
    ]
    return {"uri": uri, "models": models, "x": x, "y": y, "data": data, "runs": runs}


def _recipe_models(x: pd.DataFrame, y: pd.Series) -> list:
    """One model per :data:`RECIPES` entry: a model of some features that takes every column (the gate feeds
    it the whole frame)."""
    from sklearn.linear_model import LogisticRegression

    models = []
    for features, c in RECIPES:
        fitted = LogisticRegression(max_iter=500, C=c).fit(x[features], y)
        model = LogisticRegression(max_iter=500, C=c).fit(x, y)
        model.coef_ = np.zeros_like(model.coef_)
        model.coef_[:, [list(x.columns).index(f) for f in features]] = fitted.coef_
        model.intercept_ = fitted.intercept_
        models.append(model)
    return models


def _register(model, name: str = MODEL) -> str:
    with mlflow.start_run():
        info = mlflow.sklearn.log_model(
            model, name="model", registered_model_name=name, pip_requirements=["scikit-learn"],
            serialization_format="cloudpickle",
        )  # fmt: skip
    return str(info.registered_model_version)


def test_history_equals_a_recomputation_from_the_versions_predictions(gated, tmp_path):
    proc = run_cli("history", "--model", MODEL, "--tracking-uri", gated["uri"], "--format", "json", "--last", "3")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["champions"] == ["1", "2", "3", "5", "6"] and report["missing"] == []
    right = {str(v + 1): m.predict(gated["x"]) == gated["y"].to_numpy() for v, m in enumerate(gated["models"])}
    chain = report["champions"]
    expected = [int((right[a] & ~right[b]).sum()) for a, b in zip(chain, chain[1:], strict=False)]
    assert [s["negative_flips"] for s in report["steps"]] == expected and sum(expected) >= 5, expected
    assert [s["n"] for s in report["steps"]] == [150] * 4
    assert [s["accuracy"] for s in report["steps"]] == pytest.approx([right[v].mean() for v in chain[1:]])
    assert report["cumulative_negative_flips"] == sum(expected)
    ever = np.zeros(150, dtype=bool)
    for a, b in zip(chain, chain[1:], strict=False):
        ever |= right[a] & ~right[b]
    assert report["ever_regressed"] == pytest.approx(ever.mean())
    # the newest candidate (v6) against the last 3 champions before it: v2, v3, v5
    newest = report["newest_candidate"]
    assert newest["version"] == "6" and newest["against"] == ["2", "3", "5"]
    some = right["2"] | right["3"] | right["5"]
    assert newest["forgotten"] == pytest.approx((some & ~right["6"]).mean())
    failed = [g for g in report["gates"] if g["candidate"] == "4"]
    assert failed[0]["promoted_version"] is None and failed[0]["baseline"] == "3"
    assert failed[0]["negative_flips"] == int((right["3"] & ~right["4"]).sum())
    text = run_cli("history", "--model", MODEL, "--tracking-uri", gated["uri"])
    assert text.returncode == 0 and f"Cumulative negative flips: {sum(expected)} over 4 updates" in text.stdout
    jsonschema.validate(report, report_schema("history"))
    plot = tmp_path / "history.png"
    markdown = run_cli(
        "history", "--model", MODEL, "--tracking-uri", gated["uri"], "--format", "markdown", "--plot", plot
    )
    assert markdown.stdout.startswith(f"## consistency-gate history: {MODEL}: 5 champions")
    assert "| v1->v2 | 150 |" in markdown.stdout and plot.read_bytes()[:4] == b"\x89PNG"
    assert f"wrote the history plot to {plot}" in markdown.stderr


def test_a_growing_evaluation_set_counts_every_id_both_versions_answered(tmp_path):
    """Four generations gated one after another on an evaluation set that grows between gates (100, 125, 150
    samples): a version's answers are the union of every ledger that holds them (its own gate's and the
    gates that compared against it), so each update is counted over every id both versions answered,
    not over the samples of the version's own gate only."""
    uri = sqlite_uri(tmp_path)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    tracking.use_experiment("training", uri)
    x, y = iris_frames()
    models = _recipe_models(x, y)[:4]
    name = "iris-growing"
    for model in models:
        _register(model, name)
    MlflowClient(tracking_uri=uri, registry_uri=uri).set_registered_model_alias(name, "champion", "1")
    frame = x.assign(label=y, id=[f"s{i}" for i in range(len(x))])
    sizes = {"2": 100, "3": 125, "4": 150}
    for version, size in sizes.items():
        data = tmp_path / f"eval-{size}.csv"
        frame.head(size).to_csv(data, index=False)
        result = run_gate(name, data, candidate=version, config=PASS, tracking_uri=uri, promote=True, id_column="id")
        assert result.promoted is True
    report = json.loads(run_cli("history", "--model", name, "--tracking-uri", uri, "--format", "json").stdout)
    assert report["champions"] == ["1", "2", "3", "4"] and report["missing"] == []
    right = {str(v + 1): m.predict(x) == y.to_numpy() for v, m in enumerate(models)}
    # every id both versions answered: v1 and v2 share the first 100, v2 and v3 the first 125 (v2 was the
    # baseline on 125), v3 and v4 all 150
    shared = {"2": 100, "3": 125, "4": 150}
    expected = [int((right[str(int(v) - 1)] & ~right[v])[:n].sum()) for v, n in shared.items()]
    assert [s["n"] for s in report["steps"]] == list(shared.values())
    assert [s["negative_flips"] for s in report["steps"]] == expected and sum(expected) > 0, expected
    assert [g["n"] for g in report["gates"]] == list(shared.values())
    assert report["cumulative_negative_flips"] == sum(expected)
    assert [s["accuracy"] for s in report["steps"]] == pytest.approx([right[v][:n].mean() for v, n in shared.items()])


def test_history_of_a_model_never_gated_is_one_line_exit_4(gated):
    proc = run_cli("history", "--model", "no-such-model", "--tracking-uri", gated["uri"])
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: model 'no-such-model': no finished gate run in experiment 'consistency-gate/no-such-model' to read "
        "a history from; gate a version first (consistency-gate check --model ...)"
    ]
    bad = run_cli("history", "--model", MODEL, "--tracking-uri", gated["uri"], "--last", "0")
    assert bad.returncode == 2 and "--last" in bad.stderr


def test_a_ledger_is_logged_by_every_gate(gated):
    client = MlflowClient(tracking_uri=gated["uri"])
    experiment = client.get_experiment_by_name(f"consistency-gate/{MODEL}")
    for run in client.search_runs([experiment.experiment_id]):
        ledger = pd.read_parquet(client.download_artifacts(run.info.run_id, "gate/answers.parquet"))
        assert list(ledger.columns) == ["id", "label", "previous", "candidate"] and len(ledger) == 150


def test_forgotten_and_ctoi_excess_rules_decide_a_gate(gated, tmp_path):
    """A candidate (v8, the first generation's recipe again) against @champion v6, with a
    replica of v6 (another regularisation, the same features) as its seed-noise floor: `forgotten` over
    the last 3 champions and `ctoi_excess` equal a recomputation from the versions' own predictions,
    and their rules decide the gate."""
    from sklearn.linear_model import LogisticRegression

    x, y = gated["x"], gated["y"].to_numpy()
    mlflow.set_tracking_uri(gated["uri"])
    mlflow.set_registry_uri(gated["uri"])
    replica = LogisticRegression(max_iter=500, C=0.3).fit(x, y)
    floor = _register(replica)
    candidate = _register(gated["models"][0])
    config = tmp_path / "gate.yaml"
    config.write_text(
        "rules:\n  - {metric: forgotten, max: 0.03, history: 3, decide: upper}\n"
        "  - {metric: ctoi_excess, max: 0.005, decide: upper}\n"
    )
    report_path = tmp_path / "report.json"
    proc = run_cli(
        "check", "--model", MODEL, "--candidate", candidate, "--data", gated["data"], "--id-column", "id",
        "--config", config, "--tracking-uri", gated["uri"], "--floor", floor, "--report", report_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads(report_path.read_text())
    right = {str(v + 1): m.predict(x) == y for v, m in enumerate(gated["models"])}
    cand, base, rep = gated["models"][0].predict(x) == y, right["6"], replica.predict(x) == y
    some = right["3"] | right["5"] | right["6"]  # the last 3 champions: v3, v5 and the baseline v6
    assert report["metrics"]["forgotten"] == pytest.approx((some & ~cand).mean())
    assert report["metrics"]["ctoi_excess"] == pytest.approx((base & ~cand).mean() - (base & ~rep).mean())
    assert report["metrics"]["floor_ctoi"] == pytest.approx((base & ~rep).mean())
    rules = {r["metric"]: r for r in report["rules"]}
    assert rules["forgotten"]["held"] is False and rules["forgotten"]["history"] == 3
    assert rules["ctoi_excess"]["held"] is False
    low, high = report["intervals"]["ctoi_excess"]
    assert low <= report["metrics"]["ctoi_excess"] <= high
    assert "Seed-noise floor: a replica of the baseline" in proc.stdout and "forgotten <= 0.03" in proc.stdout
    # the champions' updates and the candidate's, drawn in the run and its HTML report
    client = MlflowClient(tracking_uri=gated["uri"])
    drawn = {a.path for a in client.list_artifacts(report["run_id"], "gate/plots")}
    assert "gate/plots/history.png" in drawn
    logged = json.loads(
        Path(client.download_artifacts(report["run_id"], "gate/history.json", str(tmp_path))).read_text()
    )
    assert logged["champions"] == ["1", "2", "3", "5", "6"] and logged["candidate"] == candidate
    assert logged["steps"][-1]["negative_flips"] == int((base & ~cand).sum())
    # the floor as the replica's prediction file (compare's format, rows shuffled, aligned by id) gives the same
    ids = [f"s{i}" for i in range(len(x))]
    scores = (
        pd.DataFrame(replica.predict_proba(x), columns=replica.classes_).assign(id=ids).sample(frac=1, random_state=0)
    )
    scores.to_csv(tmp_path / "replica.csv", index=False)
    again = tmp_path / "again.json"
    run_cli(
        "check", "--model", MODEL, "--candidate", candidate, "--data", gated["data"], "--id-column", "id",
        "--config", config, "--tracking-uri", gated["uri"], "--floor", tmp_path / "replica.csv", "--report", again,
    )  # fmt: skip
    from_file = json.loads(again.read_text())
    assert from_file["metrics"]["ctoi_excess"] == pytest.approx(report["metrics"]["ctoi_excess"])
    assert from_file["intervals"]["ctoi_excess"] == pytest.approx(report["intervals"]["ctoi_excess"])


def test_a_floor_that_is_the_baseline_is_refused(gated, tmp_path):
    config = tmp_path / "gate.yaml"
    config.write_text("floor: 6\nrules:\n  - {metric: ctoi_excess, max: 0.005}\n")
    proc = run_cli(
        "check", "--model", MODEL, "--candidate", "4", "--data", gated["data"], "--id-column", "id",
        "--config", config, "--tracking-uri", gated["uri"],
    )  # fmt: skip
    assert proc.returncode == 2 and "floor: v6 is the baseline" in proc.stderr.strip().splitlines()[-1]


def test_the_bayesian_update_repairs_a_candidate_over_three_generations(gated, tmp_path):
    """`method: bayesian-update` combines v5, v6 (@champion) and the poor v4 through their
    confusion matrices on calibration data (noisy copies of the samples, never the evaluation set),
    keeps v6's answer unless the belief says otherwise, registers one pyfunc carrying the three models
    (it predicts what was gated: checked by the gate in a fresh load) and gates it like any repair."""
    rng = np.random.default_rng(1)
    calibration = tmp_path / "calibration.csv"
    noisy = gated["x"] + rng.normal(0, 0.15, size=gated["x"].shape)
    noisy.assign(label=gated["y"]).to_csv(calibration, index=False)
    config = tmp_path / "gate.yaml"
    config.write_text(
        "rules:\n  - {metric: ctoi, max: 0.01}\n"
        f"remediation:\n  strategy: [bayesian-update]\n  calibration: {calibration}\n  generations: 3\n"
    )
    report_path = tmp_path / "report.json"
    proc = run_cli(
        "check", "--model", MODEL, "--candidate", "4", "--data", gated["data"], "--id-column", "id",
        "--config", config, "--tracking-uri", gated["uri"], "--report", report_path,
    )  # fmt: skip
    report = json.loads(report_path.read_text())
    assert report.get("candidate_verdict") == "failed", (report.get("error"), proc.stderr[-3000:])
    (attempt,) = report["attempts"]
    assert attempt["method"] == "bayesian-update", attempt
    repair = report["ensemble"]
    assert repair["setting"]["versions"] == ["5", "6", "4"] and repair["members"] == 3
    assert repair["metrics"]["ctoi"] < report["metrics"]["ctoi"]  # it keeps the champion's right answers
    if repair["verdict"] == "passed":
        assert proc.returncode == 0 and report["registered_version"] is not None
        version = MlflowClient(tracking_uri=gated["uri"]).get_model_version(MODEL, report["registered_version"])
        assert version.tags["consistency_gate.kind"] == "bayesian-update"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda scores: scores.head(0), "replica.csv: no rows of floor predictions (a header only)"),
        (
            lambda scores: scores.rename(columns={"setosa": "Setosa"}),
            "replica.csv: the floor's class columns Setosa, versicolor, virginica are not the baseline's classes",
        ),
    ],
    ids=["header only", "a class column renamed"],
)
def test_a_bad_floor_file_is_one_line_naming_it(gated, tmp_path, damage, message):
    """A floor prediction file that cannot be the replica's answers is exit 3 naming that file (not the
    evaluation data, not exit 6)."""
    x = gated["x"]
    model = gated["models"][5]
    scores = pd.DataFrame(model.predict_proba(x), columns=model.classes_).assign(id=[f"s{i}" for i in range(len(x))])
    damage(scores).to_csv(tmp_path / "replica.csv", index=False)
    config = tmp_path / "gate.yaml"
    config.write_text(f"floor: {tmp_path / 'replica.csv'}\nrules:\n  - {{metric: ctoi_excess, max: 0.5}}\n")
    proc = run_cli(
        "check", "--model", MODEL, "--candidate", "4", "--data", gated["data"], "--id-column", "id",
        "--config", config, "--tracking-uri", gated["uri"],
    )  # fmt: skip
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 3 and message in last and "Traceback" not in proc.stderr, proc.stderr
