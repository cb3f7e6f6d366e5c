"""The MLflow side: tracking URI, reachability, model versions by number or alias, and
class-probability scorers for sklearn, PyTorch and pyfunc models.

Nothing here computes a metric; :mod:`consistency_gate.gate` calls it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pandas as pd

from consistency_gate.errors import DataError, ModelError, TrackingError, UsageError, redact_credentials

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
CLASSES_TAG = "consistency_gate.classes"
TAG_VERDICT = "consistency_gate.verdict"
TAG_KIND = "consistency_gate.kind"
TAG_RUN_ID = "consistency_gate.run_id"


def resolve_tracking_uri(uri: str | None) -> str:
    """The tracking URI: the argument, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def configure_fail_fast() -> None:
    """Make MLflow's HTTP client give up in seconds, not minutes, when a server is down; no download bars."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


# the schemes MLflow 3 keeps runs and registered models under (databases as SQLAlchemy URLs)
DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
SERVER_SCHEMES = ("http", "https", "databricks", "databricks-uc", "uc")
# the pip package that provides a database driver module SQLAlchemy asks for
DRIVER_PACKAGES = {
    "psycopg": "psycopg[binary]",
    "psycopg2": "psycopg2-binary",
    "MySQLdb": "mysqlclient",
    "pymysql": "PyMySQL",
    "pyodbc": "pyodbc",
    "pymssql": "pymssql",
}
SQLITE_HEADER = b"SQLite format 3\x00"


def check_store_uri(uri: str) -> None:
    """Refuse, in one line, a tracking URI MLflow cannot keep a registry in.

    UsageError (exit 2) for a scheme MLflow does not support, or the file store MLflow 3 refuses;
    TrackingError (exit 5) for a SQLite URI on a file that is not a database, or a database whose
    driver is not installed (with the package to install).

    >>> check_store_uri("ftp://host/mlflow")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    consistency_gate.errors.UsageError: tracking URI 'ftp://host/mlflow': scheme 'ftp' is not one MLflow keeps...
    """
    parsed = urlparse(uri)
    scheme = parsed.scheme.split("+", 1)[0]
    shown = redact_credentials(uri)
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() in ("true", "1"):
            return
        raise UsageError(
            f"tracking URI '{shown}' names a folder (MLflow's file store), which MLflow 3 refuses; use "
            "sqlite:///PATH/mlflow.db or http(s)://HOST:PORT (or migrate it with `mlflow migrate-filestore`)"
        )
    if scheme not in DATABASE_SCHEMES + SERVER_SCHEMES:
        raise UsageError(
            f"tracking URI '{shown}': scheme '{parsed.scheme}' is not one MLflow keeps a model registry in; use "
            "sqlite:///PATH, http(s)://HOST:PORT, or a postgresql://, mysql:// or mssql:// database"
        )
    if scheme == "sqlite":
        path = Path(uri.removeprefix("sqlite:///")).expanduser()
        if path.is_file() and path.stat().st_size:
            with path.open("rb") as f:
                if f.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
                    raise TrackingError(
                        f"tracking store {shown}: {path} is not an SQLite database; point --tracking-uri at "
                        "an MLflow database (or a new file name, which MLflow creates)"
                    )
    elif scheme in DATABASE_SCHEMES:
        from sqlalchemy.engine import make_url

        try:
            make_url(uri).get_dialect().import_dbapi()
        except ModuleNotFoundError as exc:
            package = DRIVER_PACKAGES.get((exc.name or "").split(".")[0], exc.name)
            raise TrackingError(
                f"tracking store {shown}: its database driver '{exc.name}' is not installed; "
                f"`pip install {package}` (or name another driver, e.g. {scheme}+DRIVER://)"
            ) from None
        except Exception as exc:  # noqa: BLE001 - SQLAlchemy's word on a malformed or unknown URL
            raise UsageError(f"tracking URI '{shown}' is not a database URL SQLAlchemy knows: {exc}") from None


def check_reachable(uri: str, timeout: float = 3.0) -> None:
    """Raise within ``timeout`` seconds if the store cannot be used (:func:`check_store_uri`) or
    reached (TrackingError, exit 5).

    An HTTP(S) server is reached through the proxy the environment names for it
    (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``), as MLflow's client will reach it.
    """
    check_store_uri(uri)
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https"):
        import requests.utils

        proxy = requests.utils.get_environ_proxies(uri).get(parsed.scheme)
        target = urlparse(proxy) if proxy else parsed
        port = target.port or (443 if target.scheme == "https" else 80)
        via = f" through proxy {redact_credentials(proxy)}" if proxy else ""
        try:
            with socket.create_connection((target.hostname, port), timeout=timeout):
                pass
        except OSError as exc:
            raise TrackingError(
                f"tracking server {redact_credentials(uri)} is unreachable{via} ({exc.strerror or exc}); "
                "start it or fix --tracking-uri"
            ) from None
    elif parsed.scheme == "sqlite":
        folder = Path(uri.removeprefix("sqlite:///")).expanduser().resolve().parent
        if not folder.is_dir():
            raise TrackingError(
                f"tracking store {redact_credentials(uri)}: folder {folder} does not exist; "
                "create it or fix --tracking-uri"
            )


@dataclass
class ModelRef:
    """One registered model version."""

    name: str
    version: str
    alias: str | None = None
    run_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def uri(self) -> str:
        return f"models:/{self.name}/{self.version}"

    def to_dict(self) -> dict:
        return {"name": self.name, "version": self.version, "alias": self.alias, "uri": self.uri}


def resolve_version(client, name: str, spec: str | None) -> ModelRef:
    """A version from ``'3'``, ``'@alias'`` or None (the latest version). ModelError if absent."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException as exc:
        _reraise(exc, f"registered model '{name}' not found; check --model or register it first")
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
            if not spec.isdigit():
                raise ModelError(f"version '{spec}' of model '{name}': expected a number or @alias")
            mv = client.get_model_version(name, spec)
    except MlflowException as exc:
        what = f"alias '@{spec[1:]}' is not set" if spec and spec.startswith("@") else f"version '{spec}' not found"
        _reraise(exc, f"model '{name}': {what}; list versions with the MLflow UI or `mlflow models`")
    return ModelRef(name, str(mv.version), alias, mv.run_id, dict(mv.tags or {}))


