"""The local engine: streams prediction files through an :class:`~consistency_gate.core.evaluation.Evaluation`.

:func:`compare_files` streams three files (labels, previous, candidate) for ``consistency-gate compare``;
:func:`compare_generations` does the same for G1..GT (Wang et al. 2023's multi-generation report).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from consistency_gate.core.evaluation import ComparisonResult, Evaluation, canonical_classes, usable_ks
from consistency_gate.core.rows import load_kernels_in_background, numpy_seconds
from consistency_gate.core.slices import TRUE_CLASS
from consistency_gate.core.threshold import BinaryDecision
from consistency_gate.errors import DataError
from consistency_gate.io import matrices
from consistency_gate.io import predictions as io
from consistency_gate.io.alignment import IN_ORDER, Alignment, row_order


def resolve_ks(
    ks: Sequence[int] | None,
    sources: Sequence[io.PredictionSource],
    where: str = "--k",
    needed: Sequence[int] | None = None,
) -> tuple[int, ...]:
    """The k values to count over these prediction files, by the rule of
    :func:`~consistency_gate.core.evaluation.usable_ks` (files of hard labels have no class count; ``needed``:
    the k values that must apply, default all of ``ks``).

    >>> scores = io.PredictionSource(Path("g1.csv"), ("a", "b", "c"), None)
    >>> sources = [scores, io.PredictionSource(Path("g2.csv"), None, None)]  # scores, hard labels
    >>> resolve_ks(None, sources), resolve_ks([1, 2], sources)
    ((1,), (1, 2))
    """
    widths = {str(s.path): len(s.classes) for s in sources if s.classes is not None}
    return usable_ks(ks or None, widths, where, needed)


def compare_files(
    labels: str | Path,
    previous: str | Path,
    candidate: str | Path,
    *,
    label_column: str = "label",
    id_column: str | None = None,
    ks: Sequence[int] | None = None,
    chunk_rows: int | None = None,
    confidence: float = 0.95,
    slices: Sequence[str] = (),
) -> ComparisonResult:
    """Stream a labels file and two prediction files through the metrics (``compare``), with
    intervals at ``confidence``, and per value of the ``slices`` columns of the labels file
    (:data:`~consistency_gate.core.slices.TRUE_CLASS`: per true class).

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "labels.csv").write_text("label\\na\\nb\\nb\\n")
    >>> _ = (folder / "previous.csv").write_text("a,b\\n0.9,0.1\\n0.2,0.8\\n0.6,0.4\\n")
    >>> _ = (folder / "candidate.csv").write_text("prediction\\na\\nb\\nb\\n")
    >>> result = compare_files(folder / "labels.csv", folder / "previous.csv", folder / "candidate.csv", ks=[1])
    >>> result.metrics["con"], result.metrics["itoc"], result.metrics["ctoi"]
    (0.6666666666666666, 0.3333333333333333, 0.0)
    """
    evaluation = evaluate_files(
        labels,
        {"previous": previous, "candidate": candidate},
        label_column=label_column,
        id_column=id_column,
        ks=ks,
        chunk_rows=chunk_rows,
        slices=slices,
    )
    return evaluation.result(confidence=confidence)


def compare_generations(
    labels: str | Path,
    generations: dict[str, str | Path],
    *,
    label_column: str = "label",
    id_column: str | None = None,
    ks: Sequence[int] | None = None,
) -> dict:
    """Multi-generation report over prediction files of G1..GT, in the given order.

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "labels.csv").write_text("label\\na\\nb\\n")
    >>> for name, rows in {"g1": "a\\na", "g2": "a\\nb", "g3": "b\\nb"}.items():
    ...     _ = (folder / f"{name}.csv").write_text("prediction\\n" + rows + "\\n")
    >>> files = {g: folder / f"{g}.csv" for g in ("g1", "g2", "g3")}
    >>> report = compare_generations(folder / "labels.csv", files)
    >>> report["consecutive_flips"]["g1->g2"]["itoc"], report["consecutive_flips"]["g2->g3"]["ctoi"]
    (0.5, 0.5)
    """
    if len(generations) < 2:
        raise DataError("a multi-generation report needs at least two generations")
    return evaluate_files(
        labels, generations, label_column=label_column, id_column=id_column, ks=ks
    ).generations_report()


def evaluate_files(
    labels: str | Path,
    generations: dict[str, str | Path],
    *,
    label_column: str = "label",
    id_column: str | None = None,
    ks: Sequence[int] | None = None,
    chunk_rows: int | None = None,
    slices: Sequence[str] = (),
    keep_samples: bool = False,
    ks_from: str = "--k",
    needed_ks: Sequence[int] | None = None,
    decision: BinaryDecision | None = None,
) -> Evaluation:
    """Stream the files through an :class:`Evaluation`; rows align by id or by position; the first
    pair is also counted per value of the ``slices`` columns of the labels file. ``keep_samples``
    keeps each sample's predictions (for a flip table); ``ks_from`` names where ``ks`` came from
    in an error, and ``needed_ks`` those that must apply (default all; a gate's: its rules'); ``decision``
    (its positive class named) answers binary scores at a threshold. Files are read ``chunk_rows`` rows at a
    time (default: as many rows of the widest file as :func:`~consistency_gate.io.predictions.chunk_rows_for`
    gives).

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "labels.csv").write_text("label\\na\\nb\\n")
    >>> _ = (folder / "g1.csv").write_text("prediction\\na\\na\\n")
    >>> _ = (folder / "g2.csv").write_text("prediction\\na\\nb\\n")
    >>> evaluation = evaluate_files(folder / "labels.csv", {"g1": folder / "g1.csv", "g2": folder / "g2.csv"})
    >>> evaluation.result().metrics["itoc"]
    0.5
    """
    finish_loading = _nothing_loaded
    streams: list[matrices.ReadAhead[np.ndarray] | Generator[pd.Series, None, None]] = []
    evaluated = False
    try:
        labels = Path(labels)
        label_cols = io.file_columns(labels)
        data_slices = [c for c in slices if c != TRUE_CLASS]
        flags = io.column_flags(label_column, id_column)
        io.require_columns(labels, label_cols, [label_column] + ([id_column] if id_column else []) + data_slices, flags)
        # score columns read in the canonical class order: no column permutation per chunk
        sources = [_canonical(io.inspect_prediction_file(path, id_column)) for path in generations.values()]
        ks = resolve_ks(ks, sources, ks_from, needed_ks)
        pairs = len(sources) * (len(sources) - 1) // 2  # every pair of generations is counted
        k = max(ks, default=1)
        finish_loading = load_kernels_in_background(
            pairs * max(numpy_seconds(matrices.file_rows(s.path), len(s.classes or ()), k) for s in sources)
        )
        evaluation = Evaluation(
            list(generations),
            [s.classes for s in sources],
            ks=ks,
            slices=tuple(slices),
            keep_samples=keep_samples,
            decision=decision,
        )
        chunk_rows = chunk_rows or io.chunk_rows_for(max(len(s.classes or ()) for s in sources))
        label_fields = [label_column] + data_slices  # the ids were read once, by row_order
        label_frames = io.iter_frames(labels, label_fields, chunk_rows, text_columns=tuple(label_fields))
        order = row_order(labels, sources, id_column) if id_column else [IN_ORDER] * len(sources)
        streams += [_outputs(s, alignment, chunk_rows) for s, alignment in zip(sources, order, strict=True)]
        n = 0
        for chunk in label_frames:
            batch = [_next_chunk(stream, s, labels, len(chunk), n) for stream, s in zip(streams, sources, strict=True)]
            evaluation.add(
                io.labels_present(chunk[label_column], labels),
                batch,
                where=str(labels),
                slices={c: chunk[c] for c in data_slices},
            )
            n += len(chunk)
        for stream, source in zip(streams, sources, strict=True):
            extra = sum(len(f) for f in stream)
            if extra:
                raise DataError(
                    f"row counts differ: {labels} has {n} rows but {source.path} has {n + extra}; "
                    "give files with one row per sample, or align them with --id-column"
                )
        if n == 0:
            raise DataError(f"{labels}: the file has a header but no rows; nothing to evaluate")
        evaluated = True
        return evaluation
    finally:  # the reader threads end before the caller, and maybe the process, does (a thread still in
        for stream in streams:  # pyarrow's C++ at exit aborts the process); numba's loading is waited for
            stream.close()  # unless an error is on its way out (see load_kernels_in_background)
        finish_loading(wait=evaluated)


def _nothing_loaded(wait: bool = True) -> None:
    """What ends the kernels' loading before :func:`load_kernels_in_background` has been called."""


