"""`consistency-gate compare` as a subprocess: the SPEC section 6 contract and bad input."""

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import run_cli, run_json
from hypothesis import given, settings
from hypothesis import strategies as st

from consistency_gate.core import metrics as m
from consistency_gate.core import rows

SPEC_KEYS = {
    "acc_previous",
    "acc_candidate",
    "con",
    "acc_con",
    "ctoc",
    "ctoi",
    "itoc",
    "itoi",
    "com",
    "pearson",
    "cosine",
    "btc",
    "bec",
    "rel_nfr",  # the relative negative flip rate is a metric key too
}


def _probs(rng, n, p):
    x = rng.random((n, p)) ** 4
    return x / x.sum(1, keepdims=True)


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    n, classes = 500, ["cat", "dog", "eel", "fox", "gnu", "hen"]
    y = rng.integers(0, 6, n)
    a, b = _probs(rng, n, 6), _probs(rng, n, 6)
    a[np.arange(n), y] += 0.5
    b[np.arange(n), y] += 0.4
    labels = pd.DataFrame({"id": [f"s{i}" for i in range(n)], "label": np.array(classes)[y]})
    prev = pd.DataFrame(a, columns=classes)
    cand = pd.DataFrame(b, columns=classes)
    paths = {k: tmp_path / f"{k}.csv" for k in ("labels", "prev", "cand")}
    labels.to_csv(paths["labels"], index=False)
    prev.to_csv(paths["prev"], index=False)
    cand.to_csv(paths["cand"], index=False)
    return paths, y, a, b


def test_json_contract_and_values(files):
    paths, y, a, b = files
    out = run_json(
        "compare",
        "--labels",
        paths["labels"],
        "--previous",
        paths["prev"],
        "--candidate",
        paths["cand"],
        "--k",
        "1",
        "--k",
        "3",
        "--format",
        "json",
    )
    assert set(out) >= {"n", "metrics", "classes", "unknown_labels"}
    assert out["n"] == 500
    assert out["unknown_labels"] == {"previous": 0, "candidate": 0}
    assert set(out["metrics"]) == SPEC_KEYS | {
        f"{x}@{k}" for k in (1, 3) for x in ("ccon", "cacc_previous", "cacc_candidate")
    }
    pa, pb = rows.predicted_classes(a), rows.predicted_classes(b)
    assert out["metrics"]["con"] == pytest.approx(m.consistency(pa, pb))
    assert out["metrics"]["ctoi"] == pytest.approx(m.flip_rates(y, pa, pb)["ctoi"])
    assert out["metrics"]["ccon@3"] == pytest.approx(m.topk_consistency(a, b, 3))
    assert out["metrics"]["pearson"] == pytest.approx(m.pearson(a, b), abs=1e-9)


