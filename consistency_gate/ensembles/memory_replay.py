"""The memory's setting chosen from the team's own history, apart from what is judged (``update:`` and
``cost_ratio:`` left to the gate).

A memory version carries :data:`ARTIFACT`: every generation's answers on the tuning ids (:class:`History`). At
each gate the candidate's answers are appended, and the memory is replayed over the whole history on the tuning
ids with each setting of the grid (the two updates, independent and correlated, at each ratio of
:data:`~consistency_gate.ensembles.answers.COST_RATIOS`; a setting the config fixes is kept): what users would
have seen after each replayed gate, each generation's confusion matrix (and, for the correlated update, its
:class:`~consistency_gate.core.memory.Repeats`) estimated on the other half of the tuning ids than the one it is
replayed on (:data:`FOLDS`), so that the figures are not read on the samples that tuned them. :func:`choose`
takes the setting with the fewest cumulative negative flips (then the most accurate) among those whose accuracy
over the replayed gates stays within :data:`MARGIN` of replacing's on a paired bound (the mean per-sample
difference plus :data:`SPREAD` standard errors: the noise of the tuning sample in the rule), else the most
accurate. The judged ids and their labels are never read.

>>> history = History(["a", "b", "c", "d"], np.array([[0, 1, 1, 0], [0, 1, 0, 0]], dtype=np.int16))
>>> choice = choose(history, np.array([0, 1, 0, 0]), ["x", "y"])
>>> choice.generations, choice.ids, choice.replace_flips
(1, 4, 0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from consistency_gate.core.ids import as_text
from consistency_gate.core.memory import Memory, Repeats
from consistency_gate.ensembles.answers import COST_RATIOS, index_confusion

if TYPE_CHECKING:
    from consistency_gate.ensembles.method import TuningData

ARTIFACT = "replay.parquet"  # a memory version's history: its generations' answers on the tuning ids
MISSING = -2  # an id a generation did not answer (-1 is an answer outside the classes)
MARGIN = 0.005  # the replayed accuracy over the gates at most half a point below replacing's (the goal's margin)
FOLDS = 2  # the tuning ids replayed in halves, each with the confusion matrices of the other
SPREAD = 1.645  # the paired bound: the mean difference plus this many standard errors (one-sided 95%, the
# gate's default confidence): a setting is refused where the replay shows at that level that it loses more
# than the margin (1 standard error: 3.8x, 6.8x, 8.8x, 10.9x fewer on the four recipes offline, about the
# same accuracy; 1.645: 3.8x, 9.6x, 9.9x, 12.5x; benchmarks/memory_likelihoods.py)
FEWEST_IDS = 20  # fewer tuning ids with a whole history: the setting is not replayed
UPDATES = ("independent", "correlated")


@dataclass(frozen=True)
class History:
    """Each generation's answers (rows, oldest first; class indices, :data:`MISSING` where it did not answer)
    on the tuning ids (columns), as a memory version carries it (:data:`ARTIFACT`)."""

    ids: list[str]
    answers: np.ndarray

    @classmethod
    def read(cls, path: Path | None) -> History | None:
        """The history a memory version carries (None: it carries none, as one logged before it was kept)."""
        if path is None or not Path(path).exists():
            return None
        frame = pd.read_parquet(path)
        return cls(frame["id"].astype(str).tolist(), frame.drop(columns="id").to_numpy(np.int16).T.copy())

    def write(self, path: Path) -> None:
        """Write it as a Parquet table: the id column, then a column per generation."""
        columns = {f"g{g}": self.answers[g] for g in range(len(self.answers))}
        pd.DataFrame({"id": self.ids, **columns}).to_parquet(path, index=False)

    def on(self, ids: Sequence[object]) -> np.ndarray:
        """(generations, len(ids)): each generation's answers on ``ids``, :data:`MISSING` where it has none.

        >>> History(["a", "b"], np.array([[3, 4]], dtype=np.int16)).on(["b", "z"]).tolist()
        [[4, -2]]
        """
        where = {i: k for k, i in enumerate(self.ids)}
        rows = np.array([where.get(str(i), -1) for i in ids], dtype=np.int64)
        out = np.full((len(self.answers), len(rows)), MISSING, dtype=np.int16)
        out[:, rows >= 0] = self.answers[:, rows[rows >= 0]]
        return out

    @classmethod
    def started(cls, before: History | None, ids: Sequence[object], seen: np.ndarray) -> History:
        """The history on ``ids`` so far: ``before``'s (a memory version's), else the answers users saw (``seen``,
        the model the champion serves) as its first generation."""
        ids = [str(i) for i in ids]
        if before is None:
            return cls(ids, np.asarray(seen, dtype=np.int16)[None, :])
        return cls(ids, before.on(ids))

    def whole(self, truth: np.ndarray) -> np.ndarray:
        """Which ids have every generation's answer and a label among the classes (``truth`` >= 0): those replayed.

        >>> History(["a", "b", "c"], np.array([[0, MISSING, 1]], dtype=np.int16)).whole(np.array([0, 1, -1])).tolist()
        [True, False, False]
        """
        return (self.answers != MISSING).all(axis=0) & (np.asarray(truth) >= 0)

    def appended(self, answers: np.ndarray) -> History:
        """This history with one more generation's answers on its ids."""
        return History(self.ids, np.vstack([self.answers, np.asarray(answers, dtype=np.int16)[None, :]]))


