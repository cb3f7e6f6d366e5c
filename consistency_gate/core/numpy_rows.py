"""The row kernels' answers in plain numpy, for small batches (:mod:`consistency_gate.core.rows` picks).

:mod:`consistency_gate.core.kernels` reads each row once and is 4-5x faster than numpy on a large
evaluation, but loading numba costs a fresh process 0.6-0.8 s of CPU (its import, then its compiler's start at the
first kernel). A batch numpy answers in less than :data:`~consistency_gate.core.rows.NUMPY_BATCH_SECONDS` is
answered here instead, and so is every chunk of an evaluation of files it answers in less than
:data:`~consistency_gate.core.rows.NUMPY_SECONDS`, with the same functions, arguments and tie rule: the top lists and
indicators are the kernels' exactly, the per-row sums theirs to rounding (float64; numpy adds in another order). A
gate of a 100-class scikit-learn model on 20,000 rows (2 million scores) took 6.52 s against 6.94 s with the kernels
(median of 6 alternating, 7.3 s of CPU against 7.8 s).

>>> top_k_rows(kernel_input([[0.1, 0.4, 0.4, 0.1]], np.float64), 3).tolist()
[[1, 2, 0]]
"""

from __future__ import annotations

import numpy as np

ABSENT = 2**62  # the rank of a class not in a top list: above every k (as the kernels)


def kernel_input(values: object, dtype: type) -> np.ndarray:
    """``values`` as a C-contiguous, read-only array of ``dtype``, a view where it already is one (no copy).

    Every array a kernel gets is read-only: to numba a read-only array (what pyarrow and pandas hand
    out without a copy) is another type than a writable one, and each mix of the two a kernel met would
    be one more compile (13 s for the longest, on a cold cache); the kernels only read their inputs.

    >>> kernel_input([1, 2], np.int64).flags.writeable
    False
    """
    array = np.ascontiguousarray(values, dtype=dtype)
    view = array.view()
    view.flags.writeable = False
    return view


ARGMAX_K = 8
"""Top lists of at most this many classes are found by k passes of ``argmax`` (each pass 1 ns a score at 100
classes; a partition of the row costs about what 8 passes do): 9 ms for 20,000 rows x 100 classes at k = 5
against 25 ms for a partition and the stable sort of its k, and no slower when rows tie (95 ms then)."""


def top_k_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """(n, k) int64: each row's k best column indices, best first, lowest index first on ties.

    Up to :data:`ARGMAX_K`, k passes of ``argmax`` (the first of equal maxima: the lowest index), each
    chosen column set to minus infinity before the next; a row where a pass finds minus infinity (a
    score that is minus infinity ties the chosen ones) is sorted whole. Beyond, the k largest of each
    row come from a partition (``argpartition``), ordered by a stable sort of their scores after their
    indices; a row where a score outside them ties the k-th, which the partition may have left out in
    favour of a higher index, is sorted whole (a stable sort of its negated scores).

    >>> top_k_rows(kernel_input([[0.1, 0.7, 0.2], [0.4, 0.4, 0.2]], np.float64), 2).tolist()
    [[1, 2], [0, 1]]
    >>> top_k_rows(kernel_input([[0.5, 0.5, 0.5, 0.1]], np.float64), 2).tolist()  # the tie: columns 0 and 1
    [[0, 1]]
    """
    n, p = scores.shape
    if k == p or n == 0:
        return _sorted_rows(scores, k)
    top, whole = _top_by_argmax(scores, k) if k <= ARGMAX_K else _top_by_partition(scores, k)
    if whole.any():
        top[whole] = _sorted_rows(scores[whole], k)
    return top


def _sorted_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """The first k columns of each row sorted by score, best first, lowest index first on ties."""
    return np.argsort(-scores, axis=1, kind="stable").astype(np.int64, copy=False)[:, :k]


