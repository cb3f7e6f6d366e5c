"""``consistency-gate check``'s verdict for people: the headline that never reads as a pass when the candidate
failed, the rule table, what was built in its place (remediation's attempts), its cost, in text and Markdown."""

from __future__ import annotations

from dataclasses import dataclass

from consistency_gate.report.slices import SLICE_HEADER, slice_rows, slices_markdown
from consistency_gate.report.text import fmt, fmt_share, markdown_safe, milliseconds, printable, table


def generation_name(ref: dict) -> str:
    """A generation as a verdict names it: ``v3 (@champion)``, ``v4``, or its prediction file.

    >>> files = {"version": None, "predictions": "g.csv"}
    >>> generation_name({"version": "3", "alias": "champion"}), generation_name(files)
    ('v3 (@champion)', 'g.csv')
    """
    if ref.get("version") is None:
        return str(ref.get("predictions"))
    return f"v{ref['version']}" + (f" (@{ref['alias']})" if ref.get("alias") else "")


def verdict_headline(report: dict) -> str:
    """What the gate decided, in a line that never reads as if a failed candidate passed.

    >>> cand = {"name": "clf", "version": "2"}
    >>> verdict_headline({"candidate": cand, "verdict": "passed", "outcome": "passed"})
    'clf v2 PASSED'
    >>> ens = {"described": {"noun": "ensemble", "title": "", "served": ""}}
    >>> verdict_headline({"candidate": cand, "verdict": "passed", "outcome": "remediated", "registered_version": "3",
    ...     "ensemble": ens})
    'clf v2 FAILED; the ensemble v3 PASSED in its place'
    >>> verdict_headline({"candidate": cand, "verdict": "failed", "candidate_verdict": "passed", "outcome": "failed",
    ...     "ensemble": {"described": {"noun": "memory", "title": "", "served": ""}}})
    'clf v2 PASSED; the memory FAILED, so nothing deploys'
    """
    cand = report["candidate"]
    name = f"{cand['name']} {generation_name(cand)}"
    alone = report.get("candidate_verdict", "failed").upper()
    if report.get("outcome") == "remediated":
        noun = described(report.get("ensemble") or {})["noun"]
        return f"{name} {alone}; the {noun} v{report['registered_version']} PASSED in its place"
    if alone == "PASSED" and report["verdict"] == "failed":  # what deploys with every candidate failed
        return f"{name} PASSED; the {described(report.get('ensemble') or {})['noun']} FAILED, so nothing deploys"
    return f"{name} {report['verdict'].upper()}"


def described(remedy: dict) -> dict:
    """What remediation built, in words, as its method described it (the report's ``described``:
    ``noun``, ``title``, ``served``); a report written before methods described themselves says the method.

    >>> described({"method": "rerank", "described": {"noun": "rerank repair", "title": "t", "served": "s"}})["noun"]
    'rerank repair'
    >>> described({"method": "dynsnap-cyc"})["title"]
    'dynsnap-cyc'
    """
    if remedy.get("described"):
        return remedy["described"]
    method = remedy.get("method", "remediation")
    return {"noun": method, "title": method, "served": f"the {method}"}


@dataclass
class VerdictSection:
    """One thing the gate judged (the candidate, or what remediation built): its title, verdict and rule rows."""

    title: str
    verdict: str  # PASSED or FAILED
    rules: list[list]  # rule_row() of each rule


