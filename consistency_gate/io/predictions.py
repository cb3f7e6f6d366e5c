"""Reading label and prediction files (CSV or Parquet) in chunks, with precise errors.

A prediction file holds one row per evaluation sample and either one
numeric column per class, headed by the class label, or one column ``prediction`` with
hard labels. An optional id column aligns rows across files. Labels are compared as
strings, so a header ``3`` and a label value ``3`` name the same class.

Files are never loaded whole: :func:`iter_frames` yields chunks of a fixed row count.
"""

from __future__ import annotations

import codecs
import csv
import difflib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from consistency_gate.errors import DataError, plain
from consistency_gate.io.tensors import read_npz
from consistency_gate.io.text import as_text

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.csv as pacsv

HARD_LABEL_COLUMN = "prediction"
_PANDAS_INDEX = re.compile(r"__index_level_\d+__")
DEFAULT_CHUNK_ROWS = 50_000
CHUNK_BYTES = 16 * 2**20
"""Bytes of one chunk of a score file's scores as float64, at most (:func:`chunk_rows_for`)."""


def chunk_rows_for(classes: int) -> int:
    """Rows per chunk for score files of ``classes`` columns: as many as fit :data:`CHUNK_BYTES` as
    float64, rounded down to one significant digit, from 1,000 to :data:`DEFAULT_CHUNK_ROWS`. Each
    reader holds a few chunks; fresh memory costs more than the per-chunk work of smaller chunks
    (400,000 CSV rows of 100 classes: 0.97x the time and 0.70x the peak memory of chunks of 50,000
    rows), and 1,000 classes would make a chunk of 50,000 rows 400 MB. A round number divides the
    Parquet row groups of most writers: a chunk across two row groups holds both (chunks of 20,971
    rows over row groups of 100,000: 642 MB at 1,000,000 rows, 487 MB with 20,000).

    >>> chunk_rows_for(10), chunk_rows_for(100), chunk_rows_for(1000), chunk_rows_for(100_000)
    (50000, 20000, 2000, 1000)
    """
    rows = CHUNK_BYTES // (8 * max(classes, 1))
    rows -= rows % 10 ** (len(str(rows)) - 1)
    return min(DEFAULT_CHUNK_ROWS, max(1_000, rows))


@dataclass(frozen=True)
class PredictionSource:
    """What the header of a prediction file says: hard labels or per-class scores."""

    path: Path
    classes: tuple[str, ...] | None  # score column headers; None for a hard-label file
    id_column: str | None

    @property
    def has_scores(self) -> bool:
        """Whether the file holds class scores (not a ``prediction`` column)."""
        return self.classes is not None

    @property
    def columns(self) -> list[str]:
        """The columns read from the file: the id column (if any), then the classes or ``prediction``."""
        body = list(self.classes) if self.classes is not None else [HARD_LABEL_COLUMN]
        return ([self.id_column] if self.id_column else []) + body


