"""Score columns straight into float matrices, and rows aligned by id, with pyarrow.

What ``compare`` and the prediction-file gate spend their time on: reading a file's class columns
(pyarrow, a Parquet row group or CSV block at a time, into one float matrix per chunk, no pandas frame
of 100 columns; the next chunk read in a thread) and putting a file's rows in the labels file's id
order (integer ids by sorting, text ids by a hash look-up; no pandas index), in memory or, for a large
file, through a temporary file (:data:`REORDER_IN_MEMORY`). A CSV file is read in its own order, its
ids checked as its scores are parsed, and from where they are not the labels', its rows are placed by
their ids as they are parsed (:class:`Alignment`): its id column is not parsed in a pass of its own.
Where pyarrow cannot read a file as numbers (a text value among the scores, a CSV it cannot parse),
or ids of different types are to be matched as text, the pandas readers of
:mod:`consistency_gate.io.predictions` take over: they word the error, or read what pyarrow would not.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TypeVar

import numpy as np
import pyarrow as pa

from consistency_gate.core.ids import hash_ids
from consistency_gate.io import predictions as io
from consistency_gate.io.alignment import IN_ORDER, Alignment, file_positions, is_csv

if TYPE_CHECKING:
    import pyarrow.parquet as pq

T = TypeVar("T")


def score_chunks(
    source: io.PredictionSource, chunk_rows: int = io.DEFAULT_CHUNK_ROWS, alignment: Alignment = IN_ORDER
) -> ReadAhead[np.ndarray]:
    """A score file's class columns, in the order of ``source.classes``, as C-contiguous (rows,
    classes) float matrices of ``chunk_rows`` rows (the last may be shorter), each value checked
    (finite, not negative); in file order, or in the labels' order as ``alignment`` says (with
    ``positions``, row ``positions[i]`` of the file as the i-th row; with ``expected``, rows placed by
    id from where they stop being in order: a file out of order is read whole before its first chunk).
    Float32 files stay float32. Errors name the file, its 1-based data row and the column. The next
    chunk is read in a thread, from the start, while this one is used (pyarrow's readers release the
    GIL; :class:`ReadAhead`: close it to end the thread of a reader stopped early); each
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
    return ReadAhead(_aligned(source, chunk_rows, alignment))


def _aligned(source: io.PredictionSource, chunk_rows: int, alignment: Alignment) -> Iterator[np.ndarray]:
    if alignment.expected is not None:
        return _checked(source, chunk_rows, alignment)
    if alignment.positions is None:
        return _in_order(source, chunk_rows)
    return _reordered(source, chunk_rows, alignment.positions)


class ReadAhead(Iterator[T]):
    """``chunks``, each produced in a thread while the one before is used: the thread starts on the
    first at once (so that files are read side by side from the start). With ``depth`` 1 it goes on
    to the chunk after next only once this one has been taken (so a producer that reuses its buffers
    needs two, as :class:`_Turns` has); with a larger ``depth``, for chunks that share no memory, it
    goes on while fewer than ``depth`` chunks wait to be taken. An error in the thread is raised
    here, where the chunk it was reading is asked for. :meth:`close` ends the thread, after the
    chunk it is reading (an iterator dropped unclosed ends it at its next chunk).

    >>> chunks = ReadAhead(iter([1, 2, 3]))
    >>> next(chunks), list(chunks)
    (1, [2, 3])
    """

    def __init__(self, chunks: Iterator[T], depth: int = 1) -> None:
        self.ready: queue.Queue = queue.Queue(maxsize=depth)
        self.taken = threading.Semaphore(0) if depth == 1 else None
        self.stop = threading.Event()
        self.ended = False
        produce = partial(_produce, chunks, self.ready, self.taken, self.stop)  # no reference to self
        self.thread = threading.Thread(target=produce, name="consistency-gate-reader", daemon=True)
        self.thread.start()

    def __next__(self) -> T:
        if self.ended:
            raise StopIteration
        kind, item = self.ready.get()
        if self.taken is not None:
            self.taken.release()
        if kind == "chunk":
            return item
        self.close()
        if kind == "error":
            raise item
        raise StopIteration

    def close(self) -> None:
        """End the thread, after the chunk it is reading, and wait for it."""
        self.ended = True
        self.stop.set()
        self.thread.join()

    def __del__(self) -> None:
        self.stop.set()


