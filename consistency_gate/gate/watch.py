"""``consistency-gate watch``: the registry starts the gate and guards ``@champion`` (the specification's
"Registry events").

A :class:`Watcher` takes the events the listener (:mod:`consistency_gate.mlops.webhooks`) accepted as jobs, one
at a time (so one gate at a time per model), each job once however often its event is delivered:

- ``gate``: a version registered (``model_version.created``) is gated as ``check`` gates it, in a process of its
  own, with the model's data, config and ``--promote`` from the watch config; the version's tag
  ``consistency_gate.started_by`` says the registry started it. A version a gate registered (a repair) or one
  already gated is left alone.
- ``guard``: ``@champion`` moved (``model_version_alias.created``) to a version that the records do not authorize
  (:func:`~consistency_gate.mlops.promotion.authority`: a gate's or shadow check's promotion, a rollback, a
  person's ``authorize``) is moved back to the authorized one, verified and read back like a promotion, in a run
  ``REVERTED @champion v7 -> v5`` (:mod:`consistency_gate.gate.alias`). A move the guard finds already
  overwritten (the race ``docs/gate.md`` describes: a move made between a gate's re-read and its own) is said on
  the version and in the status. Records that cannot say (an unreadable report, an unknown outcome) move nothing.
- ``reconcile``: at start and every ``reconcile_every_s``: versions registered after the newest gated one with
  no gate record are gated, and an alias on a version nothing authorized is guarded, so an event lost while the
  listener was down is caught late, not never.

    watcher = Watcher(load_watch_config("watch.yaml"), None)
    watcher.check()  # the models exist, their data and configs are there: one line each otherwise
    watcher.start()
    watcher.on_event(event)
    # 'queued: gate fraud-clf v7'
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from consistency_gate.errors import DataError, GateError, ModelError, UsageError, error_line
from consistency_gate.mlops.ledger import GateRecord, gate_records
from consistency_gate.mlops.promotion import DEFAULT_ALIAS, authority, read_alias
from consistency_gate.mlops.store import looks_unreachable
from consistency_gate.mlops.tracking import STARTED_BY_ENV, TAG_STARTED_BY, experiment_name

if TYPE_CHECKING:
    from consistency_gate.mlops.webhooks import Event

TAG_UNAUTHORIZED = "consistency_gate.unauthorized_move"  # on a version the alias was moved to without authority
DEFAULT_SECRET_ENV = "CONSISTENCY_GATE_WEBHOOK_SECRET"
RECENT = 50  # outcomes the status keeps


class WatchedModel(BaseModel):
    """One model the listener watches: its evaluation data and gate config (None: the default), its id and label
    columns, whether a new version is gated (False: the gates run elsewhere, in CI), whether a passing gate
    promotes, and whether ``@champion`` is guarded."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    data: Path
    config: Path | None = None
    id_column: str | None = None
    label_column: str = "label"
    gate: bool = True
    promote: bool = True
    guard: bool = True


class WatchConfig(BaseModel):
    """The listener's config: the tracking server, the environment variable that holds the webhook secret, how
    often it reconciles, and the models it watches."""

    model_config = ConfigDict(extra="forbid")

    tracking_uri: str | None = None
    secret_env: str = DEFAULT_SECRET_ENV
    reconcile_every_s: float = Field(default=300.0, gt=0)
    models: list[WatchedModel] = Field(min_length=1)


