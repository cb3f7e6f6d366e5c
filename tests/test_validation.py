"""The evaluation data's expectations evaluated in pandas agree with great-expectations on the same suite:
generated tables with missing columns, nulls, labels of other types or outside the classes, empty tables and
arrays of the wrong size (hypothesis), each expectation compared with GX's own verdict on it. A suite every
expectation of which holds never loads great-expectations; one that fails is GX's report."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consistency_gate.io.validation import _with_great_expectations, expectations, holds, validate_evaluation_data

LABELS = st.one_of(
    st.sampled_from(["a", "b", "c"]), st.sampled_from([0, 1, 2]), st.none(), st.just(float("nan"))
)  # fmt: skip


@st.composite
def tables(draw):  # noqa: ANN001, ANN201
    rows = draw(st.integers(0, 6))
    frame = pd.DataFrame({"x": draw(st.lists(st.floats(-5, 5), min_size=rows, max_size=rows))})
    if draw(st.booleans()):
        frame["label"] = pd.Series(draw(st.lists(LABELS, min_size=rows, max_size=rows)), dtype=object)
    if draw(st.booleans()):
        sizes = st.one_of(st.none(), st.integers(1, 4))
        frame["image"] = [
            None if n is None else np.zeros(n) for n in draw(st.lists(sizes, min_size=rows, max_size=rows))
        ]
    features = {"x": "double", **({"y": "double"} if draw(st.booleans()) else {})}
    classes = draw(st.one_of(st.none(), st.just(["a", "b"]), st.just([0, 1])))
    arrays = {"image": draw(st.one_of(st.none(), st.integers(1, 4)))} if draw(st.booleans()) else {}
    return frame, features, classes, arrays


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables())
def test_each_expectation_holds_in_pandas_exactly_where_great_expectations_says_so(table):
    frame, features, classes, arrays = table
    sizes = {f"{name}.size": name for name in arrays if name in frame.columns}
    if sizes:
        frame = frame.assign(
            **{size: frame[name].map(lambda v: None if v is None else int(v.size)) for size, name in sizes.items()}
        )
    suite = expectations(frame, "label", features, classes, arrays)
    checked = _with_great_expectations(frame, suite).result["results"]
    assert len(checked) == len(suite)
    for (kind, kwargs), result in zip(suite, checked, strict=True):
        assert result["expectation_config"]["type"] == kind
        assert holds(frame, kind, kwargs) == result["success"], (kind, kwargs, frame)


def test_a_suite_that_holds_is_reported_without_loading_great_expectations_and_one_that_fails_by_it(tmp_path):
    script = tmp_path / "validate.py"  # a file: pyspark, which GX imports, ends a `python -c` process at its import
    script.write_text("""
import sys
import pandas as pd
from consistency_gate.io.validation import validate_evaluation_data
frame = pd.DataFrame({"x": [1.0, 2.0], "label": ["a", "b"]})
report = validate_evaluation_data(frame, "label", {"x": "double"}, ["a", "b"])
print(report.success, len(report.result["results"]), "great_expectations" in sys.modules)
report = validate_evaluation_data(frame.assign(label=["a", "z"]), "label", {"x": "double"}, ["a", "b"])
print(report.success, report.failures[0].split("(")[0], "great_expectations" in sys.modules)
""")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stdout
    said = [line for line in out.splitlines() if line.startswith(("True", "False"))]  # GX prints blank lines
    assert said == ["True 4 False", "False expect_column_values_to_be_in_set True"]


def test_the_report_of_a_suite_that_holds_names_each_expectation():
    frame = pd.DataFrame({"x": [1.0], "label": ["a"]})
    report = validate_evaluation_data(frame, "label", {"x": "double"}, ["a"])
    types = [r["expectation_config"]["type"] for r in report.result["results"]]
    assert report.success and report.result["statistics"]["successful_expectations"] == len(types) == 4
    assert "pandas" in report.result["meta"]["evaluated_by"]
