"""The Bayesian update over generations (Traeuble et al. 2021) as properties and a case by hand."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from consistency_gate.ensembles.answers import class_indices, confusion
from consistency_gate.ensembles.bayes import BayesUpdate


@st.composite
def updates(draw):
    """2 to 5 generations over 2 to 4 classes: random row-stochastic confusions and answers."""
    p = draw(st.integers(2, 4))
    k = draw(st.integers(2, 5))
    n = draw(st.integers(1, 20))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    confusions = [rng.dirichlet(np.ones(p), size=p) + 1e-3 for _ in range(k)]
    confusions = [m / m.sum(axis=1, keepdims=True) for m in confusions]
    answers = [rng.integers(0, p, size=n) for _ in range(k)]
    return [str(i) for i in range(p)], confusions, answers


@settings(max_examples=80, deadline=None)
@given(updates())
def test_the_cost_ratio_moves_from_the_belief_to_the_baseline(case):
    classes, confusions, answers = case
    belief = BayesUpdate(classes, confusions).belief(answers)
    assert np.allclose(belief.sum(axis=1), 1.0) and (belief >= 0).all()
    max_belief = BayesUpdate(classes, confusions, cost_ratio=1.0).answers(answers)
    assert (belief[np.arange(len(belief)), max_belief] == belief.max(axis=1)).all()
    assert (BayesUpdate(classes, confusions, cost_ratio=1e12).answers(answers) == answers[-2]).all()
    for ratio in (1.0, 2.0, 10.0):
        update = BayesUpdate(classes, confusions, cost_ratio=ratio)
        chosen = update.answers(answers)
        assert (update.scores(answers).argmax(axis=1) == chosen).all()
        changed = chosen != answers[-2]  # a change of the baseline's answer always has the ratio behind it
        rows = np.arange(len(belief))
        assert (belief[rows, chosen][changed] > ratio * belief[rows, answers[-2]][changed]).all()


def test_by_hand():
    # the candidate alone disagrees with two reliable generations: the baseline's answer stands; the
    # baseline alone disagrees with them: its answer changes
    reliable = confusion(["a"] * 9 + ["b"] * 9, ["a"] * 8 + ["b"] + ["b"] * 8 + ["a"], ["a", "b"], alpha=0)
    assert np.allclose(reliable, [[8 / 9, 1 / 9], [1 / 9, 8 / 9]])
    update = BayesUpdate(["a", "b"], [reliable] * 3, cost_ratio=3.0)
    said = [class_indices(x, ["a", "b"]) for x in (["a", "a"], ["a", "b"], ["b", "a"])]
    assert update.answers(said).tolist() == [0, 0]
    assert update.scores(said).tolist() == [[1.0, 0.0], [1.0, 0.0]]
