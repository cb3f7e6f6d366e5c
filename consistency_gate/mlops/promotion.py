"""Promotion: the gate's last act, moving a model's alias to the version that passed, under a lock in the
registry (one gate at a time per model), only from the baseline the gate compared against, and read back
(the registry is the truth: an alias that cannot be read back is reported unknown, never moved).
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from consistency_gate.errors import ModelError, error_line
from consistency_gate.mlops.lease import fenced
from consistency_gate.mlops.ledger import GateRecord, unreadable_reports
from consistency_gate.mlops.registry import TAG_ROLLED_BACK, ModelRef, is_not_found, is_number, lead_description
from consistency_gate.mlops.tracking import TAG_HOST, TAG_PID, process_alive

if TYPE_CHECKING:
    from mlflow import MlflowClient

DEFAULT_ALIAS = "champion"  # the alias that marks production, which a gate compares against and promotes
LOCK_SUFFIX = ".consistency-gate-lock"
TAG_LOCK_OWNER = "consistency_gate.lock_owner"
TAG_LOCK_EXPIRES = "consistency_gate.lock_expires"
TAG_LOCK_TAKEOVER = "consistency_gate.lock_takeover"  # a waiter's claim on a dead holder's lock
# how long the gate reads an alias back after asking to move it (a server restarting, a lost answer)
READ_BACK_ENV, READ_BACK_S = "CONSISTENCY_GATE_READ_BACK_S", 30.0


def read_back_s() -> float:
    """How long a move is read back: ``CONSISTENCY_GATE_READ_BACK_S`` when set (read at each move), else 30 s."""
    return float(os.environ.get(READ_BACK_ENV) or READ_BACK_S)


@dataclass
class Promotion:
    """What a promotion did, as read back from the registry.

    ``promoted`` is True only when the alias was read back pointing to ``version``, None (unknown)
    when the move was asked for and the alias could not be read back; ``holds`` is the version the
    alias points to now (None if unset, ``"unknown"`` if it could not be read); ``refused`` is True
    when the gate did not move it because the baseline had moved; ``at`` is when the move was asked
    for (its pending record: when it was about to be), the order moves are read in
    (:func:`in_move_order`).
    """

    alias: str
    version: str
    promoted: bool | None
    holds: str | None
    reason: str = ""
    refused: bool = False
    at: float | None = None  # when the alias was asked to move (seconds since the epoch; None: it was not)

    @property
    def exit_code(self) -> int:
        """0 promoted; 4 refused (the baseline moved); 5 the registry failed the move or could not
        be read back.

        >>> Promotion("champion", "3", False, "2", "moving failed (503)").exit_code
        5
        """
        if self.promoted:
            return 0
        return 4 if self.refused else 5

    def to_dict(self) -> dict:
        """As in the JSON report's ``promotion``."""
        return asdict(self)

    @classmethod
    def pending(cls, alias: str, version: str) -> Promotion:
        """The promotion as a run records it before the alias moves: unknown. The run records the outcome once
        it is read back; a run that cannot record it then still says unknown, never "not promoted".

        >>> Promotion.pending("champion", "4").promoted is None
        True
        """
        return cls(
            alias, version, None, "unknown",
            f"recorded before @{alias} was moved to v{version}; the gate could not record the move's outcome "
            f"after it: read @{alias} in the registry",
            at=time.time(),  # the move comes right after: a reader orders it among the others from this
        )  # fmt: skip


def read_alias(client: MlflowClient, name: str, alias: str, window_s: float = 10.0) -> str | None:
    """The version ``@alias`` points to (None if unset), asked again on any error but "not set"
    for ``window_s`` seconds (pauses of 1, 2, ... 5 s); raises the last error when the window ends.

    Example::

        read_alias(client, "fraud-clf", "champion")
        # '3'
    """
    from mlflow.exceptions import MlflowException

    deadline = time.monotonic() + window_s
    pause = 1.0
    while True:
        try:
            return str(client.get_model_version_by_alias(name, alias).version)
        except MlflowException as exc:
            if is_not_found(exc):
                return None
            if time.monotonic() + pause > deadline:
                raise
        except Exception:  # noqa: BLE001 - a lost response or a server restarting: ask again
            if time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause + 1.0, 5.0)


