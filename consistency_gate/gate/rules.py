"""The gate's rules: thresholds as value objects that check themselves (:class:`Rule`), and how they are
judged on a comparison's metrics, intervals and slices (:func:`evaluate_rules`): pure logic, no MLflow.
A config file becomes rules in :mod:`consistency_gate.gate.config`.

>>> rules = [Rule("ctoi", "max", 0.02), Rule("acc", "min_delta", 0.0)]
>>> results = evaluate_rules(rules, {"ctoi": 0.05, "acc_candidate": 0.9, "acc_previous": 0.88})
>>> [(r.rule.metric, r.held) for r in results]
[('ctoi', False), ('acc', True)]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from consistency_gate.core import intervals as ci
from consistency_gate.core.names import COST_METRICS, FLOOR_METRICS, HISTORY_METRICS, PER_K, SHARES
from consistency_gate.errors import UsageError
from consistency_gate.report.verdict import blocking, outcome

if TYPE_CHECKING:
    from consistency_gate.core.slices import SliceResult

# each kind of threshold and how it reads: value >= t, value <= t, (candidate - previous) >= t; a
# min_delta rule names what it compares "<metric> change" (Rule.quantity), never the metric itself
OPERATORS = {"min": ">=", "max": "<=", "min_delta": ">="}
KINDS = tuple(OPERATORS)
# what a rule compares with its threshold: the point estimate, or a bound of the metric's interval
DECIDE = ("estimate", "upper", "lower")
# a per-slice rule judges the slices with at least this many samples (smaller ones are reported only)
DEFAULT_MIN_SLICE_SIZE = 50
# when a failed rule is waived (``unless:``): the candidate is clearly more accurate than the baseline, i.e.
# the one-sided lower bound of its accuracy change at the configured confidence is above 0
UNLESS = ("clearly-better",)


@dataclass(frozen=True)
class Rule:
    """One threshold: ``metric`` ``kind`` ``threshold`` (kind is min, max or min_delta).

    A Rule validates itself: an unknown kind or a threshold that is not a finite number is a
    UsageError (exit 2), whoever builds it.

    >>> Rule("con", "mx", 0.9)
    Traceback (most recent call last):
    ...
    consistency_gate.errors.UsageError: rule for 'con': kind must be one of min, max, min_delta, got 'mx'
    """

    metric: str
    kind: str
    threshold: float
    line: int | None = None
    decide: str = "estimate"  # or "upper"/"lower": compare that bound of the metric's interval
    per_slice: bool = False  # judge every slice of at least min_slice_size samples instead of the whole set
    min_slice_size: int = DEFAULT_MIN_SLICE_SIZE
    history: int | None = None  # a history metric's champions (the baseline and those before it)
    unless: str | None = None  # "clearly-better": the rule is waived for a candidate clearly more accurate

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(f"rule for '{self.metric}': kind must be one of {', '.join(KINDS)}, got '{self.kind}'")
        if not math.isfinite(self.threshold):
            raise UsageError(f"rule for '{self.metric}': the {self.kind} threshold must be a finite number")
        if self.decide not in DECIDE:
            choices = ", ".join(DECIDE)
            raise UsageError(f"rule for '{self.metric}': decide must be one of {choices}, got '{self.decide}'")
        if self.kind == "min_delta" and self.decide != "estimate" and self.metric != "acc":
            raise UsageError(
                f"rule for '{self.metric}': decide: {self.decide} on min_delta needs a paired interval, which "
                "acc has (Newcombe's); use decide: estimate for cacc@K deltas"
            )
        if self.metric in COST_METRICS and (self.decide != "estimate" or self.per_slice):
            raise UsageError(
                f"rule for '{self.metric}': a serving cost is measured once, without an interval or slices; "
                "use decide: estimate and no per_slice"
            )
        if self.min_slice_size < 1:
            raise UsageError(f"rule for '{self.metric}': min_slice_size must be at least 1, got {self.min_slice_size}")
        if (self.history is not None) != (self.metric in HISTORY_METRICS) or (self.history or 1) < 1:
            raise UsageError(
                f"rule for '{self.metric}': history: K (at least 1 champion) applies to "
                f"{', '.join(HISTORY_METRICS)} only"
            )
        if self.per_slice and self.metric in HISTORY_METRICS + FLOOR_METRICS:
            raise UsageError(f"rule for '{self.metric}': measured on the whole set, not per slice; drop per_slice")
        if self.unless is not None and self.unless not in UNLESS:
            raise UsageError(f"rule for '{self.metric}': unless must be {', '.join(UNLESS)}, got '{self.unless}'")
        if self.unless is not None and (self.on_accuracy or self.metric in COST_METRICS):
            raise UsageError(
                f"rule for '{self.metric}': unless: {self.unless} waives a consistency rule for a candidate "
                "clearly more accurate; a rule on accuracy or on serving cost is never waived, drop unless"
            )

    @property
    def on_accuracy(self) -> bool:
        """Whether the rule reads a model's accuracy (acc, cacc@K): never waived by ``unless``."""
        return self.metric in ("acc", "acc_candidate") or self.metric.startswith("cacc@")

    @property
    def single_model(self) -> bool:
        """Checkable without a previous generation (acc / cacc@K with min or max, serving cost)."""
        return self.kind != "min_delta" and (self.on_accuracy or self.metric in COST_METRICS)

    @property
    def quantity(self) -> str:
        """What the rule compares with its threshold: the metric, or for min_delta its change from
        the previous generation to the candidate (``acc change``), so the row never reads like the
        accuracy itself.

        >>> Rule("acc", "min_delta", -0.01).quantity, Rule("acc", "min", 0.9).quantity
        ('acc change', 'acc')
        """
        return f"{self.metric} change" if self.kind == "min_delta" else self.metric

    @property
    def condition(self) -> str:
        """The threshold as it reads: ``>= 0.9``, ``<= 0.02``, ``>= -0.01`` (of the change, for min_delta),
        with the bound compared when it is not the estimate: ``<= 0.02 (upper bound)``, the
        slices a per-slice rule judges: ``<= 0.05 in every slice of n >= 50``, and when it is waived:
        ``<= 0.02 unless clearly better``."""
        bound = "" if self.decide == "estimate" else f" ({self.decide} bound)"
        where = f" in every slice of n >= {self.min_slice_size}" if self.per_slice else ""
        if self.history is not None:
            where = f" over the last {self.history} champion{'s' if self.history != 1 else ''}"
        unless = f" unless {self.unless.replace('-', ' ')}" if self.unless else ""
        return f"{OPERATORS[self.kind]} {self.threshold:g}{bound}{where}{unless}"

    @property
    def interval_key(self) -> str:
        """The key of the interval a ``decide: upper/lower`` rule reads (``acc_delta`` for min_delta)."""
        return "acc_delta" if self.kind == "min_delta" else candidate_key(self.metric)

    def describe(self) -> str:
        """The rule as it reads: ``con >= 0.95``, ``acc change >= -0.01``."""
        return f"{self.quantity} {self.condition}"

    def holds(self, value: float) -> bool:
        """Whether a measured value (a delta for min_delta) meets the threshold; a tolerance of 1e-12
        absorbs float rounding (a delta of exactly -0.01 computed as -0.0100...02)."""
        if self.kind == "max":
            return value <= self.threshold + 1e-12
        return value >= self.threshold - 1e-12


