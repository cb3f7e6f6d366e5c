"""The pyarrow readers of score files and ids agree with the pandas readers they replace."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from consistency_gate.errors import DataError
from consistency_gate.io import matrices
from consistency_gate.io import predictions as io
from consistency_gate.io.alignment import Alignment, row_order


def _write(frame: pd.DataFrame, path, row_group_size: int | None = None):
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path, row_group_size=row_group_size)
    return path


def _pandas_reader(source: io.PredictionSource) -> np.ndarray:
    """What compare read before: pandas chunks, then io.score_matrix."""
    return np.vstack([io.score_matrix(f, source) for f in io.iter_frames(source.path, source.columns)])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.integers(1, 60),
    chunk=st.integers(1, 25),
    dtype=st.sampled_from(["float32", "float64", "int64"]),
    suffix=st.sampled_from([".csv", ".parquet"]),
    seed=st.integers(0, 10**6),
    in_memory=st.sampled_from([matrices.REORDER_IN_MEMORY, 0]),  # 0: reordered through a temporary file
    group_slice=st.sampled_from([matrices.ROW_GROUP_SLICE, 1]),  # 1: row groups cut through disk, a column at a time
)
def test_score_chunks_equal_the_pandas_reader_in_file_and_id_order(
    tmp_path, monkeypatch, rows, chunk, dtype, suffix, seed, in_memory, group_slice
):
    monkeypatch.setattr(matrices, "REORDER_IN_MEMORY", in_memory)
    monkeypatch.setattr(matrices, "ROW_GROUP_SLICE", group_slice)
    rng = np.random.default_rng(seed)
    scores = (rng.random((rows, 4)) * 10).astype(dtype)
    frame = pd.DataFrame(scores, columns=["b", "a", "10", "c"]).assign(id=[f"s{i}" for i in range(rows)])
    path = _write(frame, tmp_path / f"g{seed}{suffix}", row_group_size=7 if seed % 2 else None)  # or one group
    source = io.inspect_prediction_file(path, "id")
    source = io.PredictionSource(path, ("10", "a", "b", "c"), "id")  # read in this column order
    expected = _pandas_reader(source)
    got = np.vstack([m.copy() for m in matrices.score_chunks(source, chunk_rows=chunk)])
    assert got.dtype == expected.dtype and np.array_equal(got, expected)
    assert all(len(m) == chunk for m in list(matrices.score_chunks(source, chunk_rows=chunk))[:-1])
    positions = rng.permutation(rows)
    shuffled = np.vstack(
        [m.copy() for m in matrices.score_chunks(source, chunk_rows=chunk, alignment=Alignment(positions))]
    )
    assert np.array_equal(shuffled, expected[positions])


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
@pytest.mark.parametrize(
    "value, message",
    [
        (np.nan, "row 3, column 'dog': value nan is NaN or infinite"),
        (np.inf, "row 3, column 'dog': value inf is NaN or infinite"),
        (-0.5, "row 3, column 'dog': value -0.5 is negative"),
        ("oops", "column 'dog' is not numeric"),  # a text column in Parquet: its first row is named
    ],
)
@pytest.mark.parametrize("in_memory", [matrices.REORDER_IN_MEMORY, 0])
def test_bad_scores_are_named_by_file_row_and_column_as_before(
    tmp_path, monkeypatch, suffix, value, message, in_memory
):
    monkeypatch.setattr(matrices, "REORDER_IN_MEMORY", in_memory)
    frame = pd.DataFrame({"id": ["s1", "s2", "s3", "s4"], "cat": [0.9, 0.2, 0.6, 0.5], "dog": [0.1, 0.8, 0.4, 0.5]})
    if isinstance(value, str):
        frame["dog"] = frame["dog"].astype(str)  # a text column (Parquet types it so)
    frame.loc[2, "dog"] = value
    source = io.inspect_prediction_file(_write(frame, tmp_path / f"bad{suffix}"), "id")
    for positions in (None, np.array([3, 2, 1, 0])):
        with pytest.raises(DataError, match=f"bad{suffix}: {message}".replace("(", r"\(").replace(")", r"\)")):
            list(matrices.score_chunks(source, chunk_rows=2, alignment=Alignment(positions)))
    with pytest.raises(DataError) as before:
        _pandas_reader(source)
    assert message in str(before.value)


def test_a_text_value_after_the_first_chunk_of_a_csv_is_named_by_the_pandas_reader(tmp_path):
    path = tmp_path / "late.csv"
    path.write_text("a,b\n" + "0.5,0.5\n" * 5 + "0.5,x\n")
    source = io.inspect_prediction_file(path)
    chunks = matrices.score_chunks(source, chunk_rows=2)
    assert [m.tolist() for m in (next(chunks), next(chunks))] == [[[0.5, 0.5]] * 2] * 2
    with pytest.raises(DataError, match=r"column 'b' is not numeric \(row 6: 'x'\)"):
        next(chunks)


def _ids_file(tmp_path, name: str, ids: list, suffix: str = ".parquet"):
    """A score file whose column ``a`` holds the number in each row's id."""
    frame = pd.DataFrame({"id": ids, "a": [float(str(i).strip("s")) for i in ids], "b": 0.5})
    return io.inspect_prediction_file(_write(frame, tmp_path / f"{name}{suffix}"), "id")


