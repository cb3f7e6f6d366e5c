"""What a gate decided: :class:`GateResult`, the ``--report`` JSON of ``consistency-gate check``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from consistency_gate.gate import rules
from consistency_gate.mlops.promotion import Promotion
from consistency_gate.report.schema import SCHEMA_VERSION

if TYPE_CHECKING:
    from consistency_gate.gate.decision import Decision

NOTHING_TO_DECIDE = "nothing to decide"


@dataclass
class GateResult:
    """The verdict and everything behind it; ``to_dict()`` is the ``--report`` JSON.

    ``candidate`` and ``baseline`` describe the two generations: a registered version
    (``name``, ``version``, ``alias``) or, for a gate of prediction files, ``name`` and the
    ``predictions`` file.

    >>> result = GateResult("passed", [], {"ctoi": 0.01}, None, {"name": "clf", "version": "2"}, None)
    >>> result.exit_code, result.outcome
    (0, 'passed')
    """

    verdict: str
    rules: list[rules.RuleResult]
    metrics: dict[str, float | None]
    run_id: str | None
    candidate: dict
    baseline: dict | None
    first_generation: bool = False
    registered_version: str | None = None
    promoted: bool | None = False  # None: the move was asked for and could not be read back
    promotion: dict | None = None  # promotion.Promotion.to_dict(): what the alias holds, and why
    ensemble: dict | None = None  # the (last) remediation attempt's report
    attempts: list[dict] = field(default_factory=list)  # one summary per remediation attempt, in order
    null_reasons: dict[str, str] = field(default_factory=dict)
    unknown_labels: dict[str, int] = field(default_factory=dict)
    n: int = 0
    confidence: float = 0.95
    intervals: dict[str, list[float]] = field(default_factory=dict)  # {metric: [low, high]} at ``confidence``
    tests: dict[str, float] = field(default_factory=dict)  # {"mcnemar_p": p}
    slices: list[dict] | None = None  # each slice's metrics and intervals, when the config names slices
    cost: dict = field(default_factory=dict)  # the candidate's serving cost (mlops/cost.py)
    timings: dict[str, float] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)  # MLflow UI links (http(s) tracking URIs only)
    warnings: list[str] = field(default_factory=list)  # e.g. a candidate identical to its baseline
    decision: dict | None = None  # a binary model's positive class and threshold (BinaryDecision.to_dict)
    samples: dict | None = None  # which samples were judged on and which tuned on (tuning.Split.to_dict)
    html: str | None = field(default=None, repr=False)  # the HTML report (gate/report.html), once made
    unwritten: list[str] = field(default_factory=list, repr=False)  # outputs that could not be written, and why

    @classmethod
    def of(cls, decision: Decision, candidate: dict, baseline: dict | None, run_id: str | None = None) -> GateResult:
        """The result of a gate that decided on the candidate alone (no remediation or promotion yet)."""
        comparison = decision.comparison
        return cls(
            verdict=decision.verdict,
            rules=decision.rules,
            metrics=decision.metrics,
            run_id=run_id,
            candidate=candidate,
            baseline=baseline,
            first_generation=decision.first_generation,
            null_reasons=comparison.null_reasons,
            unknown_labels=comparison.unknown_labels,
            n=comparison.n,
            confidence=comparison.confidence,
            intervals=decision.intervals,
            tests=decision.tests,
            slices=decision.slices,
            cost=decision.cost,
            warnings=list(decision.warnings),
        )

    @property
    def exit_code(self) -> int:
        """0 passed (or nothing to decide), 1 failed; 4 a promotion refused because the baseline
        moved, 5 a promotion whose outcome could not be read back."""
        if self.verdict == NOTHING_TO_DECIDE:
            return 0
        if self.verdict != "passed":
            return 1
        return Promotion(**self.promotion).exit_code if self.promotion else 0

    @property
    def candidate_verdict(self) -> str:
        """The single candidate's own verdict (``verdict`` is the final one, after remediation)."""
        return rules.verdict(self.rules)

    @property
    def outcome(self) -> str:
        """What happened, in one word: remediated (what remediation built passed and was registered in the
        candidate's place: a repair of a failed candidate, or the memory deployed with every candidate), passed
        (the candidate) or failed."""
        if self.verdict == NOTHING_TO_DECIDE:
            return NOTHING_TO_DECIDE
        if self.registered_version is not None:
            return "remediated"
        return "passed" if self.verdict == "passed" else "failed"

    @property
    def passed_version(self) -> str | None:
        """The registered version that passed, for a deploy step: the candidate, or the ensemble
        registered in its place; None when nothing passed (or files were gated, without versions), and
        when its promotion was refused because the baseline moved (it passed against a baseline that is
        no longer the one in production: gate it again), and whenever a promotion was asked for and the alias
        was not read back holding it (moved by someone else, or unknown).

        >>> GateResult("passed", [], {}, None, {"name": "clf", "version": "2"}, None).passed_version
        '2'
        >>> refused = {"alias": "champion", "version": "2", "promoted": False, "holds": "3", "refused": True}
        >>> GateResult("passed", [], {}, None, {"version": "2"}, None, promotion=refused).passed_version is None
        True
        >>> unknown = {"alias": "champion", "version": "2", "promoted": None, "holds": "unknown", "refused": False}
        >>> GateResult("passed", [], {}, None, {"version": "2"}, None, promotion=unknown).passed_version is None
        True
        """
        version = self.registered_version if self.registered_version is not None else self.candidate.get("version")
        promotion = self.promotion or {}
        if self.verdict != "passed" or promotion.get("refused") or (promotion and promotion.get("holds") != version):
            return None
        return version

    def to_dict(self) -> dict:
        """The JSON report (``--report``, ``--format json``, ``gate/report.json``)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "verdict": self.verdict,
            "candidate_verdict": self.candidate_verdict,
            "outcome": self.outcome,
            "passed_version": self.passed_version,
            "rules": [r.to_dict() for r in self.rules],
            "metrics": self.metrics,
            "run_id": self.run_id,
            "candidate": self.candidate,
            "baseline": self.baseline,
            "registered_version": self.registered_version,
            "ensemble": self.ensemble,
            "attempts": self.attempts,
            "first_generation": self.first_generation,
            "promoted": self.promoted,
            "promotion": self.promotion,
            "n": self.n,
            "unknown_labels": self.unknown_labels,
            "confidence": self.confidence,
            "intervals": self.intervals,
            "tests": self.tests,
            **({"slices": self.slices} if self.slices is not None else {}),
            "cost": self.cost,
            "null_reasons": self.null_reasons,
            "links": self.links,
            "warnings": self.warnings,
            "decision": self.decision,
            **({"samples": self.samples} if self.samples is not None else {}),
        }
