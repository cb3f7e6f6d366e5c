"""The gate: compare a candidate model version with the previous generation and decide.

:func:`run_gate` is the Python API a pipeline step calls; ``consistency-gate check`` is a
thin shell over it. It loads both generations from the MLflow Model Registry, validates
the evaluation data (great-expectations), predicts, computes the consistency
metrics, applies the configured rules, logs everything to one MLflow run, tags the
candidate version and, with ``promote=True`` and a pass, moves the baseline alias.

    result = run_gate("digits", data="eval.csv", tracking_uri="sqlite:///mlflow.db")
    result.verdict            # 'passed' or 'failed'
    result.exit_code          # 0 or 1
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from consistency_gate.core.evaluation import ComparisonResult, Evaluation, flip_table
from consistency_gate.core.slices import TRUE_CLASS
from consistency_gate.engines.spark import SparkModel, gate_comparison
from consistency_gate.errors import (
    DataError,
    GateError,
    TrackingError,
    UsageError,
    redact_credentials,
)
from consistency_gate.gate import rules
from consistency_gate.io import predictions as io
from consistency_gate.mlops import registry, scoring, store, tracking

if TYPE_CHECKING:
    import mlflow
    from mlflow import MlflowClient

DEFAULT_BASELINE = "@champion"
NOTHING_TO_DECIDE = "nothing to decide"
# with --engine spark the driver validates (great-expectations) and diagnoses this many first rows
SPARK_SAMPLE_ROWS = 10_000
# how long a failing gate keeps trying to mark its runs FAILED on a tracking server that went away
END_RUN_RETRY_S = float(os.environ.get("CONSISTENCY_GATE_END_RUN_RETRY_S", "30"))


@dataclass
class GateResult:
    """The verdict and everything behind it; ``to_dict()`` is the ``--report`` JSON."""

    verdict: str
    rules: list[rules.RuleResult]
    metrics: dict[str, float | None]
    run_id: str | None
    candidate: dict
    baseline: dict | None
    first_generation: bool = False
    registered_version: str | None = None
    promoted: bool = False
    promotion: dict | None = None  # registry.Promotion.to_dict(): what the alias holds, and why
    ensemble: dict | None = None
    null_reasons: dict[str, str] = field(default_factory=dict)
    unknown_labels: dict[str, int] = field(default_factory=dict)
    n: int = 0
    confidence: float = 0.95
    intervals: dict[str, list[float]] = field(default_factory=dict)  # {metric: [low, high]} at ``confidence``
    tests: dict[str, float] = field(default_factory=dict)  # {"mcnemar_p": p}
    slices: list[dict] | None = None  # each slice's metrics and intervals, when the config names slices
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 passed (or nothing to decide), 1 failed; 4 a promotion refused because the baseline
        moved, 5 a promotion whose outcome could not be read back."""
        if self.verdict == NOTHING_TO_DECIDE:
            return 0
        if self.verdict != "passed":
            return 1
        return registry.Promotion(**self.promotion).exit_code if self.promotion else 0

    @property
    def candidate_verdict(self) -> str:
        """The single candidate's own verdict (``verdict`` is the final one, after remediation)."""
        return rules.verdict(self.rules)

    @property
    def outcome(self) -> str:
        """What happened, in one word: passed (the candidate), remediated (an ensemble passed and was
        registered in its place) or failed."""
        if self.verdict == NOTHING_TO_DECIDE:
            return NOTHING_TO_DECIDE
        if self.candidate_verdict == "passed":
            return "passed"
        return "remediated" if self.registered_version is not None else "failed"

    def to_dict(self) -> dict:
        """The JSON report (``--report``, ``--format json``, ``gate/report.json``)."""
        return {
            "verdict": self.verdict,
            "candidate_verdict": self.candidate_verdict,
            "outcome": self.outcome,
            "rules": [r.to_dict() for r in self.rules],
            "metrics": self.metrics,
            "run_id": self.run_id,
            "candidate": self.candidate,
            "baseline": self.baseline,
            "registered_version": self.registered_version,
            "ensemble": self.ensemble,
            "first_generation": self.first_generation,
            "promoted": self.promoted,
            "promotion": self.promotion,
            "n": self.n,
            "unknown_labels": self.unknown_labels,
            "confidence": self.confidence,
            "intervals": self.intervals,
            "tests": self.tests,
            **({"slices": self.slices} if self.slices is not None else {}),
            "null_reasons": self.null_reasons,
        }


