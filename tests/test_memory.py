"""The memory of what users saw (consistency_gate.core.memory): Traeuble et al.'s update with the previous
step's posterior as the next step's prior, as properties (hypothesis), small cases by hand, and a cross-check
against the batch form of the Bayesian update (consistency_gate.ensembles.bayes.BayesUpdate), an independent
implementation that keeps every generation."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consistency_gate.core.ids import as_text, sorted_keys
from consistency_gate.core.memory import Memory
from consistency_gate.ensembles.bayes import BayesUpdate
from consistency_gate.errors import DataError

GOOD = np.array([[0.9, 0.1], [0.2, 0.8]])


@st.composite
def histories(draw):
    """Classes, ids, then K generations: each a row-stochastic confusion matrix and its answers."""
    p = draw(st.integers(2, 4))
    n = draw(st.integers(1, 12))
    k = draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    confusions = [rng.dirichlet(np.ones(p) * 0.7, size=p) * 0.98 + 0.02 / p for _ in range(k)]
    answers = [rng.integers(0, p, size=n) for _ in range(k)]
    ratio = draw(st.sampled_from([1.0, 1.5, 2.0, 10.0]))
    return [f"c{i}" for i in range(p)], [f"id{i}" for i in range(n)], confusions, answers, ratio


def _sequence(classes, ids, confusions, answers, ratio):
    memory = Memory.first(classes, ids, answers[0], confusions[0])
    for matrix, said in zip(confusions[1:], answers[1:], strict=True):
        memory, _ = memory.update(ids, said, matrix, ratio)
    return memory


@settings(max_examples=60, deadline=None)
@given(histories())
def test_the_belief_is_the_product_of_every_generations_likelihood(history):
    """The previous posterior as the prior: after K steps the belief is the batch product of the K likelihoods."""
    classes, ids, confusions, answers, ratio = history
    memory = _sequence(classes, ids, confusions, answers, ratio)
    belief = np.exp(memory.log_belief[memory.find(ids)].astype(np.float64))  # in the order of ids
    belief /= belief.sum(axis=1, keepdims=True)
    batch = BayesUpdate(classes, confusions, ratio).belief(answers)
    assert np.allclose(belief, batch, atol=1e-4)


@settings(max_examples=60, deadline=None)
@given(histories())
def test_the_answer_users_see_follows_the_cost_ratio_rule_at_every_step(history):
    """Each step is the batch update's answer with the answer kept so far (BayesUpdate.answers(..., kept))."""
    classes, ids, confusions, answers, ratio = history
    kept = answers[0]
    for step in range(2, len(answers) + 1):
        kept = BayesUpdate(classes, confusions[:step], ratio).answers(answers[:step], kept)
    memory = _sequence(classes, ids, confusions, answers, ratio)
    at = memory.find(ids)  # in the order of ids
    near_tie = np.abs(-memory.log_belief[at, kept] - np.log(ratio)) < 1e-4  # float32 against float64 at the boundary
    assert (memory.shown[at] == kept)[~near_tie].all()


@settings(max_examples=40, deadline=None)
@given(histories())
def test_an_answer_changes_only_for_a_belief_more_than_the_cost_ratio_times_the_answer_seen(history):
    classes, ids, confusions, answers, ratio = history
    before = Memory.first(classes, ids, answers[0], confusions[0])
    after, changed = before.update(ids, answers[-1], confusions[-1], ratio)  # rows in the memory's (sorted) order
    moved = after.shown != before.shown
    assert changed == int(moved.sum())
    odds = -after.log_belief[moved, before.shown[moved]]  # log(best / seen): the best is 0
    assert (odds > np.log(ratio) - 1e-5).all()
    assert (after.shown[moved] == after.log_belief[moved].argmax(axis=1)).all()  # to the most likely class
    never, _ = before.update(ids, answers[-1], confusions[-1], 1e12)  # a cost no belief pays: nothing changes
    assert (never.shown == before.shown).all()


