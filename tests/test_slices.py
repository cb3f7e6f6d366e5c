"""Slices: per-slice counts that merge like the rest, per-slice rules, and the gate's per-slice table
on a real SQLite MLflow store (cross-checked against pandas on the models' own predictions)."""

import json
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from conftest import read_report, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow import MlflowClient
from registry_fixtures import MODEL, build_store, check_args
from statsmodels.stats.proportion import proportion_confint

from consistency_gate.core.counts import ConsistencyCounts, Outputs
from consistency_gate.core.slices import MAX_SLICE_VALUES, SliceCounts, SliceResult
from consistency_gate.errors import DataError, UsageError
from consistency_gate.gate.config import parse_config
from consistency_gate.gate.rules import Rule, evaluate_rules
from consistency_gate.gate.run import run_gate
from consistency_gate.report.slices import worst_slices
from consistency_gate.report.verdict import verdict_markdown


@st.composite
def _batch(draw):
    n = draw(st.integers(1, 40))
    ints = st.lists(st.integers(0, 2), min_size=n, max_size=n)
    y, prev, cand = (np.array(draw(ints)) for _ in range(3))
    region = np.array(draw(st.lists(st.sampled_from(["eu", "us", None]), min_size=n, max_size=n)), dtype=object)
    return y, prev, cand, region


@given(_batch(), st.integers(0, 40))
@settings(max_examples=60, deadline=None)
def test_slice_counts_equal_counts_of_the_subset_and_merge_for_any_split(batch, cut):
    y, prev, cand, region = batch
    cut = min(cut, y.size)

    def sliced(rows: slice) -> SliceCounts:
        outs = Outputs.from_labels(prev[rows]), Outputs.from_labels(cand[rows])
        return SliceCounts().update(y[rows], *outs, {"region": region[rows], "true_class": y[rows]})

    whole = sliced(slice(None))
    merged = sliced(slice(0, cut)).merge(sliced(slice(cut, None)))
    assert {k: v.compute() for k, v in merged.parts.items()} == {k: v.compute() for k, v in whole.parts.items()}
    for (column, value), counts in whole.parts.items():
        keys = region if column == "region" else y
        mask = np.array([(str(k) if k is not None else "(missing)") == value for k in keys])
        direct = ConsistencyCounts().update(y[mask], Outputs.from_labels(prev[mask]), Outputs.from_labels(cand[mask]))
        assert counts.compute() == direct.compute() and counts.n == mask.sum()


def test_slice_counts_of_scores_equal_counts_of_each_subset():
    """Top-k, Pearson and cosine per slice (summed with bincount) equal the counts of the subset itself."""
    rng = np.random.default_rng(1)
    n, p = 300, 6
    y = rng.integers(0, p, n)
    a, b = rng.random((n, p)), rng.random((n, p))
    b[:5] = 1.0  # constant rows: Pearson undefined there
    region = rng.choice(["eu", "us", "apac"], n)
    prev, cand = (Outputs.from_scores(m, np.arange(p), 3) for m in (a, b))
    sliced = SliceCounts(ks=(1, 3)).update(y, prev, cand, {"region": region, "true_class": y})
    for (column, value), counts in sliced.parts.items():
        mask = (region if column == "region" else y.astype(str)) == value
        sub = [Outputs.from_scores(m[mask], np.arange(p), 3) for m in (a, b)]
        direct = ConsistencyCounts(ks=(1, 3)).update(y[mask], *sub)
        got, want = counts.compute()[0], direct.compute()[0]
        assert got.keys() == want.keys() and counts.n == mask.sum()
        for key, value_ in want.items():
            assert got[key] == pytest.approx(value_, abs=1e-12), (column, value, key)


def test_slice_intervals_are_the_slices_own_wilson_intervals():
    y = np.zeros(30, dtype=int)
    prev, cand = np.zeros(30, dtype=int), np.array([1] * 6 + [0] * 24)
    region = np.array(["eu"] * 10 + ["us"] * 20)
    results = SliceCounts().update(y, Outputs.from_labels(prev), Outputs.from_labels(cand), {"region": region})
    eu = next(s for s in results.results() if s.value == "eu")
    assert eu.n == 10 and eu.metrics["ctoi"] == 0.6
    assert eu.intervals["ctoi"] == pytest.approx(list(proportion_confint(6, 10, 0.05, method="wilson")))