@contextlib.contextmanager
def _timed(timings: dict[str, float], phase: str) -> Iterator[None]:
    """Add the time spent in the block to ``timings[phase]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[phase] = timings.get(phase, 0.0) + time.perf_counter() - start


@dataclass
class _GateRun:
    """One gate's inputs and what it has done so far, shared by its steps."""

    client: MlflowClient
    cfg: rules.GateConfig
    cand_ref: registry.ModelRef
    base_ref: registry.ModelRef | None
    frame: pd.DataFrame
    data_path: Path
    label_column: str
    id_column: str | None
    promote: bool
    quiet: bool
    engine: str
    partitions: int | None
    timings: dict[str, float]
    started: list[str] = field(default_factory=list)  # the runs it opened: the gate run, a remediation run

    @property
    def run_id(self) -> str:
        return self.started[0]

    def timed(self, phase: str) -> contextlib.AbstractContextManager[None]:
        return _timed(self.timings, phase)

    @property
    def data_slices(self) -> tuple[str, ...]:
        """The slicing columns read from the evaluation data (all but the built-in true class)."""
        return _data_slices(self.cfg)

    @property
    def non_features(self) -> tuple[str, ...]:
        """The evaluation data's columns that no model reads: label, id, slicing columns."""
        return scoring.non_features(self.label_column, self.id_column, self.data_slices)


def _data_slices(cfg: rules.GateConfig) -> tuple[str, ...]:
    return tuple(c for c in cfg.slices if c != TRUE_CLASS)


def run_gate(
    model: str,
    data: str | Path,
    *,
    candidate: str | None = None,
    baseline: str | None = None,
    label_column: str = "label",
    id_column: str | None = None,
    config: str | Path | rules.GateConfig | None = None,
    tracking_uri: str | None = None,
    report_path: str | Path | None = None,
    promote: bool = False,
    quiet: bool = False,
    engine: str = "local",
    partitions: int | None = None,
) -> GateResult:
    """Run the gate on registered model ``model``; see the module docstring.

    ``candidate`` is a version number or ``@alias`` (default: the latest version);
    ``baseline`` an ``@alias`` or version (default ``@champion``; if that alias is not set
    yet, the candidate is a first generation and only single-model rules are checked).
    ``engine="spark"`` predicts and counts on Apache Spark (``mlflow.pyfunc.spark_udf``), for
    evaluation sets past one machine; the driver then reads only the first ``SPARK_SAMPLE_ROWS``
    rows, to validate them and for the two-generation diagnosis.
    Raises a :class:`~consistency_gate.errors.GateError` with its exit code (2 usage, 3 data,
    4 model, 5 tracking) on error.

    >>> result = run_gate("fraud-clf", "eval.parquet", config="gate.yaml")  # doctest: +SKIP
    >>> result.verdict, result.exit_code, result.intervals["ctoi"]  # doctest: +SKIP
    ('failed', 1, [0.019, 0.031])
    """
    import mlflow

    if engine not in ("local", "spark"):
        raise UsageError(f"engine must be 'local' or 'spark', got {engine!r}")
    timings: dict[str, float] = {}
    cfg = config if isinstance(config, rules.GateConfig) else rules.load_config(config)
    uri, client = store.connect(tracking_uri)

    with _timed(timings, "registry"):
        cand_ref, base_ref = _versions(client, model, candidate, baseline)
    if base_ref is not None and base_ref.version == cand_ref.version:
        return _same_version(cand_ref, base_ref, report_path)
    sample = SPARK_SAMPLE_ROWS if engine == "spark" else None
    frame = io.read_evaluation_data(Path(data), label_column, id_column, max_rows=sample, slices=_data_slices(cfg))

    run = _start_run(cand_ref, uri)
    gate = _GateRun(
        client, cfg, cand_ref, base_ref, frame, Path(data), label_column, id_column, promote, quiet, engine,
        partitions, timings, started=[run.info.run_id],
    )  # fmt: skip
    try:
        mlflow.set_tags(tracking.owner_tags())
        tracking.close_orphaned_runs(client, run.info.experiment_id, run.info.run_id)
        result = _gate_in_run(gate)
        if report_path:
            Path(report_path).write_text(json.dumps(result.to_dict(), indent=2, default=str))
        mlflow.end_run("FINISHED")
        return result
    except BaseException as exc:
        error = _failed(exc, gate, uri, report_path)
        if error is exc:
            raise
        raise error from exc


