"""Score columns straight into float matrices, and rows aligned by id, with pyarrow.

What ``compare`` and the prediction-file gate spend their time on: reading a file's class columns
(pyarrow, a Parquet row group or CSV block at a time, into one float matrix per chunk, no pandas frame
of 100 columns; the next chunk read in a thread) and putting a file's rows in the labels file's id
order (integer ids by sorting, text ids by a hash look-up; no pandas index), in memory or, for a large
file, through a temporary file (:data:`REORDER_IN_MEMORY`). A CSV whose first rows are in that order
is read in its own order, its ids checked as its scores are parsed (:class:`Alignment`).
Where pyarrow cannot read a file as numbers (a text value among the scores, a CSV it cannot parse),
or ids of different types are to be matched as text, the pandas readers of
:mod:`consistency_gate.io.predictions` take over: they word the error, or read what pyarrow would not.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from consistency_gate.errors import DataError, plain
from consistency_gate.io import predictions as io

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow.parquet as pq

T = TypeVar("T")


@dataclass(frozen=True)
class Alignment:
    """Where the labels' rows are in a prediction file (:func:`row_order` finds it)."""

    positions: np.ndarray | None = None
    """The file row that holds each labels row; None where it is the same row."""
    labels: Path | None = None
    """With ``expected``: the labels file, whose ids align the prediction file where they must."""
    expected: pa.Array | None = None
    """Set for a CSV file taken to be in the labels' order from its first rows (its id column alone
    would cost a full parse): the labels' ids, checked against the file's as its scores are read.
    From the first chunk where they differ, the file is aligned by its ids and read again."""


IN_ORDER = Alignment()


def score_chunks(
    source: io.PredictionSource, chunk_rows: int = io.DEFAULT_CHUNK_ROWS, alignment: Alignment = IN_ORDER
) -> Generator[np.ndarray, None, None]:
    """A score file's class columns, in the order of ``source.classes``, as C-contiguous (rows,
    classes) float matrices of ``chunk_rows`` rows (the last may be shorter), each value checked
    (finite, not negative); in file order, or in the labels' order as ``alignment`` says (with
    ``positions``, row ``positions[i]`` of the file as the i-th row: the file is then read whole).
    Float32 files stay float32. Errors name the file, its 1-based data row and the column. The next
    chunk is read in a thread while this one is used (pyarrow's readers release the GIL); each
    matrix is valid until the next one is read (they share a few buffers: fresh memory costs more
    than the copy).

    >>> import tempfile
    >>> import pandas as pd
    >>> folder = Path(tempfile.mkdtemp())
    >>> pd.DataFrame({"id": ["s1", "s2", "s3"], "cat": [0.9, 0.2, 0.6], "dog": [0.1, 0.8, 0.4]}).to_csv(
    ...     folder / "gen2.csv", index=False)
    >>> source = io.inspect_prediction_file(folder / "gen2.csv", id_column="id")
    >>> [m.tolist() for m in score_chunks(source, chunk_rows=2)]
    [[[0.9, 0.1], [0.2, 0.8]], [[0.6, 0.4]]]
    >>> [m.tolist() for m in score_chunks(source, alignment=Alignment(np.array([2, 0, 1])))]
    [[[0.6, 0.4], [0.9, 0.1], [0.2, 0.8]]]
    """
    assert source.classes is not None
    return _one_ahead(_aligned(source, chunk_rows, alignment))


def _aligned(source: io.PredictionSource, chunk_rows: int, alignment: Alignment) -> Iterator[np.ndarray]:
    if alignment.expected is not None:
        return _checked(source, chunk_rows, alignment)
    if alignment.positions is None:
        return _in_order(source, chunk_rows)
    return _reordered(source, chunk_rows, alignment.positions)


def _one_ahead(chunks: Iterator[T]) -> Generator[T, None, None]:
    """``chunks``, each produced in a thread while the one before is used, and no further ahead:
    the thread starts on the chunk after next only once this one has been taken (so a producer that
    reuses its buffers needs two, as :class:`_Buffer` does). An error in the thread is raised here,
    where the chunk it was reading is asked for."""
    ready: queue.Queue = queue.Queue(maxsize=1)
    taken = threading.Semaphore(0)
    stop = threading.Event()

    def handed(item: tuple[str, object]) -> bool:
        """Put ``item`` and wait until the reader takes it (False: the reader stopped)."""
        ready.put(item)
        while not taken.acquire(timeout=0.1):
            if stop.is_set():
                return False
        return True

    def produce() -> None:
        try:
            for chunk in chunks:
                if not handed(("chunk", chunk)):
                    return
            handed(("end", None))
        except BaseException as exc:  # noqa: BLE001 - handed to the reader, which raises it
            handed(("error", exc))

    thread = threading.Thread(target=produce, name="consistency-gate-reader", daemon=True)
    thread.start()
    try:
        while True:
            kind, item = ready.get()
            taken.release()
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield item
    finally:  # a reader that stops early ends the thread, after the chunk it is reading
        stop.set()
        thread.join()