def _canonical(source: io.PredictionSource) -> io.PredictionSource:
    return source if source.classes is None else replace(source, classes=tuple(canonical_classes([source.classes])))


def _outputs(
    source: io.PredictionSource, alignment: Alignment, chunk_rows: int
) -> matrices.ReadAhead[np.ndarray] | Generator[pd.Series, None, None]:
    """A prediction file in chunks, in the labels' id order: score matrices, or hard labels as text."""
    if source.has_scores:
        return matrices.score_chunks(source, chunk_rows, alignment)
    return _hard_labels(source, alignment.positions, chunk_rows)


def _hard_labels(
    source: io.PredictionSource, positions: np.ndarray | None, chunk_rows: int
) -> Generator[pd.Series, None, None]:
    """A hard-label file's predictions in chunks; a file out of the labels' order is read whole."""
    text = ((source.id_column,) if source.id_column else ()) + (io.HARD_LABEL_COLUMN,)
    frames = io.iter_frames(source.path, source.columns, chunk_rows, text_columns=text)
    if positions is None:
        yield from (io.hard_labels(frame, source) for frame in frames)
        return
    whole = io.hard_labels(pd.concat(list(frames)), source)
    for start, rows in matrices.position_chunks(positions, chunk_rows):
        yield whole.iloc[rows].set_axis(pd.RangeIndex(start, start + len(rows)))


def _next_chunk(
    stream: Iterator[np.ndarray | pd.Series], source: io.PredictionSource, labels: Path, rows: int, seen: int
) -> np.ndarray | pd.Series:
    frame = next(stream, None)
    if frame is None or len(frame) < rows:
        have = seen + (0 if frame is None else len(frame))
        raise DataError(
            f"row counts differ: {source.path} has {have} rows but {labels} has more; "
            "give files with one row per sample, or align them with --id-column"
        )
    return frame