def alias_exists(client, name: str, alias: str) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        client.get_model_version_by_alias(name, alias)
        return True
    except MlflowException as exc:
        if _is_not_found(exc):
            return False
        raise


def _is_not_found(exc) -> bool:
    return getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND")


def refusal(exc: BaseException, uri: str) -> TrackingError | None:
    """A TrackingError (exit 5) if ``exc`` is the server refusing the request (HTTP 401 or 403),
    with the server's reason and what to change; None for any other error."""
    code = getattr(exc, "error_code", "")
    status = getattr(exc, "get_http_status_code", lambda: None)()
    if code not in ("PERMISSION_DENIED", "UNAUTHENTICATED") and status not in (401, 403):
        return None
    text = str(exc)
    reason = text.split("Response body:", 1)[1].strip(" '\"") if "Response body:" in text else text
    if "host header" in reason.lower():
        host = urlparse(uri).netloc.rsplit("@", 1)[-1]
        advice = f"the server must allow this Host header: start it with --allowed-hosts including '{host}'"
    elif code == "UNAUTHENTICATED" or status == 401:
        advice = "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)"
    else:
        advice = "check that this user may read and write the experiment and the registered model"
    return TrackingError(
        f"tracking server {redact_credentials(uri)} refused the request ({status or code}: {reason[:200]}); {advice}"
    )


def check_access(client, uri: str) -> None:
    """One cheap request to an HTTP(S) tracking server, so that a server that refuses us (a Host
    header it does not allow, missing or wrong credentials) is exit 5 before anything else."""
    if urlparse(uri).scheme not in ("http", "https"):
        return
    try:
        client.search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - MLflow and requests raise many kinds here
        refused = refusal(exc, uri)
        if refused is not None:
            raise refused from None
        if looks_unreachable(exc):
            raise TrackingError(f"tracking server {redact_credentials(uri)} is unreachable: {exc}") from None
        raise


def _reraise(exc, message: str):
    refused = refusal(exc, mlflow_tracking_uri())
    if refused is not None:
        raise refused from None
    if _is_not_found(exc):
        raise ModelError(message) from None
    if looks_unreachable(exc):
        raise TrackingError(f"tracking server unreachable: {exc}") from None
    raise ModelError(f"{message} ({exc})") from None


def looks_unreachable(exc: BaseException) -> bool:
    """Whether an exception from MLflow or requests means the server or store is gone."""
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    text = f"{type(exc).__name__} {exc}".lower()
    return any(s in text for s in ("connection", "max retries", "timed out", "refused", "unreachable"))


def mlflow_tracking_uri() -> str:
    """The tracking URI MLflow's client uses now."""
    import mlflow

    return mlflow.get_tracking_uri()


Scorer = Callable[[pd.DataFrame], pd.DataFrame]


@dataclass
class LoadedModel:
    """A model version that maps a feature frame to a frame of class probabilities."""

    ref: ModelRef
    flavor: str
    features: list[str] | None  # from the signature; None means "every non-label column"
    feature_types: dict[str, str]
    predict_scores: Scorer


