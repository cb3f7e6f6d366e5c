"""Class scores from every flavor a classifier is logged with, and what a model's output means.

A registered version is loaded with the flavor that gives class probabilities:

- ``lightgbm``: an ``LGBMClassifier`` (``predict_proba``, ``classes_``) or a ``Booster`` with a
  ``binary`` or ``multiclass`` objective (its probabilities);
- ``xgboost``: an ``XGBClassifier`` (``predict_proba``, ``classes_``) or a ``Booster``:
  ``binary:logistic`` and ``multi:softprob`` give probabilities, ``binary:logitraw`` a logit (its
  sigmoid is taken), ``multi:softmax`` and ``binary:hinge`` class indices (a label-only model);
- ``catboost`` and ``sklearn``: any estimator with ``predict_proba``; one without it gives labels.

Class order: an estimator's ``classes_``, renamed by the version tag ``consistency_gate.classes``
when it is set (an ``XGBClassifier`` fitted on encoded labels knows only 0, 1, ...); a Booster's
from that tag or the gate config's ``classes:``. A 1-D score output is P(positive) of a binary
model whose classes are (negative, positive) in that order: the second class is the positive one,
as in scikit-learn.

A model that answers with class labels only (no scores) gives a :class:`pandas.Series` of labels
as text, whose ``attrs["label_only"]`` says why; scores are a frame with one column per class.

Every flavor is one entry of :data:`FLAVORS`, keyed by MLflow's flavor name: how a version logged with
it becomes a scorer in-process, and how its pyfunc's output is read on Spark. A version is loaded with
the first entry among its flavors (``python_function``, which every pyfunc has, last). Adding a flavor
is one entry.

>>> list(FLAVORS)
['lightgbm', 'xgboost', 'catboost', 'sklearn', 'pytorch', 'python_function']
>>> flavor_of(["python_function", "sklearn"])
'sklearn'
"""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from consistency_gate.errors import ModelError
from consistency_gate.io.tensors import TensorInput, tensor_batch
from consistency_gate.io.text import as_text
from consistency_gate.mlops.registry import CLASSES_TAG, OUTPUTS_TAG, ModelRef

if TYPE_CHECKING:
    from torch import nn

Output = pd.DataFrame | pd.Series
# what torch says when a model's weights and its input are on different devices
MISPLACED = ("same device", "should be the same")
Scorer = Callable[[pd.DataFrame], Output]