def _versions(
    client: MlflowClient, model: str, candidate: str | None, baseline: str | None
) -> tuple[registry.ModelRef, registry.ModelRef | None]:
    """The candidate version and the baseline (None: a first generation, when the default
    ``@champion`` is not set yet)."""
    cand_ref = registry.resolve_version(client, model, None if candidate is None else str(candidate))
    base_spec = str(baseline or DEFAULT_BASELINE)
    if baseline is None and not registry.alias_exists(client, model, base_spec[1:]):
        return cand_ref, None
    return cand_ref, registry.resolve_version(client, model, base_spec)


def _start_run(cand_ref: registry.ModelRef, uri: str) -> mlflow.ActiveRun:
    """The gate's run, in the model's gate experiment, leaving the caller's active experiment as
    it was; inside a pipeline's own run, the gate's run nests under it."""
    import mlflow

    try:
        return mlflow.start_run(
            experiment_id=tracking.experiment_id(tracking.experiment_name(cand_ref.name), uri),
            run_name=f"gate {cand_ref.name} v{cand_ref.version}",
            nested=mlflow.active_run() is not None,
        )
    except Exception as exc:  # noqa: BLE001 - MLflow and requests raise many kinds here
        raise store.refusal(exc, uri) or TrackingError(
            f"cannot start an MLflow run on {redact_credentials(uri)}: {exc}"
        ) from None


def _failed(exc: BaseException, gate: _GateRun, uri: str, report_path: str | Path | None) -> BaseException:
    """End the gate's runs FAILED and return the error to raise: a refusal or an unreachable
    server as TrackingError, naming the runs left RUNNING; written to the report if one is asked."""
    left = _end_failed(exc, gate.started, gate.client)
    error = exc
    if not isinstance(exc, GateError):
        refused = store.refusal(exc, uri)
        if refused is not None:
            error = refused
        elif store.looks_unreachable(exc):
            error = TrackingError(f"tracking server or storage became unreachable during the gate: {exc}")
    if left:
        error = type(error)(
            f"{error}; runs left RUNNING (the server did not answer within {END_RUN_RETRY_S:.0f} s): "
            f"{', '.join(left)}: the next gate of '{gate.cand_ref.name}' marks them FAILED"
        )
    if report_path and isinstance(error, GateError):
        report = {"verdict": "error", "error": redact_credentials(str(error)), "run_id": gate.run_id}
        Path(report_path).write_text(json.dumps({**report, "left_running": left}, indent=2))
    return error


def _same_version(
    cand_ref: registry.ModelRef, base_ref: registry.ModelRef, report_path: str | Path | None
) -> GateResult:
    """The candidate is the baseline itself: nothing to decide, so no run, no tag, no promotion."""
    against = f"@{base_ref.alias}" if base_ref.alias else f"v{base_ref.version}"
    result = GateResult(
        verdict=NOTHING_TO_DECIDE,
        rules=[],
        metrics={},
        run_id=None,
        candidate=cand_ref.to_dict(),
        baseline=base_ref.to_dict(),
        null_reasons={"*": f"the candidate v{cand_ref.version} is the baseline {against} itself"},
    )
    if report_path:
        Path(report_path).write_text(json.dumps(result.to_dict(), indent=2, default=str))
    return result