@dataclass(frozen=True)
class RuleResult:
    """A rule, the value it was checked against, and the outcome (``held`` None: skipped).

    ``interval`` is the metric's two-sided interval (for min_delta: of the difference) when known,
    ``compared`` what was compared with the threshold: the value, or the one-sided bound ``decide``
    names, described by ``judged_on``; ``false_pass`` the chance that a model exactly at the
    threshold passes this rule on a set of this size (see :func:`false_pass`).
    """

    rule: Rule
    value: float | None
    held: bool | None
    note: str = ""
    interval: list[float] | None = None
    compared: float | None = None
    slices: tuple[dict, ...] = ()  # a per-slice rule: each slice's outcome (value, interval, held)
    judged_on: str = "estimate"
    false_pass: float | None = None
    waived: str = ""  # why a rule that failed does not block (``unless:``), empty when it is not waived

    @property
    def blocks(self) -> bool:
        """Whether the rule fails the candidate: it failed and was not waived (:func:`blocking`)."""
        return blocking({"held": self.held, "waived": self.waived})

    def record(self) -> dict:
        """The rule's row in the rule table logged to the run (``gate/rules.json``): short columns,
        the rule and its outcome first, so the MLflow UI shows them whole at its default width;
        numbers to 4 decimals (``gate/report.json`` keeps them whole).

        >>> rule = Rule("ctoi", "max", 0.02, decide="upper")
        >>> result = RuleResult(rule, 0.01, False, "", [0.004, 0.03], 0.027, (), "one-sided 95% upper bound", 0.0443)
        >>> record = result.record()
        >>> record["rule"], record["outcome"], record["bound"], record["judged on"], record["false pass"]
        ('ctoi <= 0.02', 'FAILED', 0.027, 'one-sided 95% upper bound', 0.0443)
        """
        low, high = (_rounded(v) for v in (self.interval or (None, None)))
        judged = self.judged_on
        if self.rule.per_slice:
            judged += f", worst slice of n >= {self.rule.min_slice_size}"
        return {
            "rule": f"{self.rule.quantity} {OPERATORS[self.rule.kind]} {self.rule.threshold:g}",
            "outcome": outcome({"held": self.held, "waived": self.waived}),
            "value": _rounded(self.value),
            "low": low,
            "high": high,
            "bound": _rounded(self.compared) if self.rule.decide != "estimate" else None,
            "judged on": judged,
            "false pass": _rounded(self.false_pass),
            "note": "; ".join(filter(None, [self.waived, self.note])),
        }

    def to_dict(self) -> dict:
        """As in the JSON report (a per-slice rule adds ``slices``: each
        slice's outcome; ``value``, ``interval`` and ``compared`` are then the worst judged slice's)."""
        extra = {}
        if self.rule.per_slice:
            extra = {"per_slice": True, "min_slice_size": self.rule.min_slice_size, "slices": list(self.slices)}
        if self.rule.history is not None:
            extra["history"] = self.rule.history
        if self.rule.unless is not None:
            extra |= {"unless": self.rule.unless, "waived": self.waived or None}
        return {
            "metric": self.rule.metric,
            "quantity": self.rule.quantity,
            "kind": self.rule.kind,
            "threshold": self.rule.threshold,
            "decide": self.rule.decide,
            "condition": self.rule.condition,
            "value": self.value,
            "interval": self.interval,
            "compared": self.compared,
            "judged_on": self.judged_on,
            "false_pass": self.false_pass,
            "held": self.held,
            "note": self.note,
            **extra,
        }


