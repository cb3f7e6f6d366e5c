"""The many-generation ledger's sums (Traeuble et al. 2021), as properties, by hand
and against a plain-loop recomputation; id alignment with missing and extra ids."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consistency_gate.core.history import answers, checked, forgotten, history
from consistency_gate.errors import DataError

CLASSES = ["a", "b", "c"]


@st.composite
def generations(draw, count: int | None = None):
    """Between 2 and 6 generations' answers on overlapping id sets drawn from 30 ids, one label per id."""
    ids = [f"s{i}" for i in range(30)]
    labels = {i: draw(st.sampled_from(CLASSES)) for i in ids}
    out = []
    for g in range(count or draw(st.integers(2, 6))):
        mine = draw(st.lists(st.sampled_from(ids), min_size=1, max_size=30, unique=True))
        said = [draw(st.sampled_from(CLASSES)) for _ in mine]
        out.append((str(g + 1), answers(mine, [labels[i] for i in mine], said)))
    return out


def _by_loops(gens):
    """NF_t, n_t and the ever-regressed share recomputed with dictionaries and loops."""
    steps, ever = [], {}
    for (_, old), (_, new) in zip(gens, gens[1:], strict=False):
        o = {r.id: r.answer == r.label for r in old.itertuples()}
        n = {r.id: r.answer == r.label for r in new.itertuples()}
        shared = [i for i in o if i in n]
        nf = 0
        for i in shared:
            flip = o[i] and not n[i]
            nf += flip
            ever[i] = ever.get(i, False) or flip
        steps.append((nf, len(shared)))
    return steps, (sum(ever.values()) / len(ever) if ever else None)


@settings(max_examples=60, deadline=None)
@given(generations())
def test_the_ledger_sums_equal_a_plain_recomputation(gens):
    h = history(gens)
    steps, ever = _by_loops(gens)
    assert [(s.negative_flips, s.n) for s in h.steps] == steps
    assert h.cumulative_negative_flips == sum(s.negative_flips for s in h.steps) == sum(nf for nf, _ in steps)
    assert h.ever_regressed == pytest.approx(ever) if ever is not None else h.ever_regressed is None
    for step in h.steps:
        assert 0 <= step.negative_flips <= step.n
        if step.nfr_interval:
            assert step.nfr_interval[0] - 1e-12 <= step.nfr <= step.nfr_interval[1] + 1e-12


@settings(max_examples=60, deadline=None)
@given(generations())
def test_forgotten_is_at_most_the_candidate_s_error_rate(gens):
    *champions, (_, candidate) = gens
    share = forgotten(candidate, [c for _, c in champions])
    ids = set(candidate["id"])
    shared = set().union(*(set(c["id"]) for _, c in champions)) & ids
    if not shared:
        assert share is None
        return
    rows = candidate[candidate["id"].isin(shared)]
    assert 0 <= share <= 1 - (rows["answer"] == rows["label"]).mean() + 1e-12


@settings(max_examples=30, deadline=None)
@given(generations(count=3), st.randoms())
def test_row_order_and_ids_outside_a_step_do_not_change_it(gens, rng):
    shuffled = [(v, g.sample(frac=1, random_state=rng.randrange(2**31))) for v, g in gens]
    extra = answers(["only-here"], ["a"], ["b"])
    widened = [(v, pd.concat([g, extra]) if i == 0 else g) for i, (v, g) in enumerate(shuffled)]
    assert [s.to_dict() for s in history(widened).steps] == [s.to_dict() for s in history(gens).steps]


def test_by_hand_missing_and_extra_ids():
    # g1 lacks s3 (missing), g2 adds s9 (extra): step 1 is over s1, s2; step 2 over s1, s2
    g0 = answers(["s1", "s2", "s3"], ["a", "b", "a"], ["a", "b", "a"])
    g1 = answers(["s1", "s2"], ["a", "b"], ["b", "b"])
    g2 = answers(["s2", "s1", "s9"], ["b", "a", "a"], ["a", "a", "b"])
    h = history([("1", g0), ("2", g1), ("3", g2)])
    assert [(s.previous, s.version, s.n, s.negative_flips) for s in h.steps] == [("1", "2", 2, 1), ("2", "3", 2, 1)]
    assert h.cumulative_negative_flips == 2 and h.samples == 2 and h.ever_regressed == 1.0
    assert h.steps[0].accuracy == 0.5
    # s9 was never answered by a champion: out of forgotten's denominator; s2 right before, wrong now
    assert forgotten(g2, [g0, g1]) == 0.5


def test_a_generation_without_answers_leaves_out_its_two_steps():
    g = answers(["s1", "s2"], ["a", "b"], ["a", "b"])
    worse = answers(["s1", "s2"], ["a", "b"], ["b", "b"])
    h = history([("1", g), ("2", None), ("3", worse), ("4", g), ("5", worse)])
    assert [(s.previous, s.version) for s in h.steps] == [("3", "4"), ("4", "5")]
    assert h.cumulative_negative_flips == 1


def test_a_ledger_with_a_repeated_id_or_no_answer_column_is_refused():
    with pytest.raises(DataError, match="id 's1' appears more than once"):
        answers(["s1", "s1"], ["a", "a"], ["a", "b"])
    with pytest.raises(DataError, match="v4: no column answer"):
        checked(pd.DataFrame({"id": ["s1"], "label": ["a"]}), "v4")
