"""The memory's setting chosen by replaying the team's history on the tuning ids (consistency_gate.ensembles.
memory_replay): cross-checked against a replay written apart in dense numpy, counted by hand on a small case,
and the history a memory version carries read back as written."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consistency_gate.ensembles import memory_replay
from consistency_gate.ensembles.answers import COST_RATIOS
from consistency_gate.ensembles.memory_replay import MARGIN, MISSING, History, choose, grid


def _dense(answers, truth, p, ratio, estimate):
    """What users see after each generation with the independent update, in plain numpy: log-beliefs summed
    from each generation's add-one confusion matrix (rows the truth) on the ``estimate`` ids."""

    def matrix(g):
        counts = np.ones((p, p))
        np.add.at(counts, (truth[estimate], answers[g][estimate]), 1.0)
        return counts / counts.sum(axis=1, keepdims=True)

    belief = np.log(matrix(0)).T[answers[0]].astype(np.float32)
    shown, out = answers[0].copy(), [answers[0].copy()]
    for g in range(1, len(answers)):
        belief = belief + np.log(matrix(g)).T[answers[g]].astype(np.float32)
        belief -= belief.max(axis=1, keepdims=True)
        change = -belief[np.arange(len(shown)), shown] > np.float32(np.log(ratio)) + np.float32(1e-6)
        shown = np.where(change, belief.argmax(axis=1), shown)
        out.append(shown.copy())
    return np.array(out)


def _by_numpy(answers, truth, p):
    """The rule, apart: for each ratio the replay on each half with the other half's matrices, then the fewest
    negative flips (the most accurate of those) among the settings within MARGIN of replacing on the paired bound
    (else the most accurate)."""
    n = answers.shape[1]
    fold = np.arange(n) % memory_replay.FOLDS
    replaced = answers == truth
    rows = []
    for ratio in COST_RATIOS:
        shown = np.empty_like(answers)
        for f in range(memory_replay.FOLDS):
            mine = fold == f
            estimate = ~mine if (~mine).any() else mine
            shown[:, mine] = _dense(answers, truth, p, ratio, estimate)[:, mine]
        right = shown == truth
        gain = (right[1:] * 1.0 - replaced[1:]).ravel()
        bound = gain.mean() + memory_replay.SPREAD * gain.std(ddof=1) / np.sqrt(len(gain))
        rows.append((ratio, int((right[:-1] & ~right[1:]).sum()), gain.mean(), bound))
    admitted = [r for r in rows if r[3] >= -MARGIN]
    if admitted:
        return min(admitted, key=lambda r: (r[1], -r[2]))  # the fewest flips, then the most accurate
    return max(rows, key=lambda r: r[2])


@settings(max_examples=20, deadline=None)
@given(
    p=st.integers(2, 4),
    n=st.integers(8, 30),
    generations=st.integers(2, 4),
    accuracy=st.floats(0.4, 0.95),
    seed=st.integers(0, 2**16),
)
def test_the_choice_is_the_one_a_dense_numpy_replay_makes(p, n, generations, accuracy, seed):
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, p, n)
    answers = np.where(rng.random((generations, n)) < accuracy, truth, rng.integers(0, p, (generations, n)))
    history = History([f"i{k}" for k in range(n)], answers.astype(np.int16))
    chosen = choose(history, truth, [str(c) for c in range(p)], grid("independent", None))
    ratio, flips, change, bound = _by_numpy(answers, truth, p)
    assert (chosen.flips, chosen.accuracy_change) == pytest.approx((flips, change))
    assert chosen.bound == pytest.approx(bound)
    assert chosen.cost_ratio == ratio or (chosen.flips, chosen.accuracy_change) == pytest.approx((flips, change))
    replaced = answers == truth
    assert chosen.replace_flips == int((replaced[:-1] & ~replaced[1:]).sum())
    assert (chosen.generations, chosen.ids, chosen.settings) == (generations - 1, n, len(COST_RATIOS))


def test_by_hand_a_retrain_that_breaks_what_users_had_right_is_held_back():
    """Forty ids of two classes: users saw 30 right (the first model); the retrain gets 4 of those wrong and
    fixes none. Replacing makes 4 negative flips and loses 4 of 40 answers (10 points, far outside the margin);
    a memory at any ratio above the evidence of one retrain keeps what users saw: no flip, no loss. The rule
    takes the fewest flips within the margin: a ratio that keeps every answer."""
    truth = np.array([0] * 20 + [1] * 20)
    first = truth.copy()
    first[[20, 21, 22, 23, 24, 25, 26, 27, 28, 29]] = 0  # 10 wrong: users saw 30 right
    retrain = first.copy()
    retrain[[0, 1, 2, 3]] = 1  # 4 right answers broken, nothing fixed
    history = History([f"i{k}" for k in range(40)], np.array([first, retrain], dtype=np.int16))
    chosen = choose(history, truth, ["a", "b"])
    assert chosen.replace_flips == 4
    assert chosen.flips == 0 and chosen.accuracy_change >= 0  # the memory keeps all 30 (no loss against 26)
    assert chosen.accuracy_change == pytest.approx(4 / 40)
    assert chosen.bound >= -MARGIN


def test_ids_without_a_whole_history_or_a_known_label_are_left_out():
    history = History(["a", "b", "c", "d"], np.array([[0, 1, MISSING, 0], [0, 1, 1, 1]], dtype=np.int16))
    chosen = choose(history, np.array([0, 1, 1, -1]), ["x", "y"])
    assert chosen.ids == 2  # c: the first generation never answered it; d: its label is not a class


def test_a_history_is_read_back_as_written_and_continued_on_the_next_gates_ids(tmp_path):
    history = History(["a", "b", "c"], np.array([[0, 1, 2], [1, 1, 2]], dtype=np.int16))
    history.write(tmp_path / "replay.parquet")
    back = History.read(tmp_path / "replay.parquet")
    assert back.ids == history.ids and np.array_equal(back.answers, history.answers)
    later = History.started(back, ["c", "z", "a"], seen=np.array([9, 9, 9])).appended(np.array([2, 0, 1]))
    assert later.ids == ["c", "z", "a"]
    assert later.answers.tolist() == [[2, MISSING, 0], [2, MISSING, 1], [2, 0, 1]]
    first = History.started(None, ["a", "b"], seen=np.array([1, 0])).appended(np.array([1, 1]))
    assert first.answers.tolist() == [[1, 0], [1, 1]]
    assert History.read(tmp_path / "absent.parquet") is None