@dataclass
class Verdict:
    """What a gate decided, in the words every format uses: the text table, the Markdown summary
    (CI job summaries, the run's description) and the HTML report render this one model, so they
    never say it differently.

    >>> report = {"candidate": {"name": "clf", "version": "2"}, "baseline": {"version": "1", "alias": "champion"},
    ...     "n": 600, "verdict": "failed", "outcome": "failed", "null_reasons": {}, "run_id": "abc123",
    ...     "rules": [{"metric": "ctoi", "condition": "<= 0.02", "value": 0.025, "interval": [0.015, 0.041],
    ...     "held": False, "note": ""}], "promotion": None, "promoted": False}
    >>> view = Verdict.of(report)
    >>> view.headline, view.compared(), [(s.title, s.verdict) for s in view.sections]
    ('clf v2 FAILED', 'Gate clf v2 against v1 (@champion) on 600 samples', [('The candidate', 'FAILED')])
    """

    headline: str  # verdict_headline(): the final word, never reading as if a failed candidate passed
    gated: str  # the candidate: "clf v2", or the name and prediction file
    against: str  # the baseline: "v1 (@champion)", or "no baseline: first generation"
    n: int
    nothing: str | None  # why there was nothing to decide, or None
    sections: list[VerdictSection]
    cost: str  # cost_line(): what the repair costs to serve beside what it buys ("" without one)
    registered: str | None  # "Registered the ensemble as v3 (tags ...)."
    attempts: list[list]  # attempt_rows()
    slices: list[list]  # slice_rows()
    promotion: str | None  # "Promoted: @champion now points to v3 (read back)." or "Not promoted: <why>."
    run_id: str | None
    warnings: list[str]  # what the reviewer should know beyond the rules (a candidate identical to its baseline)

    @classmethod
    def of(cls, report: dict) -> Verdict:
        """The verdict of a gate's JSON report."""
        cand, base = report["candidate"], report.get("baseline")
        rules = report["rules"]
        nothing = report["null_reasons"].get("*") if not rules else None
        sections = []
        if rules:
            single = "FAILED" if any(blocking(r) for r in rules) else "PASSED"
            sections.append(VerdictSection("The candidate", single, [rule_row(r) for r in rules]))
        ens, registered = report.get("ensemble"), None
        if ens:
            title = f"Remediation: {described(ens)['title']}"
            sections.append(VerdictSection(title, ens["verdict"].upper(), [rule_row(r) for r in ens["rules"]]))
            if ens.get("registered_version"):
                registered = (
                    f"Registered the {described(ens)['noun']} as v{ens['registered_version']} (tags "
                    f"consistency_gate.kind={ens.get('kind', 'ensemble')}, consistency_gate.verdict=passed)."
                )
        promotion = report.get("promotion")
        if promotion:
            promotion = (
                f"Promoted: @{promotion['alias']} now points to v{promotion['holds']} (read back)."
                if report.get("promoted")
                else f"Not promoted: {promotion['reason']}."
                if report.get("promoted") is False
                else f"Promotion unknown: {promotion['reason']}."
            )
        return cls(
            headline=verdict_headline(report) if not nothing else f"{cand['name']} {generation_name(cand)}",
            gated=f"{cand['name']} {generation_name(cand)}",
            against=generation_name(base) if base else "no baseline: first generation",
            n=report["n"],
            nothing=nothing,
            sections=sections,
            cost=cost_line(report),
            registered=registered,
            attempts=attempt_rows(report),
            slices=slice_rows(report) if report.get("slices") else [],
            promotion=promotion,
            run_id=report.get("run_id"),
            warnings=list(report.get("warnings") or []),
        )

    def compared(self, gated: str | None = None, against: str | None = None) -> str:
        """ "Gate <candidate> against <baseline> on <n> samples" (the names as given, e.g. as links)."""
        return f"Gate {gated or self.gated} against {against or self.against} on {self.n:,} samples"

    @property
    def nothing_line(self) -> str:
        """The line for a gate with nothing to decide."""
        return f"{self.gated}: nothing to decide: {self.nothing}; nothing was gated, tagged or promoted."


def verdict_table(report: dict) -> str:
    """The gate's verdict as text: the rule tables, then the final word.

    >>> report = {"candidate": {"name": "clf", "version": "2"}, "baseline": {"version": "1", "alias": "champion"},
    ...     "n": 600, "verdict": "failed", "null_reasons": {}, "run_id": "abc123", "rules": [{"metric": "ctoi",
    ...     "condition": "<= 0.02", "value": 0.025, "interval": [0.015, 0.041], "held": False, "false_pass": 0.58,
    ...     "note": ""}]}
    >>> print(verdict_table(report))
    Gate clf v2 against v1 (@champion) on 600 samples: FAILED
    <BLANKLINE>
    rule          value                    outcome  false pass  note
    ------------  -----------------------  -------  ----------  ----
    ctoi <= 0.02  0.0250 [0.0150, 0.0410]  FAILED   58.0%
    <BLANKLINE>
    False pass: the chance that a model exactly at a rule's threshold passes it on this many samples; ...
    <BLANKLINE>
    MLflow run: abc123
    """
    view = Verdict.of(report)
    if view.nothing:
        return f"Gate {view.nothing_line}"
    lines = []
    for number, section in enumerate(view.sections):
        title = view.compared() if number == 0 else section.title
        lines += [*([""] if lines else []), f"{title}: {section.verdict}", "", table(section.rules, RULE_HEADER)]
        if number == 0:
            lines += [f"\n{line}" for line in [decision_line(report.get("decision")), *beside_lines(report)] if line]
            lines += [f"\nWarning: {printable(warning)}." for warning in view.warnings]
    lines += [f"\n{line}" for line in (view.cost, view.registered) if line]
    if view.attempts:
        lines += ["", "Remediation attempts, in the order tried:", table(view.attempts, ATTEMPT_HEADER)]
    if view.slices:
        lines += ["", f"Slices, worst first ({len(report['slices'])} in all):", table(view.slices, SLICE_HEADER)]
    if len(view.sections) > 1:
        lines.append(f"\nFinal verdict: {view.headline}")
    if view.promotion:
        lines.append(f"\n{view.promotion}")
    if view.run_id:
        url = (report.get("links") or {}).get("run")
        lines.append(f"\nMLflow run: {view.run_id}" + (f" ({url})" if url else ""))
    return "\n".join(lines)


