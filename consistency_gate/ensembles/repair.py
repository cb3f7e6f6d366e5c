"""Repairs that need no training: the candidate's answers corrected by the previous generation's scores.

Two methods of the ``remediation:`` block, tried first by ``strategy: cheapest``:

- ``blend``: p = w * p_previous + (1 - w) * p_candidate, over the union of both generations' classes
  (a class one generation lacks scores 0 there);
- ``rerank`` (backward-compatible re-ranking, Cai et al., NeurIPS 2022): of the candidate's top-k
  classes, the one the previous generation scores highest is the answer. The output is the
  candidate's probabilities with that class and the candidate's own first choice swapped, so its
  top-k set, and so its top-k accuracy, stay the candidate's.

``w`` and ``k`` are tuned on data that is not the gate's evaluation set (the remediation's ``data:``
or a ``calibration:`` file), with the gate's own rules: the setting closest to the candidate (the
smallest ``w``, the smallest ``k``) that passes them there; if none does, the one with the fewest
negative flips there. Without such data the documented defaults (``w`` 0.5, ``k`` 3) are used.
The repair is served as one pyfunc model carrying both generations' models
(:class:`RepairPyfunc`), so it predicts without the registry.

>>> previous = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]])
>>> candidate = np.array([[0.3, 0.6, 0.1], [0.2, 0.2, 0.6]])
>>> blend(previous, candidate, 0.5).argmax(axis=1), rerank(previous, candidate, 2).argmax(axis=1)
(array([0, 2]), array([0, 2]))
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from consistency_gate.core.evaluation import canonical_classes
from consistency_gate.ensembles.carrying import carried, carried_models, input_frame, log_carrying
from consistency_gate.ensembles.config import RemediationConfig, check_k, check_weight
from consistency_gate.ensembles.method import Built, Inputs, models_of, tuning_data
from consistency_gate.ensembles.methods import KS

if TYPE_CHECKING:
    from mlflow.models.model import ModelInfo
    from mlflow.pyfunc import PythonModelContext


try:
    from mlflow.pyfunc import PythonModel
except ImportError:  # pragma: no cover - mlflow is a dependency; keeps the core importable without it
    PythonModel = object

DEFAULT_WEIGHT = 0.5  # blend: as much of the previous generation as of the candidate
DEFAULT_K = 3  # rerank: the previous generation picks among the candidate's three first choices
WEIGHTS = tuple(round(0.1 * i, 1) for i in range(1, 10))  # 0 is the candidate, 1 the previous generation


def blend(previous: np.ndarray, candidate: np.ndarray, weight: float) -> np.ndarray:
    """``weight`` times the previous generation's probabilities plus ``1 - weight`` times the candidate's.

    Parameters
    ----------
    previous, candidate : (n, p) probabilities over the same classes, in the same column order.
    weight : the previous generation's share, in [0, 1].

    Returns
    -------
    (n, p) probabilities.

    Examples
    --------
    >>> blend(np.array([[1.0, 0.0]]), np.array([[0.2, 0.8]]), 0.25)
    array([[0.4, 0.6]])
    """
    check_weight(weight)
    return weight * np.asarray(previous, dtype=np.float64) + (1.0 - weight) * np.asarray(candidate, dtype=np.float64)


def rerank(previous: np.ndarray, candidate: np.ndarray, k: int) -> np.ndarray:
    """The candidate's probabilities with its first choice replaced by the class, among its top ``k``,
    that the previous generation scores highest (the two classes' probabilities swapped).

    Ties go to the first column, as everywhere in the package (columns in the canonical class order).

    Parameters
    ----------
    previous, candidate : (n, p) scores over the same classes, in the same column order.
    k : how many of the candidate's first choices the previous generation picks from (>= 2).

    Returns
    -------
    (n, p) probabilities: a permutation of each of the candidate's rows.

    Examples
    --------
    >>> rerank(np.array([[0.1, 0.3, 0.6]]), np.array([[0.5, 0.4, 0.1]]), 2)
    array([[0.4, 0.5, 0.1]])
    """
    check_k(k, np.shape(candidate)[1])
    cand = np.asarray(candidate, dtype=np.float64)
    prev = np.asarray(previous, dtype=np.float64)
    rows = np.arange(len(cand))
    top = np.argsort(-cand, axis=1, kind="stable")[:, :k]  # the candidate's k first choices
    chosen = top[rows, np.argmax(prev[rows[:, None], top], axis=1)]
    first = top[:, 0]
    out = cand.copy()
    out[rows, first], out[rows, chosen] = cand[rows, chosen], cand[rows, first]
    return out


def aligned(previous: pd.DataFrame, candidate: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Both generations' class-score frames over the union of their classes, in the canonical order
    (labels sorted as text); a class a generation lacks scores 0 there.

    >>> p, c, classes = aligned(pd.DataFrame({"b": [0.4], "a": [0.6]}), pd.DataFrame({"a": [0.5], "c": [0.5]}))
    >>> classes, p.tolist(), c.tolist()
    (['a', 'b', 'c'], [[0.6, 0.4, 0.0]], [[0.5, 0.0, 0.5]])
    """
    classes = canonical_classes([list(previous.columns), list(candidate.columns)])

    def spread(frame: pd.DataFrame) -> np.ndarray:
        frame = frame.set_axis([str(c) for c in frame.columns], axis=1)
        return frame.reindex(columns=classes, fill_value=0.0).to_numpy(dtype=np.float64)

    return spread(previous), spread(candidate), classes


@dataclass(frozen=True)
class Repair:
    """A no-training repair: its method and setting, and where that setting came from."""

    method: str  # blend or rerank
    weight: float = DEFAULT_WEIGHT
    k: int = DEFAULT_K
    tuned_on: str = "defaults"  # the data the setting was chosen on, or "defaults"

    def apply(self, previous: np.ndarray, candidate: np.ndarray) -> np.ndarray:
        """The repaired (n, p) probabilities from both generations' aligned scores."""
        if self.method == "blend":
            return blend(previous, candidate, self.weight)
        return rerank(previous, candidate, min(self.k, np.shape(candidate)[1]))

    @property
    def setting(self) -> dict:
        """The setting as a report shows it."""
        value = {"weight": self.weight} if self.method == "blend" else {"k": self.k}
        return {**value, "tuned_on": self.tuned_on}

    def describe(self) -> str:
        """'blend (w 0.3, tuned on calib.csv)' and the like."""
        value = f"w {self.weight}" if self.method == "blend" else f"k {self.k}"
        where = "the default" if self.tuned_on == "defaults" else f"tuned on {self.tuned_on}"
        return f"{self.method} ({value}, {where})"


def tune(
    method: str,
    previous: np.ndarray,
    candidate: np.ndarray,
    judge: Callable[[np.ndarray], tuple[bool, float]],
    where: str,
) -> Repair:
    """The setting of ``method`` closest to the candidate that passes ``judge`` on tuning data that
    is not the gate's evaluation set; else the one with the fewest negative flips there.

    ``judge(probabilities)`` returns (whether the gate's rules pass, CtoI) on that data.

    >>> prev, cand = np.eye(3)[[0, 1, 2, 0]], np.eye(3)[[1, 1, 2, 0]] * 0.6 + 0.1
    >>> flips = lambda p: (p.argmax(1)[0] == 0, float(p.argmax(1)[0] != 0))  # sample 0: class 0 is right
    >>> tune("blend", prev, cand, flips, "calibration.csv")  # w > 0.375 turns sample 0 back to class 0
    Repair(method='blend', weight=0.4, k=3, tuned_on='calibration.csv')
    """
    grid: Sequence[Repair] = (
        [Repair("blend", weight=w, tuned_on=where) for w in WEIGHTS]
        if method == "blend"
        else [Repair("rerank", k=k, tuned_on=where) for k in KS if k < np.shape(candidate)[1]]
    )
    judged = [(repair, *judge(repair.apply(previous, candidate))) for repair in grid]
    passing = [repair for repair, passed, _ in judged if passed]
    return passing[0] if passing else min(judged, key=lambda item: item[2])[0]


class RepairPyfunc(PythonModel):
    """MLflow pyfunc of a no-training repair: both generations' models inside it (artifacts
    ``previous`` and ``candidate``), combined by the repair in its model config; predict() returns a
    DataFrame with one probability column per class."""

    def load_context(self, context: PythonModelContext) -> None:
        """Load both generations from the model's own artifacts (no registry needed)."""
        config = context.model_config
        self.repair = Repair(config["method"], config["weight"], config["k"], config["tuned_on"])
        self.models = carried_models(context, ("previous", "candidate"))

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:  # noqa: ANN001
        """One probability column per class of either generation."""
        from consistency_gate.mlops.scoring import predict

        frame = input_frame(model_input)
        previous, candidate, classes = aligned(*(predict(m, frame, ()) for m in self.models))
        return pd.DataFrame(self.repair.apply(previous, candidate), columns=classes, index=frame.index)


def log_repair(repair: Repair, previous: dict, candidate: dict, name: str = "repair") -> ModelInfo:
    """Log ``repair`` as one pyfunc model in the active run, carrying both generations' models
    (``previous`` and ``candidate``: each a dict with the model's ``uri``, its ``classes`` and its
    ``tags``); the candidate's signature is the repair's input. Returns MLflow's ModelInfo.

    Example::

        with mlflow.start_run():
            info = log_repair(Repair("rerank", k=3), {"uri": "models:/clf/1", ...}, {"uri": "models:/clf/2", ...})
    """
    config = {"method": repair.method, "weight": repair.weight, "k": repair.k, "tuned_on": repair.tuned_on}
    metadata = {"repair": json.loads(json.dumps(repair.setting)), "method": repair.method}
    return log_carrying("repair_code.py", {"previous": previous, "candidate": candidate}, config, metadata, name)


def build_repair(inputs: Inputs, remediation: RemediationConfig) -> Built:
    """``blend`` or ``rerank`` (the builder of :data:`~consistency_gate.ensembles.methods.METHODS`): its
    setting fixed by the config or tuned on data other than the evaluation set (:func:`setting_for`),
    logged as one pyfunc model carrying both generations' models."""
    import time

    import mlflow

    start = time.perf_counter()
    repair = setting_for(inputs, remediation)
    previous, candidate, classes = aligned(inputs.base_scores, inputs.cand_scores)
    scores = pd.DataFrame(repair.apply(previous, candidate), columns=classes, index=inputs.cand_scores.index)
    seconds = time.perf_counter() - start
    mlflow.log_params({"method": repair.method, **repair.setting})
    pairs = ((inputs.baseline, inputs.base_scores), (inputs.candidate, inputs.cand_scores))
    model_info = log_repair(repair, *(carried(model, scores) for model, scores in pairs))
    members = models_of(inputs, inputs.versions)
    setting = {**repair.setting, "combines": list(inputs.versions)}
    return Built(model_info, scores, members, seconds, inputs.candidate.features, setting=setting)


def setting_for(inputs: Inputs, remediation: RemediationConfig) -> Repair:
    """The repair's setting: as the config fixes it; else tuned with the gate's rules, each judged on its
    strict one-sided bound (``inputs.calibration_judge``), on the ``calibration:`` file, the evaluation
    set's held-out share or the remediation's ``data:`` (:func:`~consistency_gate.ensembles.methods.tuning_data`),
    never on the samples it is judged on; else the default."""
    from consistency_gate.mlops.scoring import predict

    method, fixed = remediation.settings.method, remediation.own.model_dump(exclude_none=True)
    if fixed:  # blend's weight, rerank's k
        return Repair(method, **fixed, tuned_on="config")
    tuning = tuning_data(inputs, remediation)
    if tuning is None:
        return Repair(method)
    generations = (inputs.baseline, inputs.candidate)
    prev_scores, cand_scores = (predict(m, tuning.frame, tuning.non_features) for m in generations)
    previous, candidate, classes = aligned(prev_scores, cand_scores)
    base = pd.DataFrame(previous, columns=classes)
    judge = inputs.calibration_judge(tuning.frame[tuning.label_column], base, classes, tuning.source)
    return tune(method, previous, candidate, judge, tuning.source)
