"""Evaluation-data validation with great-expectations 1.x, before anything is predicted.

Checks: the set is not empty, the label column exists and has no nulls, every feature
column the models' signatures name exists with a compatible type, every label is a
class of at least one generation, and, for tensor models, the column of arrays exists, has
no nulls and holds the number of values per sample the signature declares.

GX evaluates each expectation separately (a few milliseconds each), so the suite is built to
stay small however wide the data: one table-level expectation that every needed column exists,
and a type expectation only for the feature columns whose pandas dtype is not one of their
type's (those GX then reports as failed); a column whose dtype already fits needs no check
(``benchmarks/validation_overhead.py`` measures it against one expectation per column).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from great_expectations.core.expectation_validation_result import ExpectationValidationResult
    from great_expectations.data_context import AbstractDataContext

_NUMERIC = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64"]
# the dtypes a column of each MLflow type may have as read (io.casts gives it the signature's type):
# an integer column with an empty cell reads as floats, a pandas category column is text in a category
_TYPES = {
    "double": _NUMERIC,
    "float": _NUMERIC,
    "long": _NUMERIC,
    "integer": _NUMERIC,
    "boolean": ["bool", "boolean"],
    "string": ["object", "str", "string", "category"],
}


@dataclass
class ValidationReport:
    """The outcome of validating the evaluation data: success, failures in words, GX's result."""

    success: bool
    failures: list[str]
    result: dict  # the GX validation result as JSON

    def summary(self) -> str:
        """The failures on one line."""
        return "; ".join(self.failures)


def validate_evaluation_data(
    frame: pd.DataFrame,
    label_column: str,
    features: dict[str, str | None],
    known_classes: list[str] | None,
    arrays: dict[str, int | None] | None = None,
) -> ValidationReport:
    """Run the expectations on ``frame``; ``features`` maps column -> MLflow type name (or None).

    ``known_classes`` None (the models' classes are unknown) leaves out the label-in-set check.
    ``arrays`` maps a column of arrays (tensor models) to the values per sample its models take
    (None: any); GX checks that count on a derived column ``<column>.size``.

    Example::

        report = validate_evaluation_data(frame, "label", {"amount": "double"}, ["fraud", "ok"])
        report.success, report.summary()
        # (True, '')
    """
    import logging
    import warnings

    with warnings.catch_warnings():  # GX imports pyspark when installed, which warns about pandas 3
        warnings.filterwarnings("ignore", message="PySpark does not yet fully support", category=FutureWarning)
        import great_expectations as gx
        import great_expectations.expectations as gxe

    arrays = arrays or {}
    sizes = {f"{name}.size": name for name in arrays if name in frame.columns}
    if sizes:
        frame = frame.assign(**{size: frame[name].map(_value_count) for size, name in sizes.items()})
    # GX logs INFO lines (a temporary docs folder on every context) that would reach a root handler
    # another library installed (torch's pt2 loading does): the gate prints its own result
    # (its module great_expectations.data_context.types.base sets its own logger to INFO)
    logging.getLogger("great_expectations.data_context.types.base").setLevel(logging.WARNING)
    context = gx.get_context(mode="ephemeral")
    _quiet(context)
    asset = context.data_sources.add_pandas("consistency_gate").add_dataframe_asset("evaluation")
    batch = asset.add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame})
    suite = gx.ExpectationSuite(name="evaluation_data")
    suite.add_expectation(gxe.ExpectTableRowCountToBeBetween(min_value=1))
    needed = [label_column, *features]
    suite.add_expectation(gxe.ExpectTableColumnsToMatchSet(column_set=needed, exact_match=False))
    if label_column in frame.columns:
        suite.add_expectation(gxe.ExpectColumnValuesToNotBeNull(column=label_column))
        if known_classes is not None:
            suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column=label_column, value_set=known_classes))
    for name in mistyped_columns(frame, features):
        suite.add_expectation(gxe.ExpectColumnValuesToBeInTypeList(column=name, type_list=_TYPES[features[name]]))
    for name, size in arrays.items():
        suite.add_expectation(gxe.ExpectColumnToExist(column=name))
        if name in frame.columns:
            suite.add_expectation(gxe.ExpectColumnValuesToNotBeNull(column=name))
            if size is not None:
                suite.add_expectation(
                    gxe.ExpectColumnValuesToBeBetween(column=f"{name}.size", min_value=size, max_value=size)
                )
    result = batch.validate(suite)
    failures = [_describe(r) for r in result.results if not r.success]
    return ValidationReport(bool(result.success), failures, result.to_json_dict())


def mistyped_columns(frame: pd.DataFrame, features: dict[str, str | None]) -> list[str]:
    """The feature columns present in ``frame`` whose pandas dtype is not one that their MLflow
    type (``features``: column -> type name, None for unknown) accepts.

    >>> frame = pd.DataFrame({"a": [1.0], "b": ["x"], "c": [2.0], "d": ["y"]})
    >>> mistyped_columns(frame, {"a": "double", "b": "double", "c": "long", "d": "long", "e": None})
    ['b', 'd']
    """
    return [
        name
        for name, mlflow_type in features.items()
        if name in frame.columns and mlflow_type in _TYPES and str(frame[name].dtype) not in _TYPES[mlflow_type]
    ]


def _value_count(value: object) -> int | None:
    """How many numbers an array cell holds (None for an empty cell)."""
    return None if value is None else int(np.asarray(value).size)


def _quiet(context: AbstractDataContext) -> None:
    try:
        from great_expectations.data_context.types.base import ProgressBarsConfig

        context.variables.progress_bars = ProgressBarsConfig(globally=False)
    except Exception:  # noqa: BLE001 - only cosmetic
        pass


def _describe(result: ExpectationValidationResult) -> str:
    cfg = result.expectation_config
    kwargs = {k: v for k, v in cfg.kwargs.items() if k not in ("batch_id", "value_set", "type_list", "column_set")}
    detail = result.result or {}
    extra = ""
    missing = detail.get("details", {}).get("mismatched", {}).get("missing")
    if missing:
        extra = f": missing {missing[:10]}" + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
    elif detail.get("unexpected_count"):
        sample = detail.get("partial_unexpected_list", [])[:5]
        extra = f": {detail['unexpected_count']} unexpected, e.g. {sample}"
    elif "observed_value" in detail:
        extra = f": observed {detail['observed_value']}"
    args = ", ".join(f"{k}={v}" for k, v in kwargs.items())
    return f"{cfg.type}({args}){extra}"
