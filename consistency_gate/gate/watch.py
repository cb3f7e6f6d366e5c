"""``consistency-gate watch``: a controller that keeps the registry in its desired state, as a Kubernetes controller
does (the specification's "Registry events"). For every watched model:

- **every version** registered from a starting point on (``since:``) has **exactly one gate record**: a version
  without one is gated as ``check`` gates it (the same run, report, tags, ledger and promotion), whatever its age
  or the order it came in; a version older than the one ``@champion`` holds is gated but not promoted;
- **``@champion`` holds an authorized version** (:mod:`consistency_gate.gate.guard`): a move to any other is moved
  back, verified and read back like a promotion.

What is missing is found from the registry (its versions, the gate runs' reports, the alias), never from the
listener's memory, so a lost or repeated event changes nothing: events (MLflow's webhooks, when the registry sends
them) only wake the reconcile of their model early, and a timer wakes it too, alone where the registry sends no
webhooks (``--poll``). One listener acts for a model at a time, under the model's lease
(:mod:`consistency_gate.mlops.lease`): two listeners, a restarted one, or a gate left by one that died never gate a
version twice. Guarding runs on its own thread and never waits behind a gate; gates run one at a time in a warm
worker (:mod:`consistency_gate.gate.worker`).

    watcher = Watcher(load_watch_config("watch.yaml"), None)
    watcher.check()  # the models exist, their data and configs are there: one line each otherwise
    watcher.start()
    watcher.on_event(event)
    # 'woke fraud-clf: versions'
"""

from __future__ import annotations

import json
import socket
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from consistency_gate.errors import DataError, GateError, ModelError, UsageError, error_line
from consistency_gate.gate.workqueue import WorkQueue
from consistency_gate.mlops.ledger import GateRecord, gate_records
from consistency_gate.mlops.promotion import DEFAULT_ALIAS, authority, read_alias
from consistency_gate.mlops.store import looks_unreachable
from consistency_gate.mlops.tracking import LEASE_ENV, STARTED_BY_ENV, TAG_STARTED_BY, experiment_name

if TYPE_CHECKING:
    from consistency_gate.mlops.lease import Lease
    from consistency_gate.mlops.webhooks import Event

DEFAULT_SECRET_ENV = "CONSISTENCY_GATE_WEBHOOK_SECRET"
TAG_SINCE = "consistency_gate.watch_since"  # on a watched model: the first version its listener gates
RECENT = 50  # outcomes the status keeps
START = "the listener's start"  # what woke the first reconcile of a model
LEFT = (f"@{DEFAULT_ALIAS} on v", f"@{DEFAULT_ALIAS} of")  # how the guard says it moved nothing
RETRY_S, RETRY_MAX_S = 30.0, 3600.0  # a gate that ended in an error is tried again after 30 s, 60 s, ... 1 h
UNREAD = "unread"  # gate()'s holds when the caller has not read @champion


