"""Scoring: load a registered model version (LightGBM, XGBoost, CatBoost, sklearn, PyTorch or pyfunc)
as a class-probability scorer, and predict an evaluation frame with it, telling the model's failures
from the data's.

The flavors and what their outputs mean are in :mod:`consistency_gate.mlops.flavors`. Before a model
predicts, each column it reads is cast to its signature's type (:mod:`consistency_gate.io.casts`).
A model logged with a tensor signature gets its input in that shape
(:func:`consistency_gate.io.tensors.tensor_batch`). Scores that are logits are softmaxed:
the version tag ``consistency_gate.outputs`` says which a model gives (``logits``, the default
for PyTorch and for pyfunc arrays of any sign, or ``probabilities``). A model that answers with
class labels only predicts a :class:`pandas.Series` of labels (:func:`label_only`).
"""

from __future__ import annotations

import re
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from consistency_gate.errors import DataError, GateError, ModelError, TrackingError, plain
from consistency_gate.io.casts import cast_to_signature
from consistency_gate.io.tensors import TensorInput, array_column
from consistency_gate.mlops.flavors import FLAVORS, Output, Scorer, flavor_of
from consistency_gate.mlops.registry import CLASSES_TAG, OUTPUTS_TAG, ModelRef
from consistency_gate.mlops.store import looks_unreachable

if TYPE_CHECKING:
    from mlflow.models import ModelSignature


@dataclass
class LoadedModel:
    """A model version that maps a feature frame to a frame of class probabilities (or, for a
    label-only model, a series of class labels)."""

    ref: ModelRef
    flavor: str
    features: list[str] | None  # from the signature; None means "every non-label column"
    feature_types: dict[str, str]
    predict_scores: Scorer
    tensor: TensorInput | None = None  # the input a tensor signature declares
    categorical: tuple[str, ...] = ()  # the columns it takes as pandas categories (gradient-boosted trees)


_KEPT: OrderedDict[tuple, LoadedModel] = OrderedDict()  # the versions a long-lived process keeps loaded
_KEEP = [0]  # how many (keep_loaded)


def keep_loaded(count: int) -> None:
    """Keep up to ``count`` registered versions loaded in this process, the most recently used (a process that
    gates again and again, the listener's worker: the champion a gate compares against is the next gate's
    baseline too). A version's artifacts never change once registered; the tags that say what its outputs mean
    are part of what is kept. 0 (the default): load each time."""
    _KEEP[0] = count
    while len(_KEPT) > count:
        _KEPT.popitem(last=False)


def load_model(ref: ModelRef, classes_hint: list[str] | None = None) -> LoadedModel:
    """Load a version as a scorer, with the first flavor it was logged with of the table
    :data:`~consistency_gate.mlops.flavors.FLAVORS` (lightgbm, xgboost, catboost, sklearn, pytorch,
    python_function); a version kept loaded (:func:`keep_loaded`) is not loaded again.

    Example::

        model = load_model(ModelRef("fraud-clf", "4"))
        model.flavor, model.features[:2]
        # ('lightgbm', ['amount', 'country'])
    """
    import mlflow

    meaning = tuple(sorted((k, v) for k, v in ref.tags.items() if k in (CLASSES_TAG, OUTPUTS_TAG)))
    key = (mlflow.get_registry_uri(), ref.name, ref.version, ref.model_id, meaning, tuple(classes_hint or ()))
    if ref.source is None and key in _KEPT:
        _KEPT.move_to_end(key)
        return _KEPT[key]
    loaded = _load(ref, classes_hint)
    if ref.source is None and _KEEP[0]:
        _KEPT[key] = loaded
        keep_loaded(_KEEP[0])
    return loaded


def _load(ref: ModelRef, classes_hint: list[str] | None) -> LoadedModel:
    """The version's artifacts downloaded once (its MLmodel, then its flavor loaded from the same folder: one
    download where reading the metadata and loading were two), and its scorer."""
    import mlflow

    try:
        local = mlflow.artifacts.download_artifacts(ref.uri)
        info = mlflow.models.Model.load(local)
    except Exception as exc:  # noqa: BLE001 - MLflow raises many kinds here
        if looks_unreachable(exc):
            raise TrackingError(f"cannot reach the store to load {ref.uri}: {exc}") from None
        raise ModelError(f"{ref.uri}: cannot read the model's metadata ({exc})") from None
    ref = replace(ref, local=local)
    flavors = info.flavors or {}
    features, types = _signature_features(info.signature)
    tensor = _signature_tensor(info.signature)
    flavor = flavor_of(flavors)
    try:
        scorer, categorical = FLAVORS[flavor].scorer(ref, classes_hint, tensor)
    except (ModelError, TrackingError):
        raise
    except Exception as exc:  # noqa: BLE001
        if looks_unreachable(exc):
            raise TrackingError(f"cannot reach the store to load {ref.uri}: {exc}") from None
        raise ModelError(f"{ref.uri}: cannot load the model ({type(exc).__name__}: {exc})") from None
    return LoadedModel(ref, flavor, features, types, scorer, tensor, categorical)


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