def _end_failed(exc: BaseException, run_ids: list[str], client: MlflowClient) -> list[str]:
    """End the gate's runs (the gate run and a nested remediation run) as FAILED, retrying while
    the tracking server comes back within ``END_RUN_RETRY_S``; returns the ids left RUNNING."""
    import mlflow

    # leave the fluent stack as the caller had it: pop only the runs this gate started
    for _ in run_ids:
        active = mlflow.active_run()
        if active is None or active.info.run_id not in run_ids:
            break
        with contextlib.suppress(Exception):  # popped even when the store is gone; closed below
            mlflow.end_run("FAILED")
    return tracking.close_runs(
        client, run_ids, "FAILED", f"{type(exc).__name__}: {redact_credentials(str(exc))}", END_RUN_RETRY_S
    )


@dataclass
class _Decision:
    """One model's comparison with the baseline and the verdict of the rules on it."""

    comparison: ComparisonResult
    rules: list[rules.RuleResult]
    verdict: str
    samples: pd.DataFrame
    ks: list[int]
    metrics: dict  # the reported metrics: the config's k values only
    first_generation: bool  # no baseline: the "comparison" is the candidate against itself
    reported_ks: tuple[int, ...]  # the config's k values

    @property
    def intervals(self) -> dict[str, list[float]]:
        """The intervals of the reported metrics (and ``acc_delta`` against a baseline)."""
        return _reported_intervals(self.comparison.intervals, self.metrics, self.first_generation)

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
            metrics = _reported_metrics(s.metrics, self.reported_ks, self.first_generation)
            intervals = _reported_intervals(s.intervals, metrics, self.first_generation)
            rows.append({**s.to_dict(), "metrics": metrics, "intervals": intervals})
        return rows


@dataclass
class _Comparer:
    """Decides on candidates against the baseline, over the gate's evaluation set, in-process or on Spark.

    ``gate.frame`` is the whole evaluation set in-process, and the validated sample on Spark, where
    the models predict the whole file inside the Spark job instead.
    """

    gate: _GateRun
    baseline: scoring.LoadedModel | None = None
    base_scores: pd.DataFrame | None = None  # the baseline's scores on ``gate.frame``

    def decide(self, cand_scores: pd.DataFrame, cand_model: SparkModel) -> _Decision:
        """The comparison and the rules' verdict: ``cand_scores`` are the candidate's scores on
        the gate's frame, ``cand_model`` says how Spark loads it (unused in-process)."""
        gate, cfg = self.gate, self.gate.cfg
        first_generation = self.base_scores is None
        frames = [cand_scores, cand_scores] if first_generation else [self.base_scores, cand_scores]
        width = min(len(f.columns) for f in frames)
        too_large = [k for k in cfg.ks if k > width]
        if too_large and cfg.ks_given:
            raise UsageError(
                f"{cfg.source}: ks {too_large} larger than the {width} classes the models know; use k <= {width}"
            )
        ks = sorted({k for k in cfg.ks if k <= width} | set(range(1, min(10, width) + 1)))
        if gate.engine == "spark":
            base = [] if first_generation else [self.spark_model(self.baseline, self.base_scores)]
            comparison, samples = gate_comparison(
                gate.data_path,
                [*base, cand_model],
                label_column=gate.label_column,
                id_column=gate.id_column,
                ks=ks,
                partitions=gate.partitions,
                slices=cfg.slices,
            )
            comparison.confidence, comparison.interval_method = cfg.confidence, cfg.interval_method
        else:
            frame = gate.frame
            evaluation = Evaluation(
                ["previous", "candidate"],
                [list(f.columns) for f in frames],
                ks=ks,
                keep_samples=True,
                slices=cfg.slices,
            )
            evaluation.add(
                frame[gate.label_column].astype(str),
                frames,
                where=str(gate.data_path),
                slices={c: frame[c] for c in gate.data_slices},
            )
            comparison = evaluation.result(confidence=cfg.confidence, interval_method=cfg.interval_method)
            ids = frame[gate.id_column].to_numpy() if gate.id_column else np.arange(len(frame))
            samples = flip_table(evaluation.samples(), ids)
        results = rules.evaluate_rules(
            cfg.rules,
            comparison.metrics,
            first_generation=first_generation,
            intervals=comparison.intervals,
            level=cfg.confidence,
            n=comparison.n,
            slices=comparison.slices,
        )
        reported = _reported_metrics(comparison.metrics, cfg.ks, first_generation)
        return _Decision(comparison, results, rules.verdict(results), samples, ks, reported, first_generation, cfg.ks)

    def spark_model(self, model: scoring.LoadedModel, scores: pd.DataFrame) -> SparkModel:
        """How Spark loads a registered version: its classes are those its scorer gave on the sample."""
        frame = scoring.feature_frame(model, self.gate.frame, self.gate.non_features)
        features = model.features or list(frame.columns)
        return SparkModel(model.ref.uri, model.flavor, list(scores.columns), features)


