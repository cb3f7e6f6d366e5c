"""Intervals and the paired test: against statsmodels (an independent implementation), by coverage
simulation, and the merge property (split-and-merged counts give the intervals of one pass)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources

import numpy as np
import pytest
from conftest import read_report, run_cli
from hypothesis import example, given, settings
from hypothesis import strategies as st
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.proportion import proportion_confint

from consistency_gate.core import intervals as ci
from consistency_gate.core.counts import ConsistencyCounts, Outputs

counts_and_totals = st.integers(0, 400).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n)))


@given(counts_and_totals, st.sampled_from([0.8, 0.9, 0.95, 0.99]))
@settings(max_examples=200, deadline=None)
def test_wilson_and_clopper_pearson_match_statsmodels(kn, level):
    k, n = kn
    if n == 0:
        assert ci.wilson(k, n, level) is None and ci.clopper_pearson(k, n, level) is None
        return
    assert ci.wilson(k, n, level) == pytest.approx(proportion_confint(k, n, 1 - level, method="wilson"), abs=1e-12)
    assert ci.clopper_pearson(k, n, level) == pytest.approx(
        proportion_confint(k, n, 1 - level, method="beta"), abs=1e-9
    )


@given(st.integers(0, 60), st.integers(0, 60))
@settings(max_examples=150, deadline=None)
def test_mcnemar_exact_matches_statsmodels(b, c):
    expected = mcnemar(np.array([[10, b], [c, 10]]), exact=True).pvalue if b + c else 1.0
    assert ci.mcnemar_exact(b, c) == pytest.approx(expected, abs=1e-12)


@given(st.integers(0, 10**5), st.integers(0, 10**5), st.sampled_from([0.8, 0.9, 0.95, 0.99, 0.999]))
@settings(max_examples=200, deadline=None)
@example(0, 5661, 0.8)  # a p-value that underflows: binomtest 5e-324, ours 0 (found by a fresh run)
def test_the_scipy_special_forms_equal_scipy_stats_to_the_last_bit(k, more, level):
    """compare does not import scipy.stats (0.4 s a process): its quantiles and test come from
    scipy.special and give scipy.stats' numbers exactly (but a McNemar p below the smallest normal
    float, which is 0 here and binomtest's underflow, 0 or 5e-324, there)."""
    from scipy import stats

    n = k + more
    assert ci.z_value(level) == stats.norm.ppf(0.5 + level / 2)
    if n:
        alpha = 1 - level
        low, high = ci.clopper_pearson(k, n, level)
        assert low == (0.0 if k == 0 else stats.beta.ppf(alpha / 2, k, n - k + 1))
        assert high == (1.0 if k == n else stats.beta.ppf(1 - alpha / 2, k + 1, n - k))
        low, high = ci.jeffreys(k, n, level)
        assert low == (0.0 if k == 0 else stats.beta.ppf(alpha / 2, k + 0.5, n - k + 0.5))
        ours, theirs = ci.mcnemar_exact(k, more), stats.binomtest(k, n, 0.5).pvalue
        tiny = np.finfo(float).tiny  # both underflow below it: binomtest gave 5e-324 for (0, 5661), ours 0
        assert ours == theirs or (ours == 0 and theirs < tiny)


def test_compare_does_not_import_scipy_stats():
    script = (
        "import sys\nfrom consistency_gate.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\nprint('scipy.stats' in sys.modules)"
    )
    files = resources.files("consistency_gate") / "examples"
    args = ["--labels", "labels.csv", "--previous", "previous.csv", "--candidate", "candidate.csv", "--id-column", "id"]
    with resources.as_file(files) as folder:
        proc = subprocess.run(
            [sys.executable, "-c", script, "compare", *args, "--format", "json"],
            cwd=folder,
            capture_output=True,
            text=True,
            check=True,
        )
    assert proc.stdout.splitlines()[-1] == "False" and '"mcnemar_p"' in proc.stdout


