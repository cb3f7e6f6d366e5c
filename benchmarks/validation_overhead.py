"""Data validation's cost: the gate's great-expectations suite against one expectation per column.

    python benchmarks/validation_overhead.py [--repeat 3] [--rows 600]

GX evaluates each expectation on its own (a few milliseconds each), so a suite with an existence
and a type expectation per feature column grows with the width of the data: 64 pixel columns
(digits) or 784 (28x28 images) cost seconds to a minute per gate. The gate's suite
(:func:`consistency_gate.io.validation.validate_evaluation_data`) checks the columns with one
table-level expectation and adds a type expectation only where pandas' dtype does not fit. Both
run alternately on the same frame of 10, 64 and 784 feature columns; the script prints each one's
median and the ratio (the gate's other phases are measured in ``benchmarks/gate_overhead.py``).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np
import pandas as pd

from consistency_gate.io.validation import validate_evaluation_data


def per_column_suite(frame: pd.DataFrame, label_column: str, features: dict[str, str], classes: list[str]) -> bool:
    """The baseline: the suite as it was, an existence and a type expectation per feature column."""
    import great_expectations as gx
    import great_expectations.expectations as gxe
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    asset = context.data_sources.add_pandas("baseline").add_dataframe_asset("evaluation")
    batch = asset.add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame})
    suite = gx.ExpectationSuite(name="per_column")
    suite.add_expectation(gxe.ExpectTableRowCountToBeBetween(min_value=1))
    suite.add_expectation(gxe.ExpectColumnToExist(column=label_column))
    suite.add_expectation(gxe.ExpectColumnValuesToNotBeNull(column=label_column))
    suite.add_expectation(gxe.ExpectColumnValuesToBeInSet(column=label_column, value_set=classes))
    numeric = ["int8", "int16", "int32", "int64", "float16", "float32", "float64"]
    for name in features:
        suite.add_expectation(gxe.ExpectColumnToExist(column=name))
        suite.add_expectation(gxe.ExpectColumnValuesToBeInTypeList(column=name, type_list=numeric))
    return bool(batch.validate(suite).success)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rows", type=int, default=600)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    rng = np.random.default_rng(0)
    print(f"{args.rows} rows; median of {args.repeat} alternating runs each (after one warm-up)")
    print(f"{'feature columns':>16}  {'per column (s)':>14}  {'gate suite (s)':>14}  {'ratio':>6}")
    for width in (10, 64, 784):
        columns = [f"px{i}" for i in range(width)]
        frame = pd.DataFrame(rng.random((args.rows, width)), columns=columns)
        frame["label"] = [str(i % 10) for i in range(args.rows)]
        features = dict.fromkeys(columns, "double")
        classes = [str(i) for i in range(10)]
        times: dict[str, list[float]] = {"baseline": [], "ours": []}
        for i in range(args.repeat + 1):
            for name in ("baseline", "ours"):
                start = time.perf_counter()
                if name == "baseline":
                    ok = per_column_suite(frame, "label", features, classes)
                else:
                    ok = validate_evaluation_data(frame, "label", features, classes).success
                if i:  # the first round warms both up
                    times[name].append(time.perf_counter() - start)
                assert ok
        base, ours = statistics.median(times["baseline"]), statistics.median(times["ours"])
        print(f"{width:>16}  {base:>14.3f}  {ours:>14.3f}  {ours / base:>6.3f}")


if __name__ == "__main__":
    main()
