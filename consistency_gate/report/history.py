"""``consistency-gate history``'s table: the champions' updates, their negative flips with intervals."""

from __future__ import annotations

from collections.abc import Sequence

from consistency_gate.report.text import fmt, fmt_share, markdown_safe, table

HISTORY_HEADER = ["update", "samples", "negative flips", "NFR", "accuracy"]


def history_table(report: dict) -> str:
    """``consistency-gate history`` as text: each update of the champion, the sums, the newest candidate.

    >>> step = {"previous": "1", "version": "2", "n": 100, "negative_flips": 3, "nfr": 0.03,
    ...     "nfr_interval": [0.0103, 0.0846], "accuracy": 0.9, "accuracy_interval": [0.8256, 0.9448]}
    >>> print(history_table({"model": "clf", "champions": ["1", "2"], "steps": [step], "missing": [],
    ...     "cumulative_negative_flips": 3, "ever_regressed": 0.03, "samples": 100, "confidence": 0.95,
    ...     "newest_candidate": {"version": "3", "against": ["1", "2"], "forgotten": 0.05}}))
    clf: 2 champions in the order they were promoted, v1 -> v2 (intervals at 95%)
    update  samples  negative flips  NFR                      accuracy
    ------  -------  --------------  -----------------------  -----------------------
    v1->v2  100      3               0.0300 [0.0103, 0.0846]  0.9000 [0.8256, 0.9448]
    Cumulative negative flips: 3 over 1 update; 3.0% of 100 samples ever regressed.
    Newest candidate v3 forgets 5.0% (right under one of v1, v2, wrong now).
    """
    title, rows, lines = _history_parts(report)
    return "\n".join([title, table(rows, HISTORY_HEADER), *lines])


def history_markdown(report: dict) -> str:
    """``consistency-gate history --format markdown``: the same words as :func:`history_table`, for a CI
    job summary; names escaped.

    >>> print(history_markdown({"model": "a|b", "champions": ["1"], "steps": [], "missing": [],
    ...     "cumulative_negative_flips": 0, "ever_regressed": None, "samples": 0, "confidence": 0.95,
    ...     "newest_candidate": {"version": "1", "against": [], "forgotten": None}}), end="")
    ## consistency-gate history: a\\|b: 1 champion in the order they were promoted, v1 (intervals at 95%)
    <BLANKLINE>
    | update | samples | negative flips | NFR | accuracy |
    | --- | --- | --- | --- | --- |
    <BLANKLINE>
    Cumulative negative flips: none counted, one champion and no update yet.
    """
    title, rows, lines = _history_parts(markdown_safe(report))
    out = [f"## consistency-gate history: {title}", "", "| " + " | ".join(HISTORY_HEADER) + " |"]
    out += ["|" + " --- |" * len(HISTORY_HEADER)]
    out += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join([*out, "", *lines]) + "\n"


def _history_parts(report: dict) -> tuple[str, list[list], list[str]]:
    """The title, the table's rows and the closing lines of a history report."""
    rows = [
        [
            f"v{s['previous']}->v{s['version']}",
            s["n"],
            s["negative_flips"],
            f"{fmt(s['nfr'])} {_bracket(s['nfr_interval'])}",
            f"{fmt(s['accuracy'])} {_bracket(s['accuracy_interval'])}",
        ]
        for s in report["steps"]
    ]
    held = len(report["champions"])
    title = (
        f"{report['model']}: {held} champion{'s' if held != 1 else ''} in the order they were promoted, "
        f"{' -> '.join(f'v{v}' for v in report['champions'])} (intervals at {report['confidence']:.0%})"
    )
    updates = len(report["steps"])
    regressed = (  # none without an update to count
        f"; {fmt_share(report['ever_regressed'])} of {report['samples']} samples ever regressed"
        if report["ever_regressed"] is not None
        else ""
    )
    lines = [
        f"Cumulative negative flips: {report['cumulative_negative_flips']} over {updates} update"
        f"{'s' if updates != 1 else ''}{regressed}."
        if updates
        else f"Cumulative negative flips: none counted, {_why_no_update(report)}."
    ]
    newest = report["newest_candidate"]
    against = ", ".join(f"v{v}" for v in newest["against"])
    if newest["forgotten"] is not None:
        lines.append(
            f"Newest candidate v{newest['version']} forgets {fmt_share(newest['forgotten'])} "
            f"(right under one of {against}, wrong now)."
        )
    if report["missing"]:
        reasons = report.get("missing_reasons") or {}
        said = [f"v{v}" + (f" ({reasons[v]})" if v in reasons else "") for v in report["missing"]]
        lines.append(f"No usable answers for {'; '.join(said)}: the updates they take part in are left out.")
    for why in (report.get("unreadable") or {}).values():
        lines.append(f"Not read: {why}; what that run compared and promoted is unknown, so a champion may be missing.")
    return title, rows, lines


def _why_no_update(report: dict) -> str:
    """Why a history counts no update, in words.

    >>> _why_no_update({"champions": ["1"]})
    'one champion and no update yet'
    >>> _why_no_update({"champions": ["1", "2"], "gated": 0})[:45]
    'no gate ledger: v1 -> v2 were promoted by sha'
    """
    if len(report["champions"]) < 2:
        return "one champion and no update yet"
    if report.get("gated") == 0:
        return (
            "no gate ledger: v1 -> v2 were promoted by shadow checks or rollbacks, which log no per-sample answers; "
            "gate the next version with consistency-gate check to count its update"
        ).replace("v1 -> v2", " -> ".join(f"v{v}" for v in report["champions"]))
    return "no two champions in a row have answers in a usable ledger (see below)"


def _bracket(interval: Sequence[float] | None) -> str:
    return f"[{interval[0]:.4f}, {interval[1]:.4f}]" if interval else ""
