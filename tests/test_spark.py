"""`compare --engine spark` and `check --engine spark` on local Spark equal the in-process results;
their input errors."""

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import run_cli

pytest.importorskip("pyspark")

from registry_fixtures import MODEL, build_store, check_args  # noqa: E402

from consistency_gate.engines.local import compare_files  # noqa: E402
from consistency_gate.engines.spark import compare_spark  # noqa: E402
from consistency_gate.errors import DataError  # noqa: E402
from consistency_gate.gate.run import run_gate  # noqa: E402

pytestmark = pytest.mark.slow  # a local Spark session per module


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("spark")
    rng = np.random.default_rng(0)
    n, classes = 2000, ["a", "b", "c", "d", "e", "f"]
    y = rng.integers(0, 6, n)
    ids = [f"s{i}" for i in range(n)]
    a, b = rng.random((n, 6)), rng.random((n, 6))
    a[np.arange(n), y] += 0.6
    b[np.arange(n), y] += 0.5
    pd.DataFrame({"id": ids, "label": np.array(classes)[y]}).to_csv(root / "labels.csv", index=False)
    pd.DataFrame(a, columns=classes).assign(id=ids).to_csv(root / "prev.csv", index=False)
    cand = pd.DataFrame(b, columns=classes[::-1]).assign(id=ids).sample(frac=1, random_state=1)
    (root / "cand.parquet").mkdir()
    for i, start in enumerate(range(0, n, 700)):  # a Parquet directory, as Spark writes them
        cand.iloc[start : start + 700].to_parquet(root / "cand.parquet" / f"part-{i}.parquet", index=False)
    return root


def test_spark_equals_in_process(files):
    args = (files / "labels.csv", files / "prev.csv", files / "cand.parquet")
    local = compare_files(*args, id_column="id", ks=[1, 3], slices=["true_class"])
    spark = compare_spark(*args, id_column="id", ks=[1, 3], partitions=2, slices=["true_class"])
    assert spark.n == local.n == 2000
    assert spark.classes == local.classes and spark.unknown_labels == local.unknown_labels
    for key, value in local.metrics.items():
        assert spark.metrics[key] == pytest.approx(value, abs=1e-9), key
    assert [(s.name, s.n) for s in spark.slices] == [(s.name, s.n) for s in local.slices]
    assert len(local.slices) == 6 and sum(s.n for s in local.slices) == 2000
    for got, want in zip(spark.slices, local.slices, strict=True):
        assert got.intervals.keys() == want.intervals.keys()
        for key, value in want.intervals.items():
            assert got.intervals[key] == pytest.approx(value, abs=1e-9), (want.name, key)


def _spark_compare(files, candidate) -> tuple:
    """Arguments of `compare --engine spark` on the fixture's labels and previous generation."""
    return (
        "compare",
        "--labels",
        files / "labels.csv",
        "--previous",
        files / "prev.csv",
        "--candidate",
        candidate,
        "--id-column",
        "id",
        "--engine",
        "spark",
    )