def beside_lines(report: dict) -> list[str]:
    """The figures measured beside the comparison, in words: the seed-noise floor and the
    history metrics, each with its interval, what a false pass near 50% means, the top-k metrics that do not
    apply to the models' classes, and the samples held out to tune on (none without them).

    >>> report = {"metrics": {"floor_ctoi": 0.035, "floor_con": 0.95, "ctoi_excess": 0.031, "forgotten": 0.02},
    ...     "intervals": {"floor_ctoi": [0.025, 0.048], "floor_con": [0.93, 0.96], "ctoi_excess": [0.01, 0.05],
    ...     "forgotten": [0.012, 0.033]}}
    >>> floor, history = beside_lines(report)
    >>> print(floor.replace("; ", ";\\n"))
    Seed-noise floor: a replica of the baseline trained with another seed has CtoI 0.0350 [0.0250, 0.0480] and CON ...
    the candidate's CtoI exceeds the replica's by 0.0310 [0.0100, 0.0500] (ctoi_excess).
    >>> history
    'Over the champions: forgotten 0.0200 [0.0120, 0.0330].'
    >>> beside_lines({"rules": [{"metric": "ctoi", "decide": "upper", "false_pass": 0.04}]})  # bounded: nothing to say
    []
    >>> print(beside_lines({"null_reasons": {"ccon@5": "not applicable: k=5 is larger than the 2 classes of m"}})[0])
    Top-k: not applicable: k=5 is larger than the 2 classes of m: ccon@5, cacc_previous@5 and cacc_candidate@5 ...
    >>> samples = {"judged": 420, "tuning": 180, "tuning_share": 0.3, "held_out_by": "id", "tuning_ids": "ids.json"}
    >>> print(beside_lines({"samples": samples})[0])
    Samples: judged on 420; 180 held out to tune repairs on, never judged on (tuning_share 0.3, each sample by ...
    """
    metrics, intervals = report.get("metrics") or {}, report.get("intervals") or {}

    def shown(key: str) -> str:
        interval = intervals.get(key)
        return fmt(metrics.get(key)) + (f" [{interval[0]:.4f}, {interval[1]:.4f}]" if interval else "")

    lines = []
    if "ctoi_excess" in metrics:
        lines.append(
            f"Seed-noise floor: a replica of the baseline trained with another seed has CtoI {shown('floor_ctoi')} "
            f"and CON {shown('floor_con')} against it; the candidate's CtoI exceeds the replica's by "
            f"{shown('ctoi_excess')} (ctoi_excess)."
        )
    history = [f"{key} {shown(key)}" for key in ("forgotten", "cumulative_nfr") if key in metrics]
    if history:
        lines.append(f"Over the champions: {'; '.join(history)}.")
    loose = [r["metric"] for r in report.get("rules") or [] if r.get("decide", "estimate") == "estimate"
             and (r.get("false_pass") or 0) >= 0.2]  # fmt: skip
    if loose:
        lines.append(
            f"False pass: the chance that a model exactly at a rule's threshold passes it on this many samples; "
            f"about 50% for a rule judged on its estimate ({', '.join(dict.fromkeys(loose))}): add decide: upper "
            "(max) or lower (min) to a rule to bound it at 1 - confidence."
        )
    reasons = report.get("null_reasons") or {}
    for key in (k for k in reasons if k.startswith("ccon@") and reasons[k].startswith("not applicable")):
        k = key.split("@")[1]
        lines.append(f"Top-k: {reasons[key]}: ccon@{k}, cacc_previous@{k} and cacc_candidate@{k} are null.")
    samples = report.get("samples")
    if samples and samples["tuning"]:
        by = "its id" if samples["held_out_by"] == "id" else "its row number"
        lines.append(
            f"Samples: judged on {samples['judged']:,}; {samples['tuning']:,} held out to tune repairs on, never "
            f"judged on (tuning_share {samples['tuning_share']:g}, each sample by a hash of {by}; "
            f"{samples['tuning_ids']} lists them)."
        )
    return lines


