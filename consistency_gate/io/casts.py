"""Evaluation columns cast to the types a model was logged with, before it predicts.

Teams store evaluation data as their tools write it: a CSV reads back float32 training columns as
float64 and an integer column with a gap as float64; a pandas ``category`` column is written to
Parquet as a dictionary (read back as ``category``) and to CSV as text. The model's signature says
what it takes (MLflow type names: ``float``, ``double``, ``long``, ``integer``, ``string``, ...), and
a gradient-boosted tree fitted on a ``category`` column takes that column as ``category`` again.
:func:`cast_to_signature` gives each column that type where the cast keeps every value; NaN is
kept wherever it is (the model, not this module, says whether it handles it).

>>> frame = pd.DataFrame({"income": [1.5, None], "term": [1.0, 2.0], "branch": ["n", "s"]})
>>> cast = cast_to_signature(frame, {"income": "float", "term": "long", "branch": "string"}, ["branch"])
>>> [str(t) for t in cast.dtypes]
['float32', 'int64', 'category']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

_FLOATS = {"float": np.float32, "double": np.float64}
_INTEGERS = {"long": np.int64, "integer": np.int32}


def cast_to_signature(
    features: pd.DataFrame, types: Mapping[str, str], categorical: Sequence[str] = ()
) -> pd.DataFrame:
    """``features`` with each column cast to its signature type where that keeps every value.

    Parameters
    ----------
    features : the columns a model reads.
    types : column -> MLflow type name, from the model's signature (a column not named keeps its dtype).
    categorical : the columns the model takes as pandas ``category`` (a LightGBM or XGBoost model
        fitted on categories); they become ``category`` whatever their signature type says.

    Returns
    -------
    The frame with the cast columns (the input itself when nothing needs a cast).

    Numbers become ``float32`` / ``float64`` for ``float`` / ``double``; a float column whose values
    are whole numbers becomes ``int64`` / ``int32`` for ``long`` / ``integer``, and one holding NaN
    stays float (a model that handles missing values takes it; one that does not says so when it
    predicts); a ``category`` column becomes text for ``string``, its empty cells staying empty.

    Examples
    --------
    >>> frame = pd.DataFrame({"a": [1, 2], "b": [0.5, np.nan], "c": pd.Categorical(["x", None])})
    >>> cast = cast_to_signature(frame, {"a": "double", "b": "long", "c": "string"})
    >>> cast["a"].dtype, cast["b"].dtype, cast["c"].tolist()
    (dtype('float64'), dtype('float64'), ['x', nan])
    """
    changed: dict[str, pd.Series] = {}
    for name in features.columns:
        column = features[name]
        target = "category" if name in categorical else types.get(str(name))
        cast = _cast(column, target) if target is not None else column
        if cast is not column:
            changed[name] = cast
    if not changed:
        return features
    out = features.copy(deep=False)
    for name, column in changed.items():
        out[name] = column
    return out


def _cast(column: pd.Series, target: str) -> pd.Series:
    """``column`` as ``target`` (an MLflow type name or ``category``), or itself when no cast is needed
    or none keeps every value."""
    dtype = column.dtype
    numeric = pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype)
    if target == "category":
        return column if isinstance(dtype, pd.CategoricalDtype) else column.astype("category")
    if target in _FLOATS and numeric:
        wanted = _FLOATS[target]
        return column if dtype == wanted else column.astype(wanted)
    if target in _INTEGERS and numeric:
        wanted = _INTEGERS[target]
        if dtype == wanted:
            return column
        values = column.to_numpy(dtype=np.float64, na_value=np.nan)
        whole = np.isfinite(values).all() and (values == np.round(values)).all()
        return column.astype(wanted) if whole else column
    if target == "string" and isinstance(dtype, pd.CategoricalDtype):
        return column.astype(object).where(column.notna(), np.nan)
    return column
