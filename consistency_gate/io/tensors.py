"""Evaluation data for tensor models: one array per sample, in a Parquet column or an ``.npz`` file.

A model logged with a tensor signature (say input ``(-1, 1, 28, 28)`` float32) takes a batch
of that shape. Its evaluation data holds each sample as one array: a Parquet list (or
fixed-size list) column, or the ``x`` array of an ``.npz`` file (with ``y`` the labels and
optional ``ids``); flat numeric columns are reshaped when the signature says so.
:func:`tensor_batch` turns the feature columns of a frame into the batch a model takes, and
names the column, the row and both shapes when they do not fit.

>>> spec = TensorInput((-1, 1, 2, 2), "float32")
>>> frame = pd.DataFrame({"pixels": [np.arange(4.0), np.ones(4)]})
>>> tensor_batch(frame, spec, "eval.parquet").shape
(2, 1, 2, 2)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from consistency_gate.errors import DataError
from consistency_gate.io.text import as_text

NPZ_FEATURES = "x"  # the column an .npz file's ``x`` array becomes


@dataclass(frozen=True)
class TensorInput:
    """The input a tensor signature declares: its shape (``-1`` for any size) and dtype.

    >>> TensorInput((-1, 1, 8, 8), "float32").sample_size
    64
    """

    shape: tuple[int, ...]
    dtype: str

    @property
    def sample_size(self) -> int | None:
        """Values per sample (None where a dimension after the batch is free)."""
        rest = self.shape[1:]
        return None if any(d < 0 for d in rest) else math.prod(rest)

    def describe(self) -> str:
        """The shape and dtype as a reader writes them.

        >>> TensorInput((-1, 3), "float64").describe()
        '(-1, 3) float64'
        """
        return f"({', '.join(map(str, self.shape))}) {self.dtype}"


def array_column(frame: pd.DataFrame) -> str | None:
    """The column of ``frame`` whose values are arrays (one per sample), or None.

    >>> array_column(pd.DataFrame({"x": [np.zeros(3)], "label": ["a"]}))
    'x'
    """
    for name in frame.columns:
        column = frame[name]
        if column.dtype == object and len(column) and isinstance(column.iloc[0], (np.ndarray, list, tuple)):
            return str(name)
    return None


def tensor_batch(features: pd.DataFrame, spec: TensorInput | None, where: str) -> np.ndarray:
    """The batch a model takes from the feature columns of ``features``: the one array column
    stacked, else the numeric columns as (rows, columns); reshaped to ``spec``'s shape and cast
    to its dtype (float32 without a spec). A sample that does not fit raises DataError naming
    ``where``, the column, the row and both shapes.

    >>> frame = pd.DataFrame({"a": [1.0, 2.0], "b": [3.0, 4.0]})
    >>> tensor_batch(frame, None, "eval.csv").tolist()
    [[1.0, 3.0], [2.0, 4.0]]
    >>> tensor_batch(frame, TensorInput((-1, 3), "float32"), "eval.csv")
    Traceback (most recent call last):
    ...
    consistency_gate.errors.DataError: eval.csv: feature columns a, b hold 2 values per sample but the model takes ...
    """
    column = array_column(features)
    if column is not None:
        x = _stack(features[column], where, column, spec)
        what = f"column '{column}' holds arrays of shape {x.shape[1:]}"
    else:
        x = _numeric(features, where)
        what = f"feature columns {', '.join(map(str, features.columns))} hold {x.shape[1]} values per sample"
    dtype = np.dtype(spec.dtype if spec is not None else np.float32)
    if spec is None:
        return x.astype(dtype, copy=False)
    size = spec.sample_size
    if len(spec.shape) == x.ndim and all(d < 0 or d == f for d, f in zip(spec.shape[1:], x.shape[1:], strict=True)):
        return x.astype(dtype, copy=False)
    if size is not None and math.prod(x.shape[1:]) == size:
        return x.reshape((len(x), *spec.shape[1:])).astype(dtype, copy=False)
    expected = f"{size} per sample" if size is not None else f"{len(spec.shape) - 1} dimensions per sample"
    fix = "give the column the model was logged with" if column else "give the columns the model was logged with"
    raise DataError(f"{where}: {what} but the model takes {spec.describe()} ({expected}); {fix}")


def _stack(values: pd.Series, where: str, column: str, spec: TensorInput | None) -> np.ndarray:
    """The arrays of one column stacked into (rows, *sample shape); a ragged row is named."""
    arrays = [_dense(v) for v in values]
    first = arrays[0].shape if arrays else ()
    for row, array in zip(values.index, arrays, strict=True):
        if array.shape != first:
            expected = f"; the model takes {spec.describe()}" if spec is not None else ""
            raise DataError(
                f"{where}: column '{column}', row {int(row) + 1} holds an array of shape {array.shape} but row "
                f"{int(values.index[0]) + 1} one of shape {first}{expected}; every sample needs the same shape"
            )
        if not np.issubdtype(array.dtype, np.number) and not np.issubdtype(array.dtype, np.bool_):
            raise DataError(
                f"{where}: column '{column}', row {int(row) + 1} holds {array.dtype} values; the model takes numbers"
            )
    return np.stack(arrays) if arrays else np.zeros((0,), dtype=np.float32)


def _dense(value: object) -> np.ndarray:
    """One cell as a numeric array: a nested Parquet list reads as arrays of arrays (object dtype);
    a ragged one stays object dtype and is refused by the caller."""
    array = np.asarray(value)
    if array.dtype != object or array.ndim == 0 or not len(array):
        return array
    parts = [_dense(v) for v in array]
    if len({p.shape for p in parts}) != 1 or any(p.dtype == object for p in parts):
        return array
    return np.stack(parts)


def _numeric(features: pd.DataFrame, where: str) -> np.ndarray:
    text = [c for c in features.columns if not pd.api.types.is_numeric_dtype(features[c])]
    if text:
        raise DataError(
            f"{where}: feature column '{text[0]}' is not numeric but the model takes numbers; if it identifies "
            "samples pass --id-column, or log the model with a signature naming its feature columns"
        )
    return features.to_numpy(dtype=np.float64)


def read_npz(path: Path, label_column: str, id_column: str | None) -> pd.DataFrame:
    """An ``.npz`` evaluation set as a frame: ``x`` (one array per sample) as column ``x``, ``y``
    as ``label_column`` (text), ``ids`` as ``id_column``; other 1-D arrays of the same length
    (slicing columns) as text columns of their name.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "eval.npz"
    >>> np.savez(path, x=np.zeros((3, 1, 2, 2)), y=np.array([0, 1, 1]))
    >>> frame = read_npz(path, "label", None)
    >>> frame.columns.tolist(), frame["label"].tolist(), frame["x"].iloc[0].shape
    (['x', 'label'], ['0', '1', '1'], (1, 2, 2))
    """
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot be read as an .npz archive ({exc})") from None
    with archive:
        names = list(archive.files)
        for needed in ("x", "y"):
            if needed not in names:
                raise DataError(
                    f"{path}: the archive has no array '{needed}' (it has: {', '.join(names) or 'none'}); an "
                    ".npz evaluation set holds x (the samples), y (the labels) and optionally ids"
                )
        if id_column and "ids" not in names:
            raise DataError(f"{path}: --id-column {id_column} is given but the archive has no array 'ids'")
        try:
            x, y = archive["x"], archive["y"]
        except ValueError as exc:  # an object array: numpy would unpickle it, which runs code; never here
            raise DataError(
                f"{path}: x or y is an object array ({exc}); save numbers or fixed-width strings, e.g. "
                "np.savez(path, x=x.astype('float32'), y=y.astype(str))"
            ) from None
        if x.ndim < 2 or y.ndim != 1 or len(x) != len(y):
            raise DataError(
                f"{path}: x must be (samples, ...) and y (samples,) with one label per sample; "
                f"found x {x.shape} and y {y.shape}"
            )
        columns: dict[str, object] = {NPZ_FEATURES: list(x), label_column: as_text(pd.Series(y))}
        if id_column:
            ids = archive["ids"]
            if ids.shape != (len(x),):
                raise DataError(f"{path}: ids must hold one id per sample ({len(x)}), found shape {ids.shape}")
            columns[id_column] = as_text(pd.Series(ids))
        for name in names:
            array = archive[name]
            if name not in ("x", "y", "ids") and array.ndim == 1 and len(array) == len(x):
                columns[name] = as_text(pd.Series(array))
    return pd.DataFrame(columns)
