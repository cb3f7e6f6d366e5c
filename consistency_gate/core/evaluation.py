"""Evaluating generations: class alignment by label name (one canonical class order), counts, the result.

:class:`Evaluation` turns labelled batches of predictions (pandas frames, one per
generation) into :class:`~consistency_gate.core.counts.ConsistencyCounts` for every pair
of generations, aligning classes by their label names in a shared class-id space.
The engines (:mod:`consistency_gate.engines.local`, :mod:`consistency_gate.engines.spark`) feed it.

>>> import pandas as pd
>>> ev = Evaluation(["previous", "candidate"], [("a", "b"), ("b", "a", "c")], ks=(1, 2))
>>> labels = pd.Series(["a", "c"])
>>> prev = pd.DataFrame({"a": [0.9, 0.6], "b": [0.1, 0.4]})
>>> cand = pd.DataFrame({"b": [0.2, 0.1], "a": [0.7, 0.1], "c": [0.1, 0.8]})
>>> ev.add(labels, [prev, cand])
>>> result = ev.result()
>>> result.metrics["acc_previous"], result.metrics["acc_candidate"], result.unknown_labels
(0.5, 1.0, {'previous': 1, 'candidate': 0})
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations

import numpy as np
import pandas as pd

from consistency_gate.core.counts import ConsistencyCounts, Outputs
from consistency_gate.core.history import Figures
from consistency_gate.core.names import FLIP_NAMES
from consistency_gate.core.slices import TRUE_CLASS, SliceCounts, SliceResult
from consistency_gate.core.threshold import BinaryDecision
from consistency_gate.errors import DataError, UsageError, plain

DEFAULT_KS = (1, 5)


def usable_ks(
    ks: Sequence[int] | None, widths: Mapping[str, int], where: str = "--k", needed: Iterable[int] | None = None
) -> tuple[int, ...]:
    """The k values of the top-k metrics to count, by one rule for every command and gate.

    A k is *applicable* to a comparison when it is at most the class count of the narrowest generation that
    gives scores (``widths``: a name for each such generation, its file or model, and its class count): a larger
    k would put every class in the top k. Of the k values asked for (``ks`` not None: ``--k``, a config's
    ``ks:``), those ``needed`` (default: all of them; a gate passes the ks its rules name) must be applicable,
    else a UsageError names ``where`` they came from and that generation; the others that are not applicable
    are not counted, and :func:`inapplicable_ks` gives their metrics as null with the reason, so nothing asked
    for is dropped silently. Without a request, the defaults ``DEFAULT_KS`` (1 and 5) are cut to the narrowest
    generation.

    Parameters
    ----------
    ks : the k values asked for, or None for the defaults.
    widths : {generation: number of classes} for the generations with score columns (none for hard labels).
    where : what the k values came from, for the error message.
    needed : the k values that must be counted (a rule's); None: all of ``ks``.

    Returns
    -------
    The sorted, distinct k values to count.

    Examples
    --------
    >>> usable_ks(None, {"g1.csv": 3}), usable_ks([2, 1, 2], {"g1.csv": 3, "g2.csv": 10}), usable_ks(None, {})
    ((1,), (1, 2), (1, 5))
    >>> usable_ks([1, 5], {"models:/clf/2": 2}, "gate.yaml: ks", needed=[1])  # k=5 does not apply to 2 classes
    (1,)
    >>> usable_ks([5], {"models:/clf/2": 3}, "gate.yaml: ks")
    Traceback (most recent call last):
    ...
    consistency_gate.errors.UsageError: gate.yaml: ks [5] larger than the 3 classes of models:/clf/2; use k <= 3
    """
    narrowest = min(widths.items(), key=lambda item: item[1]) if widths else None
    if ks is None:
        return tuple(k for k in DEFAULT_KS if narrowest is None or k <= narrowest[1]) or (1,)
    below = [k for k in ks if k < 1]
    if below:
        raise UsageError(f"{where} {below}: k must be at least 1")
    must = set(ks if needed is None else needed)
    above = sorted({k for k in ks if narrowest is not None and k > narrowest[1] and k in must})
    if above:
        source, width = narrowest
        raise UsageError(f"{where} {above} larger than the {width} classes of {source}; use k <= {width}")
    return tuple(sorted({k for k in ks if narrowest is None or k <= narrowest[1]})) or (1,)


def inapplicable_ks(ks: Sequence[int], widths: Mapping[str, int]) -> Figures:
    """The top-k metrics of the k values in ``ks`` that do not apply to these generations (larger than the class
    count of the narrowest one that gives scores, ``widths`` as for :func:`usable_ks`): null, each with its
    reason, for the report to say.

    >>> figures = inapplicable_ks([1, 5], {"models:/clf/1": 2, "models:/clf/2": 2})
    >>> sorted(figures.metrics)
    ['cacc_candidate@5', 'cacc_previous@5', 'ccon@5']
    >>> figures.null_reasons["ccon@5"]
    'not applicable: k=5 is larger than the 2 classes of models:/clf/1 (its top 5 would hold every class)'
    """
    figures = Figures()
    if not widths:
        return figures
    source, width = min(widths.items(), key=lambda item: item[1])
    for k in sorted({k for k in ks if k > width}):
        why = f"not applicable: k={k} is larger than the {width} classes of {source}"
        why += f" (its top {k} would hold every class)"
        for key in (f"ccon@{k}", f"cacc_previous@{k}", f"cacc_candidate@{k}"):
            figures.null(key, why)
    return figures


def evaluate_frames(
    labels: pd.Series,
    frames: Sequence[pd.DataFrame | pd.Series],
    ks: Sequence[int],
    where: str,
    slices: Sequence[str] = (),
    slice_values: Mapping[str, pd.Series] | None = None,
    decision: BinaryDecision | None = None,
) -> Evaluation:
    """The previous generation's and the candidate's score frames (one column per class label; a series
    of hard labels for a label-only model) on the same samples, counted with their true ``labels`` and
    kept per sample (for the flip table); the one place where in-memory scores become an
    :class:`Evaluation` (the gate of registered models and the ``consistency`` evaluator). ``slices``
    names the slicing columns (``TRUE_CLASS`` among them, if asked) and ``slice_values`` holds the
    values of the others; ``decision`` answers binary scores at a threshold.

    >>> frames = [pd.DataFrame({"a": [0.9, 0.2], "b": [0.1, 0.8]}), pd.DataFrame({"a": [0.4, 0.3], "b": [0.6, 0.7]})]
    >>> result = evaluate_frames(pd.Series(["a", "b"]), frames, ks=[1], where="eval.csv").result()
    >>> result.metrics["con"], result.metrics["ctoi"]
    (0.5, 0.5)
    """
    class_sets = [None if isinstance(f, pd.Series) else list(f.columns) for f in frames]  # a series: hard labels
    evaluation = Evaluation(
        ["previous", "candidate"], class_sets, ks=ks, keep_samples=True, slices=slices, decision=decision
    )
    evaluation.add(labels.astype(str), frames, where=where, slices=slice_values)
    return evaluation


def canonical_classes(class_sets: Sequence[Sequence[object] | None]) -> list[str]:
    """The canonical class order: the label names of the union of the generations' score
    classes, sorted as text. Argmax and top-k ties go to the class that comes first in it,
    so the column order of a file never changes a metric.

    >>> canonical_classes([["b", "a", "10"], None, ["c", "2"]])
    ['10', '2', 'a', 'b', 'c']
    """
    return sorted({str(c) for cs in class_sets if cs is not None for c in cs})


class ClassIndex:
    """Assigns a stable integer id to each class label (as text), in order of first sight."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}

    def add(self, labels: Sequence[str]) -> np.ndarray:
        """The ids of ``labels``, registering the ones not seen yet."""
        return np.array([self._ids.setdefault(str(label), len(self._ids)) for label in labels], dtype=np.int64)

    def ids(self, labels: pd.Series, register: bool) -> np.ndarray:
        """Class ids of a batch of labels; unseen labels get new ids if ``register``, else -1."""
        codes, uniques = pd.factorize(labels.astype(str), sort=False)
        if register:
            mapping = self.add(list(uniques))
        else:
            mapping = np.array([self._ids.get(u, -1) for u in uniques], dtype=np.int64)
        return mapping[codes]

    @property
    def labels(self) -> list[str]:
        """Every label seen, in id order."""
        return list(self._ids)


@dataclass
class ComparisonResult:
    """Metrics of one (previous, candidate) pair, shaped as ``compare --format json`` prints them."""

    n: int
    metrics: dict[str, float | None]
    null_reasons: dict[str, str]
    classes: list[str]
    unknown_labels: dict[str, int]
    counts: ConsistencyCounts | None = field(default=None, repr=False)
    confidence: float = 0.95  # the level of ``intervals``
    interval_method: str = "wilson"  # or "clopper-pearson", for proportions
    slice_counts: SliceCounts | None = field(default=None, repr=False)
    figures: Figures = field(default_factory=Figures, repr=False)  # measured beside the counts (history, floor)

    def add(self, figures: Figures) -> ComparisonResult:
        """Metrics measured beside this comparison (over the champions' history, against a seed
        replica), reported and judged with its own; returns self."""
        self.figures.update(figures)
        self.metrics.update(figures.metrics)
        self.null_reasons.update(figures.null_reasons)
        return self

    @property
    def slices(self) -> list[SliceResult]:
        """Every slice's metrics and intervals (none when the evaluation was not sliced)."""
        return self.slice_counts.results(self.confidence, self.interval_method) if self.slice_counts else []

    @property
    def intervals(self) -> dict[str, list[float]]:
        """``{key: [low, high]}`` for every non-null metric (and ``acc_delta``), at ``confidence``."""
        own = self.counts.intervals(self.confidence, self.interval_method) if self.counts else {}
        return {**own, **self.figures.intervals}

    @property
    def bounds(self) -> dict[str, list[float]]:
        """``{key: [lower, upper]}``, each a one-sided bound at ``confidence`` (what rules decided
        on a bound compare)."""
        return {**(self.counts.bounds(self.confidence) if self.counts else {}), **self.figures.bounds}

    @property
    def tests(self) -> dict[str, float]:
        """``{"mcnemar_p": p}``: the exact McNemar test of CtoI against ItoC."""
        return self.counts.tests() if self.counts else {}

    def to_dict(self) -> dict:
        """The ``compare --format json`` object (plus ``null_reasons``)."""
        return {
            "n": self.n,
            "metrics": self.metrics,
            "classes": self.classes,
            "unknown_labels": self.unknown_labels,
            "confidence": self.confidence,
            "intervals": self.intervals,
            "tests": self.tests,
            **({"slices": [s.to_dict() for s in self.slices]} if self.slice_counts else {}),
            "null_reasons": self.null_reasons,
        }


FLIP_TYPES = {(True, True): "CtoC", (True, False): "CtoI", (False, True): "ItoC", (False, False): "ItoI"}


def flip_table(samples: pd.DataFrame, ids: np.ndarray) -> pd.DataFrame:
    """The per-sample flip table of a (previous, candidate) pair: id, label, both predictions, flip type.

    ``samples`` is :meth:`Evaluation.samples` of an evaluation named ``previous`` and ``candidate``.

    >>> samples = pd.DataFrame({"label": ["a"], "previous_prediction": ["a"], "previous_correct": [True],
    ...                         "candidate_prediction": ["b"], "candidate_correct": [False]})
    >>> flip_table(samples, np.array(["s1"])).to_dict("records")
    [{'id': 's1', 'label': 'a', 'previous_prediction': 'a', 'candidate_prediction': 'b', 'flip': 'CtoI'}]
    """
    out = pd.DataFrame(
        {
            "id": ids,
            "label": samples["label"].to_numpy(),
            "previous_prediction": samples["previous_prediction"].to_numpy(),
            "candidate_prediction": samples["candidate_prediction"].to_numpy(),
        }
    )
    out["flip"] = [
        FLIP_TYPES[(bool(p), bool(c))]
        for p, c in zip(samples["previous_correct"], samples["candidate_correct"], strict=True)
    ]
    return out


class Evaluation:
    """Streams labelled prediction batches of T generations into pairwise counts.

    ``class_sets[i]`` is generation i's score-column labels in column order, or None
    when it gives hard labels. A true label that every score-giving generation lacks is
    a DataError; one that some generation lacks is counted in ``unknown_labels``.

    Class ids follow the canonical order (:func:`canonical_classes`), and each score matrix is
    laid out in id order before its top-k is taken, so ties go to the class whose label sorts
    first, whatever the order of the file's columns.

    With ``slices`` (slicing column names) the first pair (previous, candidate) is also counted
    per slice value (:mod:`consistency_gate.core.slices`): each batch then gives its values of
    those columns, but for :data:`~consistency_gate.core.slices.TRUE_CLASS`, the batch's labels.

    With a ``decision`` (:class:`~consistency_gate.core.threshold.BinaryDecision`, its positive class
    named) on two classes, a generation that gives scores answers the positive class where its score
    of that class reaches the threshold, and the other class otherwise; its top-2 is both classes.
    """

    def __init__(
        self,
        names: Sequence[str],
        class_sets: Sequence[Sequence[str] | None],
        ks: Sequence[int] = DEFAULT_KS,
        keep_samples: bool = False,
        slices: Sequence[str] = (),
        decision: BinaryDecision | None = None,
    ) -> None:
        self.names = list(names)
        # each generation that gives scores -> its class count (what the top-k metrics can apply to)
        self.widths = {n: len(cs) for n, cs in zip(self.names, class_sets, strict=True) if cs is not None}
        self.index = ClassIndex()
        self.index.add(canonical_classes(class_sets))
        ids = [None if cs is None else self.index.add([str(c) for c in cs]) for cs in class_sets]
        # each generation's columns in canonical order: (permutation or None if already in order, sorted ids)
        self.layouts = [None if c is None else _canonical_layout(c) for c in ids]
        self.ks = tuple(sorted(set(ks)))
        self.open_class_set = any(cs is None for cs in class_sets)
        self.pairs = {pair: ConsistencyCounts(ks=self.ks) for pair in combinations(range(len(names)), 2)}
        self.slice_columns = tuple(slices)
        self.slice_counts = SliceCounts(ks=self.ks) if slices else None
        self.keep_samples = keep_samples
        self._samples: list[pd.DataFrame] = []
        self.decision = None if decision is None else decision.resolved(self.index.labels, decision.positive)

    def add(
        self,
        labels: pd.Series,
        frames: Sequence[pd.DataFrame | pd.Series],
        where: str = "labels",
        slices: Mapping[str, pd.Series] | None = None,
    ) -> None:
        """Add one batch: true labels and each generation's frame (score columns) or hard-label series;
        for a sliced evaluation, ``slices[column]`` holds the batch's values of each slicing column."""
        y = self.index.ids(labels, register=self.open_class_set)
        if (y < 0).any():
            row = int(np.argmax(y < 0))
            raise DataError(
                f"{where}: row {int(labels.index[row]) + 1}: label {plain(labels.iloc[row])} is not a class of any "
                f"generation (known classes: {', '.join(self.index.labels[:10])}"
                f"{' ...' if len(self.index.labels) > 10 else ''})"
            )
        outputs, moments = self._outputs(frames)
        for (i, j), counts in self.pairs.items():
            values = counts.sample_values(y, outputs[i], outputs[j], moments.get((i, j)))
            kinds = (outputs[i].has_scores, outputs[j].has_scores)
            counts.add_values(values, kinds)
            if (i, j) == (0, 1) and self.slice_counts is not None:  # the same values, summed per slice
                keys = {name: labels if name == TRUE_CLASS else slices[name] for name in self.slice_columns}
                self.slice_counts.add_values(values, kinds, keys)
        if self.keep_samples:
            self._samples.append(self._sample_table(labels, y, outputs))

    def _outputs(
        self, frames: Sequence[pd.DataFrame | pd.Series]
    ) -> tuple[list[Outputs], dict[tuple[int, int], tuple[np.ndarray, ...]]]:
        """Each generation's outputs on a batch, and the per-row sums of the pairs that got them on
        the way: two generations' scores over the same classes are read in one pass per row pair."""
        scores = [
            None if layout is None else self._scores(frame, layout)
            for frame, layout in zip(frames, self.layouts, strict=True)
        ]
        if len(scores) == 2 and None not in scores and np.array_equal(scores[0][1], scores[1][1]):
            (previous, columns), (candidate, _) = scores
            *outputs, moments = Outputs.pair_from_scores(previous, candidate, columns, k_max=self.ks[-1])
            return [self._decided(out) for out in outputs], {(0, 1): moments}
        outputs = [
            Outputs.from_labels(self.index.ids(pd.Series(frame), register=True))
            if found is None
            else self._decided(Outputs.from_scores(*found, k_max=self.ks[-1]))
            for frame, found in zip(frames, scores, strict=True)
        ]
        return outputs, {}

    def _decided(self, out: Outputs) -> Outputs:
        """A binary generation's outputs answered at the decision threshold (unchanged without one)."""
        if self.decision is None:
            return out
        positive, negative = (self.index.ids(pd.Series([c]), register=False)[0] for c in self._binary_classes())
        column = np.flatnonzero(out.columns == positive)
        p_positive = out.scores[:, column[0]] if len(column) else np.zeros(len(out.labels))
        labels = self.decision.answers(p_positive, positive, negative)
        top = np.column_stack([labels, np.where(labels == positive, negative, positive)])[:, : out.top.shape[1]]
        return replace(out, labels=labels, top=top)

    def _binary_classes(self) -> tuple[str, str]:
        """The positive class and the other one."""
        positive = self.decision.positive
        return positive, next(c for c in self.index.labels if c != positive)

    @staticmethod
    def _scores(
        frame: pd.DataFrame | np.ndarray, layout: tuple[np.ndarray | None, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """A generation's score matrix with its columns in canonical order, and their class ids."""
        values = frame.to_numpy() if isinstance(frame, pd.DataFrame) else np.asarray(frame)
        order, columns = layout
        return (values if order is None else values[:, order]), columns

    def _sample_table(self, labels: pd.Series, y: np.ndarray, outputs: list[Outputs]) -> pd.DataFrame:
        names = np.array(self.index.labels, dtype=object)
        table = {"label": labels.to_numpy()}
        for name, out in zip(self.names, outputs, strict=True):
            table[f"{name}_prediction"] = names[out.labels]
            table[f"{name}_correct"] = out.labels == y
        return pd.DataFrame(table, index=labels.index)

    def samples(self) -> pd.DataFrame:
        """Per-sample predictions of every generation (only with ``keep_samples=True``)."""
        return pd.concat(self._samples) if self._samples else pd.DataFrame()

    def result(
        self,
        pair: tuple[int, int] = (0, 1),
        counts: ConsistencyCounts | None = None,
        confidence: float = 0.95,
        interval_method: str = "wilson",
        slice_counts: SliceCounts | None = None,
    ) -> ComparisonResult:
        """The metrics of a pair of generations; with ``counts`` (and ``slice_counts``), of counts
        merged elsewhere (the partitions of a map-reduce) over this evaluation's classes."""
        if counts is None:
            counts, slice_counts = self.pairs[pair], (self.slice_counts if pair == (0, 1) else None)
        values, reasons = counts.compute()
        return ComparisonResult(
            n=counts.n,
            metrics=values,
            null_reasons=reasons,
            classes=sorted(self.index.labels),
            unknown_labels=counts.unknown_labels(),
            counts=counts,
            confidence=confidence,
            interval_method=interval_method,
            slice_counts=slice_counts,
        )

    def generations_report(self) -> dict:
        """Wang et al. 2023's multi-generation summary: ACC averaged over generations, CON and
        ACC-CON averaged over all pairs, and the directional flips of consecutive pairs."""
        acc, unknown = {}, {}
        for (i, j), counts in self.pairs.items():
            values, _ = counts.compute()
            acc[self.names[i]] = values["acc_previous"]
            acc[self.names[j]] = values["acc_candidate"]
            unknown[self.names[i]], unknown[self.names[j]] = counts.unknown_previous, counts.unknown_candidate
        pair_values = {pair: counts.compute()[0] for pair, counts in self.pairs.items()}
        consecutive = {
            f"{self.names[i]}->{self.names[i + 1]}": {k: pair_values[(i, i + 1)][k] for k in FLIP_NAMES}
            for i in range(len(self.names) - 1)
        }
        return {
            "n": next(iter(self.pairs.values())).n,
            "acc": acc,
            "acc_mean": _mean(acc.values()),
            "con_mean": _mean(v["con"] for v in pair_values.values()),
            "acc_con_mean": _mean(v["acc_con"] for v in pair_values.values()),
            "pairs": {f"{self.names[i]}|{self.names[j]}": v for (i, j), v in pair_values.items()},
            "consecutive_flips": consecutive,
            "classes": sorted(self.index.labels),
            # samples whose true label is not a class of that generation (counted as its errors)
            "unknown_labels": unknown,
        }


def _canonical_layout(ids: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """The column permutation that puts class ids in ascending (canonical) order, or None when
    the columns already are, and the ids in that order."""
    order = np.argsort(ids, kind="stable")
    if (np.diff(ids) > 0).all():
        return None, ids
    return order, ids[order]


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None
