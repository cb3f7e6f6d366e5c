"""Rules that decide on a one-sided bound (decide: estimate | upper | lower), their false-pass rates,
the sample-size advice and `consistency-gate plan` (exact binomial power), each cross-checked against
statsmodels / scipy or by simulation."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom
from statsmodels.stats.proportion import proportion_confint

from consistency_gate.core import intervals as ci
from consistency_gate.errors import UsageError
from consistency_gate.gate.config import parse_config
from consistency_gate.gate.rules import Rule, evaluate_rules

# CtoI 0.018 on 600 samples: the estimate passes a 0.02 rule, its 95% interval reaches past 0.03
N, CTOI = 600, 11
METRICS = {"ctoi": CTOI / N, "acc_candidate": 0.9, "acc_previous": 0.91}
INTERVALS = {"ctoi": list(ci.wilson(CTOI, N, 0.95)), "acc_delta": [-0.04, 0.02]}
BOUNDS = {"ctoi": list(ci.clopper_pearson(CTOI, N, 0.90)), "acc_delta": [-0.035, 0.015]}


def _held(rule: Rule) -> bool:
    return evaluate_rules([rule], METRICS, intervals=INTERVALS, bounds=BOUNDS, level=0.95, n=N)[0].held


def test_the_three_modes_on_a_max_rule():
    assert BOUNDS["ctoi"][0] < 0.02 < BOUNDS["ctoi"][1]
    assert _held(Rule("ctoi", "max", 0.02)) is True  # estimate 0.0183
    assert _held(Rule("ctoi", "max", 0.02, decide="upper")) is False  # not shown good enough
    assert _held(Rule("ctoi", "max", 0.02, decide="lower")) is True  # violation not shown
    assert _held(Rule("ctoi", "max", 0.005, decide="lower")) is False  # lower bound 0.0103 > 0.005: shown


def test_min_delta_decides_on_the_paired_interval():
    assert _held(Rule("acc", "min_delta", -0.02)) is True  # estimate -0.01
    assert _held(Rule("acc", "min_delta", -0.02, decide="lower")) is False  # -0.035 < -0.02
    assert _held(Rule("acc", "min_delta", -0.02, decide="upper")) is True
    with pytest.raises(UsageError, match="paired interval"):
        Rule("cacc@5", "min_delta", -0.01, decide="upper")


def test_a_rule_failing_on_its_bound_says_how_many_samples_would_decide_it():
    rule = Rule("ctoi", "max", 0.02, decide="upper")
    result = evaluate_rules([rule], METRICS, intervals=INTERVALS, bounds=BOUNDS, n=N)[0]
    assert result.held is False and result.compared == pytest.approx(BOUNDS["ctoi"][1])
    exact = ci.samples_needed(CTOI / N, 0.02, at_most=True, level=0.95)
    said = re.search(r"about ([\d,]+) samples would pass it with 80% power \(this set has 600\)", result.note)
    needed = int(said.group(1).replace(",", ""))  # read coarsely: never below the smallest, within 2% of it
    assert exact <= needed <= 1.02 * exact
    assert needed == ci.samples_needed(CTOI / N, 0.02, at_most=True, level=0.95, coarse=True)
    row = result.to_dict()
    assert (
        row["decide"] == "upper" and row["interval"] == INTERVALS["ctoi"] and row["condition"].endswith("(upper bound)")
    )
    assert row["judged_on"] == "one-sided 95% upper bound (exact binomial)"
    assert row["false_pass"] == pytest.approx(binom.cdf(6, N, 0.02))  # 6/600 is the last count that passes


def test_the_one_sided_bound_is_the_exact_one_at_the_configured_level():
    """At 0.95, a strict rule passes a model exactly at the threshold at most 5% of the time;
    the bound compared is statsmodels' one-sided exact bound (alpha 0.05 on one side)."""
    counts = {"ctoi": (CTOI, N)}
    low, high = proportion_confint(CTOI, N, alpha=0.10, method="beta")  # each end one-sided at 95%
    assert BOUNDS["ctoi"] == pytest.approx([low, high], abs=1e-12)
    for n in (100, 600, 5000):
        for level in (0.9, 0.95, 0.99):
            chance = ci.pass_probability(n, 0.02, 0.02, True, "upper", level)
            assert chance <= 1 - level + 1e-12
    assert counts  # the one-pass counts feed these bounds in test_intervals


