"""`compare --engine spark` on local Spark equals the in-process result; its input errors."""

import json
import os

import numpy as np
import pandas as pd
import pytest
from conftest import run_cli

pytest.importorskip("pyspark")

from consistency_gate.compare import compare_files  # noqa: E402
from consistency_gate.errors import DataError  # noqa: E402
from consistency_gate.spark import compare_spark  # noqa: E402


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
    local = compare_files(*args, id_column="id", ks=[1, 3])
    spark = compare_spark(*args, id_column="id", ks=[1, 3], partitions=2)
    assert spark.n == local.n == 2000
    assert spark.classes == local.classes and spark.unknown_labels == local.unknown_labels
    for key, value in local.metrics.items():
        assert spark.metrics[key] == pytest.approx(value, abs=1e-9), key


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
