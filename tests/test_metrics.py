"""Hand-computed cases and the paper's invariants (SPEC section 1) as property tests."""

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from consistency_gate.core import metrics as m
from consistency_gate.core import numpy_rows, rows
from consistency_gate.core.counts import ConsistencyCounts, Outputs


def test_hand_computed_flips_and_rates():
    y = np.array([0, 0, 1, 1, 2, 2])
    a = np.array([0, 0, 1, 2, 0, 1])  # right on 0, 1, 2
    b = np.array([0, 1, 1, 1, 2, 0])  # right on 0, 2, 3, 4
    assert m.accuracy(y, a) == pytest.approx(3 / 6)
    assert m.accuracy(y, b) == pytest.approx(4 / 6)
    assert m.consistency(a, b) == pytest.approx(2 / 6)  # samples 0 and 2
    assert m.flip_rates(y, a, b) == pytest.approx({"ctoc": 2 / 6, "ctoi": 1 / 6, "itoc": 2 / 6, "itoi": 1 / 6})
    assert m.com(y, a, b) == pytest.approx((2 + 2 - 1) / 6)
    assert m.backward_trust_compatibility(y, a, b) == pytest.approx(2 / 3)
    assert m.backward_error_compatibility(y, a, b) == pytest.approx(1 / 2)


def test_compatibility_scores_are_none_when_undefined():
    y = np.array([0, 1])
    assert m.backward_trust_compatibility(y, np.array([1, 0]), y) is None
    assert m.backward_error_compatibility(y, np.array([1, 0]), y) is None


def test_tie_rule_lowest_index_wins():
    scores = np.array([[0.3, 0.3, 0.3, 0.1], [0.0, 0.0, 0.0, 0.0]])
    assert rows.predicted_classes(scores).tolist() == [0, 0]
    assert rows.top_k(scores, 3).tolist() == [[0, 1, 2], [0, 1, 2]]


def test_top_k_matches_stable_sort_on_wide_rows_with_ties():
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 5, size=(300, 97)).astype(np.float32)  # many ties
    scores[:5] = 0.0
    expected = np.argsort(-scores, axis=1, kind="stable")[:, :7]
    assert (rows.top_k(scores, 7) == expected).all()


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 90).flatmap(
        lambda p: st.tuples(
            arrays(np.float32, st.tuples(st.integers(1, 6), st.just(p)), elements=st.integers(0, 4).map(float)),
            st.integers(1, p),
        )
    )
)
def test_top_k_kernel_equals_stable_sort(case):
    """The compiled one-pass top-k ranks exactly as a stable sort by score (ties: lower index)."""
    scores, k = case
    assert (rows.top_k(scores, k) == np.argsort(-scores, axis=1, kind="stable")[:, :k]).all()
    assert (rows.top_k(scores.astype(np.int64), k)[:, 0] == scores.argmax(axis=1)).all()


@settings(max_examples=60, deadline=None)
@given(st.integers(128, 700), st.integers(1, 12), st.integers(0, 2**32 - 1))
def test_top_k_kernel_equals_stable_sort_on_wide_rows(p, k, seed):
    """Rows wide enough for chunks of 32 (p >= 64k) or not: the same ranking as a stable sort."""
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 40, size=(8, p)).astype(np.float32)  # ties across chunk borders
    scores[0] = 0.0
    assert (rows.top_k(scores, k) == np.argsort(-scores, axis=1, kind="stable")[:, :k]).all()


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 6).flatmap(
        lambda k: st.tuples(
            arrays(np.int64, st.tuples(st.integers(0, 5), st.just(k)), elements=st.integers(0, 7)),
            arrays(np.int64, st.tuples(st.integers(0, 5), st.just(k)), elements=st.integers(0, 7)),
        )
    )
)
def test_pair_indicators_equal_their_set_definitions(case):
    """Each indicator row of pair_indicators is its definition on sets: the flips from who is right,
    CACC-k the true class in a list's first k, CCON-k the first k of both lists sharing a class."""
    top_a, top_b = case
    n = min(len(top_a), len(top_b))
    top_a, top_b = top_a[:n], top_b[:n]
    k_max = top_a.shape[1]
    y = top_b[:, -1] if n else np.zeros(0, dtype=np.int64)
    ks = list(range(1, k_max + 1))
    table = rows.pair_indicators(y, top_a, top_b, ks)
    assert table.shape == (len(rows.INDICATORS) + 3 * k_max, n) and table.dtype == bool
    named = dict(zip(rows.INDICATORS, table[: len(rows.INDICATORS)], strict=True))
    right_a, right_b = top_a[:, 0] == y, top_b[:, 0] == y
    expected = {
        "ctoc": right_a & right_b,
        "ctoi": right_a & ~right_b,
        "itoc": ~right_a & right_b,
        "itoi": ~right_a & ~right_b,
        "correct_previous": right_a,
        "correct_candidate": right_b,
        "agree": top_a[:, 0] == top_b[:, 0],
    }
    for name, want in expected.items():
        assert named[name].tolist() == want.tolist(), name
    cacc_a, cacc_b, ccon = np.split(table[len(rows.INDICATORS) :], 3)
    for j, k in enumerate(ks):
        assert cacc_a[j].tolist() == [t in a[:k] for t, a in zip(y, top_a, strict=True)], k
        assert cacc_b[j].tolist() == [t in b[:k] for t, b in zip(y, top_b, strict=True)], k
        assert ccon[j].tolist() == [bool(set(a[:k]) & set(b[:k])) for a, b in zip(top_a, top_b, strict=True)], k