def class_scores(ref: ModelRef, scores: np.ndarray, classes: Sequence[str], index: pd.Index) -> pd.DataFrame:
    """A model's scores as a frame with one column per class: ``scores`` (n, classes) as they are, or a
    1-D P(positive) of a binary model (n,) or (n, 1) as the columns (1 - p, p) of (negative, positive).

    >>> class_scores(ModelRef("m", "1"), np.array([0.8, 0.3]), ["bad", "good"], pd.RangeIndex(2))
       bad  good
    0  0.2   0.8
    1  0.7   0.3
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim == 2 and scores.shape[1] == 1:
        scores = scores[:, 0]
    if scores.ndim == 1:
        if len(classes) != 2:
            raise ModelError(
                f"{ref.uri}: the model outputs one score per sample (P(positive) of a binary model) but "
                f"{len(classes)} classes are named ({', '.join(map(str, classes[:5]))}); a binary model names "
                f"two, negative first (its classes_, or the tag {CLASSES_TAG})"
            )
        scores = np.column_stack([1.0 - scores, scores])
    if scores.ndim != 2 or scores.shape[1] != len(classes):
        raise ModelError(
            f"{ref.uri}: the model outputs scores of shape {scores.shape} but {len(classes)} classes are named "
            f"(its classes_, the tag {CLASSES_TAG} or the config's classes); expected (samples, {len(classes)})"
        )
    return pd.DataFrame(scores, columns=list(classes), index=index)


def label_series(labels: object, index: pd.Index, why: str) -> pd.Series:
    """Class labels a model answered with, as text (a whole number written without ``.0``), with the
    reason the model gives labels only in ``attrs["label_only"]``.

    >>> s = label_series(np.array([1.0, 0.0]), pd.RangeIndex(2), "it returns labels")
    >>> s.tolist(), s.attrs["label_only"]
    (['1', '0'], 'it returns labels')
    """
    values = np.asarray(labels, dtype=object).reshape(-1)
    if len(values) != len(index):
        raise ModelError(f"the model answered {len(values)} labels for {len(index)} samples")
    text = as_text(pd.Series(values, dtype=object)).map(str).to_numpy()  # as label files are read
    series = pd.Series(text, index=index, dtype=object)
    series.attrs["label_only"] = why
    return series


def tagged_classes(ref: ModelRef) -> list[str] | None:
    """The class names of the version tag ``consistency_gate.classes``, in output order (None: no tag)."""
    raw = ref.tags.get(CLASSES_TAG)
    if not raw:
        return None
    try:
        classes = json.loads(raw)
    except json.JSONDecodeError:
        classes = None
    if not isinstance(classes, list) or not classes:
        raise ModelError(f"{ref.uri}: tag {CLASSES_TAG} must be a JSON list of class labels, got {raw!r}")
    return [str(c) for c in classes]


def named_classes(ref: ModelRef, hint: list[str] | None, what: str) -> list[str]:
    """A model's class names from its tag, else the config's ``classes:`` (``hint``); ModelError without."""
    classes = tagged_classes(ref) or hint
    if classes:
        return classes
    raise ModelError(
        f"{ref.uri}: {what} needs its class names: set the model version tag {CLASSES_TAG} "
        "to a JSON list (in output order), or 'classes:' in the gate config"
    )


def _native(flavor: str) -> Callable[[ModelRef, list[str] | None, TensorInput | None], tuple[Scorer, tuple]]:
    """The loader of a classifier flavor whose model object is an estimator or a Booster
    (:func:`estimator_scorer`): its scorer and the columns it takes as categories."""

    def load(ref: ModelRef, hint: list[str] | None, tensor: TensorInput | None) -> tuple[Scorer, tuple]:
        model = importlib.import_module(f"mlflow.{flavor}").load_model(ref.artifacts)
        return estimator_scorer(ref, model, hint), categorical_columns(model)

    return load


def estimator_scorer(ref: ModelRef, model: object, hint: list[str] | None) -> Scorer:
    """The scorer of a loaded classifier object: an estimator with ``predict_proba`` (scores), a LightGBM
    or XGBoost Booster (see the module docstring), or an estimator with ``predict`` only (labels)."""
    kind = f"{type(model).__module__}.{type(model).__name__}"
    if kind.startswith("lightgbm.") and type(model).__name__ == "Booster":
        return _lightgbm_booster(ref, model, hint)
    if kind.startswith("xgboost.") and type(model).__name__ == "Booster":
        return _xgboost_booster(ref, model, hint)
    if hasattr(model, "predict_proba"):
        classes = _estimator_classes(ref, model)

        def score(features: pd.DataFrame) -> pd.DataFrame:
            return class_scores(ref, model.predict_proba(features), classes, features.index)

        return score
    if not hasattr(model, "predict"):
        raise ModelError(f"{ref.uri}: the {type(model).__name__} model has neither predict_proba nor predict")
    why = f"the {type(model).__name__} model has no predict_proba, so it answers with class labels only"

    def labels(features: pd.DataFrame) -> pd.Series:
        return label_series(model.predict(features), features.index, why)

    return labels


def _estimator_classes(ref: ModelRef, model: object) -> list[str]:
    """An estimator's classes in its output order: ``classes_``, renamed by the classes tag if set."""
    own = [str(c) for c in getattr(model, "classes_", [])]
    tagged = tagged_classes(ref)
    if tagged is None:
        if not own:
            raise ModelError(f"{ref.uri}: the {type(model).__name__} model has no classes_; set the tag {CLASSES_TAG}")
        return own
    if own and len(own) != len(tagged):
        raise ModelError(
            f"{ref.uri}: tag {CLASSES_TAG} names {len(tagged)} classes but the model's classes_ has {len(own)} "
            f"({', '.join(own[:5])}); name each of its outputs, in the order of classes_"
        )
    return tagged


def _lightgbm_booster(ref: ModelRef, booster: object, hint: list[str] | None) -> Scorer:
    objective = str(booster.dump_model(num_iteration=1).get("objective", ""))
    if not objective.startswith(("binary", "multiclass", "cross_entropy")):
        raise ModelError(
            f"{ref.uri}: the LightGBM Booster's objective is '{objective}', not a classifier's (binary, multiclass)"
        )
    classes = named_classes(ref, hint, "a LightGBM Booster")

    def score(features: pd.DataFrame) -> pd.DataFrame:
        return class_scores(ref, booster.predict(features), classes, features.index)

    return score


def _xgboost_booster(ref: ModelRef, booster: object, hint: list[str] | None) -> Scorer:
    import xgboost

    objective = json.loads(booster.save_config())["learner"]["objective"]["name"]
    if objective not in ("binary:logistic", "binary:logitraw", "multi:softprob", "multi:softmax", "binary:hinge"):
        raise ModelError(f"{ref.uri}: the XGBoost Booster's objective is '{objective}', not a classifier's")
    classes = named_classes(ref, hint, "an XGBoost Booster")
    why = f"the XGBoost Booster's objective {objective} answers with class indices only"

    def score(features: pd.DataFrame) -> Output:
        out = booster.predict(xgboost.DMatrix(features, enable_categorical=True))
        if objective in ("multi:softmax", "binary:hinge"):
            return label_series(np.asarray(classes, dtype=object)[np.asarray(out, dtype=np.int64)], features.index, why)
        if objective == "binary:logitraw":
            out = 1.0 / (1.0 + np.exp(-np.asarray(out, dtype=np.float64)))
        return class_scores(ref, out, classes, features.index)

    return score


