"""The memory of what users saw, through the gate on a real SQLite registry: ten generations of a digits
classifier, each gated with `check --promote` and a population; what each memory version serves and the
cumulative negative flips are recomputed by hand from the raw versions' own predictions; the memory answers a
real `mlflow models serve` request by id as its table says; bad populations are one-line errors."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from conftest import read_report, run_cli, start_cli
from mlflow import MlflowClient
from mlflow_server import free_port
from registry_fixtures import sqlite_uri

pytestmark = pytest.mark.slow  # ten generations registered, gated and loaded back

MODEL = "digits-memory"
GENERATIONS = 10
COST_RATIO = 2.0
RULES = "rules:\n  - {metric: ctoi, max: 0.2}\n  - {metric: acc, min_delta: -0.2}\nks: [1]\n"


def _config(root, population):
    text = RULES + (
        "remediation:\n  strategy: [memory]\n  tuning_share: 0.3\n"
        f"  options:\n    memory: {{population: {population}, cost_ratio: {COST_RATIO}, update: independent}}\n"
    )
    (root / "gate.yaml").write_text(text)
    return root / "gate.yaml"


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """Ten generations (logistic regressions on 150 random digits each), gated in turn with a population."""
    from mlflow.models import infer_signature
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    root = tmp_path_factory.mktemp("memory")
    uri = sqlite_uri(root)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    mlflow.set_experiment("training")  # not the experiment an earlier test in this worker made active
    digits = load_digits()
    x = pd.DataFrame(digits.data, columns=[f"p{i}" for i in range(64)])
    y = pd.Series(digits.target.astype(str))
    ids = pd.Series([f"d{i}" for i in range(len(x))])
    population = x.assign(id=ids)
    population.to_csv(root / "population.csv", index=False)
    evaluation = population.iloc[:600].assign(label=y.iloc[:600])  # the labelled share of the population
    evaluation.to_csv(root / "eval.csv", index=False)
    config = _config(root, root / "population.csv")
    signature = infer_signature(x, np.zeros((2, 10)))
    rng = np.random.default_rng(0)
    client = MlflowClient(tracking_uri=uri)
    raw, reports = [], []
    for generation in range(1, GENERATIONS + 1):
        rows = rng.choice(len(x), 150, replace=False)
        model = LogisticRegression(max_iter=300).fit(x.iloc[rows], y.iloc[rows])
        with mlflow.start_run():
            info = mlflow.sklearn.log_model(
                model, name="model", registered_model_name=MODEL, signature=signature,
                pip_requirements=["scikit-learn"], pyfunc_predict_fn="predict_proba",
                serialization_format="cloudpickle",
            )  # fmt: skip
        version = str(info.registered_model_version)
        raw.append((version, model))
        if generation == 1:
            client.set_registered_model_alias(MODEL, "champion", version)
            continue
        report_path = root / f"report{generation}.json"
        proc = run_cli(
            "check", "--model", MODEL, "--candidate", version, "--data", root / "eval.csv", "--config", config,
            "--tracking-uri", uri, "--id-column", "id", "--promote", "--report", report_path,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        reports.append(read_report(report_path))
    return {"uri": uri, "root": root, "x": x, "y": y, "ids": ids, "raw": raw, "reports": reports, "client": client}


def _by_hand(history):
    """The answers users see after each generation, recomputed from the raw versions' predictions: add-one
    confusion matrices on the held-out ids, each id's belief the product of its answers' likelihoods, and the
    answer seen changed only when another class is more than COST_RATIO times as likely."""
    client, first = history["client"], history["reports"][0]
    path = client.download_artifacts(first["run_id"], "gate/tuning_ids.json", str(history["root"]))
    held = json.loads(Path(path).read_text())
    held = set(held["ids"] if isinstance(held, dict) else held)
    x, y, ids = history["x"], history["y"].to_numpy(), history["ids"].to_numpy()
    classes = [str(c) for c in range(10)]
    tuning = np.isin(ids, list(held))
    belief, shown, served = None, None, []
    for _, model in history["raw"]:
        answers = model.predict(x).astype(str)
        counts = np.ones((10, 10))
        for truth, said in zip(y[tuning], answers[tuning], strict=True):
            counts[classes.index(truth), classes.index(said)] += 1
        matrix = counts / counts.sum(axis=1, keepdims=True)
        index = np.array([classes.index(a) for a in answers])
        likelihood = matrix[:, index].T
        if belief is None:
            belief, shown = likelihood / likelihood.sum(axis=1, keepdims=True), index
        else:
            belief = belief * likelihood
            belief /= belief.sum(axis=1, keepdims=True)
            best = belief.argmax(axis=1)
            change = belief[np.arange(len(ids)), best] > COST_RATIO * belief[np.arange(len(ids)), shown]
            shown = np.where(change, best, shown)
        served.append(np.array(classes)[shown])
    return served, tuning


def test_ten_generations_serve_what_the_memory_says_and_flip_far_less_than_replacing(history):
    reports, client = history["reports"], history["client"]
    assert [r["outcome"] for r in reports] == ["remediated"] * (GENERATIONS - 1)
    assert all(r["promoted"] and r["ensemble"]["kind"] == "memory" and r["ensemble"]["members"] == 1 for r in reports)
    assert reports[0]["ensemble"]["setting"]["from"].endswith("'s answers")  # the first memory: v1's answers
    assert all(r["ensemble"]["setting"]["from"].endswith("'s memory") for r in reports[1:])
    served_by_hand, tuning = _by_hand(history)
    population = history["x"].assign(id=history["ids"])
    for number, report in enumerate(reports, start=2):
        version = report["registered_version"]
        served = mlflow.pyfunc.load_model(f"models:/{MODEL}/{version}").predict(population)
        answers = served.idxmax(axis=1).to_numpy()
        disagree = int((answers != served_by_hand[number - 1]).sum())
        assert disagree <= 2, f"generation {number}: {disagree} ids served other than by hand"  # float32 ties
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == reports[-1]["registered_version"]
    # cumulative negative flips on ids that neither tuned nor were judged on (the population beyond the eval set)
    y = history["y"].to_numpy()
    unseen = np.arange(len(y)) >= 600
    replacing = [m.predict(history["x"]).astype(str) for _, m in history["raw"]]

    def flips(sequence):
        return sum(int(((a == y) & (b != y) & unseen).sum()) for a, b in zip(sequence, sequence[1:], strict=False))

    remembered, replaced = flips(served_by_hand), flips(replacing)
    assert remembered * 3 < replaced, (remembered, replaced)  # the benchmark measures the ratio; here: far fewer
    accuracy = {name: float((seq[-1] == y)[unseen].mean()) for name, seq in (("memory", served_by_hand),
                                                                             ("replace", replacing))}  # fmt: skip
    assert accuracy["memory"] > accuracy["replace"] - 0.05, accuracy


def _asked(url: str, history) -> tuple[pd.DataFrame, list[str]]:
    """Three ids of the population and one it has never seen, asked of a scoring server at ``url`` (MLflow's
    protocol); the rows and the answers (each row's highest score)."""
    population = history["x"].assign(id=history["ids"]).iloc[[0, 700, 1500]]
    frame = pd.concat([population, population.iloc[[0]].assign(id="a-new-item")])
    body = json.dumps({"dataframe_split": json.loads(frame.to_json(orient="split"))})
    request = urllib.request.Request(f"{url}/invocations", body.encode(), {"Content-Type": "application/json"})
    answer = json.loads(urllib.request.urlopen(request, timeout=60).read())["predictions"]
    return frame, [max(row, key=row.get) for row in answer]


def _expected(history, version: str, frame: pd.DataFrame) -> list[str]:
    """What a memory version answers: its table's answer for the three known ids, the model's for the new one."""
    table = mlflow.pyfunc.load_model(f"models:/{MODEL}/{version}").unwrap_python_model().memory
    known = np.array(table.classes)[table.shown[table.find(frame["id"].iloc[:3])]].tolist()
    return [*known, history["raw"][-1][1].predict(frame.iloc[[3]].drop(columns=["id"]))[0]]


def test_the_memory_answers_a_real_mlflow_models_serve_request_by_id(history, tmp_path):
    version = history["reports"][-1]["registered_version"]
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": history["uri"]}
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "models", "serve", "-m", f"models:/{MODEL}/{version}", "--env-manager",
         "local", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(3000):  # the server's /ping: up (a bound only ends a test that hangs)
            try:
                urllib.request.urlopen(f"{url}/ping", timeout=5)
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
                time.sleep(0.1)
        frame, answers = _asked(url, history)
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
    assert answers == _expected(history, version, frame)  # a known id: the table's answer; a new one: the model's


def test_shadow_serve_answers_from_the_champions_memory_and_captures_a_plain_candidate(history, tmp_path):
    """`shadow serve` with a memory version as @champion: users get the table's answers by id (the model's for
    a new id); the candidate, a plain model, is given the same rows (the id column beside its own columns) and
    its answers are captured beside the champion's."""
    champion = str(MlflowClient(history["uri"]).get_model_version_by_alias(MODEL, "champion").version)
    candidate, model = history["raw"][-1]
    port, capture = free_port(), tmp_path / "capture"
    server = start_cli("shadow", "serve", "--model", MODEL, "--candidate", candidate, "--capture", capture,
                       "--port", str(port), "--tracking-uri", history["uri"])  # fmt: skip
    try:
        said = []
        for line in server.stderr:  # its own signal that it serves, however long the models take to load
            said.append(line)
            if line.startswith("serving "):
                break
        else:
            raise AssertionError(f"shadow serve ended (exit {server.wait()}): {''.join(said)[-2000:]}")
        frame, answers = _asked(f"http://127.0.0.1:{port}", history)
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate()
    assert server.returncode == 0, err
    assert answers == _expected(history, champion, frame)
    captured = pd.read_parquet(capture).sort_values("id")
    assert captured["champion"].tolist() == answers
    assert captured["candidate"].tolist() == model.predict(frame.drop(columns=["id"])).tolist()


@pytest.mark.parametrize(
    ("population", "message"),
    [
        (lambda x: x, "the population has no id column 'id'"),
        (lambda x: x.assign(id=["a"] * len(x)), "id 'a' appears"),
        (lambda x: x.drop(columns=["p3"]).assign(id=range(len(x))), "lacks the column 'p3' the model reads"),
        (lambda x: x.iloc[:0].assign(id=[]), "the population has no rows; a memory remembers the answers users see"),
    ],
    ids=["no ids", "repeated ids", "other columns", "no rows"],
)
def test_a_bad_population_is_one_line_and_nothing_is_promoted(history, tmp_path, population, message):
    bad = tmp_path / "population.csv"
    population(history["x"]).to_csv(bad, index=False)
    config = _config(tmp_path, bad)
    client = history["client"]
    before = str(client.get_model_version_by_alias(MODEL, "champion").version)
    version = history["raw"][-1][0]
    proc = run_cli(
        "check", "--model", MODEL, "--candidate", version, "--data", history["root"] / "eval.csv", "--config", config,
        "--tracking-uri", history["uri"], "--id-column", "id", "--promote",
    )  # fmt: skip
    assert proc.returncode == 3 and message in proc.stderr.strip().splitlines()[-1], proc.stderr
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == before


def test_a_damaged_memory_of_the_champion_is_one_line_and_nothing_is_promoted(history, tmp_path):
    """The champion's table, damaged in the artifact store: exit 4 naming the version, the alias where it was."""
    client = history["client"]
    champion = str(client.get_model_version_by_alias(MODEL, "champion").version)
    source = mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{MODEL}/{champion}", dst_path=str(tmp_path))
    served = next(Path(source).rglob("memory.parquet")).read_bytes()
    table = next(
        p for p in history["root"].rglob("memory.parquet") if p.read_bytes() == served and tmp_path not in p.parents
    )
    original = table.read_bytes()
    table.write_bytes(original[:64])
    try:
        proc = run_cli(
            "check", "--model", MODEL, "--candidate", history["raw"][-1][0], "--data", history["root"] / "eval.csv",
            "--config", _config(tmp_path, history["root"] / "population.csv"), "--tracking-uri", history["uri"],
            "--id-column", "id", "--promote",
        )  # fmt: skip
    finally:
        table.write_bytes(original)
    line = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 4 and line.startswith(f"error: models:/{MODEL}/{champion}: cannot load the model"), line
    assert "memory.parquet: the memory table cannot be read" in line and "roll back to the version before it" in line
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == champion


def test_a_rollback_restores_the_previous_memory_table_and_model_together(history):
    """The last gate's memory rolled back: @champion holds the memory before it, which serves its own table."""
    reports, client = history["reports"], history["client"]
    proc = run_cli("rollback", "--model", MODEL, "--tracking-uri", history["uri"], "--reason", "test")
    assert proc.returncode == 0, proc.stderr
    before = reports[-2]["registered_version"]
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == before
    served_by_hand, _ = _by_hand(history)
    population = history["x"].assign(id=history["ids"])
    answers = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion").predict(population).idxmax(axis=1).to_numpy()
    assert int((answers != served_by_hand[-2]).sum()) <= 2  # what users saw before the last gate


def test_a_memory_that_fails_keeps_the_champion_even_when_the_candidate_passed_alone(history, tmp_path):
    """What deploys is the memory: a candidate that passes its rules is not deployed without it (here the memory
    is over a size rule the candidate meets: the model and its table are larger than the model)."""
    client = history["client"]
    before = str(client.get_model_version_by_alias(MODEL, "champion").version)
    config = _config(tmp_path, history["root"] / "population.csv")
    config.write_text(config.read_text().replace("rules:\n", "rules:\n  - {metric: size_ratio, max: 1.0}\n", 1))
    report_path = tmp_path / "report.json"
    proc = run_cli(
        "check", "--model", MODEL, "--candidate", history["raw"][-1][0], "--data", history["root"] / "eval.csv",
        "--config", config, "--tracking-uri", history["uri"], "--id-column", "id", "--promote", "--report", report_path,
    )  # fmt: skip
    report = read_report(report_path)
    assert proc.returncode == 1, proc.stderr
    assert report["candidate_verdict"] == "passed" and report["verdict"] == "failed" and report["outcome"] == "failed"
    assert report["ensemble"]["verdict"] == "failed" and report["passed_version"] is None and not report["promoted"]
    assert f"{MODEL} v{history['raw'][-1][0]} PASSED; the memory FAILED, so nothing deploys" in proc.stdout
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == before


def test_a_memory_of_the_scores_with_decay_updates_the_champions_table_by_them(history, tmp_path):
    """likelihood: scores and decay: 0.5: each id's belief is the champion memory's, halved, plus the log of the
    candidate's class scores (by hand, from the two tables and the candidate's own scores); nothing promoted."""
    config = _config(tmp_path, history["root"] / "population.csv")
    config.write_text(config.read_text().replace("cost_ratio: 2.0", "cost_ratio: 2.0, likelihood: scores, decay: 0.5"))
    report_path = tmp_path / "report.json"
    candidate = history["raw"][-1][0]
    proc = run_cli(
        "check", "--model", MODEL, "--candidate", candidate, "--data", history["root"] / "eval.csv",
        "--config", config, "--tracking-uri", history["uri"], "--id-column", "id", "--report", report_path,
    )  # fmt: skip
    report = read_report(report_path)
    assert proc.returncode == 0 and report["registered_version"] and not report["promoted"], proc.stderr
    setting = report["ensemble"]["setting"]
    assert (setting["likelihood"], setting["decay"], setting["cost_ratio"]) == ("scores", 0.5, 2.0)
    champion = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion").unwrap_python_model().memory
    built = mlflow.pyfunc.load_model(f"models:/{MODEL}/{report['registered_version']}").unwrap_python_model().memory
    population = history["x"].assign(id=history["ids"])
    scores = mlflow.pyfunc.load_model(f"models:/{MODEL}/{candidate}").predict(history["x"])
    ids = population["id"].to_numpy()
    expected = 0.5 * champion.log_belief[champion.find(ids)] + np.log(np.clip(scores, 1e-6, 1.0))
    expected -= expected.max(axis=1, keepdims=True)
    assert np.allclose(built.log_belief[built.find(ids)], expected, atol=1e-4)


def test_each_memory_says_which_rows_of_the_population_it_was_built_from(history):
    """The run of each memory logs the rows of the population it read (a file appended to while the gate reads
    it would be said to have changed: tests/test_memory.py), and how often the candidate repeated the wrong
    answers users saw against what independence predicts."""
    client = history["client"]
    repeats = []
    for report in history["reports"]:
        (attempt,) = report["attempts"]
        params = client.get_run(attempt["run_id"]).data.params
        assert params["population_read"] == f"{len(history['x']):,} rows of population.csv"
        repeats.append((float(params["repeats_repeats"]), float(params["repeats_if_independent"])))
        assert "of the wrong answers users saw" in report["ensemble"]["described"]["title"], report["ensemble"]
    # how correlated the retrains are, measured at every gate: they repeat the wrong answers users saw far more
    # often than independent generations with their confusion matrices would (here 10-46% against 5-11%)
    assert sum(r for r, _ in repeats) > 2 * sum(i for _, i in repeats)


def test_a_memory_id_column_the_data_lacks_names_both_columns_not_a_missing_option(history, tmp_path):
    """``id_column: nosuch`` with the gate's ``--id-column id``: the line names the memory's option and the gate's
    column (it said "give the gate --id-column" although it was given); exit 3, nothing promoted."""
    config = _config(tmp_path, history["root"] / "population.csv")
    config.write_text(config.read_text().replace("cost_ratio:", "id_column: nosuch, cost_ratio:"))
    client = history["client"]
    before = str(client.get_model_version_by_alias(MODEL, "champion").version)
    proc = run_cli(
        "check", "--model", MODEL, "--candidate", history["raw"][-1][0], "--data", history["root"] / "eval.csv",
        "--config", config, "--tracking-uri", history["uri"], "--id-column", "id", "--promote",
    )  # fmt: skip
    line = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 3, proc.stderr
    assert "no column 'nosuch', the memory's id column (options: memory: id_column)" in line
    assert "the gate's --id-column is 'id'" in line and "give the gate --id-column" not in line
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == before


def test_a_correlated_memory_logs_how_much_the_candidate_repeats_what_users_saw(history, tmp_path):
    """``update: correlated``: the gate estimates on the tuning share how often the candidate answers the true class
    where users saw it, repeats what they saw where that was wrong, and corrects it, logs the three on the memory's
    run, and builds the memory with them (registered without --promote, the champion untouched)."""
    config = _config(tmp_path, history["root"] / "population.csv")
    config.write_text(config.read_text().replace("update: independent", "update: correlated"))
    client = history["client"]
    before = str(client.get_model_version_by_alias(MODEL, "champion").version)
    report = tmp_path / "report.json"
    proc = run_cli(
        "check", "--model", MODEL, "--candidate", history["raw"][-1][0], "--data", history["root"] / "eval.csv",
        "--config", config, "--tracking-uri", history["uri"], "--id-column", "id", "--report", report,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    (attempt,) = read_report(report)["attempts"]
    params = client.get_run(attempt["run_id"]).data.params
    assert params["update"] == "correlated"
    right, repeats, corrects = (float(params[f"repeats_{k}"]) for k in ("right", "repeats", "corrects"))
    assert 0.5 < right < 1 and 0 < repeats < 1 and 0 < corrects < 1 and repeats + corrects < 1
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == before


def _tuning_ids(history) -> list[str]:
    client, first = history["client"], history["reports"][0]
    path = client.download_artifacts(first["run_id"], "gate/tuning_ids.json", str(history["root"]))
    held = json.loads(Path(path).read_text())
    return list(held["ids"] if isinstance(held, dict) else held)


def test_each_memory_carries_every_generations_answers_on_the_tuning_ids(history):
    """The last gate's memory carries the history its successors replay: the ten generations' answers on the
    tuning ids, oldest first, each the raw version's own prediction there."""
    held = _tuning_ids(history)
    last = history["reports"][-1]["registered_version"]
    carried = mlflow.pyfunc.load_model(f"models:/{MODEL}/{last}").unwrap_python_model().history
    assert sorted(carried.ids) == sorted(held) and carried.answers.shape == (GENERATIONS, len(held))
    position = {i: k for k, i in enumerate(history["ids"])}
    rows = np.array([position[i] for i in carried.ids])
    for generation, (_, model) in enumerate(history["raw"]):
        by_hand = model.predict(history["x"].iloc[rows]).astype(int)
        assert carried.answers[generation].tolist() == by_hand.tolist(), generation


def test_the_replayed_setting_reads_the_tuning_ids_only(history, tmp_path):
    """With update: and cost_ratio: left to it, the gate replays the history (the champion's generations and the
    candidate) on the tuning ids and deploys the setting it chose; the judged ids' labels changed, the judged
    figures (CtoI) change and the choice does not. Replacing's negative flips on the tuning ids are counted by hand."""
    config = tmp_path / "gate.yaml"
    config.write_text(
        RULES + "remediation:\n  strategy: [memory]\n  tuning_share: 0.3\n"
        f"  options:\n    memory: {{population: {history['root'] / 'population.csv'}}}\n"
    )
    held = set(_tuning_ids(history))
    carried = len(mlflow.pyfunc.load_model(f"models:/{MODEL}@champion").unwrap_python_model().history.answers)
    evaluation = pd.read_csv(history["root"] / "eval.csv", dtype={"label": str})
    judged = ~evaluation["id"].isin(held)
    relabelled = evaluation.assign(label=evaluation["label"].where(~judged, ((evaluation["label"].astype(int) + 1)
                                                                             % 10).astype(str)))  # fmt: skip
    relabelled.to_csv(tmp_path / "relabelled.csv", index=False)
    settings, judged_figures = [], []
    for data in (history["root"] / "eval.csv", tmp_path / "relabelled.csv"):
        report = tmp_path / f"{data.stem}.json"
        proc = run_cli(
            "check", "--model", MODEL, "--candidate", history["raw"][-1][0], "--data", data, "--config", config,
            "--tracking-uri", history["uri"], "--id-column", "id", "--report", report,
        )  # fmt: skip
        assert proc.returncode in (0, 1), proc.stderr
        read = read_report(report)
        settings.append(read["ensemble"]["setting"])
        title = read["ensemble"]["described"]["title"]
        judged_figures.append(read["metrics"]["ctoi"])
    replayed = [{k: v for k, v in s.items() if k.startswith("replayed_")} for s in settings]
    assert replayed[0] == replayed[1] and judged_figures[0] != judged_figures[1]
    chosen = replayed[0]
    assert (chosen["replayed_generations"], chosen["replayed_ids"], chosen["replayed_settings"]) == (
        carried, len(held), 16)  # fmt: skip
    assert settings[0]["cost_ratio"] == chosen["replayed_cost_ratio"]
    assert settings[0]["update"] == chosen["replayed_update"]
    assert settings[0]["cost_ratio_from"] == f"replayed over {carried} gates on {len(held)} tuning ids"
    said = f"; chosen by replaying {carried} gates on {len(held)} tuning ids: {chosen['replayed_flips']} negative"
    assert said in title
    ordered = sorted(held)
    position = {i: k for k, i in enumerate(history["ids"])}
    rows = np.array([position[i] for i in ordered])
    truth = history["y"].to_numpy()[rows]
    answers = [m.predict(history["x"].iloc[rows]) for _, m in [*history["raw"][:carried], history["raw"][-1]]]
    by_hand = sum(int(((a == truth) & (b != truth)).sum()) for a, b in zip(answers, answers[1:], strict=False))
    assert chosen["replayed_replace_flips"] == by_hand