def file_columns(path: str | Path) -> list[str]:
    """Column names of a CSV or Parquet file, read from its header or schema only.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> scores = pd.DataFrame({"id": ["s1", "s2", "s3"], "cat": [0.9, 0.2, 0.6], "dog": [0.1, 0.8, 0.4]})
    >>> scores.to_parquet(folder / "gen2.parquet")
    >>> file_columns(folder / "gen2.parquet")
    ['id', 'cat', 'dog']
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: file not found (in {Path.cwd()}): check the path, or give the file's absolute path")
    if path.is_dir():
        return _directory_columns(path)
    fmt = file_format(path)
    if fmt == "npz":
        raise DataError(
            f"{path}: an .npz archive is evaluation data for a tensor model (x, y, ids); labels and "
            "prediction files are CSV or Parquet"
        )
    try:
        if fmt == "parquet":
            # pandas stores a non-default index as extra columns; they are not data
            columns = [c for c in pq.read_schema(path).names if not _PANDAS_INDEX.fullmatch(c)]
        else:
            columns = _csv_header(path)
    except UnicodeDecodeError:
        raise _not_utf8(path) from None
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: the file is empty; expected a header row and one row per sample") from None
    except (OSError, ValueError, csv.Error, pd.errors.ParserError) as exc:
        what = (
            "not a Parquet file, or a truncated or corrupted one (write it again, e.g. with "
            "DataFrame.to_parquet, or give a CSV)"
            if fmt == "parquet"
            else "not a readable CSV file"
        )
        raise DataError(f"{path}: {what}; the reader said: {exc}") from None
    duplicated = sorted({c for c in columns if columns.count(c) > 1})
    if duplicated:
        raise DataError(
            f"{path}: column '{duplicated[0]}' appears more than once in the header; each class (and each "
            "column) needs exactly one column"
        )
    return columns


def _csv_header(path: Path) -> list[str]:
    """The header row of a CSV file as written (pandas would rename a repeated name to ``name.1``)."""
    with open(path, newline="", encoding="utf-8-sig") as fh:  # -sig: a byte-order mark is not part of a name
        header = next(csv.reader(fh), None)
    if not header:
        raise pd.errors.EmptyDataError("no header")
    return header


def _not_utf8(path: Path) -> DataError:
    """A DataError naming the byte offset of the first byte of ``path`` that is not UTF-8."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as fh:
        while block := fh.read(1 << 16):
            try:
                decoder.decode(block)
            except UnicodeDecodeError as exc:
                offset += exc.start
                return DataError(
                    f"{path}: not UTF-8 text: byte {offset} (0x{block[exc.start]:02x}) cannot be decoded; save the "
                    "file as UTF-8 CSV (or give a Parquet file)"
                )
            offset += len(block)
    return DataError(f"{path}: not UTF-8 text; save the file as UTF-8 CSV (or give a Parquet file)")


def _directory_columns(path: Path) -> list[str]:
    """Columns of a Parquet directory (e.g. written by Spark); every part must have the same schema."""
    parts = sorted(p for p in path.rglob("*.parquet") if not p.name.startswith((".", "_")))
    if not parts:
        raise DataError(f"{path}: a directory without .parquet files; give a CSV or Parquet file or directory")
    first = pq.read_schema(parts[0])
    for part in parts[1:]:
        schema = pq.read_schema(part)
        if not schema.equals(first):
            raise DataError(
                f"{part}: its schema differs from {parts[0].name}'s ({_schema_text(schema)} vs "
                f"{_schema_text(first)}); every part of a Parquet directory needs the same columns"
            )
    return [c for c in first.names if not _PANDAS_INDEX.fullmatch(c)]


def _schema_text(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}:{f.type}" for f in schema)[:200]


def inspect_prediction_file(path: str | Path, id_column: str | None = None) -> PredictionSource:
    """Read a prediction file's header and tell hard labels from score columns.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> scores = pd.DataFrame({"id": ["s1", "s2", "s3"], "cat": [0.9, 0.2, 0.6], "dog": [0.1, 0.8, 0.4]})
    >>> scores.to_parquet(folder / "gen2.parquet")
    >>> source = inspect_prediction_file(folder / "gen2.parquet", id_column="id")
    >>> source.classes, source.has_scores, source.columns
    (('cat', 'dog'), True, ['id', 'cat', 'dog'])
    """
    path = Path(path)
    columns = file_columns(path)
    require_columns(path, columns, [id_column] if id_column else [])
    body = [c for c in columns if c != id_column]
    if HARD_LABEL_COLUMN in body:
        return PredictionSource(path, None, id_column)
    if not body:
        raise DataError(
            f"{path}: no prediction columns; expected one column per class or a '{HARD_LABEL_COLUMN}' column"
        )
    return PredictionSource(path, tuple(str(c) for c in body), id_column)


def require_columns(path: Path, columns: list[str], needed: list[str], flags: Mapping[str, str] | None = None) -> None:
    """Raise DataError naming the first needed column that the file lacks, the file's columns that look
    like it and the others worth reading (:func:`shown_columns`), and the option that names it
    (``flags``: column -> option, e.g. ``{"label": "--label-column"}``).

    >>> require_columns(Path("gen2.csv"), ["id", "cat"], ["id"])  # nothing to say
    >>> columns = [f"p{i}" for i in range(64)] + ["target"]
    >>> require_columns(Path("eval.csv"), columns, ["label"], {"label": "--label-column"})
    Traceback (most recent call last):
    ...
    consistency_gate.errors.DataError: eval.csv: column 'label' not found; the file has: target, p0 ... p63 (65 \
columns); if 'target' holds it, pass --label-column target
    """
    for name in needed:
        if name not in columns:
            flag = (flags or {}).get(name)
            others = [str(c) for c in columns if not _numbered(str(c)) and c not in needed]
            hint = f"; if '{others[0]}' holds it, pass {flag} {others[0]}" if flag and len(others) == 1 else ""
            hint = hint or (f"; name the right one with {flag}" if flag else "")
            raise DataError(f"{path}: column '{name}' not found; the file has: {shown_columns(columns, name)}{hint}")


