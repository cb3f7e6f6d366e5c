"""Scoring: load a registered model version (sklearn, PyTorch or pyfunc) as a class-probability
scorer, and predict an evaluation frame with it, telling the model's failures from the data's.

A model logged with a tensor signature gets its input in that shape
(:func:`consistency_gate.io.tensors.tensor_batch`). Scores that are logits are softmaxed:
the version tag ``consistency_gate.outputs`` says which a model gives (``logits``, the default
for PyTorch and for pyfunc arrays of any sign, or ``probabilities``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from consistency_gate.errors import DataError, GateError, ModelError, TrackingError, plain
from consistency_gate.io.tensors import TensorInput, array_column, tensor_batch
from consistency_gate.mlops.registry import CLASSES_TAG, OUTPUTS_TAG, ModelRef
from consistency_gate.mlops.store import looks_unreachable

if TYPE_CHECKING:
    from mlflow.models import ModelSignature

Scorer = Callable[[pd.DataFrame], pd.DataFrame]


@dataclass
class LoadedModel:
    """A model version that maps a feature frame to a frame of class probabilities."""

    ref: ModelRef
    flavor: str
    features: list[str] | None  # from the signature; None means "every non-label column"
    feature_types: dict[str, str]
    predict_scores: Scorer
    tensor: TensorInput | None = None  # the input a tensor signature declares


def load_model(ref: ModelRef, classes_hint: list[str] | None = None) -> LoadedModel:
    """Load a version with the flavor that yields class probabilities (sklearn, pytorch, pyfunc).

    Example::

        model = load_model(ModelRef("fraud-clf", "4"))
        model.flavor, model.features[:2]
        # ('sklearn', ['amount', 'country'])
    """
    import mlflow

    try:
        info = mlflow.models.get_model_info(ref.uri)
    except Exception as exc:  # noqa: BLE001 - MLflow raises many kinds here
        if looks_unreachable(exc):
            raise TrackingError(f"cannot reach the store to load {ref.uri}: {exc}") from None
        raise ModelError(f"{ref.uri}: cannot read the model's metadata ({exc})") from None
    flavors = info.flavors or {}
    features, types = _signature_features(info.signature)
    tensor = _signature_tensor(info.signature)
    try:
        if "sklearn" in flavors:
            scorer, flavor = _sklearn_scorer(ref), "sklearn"
        elif "pytorch" in flavors:
            scorer, flavor = _torch_scorer(ref, classes_hint, tensor), "pytorch"
        else:
            scorer, flavor = _pyfunc_scorer(ref, classes_hint, tensor), "pyfunc"
    except (ModelError, TrackingError):
        raise
    except Exception as exc:  # noqa: BLE001
        if looks_unreachable(exc):
            raise TrackingError(f"cannot reach the store to load {ref.uri}: {exc}") from None
        raise ModelError(f"{ref.uri}: cannot load the model ({type(exc).__name__}: {exc})") from None
    return LoadedModel(ref, flavor, features, types, scorer, tensor)


def _signature_features(signature: ModelSignature | None) -> tuple[list[str] | None, dict[str, str]]:
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


def _signature_tensor(signature: ModelSignature | None) -> TensorInput | None:
    """The input of a signature with one tensor (None for column signatures and several tensors)."""
    if signature is None or signature.inputs is None or not signature.inputs.is_tensor_spec():
        return None
    specs = signature.inputs.inputs
    if len(specs) != 1 or specs[0].shape is None:
        return None
    return TensorInput(tuple(int(d) for d in specs[0].shape), str(specs[0].type))


def _sklearn_scorer(ref: ModelRef) -> Scorer:
    import mlflow.sklearn

    model = mlflow.sklearn.load_model(ref.uri)
    if not hasattr(model, "predict_proba"):
        raise ModelError(f"{ref.uri}: the sklearn model has no predict_proba, so it gives no class scores")
    classes = [str(c) for c in model.classes_]

    def score(features: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame(np.asarray(model.predict_proba(features)), columns=classes, index=features.index)

    return score


def _torch_scorer(ref: ModelRef, classes_hint: list[str] | None, tensor: TensorInput | None) -> Scorer:
    import mlflow.pytorch
    import torch

    classes = _model_classes(ref, classes_hint, "a PyTorch model")
    logits = _outputs_logits(ref, default=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = mlflow.pytorch.load_model(ref.uri, map_location=device)
    with contextlib.suppress(NotImplementedError):  # exported (pt2) graphs have no train/eval modes
        model.eval()

    def score(features: pd.DataFrame) -> pd.DataFrame:
        x = torch.as_tensor(tensor_batch(features, tensor, features.attrs.get("source", "evaluation data")))
        outs = []
        with torch.no_grad():
            for start in range(0, len(x), 8192):
                out = model(x[start : start + 8192].to(device))
                outs.append((torch.softmax(out, dim=1) if logits else out).cpu().numpy())
        probs = np.concatenate(outs) if outs else np.zeros((0, len(classes)))
        return _class_frame(ref, probs, classes, features.index)

    return score


def _class_frame(ref: ModelRef, scores: np.ndarray, classes: list[str], index: pd.Index) -> pd.DataFrame:
    """An (n, classes) score array as a frame with one column per class."""
    if scores.ndim != 2 or scores.shape[1] != len(classes):
        raise ModelError(
            f"{ref.uri}: the model outputs scores of shape {scores.shape} but {len(classes)} classes are named "
            f"(tag {CLASSES_TAG} or the config's classes); expected (samples, {len(classes)})"
        )
    return pd.DataFrame(scores, columns=classes, index=index)


def _outputs_logits(ref: ModelRef, default: bool) -> bool:
    """Whether the version's scores are logits (to softmax), from its ``consistency_gate.outputs`` tag."""
    raw = ref.tags.get(OUTPUTS_TAG)
    if raw is None:
        return default
    if raw not in ("logits", "probabilities"):
        raise ModelError(f"{ref.uri}: tag {OUTPUTS_TAG} must be 'logits' or 'probabilities', got {raw!r}")
    return raw == "logits"


