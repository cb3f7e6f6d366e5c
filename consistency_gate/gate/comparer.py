"""What a gate holds while it runs (:class:`GateRun`) and how it decides on a candidate against the
baseline (:class:`Comparer`): the candidate itself, and each repair built in its place, are judged by
the same comparison, over the same evaluation set, in-process or on Spark.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from consistency_gate.core import names
from consistency_gate.core.evaluation import canonical_classes, evaluate_frames, flip_table, inapplicable_ks
from consistency_gate.core.history import Figures, answers, floor_figures
from consistency_gate.core.slices import TRUE_CLASS
from consistency_gate.core.threshold import BinaryDecision
from consistency_gate.engines.spark import SparkModel, gate_comparison
from consistency_gate.gate import config as gate_config
from consistency_gate.gate.decision import Decision
from consistency_gate.gate.history import Generation, champions_before, history_figures, pair_answers
from consistency_gate.gate.session import GateSession, version_description
from consistency_gate.mlops import registry, scoring
from consistency_gate.mlops.cost import ServingCost, serving_cost

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.data.dataset import Dataset

    from consistency_gate.gate.tuning import Split


@contextlib.contextmanager
def add_time(timings: dict[str, float], phase: str) -> Iterator[None]:
    """Add the time spent in the block to ``timings[phase]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[phase] = timings.get(phase, 0.0) + time.perf_counter() - start


@dataclass
class GateRun:
    """One gate's inputs and what it has done so far, shared by its steps."""

    session: GateSession
    cfg: gate_config.GateConfig
    cand_ref: registry.ModelRef
    base_ref: registry.ModelRef | None
    frame: pd.DataFrame
    data_path: Path
    label_column: str
    id_column: str | None
    promote: bool
    quiet: bool
    engine: str
    partitions: int | None
    timings: dict[str, float]
    measure_cost: bool = False  # measure the candidate's serving cost before any remediation asks
    dataset: Dataset | None = None  # the evaluation data as logged to the run (metrics are linked to it)
    cost: ServingCost | None = None  # the candidate's serving cost, once measured
    decision: BinaryDecision | None = None  # a binary model's answer at its threshold, once the classes are known
    floor_scores: pd.DataFrame | pd.Series | None = None  # the seed replica's scores on ``frame`` (floor:)
    split: Split | None = None  # the evaluation set held out to tune on and judged on (tuning_share:)

    @property
    def run_id(self) -> str:
        """The gate's MLflow run."""
        return self.session.run_id

    @property
    def client(self) -> MlflowClient:
        """The client of the gate's tracking store and registry."""
        return self.session.client

    def timed(self, phase: str) -> contextlib.AbstractContextManager[None]:
        """A block whose time is added to the gate's ``phase`` (the report's timings)."""
        return add_time(self.timings, phase)

    @property
    def data_slices(self) -> tuple[str, ...]:
        """The slicing columns read from the evaluation data (all but the built-in true class)."""
        return data_slices(self.cfg)

    @property
    def non_features(self) -> tuple[str, ...]:
        """The evaluation data's columns that no model reads: label, id, slicing columns."""
        return scoring.non_features(self.label_column, self.id_column, self.data_slices)

    def measure_candidate_cost(self, candidate: scoring.LoadedModel) -> None:
        """The candidate's serving cost, in ``self.cost``."""

        def predict(frame: pd.DataFrame) -> object:
            return scoring.predict(candidate, frame, self.non_features)

        with self.timed("cost"):
            self.cost = serving_cost(predict, self.frame, self.cand_ref.uri)

    def describe(self, version: str, decision: Decision, replaces: str = "", noun: str = "repair") -> None:
        """Lead registered ``version``'s description with what ``decision`` found (see
        :func:`~consistency_gate.gate.session.version_description`); ``noun``: what a repair is, in words."""
        base = self.base_ref.to_dict() if self.base_ref else None
        text = version_description(
            decision.verdict, decision.rules, (version, base), Path(self.data_path).name, decision.comparison.n,
            replaces, noun,
        )  # fmt: skip
        registry.describe_version(self.client, registry.ModelRef(self.cand_ref.name, version), text, self.run_id)


def binary_decision(configured: BinaryDecision | None, frames: list[pd.DataFrame | pd.Series]) -> BinaryDecision | None:
    """The answer of binary models at a threshold: the config's ``decision:`` block, else P(positive) >= 0.5
    with the candidate's second class positive (None for models of more classes; a UsageError when the
    block is configured for them). ``frames`` are the generations' scores, the candidate's last.

    >>> frames = [pd.DataFrame({"bad": [0.4], "good": [0.6]}), pd.DataFrame({"good": [0.3], "bad": [0.7]})]
    >>> binary_decision(None, frames).describe()
    'bad when P(bad) >= 0.5, else the other class'
    """
    scored = [f for f in frames if isinstance(f, pd.DataFrame)]
    classes = canonical_classes([list(f.columns) for f in scored])
    if len(classes) != 2 and configured is None:
        return None
    default_positive = str(scored[-1].columns[1]) if scored and scored[-1].shape[1] == 2 else None
    return (configured or BinaryDecision()).resolved(classes, default_positive)