def test_newcombe_by_hand_and_on_the_boundaries():
    # n = 10, previous right 7, candidate right 6: the difference is -0.1, inside the interval
    low, high = ci.newcombe_paired(5, 2, 1, 2, 0.95)
    assert low < -0.1 < high and low >= -1 and high <= 1
    # identical learners: no discordant pair, the interval still has width (from the Wilson bounds)
    low, high = ci.newcombe_paired(8, 0, 0, 2, 0.95)
    assert low < 0 < high
    assert ci.newcombe_paired(0, 0, 0, 0, 0.95) is None


def test_coverage_of_the_95_percent_intervals():
    """2,000 simulated evaluation sets of 500 samples with known flip probabilities: each 95% interval
    (CtoI by Wilson, the ACC difference by Newcombe, rel_nfr by MOVER-R) covers the truth in 93-97%
    of them."""
    rng = np.random.default_rng(7)
    p = np.array([0.85, 0.02, 0.05, 0.08])  # CtoC, CtoI, ItoC, ItoI
    truth = {"ctoi": p[1], "acc_delta": p[2] - p[1], "rel_nfr": p[1] / ((p[0] + p[1]) * (p[1] + p[3]))}
    covered = dict.fromkeys(truth, 0)
    draws = rng.multinomial(500, p, size=2000)
    for ctoc, ctoi, itoc, itoi in draws:
        found = {
            "ctoi": ci.wilson(ctoi, 500, 0.95),
            "acc_delta": ci.newcombe_paired(ctoc, ctoi, itoc, itoi, 0.95),
            "rel_nfr": ci.rel_nfr_interval(ctoc, ctoi, itoc, itoi, 0.95),
        }
        for key, bounds in found.items():
            covered[key] += bounds is not None and bounds[0] <= truth[key] <= bounds[1]
    rates = {key: count / len(draws) for key, count in covered.items()}
    assert all(0.93 <= rate <= 0.97 for rate in rates.values()), rates


@pytest.mark.parametrize("disagreement", [0.004, 0.015])
def test_rel_nfr_interval_holds_its_level_when_flips_are_rare(disagreement):
    """Accuracy 0.99 for both generations, n 100: the delta method on the log scale covered 85.3% and
    93.0% here; MOVER-R on Jeffreys and Wilson covers at least 95% (conservative)."""
    rng = np.random.default_rng(11)
    flip = disagreement / 2
    p = np.array([0.99 - flip, flip, flip, 0.01 - flip])
    truth = p[1] / ((p[0] + p[1]) * (p[1] + p[3]))
    found = [ci.rel_nfr_interval(*draw, 0.95) for draw in rng.multinomial(100, p, size=4000)]
    found = [bounds for bounds in found if bounds is not None]  # no candidate error: rel_nfr undefined
    coverage = np.mean([low <= truth <= high for low, high in found])
    assert coverage >= 0.95, coverage


def test_jeffreys_matches_statsmodels_inside_the_boundaries():
    for k, n in [(1, 3), (7, 40), (20, 70), (199, 200)]:
        expected = proportion_confint(k, n, 0.05, method="jeffreys")
        assert ci.jeffreys(k, n, 0.95) == pytest.approx(expected, abs=1e-9)
    assert ci.jeffreys(0, 10, 0.95)[0] == 0.0 and ci.jeffreys(10, 10, 0.95)[1] == 1.0


def _outputs(rng, n, p):
    scores = rng.random((n, p))
    return Outputs.from_scores(scores, np.arange(p), 2)


@given(st.integers(0, 2**32 - 1), st.integers(1, 79))
@settings(max_examples=40, deadline=None)
def test_intervals_of_merged_counts_equal_one_pass(seed, cut):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, 80)
    prev, cand = _outputs(rng, 80, 4), _outputs(rng, 80, 4)

    def part(lo, hi):
        def rows(o):
            return Outputs(o.labels[lo:hi], o.top[lo:hi], o.scores[lo:hi], o.columns)

        return ConsistencyCounts(ks=(1, 2)).update(y[lo:hi], rows(prev), rows(cand))

    whole, merged = part(0, 80), part(0, cut).merge(part(cut, 80))
    one, two = whole.intervals(0.9), merged.intervals(0.9)
    assert one.keys() == two.keys()
    for key in one:
        assert one[key] == pytest.approx(two[key], abs=1e-9), key
    assert whole.tests() == pytest.approx(merged.tests())


