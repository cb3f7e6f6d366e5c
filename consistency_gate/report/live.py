"""The live-traffic commands' words: a shadow check's decision and a rollback, as a terminal reads them."""

from __future__ import annotations

from consistency_gate.report.text import fmt


def stream_text(report: dict) -> str:
    """The shadow check as a terminal reads it: the decision, the stream's counts, the figures at the look that
    decided it, and each rule's value and bounds at the latest look (looks counted from 1, as in the report).

    >>> rule = {"quantity": "ctoi", "condition": "<= 0.02", "value": 0.01, "interval": [0.002, 0.019], "held": True}
    >>> stream = {"requests": 900, "candidate_failures": 0, "labelled": 700, "looks": 7, "decided_at_look": 3,
    ...           "at_decision": {"look": 3, "requests": 400, "labelled": 300, "ctoi": 0.01, "con": 0.97}, "needed": {}}
    >>> print(stream_text({"candidate": {"name": "clf", "version": "2"}, "baseline": {"version": "1"},
    ...     "decision": "promote", "stream": stream, "rules": [rule], "promotion": None}))
    shadow check of clf v2 against v1: PROMOTE
      900 requests (0 the candidate failed), 700 labelled, 7 looks
      decided at look 3 of 7, after 300 labels (400 requests): ctoi 0.0100, con 0.9700
      at the latest look (7), 700 labels:
      ctoi <= 0.02: 0.0100, bounds [0.0020, 0.0190]: held
    >>> back = {"promoted": True, "version": "1", "reason": ""}
    >>> print(stream_text({"candidate": {"name": "clf", "version": "2"}, "baseline": {"version": "1"},
    ...     "decision": "reject", "stream": {**stream, "decided_at_look": None}, "rules": [], "promotion": None,
    ...     "rollback": back}).splitlines()[-1])
      rollback: moved @champion back from v2 to v1, read back
    """
    stream = report["stream"]
    lines = [
        f"shadow check of {report['candidate']['name']} v{report['candidate']['version']} against "
        f"v{report['baseline']['version']}: {report['decision'].upper()}",
        f"  {stream['requests']} requests ({stream['candidate_failures']} the candidate failed"
        f"{_repeats(stream.get('repeated_requests'))}), {stream['labelled']} labelled, {stream['looks']} looks",
    ]
    if stream["decided_at_look"] is not None:
        at = stream["at_decision"]
        figures = ", ".join(
            f"{r['quantity']} {fmt(at.get(r['quantity']))}" for r in report["rules"] if r["quantity"] in at
        )
        figures += "".join(f", {k} {fmt(at[k])}" for k in ("con",) if k in at and k not in figures)
        lines.append(
            f"  decided at look {stream['decided_at_look']} of {stream['looks']}, after {at['labelled']} labels "
            f"({at['requests']} requests): {figures}"
        )
    lines.append(f"  at the latest look ({stream['looks']}), {stream['labelled']} labels:")
    for rule in report["rules"]:
        low, high = rule["interval"]
        state = rule_state(rule)
        value = "n/a" if rule["value"] is None else f"{rule['value']:.4f}"
        lines.append(f"  {rule['quantity']} {rule['condition']}: {value}, bounds [{low:.4f}, {high:.4f}]: {state}")
    for rule, needed in stream["needed"].items():
        lines.append(f"  {rule}: about {needed} more samples" if needed is not None else f"  {rule}: no estimate")
    if report.get("promotion"):
        lines.append(f"  promotion: {report['promotion']['reason'] or 'moved @champion, read back'}")
    if report.get("rollback"):
        back = report["rollback"]
        moved = f"moved @champion back from v{report['candidate']['version']} to v{back['version']}, read back"
        lines.append(f"  rollback: {back['reason'] or moved}")
    lines += [f"  warning: {w}" for w in report.get("warnings") or []]
    return "\n".join(lines)


def _repeats(count: int | None) -> str:
    """The requests whose id came again, as the counts' line says them (nothing for none).

    >>> _repeats(0), _repeats(2)
    ('', '; 2 repeated ids counted once, their first answers')
    """
    return f"; {count} repeated ids counted once, their first answers" if count else ""


def rule_state(rule: dict) -> str:
    """A shadow rule's state in a word: held, broken, open, or waived.

    >>> rule_state({"held": None}), rule_state({"held": False, "waived": "waived: clearly more accurate"})
    ('open', 'waived')
    """
    return "waived" if rule.get("waived") else {True: "held", False: "broken", None: "open"}[rule["held"]]


def alias_move_text(report: dict) -> str:
    """A move of the alias other than a gate's (a rollback, the guard's revert, a person's authorization) in one
    line: the versions and what the registry holds now.

    >>> alias_move_text({"candidate": {"name": "clf", "version": "1"}, "baseline": {"version": "2"}, "promoted": True})
    '@champion of clf: v2 -> v1: rolled back, read back'
    >>> alias_move_text({"candidate": {"name": "clf", "version": "1"}, "baseline": {"version": "2"}, "promoted": None,
    ...     "outcome": "already rolled back", "note": "nothing moved"})
    '@champion of clf: v2 -> v1: nothing moved'
    >>> alias_move_text({"kind": "revert", "verdict": "reverted", "candidate": {"name": "clf", "version": "5"},
    ...     "baseline": {"version": "7"}, "promoted": True})
    '@champion of clf: v7 -> v5: reverted, read back'
    """
    if report.get("outcome") == "already rolled back":
        said = report["note"]
    else:
        verb = report.get("verdict", "rolled back")  # the move's own word (a report before moves had kinds: none)
        said = f"{verb}, read back" if report["promoted"] else report["promotion"]["reason"]
    moved = f"v{report['baseline']['version']} -> v{report['candidate']['version']}"
    return f"@champion of {report['candidate']['name']}: {moved}: {said}"