def candidate_key(metric: str) -> str:
    """The metrics-dict key a rule reads for the candidate (acc -> acc_candidate).

    >>> candidate_key("acc"), candidate_key("cacc@5"), candidate_key("ctoi")
    ('acc_candidate', 'cacc_candidate@5', 'ctoi')
    """
    if metric == "acc":
        return "acc_candidate"
    if metric.startswith("cacc@"):
        return "cacc_candidate@" + metric.split("@")[1]
    return metric


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def evaluate_rules(
    rules: list[Rule],
    metrics: dict[str, float | None],
    first_generation: bool = False,
    intervals: dict[str, list[float]] | None = None,
    bounds: dict[str, list[float]] | None = None,
    level: float = 0.95,
    n: int = 0,
    slices: Sequence[SliceResult] = (),
    null_reasons: dict[str, str] | None = None,
) -> list[RuleResult]:
    """Check each rule against the measured metrics; a ``decide: upper/lower`` rule against the
    one-sided ``bounds`` at ``level`` (``{key: [lower, upper]}``, see
    :meth:`~consistency_gate.core.counts.ConsistencyCounts.bounds`), reported beside the two-sided
    ``intervals``. A null metric, or a missing bound a rule needs, fails its rule (its note says why, from
    ``null_reasons``). A rule on a share
    of the ``n`` samples that fails on its bound although its estimate meets the threshold says how
    many samples would pass it with 80% power. A ``per_slice`` rule is checked on each of the
    ``slices`` with at least ``min_slice_size`` samples, and holds when it holds on all of them.

    >>> rule = Rule("ctoi", "max", 0.02, decide="upper")
    >>> (result,) = evaluate_rules([rule], {"ctoi": 0.018}, bounds={"ctoi": [0.011, 0.029]}, n=600)
    >>> result.held, result.compared, result.judged_on, round(result.false_pass, 4)
    (False, 0.029, 'one-sided 95% upper bound (exact binomial)', 0.0443)
    """
    results = []
    for rule in rules:
        if first_generation and not rule.single_model:
            results.append(RuleResult(rule, None, None, "skipped: first generation, no baseline to compare with"))
        elif rule.per_slice:
            results.append(_check_slices(rule, slices, level))
        else:
            result = _check(rule, metrics, intervals or {}, bounds or {}, level, n)
            why = (null_reasons or {}).get(rule.metric)
            if result.value is None and result.held is False and why:
                result = replace(result, note=f"{result.note} ({why})")
            results.append(result)
    return _waive(results, (bounds or {}).get("acc_delta"), level, first_generation)