def data_slices(cfg: gate_config.GateConfig) -> tuple[str, ...]:
    """The slicing columns read from the evaluation data (all but the built-in true class)."""
    return tuple(c for c in cfg.slices if c != TRUE_CLASS)


@dataclass
class Comparer:
    """Decides on candidates against the baseline, over the gate's evaluation set, in-process or on Spark.

    ``gate.frame`` is the whole evaluation set in-process, and the validated sample on Spark, where
    the models predict the whole file inside the Spark job instead.
    """

    gate: GateRun
    baseline: scoring.LoadedModel | None = None
    base_scores: pd.DataFrame | pd.Series | None = None  # the baseline's scores (or labels) on ``gate.frame``
    label_only: dict[str, str] = field(default_factory=dict)  # model URI -> why it answers with labels only
    single: Decision | None = None  # the candidate's own decision, once made (a repair's ItoC kept is against it)
    past: list[Generation] | None = None  # the champions before the baseline, read once (history rules)
    unread: dict[str, str] = field(default_factory=dict)  # why a champion of ``past`` has no answers
    replica: pd.DataFrame | None = None  # the seed replica's answers (floor:), once computed

    def decide(self, cand_scores: pd.DataFrame, cand_model: SparkModel, cost: dict | None = None) -> Decision:
        """The comparison and the rules' verdict: ``cand_scores`` are the candidate's scores on
        the gate's frame, ``cand_model`` says how Spark loads it (unused in-process), ``cost`` its
        serving cost relative to the candidate."""
        gate, cfg = self.gate, self.gate.cfg
        first_generation = self.base_scores is None
        frames = [cand_scores, cand_scores] if first_generation else [self.base_scores, cand_scores]
        names = [gate.cand_ref.uri] if first_generation else [self.baseline.ref.uri, gate.cand_ref.uri]
        scored = zip(names, frames[: len(names)], strict=True)
        widths = {name: len(f.columns) for name, f in scored if isinstance(f, pd.DataFrame)}
        counted = cfg.counted_ks(widths)
        plotted = range(1, min(10, *widths.values()) + 1) if widths else ()  # the top-k plot's
        ks = sorted(set(counted) | set(plotted))
        if gate.engine == "spark":
            base = [] if first_generation else [self.spark_model(self.baseline, self.base_scores)]
            comparison, samples = gate_comparison(
                gate.data_path,
                [*base, cand_model],
                label_column=gate.label_column,
                id_column=gate.id_column,
                ks=ks,
                partitions=gate.partitions,
                slices=cfg.slices,
                decision=gate.decision,
            )
            comparison.confidence, comparison.interval_method = cfg.confidence, cfg.interval_method
        else:
            frame = gate.frame
            slice_values = {c: frame[c] for c in gate.data_slices}
            evaluation = evaluate_frames(
                frame[gate.label_column], frames, ks, str(gate.data_path), cfg.slices, slice_values, gate.decision
            )
            comparison = evaluation.result(confidence=cfg.confidence, interval_method=cfg.interval_method)
            ids = frame[gate.id_column].to_numpy() if gate.id_column else np.arange(len(frame))
            samples = flip_table(evaluation.samples(), ids)
        comparison.add(inapplicable_ks(cfg.ks, widths))
        if not first_generation:
            comparison.add(self.figures(samples))
        return Decision.judge(comparison, cfg, samples, ks, first_generation, cost)

    def figures(self, samples: pd.DataFrame) -> Figures:
        """The metrics measured beside the comparison: over the champions' history when a
        rule names one, against the seed replica when a floor is configured."""
        gate, cfg = self.gate, self.gate.cfg
        figures = Figures()
        if cfg.needs_history:
            if self.past is None:
                self.past, self.unread = champions_before(gate.client, gate.cand_ref.name, gate.base_ref.version)
            level, method = cfg.confidence, cfg.interval_method
            figures.update(history_figures(cfg.rules, self.past, samples, level, method, self.unread))
        if gate.floor_scores is not None:
            if samples.empty:
                for key in names.FLOOR_METRICS:
                    figures.null(key, "needs every sample's answers, which --engine spark does not keep")
                return figures
            base, cand = pair_answers(samples)
            if self.replica is None:
                self.replica = self._answers_of(gate.floor_scores, samples["id"])
            figures.update(floor_figures(base, cand, self.replica, cfg.confidence))
        return figures

    def _answers_of(self, scores: pd.DataFrame | pd.Series, ids: pd.Series) -> pd.DataFrame:
        """A model's answers on the gate's frame (at the binary threshold, as the gate's own)."""
        gate = self.gate
        labels = gate.frame[gate.label_column]
        evaluation = evaluate_frames(labels, [scores, scores], [1], str(gate.data_path), decision=gate.decision)
        table = flip_table(evaluation.samples(), ids.to_numpy())
        return answers(table["id"], table["label"], table["candidate_prediction"])

    def spark_model(self, model: scoring.LoadedModel, scores: pd.DataFrame | pd.Series) -> SparkModel:
        """How Spark loads a registered version: its classes are those its scorer gave on the sample."""
        frame = scoring.feature_frame(model, self.gate.frame, self.gate.non_features)
        features = model.features or list(frame.columns)
        classes = list(scores.columns) if isinstance(scores, pd.DataFrame) else []  # label-only: never on Spark
        return SparkModel(model.ref.uri, model.flavor, classes, features)
