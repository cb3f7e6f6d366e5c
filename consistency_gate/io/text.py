"""Labels and ids as text, whatever type a file stored them in."""

from __future__ import annotations

import numpy as np
import pandas as pd


def as_text(values: pd.Series) -> pd.Series:
    """Labels or ids as text (object dtype, missing values kept): integral floats lose their
    ``.0`` (a CSV column of class ids read as float still names class ``3``, not ``3.0``).

    >>> as_text(pd.Series([3.0, 0.5, None, 7])).tolist()
    ['3', '0.5', nan, '7']
    >>> as_text(pd.Series(["a", None, 2])).tolist()
    ['a', None, '2']
    """
    if pd.api.types.is_string_dtype(values.dtype) and pd.api.types.infer_dtype(values, skipna=True) == "string":
        return values.astype(object)
    if pd.api.types.is_integer_dtype(values.dtype) or pd.api.types.is_bool_dtype(values.dtype):
        return values.astype(str).astype(object)
    out = values.astype(object)
    present = out.notna()
    if pd.api.types.is_float_dtype(values.dtype):
        numbers = values[present].to_numpy(dtype=np.float64)  # as Python floats, whatever the width
        integral = np.isfinite(numbers) & (numbers == np.floor(numbers)) & (np.abs(numbers) < 2**62)
        text = numbers.astype(str).astype(object)
        text[integral] = numbers[integral].astype(np.int64).astype(str)
        huge = np.isfinite(numbers) & ~integral & (numbers == np.floor(numbers))
        text[huge] = [str(int(v)) for v in numbers[huge]]
        out[present] = text
        return out
    out[present] = out[present].map(_label_text)  # mixed Python objects: one at a time
    return out


def _label_text(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