def _log_decision(decision: _Decision, report: dict) -> None:
    """Metrics, rule table, flip table, plots and JSON report into the active run."""
    tracking.log_metrics(decision.metrics)
    tracking.log_intervals(decision.intervals, decision.tests)
    rows = [{**r.to_dict(), "rule": r.rule.describe()} for r in decision.rules]
    tracking.log_rules([{k: v for k, v in row.items() if k != "slices"} for row in rows])  # slices: their own table
    if decision.slices is not None:
        tracking.log_slices(decision.slices)
    tracking.log_samples(decision.samples)
    tracking.log_plots(
        decision.samples, decision.comparison.counts.flip_counts, decision.comparison.metrics, decision.ks
    )
    tracking.log_json(report, "gate/report.json")


def _gate_in_run(gate: _GateRun) -> GateResult:
    """The gate inside its run: load, validate, predict, decide, tag, remediate, promote."""
    cfg, cand_ref, base_ref, frame = gate.cfg, gate.cand_ref, gate.base_ref, gate.frame
    _log_params(gate)
    with gate.timed("registry"):
        models = [scoring.load_model(ref, cfg.classes) for ref in ([base_ref] if base_ref else []) + [cand_ref]]
    with gate.timed("validation"):
        _validate(gate, models)
    with gate.timed("predict"):  # on Spark: the sample only (classes, diagnosis); the job predicts the rest
        frames = [scoring.predict(m, frame, gate.non_features) for m in models]
    base_scores = frames[0] if base_ref else None
    comparer = _Comparer(gate, models[0] if base_ref else None, base_scores)
    with gate.timed("metrics"):
        single = comparer.decide(frames[-1], comparer.spark_model(models[-1], frames[-1]))
    result = GateResult(
        verdict=single.verdict,
        rules=single.rules,
        metrics=single.metrics,
        run_id=gate.run_id,
        candidate=cand_ref.to_dict(),
        baseline=base_ref.to_dict() if base_ref else None,
        first_generation=base_ref is None,
        null_reasons=single.comparison.null_reasons,
        unknown_labels=single.comparison.unknown_labels,
        n=single.comparison.n,
        confidence=cfg.confidence,
        intervals=single.intervals,
        tests=single.tests,
        slices=single.slices,
    )
    with gate.timed("logging"):
        _log_decision(single, result.to_dict())
        if base_scores is not None:
            _log_diagnosis(base_scores, frames[-1], frame[gate.label_column])
        registry.tag_version(gate.client, cand_ref, single.verdict, _kind(cand_ref), gate.run_id)
    promoted_version = cand_ref.version if single.verdict == "passed" else None
    if single.verdict == "failed" and cfg.remediation is not None:
        with gate.timed("remediation"):
            result.ensemble = _remediate(gate, comparer, models[-1])
        result.verdict = result.ensemble["verdict"]
        result.registered_version = result.ensemble["registered_version"]
        promoted_version = result.registered_version
    with gate.timed("logging"):
        if gate.promote and promoted_version is not None:
            alias = (base_ref.alias if base_ref else None) or DEFAULT_BASELINE[1:]
            expected = base_ref.version if base_ref else None
            promotion = registry.promote(gate.client, cand_ref.name, alias, promoted_version, expected, gate.run_id)
            result.promoted = promotion.promoted
            result.promotion = promotion.to_dict()
        tracking.log_json(result.to_dict(), "gate/report.json")
        _tag_run(result)
    result.timings = dict(gate.timings)
    return result


