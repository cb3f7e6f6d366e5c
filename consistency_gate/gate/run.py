"""The gate: compare a candidate model version with the previous generation and decide.

:func:`run_gate` is the Python API a pipeline step calls; ``consistency-gate check`` is a
thin shell over it. This module only orchestrates; each step is a call into the module that owns it:

1. load: resolve both versions in the Model Registry (:mod:`~consistency_gate.mlops.registry`) and
   load them as scorers (:mod:`~consistency_gate.mlops.scoring`);
2. validate the evaluation data against what they read (:mod:`~consistency_gate.gate.validate`);
3. predict it with both (and with the seed replica, :mod:`~consistency_gate.gate.floor`);
4. decide: the comparison and the rules' verdict (:class:`~consistency_gate.gate.comparer.Comparer`);
5. log everything to one MLflow run and tag the candidate (:mod:`~consistency_gate.gate.session`);
6. repair a failed candidate, cheapest first (:mod:`~consistency_gate.gate.remediate`);
7. promote: with ``promote=True`` and a pass, move the baseline alias (:mod:`~consistency_gate.mlops.registry`).

    result = run_gate("digits", data="eval.csv", tracking_uri="sqlite:///mlflow.db")
    result.verdict            # 'passed' or 'failed'
    result.exit_code          # 0 or 1
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from consistency_gate.core import names
from consistency_gate.ensembles.methods import kinds
from consistency_gate.errors import ModelError, UsageError
from consistency_gate.gate import config as gate_config
from consistency_gate.gate import remediate
from consistency_gate.gate.comparer import Comparer, GateRun, add_time, binary_decision, data_slices
from consistency_gate.gate.decision import Decision
from consistency_gate.gate.floor import replica_scores
from consistency_gate.gate.history import Generation, gate_history
from consistency_gate.gate.result import NOTHING_TO_DECIDE, GateResult
from consistency_gate.gate.session import GateSession
from consistency_gate.gate.tuning import TUNING_IDS, hold_out
from consistency_gate.gate.validate import takes_shaped_tensors, validate_inputs
from consistency_gate.io import predictions as io
from consistency_gate.mlops import datasets, promotion, registry, scoring, tracking

if TYPE_CHECKING:
    from mlflow import MlflowClient

DEFAULT_BASELINE = f"@{promotion.DEFAULT_ALIAS}"
IN_MEMORY = "DataFrame"  # how errors, params and the logged dataset name evaluation data given in memory
# with --engine spark the driver validates (great-expectations) and diagnoses this many first rows
SPARK_SAMPLE_ROWS = 10_000


def run_gate(
    model: str,
    data: str | Path | pd.DataFrame,
    *,
    candidate: str | None = None,
    baseline: str | None = None,
    label_column: str = "label",
    id_column: str | None = None,
    config: str | Path | gate_config.GateConfig | None = None,
    tracking_uri: str | None = None,
    report_path: str | Path | None = None,
    promote: bool = False,
    quiet: bool = False,
    engine: str = "local",
    partitions: int | None = None,
    cost: bool = False,
    floor: str | None = None,
) -> GateResult:
    """Run the gate on registered model ``model``; see the module docstring.

    ``candidate`` is a version number or ``@alias`` (default: the latest version);
    ``baseline`` an ``@alias`` or version (default ``@champion``; if that alias is not set
    yet, the candidate is a first generation and only single-model rules are checked).
    ``data`` is a file (CSV, Parquet, ``.npz``) or a pandas DataFrame with the same columns.
    ``engine="spark"`` predicts and counts on Apache Spark (``mlflow.pyfunc.spark_udf``), for
    evaluation sets past one machine; the driver then reads only the first ``SPARK_SAMPLE_ROWS``
    rows, to validate them and for the two-generation diagnosis. The candidate's serving cost
    (timed predictions, size on disk) is measured when ``cost`` is True, a rule is on a cost
    metric, or remediation builds something whose cost is compared with it. ``floor`` (or the
    config's ``floor:``) names a seed replica of the baseline, a version or ``@alias`` of the model:
    the report then gives the churn no retrain avoids and ``ctoi_excess``.
    Raises a :class:`~consistency_gate.errors.GateError` with its exit code (2 usage, 3 data,
    4 model, 5 tracking) on error.

    Example::

        result = run_gate("fraud-clf", "eval.parquet", config="gate.yaml")
        result.verdict, result.exit_code, result.intervals["ctoi"]
        # ('failed', 1, [0.019, 0.031])
    """
    with GateSession(report_path) as session:
        if engine not in ("local", "spark"):
            raise UsageError(f"engine must be 'local' or 'spark', got {engine!r}")
        timings: dict[str, float] = {}
        cfg = config if isinstance(config, gate_config.GateConfig) else gate_config.load_config(config)
        if engine == "spark" and cfg.remediation is not None and cfg.remediation.tuning_share is not None:
            raise UsageError(
                f"{cfg.source}: remediation: tuning_share holds samples out of the evaluation set in memory, and "
                "--engine spark reads the file in the Spark job: name a calibration: file instead"
            )
        if floor is not None:
            cfg = replace(cfg, floor=str(floor))
        _, client = session.connect(tracking_uri, existing=True)

        with add_time(timings, "registry"):
            cand_ref, base_ref = _versions(client, model, candidate, baseline)
        if base_ref is not None and base_ref.version == cand_ref.version:
            return session.finish(_same_version(cand_ref, base_ref))
        if isinstance(data, pd.DataFrame):
            if engine == "spark":
                raise UsageError("engine='spark' reads the evaluation data from a file (Parquet or CSV); give its path")
            frame = io.evaluation_frame(data, label_column, id_column, data_slices(cfg), IN_MEMORY)
            data = IN_MEMORY
        else:
            sample = SPARK_SAMPLE_ROWS if engine == "spark" else None
            slices = data_slices(cfg)
            frame = io.read_evaluation_data(Path(data), label_column, id_column, max_rows=sample, slices=slices)

        name = cand_ref.name
        session.start(tracking.experiment_name(name), f"gate {name} v{cand_ref.version}", owner=name)
        gate = GateRun(
            session, cfg, cand_ref, base_ref, frame, Path(data), label_column, id_column, promote, quiet, engine,
            partitions, timings, measure_cost=cost or any(r.metric in names.COST_METRICS for r in cfg.rules),
        )  # fmt: skip
        return session.finish(_gate_in_run(gate))


def _versions(
    client: MlflowClient, model: str, candidate: str | None, baseline: str | None
) -> tuple[registry.ModelRef, registry.ModelRef | None]:
    """The candidate version and the baseline (None: a first generation, when the default
    ``@champion`` is not set yet and the model has no version before the candidate; with earlier
    versions that may be in production a missing alias is a ModelError, not a silent pass on
    single-model rules; versions a gate failed never were)."""
    cand_ref = registry.resolve_version(client, model, None if candidate is None else str(candidate))
    base_spec = str(baseline or DEFAULT_BASELINE)
    try:
        return cand_ref, registry.resolve_version(client, model, base_spec)  # the alias read once where it is set
    except ModelError:
        if baseline is not None or registry.alias_exists(client, model, base_spec[1:]):
            raise
    earlier = registry.possible_baselines(client, model, int(cand_ref.version))
    if earlier:  # a model with history and no alias: a mis-wired baseline, never a silent first generation
        raise ModelError(
            f"model '{model}' has earlier versions ({', '.join(map(str, earlier[-5:]))}) but no version holds "
            f"{base_spec}, so v{cand_ref.version} has no baseline to be gated against: pass --baseline VERSION "
            f"(e.g. --baseline {earlier[-1]}), or set the alias on the version in production "
            f"(MlflowClient().set_registered_model_alias('{model}', '{base_spec[1:]}', VERSION))"
        )
    return cand_ref, None


def _same_version(cand_ref: registry.ModelRef, base_ref: registry.ModelRef) -> GateResult:
    """The candidate is the baseline itself: nothing to decide, so no run, no tag, no promotion."""
    against = f"@{base_ref.alias}" if base_ref.alias else f"v{base_ref.version}"
    return GateResult(
        verdict=NOTHING_TO_DECIDE,
        rules=[],
        metrics={},
        run_id=None,
        candidate=cand_ref.to_dict(),
        baseline=base_ref.to_dict(),
        null_reasons={"*": f"the candidate v{cand_ref.version} is the baseline {against} itself"},
    )


def _gate_in_run(gate: GateRun) -> GateResult:
    """The gate inside its run: load, validate, predict, decide, tag, remediate, promote."""
    cfg, cand_ref, base_ref, frame = gate.cfg, gate.cand_ref, gate.base_ref, gate.frame
    _log_params(gate)
    with gate.timed("registry"):
        models = [scoring.load_model(ref, cfg.classes) for ref in ([base_ref] if base_ref else []) + [cand_ref]]
    tensors = [m.ref.uri for m in models if takes_shaped_tensors(m, gate)]
    if gate.engine == "spark" and tensors:
        raise UsageError(
            f"{tensors[0]} takes each sample as an array (a tensor input); --engine spark gates models with column "
            "signatures: gate it with --engine local, or on prediction files (--candidate-predictions)"
        )
    with gate.timed("validation"):
        validate_inputs(gate, models)
    with gate.timed("logging"):
        if gate.engine == "spark":  # the whole file, as the Spark job reads it
            from consistency_gate.engines.spark import read_table, spark_session

            table = read_table(spark_session(gate.partitions), gate.data_path)
            gate.dataset = datasets.log_spark_evaluation_data(table, gate.data_path, gate.label_column)
        else:
            gate.dataset = datasets.log_evaluation_data(frame, gate.data_path, gate.label_column)
        frame = _hold_out(gate)
    with gate.timed("predict"):  # on Spark: the sample only (classes, diagnosis); the job predicts the rest
        frames = [scoring.predict(m, frame, gate.non_features) for m in models]
    label_only = {m.ref.uri: why for m, f in zip(models, frames, strict=True) if (why := scoring.label_only(f))}
    if label_only and gate.engine == "spark":
        raise UsageError(
            f"{next(iter(label_only))} answers with class labels only; --engine spark gates models that give class "
            "scores: gate it with --engine local"
        )
    if gate.measure_cost:
        gate.measure_candidate_cost(models[-1])
    if cfg.floor is not None and base_ref is not None:
        with gate.timed("predict"):
            scored = frames[0] if isinstance(frames[0], pd.DataFrame) else None
            gate.floor_scores = replica_scores(gate, None if scored is None else [str(c) for c in scored.columns])
    gate.decision = binary_decision(cfg.decision, frames)
    base_scores = frames[0] if base_ref else None
    comparer = Comparer(gate, models[0] if base_ref else None, base_scores, label_only)
    with gate.timed("metrics"):
        cost = gate.cost.metrics(gate.cost) if gate.cost else None
        single = comparer.decide(frames[-1], comparer.spark_model(models[-1], frames[-1]), cost)
        comparer.single = single
    baseline = base_ref.to_dict() if base_ref else None
    result = GateResult.of(single, cand_ref.to_dict(), baseline, gate.run_id)
    result.decision = gate.decision.to_dict() if gate.decision else None
    if gate.split is not None:
        result.samples = gate.split.to_dict()
        if gate.split.why_not:
            result.warnings.append(f"nothing held out to tune repairs on: {gate.split.why_not}")
    if label_only:  # said once, for every generation that gives labels only
        which = " and ".join(f"{uri} ({why})" for uri, why in label_only.items())
        result.warnings.append(
            f"class labels only from {which}: gated on what labels allow (agreement, flips, accuracy, BTC/BEC, "
            "rel_nfr); top-k, Pearson and cosine are null, and repairs that need class scores are skipped"
        )
    if base_ref and base_ref.model_id and base_ref.model_id == cand_ref.model_id:
        result.warnings.insert(
            0,
            f"the candidate v{cand_ref.version} and the baseline v{base_ref.version} are the same logged model "
            f"({cand_ref.model_id}): the same model registered twice",
        )
    with gate.timed("logging"), tracking.uploads():
        if comparer.past is not None and not single.samples.empty:  # a rule on the history: draw it
            _log_history(gate, comparer.past, single)
        single.log(cand_ref.model_id, gate.dataset)
        diagnosis = None if base_scores is None else _log_diagnosis(base_scores, frames[-1], frame[gate.label_column])
        side = _side_comparison(gate)
        if side:
            result.warnings.append(side)
        else:
            registry.tag_version(gate.client, cand_ref, single.verdict, _kind(cand_ref), gate.run_id)
            gate.describe(cand_ref.version, single)
    promoted_version = cand_ref.version if single.verdict == "passed" else None
    always = remediate.always(cfg.remediation) and base_ref is not None
    if cfg.remediation is not None and (single.verdict == "failed" or always):
        if not gate.quiet:  # why remediation runs now, before it does (the rule table comes with the verdict)
            failed = "; ".join(r.rule.describe() for r in single.rules if r.blocks)
            plan = remediate.plan(cfg.remediation)
            why = f"failed: {plan} ... (failed rules: {failed})" if failed else f"passed: {plan} ..."
            print(f"The candidate {why}", file=sys.stderr, flush=True)
        if gate.cost is None:  # what remediation builds is weighed against the candidate's cost
            gate.measure_candidate_cost(models[-1])
            result.cost = gate.cost.metrics(gate.cost)
        with gate.timed("remediation"):
            result.ensemble, result.attempts = remediate.remediate(gate, comparer, models[-1], frames[-1])
        if result.ensemble is not None:  # None: every method was skipped (the attempts say why)
            # what deploys in place of every candidate (the memory) decides alone: a candidate that passed is not
            # deployed without it (its users would lose what they saw); a repair stands in for a failed one
            passed = result.ensemble["verdict"] == "passed"
            result.verdict = "passed" if passed or (single.verdict == "passed" and not always) else "failed"
            result.registered_version = result.ensemble["registered_version"]
            promoted_version = result.registered_version
    with gate.timed("logging"):
        versions = {"candidate": cand_ref.version, "baseline": base_ref.version if base_ref else None}
        result.links = tracking.ui_links(
            gate.session.uri,
            gate.session.experiment_id,
            gate.run_id,
            cand_ref.name,
            {**versions, "registered": result.registered_version},
        )
        if gate.promote and promoted_version is not None:  # unknown until the move is read back and recorded
            result.promoted, result.promotion = (
                None,
                promotion.Promotion.pending(_alias(gate), promoted_version).to_dict(),
            )
        gate.session.log_verdict(result, single, diagnosis)  # everything is logged before an alias moves
    if gate.promote and promoted_version is not None:
        with gate.timed("promotion"):
            _promote(gate, result, promoted_version, lambda: gate.session.log_report(result, single, diagnosis))
    result.timings = dict(gate.timings)
    return result


def _alias(gate: GateRun) -> str:
    """The alias a promotion moves: the baseline's, or the default."""
    return (gate.base_ref.alias if gate.base_ref else None) or DEFAULT_BASELINE[1:]


def _promote(gate: GateRun, result: GateResult, version: str, record: Callable[[], None]) -> None:
    """Move the baseline alias to ``version``, the gate's last act, and ``record`` the outcome in
    the run. The registry is the truth: a fault while recording it is a warning in the report
    (``promoted`` as read back), never an error that hides what the alias holds."""
    base_ref = gate.base_ref
    alias = _alias(gate)
    expected = base_ref.version if base_ref else None
    moved = promotion.promote(gate.client, gate.cand_ref.name, alias, version, expected, gate.run_id)
    result.promoted, result.promotion = moved.promoted, moved.to_dict()
    if warning := promotion.record_move(gate.client, gate.cand_ref.name, moved, record):
        result.warnings.append(warning)


def _hold_out(gate: GateRun) -> pd.DataFrame:
    """With ``tuning_share:`` (and no calibration file), hold that share of the evaluation set out to tune
    repairs on (:mod:`~consistency_gate.gate.tuning`) and log its ids; returns the samples judged on."""
    remediation = gate.cfg.remediation
    if remediation is None or remediation.tuning_share is None:
        return gate.frame
    split = hold_out(gate.frame, remediation.tuning_share, gate.id_column, gate.label_column, gate.non_features)
    gate.split, gate.frame = split, split.judged
    if split.held_out is not None:
        tracking.log_json({"held_out_by": split.by, "ids": list(split.held_ids)}, TUNING_IDS)
    return gate.frame


def _log_params(gate: GateRun) -> None:
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
            "remediation": ", ".join(cfg.remediation.methods) if cfg.remediation else "off",
        }
    )
    tracking.log_json([{"metric": r.metric, r.kind: r.threshold} for r in cfg.rules], "gate/config.json")