def categorical_columns(model: object) -> tuple[str, ...]:
    """The columns a LightGBM or XGBoost model (estimator or Booster) was fitted on as pandas categories,
    which it takes as categories again; none for other models."""
    booster = getattr(model, "booster_", None) or (model.get_booster() if hasattr(model, "get_booster") else model)
    module = type(booster).__module__
    if module.startswith("lightgbm.") and getattr(booster, "pandas_categorical", None):
        infos = booster.dump_model(num_iteration=1)["feature_infos"]  # a category's codes are its values
        return tuple(name for name, info in infos.items() if info.get("values"))
    if module.startswith("xgboost.") and getattr(booster, "feature_types", None) and booster.feature_names:
        return tuple(n for n, t in zip(booster.feature_names, booster.feature_types, strict=True) if t == "c")
    return ()


def pyfunc_output(ref: ModelRef, out: object, hint: list[str] | None, index: pd.Index, logits: bool | None) -> Output:
    """What a pyfunc model's ``predict`` returned, read as class scores or class labels.

    Scores: a frame whose columns are all numeric (one per class), or an (n, classes) array (classes
    from the tag or ``hint``; softmaxed when they are logits: ``logits`` from the outputs tag, None for
    "when any is negative"). A 1-D float output in [0, 1] that is not all whole numbers is P(positive)
    of a binary model. Labels: text, whole numbers, a frame with a text ``label`` column (a
    ``transformers`` text-classification pipeline's ``label, score``), or a list of ``{label, score}``.
    """
    if isinstance(out, list) and out and isinstance(out[0], dict) and "label" in out[0]:
        return label_series([row["label"] for row in out], index, "it answers with {label, score}: one class each")
    if isinstance(out, pd.DataFrame):
        numeric = [pd.api.types.is_numeric_dtype(t) and not pd.api.types.is_bool_dtype(t) for t in out.dtypes]
        if out.shape[1] >= 2 and all(numeric):
            scores = out.set_axis([str(c) for c in out.columns], axis=1)
            return scores.set_axis(index, axis=0)
        if "label" in out.columns:
            return label_series(out["label"].to_numpy(), index, "it answers with a label column: one class each")
        if out.shape[1] != 1:
            raise ModelError(f"{ref.uri}: the pyfunc model returned a frame with columns {list(out.columns)[:5]}")
        out = out.iloc[:, 0].to_numpy()
    values = np.asarray(out.to_numpy() if isinstance(out, pd.Series) else out)
    if values.ndim == 2 and values.shape[1] >= 2 and values.dtype.kind in "fiu":
        from scipy.special import softmax

        classes = named_classes(ref, hint, "a pyfunc model returning an array")
        as_logits = bool((values < 0).any()) if logits is None else logits
        return class_scores(ref, softmax(values, axis=1) if as_logits else values, classes, index)
    values = values.reshape(-1) if values.ndim == 2 and values.shape[1] == 1 else values
    if values.ndim != 1:
        raise ModelError(
            f"{ref.uri}: the pyfunc model returned {type(out).__name__} of shape {values.shape}: neither class "
            "scores (samples, classes) nor one label or P(positive) per sample"
        )
    if values.dtype.kind == "f" and not _whole(values):
        if logits:
            values = 1.0 / (1.0 + np.exp(-values))
        classes = named_classes(ref, hint, "a pyfunc model returning P(positive)")
        return class_scores(ref, values, classes, index)
    return label_series(values, index, f"it returns one class label per sample ({type(out).__name__})")


def _whole(values: np.ndarray) -> bool:
    """Whether every finite value is a whole number (labels written as floats, like 0.0 and 1.0)."""
    finite = values[np.isfinite(values)]
    return bool(len(finite)) and bool((finite == np.round(finite)).all())