def label_only(scores: Output) -> str | None:
    """Why a model's prediction holds class labels only (None: it holds class scores).

    >>> label_only(pd.DataFrame({"a": [0.4], "b": [0.6]})) is None
    True
    """
    return (
        scores.attrs.get("label_only", "it answers with class labels only") if isinstance(scores, pd.Series) else None
    )


def model_classes(model: LoadedModel, frame: pd.DataFrame, exclude: Sequence[str]) -> list[str] | None:
    """Class names of a model, from one predicted row: none if its feature columns are missing (the
    validation reports those), None for a label-only model (its class set is not known);
    ``exclude`` as for :func:`feature_frame`.

    Example::

        model_classes(model, frame, non_features("label", "id"))
        # ['fraud', 'ok']
    """
    if model.features and not set(model.features) <= set(frame.columns):
        return []
    first = predict(model, frame.head(1), exclude)
    return None if label_only(first) else list(first.columns)


_SCHEMA_COLUMN = re.compile(r"(?:for column|column) '?([^'.\s]+)'?\.?\s*(.*)", re.DOTALL)
_MISSING = ("nan", "missing value", "null", "none", "infinit")


def _failure_cause(features: pd.DataFrame, model: LoadedModel, exc: Exception) -> GateError:
    """What made a prediction fail, in words: the column (its type and the type the model takes) MLflow's
    schema check or the model names, a missing value when the model says it takes none (its first
    column and row), else the model's own message (a ModelError)."""
    where = features.attrs.get("source", "evaluation data")
    text = " ".join(str(exc).split())
    named = _SCHEMA_COLUMN.search(text) if "schema" in text.lower() or "column" in text.lower() else None
    if named and named.group(1) in features.columns:
        column = named.group(1)
        wants = model.feature_types.get(column)
        return DataError(
            f"{where}: feature column '{column}' ({features[column].dtype}) cannot be given to {model.ref.uri}"
            f"{f', whose signature takes {wants}' if wants else ''}: {named.group(2)[:200] or text[:200]}; "
            "store the column with that type, or log the model with a signature of the type you store"
        )
    if any(word in text.lower() for word in _MISSING):
        hole = _first_missing(features)
        if hole is not None:
            column, first = hole
            return DataError(
                f"{where}: feature column '{column}', row {_data_row(features.index[first])} holds "
                f"{plain(features[column].iloc[first])} and {model.ref.uri} does not take missing or infinite "
                f"values ({type(exc).__name__}: {text[:160]}); fill or drop such rows, or gate a model that "
                "handles missing values"
            )
    return ModelError(f"{model.ref.uri}: prediction failed ({type(exc).__name__}: {text[:400]})")


def _first_missing(features: pd.DataFrame) -> tuple[str, int] | None:
    """The first feature column holding an empty or non-finite value and the position of its first such
    row; None when every value is there."""
    arrays = array_column(features)
    for name in features.columns:
        column = features[name]
        if name == arrays:
            bad = np.array([not np.isfinite(np.asarray(v, dtype=np.float64)).all() for v in column])
        elif pd.api.types.is_numeric_dtype(column.dtype) and not pd.api.types.is_bool_dtype(column.dtype):
            bad = ~np.isfinite(column.to_numpy(dtype=np.float64, na_value=np.nan))
        else:
            bad = column.isna().to_numpy()
        if bad.any():
            first = int(np.argmax(bad))
            return str(name), first
    return None


def _data_row(label: object) -> int:
    """The 1-based data row of an index label (the frames' index is the file's row number from 0)."""
    return int(label) + 1 if isinstance(label, int | np.integer) else 0


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


def predict(model: LoadedModel, frame: pd.DataFrame, exclude: Sequence[str]) -> Output:
    """The model's class scores for ``frame`` (``exclude`` as for :func:`feature_frame`), or its class
    labels for a label-only model (a series: :func:`label_only`). Each feature column is first cast to
    the type the model's signature gives it (:func:`~consistency_gate.io.casts.cast_to_signature`);
    NaN is passed on: the model says whether it takes it. A model that fails is the model's fault
    (ModelError), unless its failure names a column or a missing value of the data: then the data's
    (DataError, naming the column, its type, and the first empty row). NaN, infinite or negative
    scores are the model's fault.

    Example::

        predict(model, frame, non_features("label", "id")).head(1)
        #    fraud    ok
        # 0   0.02  0.98
    """
    features = feature_frame(model, frame, exclude)
    if model.features:
        features = cast_to_signature(features, model.feature_types, model.categorical)
    try:
        # a model's numeric warnings (scikit-learn's overflow in exp for a feature of -1e308: eight lines
        # before the gate's own) are not printed: what they warn of, a NaN or infinite score, is refused below
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            scores = model.predict_scores(features)
    except GateError:
        raise
    except Exception as exc:  # noqa: BLE001 - any model failure is the model's, unless it names the data
        raise _failure_cause(features, model, exc) from None
    if label_only(scores):
        return scores
    values = scores.to_numpy(dtype=np.float64)
    if not np.isfinite(values).all() or (values < 0).any():
        bad = np.flatnonzero(~np.isfinite(values).all(axis=1) | (values < 0).any(axis=1))[0]
        raise ModelError(
            f"{model.ref.uri}: the model returned NaN, infinite or negative class scores (first at data row "
            f"{_data_row(scores.index[bad])}: {plain(values[bad].tolist())[:120]})"
        )
    return scores