@given(
    st.integers(1, 300),
    st.floats(0.0, 1.0),
    st.sampled_from(["estimate", "upper", "lower"]),
    st.sampled_from([0.9, 0.95, 0.99]),
)
@settings(max_examples=150, deadline=None)
def test_passing_count_is_the_largest_count_whose_bound_meets_the_threshold(n, threshold, decide, level):
    """The binomial-tail shortcut equals comparing the Clopper-Pearson bound of every count."""
    by_bound = -1
    for k in range(n + 1):
        low, high = ci.clopper_pearson(k, n, ci.one_sided(level))
        if {"estimate": k / n, "upper": high, "lower": low}[decide] <= threshold + 1e-12:
            by_bound = k
    assert int(ci.passing_count(n, threshold, decide, level)) == by_bound


@given(
    st.integers(1, 10**7),
    st.floats(0.0, 1.0),
    st.floats(1e-9, 1 - 1e-9),  # the tail a rule's level leaves (a subnormal q has no digits to compare)
    st.sampled_from([0.0, 0.5, 1.0, 2.0, 6.0]),
)
@settings(max_examples=300, deadline=None)
def test_binomial_cdf_and_quantile_match_scipy_stats(n, where, q, skew):
    """What the gate computes without importing scipy.stats (:func:`ci.binomial_cdf`,
    :func:`ci.binomial_quantile`) against scipy.stats.binom, small rates included. Where P(X <= k)
    is q to rounding (Bin(61, 1/2) at 30 is 0.5; q = 1 - 1e-16), the two round to either side of it
    and their quantiles may differ."""
    p = where ** (1 + skew)  # rates near 0 as often as not
    k = np.array([-1, 0, int(n * where), n - 1, n, n + 1])
    expected = binom.cdf(k, n, p)
    assert np.allclose(ci.binomial_cdf(k, n, p), expected, rtol=1e-9, atol=1e-300)
    ours, theirs = int(ci.binomial_quantile(q, n, p)), int(binom.ppf(q, n, p))
    if ours != theirs:  # only where P(X <= k) is q to rounding for every k between them
        assert np.allclose(binom.cdf(np.arange(min(ours, theirs), max(ours, theirs)), n, p), q, rtol=1e-9, atol=0)


@pytest.mark.parametrize(
    ("rate", "threshold", "at_most", "decide"),
    [
        (0.01, 0.02, True, "upper"),
        (0.97, 0.95, False, "lower"),
        (0.03, 0.02, True, "lower"),
        (0.6, 0.55, False, "estimate"),
    ],
)
def test_plan_sizes_have_the_stated_power_exactly_and_in_simulation(rate, threshold, at_most, decide):
    n = ci.samples_needed(rate, threshold, at_most, 0.95, decide, power=0.8)
    meets = rate < threshold if at_most else rate > threshold
    # exact: sum the binomial over every count whose bound decides the rule the right way
    low_high = [ci.clopper_pearson(k, n, 0.90) for k in range(n + 1)]
    compared = [
        {"estimate": k / n, "upper": hi, "lower": lo}[decide]
        for k, (lo, hi) in zip(range(n + 1), low_high, strict=True)
    ]
    passes = np.array([c <= threshold + 1e-12 if at_most else c >= threshold - 1e-12 for c in compared])
    right = binom.pmf(np.arange(n + 1), n, rate)[passes == meets].sum()
    assert right >= 0.8
    smaller = ci.pass_probability(np.arange(1, n), rate, threshold, at_most, decide, 0.95)
    assert np.all((smaller if meets else 1 - smaller) < 0.8)  # n is the smallest size that reaches it
    draws = np.random.default_rng(0).binomial(n, rate, 20_000)
    assert np.mean(passes[draws] == meets) >= 0.78


