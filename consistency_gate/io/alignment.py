"""Rows aligned by id across files, with pyarrow: where each of the labels file's rows is in a prediction
file (:func:`row_order`), integer ids by sorting, text ids by a hash look-up, no pandas index; ids that
differ, repeat or are missing are named with the file and the row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from consistency_gate.errors import DataError, plain
from consistency_gate.io import predictions as io

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Alignment:
    """Where the labels' rows are in a prediction file (:func:`row_order` finds it)."""

    positions: np.ndarray | None = None
    """The file row that holds each labels row; None where it is the same row."""
    labels: Path | None = None
    """With ``expected``: the labels file, whose ids align the prediction file where they must."""
    expected: pa.Array | None = None
    """Set for a CSV score file (its id column alone would cost a full parse): the labels' ids, checked
    against the file's as its scores are read. From the first chunk where they differ, the file's
    rows are placed by their ids (:class:`_Ids`) as they are parsed."""


IN_ORDER = Alignment()


def is_csv(path: Path) -> bool:
    """Whether a prediction file is CSV (a Parquet file or folder is not)."""
    return not path.is_dir() and io.file_format(path) == "csv"


def row_order(labels: Path, sources: list[io.PredictionSource], id_column: str) -> list[Alignment]:
    """For each prediction file, where the labels file's rows are in it, by id. The ids must be
    unique and the same set in every file (DataError naming the file and the first id that is not).
    A CSV score file (against text ids) is aligned as its scores are read (:attr:`Alignment.expected`):
    its id column is not parsed twice.

    >>> import tempfile
    >>> import pandas as pd
    >>> folder = Path(tempfile.mkdtemp())
    >>> pd.DataFrame({"id": [7, 8, 9], "label": ["a", "b", "a"]}).to_parquet(folder / "labels.parquet")
    >>> pd.DataFrame({"id": [9, 7, 8], "a": [0.1, 0.9, 0.2], "b": [0.9, 0.1, 0.8]}).to_parquet(folder / "g.parquet")
    >>> pd.DataFrame({"id": [7, 8, 9], "a": [0.1, 0.9, 0.2], "b": [0.9, 0.1, 0.8]}).to_parquet(folder / "h.parquet")
    >>> files = [io.inspect_prediction_file(folder / f, "id") for f in ("g.parquet", "h.parquet")]
    >>> [a.positions for a in row_order(folder / "labels.parquet", files, "id")]
    [array([1, 2, 0]), None]
    """
    reference = _ids(labels, id_column)
    _require_unique(reference, labels, id_column)
    order: list[Alignment] = []
    for source in sources:
        if source.has_scores and is_csv(source.path) and pa.types.is_string(reference.type):
            order.append(Alignment(labels=labels, expected=reference))
        else:
            order.append(Alignment(file_positions(labels, reference, source.path, id_column)))
    return order


def file_positions(labels: Path, reference: pa.Array, path: Path, id_column: str) -> np.ndarray | None:
    """The row of ``path`` that holds each id of ``reference`` (the labels' ids); None where they
    are in that order; DataError where the ids are not ``reference`` reordered."""
    ids = _ids(path, id_column)
    if not _comparable(ids.type, reference.type):  # e.g. integers and text: matched as text
        reference, ids = _text_ids(labels, id_column), _text_ids(path, id_column)
    if ids.equals(reference):
        return None
    rows = _positions(reference, ids)
    if rows is None:
        _mismatch(reference, ids, labels, path, id_column)
    return rows


