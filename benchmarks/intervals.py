"""Means over seeds or splits with a 95% t interval, and Markdown tables, shared by the benchmarks that
repeat a setup."""

from __future__ import annotations

import numpy as np


def t_interval(values: list[float | None], level: float = 0.95) -> tuple[float, float, float] | None:
    """(mean, low, high) of the values that are not None; the interval is the mean alone for one value,
    None for none.

    >>> [round(v, 3) for v in t_interval([1.0, 2.0, 3.0, None])]
    [2.0, -0.484, 4.484]
    """
    from scipy import stats

    present = [v for v in values if v is not None]
    if not present:
        return None
    mean = float(np.mean(present))
    if len(present) < 2:
        return mean, mean, mean
    half = float(stats.t.ppf(0.5 + level / 2, len(present) - 1) * np.std(present, ddof=1) / np.sqrt(len(present)))
    return mean, mean - half, mean + half


def format_interval(values: list[float | None], digits: int = 4, signed: bool = False) -> str:
    """'mean [low, high]' (with signs for differences), or 'null' when no value is present.

    >>> format_interval([0.1, 0.3], digits=2, signed=True)
    '+0.20 [-1.07, +1.47]'
    """
    found = t_interval(values)
    if found is None:
        return "null"
    spec = f"{'+' if signed else ''}.{digits}f"
    mean, low, high = found
    return f"{mean:{spec}} [{low:{spec}}, {high:{spec}}]"


def markdown_table(rows: list[list[object]], header: list[str]) -> str:
    """A GitHub Markdown table (``|`` in a cell escaped).

    >>> print(markdown_table([["a", 1]], ["name", "n"]))
    | name | n |
    |---|---|
    | a | 1 |
    """

    def line(cells: list[object]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(r) for r in rows)])
