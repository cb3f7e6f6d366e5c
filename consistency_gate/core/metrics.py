"""The consistency metrics as functions over arrays of one set of n samples (Wang et al. 2023, Sec. 6 and
Appendix H; BTC/BEC from Bansal et al. 2019).

Each function counts its samples with :class:`~consistency_gate.core.counts.ConsistencyCounts`
and reads one value of its ``compute()``: the functional form and the mergeable form are one
implementation (as torchmetrics' functional and modular metrics share one update/compute), so a
metric is defined once. Labels may be any values (class ids or names); score matrices hold one
column per class in the same order for both learners. Ties: see :mod:`consistency_gate.core.rows`.

>>> import numpy as np
>>> y = np.array([0, 1, 1, 2])
>>> a = np.array([0, 1, 2, 2])          # previous generation
>>> b = np.array([0, 2, 1, 2])          # candidate
>>> accuracy(y, a), consistency(a, b), correct_consistency(y, a, b)
(0.75, 0.5, 0.5)
>>> flip_rates(y, a, b)
{'ctoc': 0.5, 'ctoi': 0.25, 'itoc': 0.25, 'itoi': 0.0}
"""

from __future__ import annotations

import numpy as np

from consistency_gate.core.counts import ConsistencyCounts, Outputs
from consistency_gate.core.names import FLIP_NAMES


def _label_values(y_true: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray) -> dict[str, float | None]:
    """compute() of the counts of two learners' hard predictions (labels of any kind)."""
    labels = [np.asarray(v).ravel() for v in (y_true, pred_a, pred_b)]
    if not labels[0].size == labels[1].size == labels[2].size:
        raise ValueError(f"arrays differ in length: {[v.size for v in labels]}")
    _, ids = np.unique(np.concatenate(labels), return_inverse=True)
    y, a, b = np.split(ids.astype(np.int64), 3)
    values, _ = ConsistencyCounts().update(y, Outputs.from_labels(a), Outputs.from_labels(b)).compute()
    return values


def _score_values(
    y_true: np.ndarray | None, scores_a: np.ndarray, scores_b: np.ndarray, k: int = 1
) -> dict[str, float | None]:
    """compute() of the counts of two (n, p) score matrices (true class ids, or none)."""
    a, b = np.asarray(scores_a), np.asarray(scores_b)
    if a.ndim != 2 or a.shape != b.shape:
        raise ValueError(f"expected two (n, p) score matrices of one shape, got {a.shape} and {b.shape}")
    columns = np.arange(a.shape[1])
    y = np.zeros(a.shape[0], dtype=np.int64) if y_true is None else np.asarray(y_true, dtype=np.int64)
    counts = ConsistencyCounts(ks=(k,)).update(y, *Outputs.pair_from_scores(a, b, columns, k))
    return counts.compute()[0]


def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """ACC: share of samples whose predicted class is the true class.

    >>> accuracy(np.array([0, 1, 1]), np.array([0, 1, 0]))
    0.6666666666666666
    """
    return _label_values(y_true, y_pred, y_pred)["acc_previous"]


def consistency(pred_a: np.ndarray, pred_b: np.ndarray) -> float:
    """CON: share of samples on which the two learners predict the same class.

    >>> consistency(np.array(['a', 'b']), np.array(['a', 'a']))
    0.5
    """
    return _label_values(pred_a, pred_a, pred_b)["con"]


def correct_consistency(y_true: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray) -> float:
    """ACC-CON: share of samples both learners get right (equals CtoC).

    >>> correct_consistency(np.array([0, 1]), np.array([0, 1]), np.array([0, 0]))
    0.5
    """
    return _label_values(y_true, pred_a, pred_b)["acc_con"]


def flip_rates(y_true: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray) -> dict[str, float]:
    """The four flip rates; CtoI is the literature's negative flip rate.

    >>> flip_rates(np.array([0, 1]), np.array([0, 0]), np.array([1, 1]))
    {'ctoc': 0.0, 'ctoi': 0.5, 'itoc': 0.5, 'itoi': 0.0}
    """
    values = _label_values(y_true, pred_a, pred_b)
    return {name: values[name] for name in FLIP_NAMES}


