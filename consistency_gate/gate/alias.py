"""Moves of ``@champion`` other than a gate's promotion, each made like one (under the promotion lock, only from
the version it was read on, read back) and recorded in a run of the model's experiment whose ``gate/report.json``
``history``, ``rollback`` and the guard read (:func:`~consistency_gate.mlops.promotion.authority`):

- ``rollback``: back to the champion before (``consistency-gate rollback``, or a shadow check that rejects);
- ``revert``: the guard's (``consistency-gate watch``): the alias moved to a version nothing authorized, moved
  back to the version that was;
- ``authorize``: a person's, on purpose (``consistency-gate authorize``): a version may hold the alias because
  someone said so, and why (an emergency fix the guard must not undo).

    report = rollback("fraud-clf", "sqlite:///mlflow.db", None, "complaints")
    report["promoted"], report["candidate"]["version"]
    # (True, '3')
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from consistency_gate.errors import ModelError
from consistency_gate.gate.decision import tag_run
from consistency_gate.gate.session import GateSession
from consistency_gate.mlops import tracking
from consistency_gate.mlops.ledger import GateRecord, gate_records
from consistency_gate.mlops.promotion import (
    DEFAULT_ALIAS,
    Promotion,
    last_move,
    move_back,
    previous_champion,
    read_alias,
    record_move,
    restored_now,
)
from consistency_gate.mlops.registry import TAG_ROLLED_BACK, ModelRef, describe_move, resolve_version
from consistency_gate.report.live import alias_move_text
from consistency_gate.report.schema import SCHEMA_VERSION

if TYPE_CHECKING:
    from mlflow import MlflowClient

ALIAS = DEFAULT_ALIAS
TAG_AUTHORIZED = "consistency_gate.authorized_by"  # on a version a person authorized: who, and why


@dataclass(frozen=True)
class Words:
    """What a move's texts say: the alias, the version taken off it, the version put on it, why, and who."""

    alias: str
    current: str | None
    to: str
    why: str = ""
    by: str = ""


@dataclass(frozen=True)
class Move:
    """One kind of move: what it means and how it reads. ``undoes``: it steps back to the champion before (the
    chain of champions reads it as a step back, and the same move retried finds it done); the report's verdict
    once it is read back; the run's name; the paragraphs it adds to the descriptions of the version taken off
    the alias (None: none) and of the version put on it; what to do when the alias holds another version by the
    time the move is made. Its meaning travels in its report (``kind``, ``undoes``), which the records of
    :mod:`consistency_gate.mlops.ledger` and :func:`~consistency_gate.mlops.promotion.authority` read."""

    undoes: bool
    verdict: str
    title: Callable[[Words], str]
    left: Callable[[Words], str] | None
    put: Callable[[Words], str]
    again: str


MOVES = {
    "rollback": Move(
        True, "rolled back", lambda w: f"ROLLBACK v{w.current} to v{w.to}",
        lambda w: f"ROLLED BACK v{w.current} to v{w.to}: {w.why}.",
        lambda w: f"RESTORED v{w.to} as @{w.alias} in place of v{w.current}: {w.why}.",
        f"run rollback again to roll back from what @{DEFAULT_ALIAS} holds",
    ),
    "revert": Move(
        False, "reverted", lambda w: f"REVERTED @{w.alias} v{w.current} -> v{w.to}",
        lambda w: f"REVERTED: @{w.alias} was moved to v{w.current} without a gate's promotion, a rollback or an "
                  f"authorization; moved back to v{w.to}: {w.why}.",
        lambda w: f"RESTORED v{w.to} as @{w.alias} in place of v{w.current}, which nothing authorized: {w.why}.",
        f"the guard reads @{DEFAULT_ALIAS} again at its next event or reconcile",
    ),
    "authorize": Move(
        False, "authorized", lambda w: f"AUTHORIZED v{w.to} as @{w.alias}", None,
        lambda w: f"AUTHORIZED v{w.to} as @{w.alias} by {w.by}: {w.why}.",
        f"read @{DEFAULT_ALIAS} and authorize again",
    ),
}  # fmt: skip


