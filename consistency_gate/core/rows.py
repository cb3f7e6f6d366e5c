"""Per-sample building blocks of the metrics: predicted classes, top-k lists, flip indicators,
ranks, and the per-row sums behind Pearson and cosine. Each returns one value per sample (row);
:class:`~consistency_gate.core.counts.ConsistencyCounts` adds them up.

Tie rule: whenever scores tie, the lowest class index wins (the evaluation lays columns out in the
canonical class order first, so that is the class whose label sorts first). ``argmax`` therefore
behaves exactly like :func:`numpy.argmax`, and the top-k set of a row is the k classes that come
first when the row is sorted by score descending and then by class index ascending. This makes
the top-k sets nested (TopK is a subset of Top(K+1)), so CCON-k never decreases in k.
"""

from __future__ import annotations

import atexit
import importlib
import threading
from collections.abc import Callable, Sequence
from types import ModuleType

import numpy as np

from consistency_gate.core import numpy_rows
from consistency_gate.core.numpy_rows import kernel_input


def _kernels() -> ModuleType:
    """:mod:`consistency_gate.core.kernels`, imported at first use: it imports numba (0.15 s), which
    a command then imports in :func:`load_kernels_in_background`'s thread, not before its readers start."""
    return importlib.import_module("consistency_gate.core.kernels")


_LOADED = threading.Event()  # set once a load_kernels_in_background thread has loaded every kernel
_CHOSEN = threading.local()  # .kernels: what an evaluation of files on this thread chose (load_kernels_in_background)


def _engine(seconds: float) -> ModuleType:
    """Where a batch numpy would answer in ``seconds`` (:func:`numpy_seconds`) is answered: numpy under
    :data:`NUMPY_BATCH_SECONDS` (no numba loaded), the compiled kernels beyond, and for every batch once
    :func:`load_kernels_in_background` has loaded them (a large evaluation's small batches, such as its top lists, then
    cost what the kernels cost). While an evaluation of files runs, every batch on its thread goes where the size of
    its files chose (:func:`load_kernels_in_background`).

    >>> _engine(NUMPY_BATCH_SECONDS).__name__  # numpy under, unless this process has loaded the kernels
    'consistency_gate.core.kernels'
    """
    chosen = getattr(_CHOSEN, "kernels", None)
    if chosen is not None:
        return _kernels() if chosen else numpy_rows
    return _kernels() if seconds >= NUMPY_BATCH_SECONDS or _LOADED.is_set() else numpy_rows


NUMPY_SECONDS = 0.5
"""An evaluation of prediction files whose pairs numpy answers in less than this (:func:`numpy_seconds` of the largest
file, times the pairs of generations) is answered by numpy, chunk after chunk, and loads no numba (0.6-0.8 s of CPU
to load; the kernels then take 3 ns a score on every core). ``compare`` of ``benchmarks/compare_vs_pandas.py``'s
Parquet files, 100 classes, k = 1 and 5, numpy against the kernels (alternating fresh processes, medians): 200,000
rows (0.30 s here) 0.97 s against 1.24 s in id order, 1.05 s against 1.23 s shuffled; 300,000 rows (0.46 s) 1.32 s
against 1.63 s in id order; 400,000 rows (0.61 s) 1.45-1.54 s against 1.53-1.59 s in id order, 1.53-1.76 s against
1.55-1.68 s shuffled: even."""

NUMPY_BATCH_SECONDS = 0.25
"""A batch in memory numpy answers in less than this is answered by numpy (unless the kernels are loaded): half of
:data:`NUMPY_SECONDS`, as a gate may evaluate a few (its repairs, its diagnosis). About 160,000 rows at 100 classes
and k = 5, 1.2 million rows of a binary model (four million scores before: 40,000 and 2 million rows)."""


def numpy_seconds(rows: int, classes: int | None, k: int) -> float:
    """What numpy's row kernels take for the pair of a file of ``rows`` rows of ``classes`` scores (a file of hard
    labels: one column) at top-``k``: about 200 ns a row, 130 ns more for each k past the first (a pass of
    ``argmax``), and 3 + k ns a score. Measured on 200,000 rows (ns a row): 2 classes 176 at k = 1, 324 at k = 2;
    10 classes 195 and 906 (k = 5); 100 classes 504 and 1,614.

    >>> round(numpy_seconds(100_000, 100, 5), 3), round(numpy_seconds(1_000_000, 2, 1), 3)
    (0.152, 0.208)
    """
    k = min(k, classes or 1)
    return rows * (200 + 130 * (k - 1) + (classes or 1) * (3 + k)) * 1e-9