@settings(max_examples=60, deadline=None)
@given(
    old=st.sets(st.integers(0, 40), max_size=15),
    new=st.lists(st.integers(0, 40), max_size=15, unique=True),
    seed=st.integers(0, 2**16),
)
def test_a_memory_extended_holds_every_id_once_in_the_order_of_its_hashes(old, new, seed):
    """Each old id keeps its row's belief and answer, each new one starts from its own; find is exact."""
    rng = np.random.default_rng(seed)
    old, shown_old, shown_new = sorted(old), rng.integers(0, 2, len(old)), rng.integers(0, 2, len(new))
    memory = Memory.first(["a", "b"], [f"i{i}" for i in old], shown_old, GOOD)
    grown = memory.extended([f"i{i}" for i in new], shown_new, GOOD)
    assert sorted(grown.ids.to_pylist()) == sorted({f"i{i}" for i in [*old, *new]})
    assert (np.diff(grown.keys.astype(np.float64)) >= 0).all() and (
        grown.find(grown.ids) == np.arange(len(grown))
    ).all()
    expected = {f"i{i}": ["a", "b"][s] for i, s in zip(new, shown_new, strict=True)}
    expected.update({f"i{i}": ["a", "b"][s] for i, s in zip(old, shown_old, strict=True)})  # the old rows stay
    assert grown.seen(list(expected)) == list(expected.values())
    assert grown.find(["i99"]).tolist() == [-1]
    fresh = [f"i{i}" for i in new if i not in old]
    block = Memory.first(["a", "b"], fresh, np.array([s for i, s in zip(new, shown_new, strict=True) if i not in old]),
                         GOOD)  # fmt: skip
    merged = memory.merged(block)  # what extended does: the new ids' memory merged in
    assert merged.ids.equals(grown.ids) and np.array_equal(merged.keys, grown.keys)
    assert np.array_equal(merged.log_belief, grown.log_belief) and np.array_equal(merged.shown, grown.shown)


@settings(max_examples=40, deadline=None)
@given(
    p=st.integers(2, 4), n=st.integers(1, 8), k=st.integers(1, 5), decay=st.sampled_from([0.25, 0.5, 1.0]),
    seed=st.integers(0, 2**16),
)  # fmt: skip
def test_with_scores_and_decay_the_belief_is_the_discounted_sum_of_the_log_scores(p, n, k, decay, seed):
    """likelihood: scores, decay d: after K generations the log-belief is sum_t d^(K-1-t) log s_t, normalised."""
    rng = np.random.default_rng(seed)
    classes, ids = [f"c{i}" for i in range(p)], [f"id{i}" for i in range(n)]
    scores = [rng.dirichlet(np.ones(p), size=n) for _ in range(k)]
    uniform = np.full((p, p), 1 / p)  # not read: the scores are the likelihood
    memory = Memory.first(classes, ids, scores[0].argmax(axis=1), uniform, scores=scores[0])
    for said in scores[1:]:
        memory, _ = memory.update(ids, said.argmax(axis=1), uniform, 1.0, decay=decay, scores=said)
    expected = sum(decay ** (k - 1 - t) * np.log(np.clip(s, 1e-6, 1.0)) for t, s in enumerate(scores))
    expected -= expected.max(axis=1, keepdims=True)
    assert np.allclose(memory.log_belief[memory.find(ids)], expected, atol=1e-4)


def test_by_hand_two_even_answers_keep_what_users_saw_and_a_second_vote_changes_it():
    memory = Memory.first(["a", "b"], ["x"], np.array([0]), GOOD)  # belief (0.9, 0.2) ∝ (0.82, 0.18)
    once, changed = memory.update(["x"], np.array([1]), GOOD, 2.0)  # (0.9*0.1, 0.2*0.8) = (0.09, 0.16): 1.8x
    assert once.seen(["x"]) == ["a"] and changed == 0
    twice, changed = once.update(["x"], np.array([1]), GOOD, 2.0)  # (0.009, 0.128): 14x > 2
    assert twice.seen(["x"]) == ["b"] and changed == 1


def test_new_ids_start_from_what_users_saw_and_known_ones_keep_their_belief():
    memory = Memory.first(["a", "b"], ["x"], np.array([1]), GOOD)
    grown = memory.extended(["y", "x", "w"], np.array([0, 0, 1]), GOOD)
    assert sorted(grown.ids.to_pylist()) == ["w", "x", "y"] and grown.seen(["w", "x", "y"]) == ["b", "b", "a"]
    assert np.allclose(grown.log_belief[grown.find(["x"])], memory.log_belief[0])
    with pytest.raises(ValueError, match="id 'z' is not in the memory"):
        grown.update(["z"], np.array([0]), GOOD, 2.0)


def test_the_table_round_trips_and_a_bad_one_is_one_line_naming_the_file(tmp_path):
    memory = Memory.first(["a", "b"], [3, 1, 2], np.array([0, 1, 1]), GOOD)
    path = tmp_path / "memory.parquet"
    assert memory.write(path) > 0
    back = Memory.read(path, ["a", "b"])
    assert back.ids.equals(memory.ids) and np.array_equal(back.shown, memory.shown)
    assert np.array_equal(back.log_belief, memory.log_belief) and back.seen([1, 2, 3]) == ["b", "b", "a"]
    with pytest.raises(DataError, match=r"memory's classes \['a', 'b'\] are not the model's \['a', 'c'\]"):
        Memory.read(path, ["a", "c"])
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(DataError, match="memory.parquet: the memory table cannot be read .* it is damaged"):
        Memory.read(path)
    frame = pd.DataFrame({"id": ["1", "2", "3"], "shown": ["a", "z", "b"], "belief:a": 0.0, "belief:b": -1.0})
    frame.to_parquet(path)
    with pytest.raises(DataError, match="row 2: the answer users saw is not one of its classes"):
        Memory.read(path)
    frame.assign(shown="b", **{"belief:a": [0.0, -2.0, -3.0]}).to_parquet(path)  # another tool's, in its order
    assert Memory.read(path).seen(["3", "1", "2"]) == ["b", "b", "b"]


