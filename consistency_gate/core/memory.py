"""The memory of what users saw: per item of a population, the belief over its true class and the answer
users last saw (the specification's "Population and memory"; Traeuble et al. 2021, with the previous step's
posterior as the next step's prior, so that no earlier generation is kept).

Each generation is an imperfect annotator with a confusion matrix ``C[y, j] = p(it answers j | true class y)``
(estimated on labelled samples the gate never judges on). A new generation's answer ``j`` multiplies each
item's belief by ``C[:, j]``; the answer users see changes only when the belief in the most likely class is
more than ``cost_ratio`` times the belief in the answer they saw (a negative flip costs that many positive
flips). An item the memory has not seen starts from a uniform prior with the answer users saw for it.

Beliefs are kept as float32 logarithms, shifted so that each row's largest is 0, and ids as one Arrow string
array found by their 64-bit hashes (:mod:`consistency_gate.core.ids`): ten million items of ten classes take
about 700 MB, an update is one pass over them, and the table is read and written a row group at a time.

>>> good = np.array([[0.9, 0.1], [0.1, 0.9]])
>>> memory = Memory.first(["a", "b"], ["x", "y"], np.array([0, 1]), good)
>>> memory, changed = memory.update(np.array(["x", "y"]), np.array([1, 1]), good, cost_ratio=2.0)
>>> memory.seen(["x", "y"]), changed  # x: one answer each way, the belief is even: users keep seeing 'a'
(['a', 'b'], 0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from consistency_gate.core.ids import as_text, lookup, sorted_keys
from consistency_gate.errors import DataError

if TYPE_CHECKING:
    import pyarrow.dataset as ds

ID = "id"  # the memory table's id column
SHOWN = "shown"  # the answer users last saw, as a class label
BELIEF = "belief:"  # the prefix of each class's log-belief column
ROWS = 1_000_000  # rows updated, read and written at a time (a row group of the table)
SMALLEST = 1e-6  # a class score below it counts as it: no score rules a class out
ANSWER = np.int16  # a class index: up to 32,767 classes


def _log_likelihood(confusion: np.ndarray, answers: np.ndarray) -> np.ndarray:
    """(n, p) log p(answer | true class) of each answer (an answer outside the classes, -1, says nothing)."""
    matrix = np.log(np.asarray(confusion, dtype=np.float64)).T.astype(np.float32)  # [answer, true class]
    out = np.zeros((len(answers), matrix.shape[1]), dtype=np.float32)
    known = answers >= 0
    out[known] = matrix[answers[known]]
    return out


def _log_scores(scores: np.ndarray) -> np.ndarray:
    """(n, p) the log of class scores taken as a likelihood (a score below :data:`SMALLEST` as it)."""
    return np.log(np.clip(scores, SMALLEST, 1.0)).astype(np.float32)


def _normalised(log: np.ndarray) -> np.ndarray:
    """Each row shifted so that its largest is 0 (the belief is known up to a factor)."""
    return log - log.max(axis=1, keepdims=True)


def lean_scan(dataset: ds.Dataset) -> dict:
    """The arguments of ``dataset.to_batches`` that read it a batch at a time: pyarrow's defaults read 16
    batches ahead and buffer a Parquet file's whole row groups (500 MB of a 10M-row population at once)."""
    import pyarrow.dataset as ds

    lean = {"batch_readahead": 1, "fragment_readahead": 1}
    if isinstance(dataset.format, ds.ParquetFileFormat):
        lean["fragment_scan_options"] = ds.ParquetFragmentScanOptions(pre_buffer=False)
    return lean