KERNEL_THREAD = "consistency-gate-kernels"
"""The name of :func:`load_kernels_in_background`'s thread."""


def load_kernels_in_background(seconds: float | None = None) -> Callable[..., None]:
    """Import the kernels and load them (:func:`consistency_gate.core.kernels.precompile`) in a
    thread: numba's start-up in a fresh process (its import, about 0.3 s for its compiler, then each
    kernel from the cache) then overlaps the reading of the files, whose pyarrow readers release the
    GIL. Every batch on the calling thread then goes to the kernels, until the function returned is
    called: a kernel called before they are loaded waits for the import, or for numba's lock. That
    function ends the loading after the kernel it is compiling (so that an error on a machine whose cache
    is cold does not wait for every kernel). It waits for that kernel unless told ``wait=False`` (an
    error on its way out: its message need not wait for numba's compiler, up to 13 s on 2 cores); the
    interpreter's exit then waits for it (:func:`wait_for_kernels`), as a thread still in LLVM's C++
    at exit would abort the process, unless the process ends at once (:func:`still_compiling`).
    With ``seconds`` (what the largest prediction file costs numpy, :func:`numpy_seconds`) under
    :data:`NUMPY_SECONDS`, every batch on the calling thread is answered by numpy until the function returned
    is called, and nothing is loaded.

    >>> finish = load_kernels_in_background()
    >>> finish()
    """
    _CHOSEN.kernels = seconds is None or seconds >= NUMPY_SECONDS
    if not _CHOSEN.kernels:

        def finish_small(wait: bool = True) -> None:
            _CHOSEN.kernels = None

        return finish_small
    stop = threading.Event()
    thread = threading.Thread(target=_load, args=(stop,), name=KERNEL_THREAD, daemon=True)
    thread.start()

    def finish(wait: bool = True) -> None:
        _CHOSEN.kernels = None
        stop.set()
        if wait:
            thread.join()

    return finish


def _load(stop: threading.Event) -> None:
    _kernels().precompile(stop)
    if not stop.is_set():
        _LOADED.set()


def still_compiling() -> bool:
    """Whether a :func:`load_kernels_in_background` thread has not ended yet (it was left by
    ``finish(wait=False)``). A command that is about to exit may then end its process at once
    (:func:`os._exit`, after flushing its output) instead of waiting for numba's compiler.

    >>> wait_for_kernels()  # any left by an earlier error in this process
    >>> still_compiling()
    False
    """
    return any(thread.name == KERNEL_THREAD and thread.is_alive() for thread in threading.enumerate())


@atexit.register
def wait_for_kernels() -> None:
    """Wait for every :func:`load_kernels_in_background` thread (run at the interpreter's exit, before
    it stops daemon threads: one stopped in LLVM's C++ aborts the process)."""
    for thread in threading.enumerate():
        if thread.name == KERNEL_THREAD:
            thread.join()


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
    _require_k(k, scores.shape[1])
    return _engine(numpy_seconds(*scores.shape, k) / 2).top_k_rows(scores, k)


def pair_top_k(a: np.ndarray, b: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
    """:func:`top_k` of two score matrices of one shape and their :func:`row_moments`, in one
    compiled pass over each row pair (:func:`consistency_gate.core.kernels.pair_top_k_moments`).

    >>> top_a, top_b, moments = pair_top_k(np.array([[0.1, 0.9]]), np.array([[0.8, 0.2]]), 1)
    >>> top_a.tolist(), top_b.tolist(), [round(float(m[0]), 2) for m in moments]
    ([[1]], [[0]], [1.0, 1.0, 0.82, 0.68, 0.26])
    """
    a, b = _float_matrix(a), _float_matrix(b)
    if a.shape != b.shape:
        raise ValueError(f"score matrices differ in shape: {a.shape} and {b.shape}")
    if a.dtype != b.dtype:  # one of the two precompiled signatures (float32 to float64 is exact)
        a, b = a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)
    _require_k(k, a.shape[1])
    top_a, top_b, moments = _engine(numpy_seconds(*a.shape, k)).pair_top_k_moments(a, b, k)
    return top_a, top_b, tuple(moments)


def _require_k(k: int, p: int) -> None:
    if not 1 <= k <= p:
        raise ValueError(f"k must be between 1 and the number of classes ({p}), got {k}")


def _float_matrix(scores: np.ndarray) -> np.ndarray:
    """A C-contiguous (n, p) float matrix: float32 and float64 kept, anything else as float64."""
    scores = np.asarray(scores)
    if scores.ndim != 2:
        raise ValueError(f"expected an (n, p) score matrix, got shape {scores.shape}")
    return kernel_input(scores, scores.dtype if scores.dtype in (np.float32, np.float64) else np.float64)


