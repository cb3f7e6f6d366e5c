"""Coverage of every interval the gate reports, and the false-pass rate of every bound it decides on
simulations at n 100 / 600 / 5,000, with rare and with common flips.

Each simulated evaluation set draws its samples from known cell probabilities (CtoC, CtoI, ItoC, and
ItoI split into "both wrong, same answer" and "both wrong, different answers") and per-sample score
similarities from a skewed distribution on [-1, 1] with a known mean. The package's own interval
functions (those :meth:`~consistency_gate.core.counts.ConsistencyCounts.intervals` and ``.bounds``
call) are then checked against the truth:

- two-sided intervals at 95%: ACC and CON (Wilson), CtoI (Wilson and Clopper-Pearson), BTC and BEC
  (Wilson; ACC and BEC also Clopper-Pearson, ``intervals: clopper-pearson``), rel_nfr (MOVER-R), the
  ACC change (Newcombe), Com (MOVER), the similarity mean (normal);
  each should cover 93-97% of the time, or more (conservative, said so);
- one-sided 95% bounds a rule decides on, for a model exactly at the threshold: ``ctoi <= t`` and
  ``con >= t`` on the strict bound (false pass: at most 5%), the same on the lenient bound (false
  fail: at most 5%), ``acc min_delta`` on Newcombe's lower bound and rel_nfr on its upper bound.

    python benchmarks/interval_coverage.py [--sims 10000] [--seed 0] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from consistency_gate.core import intervals as ci

LEVEL = 0.95
SIZES = (100, 600, 5000)
# cell probabilities: CtoC, CtoI, ItoC, ItoI (same wrong answer), ItoI (different wrong answers)
SCENARIOS = {
    "rare flips (acc 0.99, 0.4% disagree)": np.array([0.988, 0.002, 0.002, 0.006, 0.002]),
    "common flips (acc 0.85 -> 0.86)": np.array([0.81, 0.04, 0.05, 0.07, 0.03]),
}
SIMILARITY = (8.0, 0.6)  # per-sample similarity 1 - 2 * Beta(0.6, 8): mean 0.86, skewed toward 1


def truths(p: np.ndarray) -> dict[str, float]:
    """The true value of every metric the intervals estimate, from the cell probabilities."""
    ctoc, ctoi, itoc, same, diff = p
    a, w = ctoc + ctoi, ctoi + same + diff
    a_, b_ = SIMILARITY
    return {
        "acc_candidate": ctoc + itoc,
        "con": ctoc + same,
        "ctoi": ctoi,
        "btc": ctoc / a,
        "bec": (same + diff) / w,
        "rel_nfr": ctoi / (a * w),
        "acc_delta": itoc - ctoi,
        "com": ctoc + itoc - ctoi,
        "similarity": 1 - 2 * b_ / (a_ + b_),
    }


def intervals(cells: np.ndarray, similarity: np.ndarray) -> dict[str, tuple[float, float] | None]:
    """The two-sided intervals of one simulated set, by the package's functions."""
    ctoc, ctoi, itoc, same, diff = (int(c) for c in cells)
    itoi, n = same + diff, int(cells.sum())
    return {
        "acc_candidate": ci.wilson(ctoc + itoc, n, LEVEL),
        "acc_candidate (clopper-pearson)": ci.clopper_pearson(ctoc + itoc, n, LEVEL),
        "con": ci.wilson(ctoc + same, n, LEVEL),
        "ctoi": ci.wilson(ctoi, n, LEVEL),
        "ctoi (clopper-pearson)": ci.clopper_pearson(ctoi, n, LEVEL),
        "btc": ci.wilson(ctoc, ctoc + ctoi, LEVEL),
        "bec": ci.wilson(itoi, ctoi + itoi, LEVEL),
        "bec (clopper-pearson)": ci.clopper_pearson(itoi, ctoi + itoi, LEVEL),
        "rel_nfr": ci.rel_nfr_interval(ctoc, ctoi, itoc, itoi, LEVEL),
        "acc_delta": ci.newcombe_paired(ctoc, ctoi, itoc, itoi, LEVEL),
        "com": ci.com_interval(ctoc, ctoi, itoc, itoi, LEVEL),
        "similarity": ci.mean_interval(float(similarity.sum()), float((similarity**2).sum()), n, LEVEL),
    }