def test_plan_meets_the_issue_case_and_a_standard_power_calculation():
    """ctoi <= 0.02 decided on the upper bound, at an expected 1%: the normal one-sided power formula
    (z 1.645 and 0.842) gives 986; the exact answer is within 3% of it, at 82% power."""
    from scipy.stats import norm

    z_a, z_b = norm.ppf(0.95), norm.ppf(0.8)
    normal = ((z_a * np.sqrt(0.02 * 0.98) + z_b * np.sqrt(0.01 * 0.99)) / 0.01) ** 2
    exact = ci.samples_needed(0.01, 0.02, at_most=True, level=0.95)
    assert round(normal) == 986 and exact == 969 and abs(exact - normal) / normal < 0.03


def test_decide_in_the_config_and_its_errors():
    config = parse_config("rules:\n  - {metric: ctoi, max: 0.02, decide: upper}\n  - {metric: rel_nfr, max: 1.5}\n")
    assert [r.decide for r in config.rules] == ["upper", "estimate"]
    with pytest.raises(UsageError, match=r"line 2: rules\[0\].decide: Input should be 'estimate', 'upper' or 'lower'"):
        parse_config("rules:\n  - {metric: ctoi, max: 0.02, decide: maybe}\n", "g.yaml")
    with pytest.raises(UsageError, match="g.yaml: line 2: .*paired interval"):
        parse_config(
            "ks: [1, 5]\nrules:\n  - {metric: cacc@5, min_delta: 0, decide: lower}\n".replace("ks: [1, 5]\n", ""),
            "g.yaml",
        )


def test_plan_prints_the_sizes_needed(tmp_path):
    config = tmp_path / "gate.yaml"
    config.write_text("rules:\n  - {metric: ctoi, max: 0.02, decide: upper}\n  - {metric: pearson, min: 0.5}\n")
    proc = run_cli("plan", "--rules", config, "--rate", "ctoi=0.01", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["confidence"] == 0.95 and out["power"] == 0.8
    assert out["rules"][0]["samples"] == ci.samples_needed(0.01, 0.02, at_most=True, level=0.95) == 969
    assert out["rules"][0]["power"] >= 0.8 and out["rules"][0]["false_pass"] <= 0.05
    assert out["rules"][1]["samples"] is None and "no size formula" in out["rules"][1]["note"]
    stronger = json.loads(
        run_cli("plan", "--config", config, "--rate", "ctoi=0.01", "--power", "0.9", "--format", "json").stdout
    )
    assert stronger["rules"][0]["samples"] > 969 and stronger["rules"][0]["power"] >= 0.9
    table = run_cli("plan", "--config", config, "--rate", "ctoi=0.01")
    assert "80% power" in table.stdout and "969" in table.stdout and "false pass" in table.stdout
    bad = run_cli("plan", "--rules", config, "--rate", "ctoi")
    assert bad.returncode == 2 and "METRIC=R" in bad.stderr


def test_plan_needs_a_rate_and_takes_the_config_by_its_name_in_check(tmp_path):
    config = tmp_path / "gate.yaml"
    config.write_text("rules:\n  - {metric: ctoi, max: 0.02}\n  - {metric: con, min: 0.9}\n")
    proc = run_cli("plan", "--config", config)
    assert proc.returncode == 2 and "--rate METRIC=R" in proc.stderr and "con, ctoi" in proc.stderr
    assert run_cli("plan", "--config", config, "--rate", "ctoi=0.01").returncode == 0
    missing = run_cli("config", "--check", tmp_path / "nofile.yaml")
    assert missing.returncode == 2 and "--config" not in missing.stderr
    assert f"{tmp_path / 'nofile.yaml'}: cannot read the config file" in missing.stderr
