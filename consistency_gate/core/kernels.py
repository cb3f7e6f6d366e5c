"""Compiled row kernels behind :mod:`consistency_gate.core.rows` (numba).

numpy needs a separate pass over a score matrix for every reduction (argmax, each top-k
rank, each sum), and the matrices of a large evaluation do not fit in cache, so the
metrics cost about nine passes. These kernels read each row once:

- :func:`top_k_rows`: the k best column indices of every row, best first. A vectorised
  pass takes the maximum of each chunk of 32 columns; the k-th largest of those maxima
  bounds the row's k-th best score from below, so only the chunks that reach it (about k)
  are searched element by element. A row costs little more than its argmax. Ties keep
  the lower index ahead, as :func:`numpy.argmax` does.
- :func:`pair_moments`: the five per-row sums behind Pearson and cosine (sum a, sum b,
  sum a², sum b², sum ab), accumulated in float64 in one scan of both rows.

Rows are spread over threads (``prange``; numba's thread count, by default one per core).
Compiled code is cached on disk (``cache=True``), so only the first call on a machine
pays the compilation.

>>> import numpy as np
>>> top_k_rows(np.array([[0.1, 0.4, 0.4, 0.1]]), 3).tolist()
[[1, 2, 0]]
"""

from __future__ import annotations

import numba
import numpy as np

_CHUNK = 32
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

    >>> top_k_rows(np.array([[0.1, 0.7, 0.2], [0.4, 0.4, 0.2]]), 2).tolist()  # the tie goes to column 0
    [[1, 2], [0, 1]]
    """
    n, p = scores.shape
    chunks = (p + _CHUNK - 1) // _CHUNK
    out = np.empty((n, k), dtype=np.int64)
    for block in numba.prange((n + _ROWS - 1) // _ROWS):
        maxima = np.empty(chunks, dtype=scores.dtype)
        vals = np.empty(k, dtype=scores.dtype)
        idx = np.empty(k, dtype=np.int64)
        for i in range(block * _ROWS, min(n, (block + 1) * _ROWS)):
            row = scores[i]
            _chunk_maxima(row, maxima)
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
            filled = 0
            for c in range(chunks):
                if maxima[c] < bound:
                    continue
                for j in range(c * _CHUNK, min(p, (c + 1) * _CHUNK)):
                    v = row[j]
                    if v < bound:
                        continue
                    if filled < k:
                        _insert(vals, idx, filled, v, j)
                        filled += 1
                    elif v > vals[k - 1]:  # strict: an equal later score never displaces an earlier one
                        _insert(vals, idx, k - 1, v, j)
            for r in range(k):
                out[i, r] = idx[r]
    return out


@numba.njit(cache=True, nogil=True, inline="always")
def _chunk_maxima(row: np.ndarray, maxima: np.ndarray) -> None:  # pragma: no cover - compiled
    p = row.size
    for c in range(maxima.size):
        start = c * _CHUNK
        if start + _CHUNK <= p:
            block = row[start : start + _CHUNK]  # a constant-length loop, which LLVM vectorises
            m = block[0]
            for j in range(1, _CHUNK):
                m = max(m, block[j])
        else:
            m = row[start]
            for j in range(start + 1, p):
                m = max(m, row[j])
        maxima[c] = m


@numba.njit(cache=True, nogil=True, parallel=True, fastmath={"reassoc", "contract"})
def pair_moments(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """(5, n) float64: per row sum a, sum b, sum a², sum b², sum ab of two (n, p) matrices.

    >>> pair_moments(np.array([[1.0, 2.0]]), np.array([[3.0, 4.0]])).ravel().tolist()
    [3.0, 7.0, 5.0, 25.0, 11.0]
    """
    n, p = a.shape
    out = np.empty((5, n), dtype=np.float64)
    for i in numba.prange(n):
        sa = sb = qa = qb = ab = 0.0
        for j in range(p):
            x = np.float64(a[i, j])
            y = np.float64(b[i, j])
            sa += x
            sb += y
            qa += x * x
            qb += y * y
            ab += x * y
        out[0, i] = sa
        out[1, i] = sb
        out[2, i] = qa
        out[3, i] = qb
        out[4, i] = ab
    return out


def precompile() -> None:
    """Compile the kernels for float32 and float64 scores into numba's cache (``NUMBA_CACHE_DIR``),
    so that later processes load them instead of compiling; the Dockerfile runs it while building
    the image.

    >>> precompile()  # compiles the kernels, or loads them from the cache
    """
    for dtype in (np.float32, np.float64):
        scores = np.ones((2, 3), dtype=dtype)
        top_k_rows(scores, 2)
        pair_moments(scores, scores)