def test_spark_cli_and_errors(files, tmp_path):
    proc = run_cli(*_spark_compare(files, files / "cand.parquet"), "--format", "json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["n"] == 2000
    bad = tmp_path / "bad.parquet"
    bad.mkdir()
    pd.DataFrame({"id": ["s0"], "a": [0.5]}).to_parquet(bad / "part-0.parquet")
    pd.DataFrame({"id": ["s1"], "a": ["x"]}).to_parquet(bad / "part-1.parquet")
    with pytest.raises(DataError, match="part-1.parquet: its schema differs"):
        compare_spark(files / "labels.csv", files / "prev.csv", bad, id_column="id")
    proc = run_cli(*_spark_compare(files, bad))
    assert proc.returncode == 3 and "schema differs" in proc.stderr


def test_missing_pyspark_is_a_usage_error(files, tmp_path):
    blocker = tmp_path / "block"
    (blocker / "pyspark").mkdir(parents=True)
    (blocker / "pyspark" / "__init__.py").write_text("raise ImportError('pyspark is not installed')\n")
    env = {**os.environ, "PYTHONPATH": f"{blocker}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = run_cli(*_spark_compare(files, files / "cand.parquet"), env=env)
    assert proc.returncode == 2 and "pip install 'consistency-gate[spark]'" in proc.stderr


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The gate tests' registry, its sklearn versions logged to predict probabilities through pyfunc."""
    root = tmp_path_factory.mktemp("spark-store")
    store = build_store(root, predict_fn="predict_proba")
    (root / "gate.yaml").write_text("rules:\n  - {metric: con, min: 0.9}\n  - {metric: ctoi, max: 0.05}\nks: [1, 2]\n")
    frame = pd.read_csv(store["data"])
    frame.assign(region=np.where(np.arange(len(frame)) % 3 == 0, "north", "south")).to_csv(
        root / "eval_regions.csv", index=False
    )
    (root / "sliced.yaml").write_text(
        "slices: [region, true_class]\nrules:\n  - {metric: con, min: 0.9}\n"
        "  - {metric: ctoi, max: 0.3, per_slice: true, min_slice_size: 40, decide: upper}\nks: [1, 2]\n"
    )
    return store


def test_check_on_spark_equals_in_process(store, tmp_path):
    """Metrics, rules and the per-slice counts (slices are part of the counting key on Spark)."""
    common = {
        "candidate": "3",
        "id_column": "id",
        "tracking_uri": store["uri"],
        "config": store["root"] / "sliced.yaml",
    }
    data = store["root"] / "eval_regions.csv"
    local = run_gate(MODEL, data, quiet=True, **common)
    spark = run_gate(MODEL, data, quiet=True, engine="spark", partitions=2, **common)
    assert local.verdict == spark.verdict == "failed"  # v3 is the poor candidate
    assert spark.n == local.n == 150 and spark.unknown_labels == local.unknown_labels
    assert spark.metrics.keys() == local.metrics.keys()
    for key, value in local.metrics.items():
        assert spark.metrics[key] == pytest.approx(value, abs=1e-9), key
    assert [r.held for r in spark.rules] == [r.held for r in local.rules]
    assert spark.rules[1].slices == local.rules[1].slices and len(local.rules[1].slices) == 5
    assert [(s["column"], s["value"], s["n"]) for s in spark.slices] == [
        (s["column"], s["value"], s["n"]) for s in local.slices
    ]
    for got, want in zip(spark.slices, local.slices, strict=True):
        assert got["metrics"].keys() == want["metrics"].keys() and got["intervals"].keys() == want["intervals"].keys()
        for key, value in want["intervals"].items():
            assert got["intervals"][key] == pytest.approx(value, abs=1e-9), key
            assert got["metrics"].get(key) == pytest.approx(want["metrics"].get(key), abs=1e-9), key

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=store["uri"])
    run = client.get_run(spark.run_id)
    assert run.data.params["engine"] == "spark" and run.info.status == "FINISHED"
    # the evaluation data as a Spark dataset: its source is the file the Spark job read, whole
    (logged,) = run.inputs.dataset_inputs
    assert logged.dataset.source_type == "spark" and logged.dataset.name == data.name
    assert json.loads(logged.dataset.source) == {"path": str(data)}
    # its schema, not its profile: MLflow's approximate count gives up after a few seconds on a busy machine
    assert "label" in logged.dataset.schema and logged.dataset.digest
    flips = pd.read_csv(client.download_artifacts(spark.run_id, "gate/flips.csv", str(tmp_path)))
    expected = local.metrics["ctoi"] * 150 + local.metrics["itoc"] * 150
    assert len(flips) == round(expected) and set(flips["flip"]) <= {"CtoI", "ItoC"}


def test_check_spark_torch_first_generation(store):
    """A PyTorch model (tensor signature, softmax of its outputs, classes from its tag) as a first generation."""
    common = {"id_column": "id", "tracking_uri": store["uri"], "config": store["root"] / "gate.yaml", "quiet": True}
    local = run_gate("iris-torch", store["data"], **common)
    spark = run_gate("iris-torch", store["data"], engine="spark", **common)
    assert spark.first_generation and spark.verdict == local.verdict
    assert spark.metrics.keys() == local.metrics.keys()
    for key, value in local.metrics.items():
        assert spark.metrics[key] == pytest.approx(value, abs=1e-6), key


def test_check_spark_refuses_a_label_predicting_sklearn_pyfunc(store, tmp_path):
    import mlflow
    from sklearn.linear_model import LogisticRegression

    mlflow.set_tracking_uri(store["uri"])
    mlflow.set_registry_uri(store["uri"])
    frame = pd.read_csv(store["data"])
    x = frame.drop(columns=["label", "id"])
    with mlflow.start_run():
        mlflow.sklearn.log_model(
            LogisticRegression(max_iter=500).fit(x, frame["label"]),
            name="model",
            registered_model_name=MODEL,
            pip_requirements=["scikit-learn"],  # not inferred: that reloads the model in a subprocess
        )
    args = check_args("4", store["data"], store["root"] / "gate.yaml", store["uri"], "--id-column", "id")
    proc = run_cli(*args, "--engine", "spark")
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert "pyfunc_predict_fn='predict_proba'" in proc.stderr and "--engine local" in proc.stderr


def test_remediation_gates_its_ensemble_on_spark(store):
    """The repaired candidate is gated on Spark through the ensemble's logged model, and the registered
    ensemble gets the same numbers when gated in-process."""
    from test_remediation import REMEDIATION

    from consistency_gate.gate.config import parse_config

    train = store["root"] / "train.csv"
    pd.read_csv(store["data"]).drop(columns=["id"]).to_csv(train, index=False)
    rules = "rules:\n  - {metric: con, min: 0.9}\n  - {metric: acc, min_delta: -0.05}\n"
    config = parse_config(rules + REMEDIATION.format(recipe="mlp", train=train, label="label"))
    common = {"config": config, "tracking_uri": store["uri"], "id_column": "id", "quiet": True}
    result = run_gate(MODEL, store["data"], candidate="3", engine="spark", **common)
    assert result.ensemble["verdict"] == "passed" == result.verdict
    again = run_gate(MODEL, store["data"], candidate=result.registered_version, **common)
    for key, value in again.metrics.items():
        assert result.ensemble["metrics"][key] == pytest.approx(value, abs=1e-6), key


@pytest.mark.xdist_group("test_spark.py")  # the worker whose Spark session the module's other tests started
@pytest.mark.parametrize("update", ["independent", "correlated"])
def test_the_memory_update_on_spark_is_the_in_process_update(tmp_path, update):
    """Three generations of a memory of 300 ids, 20 new ids each time and a few not scored: the joins of
    engines.spark.update_memory give the table Memory.extended then Memory.update give, read back as one; with
    the correlated update (``Repeats``) too."""
    from consistency_gate.core.memory import Memory, Repeats
    from consistency_gate.engines.spark import MEMORY_ADDED, MEMORY_CHANGED, spark_session, update_memory

    spark = spark_session(2)
    rng = np.random.default_rng(3)
    classes = ["a", "b", "c"]
    repeats = Repeats(right=0.85, repeats=0.6, corrects=0.3) if update == "correlated" else None

    def matrix():
        return rng.dirichlet(np.ones(3), size=3) * 0.7 + np.eye(3) * 0.3

    before, table, path = matrix(), None, tmp_path / "local.parquet"
    ids = [f"i{k}" for k in range(300)]
    local = Memory.first(classes, ids, rng.integers(0, 3, 300), before)
    local.write(path)
    table = spark.read.parquet(str(path))
    for step in range(3):
        ids = [*ids[5:], *(f"n{step}-{k}" for k in range(20))]  # 5 not scored, 20 new
        seen, said, after = rng.integers(0, 3, len(ids)), rng.integers(-1, 3, len(ids)), matrix()
        new = local.find(ids) < 0
        local = local.extended(np.array(ids)[new], seen[new], before)
        local, changed = local.update(ids, said, after, 2.0, repeats=repeats)
        frame = update_memory(
            spark, table,
            spark.createDataFrame(pd.DataFrame({"id": ids, "answer": seen.astype("int32")})),
            spark.createDataFrame(pd.DataFrame({"id": ids, "answer": said.astype("int32")})),
            classes, (before, after), 2.0, repeats=repeats,
        ).toPandas()  # fmt: skip
        assert int(frame[MEMORY_CHANGED].sum()) == changed and int(frame[MEMORY_ADDED].sum()) == 20
        out = tmp_path / f"spark-{step}"
        spark.createDataFrame(frame.drop(columns=[MEMORY_CHANGED, MEMORY_ADDED])).write.parquet(str(out))
        read = Memory.read(out, classes)  # a folder of part files, as Spark writes it
        assert read.ids.equals(local.ids) and read.seen(ids) == local.seen(ids)
        assert np.allclose(read.log_belief, local.log_belief, atol=1e-5)
        table, before = spark.read.parquet(str(out)), after


def test_a_models_answers_on_spark_for_a_memory_are_its_answers_in_process(store):
    """engines.spark.model_answers (spark_udf, the highest score, mapped to the memory's classes) against the
    in-process scorer's answers, with the memory's classes in another order."""
    import mlflow
    from mlflow import MlflowClient

    from consistency_gate.engines.spark import SparkModel, model_answers, read_table, spark_session
    from consistency_gate.ensembles.answers import answer_labels
    from consistency_gate.mlops.registry import resolve_version
    from consistency_gate.mlops.scoring import load_model, predict

    mlflow.set_tracking_uri(store["uri"])
    model = load_model(resolve_version(MlflowClient(), MODEL, "3"))
    frame = pd.read_csv(store["data"])
    scores = predict(model, frame, ("label", "id"))
    classes = [str(c) for c in scores.columns][::-1]
    spark = spark_session(2)
    features = [c for c in frame.columns if c not in ("label", "id")]
    spark_model = SparkModel(model.ref.uri, model.flavor, [str(c) for c in scores.columns], features)
    got = model_answers(spark, read_table(spark, store["data"]), "id", spark_model, classes).toPandas()
    expected = [classes.index(a) for a in answer_labels(scores)]
    assert got.set_index("id").loc[frame["id"].astype(str), "answer"].tolist() == expected


def test_a_memory_version_answers_by_id_through_spark_udf(store, tmp_path):
    """Batch scoring on Spark loads a memory version as any pyfunc: a row whose id is in the table gets the
    remembered answer, an unknown id the model's."""
    import mlflow
    from pyspark.sql import functions as F

    from consistency_gate.engines.spark import spark_session

    config = tmp_path / "memory.yaml"
    config.write_text(
        "rules:\n  - {metric: con, min: 0.0}\nremediation:\n  strategy: [memory]\n  tuning_share: 0.3\n"
        f"  options:\n    memory: {{population: {store['data']}}}\n"
    )
    result = run_gate(MODEL, store["data"], candidate="2", id_column="id", tracking_uri=store["uri"], config=config,
                      quiet=True)  # fmt: skip
    uri = f"models:/{MODEL}/{result.registered_version}"
    frame = pd.read_csv(store["data"]).drop(columns=["label"])
    frame = pd.concat([frame, frame.iloc[[0]].assign(id="a-new-item")], ignore_index=True)
    spark = spark_session(2)
    udf = mlflow.pyfunc.spark_udf(spark, uri, result_type="array<double>", env_manager="local")
    rows = spark.createDataFrame(frame).select("id", udf(F.struct(*frame.columns)).alias("scores")).toPandas()
    on_spark = np.stack(rows.set_index("id").loc[frame["id"], "scores"].to_numpy()).argmax(axis=1)
    in_process = mlflow.pyfunc.load_model(uri).predict(frame)  # the table's answers: test_memory_gate.py
    assert on_spark.tolist() == in_process.to_numpy().argmax(axis=1).tolist()
    model = mlflow.pyfunc.load_model(f"models:/{MODEL}/2")  # an unknown id: the model's answer
    assert on_spark[-1] == np.asarray(model.predict(frame.iloc[[-1]].drop(columns=["id"]))).argmax(axis=1)[0]


def _memory_table(uri: str, folder):
    """The memory table a memory version carries, as it reads back."""
    import mlflow

    from consistency_gate.core.memory import Memory

    local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(folder))
    return Memory.read(next(p for p in Path(local).rglob("memory.parquet")))


