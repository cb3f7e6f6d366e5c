"""The shadow check: a candidate judged on live traffic as its labels arrive, with decisions valid at every look.

The capture (:mod:`consistency_gate.io.capture`) holds both models' answers to each served request; labels
are joined by id as they arrive. At each look (every ``batch`` labels, in the order they arrived) CON is
measured on every request served so far and the flips and accuracies on the labelled ones, and each rule
is judged on the anytime-valid bounds of :mod:`consistency_gate.core.sequences`, intersected over the looks:

- a rule *holds* once its strict bound meets the threshold (the upper bound of ``ctoi`` under its max),
  and *breaks* once the other bound is past it (the lower bound of ``ctoi`` over its max);
- the stream is decided at the first look where every rule holds (``promote``) or one breaks
  (``reject``); until then it ``continue``s, with the labels each open rule typically still needs.

A model exactly at a rule's threshold passes it at any of the looks with probability at most
``1 - confidence``, however often the check runs (each run reads the whole stream again).

>>> capture = pd.DataFrame({"id": list("abcd"), "time": pd.to_datetime([1, 2, 3, 4], unit="s", utc=True),
...                         "champion": list("xxyy"), "candidate": list("xxyx")})
>>> labels = pd.DataFrame({"id": list("abcd"), "label": list("xxyy"), "time": pd.NaT})
>>> result = check_stream(capture, labels, [Rule("ctoi", "max", 0.5)], 0.95, batch=2)
>>> result.decision, result.metrics["ctoi"], result.metrics["con"]
('continue', 0.25, 0.75)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from consistency_gate.core import intervals as ci
from consistency_gate.core import sequences as cs
from consistency_gate.errors import DataError, UsageError
from consistency_gate.gate.rules import Rule, candidate_key, shown_better

# the shares a stream measures, and over what: every request, or the labelled ones
ON_REQUESTS = ("con",)
ON_LABELS = ("acc_previous", "acc_candidate", "acc_con", "ctoc", "ctoi", "itoc", "itoi")
DEFAULT_BATCH = 100  # labels between two looks
# the accuracy change, whose bounds ``unless: clearly-better`` reads (:func:`~consistency_gate.gate.rules.shown_better`)
ACC_CHANGE = Rule("acc", "min_delta", 0.0)


def shadow_rules(rules: Sequence[Rule]) -> list[Rule]:
    """The rules a stream judges: min and max on a share of the samples, and acc's min_delta; UsageError
    (exit 2) naming any other (they need scores, a history, slices or a serving cost, which a capture of
    answers does not give).

    >>> [r.metric for r in shadow_rules([Rule("ctoi", "max", 0.02), Rule("acc", "min_delta", -0.01)])]
    ['ctoi', 'acc']
    """
    for rule in rules:
        judged = (
            rule.metric == "acc" if rule.kind == "min_delta" else candidate_key(rule.metric) in ON_REQUESTS + ON_LABELS
        )
        if not judged or rule.per_slice:
            raise UsageError(
                f"rule '{rule.describe()}'{f' (line {rule.line})' if rule.line else ''}: a shadow check judges min/max "
                f"on {', '.join(('acc', *ON_REQUESTS, *ON_LABELS[2:]))} and acc's min_delta, on the whole stream; "
                "give it a config without this rule"
            )
    return list(rules)


@dataclass
class RuleState:
    """One rule along the stream: the bounds at each look (intersected over the looks so far) and the look at
    which it was proven to hold or to break (None while open)."""

    rule: Rule
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    held_at: int | None = None
    broken_at: int | None = None
    waived_at: int | None = None  # ``unless: clearly-better``: the look that proved the candidate more accurate

    @property
    def done_at(self) -> int | None:
        """The look at which the rule stopped standing in the way: it held, or it was waived."""
        return min((s for s in (self.held_at, self.waived_at) if s is not None), default=None)

    def look(self, step: int, low: float, high: float) -> None:
        """Add look ``step``'s bounds (kept inside the earlier looks'), and note a first proof either way."""
        low = max(low, self.lower[-1]) if self.lower else low
        high = min(high, self.upper[-1]) if self.upper else high
        self.lower.append(low)
        self.upper.append(high)
        at_most = self.rule.kind == "max"
        strict, other = (high, low) if at_most else (low, high)
        if self.held_at is None and self.rule.holds(strict):
            self.held_at = step
        if self.broken_at is None and not self.rule.holds(other):
            self.broken_at = step


@dataclass
class StreamResult:
    """What a shadow check found: the decision, the look it was reached at, the figures at the last look, each
    rule's bounds over the looks, and the stream's counts."""

    decision: str  # promote, reject or continue
    decided_at: int | None  # the look (0-based) where it was decided
    metrics: dict[str, float | None]
    steps: pd.DataFrame  # one row per look: time, requests, labelled, each share
    rules: list[RuleState]
    counts: dict[str, int]
    needed: dict[str, int | None]  # per open rule: labels (or requests, for con) typically still needed
    level: float

    def value(self, rule: Rule) -> float | None:
        """What ``rule`` compares with its threshold at the last look: the metric, or acc's change."""
        if rule.kind == "min_delta":
            before, after = self.metrics["acc_previous"], self.metrics["acc_candidate"]
            return None if after is None or before is None else after - before
        return self.metrics[candidate_key(rule.metric)]

    @property
    def labelled(self) -> int:
        """The labelled requests both models answered."""
        return self.counts["labelled"]


