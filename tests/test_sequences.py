"""Confidence sequences: anytime validity computed exactly (the chance that the bound ever passes a
share at its threshold, by dynamic programming over every look), against the fixed-sample bound that
breaks it, and the bounds' properties."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import beta

from consistency_gate.core import intervals as ci
from consistency_gate.core import sequences as cs

counts = st.integers(1, 3000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n)))


def ever_passes(bound, p: float, looks: int) -> float:
    """The exact probability that ``bound(k, n) <= p`` at some look n = 1..looks, for hits drawn at the
    share ``p``: the distribution of k among the streams that have not passed yet, step by step."""
    alive = np.array([1.0])  # P(k hits so far, never passed)
    passed = 0.0
    for n in range(1, looks + 1):
        alive = np.append(alive * (1 - p), 0.0) + np.append(0.0, alive * p)
        crossed = bound(np.arange(n + 1), n) <= p
        passed += alive[crossed].sum()
        alive[crossed] = 0.0
    return passed


def test_a_share_at_the_threshold_passes_at_most_alpha_at_any_look():
    """Checked after every sample of 600, a share exactly at 0.05 ever passes the sequence's upper
    bound less than 5% of the time; the fixed-sample exact bound checked the same way passes it far
    more often (the reason for the sequences)."""
    p, looks = 0.05, 600
    sequence = ever_passes(lambda k, n: cs.upper(k, n, 0.95), p, looks)
    fixed = ever_passes(lambda k, n: np.where(k < n, beta.ppf(0.95, k + 1, n - k), 1.0), p, looks)  # exact, one look
    assert sequence <= 0.05
    assert fixed > 0.15  # 0.05 at one look; over 600 looks, several times that


@given(counts, st.sampled_from([0.8, 0.9, 0.95, 0.99]))
@settings(max_examples=200, deadline=None)
def test_the_bounds_hold_the_estimate_and_are_wider_than_one_look(kn, level):
    k, n = kn
    up, low = float(cs.upper(k, n, level)), float(cs.lower(k, n, level))
    assert low <= k / n <= up
    exact_low, exact_up = ci.clopper_pearson(k, n, 2 * level - 1)
    assert up >= exact_up - 1e-9 and low <= exact_low + 1e-9  # valid at every look costs width at each


@given(counts, st.sampled_from([0.9, 0.95]))
@settings(max_examples=100, deadline=None)
def test_the_upper_bound_is_where_the_mixture_reaches_one_over_alpha(kn, level):
    k, n = kn
    up = float(cs.upper(k, n, level))
    if k < n:
        assert math.isclose(float(cs.log_mixture(k, n, up)), math.log(1 / (1 - level)), abs_tol=1e-6)
        assert float(cs.upper(min(k + 1, n), n, level)) >= up  # more hits, a higher bound
    else:
        assert up == 1.0


def test_no_sample_bounds_nothing_and_bad_counts_are_refused():
    assert float(cs.upper(0, 0, 0.95)) == 1.0 and float(cs.lower(0, 0, 0.95)) == 0.0
    for bad in ((3, 2, 0.95), (-1, 5, 0.95), (1, 5, 0.4)):
        try:
            cs.upper(*bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad} was accepted")


def test_the_paired_bound_and_the_samples_needed_cross_where_they_say():
    assert cs.paired_lower(30, 10, 1000, 0.95) < 0.02  # the estimate, less the price of both sides
    n = cs.samples_needed(0.01, 0.02, at_most=True, level=0.95)
    assert float(cs.upper(round(0.01 * n), n, 0.95)) <= 0.02 < float(cs.upper(round(0.01 * (n - 1)), n - 1, 0.95))
    m = cs.samples_needed(0.97, 0.95, at_most=False, level=0.95)  # con >= 0.95 at a true 0.97
    assert float(cs.lower(round(0.97 * m), m, 0.95)) > 0.95
    assert cs.samples_needed(0.03, 0.02, at_most=True, level=0.95) is not None  # the failing side too