def test_pair_indicators_of_a_hard_label_and_a_top_list():
    """A hard label is a list of one: its CACC-2 is being right; CCON-k reads the first min(k, 1)."""
    table = rows.pair_indicators(np.array([2, 2]), np.array([[2], [0]]), np.array([[1, 2], [0, 1]]), [1, 2])
    cacc_a, cacc_b, ccon = np.split(table[len(rows.INDICATORS) :], 3)
    assert cacc_a.tolist() == [[True, False], [True, False]]
    assert cacc_b.tolist() == [[False, False], [True, False]]
    assert ccon.tolist() == [[False, True], [False, True]]


@settings(max_examples=100, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 5), st.integers(1, 70)), elements=st.floats(0, 1)))
def test_row_moments_equal_numpy_sums(a):
    b = a[::-1].copy()
    expected = (a.sum(1), b.sum(1), (a * a).sum(1), (b * b).sum(1), (a * b).sum(1))
    for got, want in zip(rows.row_moments(a, b), expected, strict=True):
        assert np.allclose(got, want, rtol=1e-12, atol=1e-12)


def _score_matrices(rows: int, columns: int) -> st.SearchStrategy:
    """Score matrices with many ties, or none."""
    values = st.sampled_from([0.0, 0.25, 0.5, 1.0]) | st.floats(0, 1)
    return arrays(np.float64, st.tuples(st.integers(1, rows), st.integers(1, columns)), elements=values)


DTYPES = st.sampled_from([np.float32, np.float64])


@settings(max_examples=60, deadline=None)
@given(_score_matrices(20, 400), st.integers(1, 6), DTYPES)
def test_pair_top_k_equals_top_k_and_row_moments_of_each(a, k, dtype):
    """The one-pass pair kernel gives what the two top-k passes and the moments' pass give, for rows
    narrow and wide enough for both chunk widths."""
    a = a.astype(dtype)
    b = a[::-1, ::-1].copy()
    k = min(k, a.shape[1])
    top_a, top_b, moments = rows.pair_top_k(a, b, k)
    assert (top_a == rows.top_k(a, k)).all() and (top_b == rows.top_k(b, k)).all()
    for got, want in zip(moments, rows.row_moments(a, b), strict=True):
        assert np.allclose(got, want, rtol=1e-12, atol=1e-12)


def test_kernels_meet_only_the_signatures_precompile_compiles(monkeypatch):
    """Read-only arrays (what pyarrow and pandas hand out) and writable ones, in any mix, reach the
    kernels as the read-only arrays :func:`~consistency_gate.core.kernels.precompile` compiles for: a
    mix it had not compiled cost a cold cache 13 s at the first call (three in the suite). Every batch goes to the
    compiled kernels (``rows.NUMPY_BATCH_SECONDS`` 0)."""
    from consistency_gate.core import kernels

    monkeypatch.setattr(rows, "NUMPY_BATCH_SECONDS", 0)
    for dtype in (np.float32, np.float64):
        writable = np.random.default_rng(0).random((1_000, 4)).astype(dtype)
        read_only = writable.copy()
        read_only.flags.writeable = False
        for a, b in ((writable, read_only), (read_only, writable), (read_only, read_only)):
            rows.pair_top_k(a, b, 2)
            rows.row_moments(a, b)
            rows.top_k(a, 2)
    kernels.precompile()  # loads or compiles exactly what the warm-ups call, nothing else
    for kernel in (kernels.pair_top_k_moments, kernels.pair_moments, kernels.top_k_rows):
        arrays = [t for signature in kernel.signatures for t in signature if hasattr(t, "mutable")]
        assert arrays and not any(t.mutable for t in arrays), kernel.signatures
    assert len(kernels.pair_top_k_moments.signatures) == 2  # float32 and float64


