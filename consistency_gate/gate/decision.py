"""One decision: a comparison with the baseline, the rules' verdict on it, and how it is logged.

Shared by the gate of registered models (:mod:`consistency_gate.gate.run`) and the gate of
prediction files (:mod:`consistency_gate.gate.files`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from consistency_gate.core.evaluation import ComparisonResult
from consistency_gate.gate import config as gate_config
from consistency_gate.gate import rules
from consistency_gate.mlops import tracking
from consistency_gate.report.slices import flips_by_class
from consistency_gate.report.verdict import blocking

if TYPE_CHECKING:
    from mlflow.data.dataset import Dataset


IDENTICAL = (
    "the candidate answered exactly as the baseline on every sample (same labels, same scores): it looks like "
    "the baseline itself (the same model registered twice, or the candidate's path pointing at the baseline); "
    "check what --candidate and the baseline alias point to"
)


@dataclass
class Decision:
    """One candidate's comparison with the baseline and the verdict of the rules on it."""

    comparison: ComparisonResult
    rules: list[rules.RuleResult]
    verdict: str
    samples: pd.DataFrame  # the flip table (empty where nothing logs or draws it)
    ks: list[int]  # the k values counted (the top-k plot's)
    metrics: dict  # the reported metrics: the config's k values only
    first_generation: bool  # no baseline: the "comparison" is the candidate against itself
    reported_ks: tuple[int, ...]  # the config's k values
    cost: dict = field(default_factory=dict)  # serving cost (timed, so kept apart from the metrics)
    warnings: list[str] = field(default_factory=list)  # what the reviewer should know beyond the rules

    @classmethod
    def judge(
        cls,
        comparison: ComparisonResult,
        cfg: gate_config.GateConfig,
        samples: pd.DataFrame,
        ks: Sequence[int],
        first_generation: bool = False,
        cost: dict | None = None,
    ) -> Decision:
        """Apply the config's rules to a comparison (its metrics, intervals and slices) and to the
        serving ``cost`` of what is gated (:meth:`consistency_gate.mlops.cost.ServingCost.metrics`).

        >>> import numpy as np
        >>> from consistency_gate.core.evaluation import Evaluation
        >>> evaluation = Evaluation(["previous", "candidate"], [None, None], ks=[1])
        >>> evaluation.add(pd.Series(["a", "b"]), [pd.Series(["a", "b"]), pd.Series(["a", "a"])])
        >>> cfg = gate_config.parse_config("rules:\\n  - {metric: ctoi, max: 0.1}\\nks: [1]\\n")
        >>> decision = Decision.judge(evaluation.result(), cfg, pd.DataFrame(), [1])
        >>> decision.verdict, decision.metrics["ctoi"]
        ('failed', 0.5)
        """
        cost = cost or {}
        results = rules.evaluate_rules(
            cfg.rules,
            {**comparison.metrics, **cost},
            first_generation=first_generation,
            intervals=comparison.intervals,
            bounds=comparison.bounds,
            level=cfg.confidence,
            n=comparison.n,
            slices=comparison.slices,
            null_reasons=comparison.null_reasons,
        )
        reported = reported_metrics(comparison.metrics, cfg.ks, first_generation)
        warnings = []
        if not first_generation and comparison.counts is not None and comparison.counts.identical:
            warnings.append(IDENTICAL)
        return cls(
            comparison,
            results,
            rules.verdict(results),
            samples,
            list(ks),
            reported,
            first_generation,
            cfg.ks,
            cost,
            warnings,
        )

    @property
    def intervals(self) -> dict[str, list[float]]:
        """The intervals of the reported metrics (and ``acc_delta`` against a baseline)."""
        return reported_intervals(self.comparison.intervals, self.metrics, self.first_generation)

    @property
    def tests(self) -> dict[str, float]:
        """The paired test against the baseline (none for a first generation)."""
        return {} if self.first_generation else self.comparison.tests

    @property
    def slices(self) -> list[dict] | None:
        """Each slice's reported metrics and their intervals (None when the evaluation is not sliced)."""
        if self.comparison.slice_counts is None:
            return None
        rows = []
        for s in self.comparison.slices:
            metrics = reported_metrics(s.metrics, self.reported_ks, self.first_generation)
            intervals = reported_intervals(s.intervals, metrics, self.first_generation)
            rows.append({**s.to_dict(), "metrics": metrics, "intervals": intervals})
        return rows

    def log(self, model_id: str | None = None, dataset: Dataset | None = None) -> None:
        """Metrics and their intervals, rule table, slice table, flip table and plots into the
        active MLflow run; the metrics also linked to the candidate's logged model (``model_id``)
        measured on ``dataset``, when known. The report is logged once, with the verdict
        (:meth:`consistency_gate.gate.session.GateSession.log_verdict`)."""
        tracking.log_metrics({**self.metrics, **self.cost}, model_id=model_id, dataset=dataset)
        tracking.log_intervals(self.intervals, self.tests)
        tracking.log_rules([r.record() for r in self.rules])
        if self.slices is not None:
            tracking.log_slices(self.slices)
        tracking.log_samples(self.samples)
        tracking.log_pngs(self.pngs, "gate/plots")

    @functools.cached_property
    def pngs(self) -> dict[str, bytes]:
        """The decision's plots as PNG files (flips per class, the 2x2 table, the top-k curve)."""
        from consistency_gate.report import plots

        return plots.gate_pngs(self.samples, self.comparison.counts.flip_counts, self.comparison.metrics, self.ks)

    def html(self, report: dict, diagnosis: dict | None = None) -> str:
        """The HTML report of this decision (``report`` the final JSON report, ``diagnosis`` the
        two-generation ``diagnose`` report when the scores were there to make it)."""
        from consistency_gate.report.html import gate_html

        return gate_html(report, self.pngs, flips_by_class(self.samples), diagnosis)


