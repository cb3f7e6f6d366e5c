"""A generation's answers and how far to trust them: its answers as class labels or indices, and its confusion
matrix on labelled samples (how often it answers j for true class y). The Bayesian update
(:mod:`~consistency_gate.ensembles.bayes`) and the memory (:mod:`~consistency_gate.ensembles.memory`) multiply
these likelihoods in; the cost ratios are the settings both tune over.

>>> class_indices(answer_labels(pd.DataFrame({"a": [0.7, 0.2], "b": [0.3, 0.8]})), ["a", "b"]).tolist()
[0, 1]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

COST_RATIOS = (1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 100.0)  # 1: the most likely class always (MaxBelief)


def confusion(
    labels: Sequence[object], answers: Sequence[object], classes: Sequence[str], alpha: float = 1.0
) -> np.ndarray:
    """``C[y, j]``: the share of the samples of true class ``y`` answered ``j``, add-``alpha`` smoothed
    (a class never seen still has a likelihood). Labels and answers are compared as text; one outside
    ``classes`` is left out.

    Parameters
    ----------
    labels, answers : the calibration samples' true classes and one generation's answers.
    classes : the class order of the rows and columns.
    alpha : the pseudo-count of every cell.

    Returns
    -------
    (p, p) row-stochastic matrix.

    Examples
    --------
    >>> confusion(["a", "a", "b"], ["a", "b", "b"], ["a", "b"], alpha=0).tolist()
    [[0.5, 0.5], [0.0, 1.0]]
    """
    index = {str(c): i for i, c in enumerate(classes)}
    y = np.array([index.get(str(v), -1) for v in labels], dtype=np.int64)
    j = np.array([index.get(str(v), -1) for v in answers], dtype=np.int64)
    return index_confusion(y, j, len(classes), alpha)


def index_confusion(truth: np.ndarray, answers: np.ndarray, p: int, alpha: float = 1.0) -> np.ndarray:
    """:func:`confusion` of class indices (-1, a class outside the ``p``, left out).

    >>> index_confusion(np.array([0, 0, 1]), np.array([0, 1, -1]), 2).tolist()
    [[0.5, 0.5], [0.5, 0.5]]
    """
    truth, answers = np.asarray(truth), np.asarray(answers)
    keep = (truth >= 0) & (answers >= 0)
    counts = np.full((p, p), float(alpha))
    np.add.at(counts, (truth[keep], answers[keep]), 1.0)
    totals = counts.sum(axis=1, keepdims=True)
    return np.divide(counts, totals, out=np.full_like(counts, 1.0 / p), where=totals > 0)


def class_indices(answers: Sequence[object], classes: Sequence[str]) -> np.ndarray:
    """Answers as indices into ``classes`` (compared as text; -1 outside them).

    >>> class_indices(["b", 3, "z"], ["a", "b", "3"]).tolist()
    [1, 2, -1]
    """
    index = {str(c): i for i, c in enumerate(classes)}
    return np.array([index.get(str(a), -1) for a in answers], dtype=np.int64)


def answer_labels(output: pd.DataFrame | pd.Series, decision: object | None = None) -> list[str]:
    """A model's answers as text: a label-only model's labels, else its highest-scoring class (a binary
    model's at ``decision``, a :class:`~consistency_gate.core.threshold.BinaryDecision`).

    >>> answer_labels(pd.DataFrame({"a": [0.7, 0.2], "b": [0.3, 0.8]}))
    ['a', 'b']
    """
    if isinstance(output, pd.Series):
        return [str(v) for v in output]
    columns = [str(c) for c in output.columns]
    values = output.to_numpy(dtype=np.float64)
    if decision is not None and decision.positive in columns and len(columns) == 2:
        positive = columns.index(decision.positive)
        return [columns[i] for i in decision.answers(values[:, positive], positive, 1 - positive)]
    return [columns[i] for i in values.argmax(axis=1)]