@pytest.mark.parametrize("ids", [[7, 8, 9, 10], ["s7", "s8", "s9", "s10"]])
def test_row_order_puts_each_file_in_the_labels_id_order(tmp_path, ids):
    labels = _write(pd.DataFrame({"id": ids, "label": "a"}), tmp_path / "labels.parquet")
    same = _ids_file(tmp_path, "same", ids)
    moved = _ids_file(tmp_path, "moved", [ids[2], ids[0], ids[3], ids[1]])
    as_csv = _ids_file(tmp_path, "csv", [ids[3], ids[2], ids[1], ids[0]], ".csv")  # text ids; integers: as text
    order = row_order(labels, [same, moved, as_csv], "id")
    assert order[0].positions is None and order[1].positions.tolist() == [1, 3, 0, 2]
    assert (order[2].expected is not None) if isinstance(ids[0], str) else order[2].positions.tolist() == [3, 2, 1, 0]
    for source, alignment in zip([same, moved, as_csv], order, strict=True):  # column a holds each row's id
        read = np.vstack([m.copy() for m in matrices.score_chunks(source, 3, alignment)])
        assert read[:, 0].tolist() == [7, 8, 9, 10]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    labels_ids=st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=30, unique=True),
    text=st.booleans(),
    sort_labels=st.booleans(),
    change=st.sampled_from([None, "repeat", "replace", "add"]),
    seed=st.integers(0, 10**6),
)
def test_row_order_agrees_with_a_pandas_index(tmp_path, labels_ids, text, sort_labels, change, seed):
    """Integer ids (sorted or not) are matched by sorting, text by hashing: either way the positions
    are pandas' ``get_indexer``, and a file whose ids are not the labels' reordered is refused."""
    rng = np.random.default_rng(seed)
    labels_ids = sorted(labels_ids) if sort_labels else labels_ids
    file_ids = [labels_ids[i] for i in rng.permutation(len(labels_ids))]
    if change == "repeat" and len(file_ids) > 1:
        file_ids[-1] = file_ids[0]
    elif change == "replace":
        file_ids[-1] = 2**41
    elif change == "add":
        file_ids.append(2**41)
    labels_ids, file_ids = ([f"s{i}" for i in x] if text else x for x in (labels_ids, file_ids))
    labels = _write(pd.DataFrame({"id": labels_ids, "label": "a"}), tmp_path / f"labels{seed}.parquet")
    source = _ids_file(tmp_path, f"g{seed}", file_ids)
    if sorted(file_ids) != sorted(labels_ids):
        with pytest.raises(DataError, match=f"g{seed}.parquet: id"):
            row_order(labels, [source], "id")
        return
    (alignment,) = row_order(labels, [source], "id")
    rows = alignment.positions
    expected = pd.Index(file_ids).get_indexer(labels_ids)
    assert (rows is None and file_ids == labels_ids) or rows.tolist() == expected.tolist()


