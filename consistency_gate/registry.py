"""The MLflow side: tracking URI, reachability, model versions by number or alias, and
class-probability scorers for sklearn, PyTorch and pyfunc models.

Nothing here computes a metric; :mod:`consistency_gate.gate` calls it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pandas as pd

from consistency_gate.errors import DataError, ModelError, TrackingError

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


def check_reachable(uri: str, timeout: float = 3.0) -> None:
    """Raise TrackingError (exit 5) within ``timeout`` seconds if the store cannot be reached."""
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https"):
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            with socket.create_connection((parsed.hostname, port), timeout=timeout):
                pass
        except OSError as exc:
            raise TrackingError(
                f"tracking server {uri} is unreachable ({exc.strerror or exc}); start it or fix --tracking-uri"
            ) from None
    elif parsed.scheme == "sqlite":
        folder = Path(uri.removeprefix("sqlite:///")).expanduser().resolve().parent
        if not folder.is_dir():
            raise TrackingError(
                f"tracking store {uri}: folder {folder} does not exist; create it or fix --tracking-uri"
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


def _reraise(exc, message: str):
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
