"""The Bayesian update over generations (Traeuble et al., "Backward-Compatible Prediction Updates: A
Probabilistic Approach", NeurIPS 2021), a repair that needs no training: ``method: bayesian-update``.

Each of the last K generations (the champions before the baseline, the baseline, the candidate) is
an imperfect annotator with a confusion matrix ``C_t[y, j] = p(generation t answers j | true class y)``,
estimated on calibration data (never the gate's evaluation set, add-one smoothed). Starting from a
uniform prior, a sample's belief over its true class is the product of the likelihoods of the answers
the generations gave it. The previous generation's answer stands unless the belief in the most likely
class is more than ``cost_ratio`` times the belief in that answer (the cost-ratio rule: a negative flip
costs ``cost_ratio`` times what a positive flip gains); the output is the belief with the answer given
the highest score (for two classes, the answer alone, so any decision threshold reads it the same).

>>> classes = ["a", "b"]
>>> good, coin = np.array([[0.9, 0.1], [0.1, 0.9]]), np.array([[0.5, 0.5], [0.5, 0.5]])
>>> update = BayesUpdate(classes, [good, coin, good], cost_ratio=2.0)
>>> update.answers([np.array([0, 0]), np.array([0, 1]), np.array([1, 0])])  # the baseline is the second
array([0, 0])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from consistency_gate.core.evaluation import canonical_classes
from consistency_gate.ensembles.answers import COST_RATIOS, answer_labels, class_indices, confusion
from consistency_gate.ensembles.carrying import carried, carried_models, input_frame, log_carrying
from consistency_gate.ensembles.config import RemediationConfig
from consistency_gate.ensembles.method import Built, Inputs, models_of, tuning_data
from consistency_gate.ensembles.methods import DEFAULT_GENERATIONS

if TYPE_CHECKING:
    from mlflow.models.model import ModelInfo
    from mlflow.pyfunc import PythonModelContext

try:
    from mlflow.pyfunc import PythonModel
except ImportError:  # pragma: no cover - mlflow is a dependency; keeps the core importable without it
    PythonModel = object

DEFAULT_COST_RATIO = 2.0


@dataclass(frozen=True)
class BayesUpdate:
    """The update of K generations: their ``confusions`` in order (the baseline second to last, the
    candidate last) over ``classes``, and the ``cost_ratio`` a change of the baseline's answer needs."""

    classes: list[str]
    confusions: list[np.ndarray]
    cost_ratio: float = DEFAULT_COST_RATIO
    tuned_on: str = "defaults"

    def belief(self, answers: Sequence[np.ndarray]) -> np.ndarray:
        """(n, p) posterior over the true class, from each generation's answers (class indices; -1 for
        an answer outside the classes, which says nothing)."""
        log = np.zeros((len(answers[0]), len(self.classes)))
        for said, matrix in zip(answers, self.confusions, strict=True):
            known = said >= 0
            log[known] += np.log(matrix[:, said[known]].T)
        log -= log.max(axis=1, keepdims=True)
        belief = np.exp(log)
        return belief / belief.sum(axis=1, keepdims=True)

    def answers(self, answers: Sequence[np.ndarray], kept: np.ndarray | None = None) -> np.ndarray:
        """Each sample's answer: the one ``kept`` so far (default the baseline's, ``answers[-2]``) unless
        the most likely class is more than ``cost_ratio`` times as likely."""
        belief = self.belief(answers)
        rows = np.arange(len(belief))
        best = belief.argmax(axis=1)
        kept = answers[-2] if kept is None else kept
        known = kept >= 0
        stay = known & (belief[rows, best] <= self.cost_ratio * belief[rows, np.where(known, kept, 0)])
        return np.where(stay, kept, best)

    def scores(self, answers: Sequence[np.ndarray]) -> np.ndarray:
        """(n, p) class scores whose highest is each sample's answer: the belief with the answer's score
        and the highest swapped; for two classes the answer alone (1 and 0)."""
        belief, chosen = self.belief(answers), self.answers(answers)
        if len(self.classes) == 2:
            return np.eye(2)[chosen]
        rows, top = np.arange(len(belief)), belief.argmax(axis=1)
        out = belief.copy()
        out[rows, top], out[rows, chosen] = belief[rows, chosen], belief[rows, top]
        return out

    @property
    def setting(self) -> dict:
        """The setting as a report shows it."""
        return {"generations": len(self.confusions), "cost_ratio": self.cost_ratio, "tuned_on": self.tuned_on}


def tune_cost_ratio(
    update: BayesUpdate, answers: Sequence[np.ndarray], judge: Callable[[np.ndarray], tuple[bool, float]], where: str
) -> BayesUpdate:
    """The smallest cost ratio (the most answers the generations' belief may change) whose scores on
    calibration data pass ``judge`` (the gate's rules there: (passed, CtoI)); else the one with the
    fewest negative flips there.

    >>> good = np.array([[0.9, 0.1], [0.1, 0.9]])
    >>> update = BayesUpdate(["a", "b"], [good, good, good])
    >>> said = [np.array([0]), np.array([0]), np.array([1])]
    >>> tune_cost_ratio(update, said, lambda s: (s.argmax(1)[0] == 0, 0.0), "calib.csv").cost_ratio
    1.0
    """
    grid = [BayesUpdate(update.classes, update.confusions, c, where) for c in COST_RATIOS]
    judged = [(candidate, *judge(candidate.scores(answers))) for candidate in grid]
    passing = [candidate for candidate, passed, _ in judged if passed]
    return passing[0] if passing else min(judged, key=lambda item: item[2])[0]