def decision_line(decision: dict | None) -> str:
    """How a binary model's answers were taken, for the text report ('' for models of more classes).

    >>> decision_line({"positive": "fraud", "threshold": 0.2, "configured": True})
    "Binary answers: 'fraud' where P('fraud') >= 0.2, else the other class (the config's decision: block)."
    """
    if not decision:
        return ""
    where = "the config's decision: block" if decision["configured"] else "the default; set it with decision:"
    positive = repr(decision["positive"])
    threshold = f"{decision['threshold']:g}"
    return f"Binary answers: {positive} where P({positive}) >= {threshold}, else the other class ({where})."


def cost_line(report: dict) -> str:
    """What the remediation costs to serve beside what it buys, in one line ("" without an ensemble
    or a measured cost).

    >>> report = {"metrics": {"ctoi": 0.1, "con": 0.88}, "cost": {"latency_ms_per_1000": 10.0, "size_mb": 0.03},
    ...     "ensemble": {"members": 4, "metrics": {"ctoi": 0.02, "con": 0.95}, "cost": {"latency_ms_per_1000": 38.0,
    ...     "latency_ratio": 3.8, "size_mb": 0.12, "size_ratio": 4.0},
    ...     "described": {"served": "the ensemble of 4 members"}}}
    >>> print(cost_line(report))
    Serving cost: the ensemble of 4 members predicts in 38.0 ms per 1,000 samples (3.8x the candidate's 10.0 ms) ...
    >>> cost_line(report).endswith("(4.0x), for CtoI 0.1000 -> 0.0200 and CON 0.8800 -> 0.9500.")
    True
    """
    ens = report.get("ensemble")
    if not ens or ens.get("cost", {}).get("latency_ratio") is None:
        return ""
    single, ensemble = report["metrics"], ens["metrics"]
    cost, single_cost = ens["cost"], report.get("cost") or {}
    size = ""
    if cost.get("size_mb") is not None:
        ratio = f" ({cost['size_ratio']:.1f}x)" if cost.get("size_ratio") is not None else ""
        size = f" and takes {cost['size_mb']:.3g} MB on disk{ratio}"
    gains = [
        f"{label} {fmt(single[key])} -> {fmt(ensemble[key])}"
        for key, label in (("ctoi", "CtoI"), ("con", "CON"))
        if single.get(key) is not None and ensemble.get(key) is not None
    ]
    return (
        f"Serving cost: {described(ens)['served']} predicts in {milliseconds(cost['latency_ms_per_1000'])} per 1,000 "
        "samples "
        f"({cost['latency_ratio']:.1f}x the candidate's {milliseconds(single_cost['latency_ms_per_1000'])})"
        f"{size}" + (f", for {' and '.join(gains)}." if gains else ".")
    )


RULE_HEADER = ["rule", "value", "outcome", "false pass", "note"]


def blocking(rule: dict) -> bool:
    """Whether a rule as the report holds it (:meth:`RuleResult.to_dict`) fails the candidate: it failed
    and was not waived.

    >>> blocking({"held": False}), blocking({"held": False, "waived": "clearly better"}), blocking({"held": None})
    (True, False, False)
    """
    return rule["held"] is False and not rule.get("waived")


def outcome(rule: dict) -> str:
    """A rule's outcome as the rule tables word it: held, FAILED, waived or skipped.

    >>> [outcome({"held": h}) for h in (True, False, None)], outcome({"held": False, "waived": "clearly better"})
    (['held', 'FAILED', 'skipped'], 'waived')
    """
    if rule["held"]:
        return "held"
    if rule.get("waived"):  # failed, or (a live check) still open when the candidate was shown better
        return "waived"
    return "skipped" if rule["held"] is None else "FAILED"