def reported_metrics(metrics: dict, ks: tuple[int, ...], first_generation: bool) -> dict:
    """The metrics a gate reports: per-k metrics for the config's k values only; for a first
    generation only the candidate's own accuracy (pairwise metrics against itself mean nothing).

    >>> reported_metrics({"con": 0.9, "ccon@1": 0.9, "ccon@3": 0.99, "acc_candidate": 0.8}, (1,), False)
    {'con': 0.9, 'ccon@1': 0.9, 'acc_candidate': 0.8}
    """
    keep = {k: v for k, v in metrics.items() if "@" not in k or int(k.split("@")[1]) in ks}
    if first_generation:
        return {k: v for k, v in keep.items() if k == "acc_candidate" or k.startswith("cacc_candidate@")}
    return keep


def reported_intervals(intervals: dict, metrics: dict, first_generation: bool) -> dict:
    """The intervals of the reported ``metrics`` (and of ``acc_delta`` against a baseline).

    >>> reported_intervals({"con": [0.8, 0.95], "ccon@3": [0.9, 1.0], "acc_delta": [-0.1, 0.0]}, {"con": 0.9}, False)
    {'con': [0.8, 0.95], 'acc_delta': [-0.1, 0.0]}
    """
    keep = set(metrics) | (set() if first_generation else {"acc_delta"})
    return {k: v for k, v in intervals.items() if k in keep}


def tag_run(report: dict, move: bool = False) -> None:
    """The gate run's tags, from its report: the verdict (the report's: the final word, a repair's where one
    passed in the candidate's place), the rules the candidate failed, what the gate did (outcome), and the
    candidate's own verdict apart (``consistency_gate.candidate_verdict``). A ``move`` of the alias other than a
    promotion (a rollback, the guard's revert, an authorization) tags its outcome ``consistency_gate.moved``: it
    promoted nothing.

    Example::

        with mlflow.start_run():
            tag_run(result.to_dict())  # consistency_gate.verdict, .outcome, .candidate_verdict, .promoted
    """
    import mlflow

    tags = {
        "consistency_gate.verdict": report["verdict"],
        "consistency_gate.failed_rules": ", ".join(dict.fromkeys(r["metric"] for r in report["rules"] if blocking(r)))
        or "none",
        "consistency_gate.outcome": report["outcome"],
        "consistency_gate.candidate_verdict": report["candidate_verdict"],
        f"consistency_gate.{'moved' if move else 'promoted'}": {True: "True", False: "False"}.get(
            report["promoted"], "unknown"
        ),
    }
    if report["promotion"] and report["promoted"] is not True:
        tags["consistency_gate.promotion"] = report["promotion"]["reason"][:500]
    if report["registered_version"] is not None:
        tags["consistency_gate.ensemble_version"] = report["registered_version"]
    if report.get("warnings"):
        tags["consistency_gate.warning"] = "; ".join(report["warnings"])[:500]
    mlflow.set_tags(tags)
