"""Consistency metrics between two generations of a classifier, as pure numpy functions.

Definitions follow paper 003 (Sec. 6 and Appendix H). Every function
takes arrays for one set of n samples and returns a number or a per-sample array; the
mergeable counts behind them live in :mod:`consistency_gate.core.counts`.

Tie rule: whenever scores tie, the lowest class index wins. ``argmax`` therefore behaves
exactly like :func:`numpy.argmax`, and the top-k set of a row is the k classes that come
first when the row is sorted by score descending and then by class index ascending. This
makes the top-k sets nested (TopK is a subset of Top(K+1)), so CCON-k never decreases in k.

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

from consistency_gate.core import kernels

FLIP_NAMES = ("ctoc", "ctoi", "itoc", "itoi")


def predicted_classes(scores: np.ndarray) -> np.ndarray:
    """Index of the highest score in each row (ties: lowest index, as numpy).

    >>> predicted_classes(np.array([[0.2, 0.8], [0.5, 0.5]])).tolist()
    [1, 0]
    """
    return np.asarray(scores).argmax(axis=1)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """The k best class indices of each row, best first (ties: lowest index first).

    One compiled pass over the matrix (:func:`consistency_gate.core.kernels.top_k_rows`).
    Scores must not be NaN (the prediction readers refuse them).

    >>> top_k(np.array([[0.1, 0.4, 0.4, 0.1]]), 3).tolist()
    [[1, 2, 0]]
    """
    scores = _float_matrix(scores)
    p = scores.shape[1]
    if not 1 <= k <= p:
        raise ValueError(f"k must be between 1 and the number of classes ({p}), got {k}")
    return kernels.top_k_rows(scores, k)


def _float_matrix(scores: np.ndarray) -> np.ndarray:
    """A C-contiguous (n, p) float matrix: float32 and float64 kept, anything else as float64."""
    scores = np.asarray(scores)
    if scores.ndim != 2:
        raise ValueError(f"expected an (n, p) score matrix, got shape {scores.shape}")
    if scores.dtype not in (np.float32, np.float64):
        scores = scores.astype(np.float64)
    return np.ascontiguousarray(scores)


def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """ACC: share of samples whose predicted class is the true class."""
    return float(np.mean(np.asarray(y_true) == np.asarray(y_pred)))


def consistency(pred_a: np.ndarray, pred_b: np.ndarray) -> float:
    """CON: share of samples on which the two learners predict the same class."""
    return float(np.mean(np.asarray(pred_a) == np.asarray(pred_b)))


def correct_consistency(y_true: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray) -> float:
    """ACC-CON: share of samples both learners get right (equals CtoC)."""
    return flip_rates(y_true, pred_a, pred_b)["ctoc"]


def flip_indicators(
    y_true: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-sample booleans (CtoC, CtoI, ItoC, ItoI): A correct/incorrect -> B correct/incorrect."""
    a_ok = np.asarray(pred_a) == np.asarray(y_true)
    b_ok = np.asarray(pred_b) == np.asarray(y_true)
    return a_ok & b_ok, a_ok & ~b_ok, ~a_ok & b_ok, ~a_ok & ~b_ok


def flip_rates(y_true: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray) -> dict[str, float]:
    """The four flip rates; CtoI is the literature's negative flip rate."""
    return {
        name: float(np.mean(ind)) for name, ind in zip(FLIP_NAMES, flip_indicators(y_true, pred_a, pred_b), strict=True)
    }


def com(y_true: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray) -> float:
    """Com = CtoC + ItoC - CtoI."""
    f = flip_rates(y_true, pred_a, pred_b)
    return f["ctoc"] + f["itoc"] - f["ctoi"]


def first_shared_rank(top_a: np.ndarray, top_b: np.ndarray) -> np.ndarray:
    """Smallest k at which the two top-k lists of each row share a class (k_max + 1 if none).

    ``top_a`` and ``top_b`` are (n, k_max) class indices, best first. Then
    ``first_shared_rank(...) <= k`` is the CCON-k indicator for every k <= k_max at once.
    """
    k_max = top_a.shape[1]
    same = top_a[:, :, None] == top_b[:, None, :]
    ranks = np.maximum.outer(np.arange(k_max), np.arange(k_max)) + 1
    return np.where(same, ranks, k_max + 1).min(axis=(1, 2))


def true_class_rank(y_true: np.ndarray, top: np.ndarray) -> np.ndarray:
    """1-based position of the true class in each row's top list (k_max + 1 if absent).

    ``true_class_rank(...) <= k`` is the CACC-k indicator for every k <= k_max.
    """
    k_max = top.shape[1]
    hit = top == np.asarray(y_true)[:, None]
    return np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, k_max + 1)


