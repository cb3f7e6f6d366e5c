"""Many generations: negative flips summed over the champions' updates, and what a candidate forgets.

Traeuble et al. 2021: on samples aligned by id over the champions g_0 .. g_T in
the order they were promoted, NF_t = samples with g_{t-1} right and g_t wrong (over the ids the
two share); cumulative negative flips = sum of NF_t; ever-regressed = share of the samples of any
step with at least one such step; for a candidate c and the last K champions, ``forgotten`` = share
of c's samples right under at least one of them and wrong under c.

Each generation's answers are a frame with columns ``id``, ``label`` and ``answer`` (text), as the
gate's ledger logs them (``gate/answers.parquet``).

>>> g0 = answers(["a", "b", "c", "d"], ["x", "y", "x", "y"], ["x", "y", "y", "y"])
>>> g1 = answers(["a", "b", "c", "d"], ["x", "y", "x", "y"], ["y", "y", "x", "y"])
>>> g2 = answers(["a", "b", "c", "d"], ["x", "y", "x", "y"], ["x", "x", "x", "y"])
>>> h = history([("1", g0), ("2", g1), ("3", g2)])
>>> [(s.version, s.negative_flips, s.n) for s in h.steps], h.cumulative_negative_flips, h.ever_regressed
([('2', 1, 4), ('3', 1, 4)], 2, 0.5)
>>> forgotten(g2, [g0, g1])  # b: right under both, wrong now
0.25
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from consistency_gate.core.intervals import newcombe_paired, one_sided, proportion, z_value
from consistency_gate.errors import DataError

COLUMNS = ("id", "label", "answer")


def answers(ids: Sequence[object], labels: Sequence[object], predicted: Sequence[object]) -> pd.DataFrame:
    """One generation's answers as a ledger frame: ``id``, ``label``, ``answer`` as text, unique ids.

    >>> answers([1, 2], ["cat", "dog"], ["cat", "cat"])["answer"].tolist()
    ['cat', 'cat']
    """
    frame = pd.DataFrame({"id": ids, "label": labels, "answer": predicted}).astype(str)
    return checked(frame, "answers")


def checked(frame: pd.DataFrame, what: str) -> pd.DataFrame:
    """``frame`` if it is a ledger frame (the three columns, unique ids); DataError naming ``what`` and
    the first repeated id otherwise.

    >>> checked(pd.DataFrame({"id": ["a", "a"], "label": ["x", "x"], "answer": ["x", "y"]}), "v2")
    Traceback (most recent call last):
    ...
    consistency_gate.errors.DataError: v2: id 'a' appears more than once; each sample needs one answer
    """
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise DataError(f"{what}: no column {', '.join(missing)}; a ledger has columns id, label, answer")
    repeated = frame["id"][frame["id"].duplicated()]
    if len(repeated):
        raise DataError(f"{what}: id {repeated.iloc[0]!r} appears more than once; each sample needs one answer")
    return frame[list(COLUMNS)].astype(str)


def _correct(frame: pd.DataFrame) -> pd.Series:
    """Whether each sample (indexed by id) was answered right."""
    return pd.Series((frame["answer"] == frame["label"]).to_numpy(), index=frame["id"].to_numpy())


@dataclass(frozen=True)
class Step:
    """One update g_{t-1} -> g_t on the ids both answered: its negative flips (NF_t) and the new
    champion's accuracy, each with its interval."""

    version: str
    previous: str
    n: int
    negative_flips: int
    accuracy: float | None  # None on no shared samples
    nfr_interval: tuple[float, float] | None
    accuracy_interval: tuple[float, float] | None

    @property
    def nfr(self) -> float | None:
        """NF_t / n_t, the step's negative flip rate (None on no shared samples)."""
        return self.negative_flips / self.n if self.n else None

    def to_dict(self) -> dict:
        """As in the JSON of ``consistency-gate history``."""
        return {
            "version": self.version,
            "previous": self.previous,
            "n": self.n,
            "negative_flips": self.negative_flips,
            "nfr": self.nfr,
            "nfr_interval": list(self.nfr_interval) if self.nfr_interval else None,
            "accuracy": self.accuracy,
            "accuracy_interval": list(self.accuracy_interval) if self.accuracy_interval else None,
        }