def load_model(ref: ModelRef, classes_hint: list[str] | None = None) -> LoadedModel:
    """Load a version with the flavor that yields class probabilities (sklearn, pytorch, pyfunc)."""
    import mlflow

    try:
        info = mlflow.models.get_model_info(ref.uri)
    except Exception as exc:  # noqa: BLE001 - MLflow raises many kinds here
        if looks_unreachable(exc):
            raise TrackingError(f"cannot reach the store to load {ref.uri}: {exc}") from None
        raise ModelError(f"{ref.uri}: cannot read the model's metadata ({exc})") from None
    flavors = info.flavors or {}
    features, types = _signature_features(info.signature)
    try:
        if "sklearn" in flavors:
            scorer, flavor = _sklearn_scorer(ref), "sklearn"
        elif "pytorch" in flavors:
            scorer, flavor = _torch_scorer(ref, classes_hint), "pytorch"
        else:
            scorer, flavor = _pyfunc_scorer(ref), "pyfunc"
    except (ModelError, TrackingError):
        raise
    except Exception as exc:  # noqa: BLE001
        if looks_unreachable(exc):
            raise TrackingError(f"cannot reach the store to load {ref.uri}: {exc}") from None
        raise ModelError(f"{ref.uri}: cannot load the model ({type(exc).__name__}: {exc})") from None
    return LoadedModel(ref, flavor, features, types, scorer)


def _signature_features(signature) -> tuple[list[str] | None, dict[str, str]]:
    if signature is None or signature.inputs is None:
        return None, {}
    try:
        names = signature.inputs.input_names()
        types = signature.inputs.input_types()
    except Exception:  # noqa: BLE001 - tensor-based signatures have no column names
        return None, {}
    if not names or any(isinstance(n, int) for n in names):
        return None, {}
    return [str(n) for n in names], {str(n): str(getattr(t, "name", t)) for n, t in zip(names, types, strict=True)}