def test_small_batches_are_answered_without_numba():
    """A gate of a few thousand rows never loads numba (0.6 s of a fresh process): its batches go to numpy."""
    code = (
        "import sys, numpy as np\n"
        "from consistency_gate.core import metrics as m\n"
        "rng = np.random.default_rng(0)\n"
        "a, b, y = rng.random((2000, 10)), rng.random((2000, 10)), rng.integers(0, 10, 2000)\n"
        "assert 0 < m.topk_consistency(a, b, 5) < 1 and 0 < m.topk_accuracy(y, a, 5) < 1\n"
        "assert m.pearson(a, b) is not None and m.cosine(a, b) is not None\n"
        "print('numba' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@settings(max_examples=80, deadline=None)
@given(_score_matrices(30, 300), st.integers(1, 7), DTYPES)
def test_numpy_rows_give_the_compiled_kernels_answers(a, k, dtype):
    """Cross-check of the two implementations of every row kernel: top lists and indicators exactly,
    the sums to rounding, Pearson and cosine to rounding with NaN in the same rows."""
    from consistency_gate.core import kernels

    a = numpy_rows.kernel_input(a, dtype)
    b = numpy_rows.kernel_input(a[::-1, ::-1], dtype)
    k = min(k, a.shape[1])
    compiled, plain = kernels.pair_top_k_moments(a, b, k), numpy_rows.pair_top_k_moments(a, b, k)
    assert (compiled[0] == plain[0]).all() and (compiled[1] == plain[1]).all()
    assert np.allclose(compiled[2], plain[2], rtol=1e-12, atol=1e-12)
    assert (kernels.top_k_rows(a, k) == numpy_rows.top_k_rows(a, k)).all()
    y = numpy_rows.kernel_input(np.arange(a.shape[0]) % a.shape[1], np.int64)
    ks = numpy_rows.kernel_input(sorted({1, k}), np.int64)
    short = numpy_rows.kernel_input(plain[1][:, :1], np.int64)  # a hard label against a top list
    for top_b in (plain[1], short):
        want, got = (module.pair_indicators(y, plain[0], top_b, ks) for module in (kernels, numpy_rows))
        assert (want == got).all()
    sums = [numpy_rows.kernel_input(v, np.float64) for v in plain[2]]
    for name, args in (("pearson_rows", (*sums, a.shape[1], 1e-6 * a.shape[1])), ("cosine_rows", sums[2:])):
        want, got = getattr(kernels, name)(*args), getattr(numpy_rows, name)(*args)
        assert np.allclose(want, got, rtol=1e-12, atol=1e-12, equal_nan=True), name


@settings(max_examples=60, deadline=None)
@given(
    arrays(
        np.float64,
        st.tuples(st.integers(1, 20), st.integers(1, 40)),
        elements=st.sampled_from([-np.inf, -1.0, 0.0, 2.0]),
    ),
    st.integers(1, 12),
)
def test_numpy_top_lists_rank_minus_infinity_as_the_kernels_do(a, k):
    """Logits may be minus infinity: numpy's k passes of argmax (k <= ARGMAX_K) and its partition (beyond) give
    the kernels' lists exactly when such scores tie the columns a pass has already taken."""
    from consistency_gate.core import kernels

    a, k = numpy_rows.kernel_input(a, np.float64), min(k, a.shape[1])
    assert (kernels.top_k_rows(a, k) == numpy_rows.top_k_rows(a, k)).all()


def test_topk_hand_case():
    y = np.array([2, 0])
    a = np.array([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]])  # top2: {0,1}, {1,2}
    b = np.array([[0.1, 0.3, 0.6], [0.7, 0.2, 0.1]])  # top2: {2,1}, {0,1}
    assert m.topk_consistency(a, b, 1) == 0.0
    assert m.topk_consistency(a, b, 2) == 1.0  # share class 1 in both rows
    assert m.topk_accuracy(y, a, 2) == 0.0
    assert m.topk_accuracy(y, b, 2) == 1.0
    assert m.topk_accuracy(y, a, 3) == 1.0