@contextlib.contextmanager
def promotion_lock(
    client: MlflowClient, name: str, owner: str, wait_s: float = 120.0, lease_s: float = 600.0
) -> Iterator[None]:
    """Hold the model's promotion lock: a registered model ``NAME.consistency-gate-lock`` that only
    one gate can create (the store refuses a second with RESOURCE_ALREADY_EXISTS). A lock whose
    holder is gone (its process on this host ended, its gate run ended, or its lease ran out) is
    taken over at once: claimed with a tag, checked again, then removed, so two waiters never both
    remove it. A create whose response was lost is recognised by its owner tag. ModelError (exit 4)
    if another gate holds it for ``wait_s`` seconds.

    Example::

        with promotion_lock(client, "fraud-clf", owner=run_id):
            pass  # only this gate moves an alias of fraud-clf here
    """
    from mlflow.exceptions import MlflowException

    lock = f"{name}{LOCK_SUFFIX}"
    holder = {TAG_HOST: socket.gethostname(), TAG_PID: str(os.getpid())}
    deadline = time.monotonic() + wait_s
    while True:
        try:
            client.create_registered_model(
                lock,
                tags={TAG_LOCK_OWNER: owner, TAG_LOCK_EXPIRES: str(time.time() + lease_s), **holder},
                description=f"consistency-gate: a gate is moving an alias of '{name}'; removed when it is done",
            )
            break
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST" and time.monotonic() < deadline:
                continue  # the store refused it as existing, then found it gone: released meanwhile
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        try:
            held = client.get_registered_model(lock).tags or {}
        except MlflowException as exc:
            if is_not_found(exc):
                continue  # released meanwhile: try again
            raise
        if held.get(TAG_LOCK_OWNER) == owner:
            break  # our own create went through; its response was lost
        if _holder_gone(client, held) and _claimed(client, lock, held, owner):
            with contextlib.suppress(MlflowException):
                client.delete_registered_model(lock)
            continue
        if time.monotonic() > deadline:
            raise ModelError(
                f"model '{name}': another gate has held the promotion lock ({lock}) for over {wait_s:.0f} s; "
                "try again, or delete that registered model if no gate is running"
            )
        time.sleep(0.2 + random.random() * 0.3)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            client.delete_registered_model(lock)


def _holder_gone(client: MlflowClient, held: dict[str, str]) -> bool:
    """Whether the gate holding a lock (its tags ``held``) is gone: its lease ran out, its process on
    this host ended, or its gate run (the owner) ended."""
    from mlflow.exceptions import MlflowException

    if float(held.get(TAG_LOCK_EXPIRES, "0")) < time.time():
        return True
    pid = held.get(TAG_PID, "")
    if held.get(TAG_HOST) == socket.gethostname() and is_number(pid) and not process_alive(int(pid)):
        return True
    try:
        return client.get_run(held.get(TAG_LOCK_OWNER, "")).info.status != "RUNNING"
    except MlflowException:
        return False  # not a run id (an API caller's owner name), or the server is away: the lease decides


def _claimed(client: MlflowClient, lock: str, held: dict[str, str], owner: str) -> bool:
    """Claim a dead holder's ``lock`` for ``owner``: tag the claim, wait, and read it back; True when
    the claim stuck and the lock still belongs to the same dead holder (another waiter that claimed
    it, or took it over meanwhile, wins)."""
    from mlflow.exceptions import MlflowException

    try:
        client.set_registered_model_tag(lock, TAG_LOCK_TAKEOVER, owner)
        time.sleep(0.3)
        now = client.get_registered_model(lock).tags or {}
    except MlflowException:
        return False
    return now.get(TAG_LOCK_TAKEOVER) == owner and now.get(TAG_LOCK_OWNER) == held.get(TAG_LOCK_OWNER)


