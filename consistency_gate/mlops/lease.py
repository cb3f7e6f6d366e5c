"""A lease per watched model, kept in the registry the way Kubernetes leader election keeps a Lease (client-go's
``tools/leaderelection``): one holder acts for a model at a time; the holder renews it every few seconds; a
holder that stops renewing (killed, hung, cut off from the registry) loses it once ``duration_s`` has passed, as
measured by the contender's own clock from when it last saw the lease change (no clock is compared with another
machine's); a holder that cannot renew for ``renew_deadline_s`` (< ``duration_s``) stops acting first.

Where client-go updates a Lease with a compare-and-swap on its resourceVersion, MLflow's registry has one atomic
step: creating a registered model whose name is taken fails. So each holding is a registered model of its own,
``NAME.consistency-gate-lease.G``, G the lease's **generation**: taking the lease over from generation G is
creating generation G + 1, which exactly one contender can do; the winner then deletes generation G. The
generation is a fencing token: a holder renews only after checking that no later generation exists, and a gate's
promotion (:func:`~consistency_gate.mlops.promotion.promote`) checks it once more under the promotion lock, so
a holder that lost its lease while a gate of its was running never moves the alias. The watched model's tag
``consistency_gate.lease_generation`` points at a recent generation, where a reader starts looking.

    lease = Lease(client, "fraud-clf", identity("watch-a"))
    if lease.try_acquire_or_renew():  # every retry period (duration_s / 5)
        ...  # act for fraud-clf while lease.held
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from consistency_gate.mlops.tracking import LEASE_ENV, TAG_HOST, TAG_PID, process_alive

if TYPE_CHECKING:
    from mlflow import MlflowClient

LEASE_SUFFIX = ".consistency-gate-lease."
TAG_POINTER = "consistency_gate.lease_generation"  # on the watched model: a generation to start looking from
TAG_HOLDER = "consistency_gate.lease_holder"
TAG_RENEWED = "consistency_gate.lease_renewed"  # seconds since the epoch, as the holder's clock read it
TAG_DURATION = "consistency_gate.lease_duration_s"
TAG_RELEASED = "consistency_gate.lease_released"  # set by a holder that stops: the lease is free at once
TAG_WAKE = "consistency_gate.lease_wake"  # set by a listener that is not the holder and got an event
DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S = 15.0, 10.0, 2.0  # client-go's defaults
_FENCE: contextvars.ContextVar[str | None] = contextvars.ContextVar("consistency_gate_lease", default=None)


def identity(prefix: str = "watch") -> str:
    """A holder's identity: this host, this process and a random part (two listeners in one process differ).

    >>> identity("watch").count(":")
    3
    """
    return f"{prefix}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def lease_name(model: str, generation: int) -> str:
    """The registered model that holds generation ``generation`` of ``model``'s lease.

    >>> lease_name("fraud-clf", 3)
    'fraud-clf.consistency-gate-lease.3'
    """
    return f"{model}{LEASE_SUFFIX}{generation}"


@dataclass(frozen=True)
class Holding:
    """A lease as read: its generation (0: none was ever taken), its tags (None: no registered model holds it)."""

    generation: int
    tags: dict[str, str] | None

    @property
    def holder(self) -> str | None:
        """Who holds it (None: no one: never taken, released, or its model gone)."""
        if self.tags is None or self.tags.get(TAG_RELEASED):
            return None
        return self.tags.get(TAG_HOLDER)

    @property
    def seen(self) -> tuple[int, str | None, str | None]:
        """What changes when the holder renews (or another takes it): a contender times the lease from a change."""
        tags = self.tags or {}
        return (self.generation, tags.get(TAG_HOLDER), tags.get(TAG_RENEWED))

    def holder_gone(self) -> bool:
        """Whether its holder is a process of this host that has ended (its lease is free at once).

        >>> Holding(1, {TAG_HOST: socket.gethostname(), TAG_PID: str(os.getpid())}).holder_gone()
        False
        """
        tags = self.tags or {}
        pid = tags.get(TAG_PID, "")
        return tags.get(TAG_HOST) == socket.gethostname() and pid.isdigit() and not process_alive(int(pid))


class Lease:
    """One model's lease as one contender sees it: :meth:`try_acquire_or_renew` every retry period; :attr:`held`
    while its last renewal is younger than ``renew_deadline_s``. ``clock``: a monotonic clock (tests pass theirs).
    """

    def __init__(
        self,
        client: MlflowClient,
        model: str,
        holder: str,
        duration_s: float = DURATION_S,
        renew_deadline_s: float = RENEW_DEADLINE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < renew_deadline_s < duration_s:
            raise ValueError(f"renew_deadline_s {renew_deadline_s} must be in (0, duration_s {duration_s})")
        self.client, self.model, self.holder = client, model, holder
        self.duration_s, self.renew_deadline_s, self.clock = duration_s, renew_deadline_s, clock
        self.generation: int | None = None  # the generation this contender holds (None: it holds none)
        self.renewed_at: float | None = None  # when it last renewed it (its monotonic clock)
        self.observed: Holding | None = None  # the lease as last read
        self._seen: tuple | None = None  # what the last change showed, and when it was seen
        self._seen_at = 0.0
        self.woken: str | None = None  # the last wake-up another listener left on the lease

    @property
    def held(self) -> bool:
        """Whether this contender may act: it holds the lease and renewed it within ``renew_deadline_s``."""
        return (
            self.generation is not None
            and self.renewed_at is not None
            and self.clock() - self.renewed_at < self.renew_deadline_s
        )

    @property
    def name(self) -> str | None:
        """The registered model of the generation held (None: none held): the fencing token gates carry."""
        return None if self.generation is None else lease_name(self.model, self.generation)

    def read(self) -> Holding:
        """The newest generation of the lease and its tags, found from the watched model's pointer upwards."""
        generation = self.generation or (self.observed.generation if self.observed else 0)
        if not generation:  # first look: the pointer is a hint; without it, look from the first generation
            with contextlib.suppress(Exception):
                pointer = (self.client.get_registered_model(self.model).tags or {}).get(TAG_POINTER, "0")
                generation = int(pointer) if pointer.isdigit() else 0
        tags = self._tags(generation) if generation else None
        while (following := self._tags(generation + 1)) is not None:
            generation, tags = generation + 1, following
        return Holding(generation, tags)

    def try_acquire_or_renew(self) -> bool:
        """One step of the election: renew the lease this contender holds, or take it when it is free (never
        taken, released, its holder's process on this host gone) or expired (unchanged for ``duration_s`` by this
        contender's clock); True while it holds it. A registry that does not answer is no renewal: the holder
        stops acting once ``renew_deadline_s`` has passed without one."""
        from mlflow.exceptions import MlflowException

        try:
            now = self.read()
        except Exception:  # noqa: BLE001 - the registry is away: no renewal; held runs out by itself
            return self.held
        self.observed = now
        if now.seen != self._seen:
            self._seen, self._seen_at = now.seen, self.clock()
        if now.tags is not None and now.tags.get(TAG_WAKE):
            self.woken = now.tags[TAG_WAKE]
        if now.holder == self.holder and now.generation == self.generation:
            try:
                self.client.set_registered_model_tag(lease_name(self.model, now.generation), TAG_RENEWED, _stamp())
            except MlflowException:
                return self.held
            self.renewed_at = self.clock()
            return True
        self.generation = self.renewed_at = None
        expired = self.clock() - self._seen_at >= self.duration_s
        if now.holder is not None and not expired and not now.holder_gone():
            return False
        return self._take(now.generation + 1)

    def _take(self, generation: int) -> bool:
        """Create generation ``generation``: whoever creates it holds the lease; then the older one goes."""
        from mlflow.exceptions import MlflowException

        tags = {TAG_HOLDER: self.holder, TAG_RENEWED: _stamp(), TAG_DURATION: f"{self.duration_s:g}",
                TAG_HOST: socket.gethostname(), TAG_PID: str(os.getpid())}  # fmt: skip
        try:
            self.client.create_registered_model(
                lease_name(self.model, generation),
                tags=tags,
                description=f"consistency-gate watch: the lease of the listener that acts for '{self.model}' "
                f"(generation {generation}); a later generation takes it over (docs/watch.md)",
            )
        except MlflowException:
            return False  # another contender took this generation first (or the registry failed): not ours
        self.generation, self.renewed_at = generation, self.clock()
        for old in range(max(generation - 3, 1), generation):  # the generations before (a few left by a fault)
            _quietly(lambda o=old: self.client.delete_registered_model(lease_name(self.model, o)))
        _quietly(lambda: self.client.set_registered_model_tag(self.model, TAG_POINTER, str(generation)))
        return True

    def release(self) -> None:
        """Give the lease up (a listener that stops): the next contender takes it at once."""
        if self.generation is not None:
            name = lease_name(self.model, self.generation)
            _quietly(lambda: self.client.set_registered_model_tag(name, TAG_RELEASED, _stamp()))
        self.generation = self.renewed_at = None

    def wake(self, why: str) -> None:
        """Leave a wake-up on the lease for its holder (an event this listener got and cannot act on): the holder
        reads it when it renews and reconciles the model."""
        generation = self.observed.generation if self.observed else 0
        if generation:
            name = lease_name(self.model, generation)
            _quietly(lambda: self.client.set_registered_model_tag(name, TAG_WAKE, f"{_stamp()} {why}"[:500]))

    def _tags(self, generation: int) -> dict[str, str] | None:
        """The tags of generation ``generation`` (None: no registered model holds it)."""
        from mlflow.exceptions import MlflowException

        from consistency_gate.mlops.registry import is_not_found

        try:
            return dict(self.client.get_registered_model(lease_name(self.model, generation)).tags or {})
        except MlflowException as exc:
            if is_not_found(exc):
                return None
            raise