def column_flags(label_column: str, id_column: str | None) -> dict[str, str]:
    """The options that name the labels file's columns, for :func:`require_columns`' hint.

    >>> column_flags("y", None)
    {'y': '--label-column'}
    """
    return {label_column: "--label-column", **({id_column: "--id-column"} if id_column else {})}


def shown_columns(columns: Sequence[object], wanted: str, most: int = 12) -> str:
    """A file's columns for an error message: those that look like ``wanted`` first, then the named ones,
    and runs of numbered columns (``p0`` ... ``p783``) as their first and last, with the count.

    >>> shown_columns(["p0", "p1", "p2", "id", "Label"], "label")
    'Label, id, p0 ... p2 (5 columns)'
    """
    names = [str(c) for c in columns]
    close = difflib.get_close_matches(wanted, names, n=3, cutoff=0.6) + [
        n for n in names if n.lower() == wanted.lower()
    ]
    first = list(dict.fromkeys(close))
    named = [n for n in names if not _numbered(n) and n not in first]
    numbered = [n for n in names if _numbered(n) and n not in first]
    parts = (first + named)[:most]
    if numbered:
        parts.append(numbered[0] if len(numbered) == 1 else f"{numbered[0]} ... {numbered[-1]}")
    left = len(first + named) - len((first + named)[:most])
    count = f" ({len(names)} columns)" if len(names) > 3 else ""
    return ", ".join(parts) + (f" and {left} more" if left else "") + count


def _numbered(name: str) -> bool:
    """Whether a column name is a prefix and a number (``p17``, ``feature_3``, ``42``)."""
    return bool(re.fullmatch(r"[A-Za-z_]*\d+", name))


def iter_frames(
    path: str | Path, columns: list[str], chunk_rows: int = DEFAULT_CHUNK_ROWS, text_columns: tuple[str, ...] = ()
) -> Iterator[pd.DataFrame]:
    """Yield the given columns of a file in chunks of exactly ``chunk_rows`` rows (the last may be shorter).

    Columns in ``text_columns`` are read as strings. Each frame's index is the 0-based row number.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> scores = pd.DataFrame({"id": ["s1", "s2", "s3"], "cat": [0.9, 0.2, 0.6], "dog": [0.1, 0.8, 0.4]})
    >>> scores.to_parquet(folder / "gen2.parquet")
    >>> [len(f) for f in iter_frames(folder / "gen2.parquet", ["id", "cat"], chunk_rows=2)]
    [2, 1]
    """
    path = Path(path)
    if path.is_dir():
        import pyarrow.dataset as ds

        parts = ds.dataset(path, format="parquet").to_batches(columns=columns, batch_size=chunk_rows)
        batches = (batch.to_pandas() for batch in parts)
    elif file_format(path) == "parquet":
        batches = (
            batch.to_pandas()
            for batch in pq.ParquetFile(path, pre_buffer=False).iter_batches(batch_size=chunk_rows, columns=columns)
        )
    else:
        batches = _csv_batches(path, columns, chunk_rows, text_columns)
    start = 0
    chunks = _rechunk(batches, chunk_rows)
    while True:
        try:
            frame = next(chunks, None)
        except UnicodeDecodeError:
            raise _not_utf8(path) from None
        except (pd.errors.ParserError, csv.Error) as exc:
            raise DataError(f"{path}: cannot be read as CSV near row {start + 1}: {exc}") from None
        if frame is None:
            return
        frame = frame[columns]
        for name in text_columns:
            frame[name] = as_text(frame[name])
        frame.index = pd.RangeIndex(start, start + len(frame))
        start += len(frame)
        yield frame