def com(y_true: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray) -> float:
    """Com = CtoC + ItoC - CtoI.

    >>> com(np.array([0, 1, 1]), np.array([0, 0, 1]), np.array([0, 1, 0]))  # (1 + 1 - 1) / 3
    0.3333333333333333
    """
    return _label_values(y_true, pred_a, pred_b)["com"]


def backward_trust_compatibility(y_true: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray) -> float | None:
    """BTC = CtoC / ACC_A: share of A's correct answers that B keeps. None if A is never right.

    >>> backward_trust_compatibility(np.array([0, 1, 1]), np.array([0, 1, 0]), np.array([0, 0, 0]))
    0.5
    >>> backward_trust_compatibility(np.array([0]), np.array([1]), np.array([0])) is None
    True
    """
    return _label_values(y_true, pred_a, pred_b)["btc"]


def backward_error_compatibility(y_true: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray) -> float | None:
    """BEC = ItoI / (1 - ACC_B): share of B's errors that A made too. None if B is never wrong.

    >>> backward_error_compatibility(np.array([0, 1, 1]), np.array([0, 0, 0]), np.array([0, 0, 1]))
    1.0
    """
    return _label_values(y_true, pred_a, pred_b)["bec"]


def relative_negative_flip_rate(y_true: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray) -> float | None:
    """rel_nfr = CtoI / (ACC_A x (1 - ACC_B)) (Yan et al. 2021): the negative flips over the share two
    independent models of these accuracies would give; 1 means B's errors fall on A's right answers as
    by chance, below 1 that B errs where A did. None if A is never right or B never wrong.

    >>> y = np.array([0, 1, 1, 0])
    >>> relative_negative_flip_rate(y, np.array([0, 1, 1, 1]), np.array([0, 0, 1, 1]))  # 0.25 / (0.75 x 0.5)
    0.6666666666666666
    >>> relative_negative_flip_rate(y, y, y) is None
    True
    """
    return _label_values(y_true, pred_a, pred_b)["rel_nfr"]


def topk_consistency(scores_a: np.ndarray, scores_b: np.ndarray, k: int) -> float:
    """CCON-k: share of samples whose top-k class sets overlap. CCON-1 equals CON.

    >>> topk_consistency(np.array([[0.6, 0.3, 0.1]]), np.array([[0.2, 0.7, 0.1]]), 2)
    1.0
    """
    return _score_values(None, scores_a, scores_b, k)[f"ccon@{k}"]


def topk_accuracy(y_true: np.ndarray, scores: np.ndarray, k: int) -> float:
    """CACC-k: share of samples whose true class (a column index) is among the top k.

    >>> scores = np.array([[0.5, 0.1, 0.4]])
    >>> topk_accuracy(np.array([2]), scores, 1), topk_accuracy(np.array([2]), scores, 2)
    (0.0, 1.0)
    """
    return _score_values(y_true, scores, scores, k)[f"cacc_previous@{k}"]


def pearson(scores_a: np.ndarray, scores_b: np.ndarray) -> float | None:
    """Mean over samples of the Pearson correlation of the two score vectors.

    Samples where a vector is constant are left out of the mean (None if all are).

    >>> round(pearson(np.array([[0.1, 0.2, 0.7]]), np.array([[0.2, 0.4, 1.4]])), 6)
    1.0
    """
    return _score_values(None, scores_a, scores_b)["pearson"]


def cosine(scores_a: np.ndarray, scores_b: np.ndarray) -> float | None:
    """Mean over samples of the cosine similarity of the two score vectors (None if every
    sample has an all-zero vector).

    >>> round(cosine(np.array([[1.0, 0.0]]), np.array([[1.0, 1.0]])), 6)
    0.707107
    """
    return _score_values(None, scores_a, scores_b)["cosine"]
