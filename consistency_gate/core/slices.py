"""Slices: the consistency counts of every value of a slicing column, mergeable like the rest.

A slice is one value of a column of the evaluation data (``region = EU``) or of the true class
(the built-in slice :data:`TRUE_CLASS`). :class:`SliceCounts` keeps one
:class:`~consistency_gate.core.counts.ConsistencyCounts` per (column, value): the slice is part of
the counting key, so a stream of batches and the partitions of a Spark job merge into the same
counts as one pass, and every per-slice metric has its interval from its own counts.

>>> import numpy as np
>>> y = np.array([0, 0, 1, 1])
>>> prev, cand = Outputs.from_labels(np.array([0, 0, 1, 1])), Outputs.from_labels(np.array([0, 1, 1, 1]))
>>> counts = SliceCounts().update(y, prev, cand, {"region": np.array(["eu", "eu", "us", "us"])})
>>> [(s.value, s.n, s.metrics["ctoi"]) for s in counts.results()]
[('eu', 2, 0.5), ('us', 2, 0.0)]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from consistency_gate.core.counts import ConsistencyCounts, Outputs
from consistency_gate.errors import DataError

TRUE_CLASS = "true_class"  # the built-in slicing column: the sample's true label
MISSING = "(missing)"  # the slice of samples whose slicing column is empty
# distinct values a slicing column may have: slices are groups (region, device, class), not ids
MAX_SLICE_VALUES = 10_000


@dataclass(frozen=True)
class SliceResult:
    """The metrics of one slice (``column`` = ``value``, ``n`` samples), their intervals and the
    one-sided bounds a per-slice rule decided on a bound compares."""

    column: str
    value: str
    n: int
    metrics: dict[str, float | None]
    intervals: dict[str, list[float]]
    bounds: dict[str, list[float]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The slice as it reads: ``region=EU``."""
        return f"{self.column}={self.value}"

    def to_dict(self) -> dict:
        """As in the JSON report (``slices``)."""
        return {
            "column": self.column,
            "value": self.value,
            "n": self.n,
            "metrics": self.metrics,
            "intervals": self.intervals,
        }


@dataclass
class SliceCounts:
    """One :class:`ConsistencyCounts` per (slicing column, value); see the module docstring."""

    ks: tuple[int, ...] = (1,)
    parts: dict[tuple[str, str], ConsistencyCounts] = field(default_factory=dict)

    def update(
        self, y_true: np.ndarray, previous: Outputs, candidate: Outputs, keys: Mapping[str, np.ndarray | pd.Series]
    ) -> SliceCounts:
        """Add one batch; ``keys[column]`` is each sample's value of that slicing column. Returns self."""
        values = ConsistencyCounts(ks=self.ks).sample_values(y_true, previous, candidate)
        return self.add_values(values, (previous.has_scores, candidate.has_scores), keys)

    def add_values(
        self, values: Mapping[str, np.ndarray], kinds: tuple[bool, bool], keys: Mapping[str, np.ndarray | pd.Series]
    ) -> SliceCounts:
        """Add a batch's per-sample values (:meth:`ConsistencyCounts.sample_values`, computed once for
        the whole count and its slices), summed per slice value with ``np.bincount`` whatever the
        number of slices. Raises DataError when a column has more than ``MAX_SLICE_VALUES`` values."""
        for column, slice_keys in keys.items():
            text = pd.Series(slice_keys).astype("string").fillna(MISSING).to_numpy()
            codes, uniques = pd.factorize(text, sort=False)
            sizes = np.bincount(codes, minlength=len(uniques))
            totals = {key: np.bincount(codes, weights=v, minlength=len(uniques)) for key, v in values.items()}
            for code, value in enumerate(uniques):
                key = (column, str(value))
                if key not in self.parts:
                    self._check_room(column)
                    self.parts[key] = ConsistencyCounts(ks=self.ks)
                self.parts[key].add({name: total[code] for name, total in totals.items()}, int(sizes[code]), kinds)
        return self

    def _check_room(self, column: str) -> None:
        if sum(c == column for c, _ in self.parts) >= MAX_SLICE_VALUES:
            raise DataError(
                f"slicing column '{column}' has more than {MAX_SLICE_VALUES:,} distinct values; slices are groups "
                "(region, device, class), not ids: slice on a coarser column"
            )

    def merge(self, other: SliceCounts) -> SliceCounts:
        """A new SliceCounts holding both (a slice seen on one side only is kept as it is)."""
        if self.ks != other.ks:
            raise ValueError(f"cannot merge slice counts for k={self.ks} with counts for k={other.ks}")
        out = SliceCounts(ks=self.ks, parts=dict(self.parts))
        for key, counts in other.parts.items():
            out.parts[key] = out.parts[key].merge(counts) if key in out.parts else counts
        return out

    def results(self, level: float = 0.95, method: str = "wilson") -> list[SliceResult]:
        """Every slice's metrics and intervals, by column (in order of first sight) and value."""
        columns = list(dict.fromkeys(c for c, _ in self.parts))
        out = []
        for (column, value), counts in sorted(self.parts.items(), key=lambda kv: (columns.index(kv[0][0]), kv[0][1])):
            values, _ = counts.compute()
            found = SliceResult(column, value, counts.n, values, counts.intervals(level, method), counts.bounds(level))
            out.append(found)
        return out
