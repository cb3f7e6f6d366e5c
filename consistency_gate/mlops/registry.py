"""The model registry: versions by number or alias, the gate's version tags, and promotion
(moving an alias under a lock, only from the baseline the gate compared against, read back).

Nothing here computes a metric or loads a model (:mod:`consistency_gate.mlops.scoring` does).
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, NoReturn

from consistency_gate.errors import ModelError, TrackingError, one_line, redact_credentials
from consistency_gate.mlops.store import looks_unreachable, mlflow_tracking_uri, refusal
from consistency_gate.mlops.tracking import TAG_HOST, TAG_PID, process_alive

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

CLASSES_TAG = "consistency_gate.classes"
OUTPUTS_TAG = "consistency_gate.outputs"  # "logits" or "probabilities": whether scores are softmaxed
TAG_VERDICT = "consistency_gate.verdict"
TAG_KIND = "consistency_gate.kind"
TAG_RUN_ID = "consistency_gate.run_id"
TAG_REPLACES = "consistency_gate.replaces"
DESCRIPTION_PREFIX = "consistency-gate: "  # how the gate's paragraph of a version's description starts


@dataclass
class ModelRef:
    """One registered model version."""

    name: str
    version: str
    alias: str | None = None
    run_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    model_id: str | None = None  # the MLflow 3 logged model behind the version (its page shows linked metrics)
    source: str | None = None  # a model that is not a registered version: its URI (``models:/m-...``)

    @property
    def uri(self) -> str:
        """``models:/NAME/VERSION`` (or the unregistered model's ``source`` URI)."""
        return self.source or f"models:/{self.name}/{self.version}"

    def to_dict(self) -> dict:
        """As in the JSON report."""
        return {"name": self.name, "version": self.version, "alias": self.alias, "uri": self.uri}


def resolve_version(client: MlflowClient, name: str, spec: str | None) -> ModelRef:
    """A version from ``'3'``, ``'@alias'`` or None (the latest version). ModelError if absent.

    Example::

        client = MlflowClient("sqlite:///mlflow.db")
        resolve_version(client, "fraud-clf", "@champion").version
        # '3'
    """
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException as exc:
        store = redact_credentials(mlflow_tracking_uri())
        _reraise(exc, f"registered model '{name}' not found in {store}; check --model and --tracking-uri")
    try:
        if spec is None:
            versions = client.search_model_versions(f"name='{name}'")
            if not versions:
                raise ModelError(f"model '{name}' has no versions; register one first")
            mv = max(versions, key=lambda v: int(v.version))
            alias = None
        elif spec.startswith("@"):
            alias = spec[1:]
            mv = client.get_model_version_by_alias(name, alias)
        else:
            alias = None
            if not _is_number(spec):
                raise ModelError(f"version '{spec}' of model '{name}': expected a number or @alias")
            if int(spec) > MAX_VERSION:  # a server answers 500 for a number its database cannot hold
                raise ModelError(f"model '{name}': version '{spec}' not found; {registered_versions(client, name)}")
            mv = client.get_model_version(name, spec)
    except MlflowException as exc:
        what = f"alias '@{spec[1:]}' is not set" if spec and spec.startswith("@") else f"version '{spec}' not found"
        _reraise(exc, f"model '{name}': {what}; {registered_versions(client, name)}")
    return ModelRef(name, str(mv.version), alias, mv.run_id, dict(mv.tags or {}), logged_model_id(mv))


def _is_number(text: str) -> bool:
    """Whether ``text`` is a version number or pid in ASCII digits (``'²'.isdigit()`` is True, and
    ``int('²')`` fails).

    >>> _is_number("12"), _is_number("²"), _is_number("")
    (True, False, False)
    """
    return text.isascii() and text.isdigit()


def version_numbers(client: MlflowClient, name: str) -> list[int]:
    """The registered model's version numbers, in order.

    Example::

        version_numbers(client, "fraud-clf")
        # [1, 2, 3]
    """
    return sorted(int(v.version) for v in _search_versions(client, name))


def possible_baselines(client: MlflowClient, name: str, before: int) -> list[int]:
    """The versions before ``before`` that may be in production, in order: all but those a gate
    failed (a failed first generation never became the baseline, so its successor is a first
    generation too).

    Example::

        possible_baselines(client, "fraud-clf", 3)  # v1 failed its gate
        # [2]
    """
    versions = _search_versions(client, name)
    return sorted(int(v.version) for v in versions if int(v.version) < before and v.tags.get(TAG_VERDICT) != "failed")


def _search_versions(client: MlflowClient, name: str) -> list:
    from mlflow.exceptions import MlflowException

    try:
        return list(client.search_model_versions(f"name='{name}'"))
    except MlflowException as exc:
        _reraise(exc, f"model '{name}': cannot list its versions")


def registered_versions(client: MlflowClient, name: str) -> str:
    """What a registered model holds, for an error message: its versions and aliases.

    Example::

        registered_versions(client, "fraud-clf")
        # 'it has versions 1, 2, 3 and the aliases @champion (v2)'
    """
    try:
        versions = version_numbers(client, name)
        aliases = client.get_registered_model(name).aliases or {}
    except Exception:  # noqa: BLE001 - only a hint: the error it joins is the one to report
        return "see its versions in the MLflow UI (Models)"
    shown = ", ".join(map(str, versions[-10:])) + (f" (and {len(versions) - 10} earlier)" if len(versions) > 10 else "")
    held = ", ".join(f"@{a} (v{v})" for a, v in sorted(aliases.items())) or "none"
    return f"it has versions {shown or 'none'} and the aliases {held}"


def ref_from_uri(client: MlflowClient, uri: str) -> ModelRef:
    """The model a ``models:/NAME/VERSION`` or ``models:/NAME@alias`` URI names, with its tags; any
    other URI (a logged model ``models:/m-...``, ``runs:/...``) as an unregistered model. ModelError
    if a registered name, version or alias is absent.

    Example::

        ref_from_uri(client, "models:/fraud-clf@champion").version
        # '3'
    """
    name, at, alias = uri.removeprefix("models:/").partition("@")
    if uri.startswith("models:/") and at and name:
        return resolve_version(client, name, "@" + alias)
    name, slash, version = uri.removeprefix("models:/").rpartition("/")
    if uri.startswith("models:/") and slash and name and _is_number(version):
        return resolve_version(client, name, version)
    return ModelRef(uri, "", source=uri)


def logged_model_ref(client: MlflowClient, model_id: str) -> ModelRef:
    """The registered version of an MLflow 3 logged model (with its version tags), or the logged
    model itself (with its own tags) when no version was registered from it.

    Example::

        logged_model_ref(client, "m-1f2e3d").uri
        # 'models:/fraud-clf/4'
    """
    logged = client.get_logged_model(model_id)
    if logged.source_run_id:
        for mv in client.search_model_versions(f"run_id = '{logged.source_run_id}'"):
            if logged_model_id(mv) == model_id:
                return ModelRef(mv.name, str(mv.version), None, mv.run_id, dict(mv.tags or {}), model_id)
    return ModelRef(
        logged.name, "", None, logged.source_run_id, dict(logged.tags or {}), model_id, f"models:/{model_id}"
    )


def logged_model_id(mv: ModelVersion) -> str | None:
    """The id of the MLflow 3 logged model a version was registered from (``m-...``), or None
    (a version registered from a run's artifact path has none).

    >>> from mlflow.entities.model_registry import ModelVersion
    >>> logged_model_id(ModelVersion("clf", "3", 0, source="models:/m-1f2e3d"))
    'm-1f2e3d'
    """
    if getattr(mv, "model_id", None):
        return mv.model_id
    source = mv.source or ""
    return source.removeprefix("models:/") if source.startswith("models:/m-") else None


def register_version(model_uri: str, name: str) -> str:
    """Register a logged model as a new version of ``name`` (created if new); returns the version.
    MLflow's own lines ("Successfully registered model ...") are not printed: the caller says
    what happened.

    Example::

        register_version(model_info.model_uri, "digits-cnn")
        # '3'
    """
    import mlflow
    from mlflow.utils.logging_utils import MLFLOW_LOGGING_STREAM

    was = MLFLOW_LOGGING_STREAM.enabled
    MLFLOW_LOGGING_STREAM.enabled = False
    try:
        return str(mlflow.register_model(model_uri, name).version)
    finally:
        MLFLOW_LOGGING_STREAM.enabled = was


def tag_version(
    client: MlflowClient, ref: ModelRef, verdict: str, kind: str, run_id: str, replaces: str | None = None
) -> None:
    """Tag a gated version with its verdict, its kind (single; ensemble or distilled where remediation
    built it) and the gate run; a version registered in place of a failed candidate also names the
    version it replaces.

    Example::

        tag_version(client, ModelRef("fraud-clf", "4"), "passed", "single", run_id)
    """
    tags = {TAG_VERDICT: verdict, TAG_KIND: kind, TAG_RUN_ID: run_id}
    if replaces is not None:
        tags[TAG_REPLACES] = replaces
    for key, value in tags.items():
        client.set_model_version_tag(ref.name, ref.version, key, value)


def describe_version(client: MlflowClient, ref: ModelRef, text: str) -> None:
    """Lead the version's description with ``text``, one paragraph starting with
    ``DESCRIPTION_PREFIX``: an earlier gate's paragraph is replaced, what anyone else wrote stays below.

    Example::

        describe_version(client, ModelRef("fraud-clf", "4"), "consistency-gate: PASSED against v3 ...")
    """
    own = client.get_model_version(ref.name, ref.version).description or ""
    if own.startswith(DESCRIPTION_PREFIX):
        own = own.partition("\n\n")[2]
    client.update_model_version(ref.name, ref.version, description=f"{text}\n\n{own}".strip())


def alias_exists(client: MlflowClient, name: str, alias: str) -> bool:
    """Whether ``name@alias`` is set (ModelError if the model does not exist).

    Example::

        alias_exists(client, "fraud-clf", "champion")
        # True
    """
    from mlflow.exceptions import MlflowException

    try:
        client.get_model_version_by_alias(name, alias)
        return True
    except MlflowException as exc:
        if _is_not_found(exc):
            return False
        _reraise(exc, f"model '{name}': cannot read its alias @{alias}")


def _is_not_found(exc: Exception) -> bool:
    return getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND")


def _reraise(exc: Exception, message: str) -> NoReturn:
    refused = refusal(exc, mlflow_tracking_uri())
    if refused is not None:
        raise refused from None
    if _is_not_found(exc):
        raise ModelError(message) from None
    if looks_unreachable(exc):
        raise TrackingError(f"tracking server unreachable: {exc}") from None
    raise ModelError(f"{message} ({exc})") from None


# ---------------------------------------------------------------- promotion

LOCK_SUFFIX = ".consistency-gate-lock"
TAG_LOCK_OWNER = "consistency_gate.lock_owner"
TAG_LOCK_EXPIRES = "consistency_gate.lock_expires"
MAX_VERSION = 2**31 - 1  # the registry stores version numbers as 32-bit integers
TAG_LOCK_TAKEOVER = "consistency_gate.lock_takeover"  # a waiter's claim on a dead holder's lock
# how long the gate reads an alias back after asking to move it (a server restarting, a lost answer)
READ_BACK_S = float(os.environ.get("CONSISTENCY_GATE_READ_BACK_S", "30"))


@dataclass
class Promotion:
    """What a promotion did, as read back from the registry.

    ``promoted`` is True only when the alias was read back pointing to ``version``, None (unknown)
    when the move was asked for and the alias could not be read back; ``holds`` is the version the
    alias points to now (None if unset, ``"unknown"`` if it could not be read); ``refused`` is True
    when the gate did not move it because the baseline had moved.
    """

    alias: str
    version: str
    promoted: bool | None
    holds: str | None
    reason: str = ""
    refused: bool = False

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
            if _is_not_found(exc):
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
            if _is_not_found(exc):
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
    if held.get(TAG_HOST) == socket.gethostname() and _is_number(pid) and not process_alive(int(pid)):
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


def promote(client: MlflowClient, name: str, alias: str, version: str, expected: str | None, owner: str) -> Promotion:
    """Move ``@alias`` to ``version``, only if it still points to ``expected`` (the version the gate
    compared against; None: it was unset), under the promotion lock, and read it back.

    Concurrent gates that compared against the same baseline: exactly one moves the alias; the
    others find it moved and report why. A lost response is resolved by reading the alias again for
    ``READ_BACK_S`` seconds; past that the outcome is unknown (``promoted`` None), never false. A
    registry that fails before the move was asked for moved nothing, and says so.

    Example::

        promotion = promote(client, "fraud-clf", "champion", "4", expected="3", owner=run_id)
        promotion.promoted, promotion.holds
        # (True, '4')
    """
    try:
        with promotion_lock(client, name, owner):
            current = read_alias(client, name, alias)
            if current != expected:
                was = f"v{expected}" if expected else "unset"
                now = f"v{current}" if current else "unset"
                return Promotion(
                    alias,
                    version,
                    False,
                    current,
                    f"@{alias} is {now}, not {was} as when this gate compared against it (another gate or a "
                    f"person moved it): not moved; gate v{version} again against the new baseline",
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
            f"the registry failed before @{alias} was moved ({_failure(exc)}): nothing was moved; "
            "gate again when it answers",
        )


def _move_alias(client: MlflowClient, name: str, alias: str, version: str) -> Promotion:
    """Ask the registry to move ``@alias`` to ``version`` and read it back; a failed request may
    have gone through, so only the read-back decides."""
    error = None
    try:
        client.set_registered_model_alias(name, alias, version)
    except Exception as exc:  # noqa: BLE001 - the request may have gone through: read it back
        error = exc
    try:
        holds = read_alias(client, name, alias, READ_BACK_S)
    except Exception as exc:  # noqa: BLE001
        return Promotion(
            alias,
            version,
            None,
            "unknown",
            f"asked the registry to move @{alias} to v{version}, then could not read it back for "
            f"{READ_BACK_S:.0f} s ({_failure(exc)}): whether it moved is unknown; read @{alias} in the "
            "registry before deploying",
        )
    if holds == version:
        return Promotion(alias, version, True, holds)
    why = f" ({_failure(error)})" if error else ""
    return Promotion(alias, version, False, holds, f"moving @{alias} to v{version} failed{why}; it holds v{holds}")


def _failure(exc: BaseException) -> str:
    """An exception as ``Type: message`` on one line, credentials redacted."""
    return f"{type(exc).__name__}: {one_line(redact_credentials(str(exc)))[:300]}"