def _waive(
    results: list[RuleResult], acc_delta: list[float] | None, level: float, first_generation: bool
) -> list[RuleResult]:
    """The failed rules that say ``unless: clearly-better``, waived when the candidate is clearly more
    accurate than the baseline: the one-sided lower bound of the accuracy change (``acc_delta``, Newcombe's
    paired interval, at ``level``) is above 0, so a retrain that improves on the baseline is never locked
    out by churn alone. The rule's outcome stays what was measured; ``waived`` says why it does not block.

    >>> rule = Rule("ctoi", "max", 0.02, unless="clearly-better")
    >>> [r.blocks for r in evaluate_rules([rule], {"ctoi": 0.05}, bounds={"acc_delta": [0.01, 0.08]})]
    [False]
    >>> [r.blocks for r in evaluate_rules([rule], {"ctoi": 0.05}, bounds={"acc_delta": [-0.01, 0.08]})]
    [True]
    """
    if first_generation or not shown_better(acc_delta):
        return results
    why = f"waived: clearly more accurate (acc change's one-sided {level:.0%} lower bound {acc_delta[0]:+.4f} > 0)"
    return [replace(r, waived=why) if r.held is False and r.rule.unless else r for r in results]


def shown_better(acc_delta: Sequence[float] | None) -> bool:
    """Whether the candidate is clearly more accurate than the baseline: the lower bound of the accuracy
    change (``[lower, upper]``, fixed-sample or anytime-valid) is above 0. What ``unless: clearly-better``
    waits for, in a gate and in a shadow check.

    >>> shown_better([0.004, 0.06]), shown_better([0.0, 0.06]), shown_better(None)
    (True, False, False)
    """
    return acc_delta is not None and acc_delta[0] > 0


def with_margin(rule: Rule) -> Rule:
    """``rule`` judged on its strict one-sided bound (upper for a max, lower for a min and for acc's
    min_delta): a setting tuned on a calibration set must pass there with room for the sampling error,
    not by a hair on the estimate, to pass the evaluation set too. Rules that have no such bound (a
    serving cost, a min_delta of another metric) are left as they are.

    >>> with_margin(Rule("ctoi", "max", 0.02)).decide, with_margin(Rule("con", "min", 0.9)).decide
    ('upper', 'lower')
    """
    if rule.metric in COST_METRICS or (rule.kind == "min_delta" and rule.metric != "acc"):
        return rule
    return replace(rule, decide="upper" if rule.kind == "max" else "lower")


def tuning_confidence(level: float) -> float:
    """The one-sided level a repair's setting is tuned at on a calibration set, for a gate at ``level``:
    twice the normal quantile, so the bound there leaves room for the sampling error of both sets (a rule
    already judged on its bound is judged on it again on the evaluation set).

    >>> round(tuning_confidence(0.95), 4)
    0.9995
    """
    from scipy.special import ndtr, ndtri

    return float(ndtr(2 * ndtri(level)))


def judged_on(rule: Rule, level: float) -> str:
    """What a rule compares with its threshold, in words.

    >>> judged_on(Rule("con", "min", 0.9, decide="lower"), 0.95)
    'one-sided 95% lower bound (exact binomial)'
    >>> judged_on(Rule("acc", "min_delta", 0, decide="lower"), 0.9)
    'one-sided 90% lower bound'
    """
    if rule.decide == "estimate":
        return "estimate"
    exact = " (exact binomial)" if rule.kind != "min_delta" and is_share_of_samples(rule.metric) else ""
    return f"one-sided {level:.0%} {rule.decide} bound{exact}"