@pytest.mark.parametrize(
    "ids, message",
    [
        ([1, 2, 3, 5], r"moved.parquet: id '4' of .*labels.parquet is missing \(1 ids in all\)"),
        ([1, 2, 3, 4, 5], r"moved.parquet: id '5' is not in .*labels.parquet \(1 such ids\)"),
        ([1, 2, 3, 3], r"moved.parquet: id '3' appears more than once in column 'id'"),
        ([1, 2, None, 4], r"moved.parquet: row 3, id column 'id' is empty"),
    ],
)
def test_ids_that_do_not_match_are_named(tmp_path, ids, message):
    labels = _write(pd.DataFrame({"id": [1, 2, 3, 4], "label": "a"}), tmp_path / "labels.parquet")
    frame = pd.DataFrame({"id": pd.array(ids, dtype="Int64"), "a": 0.5, "b": 0.5})
    moved = io.inspect_prediction_file(_write(frame, tmp_path / "moved.parquet"), "id")
    with pytest.raises(DataError, match=message):
        row_order(labels, [moved], "id")


def test_a_csv_file_is_aligned_as_it_is_read_not_by_a_pass_over_its_ids_first(tmp_path, monkeypatch):
    labels = _write(pd.DataFrame({"id": ["s1", "s2", "s3"], "label": "a"}), tmp_path / "labels.csv")
    same = _ids_file(tmp_path, "same", ["s1", "s2", "s3"], ".csv")
    moved = _ids_file(tmp_path, "moved", ["s2", "s3", "s1"], ".csv")
    order = row_order(labels, [same, moved], "id")
    assert all(a.positions is None and a.expected.to_pylist() == ["s1", "s2", "s3"] for a in order)
    monkeypatch.setattr(matrices, "file_positions", None)  # the id pass: not called
    for source, alignment in zip([same, moved], order, strict=True):
        read = np.vstack([m.copy() for m in matrices.score_chunks(source, 2, alignment)])
        assert read[:, 0].tolist() == [1, 2, 3]


def test_ids_whose_hashes_collide_are_still_placed_exactly(tmp_path, monkeypatch):
    """Ids are found by hash and then compared: where hashes collide (here all of them), the file
    is aligned by its id column instead, never a row put in another's place."""
    labels = _write(pd.DataFrame({"id": [f"s{i}" for i in range(1, 6)], "label": "a"}), tmp_path / "labels.csv")
    moved = _ids_file(tmp_path, "moved", ["s4", "s2", "s5", "s1", "s3"], ".csv")
    (alignment,) = row_order(labels, [moved], "id")
    monkeypatch.setattr(matrices, "hash_ids", lambda ids: np.zeros(len(ids), dtype=np.uint64))
    read = np.vstack([m.copy() for m in matrices.score_chunks(moved, 2, alignment)])
    assert read[:, 0].tolist() == [1, 2, 3, 4, 5]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.integers(1, 30),
    kept=st.integers(0, 30),
    change=st.sampled_from([None, "shuffle", "repeat", "replace", "add", "drop", "text"]),
    chunk=st.integers(1, 7),
    in_memory=st.sampled_from([matrices.REORDER_IN_MEMORY, 0]),
    seed=st.integers(0, 10**6),
)
@example(rows=5, kept=5, change="drop", chunk=3, in_memory=0, seed=0)  # in order, one row short: a short chunk
def test_a_csv_is_read_in_its_order_and_placed_by_its_ids_from_where_it_is_not_in_the_labels(
    tmp_path, monkeypatch, rows, kept, change, chunk, in_memory, seed
):
    """A CSV file is read in its own order while its ids are the labels'; from the first chunk where
    they are not, its rows are placed by their ids as they are parsed (the chunks given are not
    given again), or it is refused with an error naming the file and the id or column."""
    monkeypatch.setattr(matrices, "REORDER_IN_MEMORY", in_memory)
    rng = np.random.default_rng(seed)
    labels_ids = [f"s{i}" for i in range(rows)]
    file_ids = labels_ids[:kept] + [labels_ids[i] for i in kept + rng.permutation(max(rows - kept, 0))]
    if change == "repeat" and rows > 1:
        file_ids[-1] = file_ids[0]
    elif change == "replace":
        file_ids[-1] = "new"
    elif change == "add":
        file_ids.append("new")
    elif change == "drop":
        file_ids.pop()
    scores = rng.random((len(file_ids), 2)).astype(object)
    if change == "text":
        scores[-1, 1] = "x"
    labels = _write(pd.DataFrame({"id": labels_ids, "label": "a"}), tmp_path / f"labels{seed}.csv")
    path = _write(pd.DataFrame({"id": file_ids, "a": scores[:, 0], "b": scores[:, 1]}), tmp_path / f"g{seed}.csv")
    source = io.inspect_prediction_file(path, "id")
    chunks = matrices.score_chunks(source, chunk, Alignment(labels=labels, expected=pa.array(labels_ids)))

    def read() -> np.ndarray:
        got: list[np.ndarray] = []
        for m in chunks:  # each as long as the labels' chunk: a reader stops at a short one, as at the end
            assert len(m) == min(chunk, rows - chunk * len(got))
            got.append(m.copy())
        return np.vstack(got)

    if sorted(file_ids) != sorted(labels_ids) or change == "text":
        with pytest.raises(DataError, match=rf"g{seed}.csv: (id '(s\d+|new)' |column 'b' is not numeric)"):
            read()
        return
    assert np.array_equal(read(), scores[pd.Index(file_ids).get_indexer(labels_ids)].astype(float))