def test_a_column_of_ids_is_refused():
    n = MAX_SLICE_VALUES + 1
    labels = Outputs.from_labels(np.zeros(n, dtype=int))
    with pytest.raises(DataError, match="slicing column 'user' has more than 10,000 distinct values"):
        SliceCounts().update(np.zeros(n), labels, labels, {"user": np.arange(n)})


def _slice(value: str, n: int, ctoi: float, interval: list[float]) -> SliceResult:
    return SliceResult("region", value, n, {"ctoi": ctoi}, {"ctoi": interval}, {"ctoi": interval})


SLICES = [
    _slice("eu", 200, 0.01, [0.003, 0.036]),
    _slice("us", 120, 0.07, [0.034, 0.126]),
    _slice("apac", 12, 0.5, [0.2, 0.8]),
]


def test_a_per_slice_rule_judges_every_large_enough_slice():
    rule = Rule("ctoi", "max", 0.05, per_slice=True, min_slice_size=50)
    (result,) = evaluate_rules([rule], {"ctoi": 0.02}, slices=SLICES)
    assert result.held is False and result.value == 0.07 and result.interval == [0.034, 0.126]
    assert "worst slice region=us (n=120)" in result.note and "1 of 2 slices fail" in result.note
    assert "1 slice under 50 samples not judged" in result.note
    assert [row["slice"] for row in result.to_dict()["slices"]] == ["region=eu", "region=us"]
    assert result.to_dict()["condition"] == "<= 0.05 in every slice of n >= 50"
    lenient = Rule("ctoi", "max", 0.05, decide="lower", per_slice=True, min_slice_size=50)
    assert evaluate_rules([lenient], {}, slices=SLICES)[0].held is True  # no violation shown (0.034 <= 0.05)
    tiny = Rule("ctoi", "max", 0.05, per_slice=True, min_slice_size=1000)
    (skipped,) = evaluate_rules([tiny], {}, slices=SLICES)
    assert skipped.held is None and "no slice has 1000 samples" in skipped.note


def test_slices_in_the_config_and_their_errors():
    config = parse_config(
        "slices: [region, true_class]\nrules:\n  - {metric: ctoi, max: 0.05, per_slice: true, min_slice_size: 30}\n"
    )
    assert config.slices == ("region", "true_class")
    assert config.rules[0].per_slice and config.rules[0].min_slice_size == 30
    assert (
        parse_config("slices: [region]\nrules:\n  - {metric: con, min: 0.9, per_slice: true}\n").rules[0].min_slice_size
        == 50
    )
    with pytest.raises(UsageError, match="g.yaml: line 2: rule for 'ctoi' is per_slice but the config names no slices"):
        parse_config("rules:\n  - {metric: ctoi, max: 0.05, per_slice: true}\n", "g.yaml")
    with pytest.raises(UsageError, match="min_slice_size applies to per_slice: true rules only"):
        parse_config("slices: [a]\nrules:\n  - {metric: ctoi, max: 0.05, min_slice_size: 10}\n")
    with pytest.raises(UsageError, match="slices names a column twice"):
        parse_config("slices: [a, a]\nrules:\n  - {metric: ctoi, max: 0.05}\n")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    store = build_store(tmp_path_factory.mktemp("slices"))
    frame = pd.read_csv(store["data"])
    frame["region"] = np.where(np.arange(len(frame)) < 140, "north", "south")  # south: 10 samples
    frame.to_csv(store["root"] / "eval_regions.csv", index=False)
    return store


