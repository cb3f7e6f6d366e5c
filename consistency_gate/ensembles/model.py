"""A trained ensemble as a predictor and as an MLflow pyfunc model.

:class:`TorchEnsemble` holds the members' weights, their validation accuracies, the recipe
that rebuilds them, its inputs (feature columns with their standardisation, or a tensor
shape) and the class names; it predicts class probabilities with a combination rule
(:mod:`consistency_gate.ensembles.combine`). :class:`EnsemblePyfunc` wraps it for the registry,
so ``check``, serving and ``mlflow.pyfunc.spark_udf`` load an ensemble version like any other
model, with the same signature as the models it replaces.
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
from consistency_gate.ensembles.recipes import RecipeSpec, build_module, code_paths
from consistency_gate.io.tensors import TensorInput, tensor_batch

if TYPE_CHECKING:
    from mlflow.models.model import ModelInfo
    from mlflow.pyfunc import PythonModelContext

try:
    from mlflow.pyfunc import PythonModel
except ImportError:  # pragma: no cover - mlflow is a dependency; keeps the core importable without it
    PythonModel = object


@dataclass
class TorchEnsemble:
    """Trained members (state dicts of one recipe), their weights and classes, and their input:
    feature columns with their standardisation (``mean``, ``std``), or, with ``features`` None,
    one tensor of ``input_shape`` per sample. Predicts combined class probabilities on CPU or CUDA."""

    recipe: RecipeSpec
    states: list[dict]
    weights: list[float]
    classes: list[str]
    features: list[str] | None
    mean: np.ndarray | None
    std: np.ndarray | None
    combination: str = "avg"
    mc_passes: int = 1
    metadata: dict = field(default_factory=dict)
    input_shape: tuple[int, ...] | None = None  # one sample's shape, for tensor inputs

    @property
    def tensor(self) -> TensorInput | None:
        """The tensor input the ensemble takes (None: feature columns)."""
        return None if self.features is not None else TensorInput((-1, *(self.input_shape or ())), "float32")

    def predict_proba(self, x: np.ndarray, batch_size: int = 8192) -> np.ndarray:
        """(n, classes) combined probabilities for raw inputs ``x`` (n, ...)."""
        device = "cuda" if torch.cuda.is_available() else "cpu"
        x = np.asarray(x, dtype=np.float32)
        if self.mean is not None:
            x = (x - self.mean) / self.std
        xs = torch.as_tensor(x, device=device)
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
        """One probability column per class, for the ensemble's feature columns of ``frame`` (for
        a tensor ensemble: its one array column, or all its columns, reshaped to the input)."""
        if self.features is None:
            x = tensor_batch(frame, self.tensor, frame.attrs.get("source", "model input"))
        else:
            missing = [c for c in self.features if c not in frame.columns]
            if missing:
                raise KeyError(f"the ensemble needs feature columns {missing}")
            x = frame[self.features].to_numpy(dtype=np.float32)
        return pd.DataFrame(self.predict_proba(x), columns=self.classes, index=frame.index)

    def save(self, folder: Path) -> None:
        """Write ``ensemble.json`` (everything but the weights) and ``members.pt`` into ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(self.states, folder / "members.pt")
        spec = {
            "recipe": self.recipe.to_dict(),
            "weights": self.weights,
            "classes": self.classes,
            "features": self.features,
            "input_shape": list(self.input_shape) if self.input_shape is not None else None,
            "mean": self.mean.tolist() if self.mean is not None else None,
            "std": self.std.tolist() if self.std is not None else None,
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
            None if spec["mean"] is None else np.asarray(spec["mean"], dtype=np.float32),
            None if spec["std"] is None else np.asarray(spec["std"], dtype=np.float32),
            spec["combination"],
            spec["mc_passes"],
            spec["metadata"],
            tuple(spec["input_shape"]) if spec.get("input_shape") is not None else None,
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
        """One probability column per class (a tensor ensemble takes an array as well)."""
        if isinstance(model_input, np.ndarray) and self.ensemble.features is None:
            probs = self.ensemble.predict_proba(model_input)
            return pd.DataFrame(probs, columns=self.ensemble.classes)
        return self.ensemble.predict_frame(pd.DataFrame(model_input))


def log_ensemble(ensemble: TorchEnsemble, name: str = "ensemble") -> ModelInfo:
    """Log the ensemble as a pyfunc model in the active run; returns MLflow's ModelInfo.

    Example::

        with mlflow.start_run():
            info = log_ensemble(ensemble)
        info.model_uri
        # 'models:/m-...'
    """
    import tempfile
    import warnings

    import mlflow
    from mlflow.models import infer_signature

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ensemble"
        ensemble.save(folder)
        if ensemble.features is None:  # the tensor signature of the models it replaces
            example = np.zeros((2, *(ensemble.input_shape or ())), dtype=np.float32)
        else:
            example = pd.DataFrame(np.zeros((2, len(ensemble.features))), columns=ensemble.features)
        signature = infer_signature(
            example,
            pd.DataFrame(np.full((2, len(ensemble.classes)), 1 / len(ensemble.classes)), columns=ensemble.classes),
        )
        with warnings.catch_warnings():  # it has a signature; MLflow would still ask for an input example
            warnings.filterwarnings("ignore", message=".*input example was not provided", category=UserWarning)
            return mlflow.pyfunc.log_model(
                name=name,
                python_model=str(Path(__file__).with_name("pyfunc_code.py")),  # models from code: nothing pickled
                artifacts={"ensemble": str(folder)},
                signature=signature,
                metadata=ensemble.metadata,
                code_paths=code_paths(ensemble.recipe) or None,
                pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", "consistency-gate"],
            )