def _positions(reference: pa.Array, ids: pa.Array) -> np.ndarray | None:
    """The row of ``ids`` that holds each id of ``reference`` (unique, no nulls), where ``ids``
    holds the same ids, each once; None where it does not. Integer ids are matched by sorting
    (a few vectors of 8 bytes a row), text by a hash look-up.

    >>> _positions(pa.array([7, 8, 9]), pa.array([9, 7, 8])).tolist(), _positions(pa.array([7, 8]), pa.array([7, 7]))
    ([1, 2, 0], None)
    >>> _positions(pa.array(["b", "a"]), pa.array(["a", "b"])).tolist()
    [1, 0]
    """
    if len(ids) != len(reference) or ids.null_count:
        return None
    if pa.types.is_integer(ids.type):
        wanted, values = reference.to_numpy(), ids.to_numpy()
        rows = np.argsort(values, kind="stable")  # the rows of ids in increasing id order
        if _increasing(wanted):
            return rows if np.array_equal(values[rows], wanted) else None
        by_reference = np.argsort(wanted, kind="stable")  # the reference in increasing id order
        if not np.array_equal(values[rows], wanted[by_reference]):
            return None
        in_reference_order = np.empty_like(rows)
        in_reference_order[by_reference] = rows
        return in_reference_order
    positions = pc.index_in(reference, value_set=ids)
    if positions.null_count:
        return None
    rows = positions.to_numpy()
    return rows if np.bincount(rows, minlength=len(rows)).max() == 1 else None  # each row once: no id repeated


def _mismatch(reference: pa.Array, ids: pa.Array, labels: Path, path: Path, id_column: str) -> None:
    """DataError naming the first id that keeps ``ids`` from being ``reference`` reordered: a
    repeated id, an id missing from ``path``, or one that is not in ``labels``."""
    _require_unique(ids, path, id_column)
    missing = pc.invert(pc.is_in(reference, value_set=ids))
    if pc.any(missing).as_py():
        first = str(reference[int(pc.index(missing, True).as_py())].as_py())  # ids are text, as pandas reads them
        raise DataError(
            f"{path}: id {plain(first)} of {labels} is missing "
            f"({pc.sum(missing).as_py()} ids in all); every file needs the same ids"
        )
    extra = pc.invert(pc.is_in(ids, value_set=reference))
    first = str(ids[int(pc.index(extra, True).as_py())].as_py())
    raise DataError(
        f"{path}: id {plain(first)} is not in {labels} "
        f"({len(ids) - len(reference)} such ids); every file needs the same ids"
    )


def _increasing(values: np.ndarray) -> bool:
    return bool(np.all(values[1:] > values[:-1]))


def _comparable(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether ids of these types match as they are: integers with integers, text with text."""
    return _id_kind(a) is not None and _id_kind(a) == _id_kind(b)


def _id_kind(t: pa.DataType) -> str | None:
    if pa.types.is_integer(t):
        return "integer"
    return "text" if pa.types.is_string(t) else None


def _ids(path: Path, column: str) -> pa.Array:
    """A file's id column: integers or text as stored (CSV: text), anything else as the pandas
    reader's text."""
    ids = io.csv_text_column(path, column) if is_csv(path) else _parquet_column(path, column)
    if ids is None or _id_kind(ids.type) is None:  # unreadable, or floats, dates...: the pandas reader's text
        return _text_ids(path, column)
    return ids


def _require_unique(ids: pa.Array, path: Path, column: str) -> None:
    """DataError naming the row of the first empty id, or an id that appears twice."""
    if ids.null_count == 0 and pa.types.is_integer(ids.type) and _increasing(ids.to_numpy()):
        return  # ids in increasing order, as most are: no hash table of a million ids
    if ids.null_count or len(pc.unique(ids)) != len(ids):  # (count_distinct's hash table is larger)
        io.unique_ids(io.read_column(path, column), path, column)  # raises, naming the row or the id


def _text_ids(path: Path, column: str) -> pa.Array:
    values: pd.Series = io.unique_ids(io.read_column(path, column), path, column)
    return pa.array(values, type=pa.string(), from_pandas=True)


def _parquet_column(path: Path, column: str) -> pa.Array:
    if path.is_dir():
        import pyarrow.dataset as ds

        table = ds.dataset(path, format="parquet").to_table(columns=[column])
    else:
        import pyarrow.parquet as pq

        table = pq.ParquetFile(path, pre_buffer=False).read(columns=[column])  # pre_buffer reads 3x the column
    ids = table.column(0).combine_chunks()
    if pa.types.is_dictionary(ids.type):
        ids = ids.dictionary_decode()
    if pa.types.is_large_string(ids.type):
        ids = ids.cast(pa.string())
    return ids