def test_a_population_names_each_item_once():
    with pytest.raises(DataError, match="pop.csv: id '7' appears 2 times .rows 1 and 3.; a population names"):
        sorted_keys(as_text(pd.Series([7, 8, 7])), "pop.csv")
    with pytest.raises(DataError, match="pop.csv: row 2: the id is empty"):
        sorted_keys(as_text(pd.Series(["a", None])), "pop.csv")


def test_forgetting_ids_drops_their_belief_and_an_id_added_again_starts_afresh():
    memory = Memory.first(["a", "b"], ["x", "y"], np.array([0, 0]), GOOD)
    memory, _ = memory.update(["x", "y"], np.array([0, 0]), GOOD, 2.0)  # a strong belief in 'a'
    fewer, forgotten = memory.without(["x", "unknown"])
    assert fewer.ids.to_pylist() == ["y"] and forgotten == 1
    again = fewer.extended(["x"], np.array([1]), GOOD)
    assert again.seen(["x"]) == ["b"]  # what users see now: the model's answer
    assert np.allclose(again.log_belief[again.find(["x"])], np.log(GOOD[:, 1] / GOOD[:, 1].max()))


def test_the_tuned_cost_ratio_is_the_largest_that_keeps_the_candidates_accuracy_on_the_tuning_share():
    from consistency_gate.ensembles.memory import Said, _tuned_ratio
    from consistency_gate.ensembles.method import TuningData

    good = np.array([[0.8, 0.2], [0.2, 0.8]])
    ids = [f"t{i}" for i in range(10)]
    memory = Memory.first(["a", "b"], ids, np.zeros(10, dtype=np.int64), good)  # users saw 'a' everywhere
    labels = ["b"] * 4 + ["a"] * 6
    held = TuningData(pd.DataFrame({"id": ids, "label": labels}), "label", ("label", "id"), "held-out share")
    said = np.array([1] * 4 + [0] * 6)  # the candidate is right everywhere: 100%; keeping 'a' is 60%
    strong = np.array([[0.95, 0.05], [0.05, 0.95]])  # 'b' now 0.2 * 0.95 / (0.8 * 0.05) = 4.75x as likely as 'a'
    assert _tuned_ratio([memory], held, "id", Said(said), strong) == (3.0, "held-out share")  # the largest below 4.75
    weak = np.array([[0.6, 0.4], [0.4, 0.6]])  # 'b' 0.375x as likely as 'a': no ratio changes it
    assert _tuned_ratio([memory], held, "id", Said(said), weak) == (
        1.0,
        "held-out share",
    )  # none keeps it: the smallest
    no_ids = TuningData(pd.DataFrame({"label": labels}), "label", ("label",), "calib.csv")
    assert _tuned_ratio([memory], no_ids, "id", Said(said), strong)[1] == "default (the tuning samples have no ids)"


def test_updating_the_known_ids_then_merging_the_new_is_extending_then_updating():
    """What a gate does to hold the beliefs once: the ids the memory has, updated in its own arrays
    (copy=False); the new ones, a memory of their own, updated; the two merged."""
    rng = np.random.default_rng(5)
    old, new = [f"o{i}" for i in range(40)], [f"n{i}" for i in range(17)]
    shown_old, shown_new, said = rng.integers(0, 2, 40), rng.integers(0, 2, 17), rng.integers(0, 2, 57)
    expected, changed = (
        Memory.first(["a", "b"], old, shown_old, GOOD).extended(new, shown_new, GOOD).update(old + new, said, GOOD, 2.0)
    )
    known, more = Memory.first(["a", "b"], old, shown_old, GOOD).update(old, said[:40], GOOD, 2.0, copy=False)
    block, most = Memory.first(["a", "b"], new, shown_new, GOOD).update(new, said[40:], GOOD, 2.0, copy=False)
    merged = known.merged(block)
    assert more + most == changed and merged.ids.equals(expected.ids)
    assert np.array_equal(merged.log_belief, expected.log_belief) and merged.seen(old + new) == expected.seen(old + new)
    with pytest.raises(DataError, match="id 'o3' appears 2 times"):
        known.merged(Memory.first(["a", "b"], ["o3"], np.array([0]), GOOD))