def _csv_batches(
    path: Path, columns: list[str], chunk_rows: int, text_columns: tuple[str, ...]
) -> Iterator[pd.DataFrame]:
    """pandas' chunked CSV reader, as a generator: its errors, the header's included, come from ``next``.
    Every column is parsed (``columns`` are picked afterwards): with ``usecols`` pandas drops a row's
    fields beyond the header without a word, and a row with more fields than the header is an error."""
    dtypes = dict.fromkeys(text_columns, str)
    for frame in pd.read_csv(path, dtype=dtypes, chunksize=chunk_rows, keep_default_na=True, encoding="utf-8-sig"):
        yield frame[columns]


def read_column(path: str | Path, column: str) -> pd.Series:
    """One whole column as text (used for id columns, which must fit in memory).

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> scores = pd.DataFrame({"id": ["s1", "s2", "s3"], "cat": [0.9, 0.2, 0.6], "dog": [0.1, 0.8, 0.4]})
    >>> scores.to_parquet(folder / "gen2.parquet")
    >>> read_column(folder / "gen2.parquet", "id").tolist()
    ['s1', 's2', 's3']
    """
    if file_format(Path(path)) == "csv" and not Path(path).is_dir():
        fast = csv_text_column(Path(path), column)
        if fast is not None:
            return fast.to_pandas().astype(object).rename(column)
    parts = list(iter_frames(path, [column], text_columns=(column,)))
    return pd.concat(parts)[column] if parts else pd.Series([], dtype=str)


# pandas' default missing-value markers, so that both CSV readers agree on what is empty
CSV_NULLS = [
    "", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>", "N/A", "NA",
    "NULL", "NaN", "None", "n/a", "nan", "null",
]  # fmt: skip


def csv_text_column(path: Path, column: str) -> pa.Array | None:
    """One CSV column as text through pyarrow's multithreaded reader (several times faster than
    pandas' on a wide file); None where pyarrow cannot read it (not UTF-8, a ragged row, no such
    column), so that the pandas reader reports what is wrong, as it words it.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "ids.csv"
    >>> _ = path.write_text("id,score\\n007,0.5\\nNA,0.5\\n")
    >>> csv_text_column(path, "id").to_pylist()
    ['007', None]
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv

    try:
        table = pacsv.read_csv(path, convert_options=csv_options((), column))
    except (pa.ArrowException, OSError, UnicodeDecodeError):
        return None
    return table.column(0).combine_chunks()


def csv_options(classes: Sequence[str], text_column: str | None = None) -> pacsv.ConvertOptions:
    """pyarrow's CSV options for ``classes`` as float64 and ``text_column`` (an id) as text, empty
    where pandas' reader sees a missing value (:data:`CSV_NULLS`): every pyarrow reader of a CSV
    here reads ids alike, so that ids checked as scores are read equal the ids aligned upfront."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    types = dict.fromkeys(classes, pa.float64()) | ({text_column: pa.string()} if text_column else {})
    return pacsv.ConvertOptions(
        include_columns=list(types), column_types=types, null_values=CSV_NULLS, strings_can_be_null=True
    )


def _rechunk(frames: Iterator[pd.DataFrame], rows: int) -> Iterator[pd.DataFrame]:
    buffer: list[pd.DataFrame] = []
    held = 0
    for frame in frames:
        buffer.append(frame)
        held += len(frame)
        while held >= rows:
            joined = pd.concat(buffer, ignore_index=True)
            yield joined.iloc[:rows]
            rest = joined.iloc[rows:]
            buffer, held = [rest], len(rest)
    if held:
        yield pd.concat(buffer, ignore_index=True)


