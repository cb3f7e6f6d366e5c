"""Slices in a report: the worst slices first, with their per-slice rules, and the flips by true class."""

from __future__ import annotations

from typing import TYPE_CHECKING

from consistency_gate.report.text import fmt

if TYPE_CHECKING:
    import pandas as pd

SLICES_SHOWN = 10  # the worst slices a verdict shows (all of them are in the report and the run)


SLICE_HEADER = ["slice", "n", "ctoi", "con", "acc (candidate)", "per-slice rules"]


def worst_slices(report: dict) -> list[dict]:
    """The report's slices, worst first: those failing a per-slice rule, then by CtoI (highest
    first), then by the candidate's accuracy (lowest first).

    >>> report = {"rules": [], "slices": [
    ...     {"column": "region", "value": "eu", "n": 90, "metrics": {"ctoi": 0.01, "acc_candidate": 0.9}},
    ...     {"column": "region", "value": "us", "n": 80, "metrics": {"ctoi": 0.04, "acc_candidate": 0.8}}]}
    >>> [s["value"] for s in worst_slices(report)]
    ['us', 'eu']
    """
    failing = _slice_outcomes(report)

    def key(s: dict) -> tuple:
        outcome = failing.get(_slice_name(s), {})
        ctoi, acc = s["metrics"].get("ctoi"), s["metrics"].get("acc_candidate")
        return (
            not any(held is False for held in outcome.values()),
            -(ctoi if ctoi is not None else -1.0),
            acc if acc is not None else 2.0,
        )

    return sorted(report.get("slices") or [], key=key)


def _slice_name(s: dict) -> str:
    return f"{s['column']}={s['value']}"


def _slice_outcomes(report: dict) -> dict[str, dict[str, bool | None]]:
    """For each slice name, each per-slice rule's outcome on it: ``{"region=eu": {"ctoi <= 0.05 ...": False}}``
    (a slice too small to judge has no entry)."""
    outcomes: dict[str, dict[str, bool | None]] = {}
    for r in report.get("rules") or []:
        for row in r.get("slices") or []:
            outcomes.setdefault(row["slice"], {})[f"{r['metric']} {r['condition']}"] = row["held"]
    return outcomes


def slice_rows(report: dict) -> list[list]:
    """The :data:`SLICES_SHOWN` worst slices' rows (:data:`SLICE_HEADER`), as every verdict shows them."""
    return [_slice_row(report, s) for s in worst_slices(report)[:SLICES_SHOWN]]


def flips_by_class(samples: pd.DataFrame, top: int = 10) -> list[list]:
    """The classes with the most negative flips: class, samples, CtoI, ItoC, CtoI share of the class
    (:data:`CLASS_FLIP_HEADER`), most CtoI first, from a flip table (``label`` and ``flip`` columns).

    >>> import pandas as pd
    >>> flips_by_class(pd.DataFrame({"label": ["a", "a", "b", "b"], "flip": ["CtoI", "CtoC", "ItoC", "CtoC"]}))
    [['a', 2, 1, 0, 0.5], ['b', 2, 0, 1, 0.0]]
    """
    import pandas

    labels = samples["label"].astype(str)
    counts = pandas.crosstab(labels, samples["flip"]).reindex(columns=["CtoI", "ItoC"], fill_value=0)
    sizes = labels.value_counts()
    order = sorted(counts.index, key=lambda c: (-counts.at[c, "CtoI"], -counts.at[c, "CtoI"] / sizes[c], c))
    return [
        [c, int(sizes[c]), int(counts.at[c, "CtoI"]), int(counts.at[c, "ItoC"]), float(counts.at[c, "CtoI"] / sizes[c])]
        for c in order[:top]
    ]


CLASS_FLIP_HEADER = ["class", "samples", "CtoI", "ItoC", "CtoI share of class"]


def _slice_row(report: dict, s: dict) -> list:
    """slice, n, CtoI and CON with their intervals, the candidate's accuracy, the per-slice rules' outcomes."""

    def with_interval(key: str) -> str:
        value, interval = s["metrics"].get(key), s.get("intervals", {}).get(key)
        if value is None:
            return "-"
        return fmt(value) + (f" [{fmt(interval[0])}, {fmt(interval[1])}]" if interval else "")

    outcome = _slice_outcomes(report).get(_slice_name(s), {})
    judged = ", ".join(f"{rule}: {'held' if held else 'FAILED'}" for rule, held in outcome.items())
    rules = report.get("rules") or []
    sizes = [r["min_slice_size"] for r in rules if r.get("per_slice") and r["held"] is not None]
    if not judged and sizes and s["n"] < min(sizes):
        judged = f"not judged (n < {min(sizes)})"
    row = [_slice_name(s), s["n"], with_interval("ctoi"), with_interval("con"), with_interval("acc_candidate")]
    return row + ([judged] if rules else [])


def slices_markdown(report: dict) -> list[str]:
    """The worst slices as Markdown table lines (the verdict's Markdown shows them)."""
    lines = ["| " + " | ".join(SLICE_HEADER) + " |", "|" + " --- |" * len(SLICE_HEADER)]
    for row in slice_rows(report):
        lines.append("| " + " | ".join(fmt(c) for c in row) + " |")
    return lines