def fenced(client: MlflowClient) -> str | None:
    """Why a move of an alias made for a lease holder must not happen (None: it may, or it is no holder's): a later
    generation of the lease exists, so the holder that started the move has lost it. The holding comes from the
    context (:func:`acting_as`) or from the environment a listener starts a gate with (:data:`LEASE_ENV`)."""
    name = _FENCE.get() or os.environ.get(LEASE_ENV)
    if not name or LEASE_SUFFIX not in name:
        return None
    model, _, generation = name.rpartition(LEASE_SUFFIX)
    if not generation.isdigit():
        return None
    later = lease_name(model, int(generation) + 1)
    try:
        client.get_registered_model(later)
    except Exception as exc:  # noqa: BLE001 - not found: still the holder's; the registry away: the move fails anyway
        from consistency_gate.mlops.registry import is_not_found

        return None if is_not_found(exc) else f"the lease {name} could not be checked ({type(exc).__name__})"
    return f"the listener that started this lost its lease on '{model}' ({later} exists): another listener acts now"


@contextlib.contextmanager
def acting_as(held: str | None) -> Iterator[None]:
    """Within this block (this thread's context), the moves made are the holder's of the lease generation ``held``
    (:attr:`Lease.name`): :func:`fenced` checks it.

    >>> with acting_as("m.consistency-gate-lease.3"):
    ...     _FENCE.get()
    'm.consistency-gate-lease.3'
    """
    token = _FENCE.set(held)
    try:
        yield
    finally:
        _FENCE.reset(token)


def _stamp() -> str:
    return f"{time.time():.3f}"


def _quietly(call: Callable[[], object]) -> None:
    """A best-effort registry call: what it tidies is tidied by the next holder if it fails."""
    with contextlib.suppress(Exception):
        call()