def test_files_numpy_answers_fast_are_compared_without_numba_as_the_kernels_compare_them(tmp_path, monkeypatch):
    """A compare of files numpy answers in under ``rows.NUMPY_SECONDS`` loads no numba (0.6 s of CPU in a
    fresh process) and gives, chunk after chunk, the metrics the compiled kernels give the same files: 20,000 rows
    x 100 classes of Parquet (8 MB each), scores in tenths so that rows tie, in one chunk and in chunks of 3,000
    rows against the kernels' chunks of 7,000."""
    from consistency_gate.engines.local import compare_files

    rng = np.random.default_rng(7)
    n, classes = 20_000, [f"c{i:02d}" for i in range(100)]
    paths = {name: tmp_path / f"{name}.parquet" for name in ("labels", "prev", "cand")}
    pd.DataFrame({"label": rng.choice(classes, n)}).to_parquet(paths["labels"])
    for name in ("prev", "cand"):
        scores = (rng.integers(0, 10, (n, len(classes))) / 10).astype(np.float32)
        pd.DataFrame(scores, columns=classes).to_parquet(paths[name])
    args = ["compare", "--labels", paths["labels"], "--previous", paths["prev"], "--candidate", paths["cand"]]
    script = (
        "import sys\nfrom consistency_gate.cli import main\n"
        "try:\n    main(sys.argv[1:])\nfinally:\n    print('numba' in sys.modules)"
    )
    options = ["--k", "1", "--k", "5", "--format", "json"]
    proc = subprocess.run([sys.executable, "-c", script, *map(str, args), *options], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    *report, loaded = proc.stdout.strip().splitlines()
    assert loaded == "False"
    in_one_chunk = json.loads("\n".join(report))["metrics"]
    by_numpy = compare_files(*args[2::2], ks=[1, 5], chunk_rows=3_000).metrics
    monkeypatch.setattr(rows, "NUMPY_SECONDS", 0)  # every file large enough for the kernels
    by_kernels = compare_files(*args[2::2], ks=[1, 5], chunk_rows=7_000).metrics
    assert set(in_one_chunk) == set(by_numpy) == set(by_kernels)
    for name, value in by_kernels.items():
        for got in (in_one_chunk[name], by_numpy[name]):
            assert got == pytest.approx(value, rel=1e-9, abs=1e-12, nan_ok=True), name


def test_shuffled_columns_rows_and_parquet_give_same_result(files, tmp_path):
    paths, *_ = files
    base = run_json(
        "compare",
        "--labels",
        paths["labels"],
        "--previous",
        paths["prev"],
        "--candidate",
        paths["cand"],
        "--format",
        "json",
    )
    ids = pd.read_csv(paths["labels"])["id"]
    pd.read_csv(paths["prev"]).assign(id=ids).to_csv(tmp_path / "prev_id.csv", index=False)
    cand = pd.read_csv(paths["cand"]).assign(id=ids)
    shuffled = cand.sample(frac=1, random_state=3)[["fox", "id", "cat", "eel", "dog", "hen", "gnu"]]
    shuffled.to_parquet(tmp_path / "cand.parquet")
    out = run_json(
        "compare",
        "--labels",
        paths["labels"],
        "--previous",
        tmp_path / "prev_id.csv",
        "--candidate",
        tmp_path / "cand.parquet",
        "--id-column",
        "id",
        "--format",
        "json",
    )
    for key, value in base["metrics"].items():
        assert out["metrics"][key] == pytest.approx(value, abs=1e-9), key


def test_table_is_default(files):
    paths, *_ = files
    proc = run_cli("compare", "--labels", paths["labels"], "--previous", paths["prev"], "--candidate", paths["cand"])
    assert proc.returncode == 0
    assert "ctoi" in proc.stdout and "n = 500" in proc.stdout


def test_new_class_in_candidate_is_reported_not_dropped(tmp_path):
    labels = pd.DataFrame({"label": ["a", "b", "c", "c"]})
    prev = pd.DataFrame({"a": [0.9, 0.2, 0.5, 0.4], "b": [0.1, 0.8, 0.5, 0.6]})
    cand = pd.DataFrame({"c": [0.1, 0.1, 0.8, 0.7], "a": [0.8, 0.2, 0.1, 0.2], "b": [0.1, 0.7, 0.1, 0.1]})
    for name, df in (("labels", labels), ("prev", prev), ("cand", cand)):
        df.to_csv(tmp_path / f"{name}.csv", index=False)
    out = run_json(
        "compare",
        "--labels",
        tmp_path / "labels.csv",
        "--previous",
        tmp_path / "prev.csv",
        "--candidate",
        tmp_path / "cand.csv",
        "--format",
        "json",
    )
    assert out["n"] == 4
    assert out["unknown_labels"] == {"previous": 2, "candidate": 0}
    assert out["metrics"]["acc_previous"] == 0.5
    assert out["metrics"]["acc_candidate"] == 1.0
    assert out["metrics"]["itoc"] == 0.5
    assert set(out["classes"]) == {"a", "b", "c"}


def test_hard_labels_vs_scores(files, tmp_path):
    paths, y, a, b = files
    hard = pd.DataFrame({"prediction": np.array(["cat", "dog", "eel", "fox", "gnu", "hen"])[b.argmax(1)]})
    hard.to_csv(tmp_path / "hard.csv", index=False)
    out = run_json(
        "compare",
        "--labels",
        paths["labels"],
        "--previous",
        paths["prev"],
        "--candidate",
        tmp_path / "hard.csv",
        "--k",
        "1",
        "--k",
        "2",
        "--format",
        "json",
    )
    assert out["metrics"]["pearson"] is None and out["metrics"]["cosine"] is None
    assert out["metrics"]["ccon@2"] is None and "ccon@2" in out["null_reasons"]
    assert out["metrics"]["con"] == pytest.approx(m.consistency(a.argmax(1), b.argmax(1)))


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


BAD_CASES = {
    "missing label column": ("id,truth\n1,a\n", "a,b\n0.5,0.5\n", "a,b\n0.5,0.5\n", [], "column 'label'"),
    "missing id column": (
        "id,label\n1,a\n",
        "a,b\n0.5,0.5\n",
        "id,a,b\n1,0.5,0.5\n",
        ["--id-column", "id"],
        "column 'id'",
    ),
    "duplicate ids": (
        "id,label\n1,a\n1,b\n",
        "id,a,b\n1,0.5,0.5\n1,0.2,0.8\n",
        "id,a,b\n1,0.5,0.5\n2,0.5,0.5\n",
        ["--id-column", "id"],
        "more than once",
    ),
    "ids not matching": (
        "id,label\n1,a\n2,b\n",
        "id,a,b\n1,0.5,0.5\n2,0.2,0.8\n",
        "id,a,b\n1,0.5,0.5\n3,0.5,0.5\n",
        ["--id-column", "id"],
        "id '2'",
    ),
    "row counts differ": ("label\na\nb\n", "a,b\n0.5,0.5\n", "a,b\n0.5,0.5\n0.1,0.9\n", [], "row counts differ"),
    "nan score": ("label\na\nb\n", "a,b\n0.5,0.5\n,0.5\n", "a,b\n0.5,0.5\n0.1,0.9\n", [], "row 2, column 'a'"),
    "inf score": ("label\na\n", "a,b\ninf,0.5\n", "a,b\n0.5,0.5\n", [], "NaN or infinite"),
    "negative score": ("label\na\n", "a,b\n0.5,-0.5\n", "a,b\n0.5,0.5\n", [], "negative"),
    "non-numeric score": (
        "label\na\nb\n",
        "a,b\n0.5,0.5\n0.1,high\n",
        "a,b\n0.5,0.5\n0.1,0.9\n",
        [],
        "column 'b' is not numeric",
    ),
    "empty file": ("", "a,b\n0.5,0.5\n", "a,b\n0.5,0.5\n", [], "empty"),
    "header only": ("label\n", "a,b\n", "a,b\n", [], "no rows"),
    "label no generation knows": (
        "label\na\nz\n",
        "a,b\n0.5,0.5\n0.1,0.9\n",
        "a,b\n0.5,0.5\n0.1,0.9\n",
        [],
        "label 'z'",
    ),
}


@pytest.mark.parametrize(
    ("k", "expected"), [("0", "--k [0]: k must be at least 1"), ("3", "--k [3] larger than the 2")]
)
def test_k_outside_the_classes_is_a_usage_error(k, expected, tmp_path):
    files = [
        _write(tmp_path, f"{n}.csv", t) for n, t in [("l", "label\na\n"), ("p", "a,b\n0.5,0.5\n"), ("c", "a,b\n1,0\n")]
    ]
    proc = run_cli("compare", "--labels", files[0], "--previous", files[1], "--candidate", files[2], "--k", k)
    assert proc.returncode == 2 and expected in proc.stderr, proc.stderr


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_input_exits_3_with_one_line(case, tmp_path):
    labels, prev, cand, extra, expected = BAD_CASES[case]
    proc = run_cli(
        "compare",
        "--labels",
        _write(tmp_path, "labels.csv", labels),
        "--previous",
        _write(tmp_path, "prev.csv", prev),
        "--candidate",
        _write(tmp_path, "cand.csv", cand),
        *extra,
        "--format",
        "json",
    )
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert expected in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_an_error_before_numba_has_loaded_exits_3_at_once_not_an_abort(tmp_path):
    """compare loads numba's kernels in a thread while it reads; an input error on a machine whose
    numba cache is cold used to end the process while that thread was in LLVM: "terminate called
    without an active exception", exit -6, about one run in three. The console script now ends
    without waiting for the compiler (no kernel reaches the cold cache: it takes seconds), its exit
    handlers run; a program that calls ``main`` and then exits waits for the kernel at its exit. The
    prediction file is large enough (3,000,000 rows) for compare to load the kernels (a smaller one is answered by
    numpy, and nothing is loaded: ``rows.NUMPY_SECONDS``)."""
    predictions = "a,b\n" + "1,0\n0,1\n" * 1_500_000
    files = [_write(tmp_path, name, text) for name, text in (("l.csv", "label\na\nz\n"), ("p.csv", predictions))]
    args = ["compare", "--labels", files[0], "--previous", files[1], "--candidate", files[1]]
    console_script = "import atexit\nfrom consistency_gate.cli import run\natexit.register(print, 'handler ran')\nrun()"
    library = "import sys\nfrom consistency_gate.cli import main\nmain(sys.argv[1:])"
    for attempt, script in enumerate([console_script] * 3 + [library]):
        cache = tmp_path / f"cold-cache-{attempt}"
        env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
        proc = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, env=env)
        assert proc.returncode == 3 and "terminate called" not in proc.stderr, proc.stderr
        assert "is not a class of any generation" in proc.stderr
        if script == console_script:
            assert proc.stdout == "handler ran\n"
            assert not list(cache.rglob("*.nbi")), "the command waited for numba's compiler"