def promote(
    client: MlflowClient, name: str, alias: str, version: str, expected: str | None, owner: str, again: str = ""
) -> Promotion:
    """Move ``@alias`` to ``version``, only if it still points to ``expected`` (the version the gate
    compared against; None: it was unset), under the promotion lock, and read it back. ``again``: what to do
    when the alias moved meanwhile (default: gate the version again against the new baseline).

    Concurrent gates that compared against the same baseline: exactly one moves the alias; the
    others find it moved and report why. A move made for a listener that has lost its lease since
    (:func:`~consistency_gate.mlops.lease.fenced`) is refused too. A lost response is resolved by
    reading the alias again for :func:`read_back_s` seconds; past that the outcome is unknown
    (``promoted`` None), never false. A registry that fails before the move was asked for moved
    nothing, and says so.

    Example::

        promotion = promote(client, "fraud-clf", "champion", "4", expected="3", owner=run_id)
        promotion.promoted, promotion.holds
        # (True, '4')
    """
    try:
        with promotion_lock(client, name, owner):
            current = read_alias(client, name, alias)
            if why := fenced(client):  # a listener's gate or revert, and that listener lost its lease meanwhile
                return Promotion(alias, version, False, current, f"not moved: {why}", refused=True)
            if current != expected:
                was = f"v{expected}" if expected else "unset"
                now = f"v{current}" if current else "unset"
                return Promotion(
                    alias,
                    version,
                    False,
                    current,
                    f"@{alias} is {now}, not {was} as when it was read (another gate or a person moved it): "
                    f"not moved; {again or f'gate v{version} again against the new baseline'}",
                    refused=True,
                )
            return _move_alias(client, name, alias, version)
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - the lock or the look-up failed: the move was never asked for
        return Promotion(
            alias,
            version,
            False,
            "unknown",
            f"the registry failed before @{alias} was moved ({error_line(exc)}): nothing was moved; "
            "gate again when it answers",
        )


def _move_alias(client: MlflowClient, name: str, alias: str, version: str) -> Promotion:
    """Ask the registry to move ``@alias`` to ``version`` and read it back; a failed request may
    have gone through, so only the read-back decides."""
    error, window, asked = None, read_back_s(), time.time()
    try:
        client.set_registered_model_alias(name, alias, version)
    except Exception as exc:  # noqa: BLE001 - the request may have gone through: read it back
        error = exc
    try:
        holds = read_alias(client, name, alias, window)
    except Exception as exc:  # noqa: BLE001
        return Promotion(
            alias,
            version,
            None,
            "unknown",
            f"asked the registry to move @{alias} to v{version}, then could not read it back for "
            f"{window:.0f} s ({error_line(exc)}): whether it moved is unknown; read @{alias} in the "
            "registry before deploying",
            at=asked,
        )
    if holds == version:
        return Promotion(alias, version, True, holds, at=asked)
    now = f"v{holds}" if holds else "unset"
    if error is None:  # the move went through, and another moved the alias before it was read back
        return Promotion(
            alias, version, False, holds,
            f"moved @{alias} to v{version}, then another gate or a person moved it to {now} before it was read back: "
            f"@{alias} holds {now}",
            refused=True, at=asked,
        )  # fmt: skip
    return Promotion(
        alias,
        version,
        False,
        holds,
        f"moving @{alias} to v{version} failed ({error_line(error)}); it is {now}",
        at=asked,
    )


def unknown_lead(alias: str) -> str:
    """How a version's description leads when its move to ``alias`` could not be read back.

    >>> unknown_lead("champion")[:44]
    'PROMOTION UNKNOWN: the move to @champion cou'
    """
    return f"PROMOTION UNKNOWN: the move to @{alias} could not be read back; read @{alias} before deploying."


def record_move(client: MlflowClient, name: str, moved: Promotion, record: Callable[[], None]) -> str | None:
    """``record`` a move the registry was asked to make in the run, first leading the version's description
    with :func:`unknown_lead` when the move could not be read back. The registry is the truth: a fault while
    recording is the returned warning (the move as read back), never an error that hides what the alias holds.

    Example::

        warning = record_move(client, "fraud-clf", promote(client, "fraud-clf", "champion", "4", "3", run_id), log)
    """
    try:
        if moved.promoted is None:
            lead_description(client, ModelRef(name, moved.version), unknown_lead(moved.alias))
        record()
    except Exception as exc:  # noqa: BLE001 - MLflow and requests raise many kinds; the alias is what it is
        return unrecorded(moved, exc)
    return None


def unrecorded(moved: Promotion, exc: BaseException) -> str:
    """The warning of a move that happened (or may have) and that the run could not record.

    >>> unrecorded(Promotion("champion", "2", True, "2"), OSError("503"))[:57]
    '@champion holds v2 (read back from the registry), but the'
    >>> unrecorded(Promotion("champion", "2", None, "unknown"), OSError("503"))[:51]
    '@champion holds unknown (it could not be read back)'
    """
    holds = f"v{moved.holds}" if moved.holds not in (None, "unknown") else moved.holds or "unset"
    read = "read back from the registry" if moved.holds != "unknown" else "it could not be read back"
    return (
        f"@{moved.alias} holds {holds} ({read}), but the run could not record the move ({error_line(exc)}): "
        "its tags and report.json predate it"
    )


