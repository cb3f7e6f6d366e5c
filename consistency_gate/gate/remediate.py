"""Remediation: when the candidate fails, build something in its place, cheapest first, and gate it.

The methods and what each needs are the entries of :data:`~consistency_gate.ensembles.methods.METHODS`;
this module only walks them. Each attempt runs in a nested MLflow run: its method builds (and logs) a
model, then one tail does the same for every method: reload the logged model as a server would,
check that it predicts what was gated, measure its serving cost, judge it with the gate's rules
against the same baseline, and register it if it passes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from functools import cache, partial

import numpy as np
import pandas as pd

from consistency_gate.core import names
from consistency_gate.core.evaluation import evaluate_frames
from consistency_gate.engines.spark import SparkModel
from consistency_gate.ensembles.config import RemediationConfig
from consistency_gate.ensembles.method import Built, Inputs, Method
from consistency_gate.ensembles.methods import METHODS
from consistency_gate.errors import ModelError
from consistency_gate.gate import rules
from consistency_gate.gate.comparer import Comparer, GateRun
from consistency_gate.gate.decision import Decision
from consistency_gate.gate.history import champions_before, last
from consistency_gate.mlops import registry, scoring, tracking
from consistency_gate.mlops.cost import ServingCost, serving_cost
from consistency_gate.report.verdict import attempt_line, blocking


def plan(remediation: RemediationConfig) -> str:
    """What remediation is about to build, for the line printed before it does."""
    methods = remediation.methods
    if len(methods) > 1:
        return f"trying {', '.join(methods)} in turn until one passes"
    return METHODS[methods[0]].plan_line(remediation)


def always(remediation: RemediationConfig | None) -> bool:
    """Whether remediation runs at every gate, the candidate passed or not: a method it tries is deployed in
    place of every candidate (the memory of what users saw)."""
    return remediation is not None and any(METHODS[name].always for name in remediation.methods)


def remediate(
    gate: GateRun, comparer: Comparer, cand_model: scoring.LoadedModel, cand_scores: pd.DataFrame | pd.Series
) -> tuple[dict | None, list[dict]]:
    """Try the configured methods in turn (:attr:`RemediationConfig.methods`), each in its own nested
    run, until one passes and is registered; returns the last attempt's report (None when every
    method was skipped) and a summary row per attempt. A method that lacks what it needs (a previous
    generation, class scores, training data, more classes than its k) is reported as skipped with the
    reason, not as an error; a repair that is a rollback is reported as such and the next one tried."""
    remediation = gate.cfg.remediation
    methods = remediation.methods
    report, attempts = None, []
    inputs = _inputs(gate, comparer, cand_model, cand_scores)
    roles = {"previous": comparer.baseline, "candidate": cand_model}
    scoreless = {role: m.ref.uri for role, m in roles.items() if m is not None and m.ref.uri in comparer.label_only}
    for name in methods:
        entry, config = METHODS[name], remediation.for_method(name)
        has_previous = comparer.baseline is not None
        skipped = entry.missing(config, len(inputs.classes), has_previous, scoreless, inputs.no_held_out)
        attempted, over, note = (inputs, None, None) if skipped else _within_budget(gate, inputs, entry, config)
        skipped = skipped or over
        if skipped:
            attempts.append({"method": name, "verdict": "skipped", "note": skipped})
            if not gate.quiet:
                print(f"{name}: skipped ({skipped})", file=sys.stderr, flush=True)
            continue
        report = _attempt(gate, comparer, entry, attempted, config, note)
        attempts.append(_attempt_summary(report))
        if len(methods) > 1 and not gate.quiet:
            print(f"{name}: {attempt_line(attempts[-1])}", file=sys.stderr, flush=True)
        if report["verdict"] == "passed":
            break
    return report, attempts


def _inputs(
    gate: GateRun, comparer: Comparer, cand_model: scoring.LoadedModel, cand_scores: pd.DataFrame | pd.Series
) -> Inputs:
    """What the gate hands every method's builder."""

    def past(count: int) -> list[tuple[str, scoring.LoadedModel]]:
        earlier = last(champions_before(gate.client, gate.cand_ref.name, gate.base_ref.version)[0], count)
        refs = [registry.resolve_version(gate.client, gate.cand_ref.name, v) for v, _ in earlier]
        return [(ref.version, scoring.load_model(ref, gate.cfg.classes)) for ref in refs]

    base_version = gate.base_ref.version if gate.base_ref else ""
    carried = partial(registry.models_carried, gate.client, gate.cand_ref.name)
    split = gate.split
    return Inputs(
        gate.frame, gate.data_path, gate.non_features, cand_model, cand_scores, comparer.baseline,
        comparer.base_scores, (base_version, gate.cand_ref.version),
        _classes_of(cand_scores, gate.frame[gate.label_column]), gate.decision, gate.quiet,
        partial(_calibration_judge, gate), cache(past), carried,
        split.held_out if split else None, split.why_not if split else None, gate.label_column, gate.id_column,
        gate.engine,
    )  # fmt: skip