def _model_classes(ref: ModelRef, hint: list[str] | None, what: str) -> list[str]:
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
        f"{ref.uri}: {what} needs its class names: set the model version tag {CLASSES_TAG} "
        "to a JSON list, or 'classes:' in the gate config"
    )


def _pyfunc_scorer(ref: ModelRef, classes_hint: list[str] | None, tensor: TensorInput | None) -> Scorer:
    import mlflow.pyfunc
    from scipy.special import softmax

    model = mlflow.pyfunc.load_model(ref.uri)

    def score(features: pd.DataFrame) -> pd.DataFrame:
        where = features.attrs.get("source", "evaluation data")
        out = model.predict(features if tensor is None else tensor_batch(features, tensor, where))
        if isinstance(out, pd.DataFrame) and out.shape[1] >= 2:
            out = out.copy()
            out.columns = [str(c) for c in out.columns]
            out.index = features.index
            return out
        if isinstance(out, np.ndarray) and out.ndim == 2 and out.shape[1] >= 2:
            classes = _model_classes(ref, classes_hint, "a pyfunc model returning an array")
            logits = _outputs_logits(ref, default=bool((out < 0).any()))
            return _class_frame(ref, softmax(out, axis=1) if logits else out, classes, features.index)
        raise ModelError(
            f"{ref.uri}: the pyfunc model returned {type(out).__name__} {getattr(out, 'shape', '')}, so it gives no "
            "class scores (a DataFrame with one column per class, or a (samples, classes) array); log it as "
            "sklearn/pytorch or return class probabilities"
        )

    return score


def model_classes(model: LoadedModel, frame: pd.DataFrame, exclude: Sequence[str]) -> list[str]:
    """Class names of a model, from one predicted row (none if its feature columns are missing:
    the validation reports those); ``exclude`` as for :func:`feature_frame`.

    Example::

        model_classes(model, frame, non_features("label", "id"))
        # ['fraud', 'ok']
    """
    if model.features and not set(model.features) <= set(frame.columns):
        return []
    return list(predict(model, frame.head(1), exclude).columns)


def _refuse_non_finite(features: pd.DataFrame, model: LoadedModel) -> None:
    """DataError naming the first numeric feature column (or array column) holding NaN or an
    infinite value, and its first such row (1-based data row); nothing if every feature is finite."""
    arrays = array_column(features)
    for name in features.columns:
        column = features[name]
        if name == arrays:
            bad = np.array([not np.isfinite(np.asarray(v, dtype=np.float64)).all() for v in column])
            shown = "an array with NaN or infinite values"
        elif pd.api.types.is_numeric_dtype(column.dtype) and not pd.api.types.is_bool_dtype(column.dtype):
            bad = ~np.isfinite(column.to_numpy(dtype=np.float64, na_value=np.nan))
            shown = ""
        else:
            continue
        if bad.any():
            first = int(np.argmax(bad))
            raise DataError(
                f"{features.attrs.get('source', 'evaluation data')}: feature column '{name}', "
                f"row {int(features.index[first]) + 1} holds "
                f"{shown or plain(column.iloc[first])} and {model.ref.uri} cannot score it; fill or drop such rows "
                "(or gate a model that handles missing values)"
            )


def feature_frame(model: LoadedModel, frame: pd.DataFrame, exclude: Sequence[str]) -> pd.DataFrame:
    """The columns of ``frame`` the model reads: its signature's, else all but the ``exclude``d
    ones (the label, the id and the slicing columns: :func:`non_features`).

    Example::

        feature_frame(model, frame, non_features("label", "id", ["region"])).columns.tolist()
        # ['amount', 'country']
    """
    if model.features:
        return frame[model.features]
    rest = frame.drop(columns=[c for c in exclude if c in frame.columns])
    column = array_column(rest)
    return rest[[column]] if column is not None else rest


def non_features(label_column: str, id_column: str | None, slices: Sequence[str] = ()) -> tuple[str, ...]:
    """The columns of the evaluation data that are not features: label, id and slicing columns.

    >>> non_features("label", None, ["region"])
    ('label', 'region')
    """
    return tuple(c for c in (label_column, id_column, *slices) if c)


def predict(model: LoadedModel, frame: pd.DataFrame, exclude: Sequence[str]) -> pd.DataFrame:
    """The model's class scores for ``frame`` (``exclude`` as for :func:`feature_frame`). A model that
    fails, or returns NaN, infinite or negative scores, is the model's fault (ModelError), unless the
    features it read hold NaN or infinite values: then the data's (DataError, naming the first such
    column and row).

    Example::

        predict(model, frame, non_features("label", "id")).head(1)
        #    fraud    ok
        # 0   0.02  0.98
    """
    features = feature_frame(model, frame, exclude)
    try:
        scores = model.predict_scores(features)
    except GateError:
        raise
    except Exception as exc:  # noqa: BLE001 - any model failure is the model's, unless the data is not finite
        _refuse_non_finite(features, model)
        raise ModelError(f"{model.ref.uri}: prediction failed ({type(exc).__name__}: {exc})") from None
    values = scores.to_numpy(dtype=np.float64)
    if not np.isfinite(values).all() or (values < 0).any():
        _refuse_non_finite(features, model)
        raise ModelError(f"{model.ref.uri}: the model returned NaN, infinite or negative class scores")
    return scores