def _sklearn_scorer(ref: ModelRef) -> Scorer:
    import mlflow.sklearn

    model = mlflow.sklearn.load_model(ref.uri)
    if not hasattr(model, "predict_proba"):
        raise ModelError(f"{ref.uri}: the sklearn model has no predict_proba, so it gives no class scores")
    classes = [str(c) for c in model.classes_]

    def score(features: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame(np.asarray(model.predict_proba(features)), columns=classes, index=features.index)

    return score


def _torch_scorer(ref: ModelRef, classes_hint: list[str] | None) -> Scorer:
    import mlflow.pytorch
    import torch

    classes = _torch_classes(ref, classes_hint)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = mlflow.pytorch.load_model(ref.uri, map_location=device)
    with contextlib.suppress(NotImplementedError):  # exported (pt2) graphs have no train/eval modes
        model.eval()

    def score(features: pd.DataFrame) -> pd.DataFrame:
        text = [c for c in features.columns if not pd.api.types.is_numeric_dtype(features[c])]
        if text:
            raise DataError(
                f"{ref.uri} takes numeric features but column '{text[0]}' is not numeric; if it identifies "
                "samples pass --id-column, or log the model with a signature naming its feature columns"
            )
        x = torch.as_tensor(features.to_numpy(dtype=np.float32), device=device)
        outs = []
        with torch.no_grad():
            for start in range(0, len(x), 8192):
                outs.append(torch.softmax(model(x[start : start + 8192]), dim=1).cpu().numpy())
        probs = np.concatenate(outs) if outs else np.zeros((0, len(classes)))
        if probs.shape[1] != len(classes):
            raise ModelError(
                f"{ref.uri}: the model outputs {probs.shape[1]} scores but {len(classes)} classes are named"
            )
        return pd.DataFrame(probs, columns=classes, index=features.index)

    return score


def _torch_classes(ref: ModelRef, hint: list[str] | None) -> list[str]:
    raw = ref.tags.get(CLASSES_TAG)
    if raw:
        try:
            classes = json.loads(raw)
        except json.JSONDecodeError:
            raise ModelError(f"{ref.uri}: tag {CLASSES_TAG} must be a JSON list of class labels, got {raw!r}") from None
        return [str(c) for c in classes]
    if hint:
        return hint
    raise ModelError(
        f"{ref.uri}: a PyTorch model needs its class names: set the model version tag {CLASSES_TAG} "
        "to a JSON list, or 'classes:' in the gate config"
    )


def _pyfunc_scorer(ref: ModelRef) -> Scorer:
    import mlflow.pyfunc

    model = mlflow.pyfunc.load_model(ref.uri)

    def score(features: pd.DataFrame) -> pd.DataFrame:
        out = model.predict(features)
        if not isinstance(out, pd.DataFrame) or out.shape[1] < 2:
            raise ModelError(
                f"{ref.uri}: the pyfunc model returned {type(out).__name__}, not a DataFrame with one column per "
                "class, so it gives no class scores; log it as sklearn/pytorch or return class probabilities"
            )
        out = out.copy()
        out.columns = [str(c) for c in out.columns]
        out.index = features.index
        return out

    return score


# ---------------------------------------------------------------- promotion

LOCK_SUFFIX = ".consistency-gate-lock"
TAG_LOCK_OWNER = "consistency_gate.lock_owner"
TAG_LOCK_EXPIRES = "consistency_gate.lock_expires"


@dataclass
class Promotion:
    """What a promotion did, as read back from the registry.

    ``promoted`` is True only when the alias was read back pointing to ``version``; ``holds`` is
    the version the alias points to now (None if unset, ``"unknown"`` if it could not be read).
    """

    alias: str
    version: str
    promoted: bool
    holds: str | None
    reason: str = ""

    @property
    def exit_code(self) -> int:
        """0 promoted; 4 refused (the baseline moved); 5 the registry could not be read back."""
        if self.promoted:
            return 0
        return 5 if self.holds == "unknown" else 4

    def to_dict(self) -> dict:
        return {
            "alias": self.alias,
            "version": self.version,
            "promoted": self.promoted,
            "holds": self.holds,
            "reason": self.reason,
        }


def read_alias(client, name: str, alias: str, attempts: int = 5, pause: float = 1.0) -> str | None:
    """The version ``@alias`` points to (None if unset), retried ``attempts`` times on any error
    but "not set"; raises the last error if every attempt fails."""
    from mlflow.exceptions import MlflowException

    for attempt in range(attempts):
        try:
            return str(client.get_model_version_by_alias(name, alias).version)
        except MlflowException as exc:
            if _is_not_found(exc):
                return None
            if attempt == attempts - 1:
                raise
        except Exception:  # noqa: BLE001 - a lost response or a server restarting: ask again
            if attempt == attempts - 1:
                raise
        time.sleep(pause * (attempt + 1))
    raise AssertionError("unreachable")  # pragma: no cover


@contextlib.contextmanager
def promotion_lock(client, name: str, owner: str, wait_s: float = 120.0, lease_s: float = 600.0):
    """Hold the model's promotion lock: a registered model ``NAME.consistency-gate-lock`` that only
    one gate can create (the store refuses a second with RESOURCE_ALREADY_EXISTS). A lock whose
    lease ran out (its holder died) is removed; a create whose response was lost is recognised by
    its owner tag. ModelError (exit 4) if another gate holds it for ``wait_s`` seconds."""
    from mlflow.exceptions import MlflowException

    lock = f"{name}{LOCK_SUFFIX}"
    deadline = time.monotonic() + wait_s
    while True:
        try:
            client.create_registered_model(
                lock,
                tags={TAG_LOCK_OWNER: owner, TAG_LOCK_EXPIRES: str(time.time() + lease_s)},
                description=f"consistency-gate: a gate is moving an alias of '{name}'; removed when it is done",
            )
            break
        except MlflowException as exc:
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
        if float(held.get(TAG_LOCK_EXPIRES, "0")) < time.time():
            with contextlib.suppress(MlflowException):
                client.delete_registered_model(lock)  # its holder died
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


def promote(client, name: str, alias: str, version: str, expected: str | None, owner: str) -> Promotion:
    """Move ``@alias`` to ``version``, only if it still points to ``expected`` (the version the gate
    compared against; None: it was unset), under the promotion lock, and read it back.

    Concurrent gates that compared against the same baseline: exactly one moves the alias; the
    others find it moved and report why. A lost response is resolved by reading the alias again.
    """
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
                f"@{alias} is {now}, not {was} as when this gate compared against it (another gate or a person "
                f"moved it): not moved; gate v{version} again against the new baseline",
            )
        error = None
        try:
            client.set_registered_model_alias(name, alias, version)
        except Exception as exc:  # noqa: BLE001 - the request may have gone through: read it back
            error = exc
        try:
            holds = read_alias(client, name, alias)
        except Exception as exc:  # noqa: BLE001
            return Promotion(
                alias,
                version,
                False,
                "unknown",
                f"could not read @{alias} back after moving it ({type(exc).__name__}: "
                f"{redact_credentials(str(exc))}); check the registry "
                "before deploying",
            )
    if holds == version:
        return Promotion(alias, version, True, holds)
    why = f" ({type(error).__name__}: {redact_credentials(str(error))})" if error else ""
    return Promotion(alias, version, False, holds, f"moving @{alias} to v{version} failed{why}; it holds v{holds}")