def _log_params(gate: _GateRun) -> None:
    """The gate's inputs as run params, and its rules as ``gate/config.json``."""
    import mlflow

    base_ref, cfg = gate.base_ref, gate.cfg
    mlflow.log_params(
        {
            "model": gate.cand_ref.name,
            "candidate_version": gate.cand_ref.version,
            "baseline_version": base_ref.version if base_ref else "none (first generation)",
            "baseline_alias": base_ref.alias if base_ref else "",
            "data": str(gate.data_path),
            "n_rows": len(gate.frame)
            if gate.engine == "local"
            else f"spark (validated on the first {len(gate.frame)})",
            "label_column": gate.label_column,
            "engine": gate.engine,
            "config": cfg.source,
            "remediation": cfg.remediation.settings.method if cfg.remediation else "off",
        }
    )
    tracking.log_json([{"metric": r.metric, r.kind: r.threshold} for r in cfg.rules], "gate/config.json")


def _tag_run(result: GateResult) -> None:
    """The gate run's tags: the candidate's own verdict, and what the gate did about it."""
    import mlflow

    tags = {
        "consistency_gate.verdict": result.candidate_verdict,
        "consistency_gate.outcome": result.outcome,
        "consistency_gate.promoted": str(result.promoted),
    }
    if result.promotion and not result.promoted:
        tags["consistency_gate.promotion"] = result.promotion["reason"][:500]
    if result.registered_version is not None:
        tags["consistency_gate.ensemble_version"] = result.registered_version
    mlflow.set_tags(tags)


def _log_diagnosis(base_scores: pd.DataFrame, cand_scores: pd.DataFrame, labels: pd.Series) -> None:
    """The two-generation `diagnose` report, so a reviewer sees why the candidate flipped."""
    from consistency_gate.diagnostics.diagnose import diagnose, frames_to_arrays

    names, probs, y, classes = frames_to_arrays(
        {"previous": base_scores, "candidate": cand_scores}, labels.astype(str).reset_index(drop=True)
    )
    report = diagnose(names, probs, y, classes)
    tracking.log_json(report, "gate/diagnose.json")
    import mlflow

    mlflow.log_text("\n".join(f"- {line}" for line in report["explanation"]), "gate/diagnose.md")


def _kind(ref: registry.ModelRef) -> str:
    """'ensemble' for versions that remediation registered, else 'single'."""
    return "ensemble" if ref.tags.get(registry.TAG_KIND) == "ensemble" else "single"


