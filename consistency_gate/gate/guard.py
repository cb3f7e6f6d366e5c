"""The guard of ``@champion`` (``consistency-gate watch``): the alias may hold only a version the records authorize
(:func:`~consistency_gate.mlops.promotion.authority`: a gate's or shadow check's promotion, a rollback, a person's
``authorize``); on any other it is moved back to the authorized one, verified and read back like a promotion, in a
run ``REVERTED @champion v7 -> v5`` (:mod:`consistency_gate.gate.alias`). A move the guard finds overwritten by an
authorized one (the race ``docs/gate.md`` describes: a move made between a gate's re-read and its own) is said on
the version. Records that cannot say (an unreadable report, an unknown outcome) move nothing.

The guard reads the alias first and the records after: a gate logs its report (its promotion pending) before it
moves the alias, so a promotion the guard sees is one its records already authorize.

    said = guard(client, uri, records_of, "fraud-clf", seen="7", event=None)
    # 'REVERTED @champion v7 -> v5 (run 9c1d...)'
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from consistency_gate.mlops.ledger import GateRecord
from consistency_gate.mlops.promotion import DEFAULT_ALIAS, authority, read_alias

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from consistency_gate.mlops.webhooks import Event

TAG_UNAUTHORIZED = "consistency_gate.unauthorized_move"  # on a version the alias was moved to without authority


def guard(
    client: MlflowClient,
    uri: str,
    records_of: Callable[[str], list[GateRecord]],
    name: str,
    seen: str | None = None,
    event: Event | None = None,
) -> str:
    """Move ``@champion`` of ``name`` back when it holds a version the records do not authorize; what it did, in
    words. ``seen``: the version an event saw the alias moved to (a move the guard finds overwritten is said on
    it); ``records_of(name)``: the model's gate records."""
    holds = read_alias(client, name, DEFAULT_ALIAS)
    said = authority(records_of(name))
    if holds is None:
        return f"@{DEFAULT_ALIAS} of '{name}' is unset now: nothing to move back"
    if said.allows(holds):
        if seen and holds != seen and not said.allows(seen):
            return overwritten(client, name, seen, holds, event)
        why = said.doubt or (f"authorized by run {said.by.run_id}" if said.by else "nothing authorized yet")
        return f"@{DEFAULT_ALIAS} on v{holds}: left ({why})"
    if said.version is None:
        return f"@{DEFAULT_ALIAS} on v{holds} is not authorized, but the records name no one version: left"
    report = revert(client, uri, name, holds, said.version, event)
    if report["promoted"]:
        return f"REVERTED @{DEFAULT_ALIAS} v{holds} -> v{said.version} (run {report['run_id']})"
    now = report["promotion"]["holds"]
    overwrote = report["promotion"]["refused"] and now not in (None, "unknown", holds)
    if overwrote and authority(records_of(name)).allows(now):  # a gate's move, while the guard waited for the lock
        return overwritten(client, name, holds, now, event)
    return f"not reverted: {report['promotion']['reason']}"


def overwritten(client: MlflowClient, name: str, moved_to: str, holds: str, event: Event | None) -> str:
    """Say a move to ``moved_to`` that nothing authorized and that another move overwrote before the guard read
    the alias (the race of a move made without the lock): on the version, and in the guard's words."""
    from consistency_gate.mlops.registry import ModelRef, describe_move

    when = utc(event.signed_at if event else time.time())
    text = (f"UNAUTHORIZED MOVE: @{DEFAULT_ALIAS} was moved to v{moved_to} at {when} without a gate's promotion or "
            f"an authorization, and overwritten by v{holds} before the guard read it: v{moved_to} may have served "
            "for that moment")  # fmt: skip
    client.set_model_version_tag(name, moved_to, TAG_UNAUTHORIZED, text[:500])
    describe_move(client, ModelRef(name, moved_to), text + ".", None)
    return text


def revert(client: MlflowClient, uri: str, name: str, holds: str, target: str, event: Event | None) -> dict:
    """Move ``@champion`` from ``holds`` back to ``target`` in a run of the model's experiment; its report."""
    from consistency_gate.gate.alias import move_in_session
    from consistency_gate.gate.session import GateSession

    seen = event.to_dict() if event else {"kind": "reconcile", "version": holds}
    when = utc(event.signed_at if event else time.time())
    how = f"seen by its {seen['kind']} event at {when}" if event else f"found by a reconcile at {when}"
    why = (f"@{DEFAULT_ALIAS} was moved to v{holds} ({how}) but no gate promoted it, no rollback restored it "
           "and no one authorized it")  # fmt: skip
    with GateSession(None) as session:
        session.connect(uri, existing=True)
        return move_in_session(session, client, name, holds, target, why, "revert", event=seen)


def utc(seconds: float) -> str:
    """A time as the versions' descriptions say it.

    >>> utc(0)
    '1970-01-01 00:00:00 UTC'
    """
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))
