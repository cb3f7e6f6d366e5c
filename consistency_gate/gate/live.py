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

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from consistency_gate.errors import ModelError
from consistency_gate.gate.config import GateConfig
from consistency_gate.gate.decision import tag_run
from consistency_gate.gate.session import GateSession
from consistency_gate.gate.shadow import DEFAULT_BATCH, RuleState, StreamResult, check_stream, mcnemar
from consistency_gate.io.capture import read_capture, read_labels, read_sagemaker
from consistency_gate.mlops import tracking
from consistency_gate.mlops.ledger import GateRecord, gate_records
from consistency_gate.mlops.promotion import (
    DEFAULT_ALIAS,
    Promotion,
    last_move,
    move_back,
    previous_champion,
    promote,
    read_alias,
    record_move,
    restored_now,
    unrecorded,
)
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
from consistency_gate.report.live import rollback_text, rule_state
from consistency_gate.report.schema import SCHEMA_VERSION
from consistency_gate.report.text import fmt

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
            f"SHADOW {SHADOW_WORDS[result.decision]} v{candidate.version} vs v{baseline.version}",
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
        moved = None
        if result.decision == "promote" and promote_on_pass and not watch:
            tracking.log_json(_moving(report, candidate.version), "gate/report.json")
            tag_run(_moving(report, candidate.version))
            moved = promote(client, inputs.model, ALIAS, candidate.version, baseline.version, run_id)
            _record(report, moved)
        elif result.decision == "reject" and watch:
            rejecting = [s for s in result.rules if s.broken_at is not None and s.waived_at is None]
            broken = ", ".join(s.rule.describe() for s in rejecting)
            rolled: dict = {}
            try:
                with session.child_run(f"ROLLBACK v{candidate.version} to v{baseline.version}") as child:
                    rolled = rollback_in_run(
                        client, inputs.model, candidate.version, baseline, child, f"live traffic broke {broken}", False
                    )
            except Exception as exc:  # noqa: BLE001 - the child run not ended after the move: said, not raised
                if not rolled:
                    raise
                rolled.setdefault("warnings", []).append(unrecorded(Promotion(**rolled["promotion"]), exc))
            moved = Promotion(**rolled["promotion"])
            report.update(rollback=rolled["promotion"], rolled_back=rolled["promoted"])
            report["warnings"] = rolled.get("warnings", [])

        def record() -> None:
            if moved is not None and moved.promoted and report["rollback"] is None:
                describe_version(client, candidate, _promoted_text(result, candidate, baseline), run_id)
                tag_version(client, candidate, "passed", candidate.tags.get(TAG_KIND, "single"), run_id)
            client.update_run(run_id, name=shadow_title(report))
            tracking.log_json(report, "gate/report.json")
            tag_run(report)
            tracking.describe_run(_description(report))

        report.setdefault("rollback", None)
        _after_move(client, inputs.model, report, moved, record)
        session.write_report(report)
        return report


SHADOW_WORDS = {"promote": "PASSED", "reject": "FAILED", "continue": "UNDECIDED"}


def shadow_title(report: dict) -> str:
    """A shadow check's run name, by what happened: the verdict, and a move only when the registry holds it.

    >>> report = {"decision": "promote", "candidate": {"version": "2"}, "baseline": {"version": "1"},
    ...           "promotion": None, "rollback": None}
    >>> shadow_title(report)
    'SHADOW PASSED v2 vs v1'
    >>> shadow_title({**report, "promotion": {"promoted": True}})
    'SHADOW PROMOTED v2 vs v1'
    >>> shadow_title({**report, "decision": "reject", "rollback": {"promoted": True, "version": "1"}})
    'SHADOW FAILED v2 vs v1, ROLLED BACK to v1'
    """
    word = SHADOW_WORDS[report["decision"]]
    versions = f"v{report['candidate']['version']} vs v{report['baseline']['version']}"
    promotion, rollback = report.get("promotion"), report.get("rollback")
    if promotion:
        said = {True: "PROMOTED", None: f"{word}, promotion unknown"}.get(promotion["promoted"], f"{word}, not moved")
        return f"SHADOW {said} {versions}"
    if rollback:
        back = {True: f", ROLLED BACK to v{rollback['version']}", None: ", rollback unknown"}
        return f"SHADOW {word} {versions}{back.get(rollback['promoted'], ', rollback refused')}"
    return f"SHADOW {word} {versions}"