def _within_budget(
    gate: GateRun, inputs: Inputs, entry: Method, remediation: RemediationConfig
) -> tuple[Inputs, str | None, str | None]:
    """What an attempt builds from within the config's ``max_models``: (inputs, why it is over the budget or
    None, the note saying how it was built or None). Inputs as they are when they fit; flattened when the
    method flattens and that fits (:func:`_flattened`); else why not."""
    over = entry.over_budget(inputs, remediation)
    if over is None:
        return inputs, None, None
    if entry.flattens:
        flat, note = _flattened(gate, inputs, entry, remediation, over)
        if note is not None:
            return flat, None, note
    return inputs, over, None


def _flattened(
    gate: GateRun, inputs: Inputs, entry: Method, remediation: RemediationConfig, over: str
) -> tuple[Inputs, str | None]:
    """A repair over the budget because champions it combines are themselves repairs: the same repair of
    the generations they stand in for (each one's ``consistency_gate.replaces``: the baseline's, and for the
    Bayesian update the earlier champions' too) and the candidate, judged against the champion as every
    repair is, with the note that says so; ``inputs`` and None when no champion it combines is a repair, or
    the flattened repair is over the budget too."""
    replaced: dict[str, str] = {}  # champion -> the generation it stands in for

    def plain(version: str, model: scoring.LoadedModel) -> tuple[str, scoring.LoadedModel]:
        stands_for = model.ref.tags.get(registry.TAG_REPLACES)
        if stands_for is None:
            return version, model
        replaced[version] = stands_for
        ref = registry.resolve_version(gate.client, gate.cand_ref.name, stands_for)
        return stands_for, scoring.load_model(ref, gate.cfg.classes)

    champion = inputs.versions[0]
    version, model = plain(champion, inputs.baseline)
    scores = inputs.base_scores if version == champion else scoring.predict(model, gate.frame, gate.non_features)
    past = cache(lambda count: [plain(v, m) for v, m in inputs.past(count)])
    flat = replace(inputs, baseline=model, base_scores=scores, versions=(version, inputs.versions[1]), past=past)
    still_over = entry.over_budget(flat, remediation)  # counts its models: the earlier champions are read too
    if not replaced or still_over:
        return inputs, None
    champions = ", ".join(f"v{v}" for v in replaced)
    plains = ", ".join(f"v{v}" for v in replaced.values())
    what = "the generation" if len(replaced) == 1 else "the generations"
    note = (
        f"{over.replace('it would', f'a {entry.name} of v{champion} and the candidate would')}: it combines "
        f"{plains}, {what} {champions} {'stands' if len(replaced) == 1 else 'stand'} in for, with the candidate "
        f"instead, and is judged against v{champion} all the same"
    )
    if not gate.quiet:
        print(f"{entry.name}: {note}", file=sys.stderr, flush=True)
    return flat, note


def _attempt(
    gate: GateRun,
    comparer: Comparer,
    entry: Method,
    inputs: Inputs,
    remediation: RemediationConfig,
    note: str | None = None,
) -> dict:
    """One method in its nested run: built by its entry, then the tail every method shares (reload the
    logged model, check it predicts what was gated, measure its cost, judge and register it); ``note``: what
    the report says about how it was built (a flattened repair)."""
    with gate.session.child_run(f"remediation: {entry.name}") as child_run_id:
        built = entry.build(inputs, remediation)
        uri = built.model_info.model_uri
        served = scoring.load_model(registry.ModelRef(uri, "", source=uri))
        classes = list(built.scores.columns)
        same = scoring.predict(served, gate.frame, gate.non_features)[classes].to_numpy()
        if not np.allclose(same, built.scores.to_numpy(), atol=1e-6):
            raise ModelError(f"{uri}: the logged {entry.name} does not predict what was gated")
        features = scoring.feature_frame(served, gate.frame, gate.non_features)
        cost = serving_cost(lambda f: scoring.predict(served, f, ()), features, uri, built.members)
        return _judge(gate, comparer, entry, built, cost, child_run_id, note)


def _classes_of(scores: pd.DataFrame | pd.Series, labels: pd.Series) -> list[str]:
    """The classes what remediation builds answers in: the candidate's score columns, or for a label-only
    candidate the labels it and the evaluation set name (sorted as text)."""
    if isinstance(scores, pd.DataFrame):
        return list(scores.columns)
    return sorted({str(c) for c in scores.unique()} | {str(c) for c in labels.unique()})


def _attempt_summary(report: dict) -> dict:
    """One remediation attempt in a row: what it built, its verdict, what it buys and what it costs."""
    metrics, cost = report["metrics"], report.get("cost") or {}
    return {
        "method": report["method"],
        "kind": report["kind"],
        "verdict": report["verdict"],
        "con": metrics.get("con"),
        "ctoi": metrics.get("ctoi"),
        "acc": metrics.get("acc_candidate"),
        "itoc_kept": report.get("itoc_kept"),
        "failed_rules": [f"{r['quantity']} {r['condition']}" for r in report["rules"] if blocking(r)],
        "members": report["members"],
        "latency_ratio": cost.get("latency_ratio"),
        "train_seconds": report["train_seconds"],
        "run_id": report["run_id"],
        "registered_version": report["registered_version"],
        **({"note": report["note"]} if "note" in report else {}),
    }


