"""Many generations: negative flips summed over the champions' updates, and what a candidate forgets.

SPEC 5 (Traeuble et al., NeurIPS 2021): on samples aligned by id over the champions g_0 .. g_T in
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

from consistency_gate.core.intervals import proportion
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
    cand_right = _correct(candidate)
    ever_right = pd.Series(False, index=cand_right.index)
    seen = pd.Series(False, index=cand_right.index)
    for champion in champions:
        right = _correct(champion)
        shared = cand_right.index.intersection(right.index)
        seen[shared] = True
        ever_right[shared] = ever_right[shared].to_numpy() | right[shared].to_numpy()
    if not seen.any():
        return None
    return float((ever_right[seen] & ~cand_right[seen]).mean())