def score_matrix(frame: pd.DataFrame, source: PredictionSource) -> np.ndarray:
    """The chunk's score columns as a float matrix, after checking every value.

    Raises DataError naming the file, column and 1-based data row of the first bad value:
    non-numeric, NaN, infinite or negative.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> scores = pd.DataFrame({"id": ["s1", "s2", "s3"], "cat": [0.9, 0.2, 0.6], "dog": [0.1, 0.8, 0.4]})
    >>> scores.to_parquet(folder / "gen2.parquet")
    >>> source = inspect_prediction_file(folder / "gen2.parquet", id_column="id")
    >>> score_matrix(next(iter_frames(source.path, source.columns)), source).tolist()
    [[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]
    """
    assert source.classes is not None
    block = frame[list(source.classes)]
    for name, col in block.items():
        if not pd.api.types.is_numeric_dtype(col) or pd.api.types.is_bool_dtype(col):
            bad = pd.to_numeric(col, errors="coerce").isna() & col.notna()
            row = int(bad.idxmax()) + 1 if bad.any() else int(frame.index[0]) + 1
            raise DataError(
                f"{source.path}: column '{name}' is not numeric (row {row}: {plain(col.loc[row - 1])}); "
                f"score columns must hold numbers (if '{name}' identifies rows, pass --id-column {name}; "
                "for hard labels use a single 'prediction' column)"
            )
    values = block.to_numpy()
    check_scores(values, source, frame.index.to_numpy())
    return values if values.dtype.kind == "f" else values.astype(np.float64)


def check_scores(matrix: np.ndarray, source: PredictionSource, rows: int | np.ndarray) -> None:
    """DataError at the first score that is NaN, infinite or negative, naming its row in the file
    (``rows``: the file's 0-based row of the matrix's first row, or of each of its rows) and its
    column (``source.classes``). Two reductions when every value is fine.

    >>> source = PredictionSource(Path("gen2.csv"), ("cat", "dog"), None)
    >>> try:
    ...     check_scores(np.array([[0.5, -0.1]]), source, 6)
    ... except DataError as exc:
    ...     print(str(exc).split(";")[0])
    gen2.csv: row 7, column 'dog': value -0.1 is negative
    """
    if matrix.size == 0 or (matrix.min() >= 0 and np.isfinite(matrix.max())):  # NaN fails both
        return
    for bad, what in (
        (~np.isfinite(matrix), "is NaN or infinite; scores must be finite numbers"),
        (matrix < 0, "is negative; scores must be probabilities or non-negative scores"),
    ):
        if bad.any():
            r, c = np.argwhere(bad)[0]
            row = rows + r if isinstance(rows, int) else rows[r]
            raise DataError(
                f"{source.path}: row {int(row) + 1}, column '{source.classes[c]}': value {plain(matrix[r, c])} {what}"
            )


def hard_labels(frame: pd.DataFrame, source: PredictionSource) -> pd.Series:
    """The chunk's hard-label column as text, refusing missing values.

    >>> source = PredictionSource(Path("gen2.csv"), None, None)
    >>> hard_labels(pd.DataFrame({"prediction": ["cat", "dog"]}), source).tolist()
    ['cat', 'dog']
    """
    return labels_present(frame[HARD_LABEL_COLUMN], source.path, "a label")


def labels_present(labels: pd.Series, path: Path, what: str = "a true label") -> pd.Series:
    """``labels`` (a chunk's column, indexed by 0-based row), or DataError naming the first empty row.

    >>> labels_present(pd.Series(["a", None], name="label"), Path("labels.csv"))
    Traceback (most recent call last):
    ...
    consistency_gate.errors.DataError: labels.csv: row 2, column 'label' is empty; every sample needs a true label
    """
    missing = labels.isna()
    if missing.any():
        row = int(labels.index[np.argmax(missing.to_numpy())]) + 1
        raise DataError(f"{path}: row {row}, column '{labels.name}' is empty; every sample needs {what}")
    return labels


def file_format(path: Path) -> str:
    """A file's kind by its suffix: ``csv``, ``parquet`` or ``npz`` (DataError for any other).

    >>> file_format(Path("gen2.PARQUET"))
    'parquet'
    """
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix in (".csv", ".txt"):
        return "csv"
    if suffix == ".npz":
        return "npz"
    raise DataError(f"{path}: unknown file type '{suffix}'; use .csv or .parquet (or .npz for evaluation data)")