def false_pass(rule: Rule, level: float, n: int) -> float | None:
    """The chance that a model exactly at the threshold passes ``rule`` on ``n`` samples: exact
    (binomial) for a share of the samples; for other metrics the nominal rate of how it decides
    (a strict bound ``1 - level``, the estimate 0.5, a lenient bound ``level``); None for a
    serving cost, which is measured, not sampled.

    >>> round(false_pass(Rule("ctoi", "max", 0.02, decide="upper"), 0.95, 600), 4)
    0.0443
    >>> false_pass(Rule("pearson", "min", 0.9, decide="lower"), 0.95, 600)
    0.05
    """
    if rule.metric in COST_METRICS:
        return None
    at_most = rule.kind == "max"
    if rule.kind != "min_delta" and is_share_of_samples(rule.metric):
        if n <= 0:
            return None
        return float(ci.pass_probability(n, rule.threshold, rule.threshold, at_most, rule.decide, level))
    if rule.decide == "estimate":
        return 0.5
    strict = rule.decide == ("upper" if at_most else "lower")
    return round(1 - level, 12) if strict else level


def _check(
    rule: Rule,
    metrics: dict[str, float | None],
    intervals: dict[str, list[float]],
    bounds: dict[str, list[float]],
    level: float,
    n: int,
) -> RuleResult:
    """One rule on one set of metrics (the whole evaluation set, or one slice)."""
    value = metrics.get(candidate_key(rule.metric))
    if rule.kind == "min_delta" and value is not None:
        previous = metrics.get(candidate_key(rule.metric).replace("candidate", "previous"))
        value = None if previous is None else value - previous
    interval = intervals.get(rule.interval_key)
    basis = {"judged_on": judged_on(rule, level), "false_pass": false_pass(rule, level, n)}
    if value is None:
        return RuleResult(rule, None, False, "metric is null: rule fails", interval, **basis)
    if rule.decide == "estimate":
        return RuleResult(rule, value, rule.holds(value), "", interval, value, **basis)
    bound = bounds.get(rule.interval_key)
    if bound is None:
        return RuleResult(rule, value, False, "no bound for this metric: rule fails", interval, **basis)
    compared = bound[1] if rule.decide == "upper" else bound[0]
    held = rule.holds(compared)
    note = "" if held else _advice(rule, value, level, n)
    return RuleResult(rule, value, held, note, interval, compared, **basis)


def _check_slices(rule: Rule, slices: Sequence[SliceResult], level: float) -> RuleResult:
    """A per-slice rule: checked on every slice of at least ``min_slice_size`` samples; its value,
    interval and compared bound are those of the worst judged slice."""
    judged = [
        (s, _check(rule, s.metrics, s.intervals, s.bounds, level, s.n)) for s in slices if s.n >= rule.min_slice_size
    ]
    small = len(slices) - len(judged)
    rows = tuple(
        {"slice": s.name, "n": s.n, "value": r.value, "interval": r.interval, "compared": r.compared, "held": r.held}
        for s, r in judged
    )
    under = f"{small} slice{'s' if small != 1 else ''} under {rule.min_slice_size} samples not judged" if small else ""
    if not judged:
        note = f"no slice has {rule.min_slice_size} samples: nothing judged" + (f" ({under})" if small else "")
        return RuleResult(rule, None, None, note)

    def badness(pair: tuple[SliceResult, RuleResult]) -> tuple[bool, float]:
        compared = pair[1].compared
        if compared is None:  # a null metric or a missing interval fails: worst of all
            return (True, math.inf)
        return (not pair[1].held, compared if rule.kind == "max" else -compared)

    worst, result = max(judged, key=badness)
    failing = sum(r.held is False for _, r in judged)
    parts = [
        f"worst slice {worst.name} (n={worst.n})",
        f"{failing} of {len(judged)} slices fail" if failing else f"all {len(judged)} slices hold",
    ]
    if under:
        parts.append(under)
    if result.note:
        parts.append(result.note)
    return RuleResult(
        rule, result.value, failing == 0, "; ".join(parts), result.interval, result.compared, rows,
        result.judged_on, result.false_pass,
    )  # fmt: skip