@dataclass(frozen=True)
class Repeats:
    """How a generation's answer depends on the answer users saw, beyond its confusion matrix: retrains on
    overlapping data make the same mistakes on the same items, so an answer that repeats what users saw is weak
    evidence, and one that departs from it strong. Estimated on labelled samples the gate never judges on
    (:meth:`estimate`): ``right``, the chance the generation answers the true class where users saw it;
    ``repeats``, the chance it answers what users saw where that was wrong; ``corrects``, the chance it answers
    the true class there. Its likelihood of answer ``a`` for an item whose users saw ``s``, over the true class
    ``y`` (:meth:`log_likelihood`): ``right`` for y = s = a; ``repeats`` for y != s = a; ``corrects`` for
    y = a != s; the rest of each case spread over the other answers as the confusion matrix spreads them (with
    two classes there is no other answer: ``repeats`` and ``corrects`` are scaled to sum to one).

    >>> repeats = Repeats.estimate(np.array([0, 0, 1, 1]), np.array([0, 0, 0, 0]), np.array([0, 0, 0, 1]))
    >>> repeats.right, repeats.repeats, repeats.corrects  # add-one smoothed: users saw two right, two wrong
    (0.75, 0.4, 0.4)
    """

    right: float
    repeats: float
    corrects: float

    @classmethod
    def estimate(cls, truth: np.ndarray, seen: np.ndarray, answers: np.ndarray) -> Repeats:
        """From the true classes, what users saw and the generation's answers of labelled samples (class indices),
        add-one smoothed (two outcomes where users saw right, three where they saw wrong).

        Parameters
        ----------
        truth, seen, answers : (n,) class indices.

        Returns
        -------
        The estimated :class:`Repeats`.
        """
        truth, seen, answers = (np.asarray(v) for v in (truth, seen, answers))
        right = seen == truth
        wrong = int((~right).sum()) + 3
        return cls(
            float((((answers == truth) & right).sum() + 1) / (right.sum() + 2)),
            float((((answers == seen) & ~right).sum() + 1) / wrong),
            float((((answers == truth) & ~right).sum() + 1) / wrong),
        )

    @staticmethod
    def if_independent(truth: np.ndarray, seen: np.ndarray, confusion: np.ndarray) -> float:
        """How often a generation with ``confusion`` would give what users saw where that was wrong, were its
        answers independent of theirs given the true class (the mean of ``confusion[y, s]`` over those samples);
        :attr:`repeats` against it says how correlated the generations are. 0 where users saw no wrong answer.

        >>> Repeats.if_independent(np.array([0, 1, 1]), np.array([0, 0, 1]), np.array([[0.9, 0.1], [0.3, 0.7]]))
        0.3
        """
        truth, seen = np.asarray(truth), np.asarray(seen)
        wrong = (seen != truth) & (seen >= 0) & (truth >= 0)
        return float(np.asarray(confusion)[truth[wrong], seen[wrong]].mean()) if wrong.any() else 0.0

    def log_likelihood(self, confusion: np.ndarray, answers: np.ndarray, shown: np.ndarray) -> np.ndarray:
        """(n, p) log p(answer | true class, what users saw) of each item (an answer outside the classes, -1, says
        nothing); ``confusion`` spreads each case's other answers.

        >>> repeats = Repeats(right=0.9, repeats=0.6, corrects=0.3)
        >>> np.exp(repeats.log_likelihood(np.full((3, 3), 1 / 3), np.array([0, 1]), np.array([0, 0]))).round(2)
        array([[0.9 , 0.6 , 0.6 ],
               [0.05, 0.3 , 0.1 ]], dtype=float32)
        """
        matrix = np.asarray(confusion, dtype=np.float64)
        diagonal = np.diag(matrix)
        answers, shown = np.asarray(answers, dtype=np.int64), np.asarray(shown, dtype=np.int64)
        known = answers >= 0
        a, s, rows = answers[known], shown[known], np.arange(int(known.sum()))
        repeats, corrects = self.repeats, self.corrects
        if len(matrix) == 2:  # where users saw wrong, the only answers are theirs and the true class
            repeats, corrects = repeats / (repeats + corrects), corrects / (repeats + corrects)
        # y != s and a not in {y, s}: what is left of the wrong cases, spread as the confusion matrix spreads it
        spread = matrix.T[a] / np.clip(1 - diagonal[None, :] - matrix[:, s].T, SMALLEST, None)
        lik = (1 - repeats - corrects) * spread
        lik[rows, a] = corrects  # y = a != s
        agree = a == s
        lik[agree] = repeats  # a = s: every y != s
        departed = (1 - self.right) * matrix[s, a] / np.clip(1 - diagonal[s], SMALLEST, None)
        lik[rows, s] = np.where(agree, self.right, departed)  # y = s
        out = np.zeros((len(answers), matrix.shape[0]), dtype=np.float32)
        out[known] = np.log(np.clip(lik, SMALLEST, None))
        return out


def _check_rows(path: Path, first: int, belief: np.ndarray, shown: np.ndarray, classes: list[str]) -> None:
    """A DataError naming the first of a table's rows (from row ``first``) whose answer is not one of its
    classes or whose belief is not finite."""
    if (shown < 0).any():
        row = first + int((shown < 0).argmax())
        raise DataError(f"{path}: row {row + 1}: the answer users saw is not one of its classes {classes[:6]}")
    finite = np.isfinite(belief).all(axis=1)
    if not finite.all():
        row = first + int((~finite).argmax())
        raise DataError(f"{path}: row {row + 1}: a belief is not a finite number; the memory table is damaged")


