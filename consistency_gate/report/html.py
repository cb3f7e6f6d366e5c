"""HTML pages rendered from the Jinja2 templates in ``report/templates``: the gate's report
(``check --format html``, ``gate/report.html`` in the run) and ``diagnose --format html``. Both share
the layout, the table macro and the diagnosis section; the tables' rows are the text tables' own
(:mod:`consistency_gate.report.verdict` and its neighbours), so every format shows the same numbers.
"""

from __future__ import annotations

import base64

from consistency_gate.report.diagnose import diagnose_sections
from consistency_gate.report.slices import CLASS_FLIP_HEADER, SLICE_HEADER
from consistency_gate.report.text import fmt
from consistency_gate.report.verdict import ATTEMPT_HEADER, RULE_HEADER, Verdict, beside_lines


def gate_html(
    report: dict, pngs: dict[str, bytes], classes: list[list] | None = None, diagnosis: dict | None = None
) -> str:
    """The gate's report as one self-contained HTML page: verdict, rules (and the remediation's),
    metrics with intervals, the classes with the most negative flips (``classes``, rows of
    :func:`~consistency_gate.report.slices.flips_by_class`), slices, the plots (``pngs``) and the
    two-generation ``diagnosis``.

    >>> report = {"candidate": {"name": "clf", "version": "2"}, "baseline": {"version": "1", "alias": "champion"},
    ...     "n": 600, "verdict": "failed", "outcome": "failed", "null_reasons": {}, "run_id": "abc", "confidence": 0.95,
    ...     "metrics": {"ctoi": 0.025}, "intervals": {"ctoi": [0.015, 0.041]}, "rules": [{"metric": "ctoi",
    ...     "condition": "<= 0.02", "value": 0.025, "interval": [0.015, 0.041], "held": False, "note": ""}]}
    >>> page = gate_html(report, {})
    >>> "<td class=\\"FAILED\\">FAILED</td>" in page, "<title>consistency-gate: clf v2 FAILED</title>" in page
    (True, True)
    """
    view = Verdict.of(report)
    intervals, reasons = report.get("intervals", {}), report.get("null_reasons", {})
    metrics = [
        [key, value, _interval(intervals.get(key)), reasons.get(key, "")] for key, value in report["metrics"].items()
    ]
    return _render(
        "gate.html.j2",
        report=report,
        view=view,
        links=report.get("links") or {},
        rule_header=RULE_HEADER,
        attempt_header=ATTEMPT_HEADER,
        metrics=metrics,
        beside=beside_lines(report),
        class_header=CLASS_FLIP_HEADER,
        classes=classes or [],
        slice_header=SLICE_HEADER,
        images=_images(pngs),
        diagnosis=diagnosis,
        diagnosis_sections=diagnose_sections(diagnosis) if diagnosis else [],
    )


def diagnose_html(report: dict, pngs: dict[str, bytes]) -> str:
    """The ``diagnose --format html`` page: the plots, findings and tables of a diagnose report.

    >>> from consistency_gate.diagnostics.diagnose import diagnose
    >>> import numpy as np
    >>> probs = np.array([[[0.9, 0.1], [0.8, 0.2], [0.3, 0.7]], [[0.6, 0.4], [0.3, 0.7], [0.4, 0.6]]])
    >>> page = diagnose_html(diagnose(["a", "b"], probs, np.array([0, 1, 1]), ["x", "y"]), {})
    >>> page.startswith("<!doctype html>"), "<th>member</th>" in page
    (True, True)
    """
    return _render(
        "diagnose.html.j2",
        diagnosis=report,
        diagnosis_sections=diagnose_sections(report),
        images=_images(pngs),
        links={},
    )


def _interval(pair: list[float] | None) -> str:
    return f"[{fmt(pair[0])}, {fmt(pair[1])}]" if pair else ""


def _images(pngs: dict[str, bytes]) -> list[tuple[str, str]]:
    """(caption, data URI) per PNG: the page needs no other file."""
    return [
        (name.removesuffix(".png").replace("_", " "), "data:image/png;base64," + base64.b64encode(png).decode())
        for name, png in pngs.items()
    ]


def _render(template: str, **context: object) -> str:
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    env = Environment(
        loader=PackageLoader("consistency_gate.report", "templates"),
        autoescape=select_autoescape(["html", "j2"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["cell"] = fmt
    return env.get_template(template).render(**context)