@pytest.mark.parametrize("where", ["before", "after"])
def test_missing_file_and_verbose_traceback(tmp_path, where):
    """``--verbose`` works before the command name and after its options."""
    files = ("--labels", tmp_path / "nope.csv", "--previous", tmp_path / "a.csv", "--candidate", tmp_path / "b.csv")
    args = ("--verbose", "compare", *files) if where == "before" else ("compare", *files, "--verbose")
    proc = run_cli(*args)
    assert proc.returncode == 3
    assert "nope.csv: file not found" in proc.stderr and "Traceback" in proc.stderr
    quiet = run_cli("compare", *files)
    assert quiet.returncode == 3 and "Traceback" not in quiet.stderr


@pytest.mark.parametrize("preset", [None, "ACTIVE"])
def test_compare_sets_its_reader_threads_in_its_own_process_only(files, preset):
    """A fresh compare process keeps OpenBLAS to one thread and numba's OpenMP workers passive (it
    does no linear algebra); a user's setting wins, and a process that loaded numpy is left alone."""
    paths, *_ = files
    script = (
        "import os, sys\nfrom consistency_gate.cli import main\n"
        "if sys.argv[1] == 'numpy': import numpy\n"
        "try:\n    main(sys.argv[2:])\nexcept SystemExit:\n    pass\n"
        "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('OPENBLAS_NUM_THREADS'))"
    )
    args = ["compare", "--labels", paths["labels"], "--previous", paths["prev"], "--candidate", paths["cand"]]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OPENBLAS_NUM_THREADS")}
    env |= {"OMP_WAIT_POLICY": preset} if preset else {}
    for first in ("fresh", "numpy"):
        proc = subprocess.run(
            [sys.executable, "-c", script, first, *map(str, args)], capture_output=True, text=True, env=env, check=True
        )
        expected = f"{preset or 'PASSIVE'} 1" if first == "fresh" else f"{preset} None"
        assert proc.stdout.splitlines()[-1] == expected, proc.stderr


