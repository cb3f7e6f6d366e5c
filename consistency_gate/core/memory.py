"""The memory of what users saw: per item of a population, the belief over its true class and the answer
users last saw (the specification's "Population and memory"; Traeuble et al. 2021, with the previous step's
posterior as the next step's prior, so that no earlier generation is kept).

Each generation is an imperfect annotator with a confusion matrix ``C[y, j] = p(it answers j | true class y)``
(estimated on labelled samples the gate never judges on). A new generation's answer ``j`` multiplies each
item's belief by ``C[:, j]``; the answer users see changes only when the belief in the most likely class is
more than ``cost_ratio`` times the belief in the answer they saw (a negative flip costs that many positive
flips). An item the memory has not seen starts from a uniform prior with the answer users saw for it.

Beliefs are kept as float32 logarithms, shifted so that each row's largest is 0: ten million items of ten
classes take 400 MB, and an update is one pass over them.

>>> good = np.array([[0.9, 0.1], [0.1, 0.9]])
>>> memory = Memory.first(["a", "b"], ["x", "y"], np.array([0, 1]), good)
>>> memory, changed = memory.update(np.array(["x", "y"]), np.array([1, 1]), good, cost_ratio=2.0)
>>> memory.shown.tolist(), changed  # x: one answer each way, the belief is even: users keep seeing 'a'
([0, 1], 0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from consistency_gate.errors import DataError

ID = "id"  # the memory table's id column
SHOWN = "shown"  # the answer users last saw, as a class label
BELIEF = "belief:"  # the prefix of each class's log-belief column


def _log_likelihood(confusion: np.ndarray, answers: np.ndarray) -> np.ndarray:
    """(n, p) log p(answer | true class) of each answer (an answer outside the classes, -1, says nothing)."""
    matrix = np.log(np.asarray(confusion, dtype=np.float64)).T.astype(np.float32)  # [answer, true class]
    out = np.zeros((len(answers), matrix.shape[1]), dtype=np.float32)
    known = answers >= 0
    out[known] = matrix[answers[known]]
    return out


def _normalised(log: np.ndarray) -> np.ndarray:
    """Each row shifted so that its largest is 0 (the belief is known up to a factor)."""
    return log - log.max(axis=1, keepdims=True)


@dataclass(frozen=True)
class Memory:
    """Per id (sorted, unique, as text): the log-belief over ``classes`` and the answer users last saw
    (an index into ``classes``)."""

    classes: list[str]
    ids: np.ndarray  # (n,) object: sorted, unique
    log_belief: np.ndarray  # (n, p) float32, each row's largest 0
    shown: np.ndarray  # (n,) int64

    def __post_init__(self) -> None:
        n, p = len(self.ids), len(self.classes)
        if self.log_belief.shape != (n, p) or self.shown.shape != (n,):
            raise ValueError(f"a memory of {n} ids and {p} classes needs ({n}, {p}) beliefs and {n} answers")

    @classmethod
    def first(cls, classes: Sequence[str], ids: Sequence[object], shown: np.ndarray, confusion: np.ndarray) -> Memory:
        """The memory of items whose users saw ``shown`` (class indices) from a generation with ``confusion``:
        a uniform prior times that answer's likelihood.

        >>> Memory.first(["a", "b"], ["y", "x"], np.array([1, 0]), np.eye(2) * 0.8 + 0.1).ids.tolist()
        ['x', 'y']
        """
        ids = unique_ids(ids, "the population")
        order = np.argsort(ids, kind="stable")
        shown = np.asarray(shown, dtype=np.int64)[order]
        return cls(list(classes), ids[order], _normalised(_log_likelihood(confusion, shown)), shown)

    def __len__(self) -> int:
        return len(self.ids)

    def find(self, ids: Sequence[object]) -> np.ndarray:
        """The row of each id in the memory (-1 for an id it has not seen).

        >>> Memory.first(["a", "b"], ["x", "y"], np.array([0, 1]), np.full((2, 2), 0.5)).find(["y", "z"]).tolist()
        [1, -1]
        """
        wanted = np.asarray([str(i) for i in ids], dtype=object)
        at = np.searchsorted(self.ids, wanted)
        inside = at < len(self.ids)
        found = np.zeros(len(wanted), dtype=bool)
        found[inside] = self.ids[at[inside]] == wanted[inside]
        return np.where(found, at, -1)

    def extended(self, ids: Sequence[object], shown: np.ndarray, confusion: np.ndarray) -> Memory:
        """This memory with the ids it has not seen added (users saw ``shown`` for them, from a generation
        with ``confusion``); ids it has are left as they are.

        >>> memory = Memory.first(["a", "b"], ["x"], np.array([0]), np.eye(2) * 0.8 + 0.1)
        >>> memory.extended(["y", "x"], np.array([1, 1]), np.eye(2) * 0.8 + 0.1).shown.tolist()
        [0, 1]
        """
        ids = unique_ids(ids, "the population")
        new = self.find(ids) < 0
        if not new.any():
            return self
        added = Memory.first(self.classes, ids[new], np.asarray(shown)[new], confusion)
        merged = np.concatenate([self.ids, added.ids])
        order = np.argsort(merged, kind="stable")
        belief = np.concatenate([self.log_belief, added.log_belief])[order]
        return Memory(self.classes, merged[order], belief, np.concatenate([self.shown, added.shown])[order])

    def without(self, ids: Sequence[object]) -> tuple[Memory, int]:
        """This memory less ``ids`` (forgotten: their users next see the model's answer); returns it and how many
        of them it held.

        >>> memory = Memory.first(["a", "b"], ["x", "y"], np.array([0, 1]), np.full((2, 2), 0.5))
        >>> memory.without(["y", "z"])[0].ids.tolist(), memory.without(["y", "z"])[1]
        (['x'], 1)
        """
        rows = self.find(ids)
        keep = np.ones(len(self.ids), dtype=bool)
        keep[rows[rows >= 0]] = False
        forgotten = int((~keep).sum())
        return Memory(self.classes, self.ids[keep], self.log_belief[keep], self.shown[keep]), forgotten

    def update(
        self, ids: Sequence[object], answers: np.ndarray, confusion: np.ndarray, cost_ratio: float
    ) -> tuple[Memory, int]:
        """The memory after a generation with ``confusion`` answered ``answers`` (class indices) for ``ids``
        (each in the memory: :meth:`extended` first); returns it and how many answers users see changed.

        Parameters
        ----------
        ids : the ids the generation scored.
        answers : (n,) its answers, indices into ``classes`` (-1: an answer outside them, which says nothing).
        confusion : (p, p) its confusion matrix, rows the true class.
        cost_ratio : how many times as likely another class must be for the answer users see to change (>= 1).

        Returns
        -------
        (the updated memory, the number of ids whose answer changed)
        """
        if cost_ratio < 1:
            raise ValueError(f"the cost ratio must be >= 1, got {cost_ratio}")
        rows = self.find(ids)
        if (rows < 0).any():
            missing = np.asarray(ids, dtype=object)[rows < 0][0]
            raise ValueError(f"id {missing!r} is not in the memory; extend it first")
        belief = self.log_belief.copy()
        belief[rows] = _normalised(belief[rows] + _log_likelihood(confusion, np.asarray(answers, dtype=np.int64)))
        shown = self.shown.copy()
        best = belief[rows].argmax(axis=1)
        seen = belief[rows, shown[rows]]  # the best is 0: it is more than cost_ratio times as likely when
        change = -seen > np.float32(np.log(cost_ratio)) + np.float32(1e-6)  # log(best / seen) > log(cost_ratio)
        shown[rows[change]] = best[change]
        return Memory(self.classes, self.ids, belief, shown), int(change.sum())

    def scores(self, rows: np.ndarray) -> np.ndarray:
        """(n, p) class scores of the memory's ``rows`` whose highest is the answer users see: the belief,
        normalised, with that answer's score and the highest swapped.

        >>> memory = Memory.first(["a", "b"], ["x"], np.array([0]), np.array([[0.6, 0.4], [0.3, 0.7]]))
        >>> memory.scores(np.array([0])).round(3).tolist()
        [[0.667, 0.333]]
        """
        belief = np.exp(self.log_belief[rows].astype(np.float64))
        belief /= belief.sum(axis=1, keepdims=True)
        index = np.arange(len(rows))
        top, shown = belief.argmax(axis=1), self.shown[rows]
        out = belief.copy()
        out[index, top], out[index, shown] = belief[index, shown], belief[index, top]
        return out

    def to_frame(self) -> pd.DataFrame:
        """As a table: ``id``, ``shown`` (the class label) and one ``belief:<class>`` column per class."""
        frame = pd.DataFrame(self.log_belief, columns=[f"{BELIEF}{c}" for c in self.classes])
        frame.insert(0, SHOWN, np.asarray(self.classes, dtype=object)[self.shown])
        frame.insert(0, ID, self.ids)
        return frame

    def write(self, path: Path) -> int:
        """Write the table as Parquet; returns its bytes."""
        self.to_frame().to_parquet(path, index=False)
        return Path(path).stat().st_size

    @classmethod
    def read(cls, path: Path, classes: Sequence[str] | None = None) -> Memory:
        """The memory a table at ``path`` holds; a DataError naming the file and what is wrong when it is not
        one (not Parquet, no id, repeated ids, beliefs missing or not finite, an answer outside its classes, or
        classes other than ``classes``)."""
        if not Path(path).is_file():
            raise DataError(f"{path}: the memory table is missing; roll back to the version before it")
        try:
            frame = pd.read_parquet(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a damaged file
            raise DataError(
                f"{path}: the memory table cannot be read ({type(exc).__name__}: {exc}); it is damaged: "
                "roll back to the version before it, or gate again without it"
            ) from None
        columns = [str(c) for c in frame.columns]
        own = [c.removeprefix(BELIEF) for c in columns if c.startswith(BELIEF)]
        if ID not in columns or SHOWN not in columns or not own:
            raise DataError(
                f"{path}: a memory table has columns {ID}, {SHOWN} and {BELIEF}<class>; it has {columns[:6]}"
            )
        if classes is not None and list(classes) != own:
            raise DataError(
                f"{path}: the memory's classes {own[:6]} are not the model's {list(classes)[:6]}: a memory of other "
                "classes cannot be updated; start a new one (gate without the previous memory version)"
            )
        ids = unique_ids(frame[ID], str(path))
        belief = frame[[f"{BELIEF}{c}" for c in own]].to_numpy(dtype=np.float32)
        if not np.isfinite(belief).all():
            row = int((~np.isfinite(belief)).any(axis=1).argmax())
            raise DataError(f"{path}: row {row + 1}: a belief is not a finite number; the memory table is damaged")
        index = {c: i for i, c in enumerate(own)}
        shown = np.array([index.get(str(v), -1) for v in frame[SHOWN]], dtype=np.int64)
        if (shown < 0).any():
            row = int((shown < 0).argmax())
            raise DataError(
                f"{path}: row {row + 1}: answer {frame[SHOWN].iloc[row]!r} is not one of its classes {own[:6]}"
            )
        order = np.argsort(ids, kind="stable")
        return cls(own, ids[order], _normalised(belief[order]), shown[order])


def unique_ids(ids: Sequence[object], where: str) -> np.ndarray:
    """``ids`` as text (an object array); a DataError naming ``where`` and the first id that repeats or is
    missing.

    >>> unique_ids([3, "4"], "pop.csv").tolist()
    ['3', '4']
    >>> unique_ids(["a", "b", "a"], "pop.csv")
    Traceback (most recent call last):
    ...
    consistency_gate.errors.DataError: pop.csv: id 'a' appears 2 times (rows 1 and 3); a population names each ...
    """
    series = pd.Series(list(ids) if not isinstance(ids, pd.Series) else ids).reset_index(drop=True)
    if series.isna().any():
        row = int(series.isna().to_numpy().argmax())
        raise DataError(f"{where}: row {row + 1}: the id is empty; every item of a population needs one")
    text = series.astype(str)
    repeated = text.duplicated(keep=False)
    if repeated.any():
        first = text[repeated].iloc[0]
        rows = np.flatnonzero((text == first).to_numpy())
        raise DataError(
            f"{where}: id {first!r} appears {len(rows)} times (rows {rows[0] + 1} and {rows[1] + 1}); a population "
            "names each item once: drop the repeats"
        )
    return text.to_numpy(dtype=object)