def rule_row(r: dict) -> list:
    """A rule's row as every table shows it: the rule as it reads (``acc change >= -0.01`` for a
    min_delta rule, ``ctoi (worst slice) <= 0.05``), the value with its two-sided interval and the
    one-sided bound compared, the outcome, the false-pass rate (the chance that a model exactly at
    the threshold passes on a set of this size), the note.

    >>> rule_row({"metric": "acc", "quantity": "acc change", "condition": ">= -0.01", "value": -0.02,
    ...     "interval": None, "held": False, "note": ""})
    ['acc change >= -0.01', '-0.0200', 'FAILED', '', '']
    >>> rule_row({"metric": "ctoi", "condition": "<= 0.02 (upper bound)", "value": 0.0183, "decide": "upper",
    ...     "interval": [0.0102, 0.0312], "compared": 0.029, "held": False, "false_pass": 0.0443, "note": ""})[1:4]
    ['0.0183 [0.0102, 0.0312], bound 0.0290', 'FAILED', '4.4%']
    """
    value = fmt(r["value"])
    if r.get("interval") and r["value"] is not None:
        value += f" [{fmt(r['interval'][0])}, {fmt(r['interval'][1])}]"
    if r.get("decide", "estimate") != "estimate" and r.get("compared") is not None:
        value += f", bound {fmt(r['compared'])}"
    quantity = r.get("quantity", r["metric"]) + (
        " (worst slice)" if r.get("per_slice") and r["value"] is not None else ""
    )
    note = "; ".join(filter(None, [r.get("waived"), r.get("note", "")]))
    return [f"{quantity} {r['condition']}", value, outcome(r), fmt_share(r.get("false_pass")), note]


ATTEMPT_HEADER = ["method", "outcome", "CON", "CtoI", "acc", "members", "latency", "train s"]


def attempt_row(a: dict) -> list:
    """A remediation attempt's row (``strategy``): what it built, its outcome, what it buys and costs.

    >>> attempt_row({"method": "focal-distillation", "verdict": "failed", "con": 0.92, "ctoi": 0.068, "acc": 0.9,
    ...     "members": 1, "latency_ratio": 1.02, "train_seconds": 3.14159, "failed_rules": ["ctoi <= 0.02"]})
    ['focal-distillation', 'FAILED: ctoi <= 0.02', '0.9200', '0.0680', '0.9000', '1', '1.0x', '3.1']
    >>> attempt_row({"method": "focal-distillation", "verdict": "skipped", "note": "no previous generation"})
    ['focal-distillation', 'skipped: no previous generation', '', '', '', '', '', '']
    """
    if a["verdict"] == "skipped":
        return [a["method"], f"skipped: {a['note']}", "", "", "", "", "", ""]
    latency = f"{a['latency_ratio']:.1f}x" if a.get("latency_ratio") is not None else "null"
    outcome = {"passed": "passed", "rollback": "ROLLBACK, not registered"}.get(a["verdict"], "FAILED")
    if a["verdict"] == "failed" and a.get("failed_rules"):
        outcome += f": {'; '.join(a['failed_rules'])}"
    metrics = [fmt(a[k]) for k in ("con", "ctoi", "acc")]
    return [a["method"], outcome, *metrics, str(a["members"]), latency, f"{a['train_seconds']:.1f}"]


def attempt_line(a: dict) -> str:
    """An attempt in one line, as the gate prints it when it moves on to the next method.

    >>> attempt_line({"method": "m", "verdict": "failed", "con": 0.9, "ctoi": 0.07, "acc": 0.9, "members": 1,
    ...     "latency_ratio": 1.0, "train_seconds": 2.0, "itoc_kept": 0.75, "failed_rules": ["ctoi <= 0.02"]})
    'FAILED (CON 0.9000, CtoI 0.0700, acc 0.9000, ItoC kept 0.7500; 1 member, latency 1.0x, trained in 2.0 s): \
failed ctoi <= 0.02'
    """
    row = attempt_row({**a, "failed_rules": []})  # the outcome in a word; the rules it failed at the end
    if a["verdict"] == "skipped":
        return row[1]
    _, outcome, con, ctoi, acc, members, latency, seconds = row
    built = f"{members} member" + ("" if members == "1" else "s")
    kept = f", ItoC kept {fmt(a['itoc_kept'])}" if a.get("itoc_kept") is not None else ""
    line = f"{outcome} (CON {con}, CtoI {ctoi}, acc {acc}{kept}; {built}, latency {latency}, trained in {seconds} s)"
    if a["verdict"] == "failed" and a.get("failed_rules"):
        return f"{line}: failed {'; '.join(a['failed_rules'])}"
    return f"{line}: {a['note']}" if a["verdict"] == "rollback" and a.get("note") else line