def _after_move(
    client: MlflowClient, name: str, report: dict, moved: Promotion | None, record: Callable[[], None],
    end_run: bool = True,
) -> None:  # fmt: skip
    """``record`` the outcome in the run, then end it FINISHED (``end_run``). Once the alias was asked to move,
    a fault while recording is a warning in the report (:func:`~consistency_gate.mlops.promotion.record_move`),
    and the run it could not end is marked FAILED by the next gate."""
    import mlflow

    def record_and_end() -> None:
        record()
        if end_run:
            mlflow.end_run("FINISHED")

    if moved is None:
        return record_and_end()
    if warning := record_move(client, name, moved, record_and_end):
        report.setdefault("warnings", []).append(warning)
        if end_run:
            with contextlib.suppress(Exception):
                mlflow.end_run("FAILED")
    return None


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
            "held_at_look": look_number(s.held_at),
            "broken_at_look": look_number(s.broken_at),
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
            "decided_at_look": look_number(result.decided_at),
            "at_decision": None if result.decided_at is None else _look(result, result.decided_at),
            "needed": result.needed,
            "steps": [_look(result, i) for i in range(len(result.steps))],
        },
    }


def look_number(look: int | None) -> int | None:
    """A look as every record numbers it, from 1 (the first look is look 1); None stays None.

    >>> look_number(0), look_number(None)
    (1, None)
    """
    return None if look is None else look + 1


def _look(result: StreamResult, index: int) -> dict:
    """The figures at one look (its ``look`` number from 1, the time as text, null for nothing measured)."""
    row = result.steps.iloc[index]
    figures = {k: (None if pd.isna(v) else v) for k, v in row.items() if k != "time"}
    return {"look": index + 1, "time": str(row["time"]), **figures}


def _waived(state: RuleState) -> str | None:
    """Why an ``unless: clearly-better`` rule that did not hold stopped standing in the way, or None."""
    if state.waived_at is None or (state.held_at is not None and state.held_at <= state.waived_at):
        return None
    at = look_number(state.waived_at)
    return f"waived: clearly more accurate (the accuracy change's lower bound above 0 at look {at})"


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
        mlflow.log_metrics(values, step=look_number(int(step)))
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


def _promoted_text(result: StreamResult, candidate: ModelRef, baseline: ModelRef) -> str:
    return (
        f"PROMOTED v{candidate.version} vs v{baseline.version} by a shadow check on live traffic: "
        f"{result.labelled} labelled of {result.counts['requests']} requests, every rule held on its "
        f"anytime-valid {result.level:.0%} bound."
    )


def _description(report: dict) -> str:
    """A shadow check's run description: the decision, the stream, each rule's value and bounds (4 decimals)."""
    rules = "\n".join(
        f"- {r['quantity']} {r['condition']}: {fmt(r['value'])} in [{fmt(r['interval'][0])}, {fmt(r['interval'][1])}]"
        f", {rule_state(r)}"
        for r in report["rules"]
    )
    warned = "".join(f"\n\nWarning: {w}" for w in report.get("warnings") or [])
    return (
        f"**{shadow_title(report)}**: shadow check on {report['stream']['requests']} requests, "
        f"{report['stream']['labelled']} labelled\n\n{rules}{warned}"
    )