@dataclass
class History:
    """The champions' updates in order, and their sums."""

    versions: list[str]
    steps: list[Step] = field(default_factory=list)
    ever_regressed: float | None = None  # share of the steps' samples with at least one negative flip
    samples: int = 0  # the samples of any step (the union of their ids)

    @property
    def cumulative_negative_flips(self) -> int:
        """Sum of NF_t over the steps."""
        return sum(s.negative_flips for s in self.steps)


def history(generations: Sequence[tuple[str, pd.DataFrame | None]], level: float = 0.95) -> History:
    """The negative flips of each update of ``generations`` (version, answers) in promotion order,
    each step over the ids the two generations share, with Wilson intervals at ``level``. A
    generation whose answers are None (not logged) leaves out the two steps it takes part in.

    >>> g0 = answers(["a", "b"], ["x", "y"], ["x", "y"])
    >>> g1 = answers(["b", "c"], ["y", "x"], ["x", "x"])  # shares only b with g0
    >>> h = history([("1", g0), ("2", g1)])
    >>> h.steps[0].n, h.steps[0].negative_flips, h.ever_regressed
    (1, 1, 1.0)
    """
    result = History([version for version, _ in generations])
    regressed: dict[str, bool] = {}
    for (before, old), (version, new) in zip(generations, generations[1:], strict=False):
        if old is None or new is None:
            continue
        old_right, new_right = _correct(old), _correct(new)
        shared = old_right.index.intersection(new_right.index)
        flipped = old_right[shared].to_numpy() & ~new_right[shared].to_numpy()
        right = int(new_right[shared].sum())
        n, nf = len(shared), int(flipped.sum())
        result.steps.append(
            Step(
                version,
                before,
                n,
                nf,
                right / n if n else None,
                proportion(nf, n, level),
                proportion(right, n, level),
            )
        )
        for sample, flip in zip(shared, flipped, strict=True):
            regressed[sample] = regressed.get(sample, False) or bool(flip)
    result.samples = len(regressed)
    result.ever_regressed = float(np.mean(list(regressed.values()))) if regressed else None
    return result


def forgotten(candidate: pd.DataFrame, champions: Sequence[pd.DataFrame]) -> float | None:
    """The share of the candidate's samples (those at least one of ``champions`` answered too) that
    some champion answered right and the candidate answers wrong; None when no sample is shared.

    >>> c = answers(["a", "b", "c"], ["x", "x", "x"], ["y", "x", "y"])
    >>> forgotten(c, [answers(["a", "c"], ["x", "x"], ["x", "y"])])  # a: right before, wrong now; c: never right
    0.5
    """
    k, n = forgotten_counts(candidate, champions)
    return k / n if n else None


def forgotten_counts(candidate: pd.DataFrame, champions: Sequence[pd.DataFrame]) -> tuple[int, int]:
    """``forgotten`` as (samples forgotten, samples any champion answered too).

    >>> forgotten_counts(answers(["a", "b"], ["x", "x"], ["y", "y"]), [answers(["a"], ["x"], ["x"])])
    (1, 1)
    """
    cand_right = _correct(candidate)
    ever_right = pd.Series(False, index=cand_right.index)
    seen = pd.Series(False, index=cand_right.index)
    for champion in champions:
        right = _correct(champion)
        shared = cand_right.index.intersection(right.index)
        seen[shared] = True
        ever_right[shared] = ever_right[shared].to_numpy() | right[shared].to_numpy()
    return int((ever_right[seen] & ~cand_right[seen]).sum()), int(seen.sum())


@dataclass
class Figures:
    """Metrics measured beside a two-generation comparison (over the champions' history, against a
    seed replica): their values, two-sided intervals at the gate's confidence and one-sided bounds,
    keyed like the comparison's, so rules read them the same way; a null value has its reason."""

    metrics: dict[str, float | None] = field(default_factory=dict)
    intervals: dict[str, list[float]] = field(default_factory=dict)
    bounds: dict[str, list[float]] = field(default_factory=dict)
    null_reasons: dict[str, str] = field(default_factory=dict)

    def share(self, key: str, k: int, n: int, level: float, method: str = "wilson") -> None:
        """``key`` = k / n with its interval and exact one-sided bounds (as every share of the samples)."""
        if n == 0:
            self.null(key, "no sample shared with the generations it is measured against")
            return
        self.metrics[key] = k / n
        self.intervals[key] = list(proportion(k, n, level, method))
        self.bounds[key] = list(proportion(k, n, one_sided(level), "clopper-pearson"))

    def null(self, key: str, reason: str) -> None:
        """``key`` is null for ``reason``."""
        self.metrics[key] = None
        self.null_reasons[key] = reason

    def update(self, other: Figures) -> Figures:
        """Both figures' keys (``other``'s win); returns self."""
        for name in ("metrics", "intervals", "bounds", "null_reasons"):
            getattr(self, name).update(getattr(other, name))
        return self