class BayesPyfunc(PythonModel):
    """MLflow pyfunc of the Bayesian update: every generation's model inside it (artifacts ``g0`` ...,
    the candidate last), their confusion matrices and the cost ratio in its model config; predict()
    returns one score column per class."""

    def load_context(self, context: PythonModelContext) -> None:
        """Load the generations from the model's own artifacts (no registry needed)."""
        from consistency_gate.core.threshold import BinaryDecision

        config = context.model_config
        confusions = [np.array(m) for m in config["confusions"]]
        self.update = BayesUpdate(config["update_classes"], confusions, config["cost_ratio"], config["tuned_on"])
        decision = config.get("decision")
        self.decision = BinaryDecision(decision["positive"], decision["threshold"]) if decision else None
        self.models = carried_models(context, config["roles"])

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:  # noqa: ANN001
        """One score column per class; the highest is the update's answer."""
        from consistency_gate.mlops.scoring import predict

        frame = input_frame(model_input)
        said = [
            class_indices(answer_labels(predict(m, frame, ()), self.decision), self.update.classes) for m in self.models
        ]
        return pd.DataFrame(self.update.scores(said), columns=self.update.classes, index=frame.index)


def log_bayes(update: BayesUpdate, generations: list[dict], decision: dict | None, name: str = "repair") -> ModelInfo:
    """Log ``update`` as one pyfunc model in the active run carrying every generation's model
    (``generations``: dicts with the model's ``uri``, its ``classes`` and its ``tags``, the candidate
    last, whose signature is the repair's input). Returns MLflow's ModelInfo.

    Example::

        with mlflow.start_run():
            info = log_bayes(update, [{"uri": "models:/clf/1", ...}, {"uri": "models:/clf/3", ...}], None)
    """
    roles = [f"g{i}" for i in range(len(generations))]
    config = {
        "update_classes": update.classes,
        "confusions": [m.tolist() for m in update.confusions],
        "cost_ratio": update.cost_ratio,
        "tuned_on": update.tuned_on,
        "decision": decision,
        "roles": roles,
    }
    metadata = {"repair": update.setting, "method": "bayesian-update"}
    return log_carrying("bayes_code.py", dict(zip(roles, generations, strict=True)), config, metadata, name)


def build_bayes(inputs: Inputs, remediation: RemediationConfig) -> Built:
    """``bayesian-update`` (the builder of :data:`~consistency_gate.ensembles.methods.METHODS`): the
    champions before the baseline (as the model's gates promoted them), the baseline and the candidate,
    their confusion matrices estimated on the tuning data (:func:`~consistency_gate.ensembles.methods.tuning_data`:
    never the samples it is judged on), the cost ratio fixed by the config or
    tuned there with the gate's rules; logged as one pyfunc carrying the K models."""
    import time

    import mlflow

    from consistency_gate.mlops.scoring import predict

    start = time.perf_counter()
    count = remediation.own.generations or DEFAULT_GENERATIONS
    past = inputs.past(count - 2)
    models = [*(m for _, m in past), inputs.baseline, inputs.candidate]
    on_eval = [*(predict(m, inputs.frame, inputs.non_features) for _, m in past), inputs.base_scores]
    on_eval.append(inputs.cand_scores)
    held = tuning_data(inputs, remediation)  # the method's entry needs one (labelled=True)
    tuning, label, source = held.frame, held.label_column, held.source
    on_tuning = [predict(m, tuning, held.non_features) for m in models]
    said_eval = [answer_labels(s, inputs.decision) for s in on_eval]
    said_tuning = [answer_labels(s, inputs.decision) for s in on_tuning]
    seen = {str(c) for s in on_eval if isinstance(s, pd.DataFrame) for c in s.columns}
    seen |= {a for said in said_eval + said_tuning for a in said} | {str(v) for v in inputs.frame[inputs.label_column]}
    held.check_labels(seen)
    classes = canonical_classes([sorted(seen)])
    update = BayesUpdate(classes, [confusion(tuning[label], s, classes) for s in said_tuning])
    tuning_idx = [class_indices(s, classes) for s in said_tuning]
    if remediation.own.cost_ratio is not None:
        update = replace(update, cost_ratio=remediation.own.cost_ratio, tuned_on="config")
    else:
        base = pd.DataFrame(np.eye(len(classes))[np.maximum(tuning_idx[-2], 0)], columns=classes)
        judge = inputs.calibration_judge(tuning[label], base, classes, source)
        update = tune_cost_ratio(update, tuning_idx, judge, str(source))
    eval_idx = [class_indices(s, classes) for s in said_eval]
    scores = pd.DataFrame(update.scores(eval_idx), columns=classes, index=inputs.frame.index)
    seconds = time.perf_counter() - start
    mlflow.log_params({"method": "bayesian-update", **update.setting, "versions": ", ".join(v for v, _ in past)})
    generations = [carried(m, s) for m, s in zip(models, on_eval, strict=True)]
    model_info = log_bayes(update, generations, inputs.decision.to_dict() if inputs.decision else None)
    setting = {**update.setting, "versions": [*(v for v, _ in past), *inputs.versions]}
    members = models_of(inputs, setting["versions"])
    return Built(model_info, scores, members, seconds, inputs.candidate.features, setting=setting)
