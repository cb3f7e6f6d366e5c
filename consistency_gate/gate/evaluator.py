"""The ``consistency`` evaluator for ``mlflow.models.evaluate`` (entry point group ``mlflow.model_evaluator``).

It predicts the evaluation data with the evaluated model (the candidate) and a baseline model, and
logs the consistency metrics, their interval bounds and the flip table into the evaluation's run,
beside MLflow's own metrics, so ``mlflow.validate_evaluation_results`` can gate on them::

    result = mlflow.models.evaluate(
        "models:/fraud-clf/4", data, targets="label", model_type="classifier",
        evaluators=["default", "consistency"],
        evaluator_config={"consistency": {"baseline_model": "models:/fraud-clf@champion"}},
    )
    mlflow.validate_evaluation_results(
        {"ctoi": MetricThreshold(threshold=0.02, greater_is_better=False)}, result
    )

Both generations are scored the way ``consistency-gate check`` scores them (class probabilities
from sklearn's ``predict_proba``, PyTorch logits softmaxed, pyfunc class-score frames), so the
metrics are the gate's own.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from mlflow.models.evaluation import EvaluationResult, ModelEvaluator
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from consistency_gate.core.evaluation import evaluate_frames, flip_table, usable_ks
from consistency_gate.errors import UsageError
from consistency_gate.gate.decision import reported_intervals, reported_metrics
from consistency_gate.mlops import registry, scoring, tracking

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.models.evaluation.base import EvaluationDataset
    from mlflow.pyfunc import PyFuncModel

ARTIFACT = "consistency_flips"  # the flip table's name among the evaluation's artifacts


class EvaluatorConfig(BaseModel):
    """``evaluator_config={"consistency": {...}}``: the baseline to compare with, and how to count."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    baseline_model: str = Field(description="URI of the previous generation, e.g. models:/fraud-clf@champion")
    candidate_model: str | None = Field(
        default=None,
        description="URI of the evaluated model, when it cannot be told from the logged model MLflow passes",
    )
    ks: tuple[int, ...] = Field(default=(1, 5), description="k values of the top-k metrics (ccon@K, cacc@K)")
    confidence: float = Field(default=0.95, gt=0, lt=1, description="level of the metrics' intervals")

    @classmethod
    def parse(cls, raw: dict) -> EvaluatorConfig:
        """The config, or a UsageError that names what is wrong in one line.

        >>> EvaluatorConfig.parse({"baseline_model": "models:/clf@champion"}).ks
        (1, 5)
        >>> EvaluatorConfig.parse({})
        Traceback (most recent call last):
        ...
        consistency_gate.errors.UsageError: evaluator_config['consistency']: baseline_model: Field required ...
        """
        try:
            return cls(**raw)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise UsageError(
                f"evaluator_config['consistency']: {problems} (e.g. {{'baseline_model': 'models:/NAME@champion'}})"
            ) from None


class ConsistencyEvaluator(ModelEvaluator):
    """Consistency of the evaluated classifier with a baseline model, as an MLflow evaluator."""

    name = "consistency"

    @classmethod
    def can_evaluate(cls, *, model_type: str, evaluator_config: dict, **kwargs: object) -> bool:
        """Classifiers only."""
        return model_type == "classifier"

    def evaluate(
        self,
        *,
        model_type: str,
        dataset: EvaluationDataset,
        run_id: str,
        evaluator_config: dict,
        model: PyFuncModel | None = None,
        model_id: str | None = None,
        **kwargs: object,
    ) -> EvaluationResult:
        """Predict the dataset with both generations; log the metrics and the flip table to ``run_id``."""
        import mlflow
        from mlflow import MlflowClient
        from mlflow.models.evaluation.artifacts import CsvEvaluationArtifact

        cfg = EvaluatorConfig.parse(evaluator_config or {})
        client = MlflowClient()
        candidate = _candidate_ref(client, cfg, model, model_id)
        baseline = registry.ref_from_uri(client, cfg.baseline_model)
        features = _features(dataset)
        frames = [scoring.predict(scoring.load_model(ref), features, ()) for ref in (baseline, candidate)]
        metrics, intervals, samples = _compare(frames, pd.Series(np.asarray(dataset.labels_data)), cfg)
        logged = {tracking.mlflow_metric_name(k): float(v) for k, v in metrics.items() if v is not None}
        logged |= {
            f"{tracking.mlflow_metric_name(k)}_{side}": float(bound)
            for k, pair in intervals.items()
            for side, bound in zip(("low", "high"), pair, strict=True)
        }
        client.log_batch(run_id, metrics=_metric_entities(logged, run_id, model_id, dataset))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{ARTIFACT}.csv"
            tracking.spreadsheet_safe(samples).to_csv(path, index=False)
            client.log_artifact(run_id, str(path))
        uri = mlflow.get_run(run_id).info.artifact_uri + f"/{path.name}"
        return EvaluationResult(logged, {ARTIFACT: CsvEvaluationArtifact(uri, samples)}, run_id)


def _candidate_ref(
    client: MlflowClient, cfg: EvaluatorConfig, model: PyFuncModel | None, model_id: str | None
) -> registry.ModelRef:
    """The evaluated model as the registry knows it (its version tags name classes and outputs)."""
    if cfg.candidate_model:
        return registry.ref_from_uri(client, cfg.candidate_model)
    model_id = model_id or getattr(model, "model_id", None)
    if not model_id:
        raise UsageError(
            "the consistency evaluator predicts with the evaluated model: pass a model URI to "
            "mlflow.models.evaluate, or name it with evaluator_config['consistency']['candidate_model']"
        )
    return registry.logged_model_ref(client, model_id)


def _features(dataset: EvaluationDataset) -> pd.DataFrame:
    """The evaluation features as a frame (MLflow gives an array for array data)."""
    data = dataset.features_data
    if isinstance(data, pd.DataFrame):
        return data.reset_index(drop=True)
    return pd.DataFrame(np.asarray(data), columns=list(dataset.feature_names))


def _compare(frames: list[pd.DataFrame], labels: pd.Series, cfg: EvaluatorConfig) -> tuple[dict, dict, pd.DataFrame]:
    """The reported metrics, their intervals and the flip table of baseline vs candidate scores."""
    widths = {"the baseline model": len(frames[0].columns), "the candidate model": len(frames[1].columns)}
    ks = usable_ks(cfg.ks if "ks" in cfg.model_fields_set else None, widths, "evaluator_config ks")
    evaluation = evaluate_frames(labels.reset_index(drop=True), frames, ks, where="the evaluation dataset")
    comparison = evaluation.result(confidence=cfg.confidence)
    metrics = reported_metrics(comparison.metrics, ks, first_generation=False)
    intervals = reported_intervals(comparison.intervals, metrics, first_generation=False)
    return metrics, intervals, flip_table(evaluation.samples(), np.arange(comparison.n))


def _metric_entities(values: dict[str, float], run_id: str, model_id: str | None, dataset: EvaluationDataset) -> list:
    """The metrics as MLflow entities linked to the evaluated model and dataset, as MLflow's own are."""
    from mlflow.entities import Metric
    from mlflow.utils.time import get_current_time_millis

    now = get_current_time_millis()
    return [Metric(key, value, now, 0, model_id, dataset.name, dataset.digest, run_id) for key, value in values.items()]