def joined(capture: pd.DataFrame, labels: pd.DataFrame, classes: Sequence[str] | None) -> pd.DataFrame:
    """The requests both models answered, with their label and its arrival time (``ready``: the later of the
    request's time and the label's) where one arrived. DataError (exit 3) when no label matches a request, or
    a label is not a class of the models.
    """
    answered = capture[capture["candidate"].notna()]
    frame = answered.merge(labels.rename(columns={"time": "label_time"}), on="id", how="left")
    if len(labels) and not labels["id"].isin(capture["id"]).any():
        raise DataError(
            f"no label matches a request of the capture (capture ids like '{capture['id'].iloc[0]}', label ids like "
            f"'{labels['id'].iloc[0]}'): give the labels of the captured requests, keyed by the id the capture holds"
        )
    known = set(classes) if classes else set(answered["champion"]) | set(answered["candidate"])
    unknown = frame["label"].notna() & ~frame["label"].isin(known)
    if unknown.any():
        row = frame[unknown].iloc[0]
        raise DataError(
            f"the label of request '{row['id']}' is '{row['label']}', not a class of the models "
            f"({', '.join(sorted(map(str, known))[:12])}); fix the labels, or give the models' classes"
        )
    frame["ready"] = frame[["time", "label_time"]].max(axis=1).where(frame["label"].notna())
    return frame


