"""Live traffic, on the registry: ``shadow serve`` (the champion answers, the candidate is captured beside it)
and ``shadow check`` (a candidate judged on a capture as its labels arrive, promoted with the gate's verified
alias move, or rolled back while watching: :mod:`consistency_gate.gate.alias`). Each check runs in one MLflow run
of the experiment ``consistency-gate/NAME`` and logs ``gate/report.json`` as a gate does, so ``history`` reads a
promotion among the gates'.

    report = shadow_check(ShadowInputs("fraud-clf", None, "capture/", None, "labels.csv"), config, None)
    report["decision"], report["stream"]["labelled"]
    # ('continue', 1200)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from consistency_gate.errors import ModelError
from consistency_gate.gate.alias import after_move, move_in_run
from consistency_gate.gate.config import GateConfig
from consistency_gate.gate.decision import tag_run
from consistency_gate.gate.session import GateSession
from consistency_gate.gate.shadow import DEFAULT_BATCH, RuleState, StreamResult, check_stream, mcnemar
from consistency_gate.io.capture import read_capture, read_labels, read_sagemaker
from consistency_gate.mlops import tracking
from consistency_gate.mlops.promotion import (
    DEFAULT_ALIAS,
    Promotion,
    promote,
    unrecorded,
)
from consistency_gate.mlops.registry import (
    CLASSES_TAG,
    TAG_KIND,
    ModelRef,
    describe_version,
    resolve_version,
    tag_version,
)
from consistency_gate.mlops.shadow_server import ServeOptions
from consistency_gate.report.live import rule_state
from consistency_gate.report.schema import SCHEMA_VERSION
from consistency_gate.report.text import fmt

if TYPE_CHECKING:
    pass

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
                    rolled = move_in_run(
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
        after_move(client, inputs.model, report, moved, record)
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
    tracking.log_table(result.steps.assign(time=result.steps["time"].astype(str)), "shadow/steps.json")


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
