"""Rules that decide on an interval's bound (decide: estimate | upper | lower), the sample-size advice
and `consistency-gate plan`."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from statsmodels.stats.proportion import proportion_confint

from consistency_gate.core import intervals as ci
from consistency_gate.errors import UsageError
from consistency_gate.gate.rules import Rule, evaluate_rules, parse_config

# CtoI 0.018 on 600 samples: the estimate passes a 0.02 rule, its 95% interval reaches past 0.03
N, CTOI = 600, 11
METRICS = {"ctoi": CTOI / N, "acc_candidate": 0.9, "acc_previous": 0.91}
INTERVALS = {"ctoi": list(ci.wilson(CTOI, N, 0.95)), "acc_delta": [-0.04, 0.02]}


def _held(rule: Rule) -> bool:
    return evaluate_rules([rule], METRICS, intervals=INTERVALS, level=0.95, n=N)[0].held


def test_the_three_modes_on_a_max_rule():
    assert INTERVALS["ctoi"][0] < 0.02 < INTERVALS["ctoi"][1]
    assert _held(Rule("ctoi", "max", 0.02)) is True  # estimate 0.0183
    assert _held(Rule("ctoi", "max", 0.02, decide="upper")) is False  # not shown good enough
    assert _held(Rule("ctoi", "max", 0.02, decide="lower")) is True  # violation not shown
    assert _held(Rule("ctoi", "max", 0.005, decide="lower")) is False  # lower bound 0.0102 > 0.005: shown


def test_min_delta_decides_on_the_paired_interval():
    assert _held(Rule("acc", "min_delta", -0.02)) is True  # estimate -0.01
    assert _held(Rule("acc", "min_delta", -0.02, decide="lower")) is False  # -0.04 < -0.02
    assert _held(Rule("acc", "min_delta", -0.02, decide="upper")) is True
    with pytest.raises(UsageError, match="paired interval"):
        Rule("cacc@5", "min_delta", -0.01, decide="upper")


def test_a_rule_failing_on_its_bound_says_how_many_samples_would_decide_it():
    result = evaluate_rules([Rule("ctoi", "max", 0.02, decide="upper")], METRICS, intervals=INTERVALS, n=N)[0]
    assert result.held is False and result.compared == pytest.approx(INTERVALS["ctoi"][1])
    needed = ci.samples_needed(CTOI / N, 0.02, at_most=True, level=0.95)
    assert f"about {needed:,} samples would show ctoi <= 0.02 at 95% (this set has 600)" in result.note
    low, high = proportion_confint(round(CTOI / N * needed), needed, 0.05, method="wilson")
    assert high <= 0.02 + 2e-4  # at that size the upper bound reaches the threshold (up to rounding k)
    row = result.to_dict()
    assert (
        row["decide"] == "upper" and row["interval"] == INTERVALS["ctoi"] and row["condition"].endswith("(upper bound)")
    )


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
    assert out["confidence"] == 0.95
    assert out["rules"][0]["samples"] == ci.samples_needed(0.01, 0.02, at_most=True, level=0.95) == 753
    assert out["rules"][1]["samples"] is None and "no size formula" in out["rules"][1]["note"]
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