def forgotten_figures(
    candidate: pd.DataFrame, champions: Sequence[pd.DataFrame], level: float, method: str = "wilson"
) -> Figures:
    """``forgotten`` of ``candidate`` against ``champions`` (the baseline and those before it), as
    rules read it.

    >>> c = answers(["a", "b"], ["x", "x"], ["y", "x"])
    >>> forgotten_figures(c, [answers(["a", "b"], ["x", "x"], ["x", "x"])], 0.95).metrics
    {'forgotten': 0.5}
    """
    figures = Figures()
    figures.share("forgotten", *forgotten_counts(candidate, champions), level, method)
    return figures


def cumulative_figures(steps: Sequence[tuple[int, int]], level: float) -> Figures:
    """``cumulative_nfr``: the negative flip rates of the updates ``steps`` ((NF_t, n_t), the
    candidate's own against the baseline last) summed, with a normal interval from their variances
    (each update's samples taken as independent) and one-sided bounds at ``level``.

    >>> f = cumulative_figures([(2, 100), (3, 100)], 0.95)
    >>> f.metrics["cumulative_nfr"], [round(v, 4) for v in f.bounds["cumulative_nfr"]]
    (0.05, [0.0137, 0.0863])
    """
    figures = Figures()
    used = [(nf, n) for nf, n in steps if n]
    if not used:
        figures.null("cumulative_nfr", "no update with shared samples")
        return figures
    total = sum(nf / n for nf, n in used)
    spread = float(np.sqrt(sum((nf / n) * (1 - nf / n) / n for nf, n in used)))
    for key, z in (("intervals", z_value(level)), ("bounds", z_value(one_sided(level)))):
        getattr(figures, key)["cumulative_nfr"] = [max(0.0, total - z * spread), total + z * spread]
    figures.metrics["cumulative_nfr"] = total
    return figures


def floor_figures(baseline: pd.DataFrame, candidate: pd.DataFrame, replica: pd.DataFrame, level: float) -> Figures:
    """The seed-noise floor: the replica's CtoI and CON against the baseline
    (``floor_ctoi``, ``floor_con``) and ``ctoi_excess`` = CtoI(b, c) - CtoI(b, r) with Newcombe's
    paired interval, on the samples all three answered (aligned by id).

    >>> b = answers(["a", "b", "c", "d"], list("xxxx"), list("xxxy"))
    >>> c = answers(["a", "b", "c", "d"], list("xxxx"), list("yyxy"))  # flips a and b
    >>> r = answers(["a", "b", "c", "d"], list("xxxx"), list("yxxx"))  # flips a: the seed alone
    >>> m = floor_figures(b, c, r, 0.95).metrics
    >>> m["floor_ctoi"], m["floor_con"], m["ctoi_excess"]
    (0.25, 0.5, 0.25)
    """
    frames = [f.set_index("id") for f in (baseline, candidate, replica)]
    shared = frames[0].index.intersection(frames[1].index).intersection(frames[2].index)
    right = [(f.loc[shared, "answer"] == f.loc[shared, "label"]).to_numpy() for f in frames]
    base, cand, rep = right
    n = len(shared)
    figures = Figures()
    figures.share("floor_ctoi", int((base & ~rep).sum()), n, level)
    agree = int((frames[0].loc[shared, "answer"].to_numpy() == frames[2].loc[shared, "answer"].to_numpy()).sum())
    figures.share("floor_con", agree, n, level)
    if n == 0:
        figures.null("ctoi_excess", "no sample answered by the baseline, the candidate and the replica")
        return figures
    flips_c, flips_r = base & ~cand, base & ~rep
    cells = [int(x.sum()) for x in (flips_c & flips_r, flips_r & ~flips_c, flips_c & ~flips_r, ~flips_c & ~flips_r)]
    figures.metrics["ctoi_excess"] = (cells[2] - cells[1]) / n
    figures.intervals["ctoi_excess"] = list(newcombe_paired(*cells, level))
    figures.bounds["ctoi_excess"] = list(newcombe_paired(*cells, one_sided(level)))
    return figures