def test_pearson_and_cosine_hand_case():
    a = np.array([[1.0, 0.0], [0.5, 0.5]])
    b = np.array([[0.0, 1.0], [0.2, 0.8]])
    # row 0: r = -1, cos = 0; row 1: a constant -> r undefined, cos = (0.5) / (0.7071 * 0.8246)
    assert m.pearson(a, b) == pytest.approx(-1.0)
    assert m.cosine(a, b) == pytest.approx((0.0 + 0.5 / (np.sqrt(0.5) * np.sqrt(0.68))) / 2)


@st.composite
def two_generations(draw, max_n=60, max_p=12):
    n = draw(st.integers(1, max_n))
    p = draw(st.integers(1, max_p))
    elems = st.floats(0, 1, width=32)
    a = draw(arrays(np.float32, (n, p), elements=elems))
    b = draw(arrays(np.float32, (n, p), elements=elems))
    y = draw(arrays(np.int64, (n,), elements=st.integers(0, p - 1)))
    return y, a, b


def _counts(y, a, b, ks):
    p = a.shape[1]
    prev = Outputs.from_scores(a, range(p), max(ks))
    cand = Outputs.from_scores(b, range(p), max(ks))
    return ConsistencyCounts(ks=ks).update(y, prev, cand)


@settings(max_examples=200, deadline=None)
@given(two_generations())
def test_theorem5_and_flip_identities(data):
    y, a, b = data
    values, _ = _counts(y, a, b, (1,)).compute()
    acc_a, acc_b, acc_con = values["acc_previous"], values["acc_candidate"], values["acc_con"]
    eps = 1e-12
    assert max(acc_a + acc_b - 1, 0) - eps <= acc_con <= min(acc_a, acc_b) + eps
    assert values["ctoc"] == pytest.approx(acc_con)
    assert values["ctoc"] + values["ctoi"] == pytest.approx(acc_a)
    assert values["ctoc"] + values["itoc"] == pytest.approx(acc_b)
    assert sum(values[f] for f in m.FLIP_NAMES) == pytest.approx(1.0)
    assert values["ccon@1"] == pytest.approx(values["con"])
    assert values["cacc_previous@1"] == pytest.approx(acc_a)


@settings(max_examples=200, deadline=None)
@given(two_generations())
def test_ccon_non_decreasing_in_k_and_matches_direct_functions(data):
    y, a, b = data
    p = a.shape[1]
    ks = tuple(range(1, p + 1))
    values, _ = _counts(y, a, b, ks).compute()
    cc = [values[f"ccon@{k}"] for k in ks]
    assert all(x <= z + 1e-12 for x, z in zip(cc, cc[1:], strict=False))
    assert cc[-1] == 1.0
    for k in ks:
        assert values[f"ccon@{k}"] == pytest.approx(m.topk_consistency(a, b, k))
        assert values[f"cacc_candidate@{k}"] == pytest.approx(m.topk_accuracy(y, b, k))
    assert values["con"] == pytest.approx(m.consistency(rows.predicted_classes(a), rows.predicted_classes(b)))


@settings(max_examples=150, deadline=None)
@given(two_generations(), st.lists(st.integers(0, 60), max_size=4))
def test_merge_equals_single_pass_for_any_split(data, cuts):
    y, a, b = data
    ks = (1, min(2, a.shape[1]))
    whole = _counts(y, a, b, ks)
    bounds = sorted({0, len(y), *[c for c in cuts if c <= len(y)]})
    parts = [_counts(y[s:e], a[s:e], b[s:e], ks) for s, e in zip(bounds, bounds[1:], strict=False) if e > s]
    merged = parts[0]
    for part in parts[1:]:
        merged = merged.merge(part)
    streamed = ConsistencyCounts(ks=ks)
    for s, e in zip(bounds, bounds[1:], strict=False):
        if e > s:
            streamed.update(
                y[s:e],
                Outputs.from_scores(a[s:e], range(a.shape[1]), ks[-1]),
                Outputs.from_scores(b[s:e], range(b.shape[1]), ks[-1]),
            )
    for other in (merged, streamed):
        v1, r1 = whole.compute()
        v2, r2 = other.compute()
        assert r1 == r2
        for key in v1:
            if v1[key] is None:
                assert v2[key] is None
            else:
                assert v2[key] == pytest.approx(v1[key], abs=1e-9)


