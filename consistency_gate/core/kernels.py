"""Compiled row kernels behind :mod:`consistency_gate.core.rows` (numba).

numpy needs a separate pass over a score matrix for every reduction (argmax, each top-k
rank, each sum), and the matrices of a large evaluation do not fit in cache, so the
metrics cost about nine passes. These kernels read each row once:

- :func:`top_k_rows`: the k best column indices of every row, best first. A vectorised
  pass takes the maximum of each chunk of 32 columns; the k-th largest of those maxima
  bounds the row's k-th best score from below, so only the chunks that reach it (about k)
  are searched: their scores that reach it are gathered (without a branch per score) and
  ranked. Chunks are 32 columns wide; 16 for rows under 2k chunks of 32 that hold k chunks of 16
  (100 classes and k = 5: 14% faster than 8 there); 8 for narrower rows, where 16 would leave fewer
  than k chunks and no bound. Ties keep the lower index ahead, as :func:`numpy.argmax` does.
- :func:`pair_indicators`: each row's flips, agreement, CACC-k and CCON-k from the two top-k lists, in
  one pass, each rank search stopping at the first match (numpy would compare all k² pairs of every
  row, and take a pass for each indicator).
- :func:`pair_moments`: the five per-row sums behind Pearson and cosine (sum a, sum b,
  sum a², sum b², sum ab), accumulated in float64 in one scan of both rows.
- :func:`pair_top_k_moments`: both generations' top-k lists and their pair's sums, reading each
  row pair from memory once (what an evaluation of two generations over the same classes uses).

Rows are spread over threads (``prange``; numba's thread count, by default one per core).
Compiled code is cached on disk (``cache=True``), so only the first call on a machine
pays the compilation. Every array they get is read-only (:func:`kernel_input`),
as in the calls :func:`precompile` compiles: a writable one would be another signature to compile.

>>> import numpy as np
>>> top_k_rows(kernel_input([[0.1, 0.4, 0.4, 0.1]], np.float64), 3).tolist()
[[1, 2, 0]]
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from functools import partial

import numba
import numpy as np

from consistency_gate.core.numpy_rows import ABSENT, kernel_input

_CHUNK = 32  # columns per chunk, for rows of at least 2 * k chunks of 32
_MID_CHUNK = 16  # for narrower rows of at least k chunks of 16 (e.g. 100 classes and k = 5)
_SMALL_CHUNK = 8  # for narrower rows still, so that the bound still prunes
_ROWS = 256  # rows per parallel task (buffers are allocated once per task)


@numba.njit(cache=True, nogil=True, inline="always")
def _insert(vals: np.ndarray, idx: np.ndarray, pos: int, v: float, j: int) -> None:  # pragma: no cover - compiled
    # move v (column j) up from slot pos past every strictly smaller score
    while pos > 0 and v > vals[pos - 1]:
        vals[pos] = vals[pos - 1]
        idx[pos] = idx[pos - 1]
        pos -= 1
    vals[pos] = v
    idx[pos] = j


@numba.njit(cache=True, nogil=True, parallel=True)
def top_k_rows(scores: np.ndarray, k: int) -> np.ndarray:  # pragma: no cover - compiled
    """(n, k) int64: each row's k best column indices, best first, lowest index first on ties.

    Needs 1 <= k <= number of columns (checked by :func:`consistency_gate.core.rows.top_k`).

    >>> top_k_rows(kernel_input([[0.1, 0.7, 0.2], [0.4, 0.4, 0.2]], np.float64), 2).tolist()  # the tie: column 0
    [[1, 2], [0, 1]]
    """
    n, p = scores.shape
    out = np.empty((n, k), dtype=np.int64)
    for block in numba.prange((n + _ROWS - 1) // _ROWS):
        work = _selection_buffers(p, k, scores.dtype)
        for i in range(block * _ROWS, min(n, (block + 1) * _ROWS)):
            _select(scores[i], k, work, out[i])
    return out


@numba.njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def pair_top_k_moments(a: np.ndarray, b: np.ndarray, k: int) -> tuple:  # pragma: no cover - compiled
    """:func:`top_k_rows` of two (n, p) matrices and their :func:`pair_moments`, in one pass over
    each row pair (a row pair is read from memory once; its second and third reads hit the cache).

    >>> a, b = kernel_input([[1.0, 2.0]], np.float64), kernel_input([[3.0, 4.0]], np.float64)
    >>> top_a, top_b, moments = pair_top_k_moments(a, b, 1)
    >>> top_a.tolist(), top_b.tolist(), moments.ravel().tolist()
    ([[1]], [[1]], [3.0, 7.0, 5.0, 25.0, 11.0])
    """
    n, p = a.shape
    top_a = np.empty((n, k), dtype=np.int64)
    top_b = np.empty((n, k), dtype=np.int64)
    moments = np.empty((5, n), dtype=np.float64)
    for block in numba.prange((n + _ROWS - 1) // _ROWS):
        work_a = _selection_buffers(p, k, a.dtype)
        work_b = _selection_buffers(p, k, b.dtype)
        for i in range(block * _ROWS, min(n, (block + 1) * _ROWS)):
            _row_moments(a[i], b[i], moments[:, i])
            _select(a[i], k, work_a, top_a[i])
            _select(b[i], k, work_b, top_b[i])
    return top_a, top_b, moments


@numba.njit(cache=True, nogil=True, inline="always")
def _selection_buffers(p: int, k: int, dtype: np.dtype) -> tuple:  # pragma: no cover - compiled
    """The buffers of :func:`_select` for rows of p scores: chunk maxima, the k best so far (values,
    columns), and the scores gathered (values, columns); allocated once per parallel task."""
    chunks = (p + _width(p, k) - 1) // _width(p, k)
    return (
        np.empty(chunks, dtype=dtype),
        np.empty(k, dtype=dtype),
        np.empty(k, dtype=np.int64),
        np.empty(p, dtype=dtype),
        np.empty(p, dtype=np.int64),
    )


@numba.njit(cache=True, nogil=True, inline="always")
def _width(p: int, k: int) -> int:  # pragma: no cover - compiled
    if p >= 2 * k * _CHUNK:
        return _CHUNK
    return _MID_CHUNK if p >= k * _MID_CHUNK else _SMALL_CHUNK


@numba.njit(cache=True, nogil=True, inline="always")
def _select(row: np.ndarray, k: int, work: tuple, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """The k best column indices of one row into ``out`` (see the module docstring)."""
    maxima, vals, idx, found_v, found_j = work
    p, width = row.size, _width(row.size, k)
    chunks = maxima.size
    if width == _CHUNK:  # a constant width per call, so that LLVM vectorises the maxima
        _chunk_maxima(row, maxima, _CHUNK)
    elif width == _MID_CHUNK:
        _chunk_maxima(row, maxima, _MID_CHUNK)
    else:
        _chunk_maxima(row, maxima, _SMALL_CHUNK)
    # k chunks hold a score >= the k-th largest chunk maximum, so the row's k best are all
    # >= it: only chunks whose maximum reaches it can hold them
    bound = -np.inf
    if chunks >= k:
        for c in range(chunks):
            if c < k:
                _insert(vals, idx, c, maxima[c], c)
            elif maxima[c] > vals[k - 1]:
                _insert(vals, idx, k - 1, maxima[c], c)
        bound = vals[k - 1]
    # gather the scores >= bound (in column order) without a branch per score, then rank them
    found = 0
    for c in range(chunks):
        if maxima[c] < bound:
            continue
        for j in range(c * width, min(p, (c + 1) * width)):
            v = row[j]
            found_v[found] = v
            found_j[found] = j
            found += v >= bound
    for m in range(found):
        if m < k:
            _insert(vals, idx, m, found_v[m], found_j[m])
        elif found_v[m] > vals[k - 1]:  # strict: an equal later score never displaces an earlier one
            _insert(vals, idx, k - 1, found_v[m], found_j[m])
    for r in range(k):
        out[r] = idx[r]


@numba.njit(cache=True, nogil=True, inline="always")
def _chunk_maxima(row: np.ndarray, maxima: np.ndarray, width: int) -> None:  # pragma: no cover - compiled
    p = row.size
    for c in range(maxima.size):
        start = c * width
        if start + width <= p:
            block = row[start : start + width]  # a constant-length loop (inlined), which LLVM vectorises
            m = block[0]
            for j in range(1, width):
                m = max(m, block[j])
        else:
            m = row[start]
            for j in range(start + 1, p):
                m = max(m, row[j])
        maxima[c] = m


@numba.njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def pair_moments(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """(5, n) float64: per row sum a, sum b, sum a², sum b², sum ab of two (n, p) matrices.

    >>> pair_moments(kernel_input([[1.0, 2.0]], np.float64), kernel_input([[3.0, 4.0]], np.float64)).ravel().tolist()
    [3.0, 7.0, 5.0, 25.0, 11.0]
    """
    n = a.shape[0]
    out = np.empty((5, n), dtype=np.float64)
    for i in numba.prange(n):
        _row_moments(a[i], b[i], out[:, i])
    return out


@numba.njit(cache=True, nogil=True, inline="always", fastmath={"reassoc", "contract"})
def _row_moments(x: np.ndarray, y: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    sa = sb = qa = qb = ab = 0.0
    for j in range(x.size):
        u = np.float64(x[j])
        v = np.float64(y[j])
        sa += u
        sb += v
        qa += u * u
        qb += v * v
        ab += u * v
    out[0] = sa
    out[1] = sb
    out[2] = qa
    out[3] = qb
    out[4] = ab


@numba.njit(cache=True, nogil=True, parallel=True)
def pearson_rows(
    sum_a: np.ndarray, sum_b: np.ndarray, sq_a: np.ndarray, sq_b: np.ndarray, dot_ab: np.ndarray, width: int, tol: float
) -> np.ndarray:  # pragma: no cover - compiled
    """(n,) float64: Pearson's r of each row pair from its five sums over ``width`` classes, NaN
    where a variance is at most ``tol`` times its sum of squares (the formula of
    :func:`consistency_gate.core.rows.rowwise_pearson`, in one pass instead of a dozen).

    >>> pearson_rows(*[kernel_input([v], np.float64) for v in (6.0, 6.0, 14.0, 14.0, 10.0)], 3, 1e-6).tolist()
    [-1.0]
    """
    n = sum_a.size
    out = np.empty(n, dtype=np.float64)
    for i in numba.prange(n):
        cov = dot_ab[i] - sum_a[i] * sum_b[i] / width
        var_a = sq_a[i] - sum_a[i] * sum_a[i] / width
        var_b = sq_b[i] - sum_b[i] * sum_b[i] / width
        if var_a > tol * sq_a[i] and var_b > tol * sq_b[i]:
            out[i] = min(max(cov / np.sqrt(var_a * var_b), -1.0), 1.0)
        else:
            out[i] = np.nan
    return out


@numba.njit(cache=True, nogil=True, parallel=True)
def cosine_rows(sq_a: np.ndarray, sq_b: np.ndarray, dot_ab: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """(n,) float64: cosine similarity of each row pair from its sums of squares and products;
    NaN where a vector is all zeros.

    >>> cosine_rows(*[kernel_input(v, np.float64) for v in ([1.0, 0.0], [4.0, 1.0], [2.0, 0.0])]).tolist()
    [1.0, nan]
    """
    n = sq_a.size
    out = np.empty(n, dtype=np.float64)
    for i in numba.prange(n):
        denom = np.sqrt(sq_a[i] * sq_b[i])
        out[i] = min(max(dot_ab[i] / denom, -1.0), 1.0) if denom > 0 else np.nan
    return out


@numba.njit(cache=True, nogil=True, parallel=True)
def pair_indicators(
    y_true: np.ndarray, top_a: np.ndarray, top_b: np.ndarray, ks: np.ndarray
) -> np.ndarray:  # pragma: no cover - compiled
    """(7 + 3 len(ks), n) uint8, one pass over the rows of two top lists (best first; a hard label is
    a top list of one): whether A is right and B right (CtoC), A right and B wrong (CtoI), A wrong and
    B right (ItoC), both wrong (ItoI); A right; B right; A and B give the same class; then for each k
    of ``ks``, the true class is among A's first k classes; for each k, among B's; for each k, the
    first min(k, m) classes of A and of B meet (m: the shorter list's length). Each rank search
    stops at the first match.

    >>> y, top_a, top_b, ks = (kernel_input(v, np.int64) for v in ([2], [[0, 2]], [[1, 0]], [1, 2]))
    >>> pair_indicators(y, top_a, top_b, ks)[:, 0].tolist()
    [0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1]
    """
    n = y_true.size
    width_a, width_b, m = top_a.shape[1], top_b.shape[1], ks.size
    shared_width = min(width_a, width_b)
    out = np.empty((7 + 3 * m, n), dtype=np.uint8)
    for i in numba.prange(n):
        y = y_true[i]
        rank_a = ABSENT
        for r in range(width_a):
            if top_a[i, r] == y:
                rank_a = r + 1
                break
        rank_b = ABSENT
        for r in range(width_b):
            if top_b[i, r] == y:
                rank_b = r + 1
                break
        shared = ABSENT
        for r in range(shared_width):  # rank r + 1 meets if a[r] is in b[:r + 1] or b[r] in a[:r + 1]
            found = False
            for s in range(r + 1):
                if top_a[i, r] == top_b[i, s] or top_b[i, r] == top_a[i, s]:
                    found = True
                    break
            if found:
                shared = r + 1
                break
        right_a, right_b = rank_a == 1, rank_b == 1
        out[0, i] = right_a and right_b
        out[1, i] = right_a and not right_b
        out[2, i] = right_b and not right_a
        out[3, i] = not right_a and not right_b
        out[4, i] = right_a
        out[5, i] = right_b
        out[6, i] = top_a[i, 0] == top_b[i, 0]
        for j in range(m):
            out[7 + j, i] = rank_a <= ks[j]
            out[7 + m + j, i] = rank_b <= ks[j]
            out[7 + 2 * m + j, i] = shared <= ks[j]
    return out


def precompile(stop: threading.Event | None = None, names: Collection[str] | None = None) -> None:
    """Compile the kernels for float32 and float64 scores into numba's cache (``NUMBA_CACHE_DIR``),
    so that later processes load them instead of compiling; the Dockerfile runs it while building
    the image. Those an evaluation of two generations calls come first. With ``stop``, it ends after
    the kernel it is compiling once ``stop`` is set; with ``names``, it compiles those kernels only (two
    processes that compile different kernels share the cores, and never write the same cache index).

    >>> precompile()  # compiles the kernels, or loads them from the cache
    """
    for warm_up in _warm_ups():
        if stop is not None and stop.is_set():
            return
        if names is None or warm_up.func.__name__ in names:
            warm_up()


def kernel_names() -> list[str]:
    """The kernels :func:`precompile` compiles, in its order.

    >>> kernel_names()[:2]
    ['pair_top_k_moments', 'pair_indicators']
    """
    return list(dict.fromkeys(warm_up.func.__name__ for warm_up in _warm_ups()))


def _warm_ups() -> list[Callable[[], object]]:
    """One call per kernel and signature, in the order :func:`precompile` compiles them."""
    f32, f64 = kernel_input(np.ones((2, 3)), np.float32), kernel_input(np.ones((2, 3)), np.float64)
    sums, top = kernel_input(np.ones(2), np.float64), kernel_input(np.zeros((2, 2)), np.int64)
    return [
        partial(pair_top_k_moments, f32, f32, 2),
        partial(pair_top_k_moments, f64, f64, 2),
        partial(pair_indicators, kernel_input([0, 0], np.int64), top, top, kernel_input([1], np.int64)),
        partial(pearson_rows, sums, sums, sums, sums, sums, 3, 1e-6),
        partial(cosine_rows, sums, sums, sums),
        *(partial(top_k_rows, scores, 2) for scores in (f32, f64)),
        *(partial(pair_moments, scores, scores) for scores in (f32, f64)),
    ]