def read_evaluation_data(
    path: Path,
    label_column: str,
    id_column: str | None,
    max_rows: int | None = None,
    slices: Sequence[str] = (),
) -> pd.DataFrame:
    """The evaluation set, or its first ``max_rows`` rows; label, id and the ``slices`` columns
    (slicing columns named by a gate config) are read as text.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "eval.csv").write_text("x1,x2,region,label\\n0.5,1.0,eu,cat\\n0.1,0.3,us,dog\\n")
    >>> frame = read_evaluation_data(folder / "eval.csv", "label", None, slices=["region"])
    >>> frame.dtypes.astype(str).to_dict()
    {'x1': 'float64', 'x2': 'float64', 'region': 'object', 'label': 'object'}
    """
    if path.is_file() and file_format(path) == "npz":
        frame = read_npz(path, label_column, id_column)
        return evaluation_frame(frame.head(max_rows) if max_rows else frame, label_column, id_column, slices, path)
    columns = file_columns(path)
    _require_evaluation_columns(path, columns, label_column, id_column, slices)
    text = (label_column,) + ((id_column,) if id_column else ()) + tuple(slices)
    chunks = iter_frames(path, columns, chunk_rows=max_rows or DEFAULT_CHUNK_ROWS, text_columns=text)
    frames = [next(chunks, None)] if max_rows else list(chunks)
    frames = [f for f in frames if f is not None and len(f)]
    if not frames:
        raise DataError(f"{path}: the file has a header but no rows; nothing to evaluate")
    frame = pd.concat(frames)
    if id_column:  # the flip table names samples by id
        unique_ids(frame[id_column], path, id_column)
    return _named(frame, path)


def evaluation_frame(
    frame: pd.DataFrame,
    label_column: str,
    id_column: str | None,
    slices: Sequence[str] = (),
    source: str | Path = "DataFrame",
) -> pd.DataFrame:
    """An evaluation set already in memory, checked and typed as :func:`read_evaluation_data`
    reads a file: label, id and slicing columns present and as text, at least one row, rows
    numbered from 0 (errors name ``source`` and the 1-based row).

    >>> frame = evaluation_frame(pd.DataFrame({"x": [0.5, 0.1], "label": [3, 7]}, index=[10, 11]), "label", None)
    >>> frame["label"].tolist(), frame.index.tolist()
    (['3', '7'], [0, 1])
    """
    _require_evaluation_columns(Path(source), list(frame.columns), label_column, id_column, slices)
    if frame.empty:
        raise DataError(f"{source}: the evaluation data has no rows; nothing to evaluate")
    frame = frame.reset_index(drop=True)
    for name in dict.fromkeys((label_column, *([id_column] if id_column else []), *slices)):
        frame[name] = as_text(frame[name])
    if id_column:  # the flip table names samples by id
        unique_ids(frame[id_column], source, id_column)
    return _named(frame, source)


def unique_ids(ids: pd.Series, source: str | Path, id_column: str) -> pd.Series:
    """``ids`` numbered from 0, or a DataError naming ``source``, the row of an empty id, or an id that
    appears twice (rows align by id, so each must name one sample).

    >>> unique_ids(pd.Series(["a", "b", "a"]), "labels.csv", "id")
    Traceback (most recent call last):
    ...
    consistency_gate.errors.DataError: labels.csv: id 'a' appears more than once in column 'id'; ids must be unique
    """
    if ids.isna().any():
        row = int(np.argmax(ids.isna().to_numpy())) + 1
        raise DataError(f"{source}: row {row}, id column '{id_column}' is empty")
    dup = ids.duplicated()
    if dup.any():
        raise DataError(
            f"{source}: id {plain(ids[dup].iloc[0])} appears more than once in column '{id_column}'; ids must be unique"
        )
    return ids.reset_index(drop=True)


def _require_evaluation_columns(
    path: Path, columns: list[str], label_column: str, id_column: str | None, slices: Sequence[str]
) -> None:
    flags = column_flags(label_column, id_column)
    require_columns(path, columns, [label_column] + ([id_column] if id_column else []), flags)
    missing = [c for c in slices if c not in columns]
    if missing:
        shown = ", ".join(map(str, columns[:12])) + (" ..." if len(columns) > 12 else "")
        raise DataError(
            f"{path}: slicing column '{missing[0]}' not found (the config's slices name it); the file has: "
            f"{shown}; add the column, or take it out of slices"
        )


def _named(frame: pd.DataFrame, path: str | Path) -> pd.DataFrame:
    frame.attrs["source"] = str(path)  # error messages name the file
    return frame
