"""A trained ensemble as a predictor and as an MLflow pyfunc model.

:class:`TorchEnsemble` holds the members' weights, their validation accuracies, the recipe
that rebuilds them, the feature standardisation and the class names; it predicts class
probabilities with a combination rule (:mod:`consistency_gate.ensembles.combine`). :class:`EnsemblePyfunc`
wraps it for the registry, so ``check`` loads an ensemble version like any other model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from consistency_gate.ensembles.combine import combine
from consistency_gate.ensembles.recipes import RecipeSpec, build_module

if TYPE_CHECKING:
    from mlflow.models.model import ModelInfo
    from mlflow.pyfunc import PythonModelContext

try:
    from mlflow.pyfunc import PythonModel
except ImportError:  # pragma: no cover - mlflow is a dependency; keeps the core importable without it
    PythonModel = object


@dataclass
class TorchEnsemble:
    """Trained members (state dicts of one recipe), their weights, classes, feature names and
    standardisation: predicts combined class probabilities on CPU or CUDA."""

    recipe: RecipeSpec
    states: list[dict]
    weights: list[float]
    classes: list[str]
    features: list[str]
    mean: np.ndarray
    std: np.ndarray
    combination: str = "avg"
    mc_passes: int = 1
    metadata: dict = field(default_factory=dict)

    def predict_proba(self, x: np.ndarray, batch_size: int = 8192) -> np.ndarray:
        """(n, classes) combined probabilities for raw features ``x``."""
        device = "cuda" if torch.cuda.is_available() else "cpu"
        xs = torch.as_tensor((np.asarray(x, dtype=np.float32) - self.mean) / self.std, device=device)
        member_probs = []
        generator_seed = 0
        for state in self.states:
            module = build_module(self.recipe).to(device)
            module.load_state_dict(state)
            for _ in range(self.mc_passes):
                torch.manual_seed(generator_seed)  # MC dropout passes are reproducible
                generator_seed += 1
                _set_mode(module, stochastic=self.mc_passes > 1)
                with torch.no_grad():
                    parts = [
                        torch.softmax(module(xs[i : i + batch_size]), 1).cpu().numpy()
                        for i in range(0, len(xs), batch_size)
                    ]
                member_probs.append(np.concatenate(parts) if parts else np.zeros((0, len(self.classes))))
        weights = [w for w in self.weights for _ in range(self.mc_passes)]
        return combine(np.stack(member_probs), self.combination, weights)

    def predict_frame(self, frame: pd.DataFrame) -> pd.DataFrame:
        """One probability column per class, for the ensemble's feature columns of ``frame``."""
        missing = [c for c in self.features if c not in frame.columns]
        if missing:
            raise KeyError(f"the ensemble needs feature columns {missing}")
        probs = self.predict_proba(frame[self.features].to_numpy(dtype=np.float32))
        return pd.DataFrame(probs, columns=self.classes, index=frame.index)

    def save(self, folder: Path) -> None:
        """Write ``ensemble.json`` (everything but the weights) and ``members.pt`` into ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(self.states, folder / "members.pt")
        spec = {
            "recipe": self.recipe.to_dict(),
            "weights": self.weights,
            "classes": self.classes,
            "features": self.features,
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
            "combination": self.combination,
            "mc_passes": self.mc_passes,
            "metadata": self.metadata,
        }
        (folder / "ensemble.json").write_text(json.dumps(spec, indent=2))

    @classmethod
    def load(cls, folder: Path) -> TorchEnsemble:
        """The ensemble :meth:`save` wrote to ``folder`` (weights only: no pickled code)."""
        spec = json.loads((Path(folder) / "ensemble.json").read_text())
        states = torch.load(Path(folder) / "members.pt", map_location="cpu", weights_only=True)
        return cls(
            RecipeSpec(**spec["recipe"]),
            states,
            spec["weights"],
            spec["classes"],
            spec["features"],
            np.asarray(spec["mean"], dtype=np.float32),
            np.asarray(spec["std"], dtype=np.float32),
            spec["combination"],
            spec["mc_passes"],
            spec["metadata"],
        )


def _set_mode(module: torch.nn.Module, stochastic: bool) -> None:
    """Eval mode, but with dropout layers active for MC dropout passes."""
    module.eval()
    if stochastic:
        for layer in module.modules():
            if isinstance(layer, torch.nn.Dropout):
                layer.train()


class EnsemblePyfunc(PythonModel):
    """MLflow pyfunc: predict() returns a DataFrame with one probability column per class."""

    def load_context(self, context: PythonModelContext) -> None:
        """Load the ensemble from the model's ``ensemble`` artifact."""
        self.ensemble = TorchEnsemble.load(Path(context.artifacts["ensemble"]))

    # MLflow reads predict's type hints to infer a signature: context and params stay unannotated,
    # as in MLflow's own examples (annotating them makes it log "unsupported type hint" at import)
    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:  # noqa: ANN001
        """One probability column per class."""
        return self.ensemble.predict_frame(pd.DataFrame(model_input))


def log_ensemble(ensemble: TorchEnsemble, name: str = "ensemble") -> ModelInfo:
    """Log the ensemble as a pyfunc model in the active run; returns MLflow's ModelInfo.

    >>> with mlflow.start_run():  # doctest: +SKIP
    ...     info = log_ensemble(ensemble)  # doctest: +SKIP
    >>> info.model_uri  # doctest: +SKIP
    'models:/m-...'
    """
    import tempfile

    import mlflow
    from mlflow.models import infer_signature

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ensemble"
        ensemble.save(folder)
        example = pd.DataFrame(np.zeros((2, len(ensemble.features)), dtype=np.float64), columns=ensemble.features)
        signature = infer_signature(
            example,
            pd.DataFrame(np.full((2, len(ensemble.classes)), 1 / len(ensemble.classes)), columns=ensemble.classes),
        )
        return mlflow.pyfunc.log_model(
            name=name,
            python_model=EnsemblePyfunc(),
            artifacts={"ensemble": str(folder)},
            signature=signature,
            metadata=ensemble.metadata,
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", "consistency-gate"],
        )
