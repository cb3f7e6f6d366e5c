"""A repair served as one MLflow pyfunc that carries the generations' models (blend, rerank, the Bayesian
update, the memory): each generation as it is carried (:func:`carried`), the pyfunc logged from a code file
beside this module with them as artifacts (:func:`log_carrying`), and loaded back inside it without the
registry (:func:`carried_models`), its input as the frame they predict (:func:`input_frame`).

>>> input_frame(np.zeros((2, 3))).shape
(2, 3)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from mlflow.models.model import ModelInfo
    from mlflow.pyfunc import PythonModelContext

    from consistency_gate.mlops.scoring import LoadedModel


def carried(model: LoadedModel, scores: pd.DataFrame | pd.Series) -> dict:
    """A generation as a repair carries it: its model URI, its classes (its score columns; none for a
    label-only model) and the tags that say how to read its outputs."""
    from consistency_gate.mlops.registry import CLASSES_TAG, OUTPUTS_TAG

    tags = {k: v for k, v in model.ref.tags.items() if k in (CLASSES_TAG, OUTPUTS_TAG)}
    classes = [str(c) for c in scores.columns] if isinstance(scores, pd.DataFrame) else None
    return {"uri": model.ref.uri, "classes": classes, "tags": tags}


def log_carrying(
    code: str | Path,
    generations: dict[str, dict],
    config: dict,
    metadata: dict,
    name: str = "repair",
    signature: object | None = None,
    extra: dict[str, str] | None = None,
) -> ModelInfo:
    """Log a repair that needs no training as one pyfunc model in the active run ("models from code":
    ``code``, the name of a file beside this module or the path of a repair's own; nothing pickled),
    carrying ``generations`` (role -> a dict with the model's ``uri``, its ``classes`` and its ``tags``,
    which go into ``config``); the last role's signature is the repair's input unless ``signature`` gives
    one; ``extra``: more artifacts (name -> local path), such as a table. Returns MLflow's ModelInfo."""
    import warnings

    import mlflow

    signature = signature or mlflow.models.get_model_info(list(generations.values())[-1]["uri"]).signature
    config = {
        **config,
        "classes": {role: g["classes"] for role, g in generations.items()},
        "tags": {role: g["tags"] for role, g in generations.items()},
    }
    with warnings.catch_warnings():  # it has the candidate's signature; MLflow would still ask for an example
        warnings.filterwarnings("ignore", message=".*input example was not provided", category=UserWarning)
        return mlflow.pyfunc.log_model(
            name=name,
            python_model=str(code if isinstance(code, Path) else Path(__file__).with_name(code)),
            artifacts={**{role: g["uri"] for role, g in generations.items()}, **(extra or {})},
            model_config=config,
            signature=signature,
            metadata=metadata,
            pip_requirements=["consistency-gate"],
        )


def carried_models(context: PythonModelContext, roles: Sequence[str]) -> list:
    """The generations' models a logged repair carries (its artifacts ``roles``, their classes and tags in
    its model config, as :func:`log_carrying` wrote them), loaded without the registry."""
    from consistency_gate.mlops.registry import ModelRef
    from consistency_gate.mlops.scoring import load_model

    config = context.model_config
    models = []
    for role in roles:
        path = context.artifacts[role]
        ref = ModelRef(path, "", tags=dict(config["tags"][role]), source=path)
        models.append(load_model(ref, config["classes"][role]))
    return models


def input_frame(model_input: pd.DataFrame | np.ndarray) -> pd.DataFrame:
    """A repair's input as the frame its generations predict: a tensor input as flat columns, which
    each model reshapes to its own signature.

    >>> input_frame(np.zeros((2, 1, 2, 2))).shape
    (2, 4)
    """
    if isinstance(model_input, np.ndarray):
        return pd.DataFrame(model_input.reshape(len(model_input), -1))
    return pd.DataFrame(model_input)
