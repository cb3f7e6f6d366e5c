"""The share of the evaluation set a gate holds out to tune repairs on (``tuning_share:``): which samples,
by their ids alone; too small a share; the config's checks. The gate's use of it, on a real store, is in
test_repair_gate.py."""

import numpy as np
import pandas as pd
import pytest
from conftest import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from consistency_gate.errors import UsageError
from consistency_gate.gate.config import parse_config
from consistency_gate.gate.tuning import MIN_TUNING, held_out_mask, hold_out

RULES = "rules:\n  - {metric: ctoi, max: 0.02}\n"


@settings(max_examples=60, deadline=None)
@given(
    ids=st.lists(st.integers(-(10**12), 10**12) | st.text(max_size=8), unique_by=str, min_size=1, max_size=80),
    share=st.floats(0.05, 0.95),
    data=st.data(),
)
def test_a_sample_is_held_out_for_its_id_alone(ids, share, data):
    """The same id is on the same side whatever else the set holds and in whatever order: a set that grows,
    shrinks or is shuffled between two gates holds out the same old samples."""
    mask = dict(zip(map(str, ids), held_out_mask(ids, share), strict=True))
    other = data.draw(st.permutations(ids))[: data.draw(st.integers(1, len(ids)))]
    assert held_out_mask(other, share).tolist() == [mask[str(i)] for i in other]


def test_the_share_held_out_is_the_share_asked_for_and_grows_with_it():
    ids = np.arange(20_000)
    low, high = held_out_mask(ids, 0.2), held_out_mask(ids, 0.4)
    assert abs(low.mean() - 0.2) < 0.01 and abs(high.mean() - 0.4) < 0.01
    assert not (low & ~high).any()  # a larger share holds out every sample a smaller one does


def test_the_split_judges_and_tunes_on_samples_apart():
    frame = pd.DataFrame({"id": [f"s{i}" for i in range(300)], "x": np.arange(300.0), "label": ["a", "b", "c"] * 100})
    split = hold_out(frame, 0.3, "id", "label", ("id", "label"))
    held, judged = split.held_out.frame, split.judged
    assert set(held["id"]).isdisjoint(judged["id"]) and len(held) + len(judged) == 300
    assert list(split.held_ids) == held["id"].tolist() and split.by == "id"
    assert split.to_dict() == {
        "judged": len(judged), "tuning": len(held), "tuning_share": 0.3, "held_out_by": "id",
        "tuning_ids": "gate/tuning_ids.json",
    }  # fmt: skip
    by_row = hold_out(frame.drop(columns="id"), 0.3, None, "label", ("label",))
    rows = np.flatnonzero(held_out_mask(range(300), 0.3))
    assert by_row.by == "row" and list(by_row.held_ids) == [str(i) for i in rows]


def test_a_share_too_small_to_tune_on_holds_nothing_out_and_says_why():
    frame = pd.DataFrame({"id": range(120), "label": ["a", "b"] * 60})
    split = hold_out(frame, 0.1, "id", "label", ("id", "label"))
    assert split.held_out is None and split.judged is frame
    assert f"holds out {held_out_mask(range(120), 0.1).sum()} to tune on" in split.why_not
    assert f"at least {MIN_TUNING}" in split.why_not and "calibration: file" in split.why_not
    assert split.to_dict()["tuning"] == 0 and split.to_dict()["tuning_ids"] is None


@pytest.mark.parametrize(
    ("block", "text"),
    [
        ("tuning_share: 0.3\n  calibration: calib.csv", "calibration: and tuning_share: both name the data"),
        ("tuning_share: 1.0", "tuning_share"),
        ("tuning_share: 0", "tuning_share"),
        ("tuning_share: half", "tuning_share"),
    ],
    ids=["with a calibration file", "all of it", "none of it", "not a number"],
)
def test_bad_tuning_shares_are_usage_errors(block, text):
    with pytest.raises(UsageError, match=text):
        parse_config(RULES + "remediation:\n  strategy: [blend]\n  " + block + "\n")


def test_a_tuning_share_is_read_and_config_check_says_what_it_does(tmp_path):
    text = RULES + "remediation:\n  strategy: cheapest\n  tuning_share: 0.25\n  max_models: 2\n"
    config = parse_config(text)
    assert config.remediation.tuning_share == 0.25 and config.remediation.calibration is None
    (tmp_path / "gate.yaml").write_text(text)
    proc = run_cli("config", "--check", tmp_path / "gate.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "repairs tuned on 25% of the evaluation set held out by id (tuning_share), never judged on" in proc.stdout
    assert "at most 2 models in what remediation registers (max_models)" in proc.stdout
