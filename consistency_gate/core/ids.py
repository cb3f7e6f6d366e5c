"""Text ids at scale: each id as a 64-bit hash (pandas' ``hash_array``), so that ten million ids are found by a
binary search over 80 MB of integers, not by a dictionary of ten million Python strings. A hash names an id,
the text decides: whoever finds an id by its hash compares the texts before trusting it.

>>> ids = as_text([3, "a", 3.5])
>>> ids.to_pylist()
['3', 'a', '3.5']
>>> keys, order = sorted_keys(ids, "pop.csv")
>>> bool((keys[1:] > keys[:-1]).all()) and sorted(order.tolist()) == [0, 1, 2]
True
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from consistency_gate.errors import DataError

HASHED = 100_000
"""Ids hashed at a time (each a Python string only while it is hashed)."""


def as_text(ids: Sequence[object] | pa.Array | pa.ChunkedArray | pd.Series | np.ndarray) -> pa.Array:
    """``ids`` as one Arrow string array, each as Python's ``str`` writes it (``3`` as ``'3'``, ``3.0`` as
    ``'3.0'``); nulls stay null. Text and integers are converted in Arrow, anything else one by one.

    >>> as_text(pa.chunked_array([[1, 2], [None]])).to_pylist()
    ['1', '2', None]
    """
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    if not isinstance(ids, pa.Array):
        values = ids if isinstance(ids, (pd.Series, np.ndarray)) else list(ids)
        try:
            ids = pa.array(values, from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed kinds: each as its text
            ids = pa.array([None if pd.isna(v) else str(v) for v in values], type=pa.string())
    if pa.types.is_string(ids.type):
        return ids
    if pa.types.is_large_string(ids.type) or pa.types.is_integer(ids.type) or pa.types.is_null(ids.type):
        return ids.cast(pa.string())
    return pa.array([None if v is None else str(v) for v in ids.to_pylist()], type=pa.string())


def hash_ids(ids: pa.Array) -> np.ndarray:
    """The 64-bit hash of each text id (``HASHED`` at a time, so that few Python strings live at once).

    >>> bool(hash_ids(pa.array(["a", "b"]))[0] == hash_ids(pa.array(["a"]))[0])
    True
    """
    from pandas.util import hash_array

    parts = [
        hash_array(ids.slice(at, HASHED).to_numpy(zero_copy_only=False), categorize=False)
        for at in range(0, len(ids), HASHED)
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


def sorted_keys(ids: pa.Array, where: str) -> tuple[np.ndarray, np.ndarray]:
    """The ids' hashes in ascending order, and the order that sorts the ids so; a DataError naming ``where``
    and the row of an empty id or the rows of the first id that repeats.

    >>> sorted_keys(pa.array(["a", "b", "a"]), "pop.csv")
    Traceback (most recent call last):
    ...
    consistency_gate.errors.DataError: pop.csv: id 'a' appears 2 times (rows 1 and 3); a population names each ...
    """
    if ids.null_count:
        row = int(np.flatnonzero(ids.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f"{where}: row {row + 1}: the id is empty; every item of a population needs one")
    keys = hash_ids(ids)
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    same = np.flatnonzero(keys[1:] == keys[:-1])
    if len(same):
        rows = np.sort(order[keys == keys[same[0]]])
        first, second = ids[int(rows[0])].as_py(), ids[int(rows[1])].as_py()
        if first != second:  # two ids, one hash: about once in 10^12 populations of 10M ids
            raise DataError(f"{where}: ids {first!r} and {second!r} share a 64-bit hash; rename one of them")
        raise DataError(
            f"{where}: id {first!r} appears {len(rows)} times (rows {rows[0] + 1} and {rows[1] + 1}); a population "
            "names each item once: drop the repeats"
        )
    return keys, order


def lookup(keys: np.ndarray, ids: pa.Array, wanted: pa.Array) -> np.ndarray:
    """The position of each of ``wanted`` among ``ids`` (whose hashes ``keys`` are sorted ascending, in the
    ids' order), -1 where it is not there; exact: a hash found is checked against the text.

    >>> ids = pa.array(["x", "y"])
    >>> keys, order = sorted_keys(ids, "t")
    >>> lookup(keys, ids.take(order), pa.array(["y", "z"])).tolist() == [int(np.flatnonzero(order == 1)[0]), -1]
    True
    """
    if not len(keys):
        return np.full(len(wanted), -1, dtype=np.int64)
    out = np.empty(len(wanted), dtype=np.int64)
    for start in range(0, len(wanted), HASHED):  # a chunk at a time: its texts are taken once, then dropped
        part = wanted.slice(start, HASHED)
        at = np.searchsorted(keys, hash_ids(part)).clip(max=len(keys) - 1)
        same = pc.equal(ids.take(pa.array(at)), part).fill_null(False).to_numpy(zero_copy_only=False)
        out[start : start + len(part)] = np.where(same, at, -1)
    return out