def is_share_of_samples(metric: str) -> bool:
    """Whether a rule's metric is a proportion of all evaluated samples (sample sizes apply).

    >>> is_share_of_samples("ctoi"), is_share_of_samples("ccon@5"), is_share_of_samples("pearson")
    (True, True, False)
    """
    key = candidate_key(metric)
    return key in (*SHARES, "forgotten", "floor_ctoi", "floor_con") or PER_K.match(key) is not None


def _advice(rule: Rule, value: float, level: float, n: int) -> str:
    """How many samples would pass the rule with 80% power at the measured rate; empty if none would."""
    if rule.kind == "min_delta" or not is_share_of_samples(rule.metric) or not rule.holds(value):
        return ""
    needed = ci.samples_needed(value, rule.threshold, rule.kind == "max", level, rule.decide, coarse=True)
    if needed is None:
        return ""
    return (
        f"the estimate meets it, its {rule.decide} bound does not: at this rate about {needed:,} samples "
        f"would pass it with 80% power (this set has {n:,})"
    )


def plan_sizes(rules: list[Rule], rates: dict[str, float], level: float, power: float = 0.8) -> list[dict]:
    """For each rule, the evaluation-set size at which it gives the right answer with probability
    ``power`` for a model at the expected ``rates`` (``{metric: rate}``): passes it when the rate
    meets the threshold, fails it when not, deciding as the rule does at one-sided ``level``
    (``consistency-gate plan``; exact binomial, see :func:`consistency_gate.core.intervals.samples_needed`).
    Each row also gives the rule's false-pass rate at that size.

    >>> row = plan_sizes([Rule("ctoi", "max", 0.02, decide="upper")], {"ctoi": 0.01}, 0.95)[0]
    >>> row["samples"], round(row["power"], 3), round(row["false_pass"], 3)
    (969, 0.821, 0.05)
    >>> estimate = plan_sizes([Rule("ctoi", "max", 0.02)], {"ctoi": 0.0}, 0.95)[0]
    >>> estimate["samples"], estimate["note"]
    (1, 'judged on the estimate, a model exactly at the threshold passes 98% of the time at this size (about \
half on large sets): decide: upper bounds that at 5%')
    """
    rows = []
    for rule in rules:
        row = {"rule": rule.describe(), "decide": rule.decide, "rate": rates.get(rule.metric), "samples": None}
        row |= {"power": None, "false_pass": None, "note": ""}
        rate, at_most = row["rate"], rule.kind == "max"
        if rule.kind == "min_delta" or not is_share_of_samples(rule.metric):
            row["note"] = "not a share of the samples: no size formula"
        elif rate is None:
            row["note"] = f"give --rate {rule.metric}=R, the rate you expect"
        else:
            row["samples"] = ci.samples_needed(rate, rule.threshold, at_most, level, rule.decide, power)
            if row["samples"] is None:
                meets = rate < rule.threshold if at_most else rate > rule.threshold
                row["note"] = (
                    "no size passes it: the expected rate is at or past the threshold"
                    if not meets or rate == rule.threshold
                    else "no size up to 10,000,000 reaches the power"
                )
            else:
                passes = float(ci.pass_probability(row["samples"], rate, rule.threshold, at_most, rule.decide, level))
                meets = rate < rule.threshold if at_most else rate > rule.threshold
                row["power"] = passes if meets else 1 - passes
                row["false_pass"] = false_pass(rule, level, row["samples"])
                if not meets:
                    row["note"] = "the expected rate breaks the rule: the size that fails it"
                elif rule.decide == "estimate":  # any size passes a model at its rate; the false pass is the issue
                    row["note"] = (
                        f"judged on the estimate, a model exactly at the threshold passes {row['false_pass']:.0%} of "
                        f"the time at this size (about half on large sets): decide: "
                        f"{'upper' if at_most else 'lower'} bounds that at {1 - level:.0%}"
                    )
        rows.append(row)
    return rows


def verdict(results: list[RuleResult]) -> str:
    """'passed' when no checked rule failed (or each that failed was waived).

    >>> verdict(evaluate_rules([Rule("con", "min", 0.9)], {"con": 0.95}))
    'passed'
    """
    return "failed" if any(r.blocks for r in results) else "passed"
