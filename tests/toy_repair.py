"""A repair of our own, added the way a team adds one: this module and its entry (``ABSTAIN``), named in a
gate config as ``strategy: ["toy_repair:ABSTAIN"]`` with its options under ``options: {abstain: {...}}``.

``abstain``: where the candidate's top score is below ``margin``, the previous generation's scores, else the
candidate's. It is served as one pyfunc carrying both generations' models (this file is also its MLflow
"models from code" file: loading it sets the model).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import Field

from consistency_gate.ensembles.carrying import carried, carried_models, input_frame, log_carrying
from consistency_gate.ensembles.method import Built, Described, Inputs, Method, Options, models_of
from consistency_gate.ensembles.repair import aligned

try:
    from mlflow.pyfunc import PythonModel
except ImportError:  # pragma: no cover
    PythonModel = object


class AbstainOptions(Options):
    """``options: {abstain: {margin: ...}}``: below this top score the candidate defers."""

    margin: float = Field(default=0.8, strict=True, gt=0, le=1)


def abstain(previous: np.ndarray, candidate: np.ndarray, margin: float) -> np.ndarray:
    """The previous generation's rows where the candidate's top score is below ``margin``."""
    unsure = candidate.max(axis=1) < margin
    return np.where(unsure[:, None], previous, candidate)


class AbstainPyfunc(PythonModel):
    """Both generations inside (artifacts ``previous`` and ``candidate``), the margin in the model config."""

    def load_context(self, context) -> None:  # noqa: ANN001
        self.margin = context.model_config["margin"]
        self.models = carried_models(context, ("previous", "candidate"))

    def predict(self, context, model_input, params=None) -> pd.DataFrame:  # noqa: ANN001
        from consistency_gate.mlops.scoring import predict

        frame = input_frame(model_input)
        previous, candidate, classes = aligned(*(predict(m, frame, ()) for m in self.models))
        return pd.DataFrame(abstain(previous, candidate, self.margin), columns=classes, index=frame.index)


def build_abstain(inputs: Inputs, remediation) -> Built:  # noqa: ANN001
    """The builder: scores on the evaluation set, the model logged in the attempt's run."""
    import mlflow

    start = time.perf_counter()
    margin = remediation.own.margin
    previous, candidate, classes = aligned(inputs.base_scores, inputs.cand_scores)
    scores = pd.DataFrame(abstain(previous, candidate, margin), columns=classes, index=inputs.cand_scores.index)
    mlflow.log_params({"method": "abstain", "margin": margin})
    pairs = {"previous": (inputs.baseline, inputs.base_scores), "candidate": (inputs.candidate, inputs.cand_scores)}
    generations = {role: carried(model, s) for role, (model, s) in pairs.items()}
    info = log_carrying(Path(__file__), generations, {"margin": margin}, {"method": "abstain"})
    setting = {"margin": margin, "deferred": int((candidate.max(axis=1) < margin).sum())}
    return Built(info, scores, models_of(inputs, inputs.versions), time.perf_counter() - start, None, setting)


def describe_abstain(name: str, built: Built) -> Described:
    noun = f"{name} repair"
    title = f"{noun} (margin {built.setting['margin']:g}: {built.setting['deferred']} answers deferred)"
    return Described(noun, title, f"the {noun} ({built.members} models)")


ABSTAIN = Method(
    "abstain",
    "abstain",
    15,
    build_abstain,
    lambda name, m: f"deferring the candidate's unsure answers to the previous generation ({name})",
    previous=True,
    scores=("previous", "candidate"),
    models=lambda inputs, remediation: models_of(inputs, inputs.versions),
    options=AbstainOptions,
    describe=describe_abstain,
)

try:  # loaded as the logged model's code: the model it serves
    import mlflow

    mlflow.models.set_model(AbstainPyfunc())
except ImportError:  # pragma: no cover
    pass
