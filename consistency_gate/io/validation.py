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

    The suite is first evaluated in pandas (:data:`HOLDS`, the expectations' own definitions); where every
    expectation holds, that is the report and great-expectations is not loaded (1.7 s of a gate's start).
    Where one does not, or one has no pandas definition, great-expectations runs the same suite and its
    result, with the failed expectations and their examples, is the report.

    Example::

        report = validate_evaluation_data(frame, "label", {"amount": "double"}, ["fraud", "ok"])
        report.success, report.summary()
        # (True, '')
    """
    arrays = arrays or {}
    sizes = {f"{name}.size": name for name in arrays if name in frame.columns}
    if sizes:
        frame = frame.assign(**{size: frame[name].map(_value_count) for size, name in sizes.items()})
    suite = expectations(frame, label_column, features, known_classes, arrays)
    if all(holds(frame, kind, kwargs) for kind, kwargs in suite):
        return ValidationReport(True, [], _held(suite))
    return _with_great_expectations(frame, suite)


def expectations(
    frame: pd.DataFrame,
    label_column: str,
    features: dict[str, str | None],
    known_classes: list[str] | None,
    arrays: dict[str, int | None],
) -> list[tuple[str, dict]]:
    """The suite for ``frame``: (expectation type, its arguments) in great-expectations' names.

    >>> frame = pd.DataFrame({"x": [1.0], "label": ["a"]})
    >>> [kind.split("_")[-1] for kind, _ in expectations(frame, "label", {"x": "double"}, ["a"], {})]
    ['between', 'set', 'null', 'set']
    """
    suite: list[tuple[str, dict]] = [
        ("expect_table_row_count_to_be_between", {"min_value": 1}),
        ("expect_table_columns_to_match_set", {"column_set": [label_column, *features], "exact_match": False}),
    ]
    if label_column in frame.columns:
        suite.append(("expect_column_values_to_not_be_null", {"column": label_column}))
        if known_classes is not None:
            suite.append(("expect_column_values_to_be_in_set", {"column": label_column, "value_set": known_classes}))
    for name in mistyped_columns(frame, features):
        suite.append(("expect_column_values_to_be_in_type_list", {"column": name, "type_list": _TYPES[features[name]]}))
    for name, size in arrays.items():
        suite.append(("expect_column_to_exist", {"column": name}))
        if name in frame.columns:
            suite.append(("expect_column_values_to_not_be_null", {"column": name}))
            if size is not None:
                bounds = {"column": f"{name}.size", "min_value": size, "max_value": size}
                suite.append(("expect_column_values_to_be_between", bounds))
    return suite


def _present(frame: pd.DataFrame, kwargs: dict) -> pd.Series | None:
    return frame[kwargs["column"]] if kwargs["column"] in frame.columns else None


HOLDS = {
    "expect_table_row_count_to_be_between": lambda frame, kw: len(frame) >= kw["min_value"],
    "expect_table_columns_to_match_set": lambda frame, kw: set(kw["column_set"]) <= set(frame.columns),
    "expect_column_to_exist": lambda frame, kw: kw["column"] in frame.columns,
    "expect_column_values_to_not_be_null": lambda frame, kw: (
        (column := _present(frame, kw)) is not None and not column.isna().any()
    ),
    "expect_column_values_to_be_in_set": lambda frame, kw: (
        (column := _present(frame, kw)) is not None and bool(column.dropna().isin(kw["value_set"]).all())
    ),
    "expect_column_values_to_be_between": lambda frame, kw: (
        (column := _present(frame, kw)) is not None
        and bool(column.dropna().between(kw["min_value"], kw["max_value"]).all())
    ),
}
"""Each expectation of the suite that pandas evaluates as great-expectations defines it (nulls left out of
the column checks but the null check's own): ``HOLDS[type](frame, kwargs)``. A type not here
(``expect_column_values_to_be_in_type_list``, whose reading of object columns is GX's own) is left to GX."""


def holds(frame: pd.DataFrame, kind: str, kwargs: dict) -> bool:
    """Whether the expectation ``kind`` with ``kwargs`` holds on ``frame`` as pandas evaluates it (False for one
    pandas does not evaluate: great-expectations then decides).

    >>> holds(pd.DataFrame({"label": ["a", None]}), "expect_column_values_to_be_in_set", {"column": "label",
    ...       "value_set": ["a"]})
    True
    """
    check = HOLDS.get(kind)
    return check is not None and bool(check(frame, kwargs))


def _held(suite: list[tuple[str, dict]]) -> dict:
    """The report of a suite every expectation of which held, in great-expectations' result's shape."""
    return {
        "success": True,
        "results": [
            {"success": True, "expectation_config": {"type": kind, "kwargs": kwargs}, "result": {}}
            for kind, kwargs in suite
        ],
        "statistics": {
            "evaluated_expectations": len(suite),
            "successful_expectations": len(suite),
            "unsuccessful_expectations": 0,
            "success_percent": 100.0,
        },
        "meta": {"evaluated_by": "pandas: every expectation held (great-expectations runs the suite when one fails)"},
    }


def _with_great_expectations(frame: pd.DataFrame, suite: list[tuple[str, dict]]) -> ValidationReport:
    """``suite`` run by great-expectations on ``frame``."""
    import logging
    import warnings

    with warnings.catch_warnings():  # GX imports pyspark when installed, which warns about pandas 3
        warnings.filterwarnings("ignore", message="PySpark does not yet fully support", category=FutureWarning)
        import great_expectations as gx
        import great_expectations.expectations as gxe

    # GX logs INFO lines (a temporary docs folder on every context) that would reach a root handler
    # another library installed (torch's pt2 loading does): the gate prints its own result
    # (its module great_expectations.data_context.types.base sets its own logger to INFO)
    logging.getLogger("great_expectations.data_context.types.base").setLevel(logging.WARNING)
    context = gx.get_context(mode="ephemeral")
    _quiet(context)
    asset = context.data_sources.add_pandas("consistency_gate").add_dataframe_asset("evaluation")
    batch = asset.add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame})
    gx_suite = gx.ExpectationSuite(name="evaluation_data")
    for kind, kwargs in suite:
        gx_suite.add_expectation(getattr(gxe, "".join(word.title() for word in kind.split("_")))(**kwargs))
    result = batch.validate(gx_suite)
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