def test_hard_labels_give_null_score_metrics_with_reasons():
    y = np.array([0, 1, 1])
    prev = Outputs.from_scores(np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]), [0, 1], 2)
    cand = Outputs.from_labels(np.array([0, 1, 0]))
    values, reasons = ConsistencyCounts(ks=(1, 2)).update(y, prev, cand).compute()
    assert values["con"] == 1.0
    assert values["pearson"] is None and "hard labels" in reasons["pearson"]
    assert values["ccon@2"] is None and "ccon@2" in reasons
    assert values["cacc_previous@2"] == 1.0
    assert values["cacc_candidate@1"] == values["acc_candidate"]


def test_different_class_sets_align_by_id():
    # previous knows classes {0, 1}; candidate knows {1, 0, 2} in another order
    y = np.array([2, 0])
    prev = Outputs.from_scores(np.array([[0.3, 0.7], [0.8, 0.2]]), [0, 1], 1)
    cand = Outputs.from_scores(np.array([[0.1, 0.1, 0.8], [0.2, 0.7, 0.1]]), [1, 0, 2], 1)
    counts = ConsistencyCounts().update(y, prev, cand)
    values, _ = counts.compute()
    assert counts.unknown_labels() == {"previous": 1, "candidate": 0}
    assert values["acc_previous"] == 0.5 and values["acc_candidate"] == 1.0
    # row 1 on the union (0, 1, 2): prev (0.8, 0.2, 0), cand (0.7, 0.2, 0.1)
    a1, b1 = np.array([0.8, 0.2, 0.0]), np.array([0.7, 0.2, 0.1])
    a0, b0 = np.array([0.3, 0.7, 0.0]), np.array([0.1, 0.1, 0.8])
    expected = np.mean([np.corrcoef(a0, b0)[0, 1], np.corrcoef(a1, b1)[0, 1]])
    assert values["pearson"] == pytest.approx(expected)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(0, 12), min_size=1, max_size=40),
    st.lists(st.integers(0, 9), min_size=2, max_size=6, unique=True),
    st.integers(0, 10**6),
)
def test_unknown_labels_are_those_no_column_holds(y, columns, seed):
    """A sample's true class counts as unknown to a generation exactly when none of its score
    columns is that class (cross-checked with numpy's isin)."""
    y, columns = np.array(y), np.array(columns)
    scores = np.random.default_rng(seed).random((len(y), len(columns)))
    known = Outputs.from_scores(scores, columns, k_max=1)
    values = ConsistencyCounts(ks=(1,)).sample_values(y, known, Outputs.from_labels(y))
    assert values["unknown_previous"].tolist() == (~np.isin(y, columns)).tolist()
    assert not values["unknown_candidate"].any()


def test_rel_nfr_by_hand_and_against_its_definition():
    y = np.array([0, 0, 1, 1, 2, 2, 0, 1])
    a = np.array([0, 0, 1, 2, 2, 2, 1, 1])  # right on 6 of 8
    b = np.array([0, 1, 1, 2, 0, 2, 1, 0])  # right on 3 of 8; CtoI on samples 1, 4, 7
    assert m.relative_negative_flip_rate(y, a, b) == pytest.approx((3 / 8) / ((6 / 8) * (5 / 8)))


@given(
    arrays(np.int64, st.integers(1, 40), elements=st.integers(0, 3)),
    st.integers(0, 2**32 - 1),
)
def test_rel_nfr_is_ctoi_over_what_independent_models_would_flip(y, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, 4, len(y)), rng.integers(0, 4, len(y))
    acc_a, err_b = (a == y).mean(), (b != y).mean()
    expected = None if acc_a == 0 or err_b == 0 else ((a == y) & (b != y)).mean() / (acc_a * err_b)
    got = m.relative_negative_flip_rate(y, a, b)
    assert (got is None) == (expected is None) and (got is None or got == pytest.approx(expected))


def test_compute_gives_exactly_the_named_metrics():
    from consistency_gate.core.names import LEARNER_METRICS, PAIR_METRICS, PER_K

    y = np.array([0, 1, 2, 1])
    scores = np.eye(3)[[0, 1, 1, 2]] * 0.8 + 0.05
    outputs = [Outputs.from_scores(s, list(range(3)), 2) for s in (scores, scores[::-1])]
    counts = ConsistencyCounts(ks=(1, 2)).update(y, *outputs)
    values, _ = counts.compute()
    per_k = {key for key in values if PER_K.match(key)}
    assert set(values) - per_k == set(LEARNER_METRICS + PAIR_METRICS)
    assert per_k == {f"{name}@{k}" for name in ("ccon", "cacc_previous", "cacc_candidate") for k in (1, 2)}