def load_watch_config(path: str | Path) -> WatchConfig:
    """The watch config in ``path`` (YAML); a UsageError naming the file and the first wrong key otherwise.
    Relative paths in it are relative to the file.

    >>> import tempfile; folder = Path(tempfile.mkdtemp()); (folder / "w.yaml").write_text("models: []\\n")
    11
    >>> load_watch_config(folder / "w.yaml")
    Traceback (most recent call last):
    ...
    consistency_gate.errors.UsageError: ...w.yaml: models: List should have at least 1 item after validation, ...
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the watch config ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: malformed YAML ({error_line(exc)})") from None
    try:
        config = WatchConfig.model_validate(data or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the top level"
        raise UsageError(f"{path}: {where}: {first['msg']} (see docs/watch.md)") from None
    for model in config.models:
        model.data = path.parent / model.data
        model.config = None if model.config is None else path.parent / model.config
    return config


@dataclass(frozen=True)
class Job:
    """One thing to do: ``gate`` a version, ``guard`` the alias (moved to ``version``) or ``reconcile``; the event
    that asked (None: a reconcile)."""

    kind: str
    model: str = ""
    version: str = ""
    event: Event | None = field(default=None, compare=False, hash=False)

    @property
    def key(self) -> tuple[str, str, str]:
        """What makes two jobs the same (their event aside)."""
        return (self.kind, self.model, self.version)

    def describe(self) -> str:
        """The job in words.

        >>> Job("gate", "clf", "7").describe(), Job("reconcile").describe()
        ('gate clf v7', 'reconcile')
        """
        return " ".join(w for w in (self.kind, self.model, f"v{self.version}" if self.version else "") if w)


class Watcher:
    """The listener's work: a queue of :class:`Job`, run one at a time by a thread of its own, each key queued
    once at a time; what each did is kept for ``/health`` and said on ``echo``."""

    def __init__(self, config: WatchConfig, tracking_uri: str | None, echo: Callable[[str], None] = print) -> None:
        from consistency_gate.mlops.store import connect

        self.config, self.echo = config, echo
        self.uri, self.client = connect(tracking_uri or config.tracking_uri, existing=True)
        self.models = {m.name: m for m in config.models}
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.queued: set[tuple[str, str, str]] = set()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.ended: dict[str, GateRecord | None] = {}  # the records of ended runs, read once (gate_records)
        self.state: dict = {"started": time.time(), "running": None, "last_event": None, "last_reconcile": None,
                            "done": deque(maxlen=RECENT)}  # fmt: skip
        self.worker = threading.Thread(target=self._work, name="consistency-gate-watch", daemon=True)

    def check(self) -> None:
        """Each watched model is registered, its data file and gate config are there: one line otherwise (exit 4,
        3 or 2), before anything is listened to."""
        from consistency_gate.gate.config import load_config
        from consistency_gate.mlops.registry import is_not_found

        for model in self.config.models:
            try:
                self.client.get_registered_model(model.name)
            except Exception as exc:  # noqa: BLE001 - MLflow raises its own kinds; not-found is the user's
                if is_not_found(exc):
                    raise ModelError(
                        f"model '{model.name}' is not registered at {self.uri}: the watch config names a model that "
                        "does not exist; register it or fix its name"
                    ) from None
                raise
            if not model.data.is_file():
                raise DataError(f"{model.data}: the evaluation data of '{model.name}' does not exist")
            if model.config is not None:
                load_config(model.config)

    def start(self) -> None:
        """Start the worker, queue a first reconcile, and reconcile every ``reconcile_every_s`` after it."""
        self.worker.start()
        self.submit(Job("reconcile"))

        def every() -> None:
            while not self.stopped.wait(self.config.reconcile_every_s):
                self.submit(Job("reconcile"))

        threading.Thread(target=every, name="consistency-gate-reconcile", daemon=True).start()

    def stop(self, wait_s: float | None = None) -> None:
        """Take no more jobs; the one running ends first (up to ``wait_s``)."""
        self.stopped.set()
        self.jobs.put(None)
        self.worker.join(wait_s)

    def on_event(self, event: Event) -> str:
        """Queue what an accepted event asks (fast: the work is the worker's); what it did, in words."""
        self.state["last_event"] = {**event.to_dict(), "received": time.time()}
        model = self.models.get(event.model)
        if model is None:
            return f"ignored: '{event.model}' is not watched"
        if event.kind == "model_version.created":
            if not model.gate:
                return f"ignored: '{event.model}' is gated elsewhere"
            return self.submit(Job("gate", event.model, event.version, event))
        if event.kind == "model_version_alias.created":
            if event.alias != DEFAULT_ALIAS or not model.guard:
                return f"ignored: @{event.alias} is not guarded"
            return self.submit(Job("guard", event.model, event.version, event))
        return f"ignored: {event.kind} is not an event the listener acts on"

    def submit(self, job: Job) -> str:
        """Queue ``job`` unless the same is already waiting."""
        with self.lock:
            if job.key in self.queued:
                return f"already queued: {job.describe()}"
            self.queued.add(job.key)
        self.jobs.put(job)
        return f"queued: {job.describe()}"

    def status(self) -> dict:
        """What ``/health`` answers: healthy while the worker runs; the queue, the job running, the last event and
        reconcile, and the last :data:`RECENT` outcomes."""
        return {
            "healthy": self.worker.is_alive() and not self.stopped.is_set(),
            "queue": self.jobs.qsize(),
            **{k: (list(v) if isinstance(v, deque) else v) for k, v in self.state.items()},
        }

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            with self.lock:
                self.queued.discard(job.key)
            self.state["running"] = {"job": job.describe(), "since": time.time()}
            try:
                said = {"gate": self.gate, "guard": self.guard, "reconcile": self.reconcile}[job.kind](job)
            except GateError as exc:
                said = f"error: {error_line(exc)}"
            except Exception as exc:  # noqa: BLE001 - the listener outlives any one job; said, never swallowed
                said = (
                    f"error: the tracking server does not answer ({error_line(exc)[:300]}): nothing was moved; the "
                    "next event or reconcile tries again"
                    if looks_unreachable(exc)
                    else f"error (report it): {type(exc).__name__}: {error_line(exc)}"
                )
            self.state["running"] = None
            self.state["done"].append({"job": job.describe(), "at": time.time(), "said": said})
            self.echo(f"{job.describe()}: {said}")

    def _records(self, name: str) -> list[GateRecord]:
        try:
            return gate_records(self.client, name, self.ended)
        except ModelError:  # no gate has run on it yet
            return []

    def gate(self, job: Job) -> str:
        """Gate ``job``'s version as ``check`` does, in a process of its own; what it decided, in words."""
        model = self.models[job.model]
        version = self.client.get_model_version(job.model, job.version)
        if self._registered_by_a_gate(job.model, version.run_id):
            return "left alone: a gate registered it (a repair)"
        gated = next((r for r in self._records(job.model) if r.candidate == job.version), None)
        if gated is not None:
            return f"left alone: gated already (run {gated.run_id})"
        why = f"{job.event.kind} (delivery {job.event.delivery_id})" if job.event else "a reconcile"
        self.client.set_model_version_tag(job.model, job.version, TAG_STARTED_BY, f"registry: {why}")
        with tempfile.TemporaryDirectory() as folder:
            report = Path(folder) / "report.json"
            args = ["check", "--model", job.model, "--candidate", job.version, "--data", str(model.data),
                    "--tracking-uri", self.uri, "--label-column", model.label_column,
                    "--report", str(report)]  # fmt: skip
            args += ["--config", str(model.config)] if model.config else []
            args += ["--id-column", model.id_column] if model.id_column else []
            args += ["--promote"] if model.promote else []
            proc = subprocess.run([sys.executable, "-m", "consistency_gate", *args], capture_output=True, text=True,
                                  env={**os.environ, STARTED_BY_ENV: f"registry: {why}"})  # fmt: skip
            said = json.loads(report.read_text()) if report.is_file() else {}
        if proc.returncode >= 2:
            line = (proc.stderr.strip().splitlines() or ["no message"])[-1]
            return f"gate ended with exit {proc.returncode}: {line}"
        promoted = {True: "promoted", False: "not promoted", None: "promotion unknown"}[said.get("promoted")]
        return f"{said.get('verdict', 'unknown')} (exit {proc.returncode}, run {said.get('run_id')}): {promoted}"

    def _registered_by_a_gate(self, name: str, run_id: str | None) -> bool:
        """Whether a version's run is a gate's (a repair a gate registered): the model's gate experiment."""
        if not run_id:
            return False
        experiment = self.client.get_experiment_by_name(experiment_name(name))
        return experiment is not None and self.client.get_run(run_id).info.experiment_id == experiment.experiment_id

    def guard(self, job: Job) -> str:
        """Move ``@champion`` back when it holds a version the records do not authorize; what it did, in words."""
        name, moved_to = job.model, job.version
        holds = read_alias(self.client, name, DEFAULT_ALIAS)
        records = self._records(name)
        said = authority(records)
        if holds is None:
            return f"@{DEFAULT_ALIAS} of '{name}' is unset now: nothing to move back"
        if said.allows(holds):
            if holds != moved_to and not said.allows(moved_to):
                return self._overwritten(name, moved_to, holds, job)
            why = said.doubt or (f"authorized by run {said.by.run_id}" if said.by else "nothing authorized yet")
            return f"@{DEFAULT_ALIAS} on v{holds}: left ({why})"
        if said.version is None:
            return f"@{DEFAULT_ALIAS} on v{holds} is not authorized, but the records name no one version: left"
        return self._revert(name, holds, said.version, job)

    def _overwritten(self, name: str, moved_to: str, holds: str, job: Job) -> str:
        """Say a move to ``moved_to`` that nothing authorized and that another move overwrote before the guard read
        the alias (the race of a move made without the lock): on the version, and in the status."""
        from consistency_gate.mlops.registry import ModelRef, lead_description

        when = _utc(job.event.signed_at if job.event else time.time())
        text = (f"UNAUTHORIZED MOVE: @{DEFAULT_ALIAS} was moved to v{moved_to} at {when} without a gate's promotion or "
                f"an authorization, and overwritten by v{holds} before the guard read it: v{moved_to} may have served "
                "for that moment")  # fmt: skip
        self.client.set_model_version_tag(name, moved_to, TAG_UNAUTHORIZED, text[:500])
        lead_description(self.client, ModelRef(name, moved_to), text + ".")
        return text

    def _revert(self, name: str, holds: str, target: str, job: Job) -> str:
        """Move ``@champion`` from ``holds`` back to ``target`` in a run of the model's experiment."""
        from consistency_gate.gate.alias import move_in_session
        from consistency_gate.gate.session import GateSession

        seen = job.event.to_dict() if job.event else {"kind": "reconcile", "version": holds}
        when = _utc(job.event.signed_at if job.event else time.time())
        how = f"seen by its {seen['kind']} event at {when}" if job.event else f"found by a reconcile at {when}"
        why = (f"@{DEFAULT_ALIAS} was moved to v{holds} ({how}) but no gate promoted it, no rollback restored it "
               "and no one authorized it")  # fmt: skip
        with GateSession(None) as session:
            session.connect(self.uri, existing=True)
            report = move_in_session(session, self.client, name, holds, target, why, "revert", event=seen)
        if report["promoted"]:
            return f"REVERTED @{DEFAULT_ALIAS} v{holds} -> v{target} (run {report['run_id']})"
        now = report["promotion"]["holds"]
        overwritten = report["promotion"]["refused"] and now not in (None, "unknown", holds)
        if overwritten and authority(self._records(name)).allows(now):  # a gate's move, while the guard waited
            return self._overwritten(name, holds, now, job)
        return f"not reverted: {report['promotion']['reason']}"

    def reconcile(self, job: Job) -> str:
        """Gate the versions registered after the newest gated one that no gate recorded, and guard an alias on a
        version nothing authorized, for every watched model; what it queued, in words."""
        queued = []
        for model in self.config.models:
            records = self._records(model.name)
            holds = read_alias(self.client, model.name, DEFAULT_ALIAS)
            known = {r.candidate for r in records} | {r.registered for r in records if r.registered}
            known |= {r.baseline for r in records if r.baseline}
            # before any gate, what the alias holds is where the team starts; after, only what the gates saw counts
            numbers = [int(v) for v in (known if records else {holds}) if v and v.isdigit()]
            newest = max(numbers, default=0)
            if model.guard and holds is not None and not authority(records).allows(holds):
                queued.append(self.submit(Job("guard", model.name, holds)))  # first: a gate compares against it
            for version in self.client.search_model_versions(f"name='{model.name}'") if model.gate else ():
                if int(version.version) > newest and version.version not in known:
                    queued.append(self.submit(Job("gate", model.name, version.version)))
        self.state["last_reconcile"] = {"at": time.time(), "queued": queued}
        return "; ".join(queued) or "nothing missed"


def _utc(seconds: float) -> str:
    """A time as the versions' descriptions say it.

    >>> _utc(0)
    '1970-01-01 00:00:00 UTC'
    """
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))