def _in_order(source: io.PredictionSource, chunk_rows: int) -> Iterator[np.ndarray]:
    start = 0
    try:
        for matrix, _ in _file_order(source, chunk_rows):
            yield matrix
            start += len(matrix)
    except pa.ArrowException:  # a value pyarrow cannot read as a number: go on with pandas, which words it
        for frame in io.iter_frames(source.path, source.columns, chunk_rows):
            if frame.index[0] >= start:
                yield io.score_matrix(frame, source)


def _file_order(
    source: io.PredictionSource, chunk_rows: int, with_ids: bool = False
) -> Iterator[tuple[np.ndarray, pa.ChunkedArray | None]]:
    """Each chunk's checked score matrix, and with ``with_ids`` (CSV only) its ids as text;
    ArrowInvalid where pyarrow cannot read a value as a number."""
    buffer: _Buffer | None = None
    start = 0
    for table in _tables(source, chunk_rows, source.id_column if with_ids else None):
        buffer = buffer or _Buffer(table, source.classes, chunk_rows)
        matrix = buffer.rows(table)
        ids = table.column(source.id_column) if with_ids else None
        del table  # its row group is freed before the next is read
        io.check_scores(matrix, source, start)
        yield matrix, ids
        start += len(matrix)


def _checked(source: io.PredictionSource, chunk_rows: int, alignment: Alignment) -> Iterator[np.ndarray]:
    """The file in its own order while its ids are ``alignment.expected``, chunk by chunk; from the
    first chunk where they are not (or that pyarrow cannot read), the file aligned by its ids (a
    DataError where they are not the labels' reordered), read again, the chunks given skipped."""
    assert alignment.expected is not None and alignment.labels is not None and source.id_column is not None
    given = 0
    with contextlib.suppress(pa.ArrowException):  # pyarrow cannot read a value: the aligned reader words it
        for matrix, ids in _file_order(source, chunk_rows, with_ids=True):
            if not ids.equals(pa.chunked_array([alignment.expected.slice(given, chunk_rows)])):  # a short end too
                break
            yield matrix
            given += len(matrix)
        else:
            if given == len(alignment.expected):
                return
    positions = _file_positions(alignment.labels, alignment.expected, source.path, source.id_column)
    yield from itertools.islice(_aligned(source, chunk_rows, Alignment(positions)), given // chunk_rows, None)


_UNBUFFERED = "clip"
"""``np.take``'s mode for row numbers known to be in range: with ``out``, the default ("raise") gathers
into a temporary first (3.5x the time at 50,000 x 100)."""

REORDER_IN_MEMORY = 256 * 2**20
"""Bytes of scores a file read out of the labels' order may hold in memory. A larger file is put in
order through a temporary file of its scores' size (in :func:`tempfile.gettempdir`, ``TMPDIR``)."""


def _reordered(source: io.PredictionSource, chunk_rows: int, positions: np.ndarray) -> Iterator[np.ndarray]:
    """The file's rows in the order of ``positions``, in memory of at most
    :data:`REORDER_IN_MEMORY` plus a few chunks, whatever the number of rows."""
    with contextlib.ExitStack() as cleanup:
        try:
            tables = _tables(source, chunk_rows)
            if _is_csv(source.path):  # a CSV block parses on one core: the next one while this one is placed
                tables = _one_ahead(tables)
            first = next(tables)
            buffer = _Buffer(first, source.classes, chunk_rows)
            tables = itertools.chain([first], tables)
            del first
            if len(positions) * len(source.classes) * buffer.dtype.itemsize <= REORDER_IN_MEMORY:
                placed: _InMemory | _OnDisk = _InMemory(tables, buffer, len(positions))
            else:
                import tempfile

                spill = cleanup.enter_context(tempfile.TemporaryFile(prefix="consistency-gate-reorder-"))
                placed = _OnDisk(tables, buffer, positions, chunk_rows, spill)
        except pa.ArrowException:  # a value pyarrow cannot read as a number: pandas reads it, or says why
            import pandas as pd

            whole = io.score_matrix(pd.concat(io.iter_frames(source.path, source.columns, chunk_rows)), source)
            yield from (whole[rows] for _, rows in position_chunks(positions, chunk_rows))
            return
        for i, (_, rows) in enumerate(position_chunks(positions, chunk_rows)):
            matrix = placed.chunk(i, rows)
            io.check_scores(matrix, source, rows)
            yield matrix


class _InMemory:
    """A whole file's scores as one (rows, classes) matrix (its scores' size in memory); each chunk
    is gathered from it row by row."""

    def __init__(self, tables: Iterator[pa.Table], buffer: _Buffer, rows: int) -> None:
        self.buffer = buffer
        self.rows = np.empty((rows, len(buffer.classes)), dtype=buffer.dtype)
        at = 0
        for table in tables:
            buffer.rows(table, out=self.rows[at : at + table.num_rows])
            at += table.num_rows

    def chunk(self, index: int, rows: np.ndarray) -> np.ndarray:
        """File rows ``rows`` (those of output chunk ``index``) as a (rows, classes) matrix."""
        return np.take(self.rows, rows, axis=0, out=self.buffer.next_rows(len(rows)), mode=_UNBUFFERED)


class _OnDisk:
    """A file's rows sorted by the output chunk they belong to, through a temporary file (a bucket
    sort on disk): each chunk of the file as read is split by output chunk and appended to the file
    a segment at a time; an output chunk then reads its segments back, which hold its rows in file
    order, and puts them in its own. Memory: a few chunks, and 10 bytes per row of positions."""

    def __init__(
        self, tables: Iterator[pa.Table], buffer: _Buffer, positions: np.ndarray, chunk_rows: int, file: BinaryIO
    ) -> None:
        self.buffer = buffer
        count = -(-len(positions) // chunk_rows)
        destination = np.empty(len(positions), dtype=np.min_scalar_type(count))  # file row -> output chunk
        destination[positions] = np.arange(len(positions)) // chunk_rows
        self.segments: list[list[tuple[int, int]]] = [[] for _ in range(count)]  # (offset, rows) per output chunk
        self.scratch = np.empty((chunk_rows, len(buffer.classes)), dtype=buffer.dtype)
        self.file = file
        at = 0
        for table in tables:
            rows = buffer.rows(table)
            chunks = destination[at : at + len(rows)]
            order = np.argsort(chunks, kind="stable")
            grouped = np.take(rows, order, axis=0, out=self.scratch[: len(rows)], mode=_UNBUFFERED)
            bounds = np.searchsorted(chunks[order], np.arange(count + 1))
            for index in np.flatnonzero(np.diff(bounds)):
                start, end = bounds[index], bounds[index + 1]
                self.segments[index].append((self.file.tell(), end - start))
                self.file.write(grouped[start:end])
            at += len(rows)
            del table  # pyarrow's allocator keeps what its decoding threads freed unless told: 745 -> 665 MB
            pa.default_memory_pool().release_unused()  # at 1,000,000 shuffled rows, for about 5% of the time

    def chunk(self, index: int, rows: np.ndarray) -> np.ndarray:
        """File rows ``rows`` (those of output chunk ``index``) as a (rows, classes) matrix."""
        in_file_order = self.scratch[: len(rows)]
        at = 0
        for offset, count in self.segments[index]:
            self.file.seek(offset)
            self.file.readinto(memoryview(in_file_order[at : at + count]).cast("B"))
            at += count
        matrix = self.buffer.next_rows(len(rows))
        matrix[np.argsort(rows)] = in_file_order  # the i-th smallest file row goes where it is asked for
        return matrix


def position_chunks(positions: np.ndarray, chunk_rows: int) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, positions[start : start + chunk_rows])`` for each chunk of a reordering: the file
    rows that make chunk rows ``start`` onwards of a file read out of order.

    >>> [(start, rows.tolist()) for start, rows in position_chunks(np.array([2, 0, 1]), 2)]
    [(0, [2, 0]), (2, [1])]
    """
    for start in range(0, len(positions), chunk_rows):
        yield start, positions[start : start + chunk_rows]


_PIECE_BYTES = 2**20
"""Scores made row-major at a time by :meth:`_Buffer.rows`: small enough for the cache."""


class _Buffer:
    """Matrices reused chunk after chunk: a chunk's rows, in turn in two matrices (one being used,
    one being filled: see :func:`_one_ahead`)."""

    def __init__(self, table: pa.Table, classes: tuple[str, ...], rows: int) -> None:
        float32 = all(table.column(name).type == pa.float32() for name in classes)
        self.dtype = np.dtype(np.float32 if float32 else np.float64)
        self.classes = classes
        self.by_rows = [np.empty((rows, len(classes)), dtype=self.dtype) for _ in range(2)]
        self.turn = 0

    def rows(self, table: pa.Table, out: np.ndarray | None = None) -> np.ndarray:
        """The table's class columns as a C-contiguous (rows, classes) matrix (nulls as NaN), in
        ``out`` or the next of the matrices used in turn. pyarrow makes the rows row-major
        :data:`_PIECE_BYTES` at a time (a CSV block at 100 classes; a Parquet row group in pieces):
        in the cache, 1.5x faster than a column-by-column copy and a transpose of the chunk for CSV,
        as fast for Parquet (3x slower than that for a whole 50,000-row Parquet batch)."""
        matrix = self.next_rows(table.num_rows) if out is None else out
        step = max(1, _PIECE_BYTES // (len(self.classes) * self.dtype.itemsize))
        at = 0
        for batch in table.select(list(self.classes)).to_batches():
            for start in range(0, batch.num_rows, step):
                piece = batch.slice(start, step)
                matrix[at : at + piece.num_rows] = np.asarray(piece.to_tensor(null_to_nan=True, row_major=True))
                at += piece.num_rows
        return matrix

    def next_rows(self, n: int) -> np.ndarray:
        """The next of the (rows, classes) matrices used in turn, ``n`` rows of it."""
        self.turn = (self.turn + 1) % len(self.by_rows)
        return self.by_rows[self.turn][:n]


def _is_csv(path: Path) -> bool:
    return not path.is_dir() and io.file_format(path) == "csv"


def _numeric(schema: pa.Schema, classes: tuple[str, ...]) -> bool:
    """Whether every class column of a Parquet schema holds numbers (not text, not booleans)."""
    types = [schema.field(name).type for name in classes]
    return all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in types)


def _parquet_schema(path: Path) -> pa.Schema:
    if path.is_dir():
        import pyarrow.dataset as ds

        return ds.dataset(path, format="parquet").schema
    import pyarrow.parquet as pq

    return pq.read_schema(path)


def _tables(source: io.PredictionSource, chunk_rows: int, id_column: str | None = None) -> Iterator[pa.Table]:
    """The class columns (and a CSV's ``id_column``, as text) in tables of exactly ``chunk_rows``
    rows (the last may be shorter), read a row group (Parquet) or a block (CSV) at a time;
    ArrowInvalid where a value is not a number."""
    classes = list(source.classes)
    if _is_csv(source.path):
        import pyarrow.csv as pacsv

        batches = pacsv.open_csv(source.path, convert_options=io.csv_options(source.classes, id_column))
    else:
        if not _numeric(_parquet_schema(source.path), source.classes):
            raise pa.ArrowInvalid("a class column is not numeric")
        if source.path.is_dir():
            import pyarrow.dataset as ds

            batches = ds.dataset(source.path, format="parquet").to_batches(columns=classes, batch_size=chunk_rows)
        else:
            import pyarrow.parquet as pq

            batches = _row_groups(pq.ParquetFile(source.path, pre_buffer=False), classes)
    # Each row group (or CSV block) is freed before the next is read: no reference to one is held
    # past the chunks cut from it (the peak memory does not grow with the number of row groups).
    held: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        held.append(batch)
        count += batch.num_rows
        del batch
        while count >= chunk_rows:
            table = pa.Table.from_batches(held)
            chunk, held, count = table.slice(0, chunk_rows), table.slice(chunk_rows).to_batches(), count - chunk_rows
            del table
            yield chunk
            del chunk
    if count:
        yield pa.Table.from_batches(held)


def _row_groups(parquet: pq.ParquetFile, classes: list[str]) -> Iterator[pa.RecordBatch]:
    """A Parquet file's class columns a row group at a time (pyarrow decodes a whole one for any
    batch of it), its columns in parallel."""
    for i in range(parquet.num_row_groups):
        yield from parquet.read_row_group(i, columns=classes).to_batches()


def row_order(labels: Path, sources: list[io.PredictionSource], id_column: str) -> list[Alignment]:
    """For each prediction file, where the labels file's rows are in it, by id. The ids must be
    unique and the same set in every file (DataError naming the file and the first id that is not).
    A CSV score file whose first rows hold the labels' first ids is taken to be in order, its ids
    checked as its scores are read (:attr:`Alignment.expected`): its id column is not parsed twice.

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
        if source.has_scores and _starts_in_order(source.path, reference, id_column):
            order.append(Alignment(labels=labels, expected=reference))
        else:
            order.append(Alignment(_file_positions(labels, reference, source.path, id_column)))
    return order


def _file_positions(labels: Path, reference: pa.Array, path: Path, id_column: str) -> np.ndarray | None:
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


def _starts_in_order(path: Path, reference: pa.Array, id_column: str) -> bool:
    """Whether a CSV file's first block of rows (about 1 MB) holds the first of the text ids
    ``reference``, in order."""
    if not (_is_csv(path) and pa.types.is_string(reference.type)):
        return False
    import pyarrow.csv as pacsv

    try:
        first = pacsv.open_csv(path, convert_options=io.csv_options((), id_column)).read_next_batch()
    except (pa.ArrowException, OSError, StopIteration):  # not UTF-8, ragged, empty...: the full pass says why
        return False
    ids = first.column(0)
    return len(ids) > 0 and ids.equals(reference.slice(0, len(ids)))


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
    ids = io.csv_text_column(path, column) if _is_csv(path) else _parquet_column(path, column)
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