def _expected_slices(store, frame: pd.DataFrame) -> pd.DataFrame:
    """CtoI of v3 against v1 per true class, from the models' own sklearn predictions and pandas."""
    mlflow.set_tracking_uri(store["uri"])
    x = frame[["sepal_length", "sepal_width", "petal_length", "petal_width"]]
    previous, candidate = (mlflow.sklearn.load_model(f"models:/{MODEL}/{v}").predict(x) for v in ("1", "3"))
    ctoi = (previous == frame["label"]) & (candidate != frame["label"])
    return ctoi.groupby(frame["label"]).agg(["mean", "size"])


def test_the_gate_judges_each_slice_and_logs_the_table(store, tmp_path):
    frame = pd.read_csv(store["root"] / "eval_regions.csv")
    expected = _expected_slices(store, frame)
    assert expected["mean"].nunique() > 1  # the classes differ: a threshold between them must fail one
    threshold = float(expected["mean"].sort_values().iloc[:2].mean())  # between the best and the second best
    config = tmp_path / "gate.yaml"
    config.write_text(
        "slices: [true_class, region]\nrules:\n  - {metric: con, min: 0.0}\n"
        f"  - {{metric: ctoi, max: {threshold}, per_slice: true, min_slice_size: 20}}\n"
    )
    report = tmp_path / "report.json"
    proc = run_cli(
        *check_args("3", store["root"] / "eval_regions.csv", config, store["uri"], "--id-column", "id"),
        "--report",
        report,
    )
    assert proc.returncode == 1, proc.stderr  # the per-slice rule fails although the overall rule holds
    saved = read_report(report)
    slices = {f"{s['column']}={s['value']}": s for s in saved["slices"]}
    assert set(slices) == {f"true_class={c}" for c in expected.index} | {"region=north", "region=south"}
    for label, row in expected.iterrows():
        got = slices[f"true_class={label}"]
        assert got["n"] == row["size"] and got["metrics"]["ctoi"] == pytest.approx(row["mean"])
        low, high = proportion_confint(round(row["mean"] * row["size"]), row["size"], 0.05, method="wilson")
        assert got["intervals"]["ctoi"] == pytest.approx([low, high])
    overall, per_slice = saved["rules"]
    assert overall["held"] is True and per_slice["held"] is False
    worst = expected["mean"].idxmax()
    assert per_slice["value"] == pytest.approx(expected["mean"].max())
    assert f"worst slice true_class={worst}" in per_slice["note"] and "1 slice under 20 samples" in per_slice["note"]
    assert worst_slices(saved)[0]["value"] == worst
    markdown = verdict_markdown(saved)
    assert "### Slices, worst first" in markdown and markdown.index(f"true_class={worst}") < markdown.index(
        "region=south"
    )
    assert "not judged (n < 20)" in markdown  # region=south, 10 samples
    assert "Slices, worst first" in proc.stdout

    client = MlflowClient(tracking_uri=store["uri"])
    run = client.get_run(saved["run_id"])
    table = json.loads(Path(client.download_artifacts(saved["run_id"], "gate/slices.json", str(tmp_path))).read_text())
    frame_logged = pd.DataFrame(table["data"], columns=table["columns"])
    assert len(frame_logged) == len(slices) and {"slice", "value", "n", "ctoi", "ctoi_low", "ctoi_high"} <= set(
        frame_logged.columns
    )
    # every metric's interval is a run metric too, and the paired test
    assert run.data.metrics["interval/ctoi_low"] == pytest.approx(saved["intervals"]["ctoi"][0])
    assert run.data.metrics["interval/acc_delta_high"] == pytest.approx(saved["intervals"]["acc_delta"][1])
    assert run.data.metrics["test/mcnemar_p"] == pytest.approx(saved["tests"]["mcnemar_p"])


def test_a_slicing_column_the_data_lacks_is_a_data_error(store, tmp_path):
    config = tmp_path / "gate.yaml"
    config.write_text("slices: [device]\nrules:\n  - {metric: ctoi, max: 0.05, per_slice: true}\n")
    with pytest.raises(DataError, match="slicing column 'device' not found"):
        run_gate(MODEL, store["data"], candidate="2", config=config, tracking_uri=store["uri"], quiet=True)
