"""No-training repairs (blend, rerank): their invariants as properties, small cases by hand, and a
cross-check of rerank against a plain loop."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from consistency_gate.ensembles.repair import Repair, aligned, blend, rerank, tune
from consistency_gate.errors import UsageError


@st.composite
def generations(draw):
    """Two generations' probabilities over the same classes, and true labels."""
    p, n = draw(st.integers(2, 8)), draw(st.integers(1, 30))
    unit = st.floats(0.01, 1.0, allow_nan=False)
    prev, cand = (draw(arrays(np.float64, (n, p), elements=unit)) for _ in range(2))
    y = draw(arrays(np.int64, n, elements=st.integers(0, p - 1)))
    return prev / prev.sum(1, keepdims=True), cand / cand.sum(1, keepdims=True), y


def _rerank_by_loop(prev, cand, k):
    out = cand.copy()
    for i in range(len(cand)):
        top = sorted(range(cand.shape[1]), key=lambda c: (-cand[i, c], c))[:k]
        chosen = max(top, key=lambda c: (prev[i, c], -top.index(c)))  # first of equal scores wins
        out[i, top[0]], out[i, chosen] = cand[i, chosen], cand[i, top[0]]
    return out


@settings(max_examples=150, deadline=None)
@given(generations(), st.integers(2, 8))
def test_rerank_keeps_the_candidates_top_k_and_never_adds_a_negative_flip(data, k):
    prev, cand, y = data
    k = min(k, cand.shape[1])
    out = rerank(prev, cand, k)
    assert np.allclose(np.sort(out, 1), np.sort(cand, 1))  # each row a permutation of the candidate's
    answer = out.argmax(1)
    top = np.argsort(-cand, 1, kind="stable")[:, :k]
    assert all(answer[i] in top[i] for i in range(len(y)))  # the answer is one of the candidate's first k
    prev_right = prev.argmax(1) == y
    ctoi = lambda scores: np.mean(prev_right & (scores.argmax(1) != y))  # noqa: E731
    assert ctoi(out) <= ctoi(cand)  # where the previous generation was right and in the top k, it is kept
    assert np.allclose(out, _rerank_by_loop(prev, cand, k))


@settings(max_examples=100, deadline=None)
@given(generations(), st.floats(0, 1))
def test_blend_is_a_distribution_between_both_generations(data, w):
    prev, cand, _ = data
    out = blend(prev, cand, w)
    assert (
        np.allclose(out.sum(1), 1)
        and np.allclose(blend(prev, cand, 0), cand)
        and np.allclose(blend(prev, cand, 1), prev)
    )
    assert np.all(out >= np.minimum(prev, cand) - 1e-12) and np.all(out <= np.maximum(prev, cand) + 1e-12)


def test_by_hand():
    prev = np.array([[0.6, 0.3, 0.1], [0.1, 0.1, 0.8]])
    cand = np.array([[0.2, 0.5, 0.3], [0.5, 0.4, 0.1]])
    # k 2: row 0's top 2 are classes 1, 2 (the previous generation prefers 1); row 1's are 0, 1 (a tie: 0)
    assert rerank(prev, cand, 2).tolist() == cand.tolist()
    # k 3: the previous generation's own answer (0, then 2) is in each top 3: it swaps with the first choice
    assert rerank(prev, cand, 3).tolist() == [[0.5, 0.2, 0.3], [0.1, 0.4, 0.5]]
    assert blend(prev, cand, 0.5).argmax(1).tolist() == [0, 2]  # [0.4, 0.4, 0.2]: a tie goes to the first class


def test_classes_align_by_name_and_settings_are_checked():
    p, c, classes = aligned(pd.DataFrame({"dog": [1.0], "cat": [0.0]}), pd.DataFrame({"eel": [0.2], "cat": [0.8]}))
    assert classes == ["cat", "dog", "eel"] and p.tolist() == [[0.0, 1.0, 0.0]] and c.tolist() == [[0.8, 0.0, 0.2]]
    with pytest.raises(UsageError, match=r"weight \(blend\) must be in \[0, 1\]"):
        blend(p, c, -0.1)
    with pytest.raises(UsageError, match=r"k \(rerank\) must be an integer >= 2"):
        rerank(p, c, 1)
    with pytest.raises(UsageError, match="larger than the 3 classes"):
        rerank(p, c, 4)


def test_tuning_takes_the_setting_closest_to_the_candidate_that_passes():
    prev = np.array([[0.9, 0.05, 0.05]] * 4)
    cand = np.array([[0.3, 0.4, 0.3]] * 4)
    passes_when_class_0 = lambda p: (bool((p.argmax(1) == 0).all()), float((p.argmax(1) != 0).mean()))  # noqa: E731
    # w 0.1 still answers class 1 (0.36 against 0.365); w 0.2 answers class 0
    assert tune("blend", prev, cand, passes_when_class_0, "calib.csv") == Repair("blend", 0.2, 3, "calib.csv")
    assert tune("rerank", prev, cand, passes_when_class_0, "calib.csv").k == 2  # class 0 is 2nd (before 2 by order)
    never = lambda p: (False, float((p.argmax(1) != 0).mean()))  # noqa: E731
    assert tune("blend", prev, cand, never, "calib.csv").weight == 0.2  # none passes: the fewest flips, the first