def attempt_rows(report: dict) -> list[list]:
    """The attempts table's rows: one per remediation attempt, none unless several methods were tried.

    >>> attempt_rows({"attempts": [{"method": "dynsnap-cyc", "verdict": "skipped", "note": "n/a"}]})
    []
    """
    attempts = report.get("attempts") or []
    return [attempt_row(a) for a in attempts] if len(attempts) > 1 else []


def verdict_markdown(report: dict) -> str:
    """The verdict as Markdown, for a CI job summary (e.g. ``$GITHUB_STEP_SUMMARY``) and the run's
    description: the words of :class:`Verdict`, with links into the MLflow UI when the report has them.

    >>> report = {"candidate": {"name": "clf", "version": "2"}, "baseline": {"version": "1", "alias": "champion"},
    ...     "n": 600, "verdict": "failed", "null_reasons": {}, "run_id": "abc123", "rules": [{"metric": "ctoi",
    ...     "condition": "<= 0.02", "value": 0.025, "interval": [0.015, 0.041], "held": False, "false_pass": 0.58,
    ...     "note": ""}]}
    >>> print(verdict_markdown(report), end="")
    ## consistency-gate: clf v2 FAILED
    <BLANKLINE>
    Gate clf v2 against v1 (@champion) on 600 samples. Failed: ctoi <= 0.02 (0.0250 [0.0150, 0.0410]).
    <BLANKLINE>
    False pass: the chance that a model exactly at a rule's threshold passes it on this many samples; ...
    <BLANKLINE>
    ### The candidate: FAILED
    <BLANKLINE>
    | rule | value | outcome | false pass |
    | --- | --- | --- | --- |
    | ctoi <= 0.02 | 0.0250 [0.0150, 0.0410] | FAILED | 58.0% |
    <BLANKLINE>
    MLflow run: `abc123`
    """
    links = report.get("links") or {}
    view = Verdict.of(markdown_safe(report))
    if view.nothing:
        return f"## consistency-gate: {view.gated}: nothing to decide\n\n{view.nothing_line}\n"
    gated = _linked(view.gated, links.get("candidate"))
    against = _linked(view.against, links.get("baseline"))
    # plain words: a status emoji is an empty box where the reviewer's browser has no emoji font
    # the failed rules in the first lines: the MLflow UI shows a run description's first lines only
    first = view.sections[0].rules if view.sections else []
    failed = [f"{rule} ({value})" for rule, value, outcome, *_ in first if outcome == "FAILED"]
    found = f" Failed: {'; '.join(failed)}." if failed else ""
    lines = [f"## consistency-gate: {view.headline}", "", f"{view.compared(gated, against)}.{found}"]
    lines += [f"\n{line}" for line in beside_lines(markdown_safe(report))]
    lines += [f"\n> **Warning:** {warning}." for warning in view.warnings]
    for section in view.sections:
        lines += ["", f"### {section.title}: {section.verdict}", ""]
        lines += ["| rule | value | outcome | false pass |", "| --- | --- | --- | --- |"]
        lines += [f"| {rule} | {value} | {outcome} | {chance} |" for rule, value, outcome, chance, _ in section.rules]
    if view.cost:
        lines += ["", view.cost]
    if view.registered:
        version = report["registered_version"]
        lines += ["", view.registered.replace(f"v{version}", _linked(f"v{version}", links.get("registered")), 1)]
    if view.attempts:
        lines += ["", "### Remediation attempts, in the order tried", ""]
        lines += ["| " + " | ".join(ATTEMPT_HEADER) + " |", "|" + " --- |" * len(ATTEMPT_HEADER)]
        lines += ["| " + " | ".join(row) + " |" for row in view.attempts]
    if view.slices:
        lines += ["", f"### Slices, worst first ({len(report['slices'])} in all: `gate/slices.json` in the run)", ""]
        lines += slices_markdown(markdown_safe(report))
    if view.promotion:
        lines += ["", view.promotion]
    if view.run_id:
        lines += ["", f"MLflow run: {_linked('`' + view.run_id + '`', links.get('run'))}"]
    return "\n".join(lines) + "\n"


def _linked(text: str, url: str | None) -> str:
    """``text`` as a Markdown link to ``url``, or as it is without one."""
    return f"[{text}]({url})" if url else text