def after_move(
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


def rollback(
    name: str, tracking_uri: str | None, to: str | None, why: str, report_path: str | Path | None = None
) -> dict:
    """``consistency-gate rollback``: move ``@champion`` back to the champion before it (from the gates'
    history and the registry, or ``to``), verified and read back, in a run whose report ``history`` reads as
    a step back. A rollback retried after its answer was lost finds the alias already where the last
    rollback put it: nothing moves, and the report says so (``outcome`` "already rolled back")."""
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
        return move_in_session(session, client, name, current, target, why, "rollback")


def authorize(
    name: str, tracking_uri: str | None, version: str, why: str, by: str, report_path: str | Path | None = None
) -> dict:
    """``consistency-gate authorize``: move ``@champion`` to ``version`` on a person's word (``by``, ``why``),
    recorded so that the guard (``consistency-gate watch``) leaves it there; nothing moves when it holds it
    already, and the authorization is recorded all the same."""
    with GateSession(report_path) as session:
        _, client = session.connect(tracking_uri, existing=True)
        current = read_alias(client, name, ALIAS)
        return move_in_session(session, client, name, current, version, why, "authorize", by=by)


def move_in_session(
    session: GateSession, client: MlflowClient, name: str, current: str | None, to: str, why: str, kind: str,
    **said: str,
) -> dict:  # fmt: skip
    """Move ``@champion`` from ``current`` to version ``to`` in a new run of the model's experiment, as ``kind``
    (an entry of :data:`MOVES`), and write the report; ``said``: more for the texts and the report (``by``)."""
    target = resolve_version(client, name, to)
    if target.version == current and kind == "rollback":
        raise ModelError(f"model '{name}': @{ALIAS} already holds v{current}; nothing to roll back")
    title = MOVES[kind].title(Words(ALIAS, current, target.version))
    run_id = session.start(tracking.experiment_name(name), title, f"{name} v{current}")
    report = move_in_run(client, name, current, target, run_id, why, kind=kind, **said)
    session.write_report(report)
    return report


def already_rolled_back(name: str, current: str, before: GateRecord, why: str) -> dict:
    """The report of a rollback that finds the alias where the last rollback put it (a retry): nothing moved."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "rollback",
        "undoes": True,
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


def move_in_run(
    client: MlflowClient, name: str, current: str | None, target: ModelRef, run_id: str, why: str,
    end_run: bool = True, kind: str = "rollback", **said: str,
) -> dict:  # fmt: skip
    """Move ``@champion`` from ``current`` to ``target`` in the active run ``run_id`` as ``kind`` (an entry of
    :data:`MOVES`) and log its report (pending first: a run killed at the move says so), which ``history`` and
    the guard read; ends the run with ``end_run`` (a watching shadow check's child run is ended by its block).
    After the move, a fault while recording it is a warning in the report, never an error that hides what the
    alias holds."""
    import mlflow

    move = MOVES[kind]
    mlflow.log_params({"model": name, "candidate": target.version, "baseline": current})
    report = {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "undoes": move.undoes,
        "verdict": move.verdict,
        "candidate_verdict": "not judged",
        "outcome": move.verdict,
        "reason": why,
        "candidate": target.to_dict(),
        "baseline": {"name": name, "version": current, "alias": ALIAS},
        "run_id": run_id,
        "rules": [],
        "promoted": None,
        "promotion": Promotion.pending(ALIAS, target.version).to_dict(),
        "registered_version": None,
        "passed_version": None,
        **said,
    }
    tracking.log_json({**report, "outcome": "pending"}, "gate/report.json")
    promotion = move_back(client, name, current, target.version, run_id, move.again)
    report.update(promoted=promotion.promoted, promotion=promotion.to_dict(),
                  passed_version=target.version if promotion.promoted else None)  # fmt: skip
    if not promotion.promoted:
        report["verdict"] = report["outcome"] = "failed" if promotion.promoted is False else "unknown"

    def record() -> None:
        if promotion.promoted:
            _say(client, name, current, target.version, run_id, move, why, said.get("by", ""))
        else:  # the run's name says the move; a run that made none says so
            title = move.title(Words(ALIAS, current, target.version))
            client.update_run(run_id, name=f"{title}: NOT MOVED ({report['verdict']})")
        tracking.log_json(report, "gate/report.json")
        tag_run(report, move=True)
        tracking.describe_run(f"**{alias_move_text(report)}**: {why}")

    after_move(client, name, report, promotion, record, end_run)
    return report


def _say(client: MlflowClient, name: str, current: str | None, to: str, run_id: str, move: Move, why: str,
         by: str) -> None:  # fmt: skip
    """Say a move on both versions: the descriptions, the rolled-back tag on the version taken off the alias, who
    authorized the version put on it."""
    words = Words(ALIAS, current, to, why, by)
    if move.left is not None and current is not None and current != to:
        client.set_model_version_tag(name, current, TAG_ROLLED_BACK, to)
        describe_move(client, ModelRef(name, current), move.left(words), run_id)
    if by:
        client.set_model_version_tag(name, to, TAG_AUTHORIZED, f"{by}: {why}"[:500])
    describe_move(client, ModelRef(name, to), move.put(words), run_id)