@pytest.mark.parametrize(("depth", "untaken"), [(1, 1), (4, 5)])
def test_a_reader_goes_no_further_ahead_than_its_depth_and_closes(depth, untaken):
    """Depth 1: the next chunk is read only once the one before is taken (buffers reused in turn);
    a larger depth: that many wait to be taken, and the thread holds one more. close() ends it."""
    import time

    produced: list[int] = []

    def chunks():
        for i in range(50):
            produced.append(i)
            yield i

    def settled(count: int) -> None:
        deadline = time.monotonic() + 5
        while len(produced) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # and no further
        assert len(produced) == count

    reader = matrices.ReadAhead(chunks(), depth)
    settled(untaken)
    assert [next(reader), next(reader)] == [0, 1]
    settled(untaken + 2)
    reader.close()
    assert not reader.thread.is_alive() and list(reader) == []


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_row_group_goes_through_disk_by_its_rows_and_classes_whatever_its_dtype(tmp_path, monkeypatch, dtype):
    """The budget is the float64 matrices a row group becomes (rows x classes x 8), not its bytes in the
    file: 300 rows x 4 float32 classes are 4,800 bytes in the file and 9,600 as matrices."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.random((300, 4)).astype(dtype), columns=list("abcd")).assign(id=range(300))
    path = _write(frame, tmp_path / f"{dtype}.parquet")  # one row group
    source = io.PredictionSource(path, ("a", "b", "c", "d"), "id")
    spilled = []
    through_disk = matrices._through_disk
    monkeypatch.setattr(matrices, "_through_disk", lambda *a: spilled.append(a[1]) or through_disk(*a))
    monkeypatch.setattr(matrices, "ROW_GROUP_SLICE", 300 * 4 * 8 - 1)
    got = np.vstack([m.copy() for m in matrices.score_chunks(source, chunk_rows=100)])
    assert spilled == [0] and np.array_equal(got, frame[list("abcd")].to_numpy(np.float64))
    spilled.clear()
    monkeypatch.setattr(matrices, "ROW_GROUP_SLICE", 300 * 4 * 8)  # fits: read whole
    assert np.array_equal(np.vstack([m.copy() for m in matrices.score_chunks(source, chunk_rows=100)]), got)
    assert spilled == []