def _torch_scorer(ref: ModelRef, classes_hint: list[str] | None, tensor: TensorInput | None) -> tuple[Scorer, tuple]:
    import mlflow.pytorch
    import torch

    classes = named_classes(ref, classes_hint, "a PyTorch model")
    logits = _outputs_logits(ref, default=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = mlflow.pytorch.load_model(ref.artifacts, map_location=device)
    with contextlib.suppress(NotImplementedError):  # exported (pt2) graphs have no train/eval modes
        model.eval()
    # an exported (pt2) program, what MLflow 3 logs by default, loads on the CPU whatever map_location says
    placed = {"device": _moved(model, device)}

    def forward(batch: torch.Tensor) -> torch.Tensor:
        try:
            return model(batch.to(placed["device"]))
        except RuntimeError as exc:  # weights a .to() did not move (a program's constants): score on the CPU
            if placed["device"] == "cpu" or not any(said in str(exc) for said in MISPLACED):
                raise
            placed["device"] = _moved(model, "cpu")
            return model(batch)

    def probabilities(out: torch.Tensor) -> torch.Tensor:
        if not logits:
            return out
        return torch.sigmoid(out) if out.ndim == 1 or out.shape[1] == 1 else torch.softmax(out, dim=1)

    def score(features: pd.DataFrame) -> pd.DataFrame:
        x = torch.as_tensor(tensor_batch(features, tensor, features.attrs.get("source", "evaluation data")))
        outs = []
        with torch.no_grad():
            for start in range(0, len(x), 8192):
                outs.append(probabilities(forward(x[start : start + 8192])).cpu().numpy())
        probs = np.concatenate(outs) if outs else np.zeros((0, len(classes)))
        return class_scores(ref, probs, classes, features.index)

    return score, ()


def _moved(model: nn.Module, device: str) -> str:
    """Move ``model`` to ``device`` and return where it is then: ``device``, or the CPU for a model that refuses."""
    try:
        model.to(device)
    except (NotImplementedError, RuntimeError):
        return "cpu"
    return device


def _outputs_logits(ref: ModelRef, default: bool | None) -> bool | None:
    """Whether the version's scores are logits (to softmax), from its ``consistency_gate.outputs`` tag."""
    raw = ref.tags.get(OUTPUTS_TAG)
    if raw is None:
        return default
    if raw not in ("logits", "probabilities"):
        raise ModelError(f"{ref.uri}: tag {OUTPUTS_TAG} must be 'logits' or 'probabilities', got {raw!r}")
    return raw == "logits"


def _pyfunc_scorer(ref: ModelRef, classes_hint: list[str] | None, tensor: TensorInput | None) -> tuple[Scorer, tuple]:
    import mlflow.pyfunc

    model = mlflow.pyfunc.load_model(ref.artifacts)
    logits = _outputs_logits(ref, default=None)

    def score(features: pd.DataFrame) -> Output:
        where = features.attrs.get("source", "evaluation data")
        out = model.predict(features if tensor is None else tensor_batch(features, tensor, where))
        return pyfunc_output(ref, out, classes_hint, features.index, logits)

    return score, ()


def _require_predict_proba(uri: str, pyfunc: dict) -> None:
    """ModelError unless a scikit-learn model's pyfunc returns class probabilities (``spark_udf`` calls it)."""
    predict_fn = pyfunc.get("predict_fn")
    if predict_fn != "predict_proba":
        raise ModelError(
            f"{uri}: its pyfunc predicts labels ({predict_fn or 'predict'}), but --engine spark predicts "
            "with mlflow.pyfunc.spark_udf and needs class probabilities: log the model with "
            "mlflow.sklearn.log_model(..., pyfunc_predict_fn='predict_proba'), or use --engine local"
        )


@dataclass(frozen=True)
class Flavor:
    """How a model logged with one MLflow flavor is read: ``scorer(ref, classes_hint, tensor)`` loads it
    in-process and returns its scorer and the columns it takes as pandas categories; on Spark its pyfunc
    predicts (``mlflow.pyfunc.spark_udf``), whose scores are logits when ``spark_logits`` (softmaxed as
    in-process), after ``spark_check(uri, python_function flavor config)`` says the pyfunc gives scores."""

    scorer: Callable[[ModelRef, list[str] | None, TensorInput | None], tuple[Scorer, tuple]]
    spark_logits: bool = False
    spark_check: Callable[[str, dict], None] | None = None


FLAVORS: dict[str, Flavor] = {  # in the order they are preferred
    "lightgbm": Flavor(_native("lightgbm")),
    "xgboost": Flavor(_native("xgboost")),
    "catboost": Flavor(_native("catboost")),
    "sklearn": Flavor(_native("sklearn"), spark_check=_require_predict_proba),
    "pytorch": Flavor(_torch_scorer, spark_logits=True),
    "python_function": Flavor(_pyfunc_scorer),
}


def flavor_of(flavors: Sequence[str]) -> str:
    """The entry of :data:`FLAVORS` a version logged with ``flavors`` is loaded with (the first of the
    table it has; ``python_function`` for any other)."""
    return next((name for name in FLAVORS if name in flavors), "python_function")