def _log_diagnosis(base_scores: pd.DataFrame, cand_scores: pd.DataFrame, labels: pd.Series) -> dict:
    """Log the two-generation `diagnose` report, so a reviewer sees why the candidate flipped; returns it."""
    from consistency_gate.diagnostics.diagnose import diagnose, frames_to_arrays

    names, probs, y, classes = frames_to_arrays(
        {"previous": base_scores, "candidate": cand_scores}, labels.astype(str).reset_index(drop=True)
    )
    report = diagnose(names, probs, y, classes)
    tracking.log_json(report, "gate/diagnose.json")

    tracking.log_text("\n".join(f"- {line}" for line in report["explanation"]), "gate/diagnose.md")
    return report


def _log_history(gate: GateRun, past: list[Generation], decision: Decision) -> None:
    """``gate/history.json``: the champions' updates and the candidate's, and their curve beside the
    decision's plots (``gate/plots/history.png``, in the HTML report too)."""
    from consistency_gate.report.plots import history_curve, png_bytes

    versions = (gate.base_ref.version, gate.cand_ref.version)
    report = gate_history(gate.cand_ref.name, past, decision.samples, versions, gate.cfg.confidence)
    tracking.log_json(report, "gate/history.json")
    decision.pngs["history.png"] = png_bytes(history_curve(report))


def _side_comparison(gate: GateRun) -> str | None:
    """Why this gate's verdict stays in its run and off the candidate's tags (None: it goes on them).

    A version's tags say what the gate that decides its production fate found: a promoting gate, a
    first generation's, or a gate against a baseline alias (the version it holds now). A baseline
    given by number is a side comparison unless it holds @champion: a what-if comparison (the
    production version against an older one) must not rewrite the production version's verdict.
    """
    base_ref, cand_ref = gate.base_ref, gate.cand_ref
    if gate.promote or base_ref is None or base_ref.alias:
        return None
    alias = DEFAULT_BASELINE[1:]
    holder = promotion.read_alias(gate.client, cand_ref.name, alias)
    if holder == base_ref.version:
        return None
    now = f"v{holder} is" if holder else "no version is"
    return (
        f"v{cand_ref.version} was gated against v{base_ref.version}, and {now} @{alias}: a side comparison, so "
        f"v{cand_ref.version}'s tags are left as they were (this run holds its verdict)"
    )


def _kind(ref: registry.ModelRef) -> str:
    """The kind remediation tagged a version it registered with ('ensemble' or 'distilled'), else 'single'."""
    kind = ref.tags.get(registry.TAG_KIND)
    return kind if kind in kinds() else "single"