def _produce(chunks: Iterator[T], ready: queue.Queue, taken: threading.Semaphore | None, stop: threading.Event) -> None:
    """:class:`ReadAhead`'s thread: each chunk handed over once there is room in ``ready`` and,
    with ``taken``, once the one before was taken."""

    def handed(item: tuple[str, object]) -> bool:
        """Put ``item`` and, with ``taken``, wait until the reader takes it (False: the reader stopped)."""
        while True:
            with contextlib.suppress(queue.Full):
                ready.put(item, timeout=0.1)
                break
            if stop.is_set():
                return False
        while taken is not None and not taken.acquire(timeout=0.1):
            if stop.is_set():
                return False
        return True

    try:
        for chunk in chunks:
            if not handed(("chunk", chunk)):
                return
        handed(("end", None))
    except BaseException as exc:  # noqa: BLE001 - handed to the reader, which raises it
        handed(("error", exc))


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


PARSED_AHEAD = 128 * 2**20
"""Bytes of float64 scores a CSV file may have parsed ahead of their use (:func:`_file_order`)."""


def _file_order(
    source: io.PredictionSource, chunk_rows: int, with_ids: bool = False, ahead: bool = False
) -> Iterator[tuple[np.ndarray, pa.ChunkedArray | None]]:
    """Each chunk's checked score matrix, and with ``with_ids`` (CSV only) its ids as text;
    ArrowInvalid where pyarrow cannot read a value as a number. With ``ahead``, the chunks after
    this one are parsed in a thread while it is made a matrix and used (a CSV block parses on one
    core), up to :data:`PARSED_AHEAD` of them: a file in the labels' order then goes on being parsed
    while one out of order is read whole before its first chunk (400,000 CSV rows, the other
    shuffled: 0.97x the time of one chunk ahead, for 135 MB more)."""
    buffer: _Buffer | None = None
    start = 0
    tables = _tables(source, chunk_rows, source.id_column if with_ids else None)
    depth = max(1, PARSED_AHEAD // (8 * chunk_rows * max(1, len(source.classes or ()))))
    with contextlib.closing(ReadAhead(tables, depth)) if ahead else contextlib.nullcontext(tables) as read:
        for table in read:
            buffer = buffer or _Buffer(table, source.classes, chunk_rows)
            matrix = buffer.rows(table)
            ids = table.column(source.id_column) if with_ids else None
            del table  # its row group is freed before the next is read
            io.check_scores(matrix, source, start)
            yield matrix, ids
            start += len(matrix)


def _checked(source: io.PredictionSource, chunk_rows: int, alignment: Alignment) -> Iterator[np.ndarray]:
    """The file in its own order while its ids are ``alignment.expected``, chunk by chunk; from the
    first chunk where they are not, the rest of the file placed by its ids as it is parsed. Where
    its ids are not the labels' reordered, or pyarrow cannot read a value, the file is aligned by
    its id column (a DataError naming the id) and read again, the chunks given skipped."""
    assert alignment.expected is not None and alignment.labels is not None and source.id_column is not None
    expected, given = alignment.expected, 0
    try:
        with contextlib.closing(_file_order(source, chunk_rows, with_ids=True, ahead=True)) as parsed:
            for matrix, ids in parsed:
                if not ids.equals(pa.chunked_array([expected.slice(given, chunk_rows)])):  # a short end too
                    rest = _by_id(itertools.chain([(matrix, ids)], parsed), expected.slice(given))
                    yield from _placed(rest, len(expected) - given, chunk_rows)
                    return
                yield matrix
                given += len(matrix)
        if given == len(expected):
            return
    except (pa.ArrowException, _Misaligned):  # the aligned reader says why, or the pandas reader reads it
        pass
    positions = file_positions(alignment.labels, expected, source.path, source.id_column)
    yield from itertools.islice(_aligned(source, chunk_rows, Alignment(positions)), given // chunk_rows, None)


class _Misaligned(Exception):
    """A file's ids are not the labels' reordered (the id pass then names the one that is not)."""


class _Ids:
    """Unique text ids, each found by its hash (pandas' ``hash_array``, sorted once): the labels'
    ids, against which a file's are looked up chunk by chunk, exactly (pyarrow's ``index_in``
    builds its hash table on every call: 36 ms for 400,000 ids, for each chunk).

    >>> _Ids(pa.array(["s1", "s2", "s3"])).rows(pa.chunked_array([["s3", "s1"]])).tolist()
    [2, 0]
    >>> _Ids(pa.array(["s1", "s2"])).rows(pa.chunked_array([["s1", "x"]])) is None
    True
    """

    def __init__(self, ids: pa.Array) -> None:
        self.ids = ids
        hashes = hash_ids(ids)
        self.order = np.argsort(hashes)
        self.hashes = hashes[self.order]

    def rows(self, ids: pa.ChunkedArray) -> np.ndarray | None:
        """The row of each of ``ids`` here; None where one is not here (or is empty)."""
        if not len(self.order):
            return None
        found = self.order[np.searchsorted(self.hashes, hash_ids(ids.combine_chunks())).clip(max=len(self.order) - 1)]
        return found if self.ids.take(found).equals(ids.combine_chunks()) else None


def _by_id(
    parsed: Iterator[tuple[np.ndarray, pa.ChunkedArray]], ids: pa.Array
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each chunk of a file, with the row of ``ids`` (the labels' ids not yet given) that each of
    its rows holds; _Misaligned where an id is not one of ``ids``, or not each of them once."""
    lookup, seen, count = _Ids(ids), np.zeros(len(ids), dtype=bool), 0
    for matrix, chunk_ids in parsed:
        rows = lookup.rows(chunk_ids)
        count += len(matrix)
        if rows is None or count > len(ids):
            raise _Misaligned
        seen[rows] = True
        yield matrix, rows
    if count < len(ids) or not seen.all():  # an id repeated: another is missing
        raise _Misaligned


_UNBUFFERED = "clip"
"""``np.take``'s mode for row numbers known to be in range: with ``out``, the default ("raise") gathers
into a temporary first (3.5x the time at 50,000 x 100)."""


REORDER_IN_MEMORY = 256 * 2**20
"""Bytes of scores a file read out of the labels' order may hold in memory. A larger file is put in
order through a temporary file of its scores' size (in :func:`tempfile.gettempdir`, ``TMPDIR``)."""


def _reordered(source: io.PredictionSource, chunk_rows: int, positions: np.ndarray) -> Iterator[np.ndarray]:
    """The file's rows in the order of ``positions``, in memory of at most
    :data:`REORDER_IN_MEMORY` plus a few chunks, whatever the number of rows."""
    targets = np.empty_like(positions)
    targets[positions] = np.arange(len(positions))  # where each file row goes

    def with_targets(parsed: Iterator[tuple[np.ndarray, object]]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        at = 0
        for matrix, _ in parsed:
            yield matrix, targets[at : at + len(matrix)]
            at += len(matrix)

    try:
        parsed = _file_order(source, chunk_rows, ahead=is_csv(source.path))
        yield from _placed(with_targets(parsed), len(positions), chunk_rows)
    except pa.ArrowException:  # a value pyarrow cannot read as a number: pandas reads it, or says why
        import pandas as pd

        whole = io.score_matrix(pd.concat(io.iter_frames(source.path, source.columns, chunk_rows)), source)
        yield from (whole[rows] for _, rows in position_chunks(positions, chunk_rows))


def _placed(pieces: Iterator[tuple[np.ndarray, np.ndarray]], rows: int, chunk_rows: int) -> Iterator[np.ndarray]:
    """``rows`` rows in chunks of ``chunk_rows``, from ``pieces``: matrices of a file's rows, each
    with the row each of its rows is to be (every row once). Every piece is placed before the
    first chunk is given, in memory or, above :data:`REORDER_IN_MEMORY`, through a temporary file."""
    with contextlib.ExitStack() as cleanup:
        placed: _InMemory | _OnDisk | None = None
        for matrix, targets in pieces:
            if placed is None:
                shape = (rows, matrix.shape[1])
                if rows * matrix.shape[1] * matrix.itemsize <= REORDER_IN_MEMORY:
                    placed = _InMemory(shape, matrix.dtype)
                else:
                    import tempfile

                    spill = cleanup.enter_context(tempfile.TemporaryFile(prefix="consistency-gate-reorder-"))
                    placed = _OnDisk(shape, matrix.dtype, chunk_rows, spill)
            placed.add(matrix, targets)
        for start in range(0, rows if placed else 0, chunk_rows):
            yield placed.chunk(start, min(start + chunk_rows, rows))


class _InMemory:
    """A whole file's scores as one (rows, classes) matrix (its scores' size in memory), each row
    put in its place as it is read; a chunk is a slice of it."""

    def __init__(self, shape: tuple[int, int], dtype: np.dtype) -> None:
        self.rows = np.empty(shape, dtype=dtype)

    def add(self, matrix: np.ndarray, targets: np.ndarray) -> None:
        """Put row i of ``matrix`` in row ``targets[i]``."""
        self.rows[targets] = matrix

    def chunk(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start`` to ``stop``."""
        return self.rows[start:stop]


class _OnDisk:
    """A file's rows sorted by the chunk they belong to, through a temporary file (a bucket sort on
    disk): each piece of the file as read is split by chunk and appended to the file a segment at a
    time, with the row each of its rows is to be; a chunk then reads its segments back and puts
    their rows in place. Memory: a few chunks, and 4 bytes per row."""

    def __init__(self, shape: tuple[int, int], dtype: np.dtype, chunk_rows: int, file: BinaryIO) -> None:
        self.chunk_rows = chunk_rows
        count = -(-shape[0] // chunk_rows)
        self.segments: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(count)]  # (offset, rows) per chunk
        self.scratch = np.empty((chunk_rows, shape[1]), dtype=dtype)
        self.out = _Turns(chunk_rows, shape[1], dtype)
        self.file = file

    def add(self, matrix: np.ndarray, targets: np.ndarray) -> None:
        """Append the rows of ``matrix`` (row i to be row ``targets[i]``) to their chunks' segments."""
        chunks = targets // self.chunk_rows
        order = np.argsort(chunks, kind="stable")
        grouped = np.take(matrix, order, axis=0, out=self.scratch[: len(matrix)], mode=_UNBUFFERED)
        within = (targets[order] % self.chunk_rows).astype(np.int32)
        bounds = np.searchsorted(chunks[order], np.arange(len(self.segments) + 1))
        for index in np.flatnonzero(np.diff(bounds)):
            start, end = bounds[index], bounds[index + 1]
            self.segments[index].append((self.file.tell(), within[start:end]))
            self.file.write(grouped[start:end])
        pa.default_memory_pool().release_unused()  # pyarrow's allocator keeps what its decoding threads freed
        # unless told: 745 -> 665 MB at 1,000,000 shuffled rows, for about 5% of the time

    def chunk(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start`` to ``stop`` (a chunk's)."""
        segments = self.segments[start // self.chunk_rows]
        in_file_order = self.scratch[: stop - start]
        at = 0
        for offset, within in segments:
            self.file.seek(offset)
            self.file.readinto(memoryview(in_file_order[at : at + len(within)]).cast("B"))
            at += len(within)
        matrix = self.out.next_rows(stop - start)
        matrix[np.concatenate([within for _, within in segments])] = in_file_order
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


class _Turns:
    """Two matrices reused chunk after chunk, in turn: one being used, one being filled (see
    :class:`ReadAhead`)."""

    def __init__(self, rows: int, columns: int, dtype: np.dtype) -> None:
        self.dtype = np.dtype(dtype)
        self.by_rows = [np.empty((rows, columns), dtype=self.dtype) for _ in range(2)]
        self.turn = 0

    def next_rows(self, n: int) -> np.ndarray:
        """The next of the matrices used in turn, ``n`` rows of it."""
        self.turn = (self.turn + 1) % len(self.by_rows)
        return self.by_rows[self.turn][:n]


class _Buffer(_Turns):
    """A score file's chunks as (rows, classes) matrices, float32 where every class column is."""

    def __init__(self, table: pa.Table, classes: tuple[str, ...], rows: int) -> None:
        float32 = all(table.column(name).type == pa.float32() for name in classes)
        super().__init__(rows, len(classes), np.float32 if float32 else np.float64)
        self.classes = classes

    def rows(self, table: pa.Table) -> np.ndarray:
        """The table's class columns as a C-contiguous (rows, classes) matrix (nulls as NaN), in
        the next of the matrices used in turn. pyarrow makes the rows row-major
        :data:`_PIECE_BYTES` at a time (a CSV block at 100 classes; a Parquet row group in pieces):
        in the cache, 1.5x faster than a column-by-column copy and a transpose of the chunk for CSV,
        as fast for Parquet (3x slower than that for a whole 50,000-row Parquet batch)."""
        matrix = self.next_rows(table.num_rows)
        step = max(1, _PIECE_BYTES // (len(self.classes) * self.dtype.itemsize))
        at = 0
        for batch in table.select(list(self.classes)).to_batches():
            for start in range(0, batch.num_rows, step):
                piece = batch.slice(start, step)
                matrix[at : at + piece.num_rows] = np.asarray(piece.to_tensor(null_to_nan=True, row_major=True))
                at += piece.num_rows
        return matrix


def _numeric(schema: pa.Schema, classes: tuple[str, ...]) -> bool:
    """Whether every class column of a Parquet schema holds numbers (not text, not booleans)."""
    types = [schema.field(name).type for name in classes]
    return all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in types)


def file_rows(path: Path) -> int:
    """A prediction file's rows, for :func:`~consistency_gate.core.rows.numpy_seconds`: a Parquet file's or folder's
    from its metadata, a CSV file's estimated from its first megabyte.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "g1.csv"
    >>> _ = path.write_text("a,b\\n" + "0.25,0.75\\n" * 1000)
    >>> file_rows(path)
    1000
    >>> import pandas as pd
    >>> pd.DataFrame({"a": [0.25] * 3, "b": [0.75] * 3}).to_parquet(path.with_suffix(".parquet"))
    >>> file_rows(path.with_suffix(".parquet"))
    3
    """
    if path.is_dir():
        import pyarrow.dataset as ds

        return ds.dataset(path, format="parquet").count_rows()
    if not is_csv(path):
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    with path.open("rb") as file:
        start = file.read(2**20)
    return max(0, round(start.count(b"\n") * path.stat().st_size / max(1, len(start))) - 1)  # less the header


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
    if is_csv(source.path):
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

            batches = _row_groups(pq.ParquetFile(source.path, pre_buffer=False), classes, chunk_rows)
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


# a row group whose class columns pass this as float64 is read a few columns at a time through a temporary
# file: pyarrow decodes a whole column chunk for any batch of it (iter_batches too, with more held), so the
# peak would grow with the writer's row-group size (DataFrame.to_parquet writes up to 1,048,576 rows in one)
ROW_GROUP_SLICE = 32 * 2**20  # the most of a row group's columns decoded at once, counted as float64


def _row_groups(parquet: pq.ParquetFile, classes: list[str], chunk_rows: int) -> Iterator[pa.RecordBatch]:
    """A Parquet file's class columns a row group at a time (pyarrow decodes a whole one for any
    batch of it), its columns in parallel. A row group of more than one chunk whose class columns would
    decode past :data:`ROW_GROUP_SLICE` as the float64 matrices they become is cut into batches of
    ``chunk_rows`` through a temporary file (:func:`_through_disk`). The budget counts rows and columns,
    not the file's bytes, so the peak holds for any writer's row-group size, score dtype and encoding:
    a float32 group of 400,000 rows x 100 classes (160 MB in the file, held whole for each generation)
    peaked at 813 MB read whole and 437 MB through disk, and took 0.97x the time
    (``benchmarks/compare_memory.py``, ``compare_vs_pandas.py``)."""
    metadata = parquet.metadata
    for i in range(parquet.num_row_groups):
        rows = metadata.row_group(i).num_rows
        if rows > chunk_rows and rows * len(classes) * 8 > ROW_GROUP_SLICE:
            yield from _through_disk(parquet, i, classes, chunk_rows)
        else:
            yield from parquet.read_row_group(i, columns=classes).to_batches()


def _through_disk(parquet: pq.ParquetFile, group: int, classes: list[str], chunk_rows: int) -> Iterator[pa.RecordBatch]:
    """Row group ``group`` of ``parquet`` in batches of ``chunk_rows`` rows, with at most a few columns
    of it decoded at once: the columns are read in slices that fit :data:`ROW_GROUP_SLICE` and
    written, each to a temporary Arrow IPC file in batches of ``chunk_rows`` (in
    :func:`tempfile.gettempdir`, ``TMPDIR``; no encoding, so writing and reading back cost little
    beside the decoding), then read back a batch of each file at a time. Only for row groups that would
    not fit."""
    import tempfile

    rows = parquet.metadata.row_group(group).num_rows
    width = max(1, ROW_GROUP_SLICE // (8 * rows))
    with tempfile.TemporaryDirectory(prefix="consistency-gate-row-group-") as folder, contextlib.ExitStack() as files:
        readers = []
        for start in range(0, len(classes), width):
            path = Path(folder) / f"{start}.arrow"
            table = parquet.read_row_group(group, columns=classes[start : start + width]).combine_chunks()
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                for batch in table.to_batches(max_chunksize=chunk_rows):
                    writer.write_batch(batch)
            del table
            readers.append(pa.ipc.open_file(files.enter_context(pa.OSFile(str(path), "rb"))))
        for j in range(readers[0].num_record_batches):
            pieces = [reader.get_batch(j) for reader in readers]
            columns = [column for piece in pieces for column in piece.columns]
            yield pa.RecordBatch.from_arrays(columns, names=classes)
