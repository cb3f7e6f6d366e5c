"""``consistency-gate compare``'s table: the metrics of two prediction files, with why a value is null."""

from __future__ import annotations

from consistency_gate.report.slices import SLICE_HEADER, slice_rows
from consistency_gate.report.text import table


def comparison_table(result: dict) -> str:
    """The ``compare --format table`` output from a comparison's JSON object.

    >>> result = {"n": 3, "classes": ["a", "b"], "unknown_labels": {"previous": 0, "candidate": 0},
    ...     "metrics": {"con": 0.6667, "pearson": None}, "null_reasons": {"pearson": "the candidate gave hard labels"}}
    >>> print(comparison_table(result))
    n = 3 samples, 2 classes; labels unknown to previous: 0, to candidate: 0
    <BLANKLINE>
    metric   value   note
    -------  ------  ------------------------------
    con      0.6667
    pearson  null    the candidate gave hard labels
    """
    reasons = result.get("null_reasons", {})
    rows = [[name, value, reasons.get(name, "")] for name, value in result["metrics"].items()]
    unknown = result["unknown_labels"]
    head = (
        f"n = {result['n']} samples, {len(result['classes'])} classes; "
        f"labels unknown to previous: {unknown['previous']}, to candidate: {unknown['candidate']}"
    )
    out = head + "\n\n" + table(rows, ["metric", "value", "note"])
    if result.get("slices"):
        rows = slice_rows(result)
        out += f"\n\nSlices, worst first ({len(result['slices'])} in all):\n" + table(rows, SLICE_HEADER[:-1])
    return out
