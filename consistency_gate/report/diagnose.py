"""``consistency-gate diagnose``'s tables: why an ensemble helps or does not, in numbers and words."""

from __future__ import annotations

from consistency_gate.report.text import table

# two different debiasing shares, named apart: the decomposition's is over the members' probabilities (the
# Brier diversity), the collusion check's over their centred log-probabilities (the score-space outputs)
DECOMPOSITION_LABELS = {"debiasing_share": "debiasing share (probabilities)"}


def diagnose_sections(report: dict) -> list[tuple[str, list[str], list[list]]]:
    """The ``diagnose`` report's tables as (title, header, rows): the text, the HTML page and the
    gate's HTML report show the same tables.

    >>> sections = diagnose_sections({"members": {"a": {"acc": 0.9}}, "pairs": {}, "ensemble_acc": {},
    ...     "oracle_upper_bound": 0.95, "diversity": {}, "diversity_null_reasons": {}, "decomposition": {}})
    >>> [title for title, _, _ in sections]
    ['Members', 'Pairs', 'Ensembles', 'Diversity', 'Decomposition']
    """
    sections = [
        ("Members", ["member", "acc"], [[k, v["acc"]] for k, v in report["members"].items()]),
        (
            "Pairs",
            ["pair", "con", "acc_con", "ctoi", "itoc", "pearson", "both right", "only 1st", "only 2nd", "both wrong"],
            [
                [k, v["con"], v["acc_con"], v["ctoi"], v["itoc"], v["pearson"], *v["table"].values()]
                for k, v in report["pairs"].items()
            ],
        ),
        (
            "Ensembles",
            ["ensemble rule", "acc"],
            [[k, v] for k, v in report["ensemble_acc"].items()] + [["oracle bound", report["oracle_upper_bound"]]],
        ),
        (
            "Diversity",
            ["diversity", "value", "note"],
            [[k, v, report["diversity_null_reasons"].get(k, "")] for k, v in report["diversity"].items()],
        ),
        (
            "Decomposition",
            ["decomposition", "value"],
            [[DECOMPOSITION_LABELS.get(k, k), v] for k, v in report["decomposition"].items()],
        ),
    ]
    collusion = report.get("collusion") or {}
    rows = [
        [part, numbers["div"], numbers["div_share"], numbers["debiasing_share_logits"]]
        for part, numbers in collusion.items()
        if part != "warnings" and numbers is not None
    ]
    if rows:
        header = ["set", "DIV", "DIV / member loss", "debiasing share (log-probabilities)"]
        sections.append(("Collusion (Jeffares et al. 2023)", header, rows))
    if report.get("selection"):
        rows = [
            [
                r["method"],
                r["teams_considered"],
                r["teams_selected"],
                r["acc_min"],
                r["acc_max"],
                r["above_best_single"],
                r["share_above_best_single"],
            ]
            for r in report["selection"]["rows"]
        ]
        header = ["method", "#EnsSet", "#GEnsSet", "acc min", "acc max", "# > best single", "share > best"]
        sections.append(("Team selection", header, rows))
    return sections


def diagnose_text(report: dict) -> str:
    """The ``diagnose --format table`` output.

    >>> from consistency_gate.diagnostics.diagnose import diagnose
    >>> import numpy as np
    >>> probs = np.array([[[0.9, 0.1], [0.8, 0.2], [0.3, 0.7]], [[0.6, 0.4], [0.3, 0.7], [0.4, 0.6]]])
    >>> report = diagnose(["a", "b"], probs, np.array([0, 1, 1]), ["x", "y"])
    >>> diagnose_text(report).splitlines()[0]
    'n = 3 samples, 2 classes'
    """
    tables = [table(rows, header) for _, header, rows in diagnose_sections(report)]
    findings = "Findings:\n" + "\n".join(f"- {line}" for line in report["explanation"])
    parts = [f"n = {report['n']} samples, {report['classes']} classes", *tables[:5], findings, *tables[5:]]
    return "\n\n".join(parts)