def _int_matrix(top: np.ndarray) -> np.ndarray:
    """A C-contiguous (n, k) int64 matrix of class indices."""
    top = kernel_input(top, np.int64)
    if top.ndim != 2:
        raise ValueError(f"expected an (n, k) matrix of class indices, got shape {top.shape}")
    return top


INDICATORS = ("ctoc", "ctoi", "itoc", "itoi", "correct_previous", "correct_candidate", "agree")
"""The rows of :func:`pair_indicators` before its per-k rows."""


def pair_indicators(y_true: np.ndarray, top_a: np.ndarray, top_b: np.ndarray, ks: Sequence[int]) -> np.ndarray:
    """Per-sample booleans of two learners' top lists, one row each, in one compiled pass.

    ``top_a`` and ``top_b`` are (n, k) class indices, best first (hard labels: lists of one). The
    rows are :data:`INDICATORS` (CtoC, CtoI, ItoC, ItoI: A right or wrong, then B; A right; B right;
    the same class), then for each k of ``ks`` (in increasing order) the true class is among A's first
    k classes (CACC-k), then for each k among B's, then for each k the first min(k, m) classes of A
    and of B share one (CCON-k; m is the shorter list's length).

    >>> table = pair_indicators(np.array([0, 1]), np.array([[0], [0]]), np.array([[1], [1]]), ks=[1])
    >>> table[:4].tolist()  # CtoC, CtoI, ItoC, ItoI
    [[False, False], [True, False], [False, True], [False, False]]
    """
    top_a, top_b = _int_matrix(top_a), _int_matrix(top_b)
    y_true = kernel_input(y_true, np.int64)
    if not y_true.shape == top_a.shape[:1] == top_b.shape[:1]:
        raise ValueError(
            f"expected one true class per row of the top lists, got {y_true.shape}, {top_a.shape}, {top_b.shape}"
        )
    if min(top_a.shape[1], top_b.shape[1]) < 1:
        raise ValueError("a top list needs at least one class")
    ks = kernel_input(sorted(set(ks)), np.int64)
    return _engine(numpy_seconds(y_true.size, 1, 1)).pair_indicators(y_true, top_a, top_b, ks).view(bool)


def row_moments(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per-row float64 (sum a, sum b, sum a², sum b², sum ab) of two (n, p) score matrices,
    in one compiled pass; a row's values do not depend on the batch it came in.

    >>> [v.tolist() for v in row_moments(np.array([[1.0, 2.0]]), np.array([[3.0, 4.0]]))]
    [[3.0], [7.0], [5.0], [25.0], [11.0]]
    """
    a, b = _float_matrix(a), _float_matrix(b)
    if a.shape != b.shape:
        raise ValueError(f"score matrices differ in shape: {a.shape} and {b.shape}")
    return tuple(_engine(numpy_seconds(*a.shape, 1)).pair_moments(a, b))


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

    >>> sums = row_moments(np.array([[1.0, 2.0, 3.0]]), np.array([[3.0, 2.0, 1.0]]))
    >>> rowwise_pearson(*sums, 3).tolist()
    [-1.0]
    """
    sums = [kernel_input(v, np.float64) for v in (sum_a, sum_b, sq_a, sq_b, dot_ab)]
    return _engine(numpy_seconds(sums[0].size, 1, 1)).pearson_rows(*sums, int(width), float(rel_tol * width))


def rounding_tolerance(*arrays: np.ndarray) -> float:
    """Relative tolerance for sums of the arrays' dtypes: 8 machine epsilons of the coarsest.

    >>> bool(rounding_tolerance(np.zeros(1, np.float32)) > rounding_tolerance(np.zeros(1, np.float64)))
    True
    """
    return 8 * max(np.finfo(x.dtype).eps if x.dtype.kind == "f" else np.finfo(np.float64).eps for x in arrays)


def rowwise_cosine(sq_a: np.ndarray, sq_b: np.ndarray, dot_ab: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row pair; NaN where a vector is all zeros.

    >>> rowwise_cosine(np.array([1.0, 0.0]), np.array([4.0, 1.0]), np.array([2.0, 0.0])).tolist()
    [1.0, nan]
    """
    sums = [kernel_input(v, np.float64) for v in (sq_a, sq_b, dot_ab)]
    return _engine(numpy_seconds(sums[0].size, 1, 1)).cosine_rows(*sums)