def _shares(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """Each labelled request's hits for each share of ON_LABELS, in the order the labels arrived."""
    right_p = (frame["champion"] == frame["label"]).to_numpy(bool)
    right_c = (frame["candidate"] == frame["label"]).to_numpy(bool)
    return {
        "acc_previous": right_p,
        "acc_candidate": right_c,
        "acc_con": right_p & right_c,
        "ctoc": right_p & right_c,
        "ctoi": right_p & ~right_c,
        "itoc": ~right_p & right_c,
        "itoi": ~right_p & ~right_c,
    }


def check_stream(
    capture: pd.DataFrame,
    labels: pd.DataFrame,
    rules: Sequence[Rule],
    level: float,
    batch: int = DEFAULT_BATCH,
    classes: Sequence[str] | None = None,
) -> StreamResult:
    """Judge ``rules`` on the stream of ``capture`` and its ``labels``, looking after every ``batch`` labels in
    the order they arrived (and once more at the end), at one-sided confidence ``level``. A request id the
    capture holds more than once (a client's retry) counts once, with its first answers (``repeated_requests``).

    Returns
    -------
    StreamResult
        The decision (``promote``, ``reject``, ``continue``), the look it was reached at, and everything
        the report and the plot show.
    """
    if batch < 1:
        raise UsageError(f"--batch must be at least 1 label, got {batch}")
    rules = shadow_rules(rules)
    first = capture.sort_values("time", kind="stable")
    repeated = first["id"].duplicated()  # a client's retry of a request: its first answer is the one judged
    capture = first[~repeated]
    frame = joined(capture, labels, classes)
    requests = frame.sort_values("time", kind="stable")
    agree = np.cumsum((requests["champion"] == requests["candidate"]).to_numpy(bool))
    request_times = requests["time"].to_numpy()
    labelled = frame[frame["label"].notna()].sort_values("ready", kind="stable")
    hits = {key: np.cumsum(v) for key, v in _shares(labelled).items()}
    ready = labelled["ready"].to_numpy()
    ends = sorted({*range(batch, len(labelled) + 1, batch), len(labelled)} - {0})
    looks = [(int(i), ready[i - 1]) for i in ends] if ends else [(0, request_times[-1] if len(requests) else None)]
    states = [RuleState(rule) for rule in rules]
    change = RuleState(ACC_CHANGE)  # the accuracy change's bounds, intersected over the looks
    rows = []
    decision, decided_at = "continue", None
    for step, (m, at) in enumerate(looks):
        served = int(np.searchsorted(request_times, at, side="right")) if at is not None else 0
        counts = {"con": (int(agree[served - 1]) if served else 0, served)}
        counts.update({key: (int(hits[key][m - 1]) if m else 0, m) for key in ON_LABELS})
        rows.append({"time": at, "requests": served, "labelled": m, **{k: _share(*kn) for k, kn in counts.items()}})
        change.look(step, *_bounds(change.rule, counts, level))
        better = shown_better([change.lower[-1], change.upper[-1]])
        for state in states:
            state.look(step, *_bounds(state.rule, counts, level))
            if state.rule.unless and state.waived_at is None and better:
                state.waived_at = step
        if decided_at is None:
            if any(_rejects(s, no_better=change.upper[-1] <= 0) for s in states):
                decision, decided_at = "reject", step
            elif all(s.done_at is not None for s in states):
                decision, decided_at = "promote", step
    steps = pd.DataFrame(rows)
    final = steps.iloc[-1]
    metrics = {key: (None if pd.isna(final[key]) else float(final[key])) for key in (*ON_REQUESTS, *ON_LABELS)}
    open_rules = [s for s in states if decision == "continue" and s.done_at is None]
    return StreamResult(
        decision,
        decided_at,
        metrics,
        steps,
        states,
        {
            "requests": len(capture),
            "repeated_requests": int(repeated.sum()),
            "answered_by_both": len(frame),
            "candidate_failures": int(capture["candidate"].isna().sum()),
            "labelled": len(labelled),
            "labels_unmatched": int((~labels["id"].isin(capture["id"])).sum()),
            "looks": len(looks),
        },
        {s.rule.describe(): _needed(s.rule, metrics, final, level) for s in open_rules},
        level,
    )


def _rejects(state: RuleState, no_better: bool) -> bool:
    """Whether a broken rule rejects the candidate: at once, or for an ``unless: clearly-better`` rule once
    the candidate is also proven not more accurate (the accuracy change's upper bound at or under 0), so
    that a retrain still on its way to proving itself better stays open instead."""
    if state.broken_at is None:
        return False
    return not state.rule.unless or (state.waived_at is None and no_better)


def _share(k: int, n: int) -> float:
    return k / n if n else float("nan")


def _bounds(rule: Rule, counts: dict[str, tuple[int, int]], level: float) -> tuple[float, float]:
    """The anytime-valid lower and upper bound of what ``rule`` compares with its threshold, at this look."""
    if rule.kind == "min_delta":  # acc change = ItoC - CtoI, on the labelled requests
        (gained, n), (lost, _) = counts["itoc"], counts["ctoi"]
        return cs.paired_lower(gained, lost, n, level), -cs.paired_lower(lost, gained, n, level)
    k, n = counts[candidate_key(rule.metric)]
    return float(cs.lower(k, n, level)), float(cs.upper(k, n, level))


def _needed(rule: Rule, metrics: dict[str, float | None], final: pd.Series, level: float) -> int | None:
    """How many more samples an open rule typically needs at the rate measured so far (None: unknown, or never
    at that rate)."""
    key = candidate_key(rule.metric)
    rate = metrics.get(key)
    if rule.kind == "min_delta" or rate is None:
        return None
    total = cs.samples_needed(rate, rule.threshold, rule.kind == "max", level)
    have = int(final["requests"] if key in ON_REQUESTS else final["labelled"])
    return None if total is None else max(total - have, 0)


def mcnemar(result: StreamResult) -> float | None:
    """The exact McNemar p-value on the labelled requests' discordant pairs (as a gate's ``tests``)."""
    n = result.labelled
    if not n:
        return None
    return ci.mcnemar_exact(round(result.metrics["ctoi"] * n), round(result.metrics["itoc"] * n))