def bounds(cells: np.ndarray, truth: dict[str, float]) -> dict[str, bool]:
    """Whether each rule set exactly at the truth passes (strict: a false pass) or fails (lenient: a
    false fail) on one simulated set, deciding on the one-sided bounds the gate uses."""
    ctoc, ctoi, itoc, same, diff = (int(c) for c in cells)
    itoi, n = same + diff, int(cells.sum())
    two_sided = ci.one_sided(LEVEL)
    ctoi_low, ctoi_high = ci.clopper_pearson(ctoi, n, two_sided)
    con_low, con_high = ci.clopper_pearson(ctoc + same, n, two_sided)
    delta = ci.newcombe_paired(ctoc, ctoi, itoc, itoi, two_sided)
    rel = ci.rel_nfr_interval(ctoc, ctoi, itoc, itoi, two_sided)
    return {
        "ctoi <= t, upper (false pass)": ctoi_high <= truth["ctoi"],
        "ctoi <= t, lower (false fail)": ctoi_low > truth["ctoi"],
        "con >= t, lower (false pass)": con_low >= truth["con"],
        "con >= t, upper (false fail)": con_high < truth["con"],
        "acc change >= t, lower (false pass)": delta[0] >= truth["acc_delta"],
        "rel_nfr <= t, upper (false pass)": rel is not None and rel[1] <= truth["rel_nfr"],
    }


def simulate(p: np.ndarray, n: int, sims: int, rng: np.random.Generator) -> tuple[dict, dict]:
    """Coverage of each interval and the rate of each bound's wrong decision over ``sims`` sets."""
    truth = truths(p)
    covered: dict[str, list[bool]] = {}
    wrong: dict[str, list[bool]] = {}
    a_, b_ = SIMILARITY
    for cells in rng.multinomial(n, p, size=sims):
        similarity = 1 - 2 * rng.beta(b_, a_, n)
        for key, found in intervals(cells, similarity).items():
            if found is not None:  # undefined on this set (a denominator of 0): not counted
                value = truth[key.split(" ")[0]]
                covered.setdefault(key, []).append(found[0] <= value <= found[1])
        for key, happened in bounds(cells, truth).items():
            wrong.setdefault(key, []).append(happened)
    return {k: float(np.mean(v)) for k, v in covered.items()}, {k: float(np.mean(v)) for k, v in wrong.items()}


def verdict(coverage: float) -> str:
    """In range (93-97%), conservative (above) or LOW (below)."""
    if coverage < 0.93:
        return "LOW"
    return "ok" if coverage <= 0.97 else "conservative"


def bound_verdict(rate: float) -> str:
    """At most ``1 - LEVEL`` (within half a point of simulation noise) is in range."""
    return "ok" if rate <= 1 - LEVEL + 0.005 else "HIGH"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sims", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", type=Path, help="also write the tables as Markdown")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    cover_rows, bound_rows = [], []
    for name, p in SCENARIOS.items():
        for n in SIZES:
            coverage, wrong = simulate(p, n, args.sims, rng)
            cover_rows += [(name, n, key, rate) for key, rate in coverage.items()]
            bound_rows += [(name, n, key, rate) for key, rate in wrong.items()]
    lines = [
        f"Coverage of the two-sided {LEVEL:.0%} intervals ({args.sims:,} simulated sets per row; 93-97% is in range):",
        "",
        "| flips | n | interval | coverage | verdict |",
        "| --- | --- | --- | --- | --- |",
        *(f"| {s} | {n:,} | {k} | {r:.1%} | {verdict(r)} |" for s, n, k, r in cover_rows),
        "",
        f"Wrong decisions of the one-sided {LEVEL:.0%} bounds for a model exactly at the threshold (at most "
        f"{1 - LEVEL:.0%} is in range):",
        "",
        "| flips | n | rule, bound | rate | verdict |",
        "| --- | --- | --- | --- | --- |",
        *(f"| {s} | {n:,} | {k} | {r:.2%} | {bound_verdict(r)} |" for s, n, k, r in bound_rows),
    ]
    text = "\n".join(lines)
    print(text)
    print(f"\n{time.perf_counter() - started:.0f} s")
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