def _remediate(gate: _GateRun, comparer: _Comparer, cand_model: scoring.LoadedModel) -> dict:
    """Train the configured ensemble in a nested run, gate it, and register it if it passes."""
    import mlflow

    from consistency_gate.ensembles.model import log_ensemble
    from consistency_gate.ensembles.remediation import log_build, train_ensemble

    cfg, frame, data_path, cand_ref = gate.cfg, gate.frame, gate.data_path, gate.cand_ref
    method = cfg.remediation.settings.method
    gate_experiment = mlflow.active_run().info.experiment_id
    with mlflow.start_run(experiment_id=gate_experiment, run_name=f"remediation: {method}", nested=True) as child:
        gate.started.append(child.info.run_id)
        mlflow.set_tags(tracking.owner_tags())
        ensemble, build = train_ensemble(cfg.remediation, cand_model.features, gate.non_features, gate.quiet)
        log_build(build)
        model_info = log_ensemble(ensemble)
        missing = [c for c in ensemble.features if c not in frame.columns]
        if missing:
            raise DataError(f"{data_path}: the ensemble's feature column '{missing[0]}' is missing")
        scores = ensemble.predict_frame(frame)
        spark_model = SparkModel(model_info.model_uri, "pyfunc", list(scores.columns), list(ensemble.features))
        decision = comparer.decide(scores, spark_model)
        report = {
            "verdict": decision.verdict,
            "rules": [r.to_dict() for r in decision.rules],
            "metrics": decision.metrics,
            "intervals": decision.intervals,
            "tests": decision.tests,
            **({"slices": decision.slices} if decision.slices is not None else {}),
            "method": method,
            "members": len(build.members),
            "runs": len(build.runs),
            "kappa": build.kappa,
            "train_seconds": build.seconds,
            "run_id": child.info.run_id,
            "registered_version": None,
        }
        _log_decision(decision, report)
        if decision.verdict == "passed":
            version = str(mlflow.register_model(model_info.model_uri, cand_ref.name).version)
            ensemble_ref = registry.ModelRef(cand_ref.name, version)
            registry.tag_version(
                gate.client, ensemble_ref, "passed", "ensemble", gate.run_id, replaces=cand_ref.version
            )
            report["registered_version"] = version
            tracking.log_json(report, "gate/report.json")
    return report


def _reported_metrics(metrics: dict, ks: tuple[int, ...], first_generation: bool) -> dict:
    keep = {k: v for k, v in metrics.items() if "@" not in k or int(k.split("@")[1]) in ks}
    if first_generation:  # pairwise metrics of a model against itself mean nothing
        return {k: v for k, v in keep.items() if k == "acc_candidate" or k.startswith("cacc_candidate@")}
    return keep


def _reported_intervals(intervals: dict, metrics: dict, first_generation: bool) -> dict:
    """The intervals of the reported ``metrics`` (and of ``acc_delta`` against a baseline)."""
    keep = set(metrics) | (set() if first_generation else {"acc_delta"})
    return {k: v for k, v in intervals.items() if k in keep}


def _validate(gate: _GateRun, models: list[scoring.LoadedModel]) -> None:
    """Validate the evaluation data (great-expectations) before anything is predicted.

    A feature column a model reads but the data lacks is the first cause reported, and alone:
    without it the model cannot predict, so its classes are unknown and the labels are not
    checked against them (that check would only report every label as unexpected).
    """
    from consistency_gate.io.validation import validate_evaluation_data

    frame, label_column = gate.frame, gate.label_column
    features: dict[str, str | None] = {}
    for m in models:
        for name in m.features or []:
            features[name] = m.feature_types.get(name)
    missing = [name for name in features if name not in frame.columns]
    known = None
    if not missing:
        known = sorted({str(c) for m in models for c in scoring.model_classes(m, frame, gate.non_features)})
    report = validate_evaluation_data(frame, label_column, features, known)
    tracking.log_json(report.result, "gate/data_validation.json")
    if missing:
        reader = next(m for m in models if missing[0] in (m.features or []))
        others = f" (and {len(missing) - 1} more: {', '.join(missing[1:4])})" if len(missing) > 1 else ""
        raise DataError(
            f"{gate.data_path}: feature column '{missing[0]}' is missing{others}; {reader.ref.uri} reads it (its "
            "signature names it): add the column to the evaluation data, or gate a model logged with its columns"
        )
    if not report.success:
        raise DataError(f"evaluation data failed validation ({len(report.failures)} expectations): {report.summary()}")
