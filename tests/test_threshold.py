"""Binary answers at a decision threshold: the positive class where P(positive) >= t. Properties
against a direct thresholding of the scores, the paper's invariants at any threshold, and the prediction
file gate with a ``decision:`` block."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consistency_gate.core.evaluation import evaluate_frames
from consistency_gate.core.threshold import BinaryDecision
from consistency_gate.errors import UsageError
from consistency_gate.gate.config import parse_config
from consistency_gate.gate.files import run_file_gate


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1), st.booleans()), min_size=1, max_size=40),
    st.floats(0.01, 0.99),
)
def test_answers_are_the_scores_thresholded_and_the_invariants_hold(rows, threshold):
    p_prev, p_cand, truth = (np.array(c) for c in zip(*rows, strict=True))
    labels = pd.Series(np.where(truth, "fraud", "ok"))
    frames = [pd.DataFrame({"ok": 1 - p, "fraud": p}) for p in (p_prev, p_cand)]
    result = evaluate_frames(labels, frames, [1, 2], "x", decision=BinaryDecision("fraud", threshold)).result()
    m = result.metrics
    prev, cand = (np.where(p >= threshold, "fraud", "ok") for p in (p_prev, p_cand))
    y = labels.to_numpy()
    assert m["acc_previous"] == pytest.approx(np.mean(prev == y))
    assert m["ctoi"] == pytest.approx(np.mean((prev == y) & (cand != y)))
    assert m["con"] == pytest.approx(np.mean(prev == cand))
    assert m["ctoc"] + m["ctoi"] == pytest.approx(m["acc_previous"])
    assert m["ctoc"] + m["itoc"] == pytest.approx(m["acc_candidate"])
    assert m["ccon@2"] == 1.0 and m["cacc_candidate@2"] == 1.0  # both classes are the top 2


def test_by_hand():
    labels = pd.Series(["fraud", "ok", "fraud"])
    prev = pd.DataFrame({"fraud": [0.3, 0.25, 0.1], "ok": [0.7, 0.75, 0.9]})
    cand = pd.DataFrame({"ok": [0.8, 0.6, 0.2], "fraud": [0.2, 0.4, 0.8]})
    at_half = evaluate_frames(labels, [prev, cand], [1], "x").result().metrics
    at_quarter = evaluate_frames(labels, [prev, cand], [1], "x", decision=BinaryDecision("fraud", 0.25)).result()
    # at 0.5 both answer ok, ok, ok / ok, ok, fraud; at 0.25: fraud, fraud, ok / ok, fraud, fraud
    assert (at_half["acc_previous"], at_half["acc_candidate"]) == (pytest.approx(1 / 3), pytest.approx(2 / 3))
    m = at_quarter.metrics
    assert (m["acc_previous"], m["acc_candidate"], m["ctoi"], m["itoc"]) == pytest.approx((1 / 3, 1 / 3, 1 / 3, 1 / 3))


def test_a_threshold_names_a_probability_and_a_class_of_the_models():
    with pytest.raises(UsageError, match="strictly between 0 and 1"):
        BinaryDecision("fraud", 0.0)
    with pytest.raises(UsageError, match="decision.positive 'fraud' is not a class of the models"):
        BinaryDecision("fraud", 0.3).resolved(["no", "yes"], None)
    with pytest.raises(UsageError, match="line 3: decision.threshold must be a probability"):
        parse_config("rules:\n  - {metric: ctoi, max: 0.05}\ndecision:\n  threshold: 1.0\n")


def test_the_file_gate_answers_at_the_configured_threshold(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # no run: another test's server may be gone
    rng = np.random.default_rng(0)
    n = 400
    truth = rng.random(n) < 0.3
    p_prev = np.clip(truth * 0.35 + rng.random(n) * 0.5, 0, 1)
    p_cand = np.clip(truth * 0.35 + rng.random(n) * 0.5, 0, 1)
    pd.DataFrame({"label": np.where(truth, "fraud", "ok")}).to_csv(tmp_path / "labels.csv", index=False)
    for name, p in (("previous", p_prev), ("candidate", p_cand)):
        pd.DataFrame({"fraud": p, "ok": 1 - p}).to_csv(tmp_path / f"{name}.csv", index=False)
    files = [tmp_path / f"{name}.csv" for name in ("labels", "previous", "candidate")]
    rules = "rules:\n  - {metric: ctoi, max: 0.5}\n"
    result = run_file_gate(*files, config=parse_config(rules + "decision: {positive: fraud, threshold: 0.3}\n"))
    prev, cand = (p >= 0.3 for p in (p_prev, p_cand))
    assert result.metrics["ctoi"] == pytest.approx(np.mean((prev == truth) & (cand != truth)))
    assert result.metrics["acc_candidate"] == pytest.approx(np.mean(cand == truth))
    with pytest.raises(UsageError, match="decision: names no positive class, and prediction files"):
        run_file_gate(*files, config=parse_config(rules + "decision: {threshold: 0.3}\n"))


def test_hostile_class_names_are_escaped_in_markdown(tmp_path, monkeypatch):
    """Markdown outputs embedded <script> and escape characters from class labels verbatim."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # no run: another test's server may be gone
    from consistency_gate.report.verdict import verdict_markdown

    hostile = "<script>alert(1)</script>|\x1b[31m"
    pd.DataFrame({"label": [hostile, "ok", hostile]}).to_csv(tmp_path / "labels.csv", index=False)
    for name, p in (("previous", [0.9, 0.2, 0.4]), ("candidate", [0.1, 0.2, 0.9])):
        pd.DataFrame({hostile: p, "ok": 1 - np.array(p)}).to_csv(tmp_path / f"{name}.csv", index=False)
    files = [tmp_path / f"{name}.csv" for name in ("labels", "previous", "candidate")]
    config = parse_config("rules:\n  - {metric: ctoi, max: 0.0}\ndecision: {positive: ok, threshold: 0.5}\n")
    result = run_file_gate(*files, config=config, name="<b>clf</b>")
    markdown = verdict_markdown(result.to_dict())
    assert "<script>" not in markdown and "<b>" not in markdown and "\x1b" not in markdown
    assert "&lt;b>clf&lt;/b>" in markdown