@pytest.mark.xdist_group("test_spark.py")
def test_a_gate_on_spark_updates_the_memory_as_in_process(store, tmp_path):
    """`check --engine spark` with a memory: the population a CSV file at the first gate (the evaluation set's
    missing ids added, the cost ratio tuned on a calibration file), a table of Spark's catalog at the second
    (from the first gate's memory, promoted: its table and the model it carries read by Spark; class scores as
    the likelihood, a decay, two ids forgotten). Each memory version's table is the one the same gate in
    process registers: the same ids, answers, counts and beliefs."""
    from mlflow import MlflowClient

    from consistency_gate.engines.spark import spark_session

    frame = pd.read_csv(store["data"])
    population = pd.concat([frame.iloc[20:], frame.iloc[:40].assign(id=[f"new{i}" for i in range(40)])])
    population.drop(columns=["label"]).to_csv(tmp_path / "population.csv", index=False)
    frame.iloc[::3].to_csv(tmp_path / "calibration.csv", index=False)  # ids in the population
    (tmp_path / "forget.txt").write_text("s30\ns31\n")

    def config(name, population, extra=""):
        path = tmp_path / f"{name}.yaml"
        path.write_text(
            f"rules:\n  - {{metric: con, min: 0.0}}\nremediation:\n  strategy: [memory]\n  calibration: "
            f"{tmp_path / 'calibration.csv'}\n  options:\n    memory: {{population: {population}{extra}}}\n"
        )
        return path

    common = {"id_column": "id", "tracking_uri": store["uri"], "quiet": True}
    first = config("first", tmp_path / "population.csv")
    later = f", likelihood: scores, decay: 0.5, forget: {tmp_path / 'forget.txt'}"
    client = MlflowClient(tracking_uri=store["uri"])
    try:
        local = run_gate(MODEL, store["data"], candidate="2", config=first, **common)
        spark = run_gate(MODEL, store["data"], candidate="2", config=first, engine="spark", promote=True, **common)
        assert spark.promoted and spark.ensemble["setting"]["engine"] == "spark"
        spark_session().read.csv(str(tmp_path / "population.csv"), header=True, inferSchema=True) \
            .createOrReplaceTempView("population_view")  # fmt: skip
        local_next = run_gate(MODEL, store["data"], candidate="3", config=config("next", tmp_path / "population.csv",
                              later), **common)  # fmt: skip
        spark_next = run_gate(MODEL, store["data"], candidate="3", config=config("view", "population_view", later),
                              engine="spark", **common)  # fmt: skip
    finally:
        client.set_registered_model_alias(MODEL, "champion", "1")
    for one, other in ((local, spark), (local_next, spark_next)):
        mine, theirs = one.ensemble["setting"], other.ensemble["setting"]
        for key in ("rows", "added", "changed", "forgotten", "cost_ratio", "from"):
            assert mine[key] == theirs[key], key
        here, there = (_memory_table(f"models:/{MODEL}/{r.registered_version}", tmp_path / r.registered_version)
                       for r in (one, other))  # fmt: skip
        assert here.ids.equals(there.ids) and (here.shown == there.shown).all()
        assert np.allclose(here.log_belief, there.log_belief, atol=1e-4)
    assert spark.ensemble["setting"]["rows"] == 190 and spark_next.ensemble["setting"]["forgotten"] == 2
    assert spark_next.ensemble["setting"]["from"] == f"v{spark.registered_version}'s memory"
