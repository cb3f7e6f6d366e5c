"""Gate configs: every mistake is one line naming the file, the YAML line and the key path (exit 2)."""

from __future__ import annotations

import pytest

from consistency_gate.errors import UsageError
from consistency_gate.gate.config import parse_config

RULE = "rules:\n  - {metric: con, min: 0.9}\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "rulez: []\n",
            "gate.yaml: line 1: unknown key 'rulez' "
            "(known: classes, confidence, decision, floor, intervals, ks, remediation, rules, slices)",
        ),
        (
            "rules:\n  - {metric: con, mx: 0.9}\n",
            "line 2: unknown key 'mx' in rules[0] (known: decide, history, max, metric, min",
        ),
        ("rules:\n  - con\n", "line 2: rules[0]: expected a mapping (key: value) (got 'con')"),
        ("rules:\n  - {metric: ctio, max: 0.02}\n", "unknown metric 'ctio'; did you mean 'ctoi'? known: acc,"),
        (
            "rules:\n  - {metric: latency_ratio, max: 5, decide: upper}\n",
            "line 2: rule for 'latency_ratio': a serving cost is measured once, without an interval",
        ),
        ("rules:\n  - {metric: size_ratio, min_delta: 1}\n", "min_delta applies to per-learner metrics"),
        ("rules:\n  - {metric: con, min: 0.9, max: 1}\n", "line 2: rules[0]: rule for 'con' needs exactly one of"),
        ("rules:\n  - {metric: con, min: yes}\n", "line 2: rules[0].min: Input should be a valid number"),
        ("rules:\n  - {metric: con, min: .inf}\n", "line 2: rules[0].min: Input should be a finite number"),
        ("ks: [1, 0]\n" + RULE, "line 1: ks[1]: Input should be greater than or equal to 1"),
        (RULE + "remediation:\n  data: t.csv\n  colour: red\n", "line 5: unknown key 'colour' in remediation"),
        (RULE + "remediation:\n  data: t.csv\n  combination: median\n", "line 5: remediation.combination"),
        (RULE + "remediation:\n  data: t.csv\n  m: 0\n", "gate.yaml: remediation m must be an integer >= 1"),
        (RULE + "remediation:\n  m: 2\n", "gate.yaml: remediation: 'data' (the training data file) is required"),
        (RULE + "remediation:\n  data: t.csv\n  threads: -1\n", "remediation threads must be an integer >= 0"),
        (RULE + "classes: []\n", "line 3: classes: List should have at least 1 item"),
        (
            RULE + "remediation:\n  data: t.csv\n  distillation: {loss: js}\n",
            "line 5: remediation.distillation.loss: Input should be 'kl' or 'lm'",
        ),
        (RULE + "remediation:\n  data: t.csv\n  distillation: {beta: -1.0}\n", "remediation.distillation.beta"),
        (RULE + "remediation:\n  data: t.csv\n  distillation: {gamma: 2.0}\n", "unknown key 'gamma'"),
        (RULE + "remediation:\n  data: t.csv\n  teacher_method: mcdropout\n", "teacher_method 'mcdropout' cannot"),
        (RULE + "remediation:\n  data: t.csv\n  optimizer: rmsprop\n", "line 5: remediation.optimizer: Input should"),
        (RULE + "remediation:\n  data: t.csv\n  snapshot_one_run: 2\n", "line 5: remediation.snapshot_one_run"),
        (
            RULE + "remediation:\n  strategy: [memory]\n  options:\n    memory: {}\n",
            "gate.yaml: remediation: memory: it remembers the answers of a population: name it with options: memory: "
            "population: <file>",
        ),
        (
            RULE + "remediation:\n  strategy: [blend, memory]\n",
            "gate.yaml: remediation: memory: it remembers the answers of a population",
        ),
    ],
)
def test_config_mistakes_name_the_line_and_key(text, expected):
    with pytest.raises(UsageError) as caught:
        parse_config(text, "gate.yaml")
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value) and "_RuleSpec" not in str(caught.value)


def test_a_valid_config_keeps_its_values():
    config = parse_config(
        "ks: [5, 1]\nrules:\n  - {metric: ctoi, max: 0.02}\n  - {metric: acc, min_delta: -0.01}\n"
        "remediation:\n  data: train.csv\n  combination: WAVG\n  N: 3\n  epochs: 6\n  enabled: true\n  threads: 2\n"
        "  optimizer: adam\n  snapshot_one_run: false\n",
        "gate.yaml",
    )
    assert config.ks == (1, 5) and config.rule_ks == ()
    assert [(r.metric, r.kind, r.threshold, r.line) for r in config.rules] == [
        ("ctoi", "max", 0.02, 3),
        ("acc", "min_delta", -0.01, 4),
    ]
    assert config.remediation.combination == "wavg" and config.remediation.settings.n_snapshots == 3
    assert config.remediation.settings.threads == 2 and config.remediation.settings.optimizer == "adam"
    assert config.remediation.settings.snapshot_one_run is False
    assert parse_config(RULE + "remediation:\n  enabled: false\n").remediation is None


def test_config_check_says_each_methods_own_settings(tmp_path):
    """``config --check`` prints each method's own settings: a memory's population and options, an ensemble's
    members and snapshots; never DynSnap's settings for a method that does not train."""
    from consistency_gate.cli import main

    path = tmp_path / "gate.yaml"
    path.write_text(
        RULE + "remediation:\n  data: t.csv\n  strategy: [memory, dynsnap-step]\n  tuning_share: 0.3\n"
        "  options:\n    memory: {population: pop.csv, cost_ratio: 2}\n"
    )
    lines = _output(main, ["config", "--check", str(path)])
    assert "  remediation: memory then dynsnap-step; recipe mlp, training data t.csv" in lines
    memory = "    memory: population pop.csv, cost_ratio 2.0, likelihood answers, decay 1.0; update replayed at each"
    assert memory + " gate" in lines
    assert "    dynsnap-step: m 20 members, N 10 snapshots, epochs 40, optimizer sgd" in lines


def _output(main, args: list[str]) -> list[str]:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        main(args)
    assert done.value.code == 0, out.getvalue()
    return out.getvalue().splitlines()