def _top_by_argmax(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The top lists by k passes of ``argmax``, and the rows where a pass met minus infinity (the scores are
    copied only where a pass is to follow)."""
    work, rows = scores if k == 1 else np.array(scores), np.arange(scores.shape[0])
    top = np.empty((rows.size, k), dtype=np.int64)
    whole = np.zeros(rows.size, dtype=bool)
    for r in range(k):
        top[:, r] = best = work.argmax(axis=1)
        whole |= np.isneginf(work[rows, best])
        if r + 1 < k:
            work[rows, best] = -np.inf
    return top, whole


def _top_by_partition(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The top lists by a partition, and the rows where a score left out ties the k-th."""
    p = scores.shape[1]
    chosen = np.argpartition(scores, p - k, axis=1)[:, p - k :]
    chosen.sort(axis=1)
    values = np.take_along_axis(scores, chosen, axis=1)
    best_first = np.argsort(-values, axis=1, kind="stable")
    top = np.take_along_axis(chosen, best_first, axis=1).astype(np.int64, copy=False)
    return top, (scores >= values.min(axis=1, keepdims=True)).sum(axis=1) > k


MOMENT_BYTES = 2**20
""":func:`pair_moments` casts its rows to float64 this many bytes of a matrix at a time (2,048 rows at 64 classes,
1,310 at 100), which the sums then read from the cache: 4.7 ms for 20,000 rows x 100 float32 classes against 11 ms
for the whole matrices cast at once."""

NARROW_CLASSES = 16
"""Up to this many classes, :func:`pair_moments` adds a column at a time over every row (a row sum of two scores is
mostly the call's own cost): 50,000 rows x 2 classes 0.25 ms against 2.2 ms, x 10 1.4 ms against 3.2 ms."""


def pair_moments(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(5, n) float64: per row sum a, sum b, sum a², sum b², sum ab of two (n, p) matrices, in float64.

    >>> pair_moments(kernel_input([[1.0, 2.0]], np.float64), kernel_input([[3.0, 4.0]], np.float64)).ravel().tolist()
    [3.0, 7.0, 5.0, 25.0, 11.0]
    """
    n, p = a.shape
    if p <= NARROW_CLASSES:
        out = np.zeros((5, n), dtype=np.float64)
        for column in range(p):
            x, y = a[:, column].astype(np.float64), b[:, column].astype(np.float64)
            for row, value in enumerate((x, y, x * x, y * y, x * y)):
                out[row] += value
        return out
    out = np.empty((5, n), dtype=np.float64)
    step = max(1, MOMENT_BYTES // (8 * p))
    for start in range(0, n, step):
        rows = slice(start, start + step)
        x, y = a[rows].astype(np.float64, copy=False), b[rows].astype(np.float64, copy=False)
        x.sum(axis=1, out=out[0, rows])
        y.sum(axis=1, out=out[1, rows])
        for row, (u, v) in enumerate(((x, x), (y, y), (x, y)), start=2):
            np.einsum("ij,ij->i", u, v, out=out[row, rows])
    return out


def pair_top_k_moments(a: np.ndarray, b: np.ndarray, k: int) -> tuple:
    """:func:`top_k_rows` of two (n, p) matrices and their :func:`pair_moments`.

    >>> a, b = kernel_input([[1.0, 2.0]], np.float64), kernel_input([[3.0, 4.0]], np.float64)
    >>> top_a, top_b, moments = pair_top_k_moments(a, b, 1)
    >>> top_a.tolist(), top_b.tolist(), moments.ravel().tolist()
    ([[1]], [[1]], [3.0, 7.0, 5.0, 25.0, 11.0])
    """
    return top_k_rows(a, k), top_k_rows(b, k), pair_moments(a, b)


def pearson_rows(
    sum_a: np.ndarray, sum_b: np.ndarray, sq_a: np.ndarray, sq_b: np.ndarray, dot_ab: np.ndarray, width: int, tol: float
) -> np.ndarray:
    """(n,) float64: Pearson's r of each row pair from its five sums over ``width`` classes, NaN
    where a variance is at most ``tol`` times its sum of squares.

    >>> pearson_rows(*[kernel_input([v], np.float64) for v in (6.0, 6.0, 14.0, 14.0, 10.0)], 3, 1e-6).tolist()
    [-1.0]
    """
    cov = dot_ab - sum_a * sum_b / width
    var_a, var_b = sq_a - sum_a * sum_a / width, sq_b - sum_b * sum_b / width
    defined = (var_a > tol * sq_a) & (var_b > tol * sq_b)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.clip(cov / np.sqrt(var_a * var_b), -1.0, 1.0)
    return np.where(defined, r, np.nan)


def cosine_rows(sq_a: np.ndarray, sq_b: np.ndarray, dot_ab: np.ndarray) -> np.ndarray:
    """(n,) float64: cosine similarity of each row pair; NaN where a vector is all zeros.

    >>> cosine_rows(*[kernel_input(v, np.float64) for v in ([1.0, 0.0], [4.0, 1.0], [2.0, 0.0])]).tolist()
    [1.0, nan]
    """
    denom = np.sqrt(sq_a * sq_b)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denom > 0, np.clip(dot_ab / denom, -1.0, 1.0), np.nan)


def pair_indicators(y_true: np.ndarray, top_a: np.ndarray, top_b: np.ndarray, ks: np.ndarray) -> np.ndarray:
    """(7 + 3 len(ks), n) uint8: the rows of :func:`consistency_gate.core.kernels.pair_indicators`
    (CtoC, CtoI, ItoC, ItoI, A right, B right, the same class; then CACC-k of A and of B and CCON-k
    for each k of ``ks``).

    >>> y, top_a, top_b, ks = (kernel_input(v, np.int64) for v in ([2], [[0, 2]], [[1, 0]], [1, 2]))
    >>> pair_indicators(y, top_a, top_b, ks)[:, 0].tolist()
    [0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1]
    """
    rank_a, rank_b = _rank(top_a, y_true), _rank(top_b, y_true)
    shared = np.full(y_true.size, ABSENT, dtype=np.int64)
    for r in range(min(top_a.shape[1], top_b.shape[1])):  # rank r + 1 meets: a[r] in b[:r + 1] or b[r] in a[:r + 1]
        meets = (top_a[:, r : r + 1] == top_b[:, : r + 1]).any(axis=1) | (top_b[:, r : r + 1] == top_a[:, : r + 1]).any(
            axis=1
        )
        shared = np.where(meets & (shared == ABSENT), r + 1, shared)
    right_a, right_b = rank_a == 1, rank_b == 1
    rows = [right_a & right_b, right_a & ~right_b, right_b & ~right_a, ~right_a & ~right_b, right_a, right_b]
    rows.append(top_a[:, 0] == top_b[:, 0])
    for rank in (rank_a, rank_b, shared):
        rows += [rank <= k for k in ks]
    return np.stack(rows).astype(np.uint8)


def _rank(top: np.ndarray, y_true: np.ndarray) -> np.ndarray:
    """Each row's 1-based position of its true class in its top list, :data:`ABSENT` where absent."""
    match = top == y_true[:, None]
    return np.where(match.any(axis=1), match.argmax(axis=1) + 1, ABSENT)