def champions(records: list[GateRecord], holder: str | None = None) -> list[str]:
    """The versions that held the baseline alias, in the order they held it, from what the gates saw and
    did and what the registry holds: each gate against the alias (or promoting) names the version that held
    it then, its baseline, and each promoting gate the version it moved the alias to (a repair where one was
    registered). A promotion that a gate did not record (killed at the alias move, or recorded as unknown)
    still enters the chain through the next gate's baseline, or through ``holder``, the version the alias
    holds now, which ends the chain. A move that was refused (the alias had moved since it read its baseline)
    says nothing about what held the alias, nor does a record whose report could not be read.

    >>> r = lambda c, b, p, **k: GateRecord("run", c, b, "passed", "passed", p, None, None, held_alias=True, **k)
    >>> champions([r("2", "1", True), r("3", "2", False), r("4", "2", True)])
    ['1', '2', '4']
    >>> champions([r("6", "5", None), r("7", "6", True)])  # v6's promotion unrecorded: v7's gate saw it
    ['5', '6', '7']
    >>> champions([r("2", "1", None)], holder="2")  # the gate's move unrecorded; the registry holds v2
    ['1', '2']
    >>> champions([r("2", "1", True), r("1", "3", False, refused=True)])  # a stale rollback of v3, refused
    ['1', '2']
    """
    chain: list[str] = []
    for record in records:
        held = record.baseline if record.held_alias and not record.refused else None
        for version in (held, record.promoted_version):
            if version is not None and (not chain or chain[-1] != version):
                chain.append(version)
    if holder is not None and (not chain or chain[-1] != holder):
        chain.append(holder)
    return chain


def chain_doubt(unreadable: dict[str, str]) -> str | None:
    """Why the chain of champions may miss one (a run whose report cannot be read), or None.

    >>> chain_doubt({"r1": "run r1: gate/report.json is not JSON (...)"})[:52]
    'run r1: gate/report.json is not JSON (...): what tha'
    """
    if not unreadable:
        return None
    why = next(iter(unreadable.values()))
    more = f" (and {len(unreadable) - 1} more)" if len(unreadable) > 1 else ""
    return f"{why}{more}: what that run compared and promoted is unknown, so the champions before it may be incomplete"


def rollback_target(records: list[GateRecord], current: str, holds: Callable[[str], bool]) -> str | None:
    """The champion before ``current`` in the order they held the alias, skipping versions a rollback took off it
    (``holds(v)``: v carries ``rolled_back_to``); None when there is none.

    >>> r = lambda c, b, p, **k: GateRecord("run", c, b, "passed", "passed", p, None, None, held_alias=True, **k)
    >>> rollback_target([r("2", "1", True), r("3", "2", True)], "3", lambda v: False)
    '2'
    >>> rollback_target([r("2", "1", True), r("3", "2", True)], "3", lambda v: v == "2")  # v2 was rolled back
    '1'
    """
    chain = champions(records, current)
    before = chain[: len(chain) - chain[::-1].index(current) - 1]
    return next((v for v in reversed(before) if v != current and not holds(v)), None)


def in_move_order(records: list[GateRecord]) -> list[GateRecord]:
    """The records in the order their moves of the alias happened (``moved_at``; a record without one, by its run's
    start), where the runs started in another: a revert made while a long gate ran moved the alias before that
    gate's promotion, though its run started after the gate's.

    >>> r = lambda run, started, at: GateRecord(run, "2", "1", "passed", "passed", True, None, None, started=started,
    ...     moved_at=at)
    >>> [x.run_id for x in in_move_order([r("gate", 10.0, 40.0), r("revert", 20.0, 25.0), r("old", 5.0, None)])]
    ['old', 'revert', 'gate']
    """
    return sorted(records, key=lambda r: r.moved_at if r.moved_at is not None else r.started)


def last_move(records: list[GateRecord]) -> GateRecord | None:
    """The last record that moved the alias (a gate's or shadow check's promotion, a rollback), or may have (a
    move whose run may have lost its record of it).

    >>> r = lambda c, b, p, undoes: GateRecord("r" + c, c, b, "passed", "passed", p, None, None, True, moving=c,
    ...     undoes=undoes)
    >>> last_move([r("2", "1", True, False), r("1", "2", None, True), r("3", "1", False, False)]).run_id
    'r1'
    """
    moves = (r for r in reversed(in_move_order(records)) if r.promoted_version or (r.moving and r.promoted is None))
    return next(moves, None)