def test_every_non_null_metric_has_an_interval():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 5, 300)
    counts = ConsistencyCounts(ks=(1, 3)).update(y, _outputs3(rng, 300), _outputs3(rng, 300))
    values, _ = counts.compute()
    found = counts.intervals(0.95)
    assert {k for k, v in values.items() if v is not None} | {"acc_delta"} == set(found)
    for key, (low, high) in found.items():
        if key != "acc_delta":
            assert low <= values[key] + 1e-12 and values[key] <= high + 1e-12, key


def _outputs3(rng, n):
    return Outputs.from_scores(rng.random((n, 5)), np.arange(5), 3)


def test_compare_json_carries_confidence_intervals_and_mcnemar(tmp_path):
    labels = tmp_path / "labels.csv"
    labels.write_text("label\n" + "a\nb\n" * 50)
    previous = tmp_path / "previous.csv"
    previous.write_text("prediction\n" + "a\nb\n" * 40 + "a\na\n" * 10)
    candidate = tmp_path / "candidate.csv"
    candidate.write_text("prediction\n" + "a\nb\n" * 45 + "a\na\n" * 5)  # right where previous was, but 5
    proc = run_cli(
        "compare", "--labels", labels, "--previous", previous, "--candidate", candidate, "--format", "json",
        "--confidence", "0.9",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["confidence"] == 0.9
    assert out["metrics"]["itoc"] == 0.05 and out["metrics"]["ctoi"] == 0.0
    assert out["intervals"]["itoc"] == pytest.approx(proportion_confint(5, 100, 0.1, method="wilson"))
    assert out["tests"]["mcnemar_p"] == pytest.approx(mcnemar(np.array([[90, 0], [5, 5]]), exact=True).pvalue)
    assert out["metrics"]["rel_nfr"] == 0.0 and out["intervals"]["rel_nfr"][0] == 0.0
    assert {k for k, v in out["metrics"].items() if v is not None} <= set(out["intervals"])
    bad = run_cli("compare", "--labels", labels, "--previous", previous, "--candidate", candidate, "--confidence", "1")
    assert bad.returncode == 2


def test_gate_report_carries_the_configured_level_intervals_and_mcnemar(tmp_path):
    from registry_fixtures import build_store

    from consistency_gate.gate.config import parse_config
    from consistency_gate.gate.run import run_gate

    store = build_store(tmp_path)
    config = parse_config("confidence: 0.9\nks: [1, 2]\nrules:\n  - {metric: ctoi, max: 0.5}\n")
    report_path = tmp_path / "report.json"
    result = run_gate(
        "iris-clf", store["data"], candidate="3", config=config, tracking_uri=store["uri"], report_path=report_path
    )
    report = read_report(report_path)
    assert report["confidence"] == 0.9 and set(report["tests"]) == {"mcnemar_p"}
    non_null = {k for k, v in report["metrics"].items() if v is not None}
    assert non_null | {"acc_delta"} == set(report["intervals"])
    low, high = report["intervals"]["ctoi"]
    assert low <= report["metrics"]["ctoi"] <= high
    n, ctoi = result.n, round(report["metrics"]["ctoi"] * result.n)
    assert [low, high] == pytest.approx(proportion_confint(ctoi, n, 0.1, method="wilson"))


@pytest.mark.parametrize(("rate", "threshold"), [(0.0273, 0.03), (0.018, 0.02), (0.01, 0.02), (0.95, 0.9)])
def test_the_coarse_sample_size_is_never_below_the_smallest_and_close_to_it(rate, threshold):
    at_most = rate < threshold
    exact = ci.samples_needed(rate, threshold, at_most, 0.95, "upper" if at_most else "lower")
    coarse = ci.samples_needed(rate, threshold, at_most, 0.95, "upper" if at_most else "lower", coarse=True)
    assert exact <= coarse <= 1.02 * exact