@dataclass(frozen=True)
class Memory:
    """Per id (unique text, in the order of their hashes ``keys``): the log-belief over ``classes`` and the answer
    users last saw (an index into ``classes``)."""

    classes: list[str]
    ids: pa.Array  # (n,) string, no nulls, in the order of keys
    keys: np.ndarray  # (n,) uint64, the ids' hashes, ascending
    log_belief: np.ndarray  # (n, p) float32, each row's largest 0
    shown: np.ndarray  # (n,) int16: classes, not ids, so 20 MB for ten million

    def __post_init__(self) -> None:
        n, p = len(self.ids), len(self.classes)
        if self.log_belief.shape != (n, p) or self.shown.shape != (n,) or self.keys.shape != (n,):
            raise ValueError(f"a memory of {n} ids and {p} classes needs ({n}, {p}) beliefs, {n} keys and answers")

    @classmethod
    def first(
        cls,
        classes: Sequence[str],
        ids: Sequence[object],
        shown: np.ndarray,
        confusion: np.ndarray,
        scores: np.ndarray | None = None,
    ) -> Memory:
        """The memory of items whose users saw ``shown`` (class indices) from a generation with ``confusion``:
        a uniform prior times that answer's likelihood (or, given, the generation's class ``scores``).

        >>> Memory.first(["a", "b"], ["y", "x"], np.array([1, 0]), np.eye(2) * 0.8 + 0.1).seen(["x", "y", "z"])
        ['a', 'b', None]
        """
        ids = as_text(ids)
        keys, order = sorted_keys(ids, "the population")
        shown = np.asarray(shown, dtype=ANSWER)[order]
        evidence = _log_likelihood(confusion, shown) if scores is None else _log_scores(np.asarray(scores)[order])
        return cls(list(classes), ids.take(pa.array(order)), keys, _normalised(evidence), shown)

    def __len__(self) -> int:
        return len(self.ids)

    def find(self, ids: Sequence[object]) -> np.ndarray:
        """The row of each id in the memory (-1 for an id it has not seen).

        >>> memory = Memory.first(["a", "b"], ["x", "y"], np.array([0, 1]), np.full((2, 2), 0.5))
        >>> (memory.find(["y", "z"]) >= 0).tolist()
        [True, False]
        """
        return lookup(self.keys, self.ids, as_text(ids))

    def seen(self, ids: Sequence[object]) -> list[str | None]:
        """The answer users saw for each id (None for an id the memory has not seen)."""
        rows = self.find(ids)
        return [self.classes[self.shown[r]] if r >= 0 else None for r in rows]

    def take(self, rows: np.ndarray) -> Memory:
        """The memory of its ``rows`` only (ascending).

        >>> memory = Memory.first(["a", "b"], ["x", "y"], np.array([0, 1]), np.full((2, 2), 0.5))
        >>> memory.take(np.sort(memory.find(["y"]))).seen(["x", "y"])
        [None, 'b']
        """
        rows = np.asarray(rows, dtype=np.int64)
        return Memory(self.classes, self.ids.take(pa.array(rows)), self.keys[rows], self.log_belief[rows],
                      self.shown[rows])  # fmt: skip

    def extended(self, ids: Sequence[object], shown: np.ndarray, confusion: np.ndarray) -> Memory:
        """This memory with the ids it has not seen added (users saw ``shown`` for them, from a generation
        with ``confusion``); ids it has are left as they are.

        >>> memory = Memory.first(["a", "b"], ["x"], np.array([0]), np.eye(2) * 0.8 + 0.1)
        >>> memory.extended(["y", "x"], np.array([1, 1]), np.eye(2) * 0.8 + 0.1).seen(["x", "y"])
        ['a', 'b']
        """
        ids = as_text(ids)
        new = self.find(ids) < 0
        if not new.any():
            return self
        return self.merged(Memory.first(self.classes, ids.filter(pa.array(new)), np.asarray(shown)[new], confusion))

    def merged(self, other: Memory) -> Memory:
        """This memory and ``other``, of other ids, as one (each array copied once, into its place).

        >>> good = np.eye(2) * 0.8 + 0.1
        >>> Memory.first(["a", "b"], ["x"], np.array([0]), good).merged(
        ...     Memory.first(["a", "b"], ["y"], np.array([1]), good)).seen(["x", "y"])
        ['a', 'b']
        """
        n, total = len(self), len(self) + len(other)
        at = np.searchsorted(self.keys, other.keys)  # the rows of this memory before which each of other's goes
        placed = at + np.arange(len(at))  # where each of other's rows goes
        keys, shown = np.empty(total, dtype=self.keys.dtype), np.empty(total, dtype=self.shown.dtype)
        belief = np.empty((total, len(self.classes)), dtype=self.log_belief.dtype)
        order = np.empty(total, dtype=np.int32 if total < 2**31 else np.int64)  # the row of [self, other] each takes
        for start in range(0, n, ROWS):  # this memory's rows, ROWS at a time: no index of them all is held
            rows = np.arange(start, min(start + ROWS, n))
            to = rows + np.searchsorted(at, rows, side="right")
            keys[to], shown[to], belief[to], order[to] = self.keys[rows], self.shown[rows], self.log_belief[rows], rows
        keys[placed], shown[placed], belief[placed], order[placed] = (
            other.keys,
            other.shown,
            other.log_belief,
            np.arange(n, total),
        )
        if total > 1 and (keys[1:] == keys[:-1]).any():  # an id of both, or two ids of one hash: name them
            sorted_keys(pa.concat_arrays([self.ids, other.ids]), "the population")
        ids = pa.chunked_array([self.ids, other.ids]).take(pa.array(order)).combine_chunks()
        return Memory(self.classes, ids, keys, belief, shown)

    def without(self, ids: Sequence[object]) -> tuple[Memory, int]:
        """This memory less ``ids`` (forgotten: their users next see the model's answer); returns it and how many
        of them it held.

        >>> memory = Memory.first(["a", "b"], ["x", "y"], np.array([0, 1]), np.full((2, 2), 0.5))
        >>> fewer, forgotten = memory.without(["y", "z"])
        >>> fewer.seen(["x", "y"]), forgotten
        (['a', None], 1)
        """
        rows = self.find(ids)
        keep = np.ones(len(self), dtype=bool)
        keep[rows[rows >= 0]] = False
        return self.take(np.flatnonzero(keep)), int((~keep).sum())

    def update(
        self,
        ids: Sequence[object],
        answers: np.ndarray,
        confusion: np.ndarray,
        cost_ratio: float,
        copy: bool = True,
        decay: float = 1.0,
        scores: np.ndarray | None = None,
        repeats: Repeats | None = None,
    ) -> tuple[Memory, int]:
        """The memory after a generation with ``confusion`` answered ``answers`` (class indices) for ``ids``
        (each in the memory: :meth:`extended` first); returns it and how many answers users see changed.
        It updates the beliefs :data:`ROWS` at a time, in a copy (``copy=False``: in this memory's own arrays,
        for a caller that holds it alone; 400 MB less for ten million ids of ten classes).

        Parameters
        ----------
        ids : the ids the generation scored.
        answers : (n,) its answers, indices into ``classes`` (-1: an answer outside them, which says nothing).
        confusion : (p, p) its confusion matrix, rows the true class.
        cost_ratio : how many times as likely another class must be for the answer users see to change (>= 1).
        copy : False to update this memory's arrays in place.
        decay : the weight of the belief so far before this generation's likelihood is added, in (0, 1]: 1 keeps
            every generation's evidence (Traeuble et al.), 0.5 halves the older evidence at each generation.
        scores : (n, p) the generation's class probabilities; given, their logarithm is its likelihood (the
            answers' through ``confusion`` otherwise).
        repeats : given, the answers' likelihood depends on what users saw too (:class:`Repeats`: generations
            that repeat the same mistakes are not independent witnesses).

        Returns
        -------
        (the updated memory, the number of ids whose answer changed)
        """
        if cost_ratio < 1 or not 0 < decay <= 1:
            raise ValueError(f"the cost ratio must be >= 1 and the decay in (0, 1], got {cost_ratio} and {decay}")
        ids, answers = as_text(ids), np.asarray(answers)
        belief, shown, changed = (
            (self.log_belief.copy(), self.shown.copy(), 0) if copy else (self.log_belief, self.shown, 0)
        )
        threshold = np.float32(np.log(cost_ratio)) + np.float32(1e-6)
        for start in range(0, len(ids), ROWS):
            rows = self.find(ids.slice(start, ROWS))
            if (rows < 0).any():
                missing = ids[start + int(np.flatnonzero(rows < 0)[0])].as_py()
                raise ValueError(f"id {missing!r} is not in the memory; extend it first")
            said = answers[start : start + ROWS].astype(np.int64)
            if scores is not None:
                evidence = _log_scores(scores[start : start + ROWS])
            elif repeats is not None:
                evidence = repeats.log_likelihood(confusion, said, shown[rows])
            else:
                evidence = _log_likelihood(confusion, said)
            prior = belief[rows] if decay == 1 else belief[rows] * np.float32(decay)
            part = _normalised(prior + evidence)
            belief[rows] = part
            seen = part[np.arange(len(rows)), shown[rows]]  # the best is 0: another class is more than
            change = -seen > threshold  # cost_ratio times as likely when log(best / seen) > log(cost_ratio)
            shown[rows[change]] = part[change].argmax(axis=1)
            changed += int(change.sum())
        return Memory(self.classes, self.ids, self.keys, belief, shown), changed

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

    def _schema(self) -> pa.Schema:
        return pa.schema([(ID, pa.string()), (SHOWN, pa.string()),
                          *((f"{BELIEF}{c}", pa.float32()) for c in self.classes)])  # fmt: skip

    def write(self, path: Path) -> int:
        """Write the table as Parquet (``id``, ``shown`` as the class label, one ``belief:<class>`` column per
        class), :data:`ROWS` rows a row group; returns its bytes."""
        import pyarrow.parquet as pq

        labels = pa.array(self.classes, type=pa.string())
        with pq.ParquetWriter(path, self._schema()) as writer:
            for start in range(0, max(len(self), 1), ROWS):
                stop = min(start + ROWS, len(self))
                beliefs = [pa.array(self.log_belief[start:stop, i]) for i in range(len(self.classes))]
                columns = [self.ids.slice(start, stop - start), labels.take(pa.array(self.shown[start:stop])), *beliefs]
                writer.write_table(pa.Table.from_arrays(columns, schema=self._schema()))
        return Path(path).stat().st_size

    @classmethod
    def read(cls, path: Path, classes: Sequence[str] | None = None, only: Sequence[object] | None = None) -> Memory:
        """The memory a table at ``path`` (a Parquet file, or a folder of them as Spark writes it) holds, read a
        row group at a time (``only``: the rows of these ids alone); a DataError naming the file and what
        is wrong when it is not one (not Parquet, no id, repeated ids, beliefs missing or not finite, an answer
        outside its classes, or classes other than ``classes``)."""
        import pyarrow.dataset as ds

        if not Path(path).exists():
            raise DataError(f"{path}: the memory table is missing; roll back to the version before it")
        try:
            table = ds.dataset(path, format="parquet")
            columns = table.schema.names
            own = [c.removeprefix(BELIEF) for c in columns if c.startswith(BELIEF)]
            if ID not in columns or SHOWN not in columns or not own:
                raise DataError(
                    f"{path}: a memory table has columns {ID}, {SHOWN} and {BELIEF}<class>; it has {columns[:6]}"
                )
            if classes is not None and list(classes) != own:
                raise DataError(
                    f"{path}: the memory's classes {own[:6]} are not the model's {list(classes)[:6]}: a memory of "
                    "other classes cannot be updated; start a new one (gate without the previous memory version)"
                )
            scan = {**lean_scan(table), "filter": None if only is None else ds.field(ID).isin(as_text(only))}
            ids = as_text(table.to_table(columns=[ID], **scan).column(0))  # first: before the beliefs
            keys, order = sorted_keys(ids, str(path))
            n, labels, at = len(ids), pa.array(own, type=pa.string()), 0
            belief, shown = np.empty((n, len(own)), dtype=np.float32), np.empty(n, dtype=ANSWER)
            for batch in table.to_batches(columns=[SHOWN, *(f"{BELIEF}{c}" for c in own)], batch_size=ROWS,
                                          **scan):  # fmt: skip
                found = pc.index_in(batch.column(0).cast(pa.string()), value_set=labels).fill_null(-1)
                shown[at : at + len(batch)] = found.to_numpy(zero_copy_only=False)
                for i in range(len(own)):
                    belief[at : at + len(batch), i] = batch.column(1 + i).to_numpy(zero_copy_only=False)
                _check_rows(path, at, belief[at : at + len(batch)], shown[at : at + len(batch)], own)
                at += len(batch)
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a damaged file
            raise DataError(
                f"{path}: the memory table cannot be read ({type(exc).__name__}: {exc}); it is damaged: "
                "roll back to the version before it, or gate again without it"
            ) from None
        if (order != np.arange(n)).any():  # written by another tool: put it in the order of the hashes
            ids, belief, shown = ids.take(pa.array(order)), belief[order], shown[order]
        belief -= belief.max(axis=1, keepdims=True)  # normalised in place: no second copy
        return cls(own, ids, keys, belief, shown)
