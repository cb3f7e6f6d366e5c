"""Live traffic, on the registry: ``shadow check`` (a candidate judged on a capture as its labels arrive,
promoted with the gate's verified alias move) and ``rollback`` (the alias moved back to the champion before,
verified and read back the same way). Each runs in one MLflow run of the experiment ``consistency-gate/NAME``
and logs ``gate/report.json`` as a gate does, so ``history`` reads a promotion or a rollback among the
gates' (a rollback is a step back to an earlier champion).

    report = shadow_check(ShadowInputs("fraud-clf", None, "capture/", None, "labels.csv"), config, None)
    report["decision"], report["stream"]["labelled"]
    # ('continue', 1200)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from consistency_gate.errors import ModelError
from consistency_gate.gate.config import GateConfig
from consistency_gate.gate.decision import tag_run
from consistency_gate.gate.history import champions
from consistency_gate.gate.session import GateSession
from consistency_gate.gate.shadow import DEFAULT_BATCH, RuleState, StreamResult, check_stream, mcnemar
from consistency_gate.io.capture import read_capture, read_labels, read_sagemaker
from consistency_gate.mlops import tracking
from consistency_gate.mlops.ledger import gate_records
from consistency_gate.mlops.promotion import DEFAULT_ALIAS, Promotion, promote, read_alias
from consistency_gate.mlops.registry import (
    CLASSES_TAG,
    TAG_KIND,
    TAG_ROLLED_BACK,
    ModelRef,
    describe_version,
    resolve_version,
    tag_version,
)
from consistency_gate.mlops.shadow_server import ServeOptions
from consistency_gate.report.schema import SCHEMA_VERSION

if TYPE_CHECKING:
    from mlflow import MlflowClient

ALIAS = DEFAULT_ALIAS


@dataclass(frozen=True)
class ShadowInputs:
    """What a shadow check reads: the model, the candidate (a version, @alias, or None: the latest) and the
    baseline it was shadowed against (None: @champion), the capture (a table, or the production variant's
    SageMaker capture with ``shadow_capture`` the shadow variant's) and the labels."""

    model: str
    candidate: str | None
    capture: str | Path
    shadow_capture: str | Path | None
    labels: str | Path
    baseline: str | None = None
    batch: int = DEFAULT_BATCH
    classes: tuple[str, ...] | None = None


def _classes(ref: ModelRef, given: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """The class names, in output order: as given, else the version's ``consistency_gate.classes`` tag."""
    if given:
        return given
    tagged = ref.tags.get(CLASSES_TAG)
    return tuple(map(str, json.loads(tagged))) if tagged else None


def shadow_check(
    inputs: ShadowInputs, config: GateConfig, tracking_uri: str | None, promote_on_pass: bool = False,
    watch: bool = False, report_path: str | Path | None = None,
) -> dict:  # fmt: skip
    """Judge the candidate on the capture and its labels (:func:`~consistency_gate.gate.shadow.check_stream`),
    log the run, and act on the decision: with ``promote_on_pass`` move ``@champion`` to the candidate on
    ``promote`` (only from the baseline it was shadowed against); with ``watch`` (the candidate is the
    champion now, the baseline the one it replaced) move it back on ``reject``. Returns the report."""
    with GateSession(report_path) as session:
        uri, client = session.connect(tracking_uri, existing=True)
        candidate = resolve_version(client, inputs.model, inputs.candidate)
        baseline = resolve_version(client, inputs.model, inputs.baseline or f"@{ALIAS}")
        if baseline.version == candidate.version:
            raise ModelError(
                f"model '{inputs.model}': the candidate v{candidate.version} is the baseline; give the version it "
                f"replaced with --baseline (watching a promoted model) or the candidate served in shadow"
            )
        classes = _classes(candidate, inputs.classes)
        if inputs.shadow_capture is not None:
            capture = read_sagemaker(inputs.capture, inputs.shadow_capture, classes)
        else:
            capture = read_capture(inputs.capture)
        result = check_stream(
            capture, read_labels(inputs.labels), config.rules, config.confidence, inputs.batch, classes
        )
        run_id = session.start(
            tracking.experiment_name(inputs.model),
            f"SHADOW {result.decision.upper()} v{candidate.version} vs v{baseline.version}",
            f"{inputs.model} v{candidate.version}",
        )
        _log_stream(result, inputs, candidate, baseline)
        report = shadow_report(result, candidate, baseline, run_id)
        report["links"] = tracking.ui_links(
            uri,
            session.experiment_id,
            run_id,
            inputs.model,
            {"candidate": candidate.version, "baseline": baseline.version},
        )
        tracking.log_json(report, "gate/report.json")
        if result.decision == "promote" and promote_on_pass and not watch:
            tracking.log_json(_moving(report, candidate.version), "gate/report.json")
            _record(report, promote(client, inputs.model, ALIAS, candidate.version, baseline.version, run_id))
            if report["promoted"]:
                describe_version(client, candidate, _promoted_text(result, baseline))
                tag_version(client, candidate, "passed", candidate.tags.get(TAG_KIND, "single"), run_id)
        elif result.decision == "reject" and watch:
            rejecting = [s for s in result.rules if s.broken_at is not None and s.waived_at is None]
            broken = ", ".join(s.rule.describe() for s in rejecting)
            with session.child_run(f"ROLLBACK v{candidate.version} to v{baseline.version}") as child:
                moved = rollback_in_run(
                    client, inputs.model, candidate.version, baseline, child, f"live traffic broke {broken}"
                )
            report.update(rollback=moved["promotion"], rolled_back=moved["promoted"])
        tracking.log_json(report, "gate/report.json")
        tag_run(report)
        tracking.describe_run(_description(report))
        session.write_report(report)
        import mlflow

        mlflow.end_run("FINISHED")
        return report


def shadow_serve(
    model: str, candidate: str | None, champion: str | None, capture: str | Path, tracking_uri: str | None,
    options: ServeOptions, classes: tuple[str, ...] | None = None,
) -> dict:  # fmt: skip
    """``consistency-gate shadow serve``: resolve the champion (default ``@champion``) and the candidate in the
    registry, then serve (:func:`~consistency_gate.mlops.shadow_server.serve`) until stopped."""
    import sys

    from consistency_gate.mlops import store
    from consistency_gate.mlops.shadow_server import serve

    uri, client = store.connect(tracking_uri, existing=True)
    served = resolve_version(client, model, champion or f"@{ALIAS}")
    shadowed = resolve_version(client, model, candidate)
    if served.version == shadowed.version:
        raise ModelError(
            f"model '{model}': the candidate v{shadowed.version} is the champion; give the version to shadow"
        )
    names = _classes(shadowed, classes) or _classes(served, None)
    return serve(served.uri, shadowed.uri, uri, capture, names, options, lambda line: print(line, file=sys.stderr))


def shadow_report(result: StreamResult, candidate: ModelRef, baseline: ModelRef, run_id: str) -> dict:
    """The shadow check's report: the gate report's keys (verdict, rules, metrics, intervals, tests, ...) and
    ``stream``, what only a stream has (requests, labels, looks, the decision's look, the labels still needed)."""
    last = len(result.steps) - 1
    rules = [
        {
            "metric": s.rule.metric,
            "kind": s.rule.kind,
            "threshold": s.rule.threshold,
            "decide": "anytime",
            "condition": s.rule.condition,
            "quantity": s.rule.quantity,
            "value": result.value(s.rule),
            "interval": [s.lower[last], s.upper[last]],
            "compared": s.upper[last] if s.rule.kind == "max" else s.lower[last],
            "held": True if s.held_at is not None else (False if s.broken_at is not None else None),
            "held_at_look": s.held_at,
            "broken_at_look": s.broken_at,
            "judged_on": f"anytime-valid {result.level:.0%} confidence sequence",
            "note": "" if s.done_at is not None or s.broken_at is not None else "open: more labels needed",
            **({"unless": s.rule.unless, "waived": _waived(s)} if s.rule.unless else {}),
        }
        for s in result.rules
    ]
    verdict = {"promote": "passed", "reject": "failed", "continue": "undecided"}[result.decision]
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "shadow",
        "verdict": verdict,
        "candidate_verdict": verdict,
        "outcome": verdict,
        "decision": result.decision,
        "passed_version": candidate.version if result.decision == "promote" else None,
        "promoted": False,
        "promotion": None,
        "registered_version": None,
        "run_id": run_id,
        "candidate": candidate.to_dict(),
        "baseline": baseline.to_dict(),
        "n": result.labelled,
        "confidence": result.level,
        "metrics": result.metrics,
        "intervals": {r["metric"] if r["kind"] != "min_delta" else "acc_delta": r["interval"] for r in rules},
        "tests": {"mcnemar_p": mcnemar(result)},
        "rules": rules,
        "stream": {
            **result.counts,
            "decided_at_look": result.decided_at,
            "needed": result.needed,
            "steps": result.steps.assign(time=result.steps["time"].astype(str)).to_dict("records"),
        },
    }


def _waived(state: RuleState) -> str | None:
    """Why an ``unless: clearly-better`` rule that did not hold stopped standing in the way, or None."""
    if state.waived_at is None or (state.held_at is not None and state.held_at <= state.waived_at):
        return None
    return f"waived: clearly more accurate (the accuracy change's lower bound above 0 at look {state.waived_at + 1})"


def _log_stream(result: StreamResult, inputs: ShadowInputs, candidate: ModelRef, baseline: ModelRef) -> None:
    """The run's parameters, every look's figures as metrics over steps, and the bounds plot."""
    import mlflow

    from consistency_gate.report.plots import bounds_curve, png_bytes

    versions = {"model": inputs.model, "candidate": candidate.version, "baseline": baseline.version}
    mlflow.log_params({**versions, "capture": str(inputs.capture), "labels": str(inputs.labels), "batch": inputs.batch})
    for step, row in result.steps.iterrows():
        values = {k: float(v) for k, v in row.items() if k != "time" and v == v}  # NaN: nothing labelled yet
        for state in result.rules:
            key = tracking.mlflow_metric_name(state.rule.quantity.replace(" ", "_"))
            values[f"bound_lower_{key}"], values[f"bound_upper_{key}"] = state.lower[step], state.upper[step]
        mlflow.log_metrics(values, step=int(step))
    curves = [
        {"rule": s.rule.describe(), "threshold": s.rule.threshold, "lower": s.lower, "upper": s.upper}
        for s in result.rules
    ]
    labelled = result.steps["labelled"].tolist()
    mlflow.log_image(_image(png_bytes(bounds_curve(curves, labelled, result.decided_at))), "shadow/bounds.png")
    mlflow.log_table(result.steps.assign(time=result.steps["time"].astype(str)), "shadow/steps.json")


def _image(png: bytes):  # noqa: ANN202 - a PIL image
    import io

    from PIL import Image

    return Image.open(io.BytesIO(png))


def _record(report: dict, promotion: Promotion) -> None:
    """A promotion's outcome in the report: ``passed_version`` only when the alias was read back holding it."""
    report.update(promotion=promotion.to_dict(), promoted=promotion.promoted)
    if promotion.promoted is not True:
        report["passed_version"] = None


def _moving(report: dict, version: str) -> dict:
    """The report as logged just before the alias move: a check killed during the move says it is unknown."""
    return {
        **report,
        "promoted": None,
        "promotion": Promotion.pending(ALIAS, version).to_dict(),
        "passed_version": None,
    }


def _promoted_text(result: StreamResult, baseline: ModelRef) -> str:
    return (
        f"consistency-gate: PROMOTED by a shadow check on live traffic against v{baseline.version}: "
        f"{result.labelled} labelled of {result.counts['requests']} requests, every rule held on its "
        f"anytime-valid {result.level:.0%} bound"
    )


def _description(report: dict) -> str:
    rules = "\n".join(
        f"- {r['quantity']} {r['condition']}: {r['value']} in {r['interval']}, held: {r['held']}"
        for r in report["rules"]
    )
    return (
        f"**Shadow check: {report['decision']}** v{report['candidate']['version']} vs "
        f"v{report['baseline']['version']} on {report['stream']['requests']} requests, "
        f"{report['stream']['labelled']} labelled\n\n{rules}"
    )


def previous_champion(client: MlflowClient, name: str, current: str) -> str | None:
    """The champion before ``current`` in the order the gates promoted them (None when the gates' history
    has none)."""
    try:
        chain = champions(gate_records(client, name))
    except ModelError:
        return None
    if current not in chain:
        return None
    before = [v for v in chain[: len(chain) - chain[::-1].index(current) - 1] if v != current]
    return before[-1] if before else None


def move_back(client: MlflowClient, name: str, current: str, to: str, run_id: str, why: str) -> Promotion:
    """Move ``@champion`` from ``current`` back to ``to`` (only if it still holds ``current``), read back, and
    say so on both versions (tags and description)."""
    promotion = promote(client, name, ALIAS, to, current, run_id)
    if promotion.promoted:
        client.set_model_version_tag(name, current, TAG_ROLLED_BACK, to)
        describe_version(
            client, ModelRef(name, current), f"consistency-gate: ROLLED BACK to v{to} ({why}; run {run_id})"
        )
        describe_version(
            client,
            ModelRef(name, to),
            f"consistency-gate: RESTORED as @{ALIAS} in place of v{current} ({why}; run {run_id})",
        )
    return promotion


def rollback(
    name: str, tracking_uri: str | None, to: str | None, why: str, report_path: str | Path | None = None
) -> dict:
    """``consistency-gate rollback``: move ``@champion`` back to the champion before it (from the gates'
    history, or ``to``), verified and read back, in a run whose report ``history`` reads as a step back.

    Example::

        report = rollback("fraud-clf", "sqlite:///mlflow.db", None, "complaints")
        report["promoted"], report["candidate"]["version"]
        # (True, '3')
    """
    with GateSession(report_path) as session:
        _, client = session.connect(tracking_uri, existing=True)
        current = read_alias(client, name, ALIAS)
        if current is None:
            raise ModelError(f"model '{name}': @{ALIAS} is not set; there is nothing to roll back")
        target = to or previous_champion(client, name, current)
        if target is None:
            raise ModelError(
                f"model '{name}': the gates' history has no champion before v{current}; give the version to "
                "restore with --to VERSION"
            )
        restored = resolve_version(client, name, target)
        if restored.version == current:
            raise ModelError(f"model '{name}': @{ALIAS} already holds v{current}; nothing to roll back")
        run_id = session.start(
            tracking.experiment_name(name), f"ROLLBACK v{current} to v{restored.version}", f"{name} v{current}"
        )
        report = rollback_in_run(client, name, current, restored, run_id, why)
        session.write_report(report)
        import mlflow

        mlflow.end_run("FINISHED")
        return report


def rollback_in_run(client: MlflowClient, name: str, current: str, restored: ModelRef, run_id: str, why: str) -> dict:
    """Move ``@champion`` from ``current`` back to ``restored`` in the active run ``run_id`` and log its report
    (pending first: a run killed at the move says so), which ``history`` reads as a step back."""
    import mlflow

    mlflow.log_params({"model": name, "candidate": restored.version, "baseline": current})
    report = {
        "schema_version": SCHEMA_VERSION,
        "kind": "rollback",
        "verdict": "passed",
        "candidate_verdict": "passed",
        "outcome": "rolled back",
        "reason": why,
        "candidate": restored.to_dict(),
        "baseline": {"name": name, "version": current, "alias": ALIAS},
        "run_id": run_id,
        "rules": [],
        "promoted": None,
        "promotion": None,
        "registered_version": None,
        "passed_version": None,
    }
    tracking.log_json({**report, "outcome": "pending"}, "gate/report.json")
    promotion = move_back(client, name, current, restored.version, run_id, why)
    report.update(promoted=promotion.promoted, promotion=promotion.to_dict(),
                  passed_version=restored.version if promotion.promoted else None)  # fmt: skip
    if not promotion.promoted:
        report["outcome"] = "failed"
    tracking.log_json(report, "gate/report.json")
    tag_run(report)
    tracking.describe_run(f"**Rollback** of @{ALIAS} from v{current} to v{restored.version}: {why}")
    return report