def test_usage_error_exits_2(tmp_path):
    proc = run_cli("compare", "--labels", tmp_path / "x.csv")
    assert proc.returncode == 2


def test_generations_report(files, tmp_path):
    paths, y, a, b = files
    out = run_json(
        "generations",
        "--labels",
        paths["labels"],
        "--generation",
        f"g1={paths['prev']}",
        "--generation",
        f"g2={paths['cand']}",
        "--generation",
        f"g3={paths['prev']}",
        "--format",
        "json",
    )
    pa, pb = a.argmax(1), b.argmax(1)
    assert out["acc_mean"] == pytest.approx((2 * m.accuracy(y, pa) + m.accuracy(y, pb)) / 3)
    assert out["con_mean"] == pytest.approx((2 * m.consistency(pa, pb) + 1.0) / 3)
    assert out["consecutive_flips"]["g2->g3"]["ctoi"] == pytest.approx(m.flip_rates(y, pb, pa)["ctoi"])


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        st.lists(st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False, width=64)), min_size=1),
        st.lists(st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False, width=32)), min_size=1).map(
            lambda v: pd.Series(v, dtype="float32")
        ),
        st.lists(st.integers(-(2**62), 2**62), min_size=1),
        st.lists(st.one_of(st.none(), st.text(max_size=5)), min_size=1),
        st.lists(st.one_of(st.none(), st.text(max_size=3), st.integers(), st.floats(allow_nan=False)), min_size=1),
    )
)
def test_as_text_equals_the_one_value_rule(values):
    """The vectorised label/id text conversion gives what converting each value alone gives."""
    from consistency_gate.io.text import _label_text, as_text

    series = values if isinstance(values, pd.Series) else pd.Series(values)
    expected = [v if pd.isna(v) else _label_text(v) for v in series.astype(object)]
    got = as_text(series).tolist()
    assert [None if pd.isna(v) else v for v in got] == [None if pd.isna(v) else v for v in expected]