def restored_now(record: GateRecord | None, current: str) -> bool:
    """Whether ``record`` is a step back (a rollback: ``undoes``) that put the alias where it is now, ``current``
    (its move read back, or unknown in its run: the registry holding its target says it went through).

    >>> r = GateRecord("r", "1", "2", "rolled back", "pending", None, None, None, True, kind="rollback", undoes=True)
    >>> restored_now(r, "1"), restored_now(r, "2")
    (True, False)
    """
    return record is not None and record.undoes and record.candidate == current and record.promoted is not False


def move_back(client: MlflowClient, name: str, current: str, to: str, owner: str, again: str = "") -> Promotion:
    """Move ``@champion`` from ``current`` back to ``to`` (only if it still holds ``current``), under the lock, read
    back, as a rollback does; ``again``: what to do when it holds another version by then."""
    again = again or f"run rollback again to roll back from what @{DEFAULT_ALIAS} holds"
    return promote(client, name, DEFAULT_ALIAS, to, current, owner, again)


def previous_champion(client: MlflowClient, name: str, records: list[GateRecord], current: str) -> str:
    """The champion before ``current`` that a rollback without ``--to`` restores (from the gates' records and the
    versions a rollback took off the alias); ModelError (exit 4) when it is not known for sure."""
    doubt = chain_doubt(unreadable_reports(records))
    if doubt:
        raise ModelError(f"model '{name}': {doubt}; give the version to restore with --to VERSION")

    def rolled_back(version: str) -> bool:
        return TAG_ROLLED_BACK in (client.get_model_version(name, version).tags or {})

    target = rollback_target(records, current, rolled_back)
    if target is None:
        raise ModelError(
            f"model '{name}': the gates' history has no champion before v{current} that was not rolled back; give "
            "the version to restore with --to VERSION"
        )
    return target


@dataclass(frozen=True)
class Authority:
    """Which version may hold the alias now, from the records of every move a gate, a shadow check, a rollback,
    a person's ``authorize`` or the guard made: ``versions`` (one; two while the last move's outcome is unknown,
    the version before it and the one it asked for; none before anything held it), the record that says so, and
    ``doubt``: why the records cannot say (a report that cannot be read), when nothing may be moved on them."""

    versions: frozenset[str]
    by: GateRecord | None
    doubt: str | None = None

    @property
    def version(self) -> str | None:
        """The one version that may hold the alias (None: none, or it is not known which)."""
        return next(iter(self.versions)) if len(self.versions) == 1 and self.doubt is None else None

    def allows(self, version: str) -> bool:
        """Whether the alias may hold ``version``: the records authorize it, or cannot say (fail safe)."""
        return self.doubt is not None or not self.versions or version in self.versions


def authority(records: list[GateRecord]) -> Authority:
    """The versions that may hold the alias now (:class:`Authority`), the moves read in the order they happened
    (:func:`in_move_order`): the target of the last move that was read back, with the target of any later move
    whose outcome is unknown; before any move, the version that held it
    when the first gate compared against it (what a team started with).

    >>> r = lambda c, b, p, **k: GateRecord("r" + c, c, b, "passed", "passed", p, None, None, held_alias=True, **k)
    >>> sorted(authority([r("2", "1", True, moving="2"), r("3", "2", False, moving="3")]).versions)
    ['2']
    >>> sorted(authority([r("2", "1", True, moving="2"), r("3", "2", None, moving="3")]).versions)  # unknown
    ['2', '3']
    >>> authority([r("2", "1", False)]).version, authority([]).version  # none moved: what held it then
    ('1', None)
    >>> authority([r("2", "1", True, moving="2"), r("1", "2", True, kind="rollback", moving="1")]).version
    '1'
    >>> gate, revert = r("9", "5", True, moving="9", started=1.0, moved_at=9.0), r("5", "7", True, moving="5",
    ...     kind="revert", started=2.0, moved_at=3.0)  # the revert made while the gate of v9 ran
    >>> authority([gate, revert]).version
    '9'
    """
    allowed: set[str] = set()
    by, unreadable = None, {}
    for record in in_move_order(records):
        if record.unreadable:  # what it moved is unknown, until a later move is read back
            unreadable[record.run_id] = record.unreadable
            continue
        target = record.moving or record.promoted_version  # the version its move asked for
        if record.promoted is True and target is not None:
            allowed, by, unreadable = {target}, record, {}
        elif record.promoted is None and record.moving is not None:
            allowed, by = allowed | {record.moving}, record
        elif not allowed and record.held_alias and record.baseline and not record.refused:
            allowed = {record.baseline}
    return Authority(frozenset(allowed), by, chain_doubt(unreadable))