@dataclass(frozen=True)
class Choice:
    """The setting the replay chose and what it measured with it: the update and the cost ratio; how many
    gates and tuning ids it replayed and how many settings; its cumulative negative flips there and replacing's;
    the mean change of accuracy over the replayed gates against replacing (points of a share) and its paired
    upper bound."""

    update: str
    cost_ratio: float
    generations: int
    ids: int
    settings: int
    flips: int
    replace_flips: int
    accuracy_change: float
    bound: float

    def said(self) -> dict:
        """As the run's parameters and the report's setting say it (``replayed_*``)."""
        return {f"replayed_{k}": (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def gates(count: int) -> str:
    """How many gates were replayed, in words.

    >>> gates(1), gates(9)
    ('1 gate', '9 gates')
    """
    return f"{count} gate" + ("s" if count != 1 else "")


def tuning_ids(held: TuningData, id_column: str) -> list[str]:
    """The tuning samples' ids (their row numbers where they have none: a history no later gate continues)."""
    if id_column not in held.frame.columns:
        return [f"row {i}" for i in range(len(held.frame))]
    return as_text(held.frame[id_column]).to_pylist()


def replayed(
    history: History, truth: np.ndarray, classes: list[str], fixed: tuple[str | None, float | None], decay: float
) -> Choice | None:
    """:func:`choose` over what the config leaves to the gate (``fixed``: its ``update:`` and ``cost_ratio:``,
    None where it leaves them); None where it fixes both, or fewer than :data:`FEWEST_IDS` tuning ids have a whole
    history and a label."""
    if None not in fixed or int(history.whole(truth).sum()) < FEWEST_IDS:
        return None
    return choose(history, truth, classes, grid(*fixed), decay)


def grid(update: str | None, cost_ratio: float | None) -> list[tuple[str, float]]:
    """The settings replayed: each update at each ratio, less what the config fixes.

    >>> len(grid(None, None)), grid("correlated", 10.0)
    (16, [('correlated', 10.0)])
    """
    updates = UPDATES if update is None else (update,)
    ratios = COST_RATIOS if cost_ratio is None else (cost_ratio,)
    return [(u, r) for u in updates for r in ratios]


def choose(
    history: History,
    truth: np.ndarray,
    classes: Sequence[str],
    settings: list[tuple[str, float]] | None = None,
    decay: float = 1.0,
    folds: int = FOLDS,
) -> Choice:
    """The setting of ``settings`` (default :func:`grid`'s) with the fewest cumulative negative flips over the
    replayed history among those within :data:`MARGIN` of replacing's accuracy on the paired bound, else the
    most accurate; replayed on the ids with a whole history and a known label.

    Parameters
    ----------
    history : every generation's answers on the tuning ids, the candidate's last.
    truth : (n,) the tuning ids' true classes (indices into ``classes``; -1 for a label outside them).
    classes : the class order.
    settings : (update, cost ratio) pairs.
    decay : the memory's ``decay:``.
    folds : the parts the tuning ids are replayed in, each with the other parts' matrices (1: on the ids that
        estimated them).

    Returns
    -------
    The :class:`Choice`.
    """
    settings = settings or grid(None, None)
    whole = history.whole(truth)
    answers, truth = history.answers[:, whole].astype(np.int64), np.asarray(truth)[whole]
    ids = [i for i, keep in zip(history.ids, whole, strict=True) if keep]
    fold = np.arange(len(ids)) % folds
    replaced = answers == truth
    replace_flips = int((replaced[:-1] & ~replaced[1:]).sum())
    halves = [(fold == f, ~(fold == f) if (fold != f).any() else fold == f) for f in range(folds)]
    matrices = [[index_confusion(truth[estimate], answers[g][estimate], len(classes)) for g in range(len(answers))]
                for _, estimate in halves]  # fmt: skip
    best = None
    for update, ratio in settings:
        shown = np.empty_like(answers)
        for (rows, estimate), matrix in zip(halves, matrices, strict=True):
            shown[:, rows] = _replayed(answers, truth, estimate, matrix, classes, update, ratio, decay, ids)[:, rows]
        right = shown == truth
        gain = (right[1:] * 1.0 - replaced[1:]).ravel()
        spread = SPREAD * gain.std(ddof=1) / np.sqrt(len(gain)) if len(gain) > 1 else 0.0
        change = float(gain.mean()) if len(gain) else 0.0
        flips = int((right[:-1] & ~right[1:]).sum())
        choice = Choice(update, ratio, len(answers) - 1, len(ids), len(settings), flips, replace_flips, change,
                        change + spread)  # fmt: skip
        key = (choice.bound < -MARGIN, flips if choice.bound >= -MARGIN else 0, -change)  # equal flips: more accurate
        if best is None or key < best[0]:
            best = (key, choice)
    return best[1]


def _replayed(
    answers: np.ndarray,
    truth: np.ndarray,
    estimate: np.ndarray,
    matrices: list[np.ndarray],
    classes: Sequence[str],
    update: str,
    ratio: float,
    decay: float,
    ids: list[str],
) -> np.ndarray:
    """(generations, ids): what users would have seen after each generation with the memory of this setting,
    each generation's confusion matrix (``matrices``) and, for the correlated update, its repeats estimated on
    the ``estimate`` ids."""
    memory = Memory.first(classes, ids, answers[0], matrices[0])
    order = memory.find(ids)
    out = [answers[0]]
    for g in range(1, len(answers)):
        repeats = None
        if update == "correlated":
            repeats = Repeats.estimate(truth[estimate], out[-1][estimate], answers[g][estimate])
        memory, _ = memory.update(ids, answers[g], matrices[g], ratio, copy=False, decay=decay, repeats=repeats)
        out.append(memory.shown[order].astype(np.int64))
    return np.array(out)