def test_compare_per_slice(files, tmp_path):
    """--slice: each metric per value of a labels-file column and per true class, worst slices in the table."""
    paths, y, a, b = files
    labels = pd.read_csv(paths["labels"])
    region = np.where(np.arange(len(labels)) % 4 == 0, "north", "south")
    labels.assign(region=region).to_csv(tmp_path / "regions.csv", index=False)
    common = ["compare", "--labels", tmp_path / "regions.csv", "--previous", paths["prev"]]
    common += ["--candidate", paths["cand"], "--slice", "region", "--slice", "true_class"]
    out = run_json(*common, "--format", "json")
    slices = {(s["column"], s["value"]): s for s in out["slices"]}
    assert {v for c, v in slices if c == "region"} == {"north", "south"}
    assert {v for c, v in slices if c == "true_class"} == set(labels["label"])
    north = region == "north"
    right_before, right_after = a[north].argmax(1) == y[north], b[north].argmax(1) == y[north]
    assert slices[("region", "north")]["n"] == north.sum()
    assert slices[("region", "north")]["metrics"]["ctoi"] == pytest.approx((right_before & ~right_after).mean())
    table = run_cli(*common)
    assert table.returncode == 0 and "Slices, worst first (8 in all)" in table.stdout
    missing = run_cli(*common[:-2], "--slice", "device")
    assert missing.returncode == 3 and "column 'device' not found" in missing.stderr


def test_a_corrupted_parquet_file_says_what_it_is_and_what_to_do(tmp_path):
    """Bytes that are not Parquet under a .parquet name: one line saying so and what to do, not pyarrow's
    "magic bytes not found" alone."""
    (tmp_path / "prev.parquet").write_bytes(b"x" * 100)
    labels, cand = _write(tmp_path, "l.csv", "label\na\nb\n"), _write(tmp_path, "c.csv", "a,b\n1,0\n0,1\n")
    proc = run_cli("compare", "--labels", labels, "--previous", tmp_path / "prev.parquet", "--candidate", cand)
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 3 and "prev.parquet: not a Parquet file, or a truncated or corrupted one" in line
    assert "write it again" in line and "Traceback" not in proc.stderr
