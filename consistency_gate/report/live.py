"""The live-traffic commands' words: a shadow check's decision and a rollback, as a terminal reads them."""

from __future__ import annotations


def stream_text(report: dict) -> str:
    """The shadow check as a terminal reads it: the decision, the stream's counts, each rule's bounds.

    >>> rule = {"quantity": "ctoi", "condition": "<= 0.02", "value": 0.01, "interval": [0.002, 0.019], "held": True}
    >>> stream = {"requests": 900, "candidate_failures": 0, "labelled": 700, "looks": 7, "decided_at_look": 2,
    ...           "steps": [{}, {}, {"labelled": 300}], "needed": {}}
    >>> print(stream_text({"candidate": {"name": "clf", "version": "2"}, "baseline": {"version": "1"},
    ...     "decision": "promote", "stream": stream, "rules": [rule], "promotion": None}))
    shadow check of clf v2 against v1: PROMOTE
      900 requests (0 the candidate failed), 700 labelled, 7 looks
      decided at look 3, after 300 labels
      ctoi <= 0.02: 0.0100, bounds [0.0020, 0.0190]: held
    """
    stream = report["stream"]
    lines = [
        f"shadow check of {report['candidate']['name']} v{report['candidate']['version']} against "
        f"v{report['baseline']['version']}: {report['decision'].upper()}",
        f"  {stream['requests']} requests ({stream['candidate_failures']} the candidate failed), "
        f"{stream['labelled']} labelled, {stream['looks']} looks",
    ]
    if stream["decided_at_look"] is not None:
        look = stream["decided_at_look"]
        lines.append(f"  decided at look {look + 1}, after {stream['steps'][look]['labelled']} labels")
    for rule in report["rules"]:
        low, high = rule["interval"]
        state = "waived" if rule.get("waived") else {True: "held", False: "broken", None: "open"}[rule["held"]]
        value = "n/a" if rule["value"] is None else f"{rule['value']:.4f}"
        lines.append(f"  {rule['quantity']} {rule['condition']}: {value}, bounds [{low:.4f}, {high:.4f}]: {state}")
    for rule, needed in stream["needed"].items():
        lines.append(f"  {rule}: about {needed} more samples" if needed is not None else f"  {rule}: no estimate")
    if report.get("promotion"):
        lines.append(f"  promotion: {report['promotion']['reason'] or 'moved @champion, read back'}")
    if report.get("rollback"):
        lines.append(f"  rollback: {report['rollback']['reason'] or 'moved @champion back, read back'}")
    return "\n".join(lines)


def rollback_text(report: dict) -> str:
    """A rollback in one line: the versions and what the registry holds now.

    >>> rollback_text({"candidate": {"name": "clf", "version": "1"}, "baseline": {"version": "2"}, "promoted": True})
    '@champion of clf: v2 -> v1: rolled back, read back'
    """
    said = "rolled back, read back" if report["promoted"] else report["promotion"]["reason"]
    moved = f"v{report['baseline']['version']} -> v{report['candidate']['version']}"
    return f"@champion of {report['candidate']['name']}: {moved}: {said}"