class WatchedModel(BaseModel):
    """One model the listener watches: its evaluation data and gate config (None: the default), its id and label
    columns, whether a new version is gated (False: the gates run elsewhere, in CI) and from which version on
    (``since``: a number; ``champion``, the versions after the one ``@champion`` held when the listener first
    watched the model; ``all``; ``new``, those registered after that first start), whether a passing gate
    promotes, and whether ``@champion`` is guarded."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    data: Path
    config: Path | None = None
    id_column: str | None = None
    label_column: str = "label"
    gate: bool = True
    since: Literal["champion", "all", "new"] | Annotated[int, Field(ge=1)] = "champion"
    promote: bool = True
    guard: bool = True


class WatchConfig(BaseModel):
    """The listener's config: the tracking server, the environment variable that holds the webhook secret, how
    often it reconciles with webhooks on (``--poll`` sets it without), its lease's duration, how long the tracking
    server caches its webhooks (``MLFLOW_WEBHOOK_CACHE_TTL`` there), and the models it watches (each once)."""

    model_config = ConfigDict(extra="forbid")

    tracking_uri: str | None = None
    secret_env: str = DEFAULT_SECRET_ENV
    reconcile_every_s: float = Field(default=300.0, ge=1.0, le=86_400.0)
    lease_s: float = Field(default=15.0, ge=3.0, le=600.0)
    webhook_cache_s: float = Field(default=60.0, ge=0.0, le=3_600.0)
    models: list[WatchedModel] = Field(min_length=1)

    @model_validator(mode="after")
    def _each_model_once(self) -> WatchConfig:
        names = [m.name for m in self.models]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"model {twice[0]!r} is listed {names.count(twice[0])} times: list each model once")
        return self


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
        raise UsageError(f"{path}: {where}: {first['msg'].removeprefix('Value error, ')} (see docs/watch.md)") from None
    for model in config.models:
        model.data = path.parent / model.data
        model.config = None if model.config is None else path.parent / model.config
    return config


@dataclass(frozen=True)
class Guard:
    """An item of the guard's queue: reconcile ``model``'s alias; ``seen``, the version an event saw it moved to."""

    model: str
    seen: str = ""
    event: Event | None = None

    def describe(self) -> str:
        """As the status and the output say it.

        >>> Guard("clf", "7").describe(), Guard("clf").describe()
        ('guard clf v7', 'guard clf')
        """
        return f"guard {self.model}" + (f" v{self.seen}" if self.seen else "")


class Watcher:
    """The controller: the models' leases kept by one thread, the guard's queue and the gates' queue each worked by
    a thread of its own, a timer that reconciles every model; what each did is kept for ``/health`` and said on
    ``echo``. ``poll_s``: reconcile that often (a registry that sends no webhooks); ``holder``: this listener's
    identity in the leases."""

    def __init__(
        self,
        config: WatchConfig,
        tracking_uri: str | None,
        echo: Callable[[str], None] = print,
        poll_s: float | None = None,
        holder: str | None = None,
    ) -> None:
        from consistency_gate.gate.worker import GateWorker
        from consistency_gate.mlops.lease import Lease, identity
        from consistency_gate.mlops.store import connect

        self.config, self.echo = config, echo
        self.uri, self.client = connect(tracking_uri or config.tracking_uri, existing=True)
        self.models = {m.name: m for m in config.models}
        self.period = poll_s or config.reconcile_every_s
        self.mode = f"polling every {self.period:g} s" if poll_s else "webhooks"
        self.holder = holder or identity()
        deadline, retry = config.lease_s * 2 / 3, config.lease_s / 7.5  # 15 s: renewed every 2 s, deadline 10 s
        self.retry_s = retry
        self.leases: dict[str, Lease] = {
            name: Lease(self.client, name, self.holder, config.lease_s, deadline) for name in self.models
        }
        self.guards, self.gates = WorkQueue(), WorkQueue()
        self.worker = GateWorker()
        self.pool = ThreadPoolExecutor(4, thread_name_prefix="consistency-gate-read")  # reads made side by side
        self.stopped = threading.Event()
        self.ended: dict[str, GateRecord | None] = {}  # the records of ended runs, read once (gate_records)
        self.repairs: dict[tuple[str, str], bool] = {}  # (model, version) -> registered by a gate (a repair)
        self.first: dict[str, int] = {}  # model -> the first version it gates (since:), once resolved
        self.experiments: dict[str, str] = {}  # model -> its gate experiment's id, once it exists
        self.retries: dict[tuple[str, str], tuple[int, float, str]] = {}  # looked at again later: tries, when, why
        self.state: dict = {"started": time.time(), "mode": self.mode, "holder": self.holder, "running": None,
                            "last_event": None, "last_reconcile": None, "done": deque(maxlen=RECENT),
                            "woken": {}}  # fmt: skip  # woken: model -> what woke its last reconcile, and when
        self.threads = [
            threading.Thread(target=self._keep_leases, name="consistency-gate-leases", daemon=True),
            threading.Thread(target=self._work, args=(self.guards, self._guard), name="consistency-gate-guard",
                             daemon=True),
            threading.Thread(target=self._work, args=(self.gates, self._gate_next), name="consistency-gate-gates",
                             daemon=True),
            threading.Thread(target=self._tick, name="consistency-gate-timer", daemon=True),
        ]  # fmt: skip

    # ------------------------------------------------------------------------------------------------ lifecycle

    def check(self) -> None:
        """Each watched model is registered, its data file is there with its id and label columns, its gate config
        is valid: one line otherwise (exit 4, 3 or 2), before anything is listened to."""
        from consistency_gate.gate.config import load_config
        from consistency_gate.io.predictions import file_columns, file_format
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
            columns = file_columns(model.data) if file_format(model.data) != "npz" else []
            for role, column in (("label_column", model.label_column), ("id_column", model.id_column)):
                if column and columns and column not in columns:
                    raise DataError(
                        f"{model.data}: no column '{column}' (the {role} of '{model.name}' in the watch config); its "
                        f"columns: {', '.join(columns[:12])}{' ...' if len(columns) > 12 else ''}"
                    )
            if model.config is not None:
                load_config(model.config)

    def start(self) -> None:
        """Start the threads: the leases are tried at once, and each model is reconciled once its lease is held."""
        for thread in self.threads:
            thread.start()

    def reconcile_in(self, seconds: float, why: str) -> None:
        """Reconcile every model in ``seconds`` (e.g. once the tracking server's webhook cache has expired)."""

        def later() -> None:
            if not self.stopped.wait(seconds):
                self.echo(f"reconciling every model held: {why}")
                self.wake_all(why)

        threading.Thread(target=later, name="consistency-gate-later", daemon=True).start()

    def stop(self, wait_s: float | None = None) -> None:
        """Take no more work; the gate running ends first (up to ``wait_s``); the leases are released for the next
        listener to take at once."""
        self.stopped.set()
        self.guards.close()
        self.gates.close()
        for thread in self.threads[1:3]:
            thread.join(wait_s)
        self.worker.stop()
        self.pool.shutdown(wait=False)
        for lease in self.leases.values():
            lease.release()

    # -------------------------------------------------------------------------------------------------- wake-ups

    def on_event(self, event: Event) -> str:
        """Wake the reconcile of what an accepted event may have changed (fast: the work is the threads'); what it
        did, in words. A listener that does not hold the model's lease leaves the holder a wake-up on the lease."""
        from consistency_gate.mlops.webhooks import WAKES

        self.state["last_event"] = {**event.to_dict(), "received": time.time()}
        model, part = self.models.get(event.model), WAKES.get(event.kind)
        if model is None:
            return f"ignored: '{event.model}' is not watched"
        if part is None:
            return f"ignored: {event.kind} is not an event the listener acts on"
        if part == "alias" and (event.alias != DEFAULT_ALIAS or not model.guard):
            return f"ignored: @{event.alias} is not guarded"
        if part == "versions" and not model.gate:
            return f"ignored: '{event.model}' is gated elsewhere"
        lease = self.leases[event.model]
        if not lease.held:
            lease.wake(f"{event.kind} v{event.version}")
            holder = lease.observed.holder if lease.observed else None
            return f"not the holder of the lease on '{event.model}' ({holder or 'no one yet'}): left it a wake-up"
        self.state["woken"][event.model] = {"at": time.time(), "why": f"{event.kind}, delivery {event.delivery_id}"}
        if part == "alias":
            self.guards.add(Guard(event.model, event.version, event))
        else:
            self.gates.add(event.model)
        return f"woke {event.model}: {part}"

    def wake(self, name: str, why: str) -> None:
        """Reconcile model ``name``: its alias first (a gate compares against it), then its versions."""
        model = self.models[name]
        self.state["woken"][name] = {"at": time.time(), "why": why}
        if model.guard:
            self.guards.add(Guard(name))
        if model.gate:
            self.gates.add(name)

    def wake_all(self, why: str) -> None:
        """Reconcile every model this listener holds the lease of."""
        for name, lease in self.leases.items():
            if lease.held:
                self.wake(name, why)

    def _tick(self) -> None:
        while not self.stopped.wait(self.period):
            self.wake_all("the timer")

    def _keep_leases(self) -> None:
        """Try every model's lease each retry period: a model whose lease is taken (or whose holder left a
        wake-up) is reconciled; a lease lost is said."""
        while not self.stopped.is_set():
            for name, lease in self.leases.items():
                had, woken = lease.held, lease.woken
                lease.try_acquire_or_renew()
                if lease.held and not had:
                    self._said(f"lease {name}", f"held (generation {lease.generation}): acting for '{name}'")
                    self.wake(name, f"the lease taken, generation {lease.generation}")
                elif had and not lease.held:
                    holder = lease.observed.holder if lease.observed else None
                    self._said(f"lease {name}", f"lost to {holder or 'no one (the registry did not answer)'}")
                elif lease.held and lease.woken != woken:
                    self.wake(name, f"a wake-up left by another listener: {lease.woken}")
            self.stopped.wait(self.retry_s)

    # ---------------------------------------------------------------------------------------------------- status

    def status(self) -> dict:
        """What ``/health`` answers: healthy while the threads run; the mode, the leases, the queues, the job
        running, the last event, what last woke each model, the last reconcile of versions, the gates waiting to be
        tried again, the worker, and the last outcomes."""
        leases = {
            name: {"held": lease.held, "generation": lease.generation or (lease.observed and lease.observed.generation),
                   "holder": lease.observed.holder if lease.observed else None}
            for name, lease in self.leases.items()
        }  # fmt: skip
        retries = {f"{m} v{v}": {"tries": n, "next_in_s": round(max(at - time.time(), 0), 1), "why": why}
                   for (m, v), (n, at, why) in self.retries.items()}  # fmt: skip
        return {
            "healthy": all(t.is_alive() for t in self.threads) and not self.stopped.is_set(),
            "leases": leases,
            "queue": {"guard": len(self.guards), "gates": len(self.gates)},
            "retries": retries,
            "worker": {"ready": self.worker.ready, "started": self.worker.started, "log": str(self.worker.log)},
            **{k: (list(v) if isinstance(v, deque) else v) for k, v in self.state.items()},
        }

    def _said(self, job: str, said: str) -> None:
        self.state["done"].append({"job": job, "at": time.time(), "said": said})
        self.echo(f"{job}: {said}")

    def _work(self, queue: WorkQueue, step: Callable[[Hashable], tuple[str, str] | None]) -> None:
        """Work ``queue`` until it closes: each item's ``step`` under its model's lease; an error is one line. The
        gates' thread starts the warm worker first, so that the first gate does not wait for its imports."""
        from consistency_gate.gate.worker import WorkerEnded
        from consistency_gate.mlops.lease import acting_as

        if queue is self.gates:
            try:
                self.worker.start()
            except WorkerEnded as exc:
                self._said("worker", f"{exc}; started again at the first gate")
        while (item := queue.get()) is not None:
            name = item.model if isinstance(item, Guard) else item
            job = item.describe() if isinstance(item, Guard) else f"gates {item}"
            lease = self.leases[name]
            try:
                if not lease.held:
                    continue  # its holder acts for it; this listener left it a wake-up if an event came here
                with acting_as(lease.name):
                    outcome = step(item)
                if outcome is not None:
                    self._said(*outcome)
            except GateError as exc:
                self._said(job, f"error: {error_line(exc)}")
            except Exception as exc:  # noqa: BLE001 - the listener outlives any one job; said, never swallowed
                self._said(job, _unexpected(exc))
            finally:
                queue.done(item)

    def _records(self, name: str) -> list[GateRecord]:
        try:
            return gate_records(self.client, name, self.ended)
        except ModelError:  # no gate has run on it yet
            return []

    # ----------------------------------------------------------------------------------------------------- guard

    def _guard(self, item: Guard) -> tuple[str, str]:
        from consistency_gate.gate.guard import guard

        said = guard(self.client, self.uri, self._records, item.model, item.seen or None, item.event)
        if said.startswith("REVERTED") and self.models[item.model].gate:
            self.gates.add(item.model)  # the version moved off may be one no gate has seen yet
        if item.event is None and said.startswith(LEFT):  # a timer's look that found nothing to do: status only
            self.state["last_guard"] = {"at": time.time(), "model": item.model, "said": said}
            return None
        return item.describe(), said

    # ----------------------------------------------------------------------------------------------------- gates

    def missing(self, name: str) -> tuple[list[str], str | None, bool]:
        """The versions of model ``name`` that should have a gate record and have none, oldest first: from its
        starting point (``since``) on, neither gated nor registered by a gate (a repair), nor the version the alias
        holds with authority (where the team started), nor waiting to be tried again after an error; the version
        ``@champion`` holds (None: unset); and whether the records authorize it (a gate never compares against a
        version the guard is about to move back)."""
        # three reads of the registry at once: each is a round trip to the tracking server
        reads = [self.pool.submit(self._records, name), self.pool.submit(read_alias, self.client, name, DEFAULT_ALIAS),
                 self.pool.submit(self.client.search_model_versions, f"name='{name}'")]  # fmt: skip
        records, holds, found = (read.result() for read in reads)
        known = {r.candidate for r in records} | {r.registered for r in records if r.registered}
        known |= {r.baseline for r in records if r.baseline}
        authorized = holds is None or authority(records).allows(holds)
        if holds is not None and authorized:
            known.add(holds)
        versions = {int(v.version): v.run_id for v in found}
        since = self._since(name, holds, list(versions))
        now = time.time()
        missing = [
            str(v) for v, run_id in sorted(versions.items())
            if v >= since and str(v) not in known and not self._registered_by_a_gate(name, str(v), run_id)
            and self.retries.get((name, str(v)), (0, 0.0, ""))[1] <= now
        ]  # fmt: skip
        return missing, holds, authorized

    def _since(self, name: str, holds: str | None, numbers: list[int]) -> int:
        """The first version the listener gates: the config's number, else the model's tag, which the first
        listener to watch it sets from ``since:`` (``champion``, ``all``, ``new``): every listener agrees."""
        since = self.models[name].since
        if isinstance(since, int):
            return since
        if name not in self.first:
            tag = (self.client.get_registered_model(name).tags or {}).get(TAG_SINCE, "")
            if not tag.isdigit():
                first = {"all": 1, "champion": int(holds) + 1 if holds else 1, "new": max(numbers, default=0) + 1}
                tag = str(first[since])
                self.client.set_registered_model_tag(name, TAG_SINCE, tag)
                self._said(f"since {name}", f"gating the versions from v{tag} on (since: {since}; tag {TAG_SINCE})")
            self.first[name] = int(tag)
        return self.first[name]

    def _experiment(self, name: str) -> str | None:
        """The id of model ``name``'s gate experiment (None: no gate has run), kept once found."""
        if name not in self.experiments:
            found = self.client.get_experiment_by_name(experiment_name(name))
            if found is None:
                return None
            self.experiments[name] = found.experiment_id
        return self.experiments[name]

    def _registered_by_a_gate(self, name: str, version: str, run_id: str | None) -> bool:
        """Whether a version's run is a gate's (a repair a gate registered): the model's gate experiment."""
        if (name, version) not in self.repairs:
            experiment = self._experiment(name) if run_id else None
            self.repairs[(name, version)] = bool(
                experiment is not None and self.client.get_run(run_id).info.experiment_id == experiment
            )
        return self.repairs[(name, version)]

    def _gate_next(self, name: str) -> tuple[str, str] | None:
        """Gate the oldest version of ``name`` that misses its gate record, then queue the model again while any
        is left (each gate re-reads the registry: what another gate did meanwhile counts)."""
        missing, holds, authorized = self.missing(name)
        if missing and not authorized:  # the guard moves the alias back first: gate against what it restores
            self.guards.add(Guard(name))
            self.gates.add_after(name, 2.0)
            return None
        if not missing:
            waiting = [v for (m, v) in self.retries if m == name]
            self.state["last_reconcile"] = {"at": time.time(), "model": name, "missing": [], "retrying": waiting}
            return None
        version = missing[0]
        job = f"gate {name} v{version}"
        self.state["running"] = {"job": job, "since": time.time()}
        try:
            woken = self.state["woken"].get(name, {}).get("why", START)
            said = self.gate(name, version, f"a reconcile ({woken})", holds)
        finally:
            self.state["running"] = None
        if len(missing) > 1:
            self.gates.add(name)
        return job, said

    def gate(self, name: str, version: str, why: str = "a reconcile", holds: str | None = UNREAD) -> str:
        """Gate version ``version`` of ``name`` as ``check`` does, in the warm worker; what it decided, in words.
        A gate of it still running (started by a listener that died) is ended first if its process is gone, else
        left to end; a version older than the one ``@champion`` holds is not promoted."""
        from consistency_gate.gate.worker import WorkerEnded
        from consistency_gate.mlops.registry import is_not_found

        model, lease = self.models[name], self.leases[name]
        running = self._running_gate(name, version)
        if running is not None:
            return running
        holds = read_alias(self.client, name, DEFAULT_ALIAS) if holds is UNREAD else holds
        promote = model.promote and (holds is None or not holds.isdigit() or int(version) > int(holds))
        started_by = f"registry: {why}"
        try:
            self.client.set_model_version_tag(name, version, TAG_STARTED_BY, started_by)
        except Exception as exc:  # noqa: BLE001 - MLflow's own kinds; not found is the registry's state, not a fault
            if is_not_found(exc):
                return f"v{version} is not registered now (deleted meanwhile): nothing to gate"
            raise
        with tempfile.TemporaryDirectory() as folder:
            report = Path(folder) / "report.json"
            args = ["check", "--model", name, "--candidate", version, "--data", str(model.data), "--tracking-uri",
                    self.uri, "--label-column", model.label_column, "--report", str(report)]  # fmt: skip
            args += ["--config", str(model.config)] if model.config else []
            args += ["--id-column", model.id_column] if model.id_column else []
            args += ["--promote"] if promote else []
            try:
                code, last = self.worker.run(args, {STARTED_BY_ENV: started_by, LEASE_ENV: lease.name or ""})
            except WorkerEnded as exc:
                return self._retry(name, version, f"{exc}; a new worker gates v{version} again")
            said = json.loads(report.read_text()) if report.is_file() else {}
        if code >= 2:
            return self._retry(name, version, f"the gate ended with exit {code}: {last or 'no message'}")
        self.retries.pop((name, version), None)
        promoted = {True: "promoted", False: "not promoted", None: "promotion unknown"}[said.get("promoted")]
        if model.promote and not promote:
            promoted = f"not promoted: v{version} is older than v{holds}, which @{DEFAULT_ALIAS} holds"
        return f"{said.get('verdict', 'unknown')} (exit {code}, run {said.get('run_id')}): {promoted}"

    def _retry(self, name: str, version: str, why: str) -> str:
        """A gate that ended in an error: tried again later (30 s, 60 s, ... 1 h), as the status says."""
        tries = self.retries.get((name, version), (0, 0.0, ""))[0] + 1
        wait = min(RETRY_S * 2 ** (tries - 1), RETRY_MAX_S)
        return self._later(name, version, wait, why, tries) + f" (try {tries})"

    def _later(self, name: str, version: str, seconds: float, why: str, tries: int | None = None) -> str:
        """Look at version ``version`` again in ``seconds`` (the versions after it go on meanwhile)."""
        tries = self.retries.get((name, version), (0, 0.0, ""))[0] if tries is None else tries
        self.retries[(name, version)] = (tries, time.time() + seconds, why)
        self.gates.add_after(name, seconds)
        return f"{why}; looked at again in {seconds:.0f} s"

    def _running_gate(self, name: str, version: str) -> str | None:
        """Why version ``version`` must not be gated now: a gate of it is running (None: none is). A gate left
        RUNNING by a process that has ended (a listener killed with its worker) is ended FAILED and gated again."""
        from consistency_gate.mlops.tracking import TAG_HOST, TAG_PID, close_runs, process_alive

        experiment = self._experiment(name)
        if experiment is None:
            return None
        query = f"attributes.status = 'RUNNING' and attributes.run_name = 'gate {name} v{version}'"
        for run in self.client.search_runs([experiment], filter_string=query, max_results=10):
            tags, run_id = run.data.tags, run.info.run_id
            pid, here = tags.get(TAG_PID, ""), tags.get(TAG_HOST) == socket.gethostname()
            if here and pid.isdigit() and process_alive(int(pid)):
                return self._later(name, version, 5.0, f"left to the gate running in run {run_id} (process {pid})")
            why = (f"ended: the gate's process (host {tags.get(TAG_HOST)}, pid {pid}) ended before it decided (its "
                   f"listener stopped); {self.holder} gates v{version} again")  # fmt: skip
            close_runs(self.client, [run_id], "FAILED", why, 0)
        return None


def _unexpected(exc: Exception) -> str:
    """An error no one line of ours explains, in one line: the tracking server away, or a bug to report."""
    if looks_unreachable(exc):
        return (f"error: the tracking server does not answer ({error_line(exc)[:300]}): nothing was moved; the next "
                "event or reconcile tries again")  # fmt: skip
    return f"error (report it): {type(exc).__name__}: {error_line(exc)}"