def _say_moved_back(client: MlflowClient, name: str, current: str, to: str, run_id: str, why: str) -> None:
    """Say a rollback on both versions (tag and description)."""
    client.set_model_version_tag(name, current, TAG_ROLLED_BACK, to)
    describe_version(client, ModelRef(name, current), f"ROLLED BACK v{current} to v{to}: {why}.", run_id)
    describe_version(client, ModelRef(name, to), f"RESTORED v{to} as @{ALIAS} in place of v{current}: {why}.", run_id)


def rollback(
    name: str, tracking_uri: str | None, to: str | None, why: str, report_path: str | Path | None = None
) -> dict:
    """``consistency-gate rollback``: move ``@champion`` back to the champion before it (from the gates'
    history and the registry, or ``to``), verified and read back, in a run whose report ``history`` reads as
    a step back. A rollback retried after its answer was lost finds the alias already where the last
    rollback put it: nothing moves, and the report says so (``outcome`` "already rolled back").

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
        try:
            records = gate_records(client, name)
        except ModelError:
            records = []
        before = last_move(records)
        if restored_now(before, current) and to in (None, current):
            report = already_rolled_back(name, current, before, why)
            session.write_report(report)
            return report
        target = to or previous_champion(client, name, records, current)
        restored = resolve_version(client, name, target)
        if restored.version == current:
            raise ModelError(f"model '{name}': @{ALIAS} already holds v{current}; nothing to roll back")
        run_id = session.start(
            tracking.experiment_name(name), f"ROLLBACK v{current} to v{restored.version}", f"{name} v{current}"
        )
        report = rollback_in_run(client, name, current, restored, run_id, why)
        session.write_report(report)
        return report


def already_rolled_back(name: str, current: str, before: GateRecord, why: str) -> dict:
    """The report of a rollback that finds the alias where the last rollback put it (a retry): nothing moved."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "rollback",
        "verdict": "nothing to decide",
        "candidate_verdict": "nothing to decide",
        "outcome": "already rolled back",
        "reason": why,
        "candidate": {"name": name, "version": current},
        "baseline": {"name": name, "version": before.baseline, "alias": ALIAS},
        "run_id": None,
        "rolled_back_by": before.run_id,
        "rules": [],
        "promoted": None,
        "promotion": None,
        "registered_version": None,
        "passed_version": current,
        "note": (
            f"@{ALIAS} already holds v{current}, which rollback run {before.run_id} restored in place of "
            f"v{before.baseline}: nothing moved (a retried rollback is a no-op); to roll back further, give "
            "--to VERSION"
        ),
    }


def rollback_in_run(
    client: MlflowClient, name: str, current: str, restored: ModelRef, run_id: str, why: str, end_run: bool = True
) -> dict:
    """Move ``@champion`` from ``current`` back to ``restored`` in the active run ``run_id`` and log its report
    (pending first: a run killed at the move says so), which ``history`` reads as a step back; ends the run
    with ``end_run`` (a watching shadow check's child run is ended by its block). After the move,
    a fault while recording it is a warning in the report, never an error that hides what the alias holds."""
    import mlflow

    mlflow.log_params({"model": name, "candidate": restored.version, "baseline": current})
    report = {
        "schema_version": SCHEMA_VERSION,
        "kind": "rollback",
        "verdict": "rolled back",
        "candidate_verdict": "not judged",
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
    promotion = move_back(client, name, current, restored.version, run_id)
    report.update(promoted=promotion.promoted, promotion=promotion.to_dict(),
                  passed_version=restored.version if promotion.promoted else None)  # fmt: skip
    if not promotion.promoted:
        report["verdict"] = report["outcome"] = "failed" if promotion.promoted is False else "unknown"

    def record() -> None:
        if promotion.promoted:
            _say_moved_back(client, name, current, restored.version, run_id, why)
        tracking.log_json(report, "gate/report.json")
        tag_run(report)
        tracking.describe_run(f"**{rollback_text(report)}**: {why}")

    _after_move(client, name, report, promotion, record, end_run)
    return report