def topk_consistency(scores_a: np.ndarray, scores_b: np.ndarray, k: int) -> float:
    """CCON-k: share of samples whose top-k class sets overlap. CCON-1 equals CON."""
    return float(np.mean(first_shared_rank(top_k(scores_a, k), top_k(scores_b, k)) <= k))


def topk_accuracy(y_true: np.ndarray, scores: np.ndarray, k: int) -> float:
    """CACC-k: share of samples whose true class is among the top k."""
    return float(np.mean(true_class_rank(y_true, top_k(scores, k)) <= k))


def row_moments(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per-row float64 (sum a, sum b, sum a², sum b², sum ab) of two (n, p) score matrices,
    in one compiled pass; a row's values do not depend on the batch it came in.

    >>> [v.tolist() for v in row_moments(np.array([[1.0, 2.0]]), np.array([[3.0, 4.0]]))]
    [[3.0], [7.0], [5.0], [25.0], [11.0]]
    """
    a, b = _float_matrix(a), _float_matrix(b)
    if a.shape != b.shape:
        raise ValueError(f"score matrices differ in shape: {a.shape} and {b.shape}")
    return tuple(kernels.pair_moments(a, b))


def rowwise_pearson(
    sum_a: np.ndarray,
    sum_b: np.ndarray,
    sq_a: np.ndarray,
    sq_b: np.ndarray,
    dot_ab: np.ndarray,
    width: int,
    rel_tol: float = 1e-6,
) -> np.ndarray:
    """Pearson's r of each row pair from its five sums over ``width`` classes.

    Rows where either vector is constant have no correlation: they come back as NaN. A
    variance below ``rel_tol`` times the sum of squares counts as zero, since the sums carry
    rounding error of that order (the default suits float32 scores).
    """
    cov = dot_ab - sum_a * sum_b / width
    var_a = sq_a - sum_a**2 / width
    var_b = sq_b - sum_b**2 / width
    tol = rel_tol * width
    defined = (var_a > tol * sq_a) & (var_b > tol * sq_b)
    denom = np.sqrt(np.clip(var_a, 0, None) * np.clip(var_b, 0, None))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(defined, cov / denom, np.nan)
    return np.clip(r, -1.0, 1.0)


def rounding_tolerance(*arrays: np.ndarray) -> float:
    """Relative tolerance for sums of the arrays' dtypes: 8 machine epsilons of the coarsest."""
    return 8 * max(np.finfo(x.dtype).eps if x.dtype.kind == "f" else np.finfo(np.float64).eps for x in arrays)


def rowwise_cosine(sq_a: np.ndarray, sq_b: np.ndarray, dot_ab: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row pair; NaN where a vector is all zeros."""
    denom = np.sqrt(sq_a * sq_b)
    with np.errstate(invalid="ignore", divide="ignore"):
        c = np.where(denom > 0, dot_ab / denom, np.nan)
    return np.clip(c, -1.0, 1.0)


def pearson(scores_a: np.ndarray, scores_b: np.ndarray) -> float:
    """Mean over samples of the Pearson correlation of the two score vectors.

    Samples where a vector is constant are left out of the mean (NaN if all are).

    >>> round(pearson(np.array([[0.1, 0.2, 0.7]]), np.array([[0.2, 0.4, 1.4]])), 6)
    1.0
    """
    a, b = np.asarray(scores_a), np.asarray(scores_b)
    r = rowwise_pearson(*row_moments(a, b), a.shape[1], rel_tol=rounding_tolerance(a, b))
    return _nanmean(r)


def cosine(scores_a: np.ndarray, scores_b: np.ndarray) -> float:
    """Mean over samples of the cosine similarity of the two score vectors."""
    _, _, sq_a, sq_b, dot_ab = row_moments(scores_a, scores_b)
    return _nanmean(rowwise_cosine(sq_a, sq_b, dot_ab))


def _nanmean(values: np.ndarray) -> float:
    ok = ~np.isnan(values)
    return float(values[ok].mean()) if ok.any() else float("nan")


def backward_trust_compatibility(y_true: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray) -> float | None:
    """BTC = CtoC / ACC_A: share of A's correct answers that B keeps. None if A is never right."""
    ctoc, ctoi, _, _ = flip_indicators(y_true, pred_a, pred_b)
    kept, a_right = int(ctoc.sum()), int(ctoc.sum() + ctoi.sum())
    return kept / a_right if a_right else None


def backward_error_compatibility(y_true: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray) -> float | None:
    """BEC = ItoI / (1 - ACC_B): share of B's errors that A made too. None if B is never wrong."""
    _, ctoi, _, itoi = flip_indicators(y_true, pred_a, pred_b)
    shared, b_wrong = int(itoi.sum()), int(itoi.sum() + ctoi.sum())
    return shared / b_wrong if b_wrong else None