def _population_file(tmp_path, rows: int):
    from consistency_gate.ensembles.memory import Population

    path = tmp_path / "population.csv"
    pd.DataFrame({"id": [f"i{n}" for n in range(rows)], "x": np.arange(rows)}).to_csv(path, index=False)
    return path, Population(path, "id", pd.DataFrame({"id": ["i0"], "x": [0]}))


def test_a_population_appended_to_while_it_is_read_says_which_rows_the_memory_was_built_from(tmp_path):
    """The rows read are counted, and a file that changed while it was read is said to have (the memory holds the
    rows as read then); a file left alone is said plainly."""
    path, population = _population_file(tmp_path, 5)
    batches = population.batches()
    next(batches)  # the file's rows, read
    with path.open("a") as file:
        file.write("late,99\n")
    list(batches)
    assert population.read() == "5 rows of population.csv (it changed while it was read: the rows as read then)"
    _, again = _population_file(tmp_path, 6)
    list(again.batches())
    assert again.read() == "6 rows of population.csv"


def test_an_empty_population_is_refused_naming_the_file(tmp_path):
    """A header and no rows: a memory built from it would change nothing, so the gate stops (exit 3) instead."""
    path, population = _population_file(tmp_path, 0)
    with pytest.raises(DataError, match=f"{path}: the population has no rows; a memory remembers"):
        list(population.batches())


def test_by_hand_a_clearly_better_retrain_undoes_a_mistake_five_correlated_generations_repeated():
    """Item x (true class 1) answered 0 by five generations that repeat each other's mistakes, then 1 by a clearly
    better retrain; item z (true class 0) answered 0 by all six. Independent witnesses: x's odds for 0 are
    4.5^5 (each early answer, C[0,0] / C[1,0] = 0.9 / 0.2) times 0.05 / 0.95 (the better answer) = 97.3: users
    keep the wrong answer at any cost ratio up to 97. Correlated (right 0.9, repeats 0.8): the first answer 4.5,
    each repeat only 0.9 / 0.8 = 1.125, so 4.5 * 1.125^4 = 7.208; the better retrain's departure (right 0.95,
    corrects 0.9) multiplies 0 by 0.05 * 0.05 / 0.05 = 0.05 and 1 by 0.9: 7.208 * 0.05 / 0.9 = 0.4004, so 1 is
    2.497 times as likely and users see it at a cost ratio of 2. Item z keeps 0 either way."""
    from consistency_gate.core.memory import Repeats

    early, better = np.array([[0.9, 0.1], [0.2, 0.8]]), np.array([[0.95, 0.05], [0.05, 0.95]])
    ids, shown = np.array(["x", "z"]), np.array([0, 0])
    correlated, better_repeats = Repeats(right=0.9, repeats=0.8, corrects=0.2), Repeats(0.95, 0.1, 0.9)
    results = {}
    for update in ("independent", "correlated"):
        memory = Memory.first(["0", "1"], ids, shown, early)
        for _ in range(4):
            memory, _ = memory.update(ids, shown, early, 2.0, repeats=correlated if update == "correlated" else None)
        odds = float(np.exp(-memory.log_belief[memory.find(["x"])[0], 1]))
        memory, changed = memory.update(
            ids, np.array([1, 0]), better, 2.0, repeats=better_repeats if update == "correlated" else None
        )
        results[update] = (odds, memory.seen(["x", "z"]), changed)
    assert results["independent"][0] == pytest.approx(4.5**5, rel=1e-4)
    assert results["independent"][1:] == (["0", "0"], 0)
    assert results["correlated"][0] == pytest.approx(4.5 * 1.125**4, rel=1e-4)
    assert results["correlated"][1:] == (["1", "0"], 1)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 6),
    st.floats(0.05, 0.95),
    st.floats(0.01, 0.6),
    st.floats(0.01, 0.35),
    st.integers(0, 2**31 - 1),
)
def test_a_correlated_likelihood_is_a_distribution_over_answers_for_every_truth_and_answer_seen(p, right, r, q, seed):
    """For each true class y and answer users saw s, the likelihoods of every answer a sum to 1 (what makes it a
    likelihood: the chance of each answer given y and s)."""
    from consistency_gate.core.memory import Repeats

    rng = np.random.default_rng(seed)
    confusion = rng.dirichlet(np.ones(p), size=p) * 0.5 + np.eye(p) * 0.5
    repeats = Repeats(right, r, q)
    for s in range(p):
        answers = np.arange(p)
        lik = np.exp(repeats.log_likelihood(confusion, answers, np.full(p, s)).astype(np.float64))  # [a, y]
        assert np.allclose(lik.sum(axis=0), 1.0, atol=1e-5), (s, lik.sum(axis=0))