def _judge(
    gate: GateRun,
    comparer: Comparer,
    entry: Method,
    built: Built,
    cost: ServingCost,
    run_id: str,
    note: str | None = None,
) -> dict:
    """Gate what an attempt built (its scores on the evaluation set, its serving ``cost``) with the
    same rules against the same baseline, log the decision in the attempt's run (``run_id``), and
    register it if it passes; returns the attempt's report (``note`` in it, unless it is a rollback)."""
    model_info, scores = built.model_info, built.scores
    spark_model = SparkModel(model_info.model_uri, "python_function", list(scores.columns), list(built.features or []))
    decision = comparer.decide(scores, spark_model, cost.metrics(gate.cost))
    rollback = entry.same_is_rollback and comparer.baseline is not None and decision.metrics.get("con") == 1.0
    report = {
        "verdict": "rollback" if rollback else decision.verdict,
        **(
            {
                "note": f"its answers equal the previous generation's (v{gate.base_ref.version}) on every sample: "
                "a rollback at the cost of both models, not a repair; it is not registered"
            }
            if rollback
            else {"note": note}
            if note
            else {}
        ),
        "itoc_kept": _itoc_kept(comparer.single, decision),
        "rules": [r.to_dict() for r in decision.rules],
        "metrics": decision.metrics,
        "intervals": decision.intervals,
        "tests": decision.tests,
        **({"slices": decision.slices} if decision.slices is not None else {}),
        "cost": decision.cost,
        "method": entry.name,
        "kind": entry.kind,
        "members": built.members,
        "runs": built.runs,
        "kappa": built.kappa,
        "train_seconds": built.seconds,
        **({"setting": built.setting} if built.setting is not None else {}),
        "described": entry.describe(entry.name, built).to_dict(),
        "run_id": run_id,
        "registered_version": None,
    }
    decision.log(model_info.model_id, gate.dataset)
    if report["verdict"] == "passed":
        cand_ref = gate.cand_ref
        version = registry.register_version(model_info.model_uri, cand_ref.name)
        registry.tag_version(
            gate.client, registry.ModelRef(cand_ref.name, version), "passed", report["kind"], gate.run_id,
            replaces=cand_ref.version, models=built.members,
        )  # fmt: skip
        gate.describe(version, decision, replaces=cand_ref.version, noun=report["described"]["noun"])
        report["registered_version"] = version
    tracking.log_json(report, "gate/report.json")
    return report


def _itoc_kept(single: Decision | None, attempt: Decision) -> float | None:
    """The share of the candidate's positive flips (ItoC against the baseline) that an attempt answers
    right too; None when the candidate has none, or the flip tables do not hold every sample (Spark)."""
    if single is None or len(single.samples) != len(attempt.samples) or not len(single.samples):
        return None
    flipped = (single.samples["flip"] == "ItoC").to_numpy()
    if not flipped.any():
        return None
    right = attempt.samples["flip"].isin(["CtoC", "ItoC"]).to_numpy()
    return float(right[flipped].mean())


def _calibration_judge(
    gate: GateRun, labels: pd.Series, base: pd.DataFrame | pd.Series, classes: list[str], source: str
) -> Callable[[np.ndarray], tuple[bool, float]]:
    """``judge(scores)`` for tuning a repair on calibration data (``labels``; the baseline's scores
    ``base`` there; the repair's over ``classes``): (whether the gate's rules pass, CtoI), each rule on
    its strict one-sided bound at the tuning confidence, wide enough for the evaluation set's sampling
    error as well: a setting that passes calibration by a hair fails the evaluation set. A serving cost,
    a slice and what is measured over the champions or against a replica are not measured there."""
    cfg = gate.cfg
    beside = (*names.COST_METRICS, *names.HISTORY_METRICS, *names.FLOOR_METRICS)
    margin = [rules.with_margin(r) for r in cfg.rules if r.metric not in beside and not r.per_slice]
    kept = replace(cfg, rules=margin, confidence=rules.tuning_confidence(cfg.confidence))
    ks = cfg.counted_ks({str(source): len(classes)})

    def judge(probabilities: np.ndarray) -> tuple[bool, float]:
        repaired = pd.DataFrame(probabilities, columns=classes)
        evaluation = evaluate_frames(labels, [base, repaired], ks, str(source), decision=gate.decision)
        comparison = evaluation.result(confidence=kept.confidence, interval_method=cfg.interval_method)
        decision = Decision.judge(comparison, kept, pd.DataFrame(), ks)
        return decision.verdict == "passed", comparison.metrics["ctoi"]

    return judge
