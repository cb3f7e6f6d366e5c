"""The gate: compare a candidate model version with the previous generation and decide.

:func:`run_gate` is the Python API a pipeline step calls; ``consistency-gate check`` is a
thin shell over it. It loads both generations from the MLflow Model Registry, validates
the evaluation data (great-expectations), predicts, computes the consistency
metrics, applies the configured rules, logs everything to one MLflow run, tags the
candidate version and, with ``promote=True`` and a pass, moves the baseline alias.

    result = run_gate("digits", data="eval.csv", tracking_uri="sqlite:///mlflow.db")
    result.verdict            # 'passed' or 'failed'
    result.exit_code          # 0 or 1
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from consistency_gate.core.evaluation import canonical_classes, evaluate_frames, flip_table, usable_ks
from consistency_gate.core.history import Figures, answers, floor_figures
from consistency_gate.core.slices import TRUE_CLASS
from consistency_gate.core.threshold import BinaryDecision
from consistency_gate.engines.spark import SparkModel, gate_comparison
from consistency_gate.ensembles.config import REMEDIATION_KINDS, REPAIR_METHODS, RemediationConfig, remediation_kind
from consistency_gate.errors import DataError, ModelError, UsageError, redact_credentials
from consistency_gate.gate import rules
from consistency_gate.gate.decision import Decision
from consistency_gate.gate.history import (
    Generation,
    champions_before,
    gate_history,
    history_figures,
    last,
    pair_answers,
)
from consistency_gate.gate.result import NOTHING_TO_DECIDE, GateResult
from consistency_gate.gate.session import GateSession, version_description
from consistency_gate.io import predictions as io
from consistency_gate.io.tensors import array_column, tensor_batch
from consistency_gate.mlops import registry, scoring, tracking
from consistency_gate.mlops.cost import ServingCost, model_size_mb, predict_latency
from consistency_gate.report.tables import attempt_line

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.data.dataset import Dataset
    from mlflow.models.model import ModelInfo

    from consistency_gate.ensembles.repair import Repair

DEFAULT_BASELINE = "@champion"
IN_MEMORY = "DataFrame"  # how errors, params and the logged dataset name evaluation data given in memory
# with --engine spark the driver validates (great-expectations) and diagnoses this many first rows
SPARK_SAMPLE_ROWS = 10_000


@contextlib.contextmanager
def _timed(timings: dict[str, float], phase: str) -> Iterator[None]:
    """Add the time spent in the block to ``timings[phase]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[phase] = timings.get(phase, 0.0) + time.perf_counter() - start


@dataclass
class _GateRun:
    """One gate's inputs and what it has done so far, shared by its steps."""

    session: GateSession
    cfg: rules.GateConfig
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

    @property
    def run_id(self) -> str:
        return self.session.run_id

    @property
    def client(self) -> MlflowClient:
        return self.session.client

    def timed(self, phase: str) -> contextlib.AbstractContextManager[None]:
        return _timed(self.timings, phase)

    @property
    def data_slices(self) -> tuple[str, ...]:
        """The slicing columns read from the evaluation data (all but the built-in true class)."""
        return _data_slices(self.cfg)

    @property
    def non_features(self) -> tuple[str, ...]:
        """The evaluation data's columns that no model reads: label, id, slicing columns."""
        return scoring.non_features(self.label_column, self.id_column, self.data_slices)


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


def _data_slices(cfg: rules.GateConfig) -> tuple[str, ...]:
    return tuple(c for c in cfg.slices if c != TRUE_CLASS)


def run_gate(
    model: str,
    data: str | Path | pd.DataFrame,
    *,
    candidate: str | None = None,
    baseline: str | None = None,
    label_column: str = "label",
    id_column: str | None = None,
    config: str | Path | rules.GateConfig | None = None,
    tracking_uri: str | None = None,
    report_path: str | Path | None = None,
    promote: bool = False,
    quiet: bool = False,
    engine: str = "local",
    partitions: int | None = None,
    cost: bool = False,
    floor: str | None = None,
) -> GateResult:
    """Run the gate on registered model ``model``; see the module docstring.

    ``candidate`` is a version number or ``@alias`` (default: the latest version);
    ``baseline`` an ``@alias`` or version (default ``@champion``; if that alias is not set
    yet, the candidate is a first generation and only single-model rules are checked).
    ``data`` is a file (CSV, Parquet, ``.npz``) or a pandas DataFrame with the same columns.
    ``engine="spark"`` predicts and counts on Apache Spark (``mlflow.pyfunc.spark_udf``), for
    evaluation sets past one machine; the driver then reads only the first ``SPARK_SAMPLE_ROWS``
    rows, to validate them and for the two-generation diagnosis. The candidate's serving cost
    (timed predictions, size on disk) is measured when ``cost`` is True, a rule is on a cost
    metric, or remediation builds something whose cost is compared with it. ``floor`` (or the
    config's ``floor:``) names a seed replica of the baseline, a version or ``@alias`` of the model:
    the report then gives the churn no retrain avoids and ``ctoi_excess`` (SPEC 5).
    Raises a :class:`~consistency_gate.errors.GateError` with its exit code (2 usage, 3 data,
    4 model, 5 tracking) on error.

    Example::

        result = run_gate("fraud-clf", "eval.parquet", config="gate.yaml")
        result.verdict, result.exit_code, result.intervals["ctoi"]
        # ('failed', 1, [0.019, 0.031])
    """
    with GateSession(report_path) as session:
        if engine not in ("local", "spark"):
            raise UsageError(f"engine must be 'local' or 'spark', got {engine!r}")
        timings: dict[str, float] = {}
        cfg = config if isinstance(config, rules.GateConfig) else rules.load_config(config)
        if floor is not None:
            cfg = replace(cfg, floor=str(floor))
        _, client = session.connect(tracking_uri)

        with _timed(timings, "registry"):
            cand_ref, base_ref = _versions(client, model, candidate, baseline)
        if base_ref is not None and base_ref.version == cand_ref.version:
            return session.finish(_same_version(cand_ref, base_ref))
        if isinstance(data, pd.DataFrame):
            if engine == "spark":
                raise UsageError("engine='spark' reads the evaluation data from a file (Parquet or CSV); give its path")
            frame = io.evaluation_frame(data, label_column, id_column, _data_slices(cfg), IN_MEMORY)
            data = IN_MEMORY
        else:
            sample = SPARK_SAMPLE_ROWS if engine == "spark" else None
            slices = _data_slices(cfg)
            frame = io.read_evaluation_data(Path(data), label_column, id_column, max_rows=sample, slices=slices)

        name = cand_ref.name
        session.start(tracking.experiment_name(name), f"gate {name} v{cand_ref.version}", owner=name)
        gate = _GateRun(
            session, cfg, cand_ref, base_ref, frame, Path(data), label_column, id_column, promote, quiet, engine,
            partitions, timings, measure_cost=cost or any(r.metric in rules.COST_METRICS for r in cfg.rules),
        )  # fmt: skip
        return session.finish(_gate_in_run(gate))


def _versions(
    client: MlflowClient, model: str, candidate: str | None, baseline: str | None
) -> tuple[registry.ModelRef, registry.ModelRef | None]:
    """The candidate version and the baseline (None: a first generation, when the default
    ``@champion`` is not set yet and the model has no version before the candidate; with earlier
    versions that may be in production a missing alias is a ModelError, not a silent pass on
    single-model rules; versions a gate failed never were)."""
    cand_ref = registry.resolve_version(client, model, None if candidate is None else str(candidate))
    base_spec = str(baseline or DEFAULT_BASELINE)
    if baseline is None and not registry.alias_exists(client, model, base_spec[1:]):
        earlier = registry.possible_baselines(client, model, int(cand_ref.version))
        if earlier:  # a model with history and no alias: a mis-wired baseline, never a silent first generation
            raise ModelError(
                f"model '{model}' has earlier versions ({', '.join(map(str, earlier[-5:]))}) but no version holds "
                f"{base_spec}, so v{cand_ref.version} has no baseline to be gated against: pass --baseline VERSION "
                f"(e.g. --baseline {earlier[-1]}), or set the alias on the version in production "
                f"(MlflowClient().set_registered_model_alias('{model}', '{base_spec[1:]}', VERSION))"
            )
        return cand_ref, None
    return cand_ref, registry.resolve_version(client, model, base_spec)


def _same_version(cand_ref: registry.ModelRef, base_ref: registry.ModelRef) -> GateResult:
    """The candidate is the baseline itself: nothing to decide, so no run, no tag, no promotion."""
    against = f"@{base_ref.alias}" if base_ref.alias else f"v{base_ref.version}"
    return GateResult(
        verdict=NOTHING_TO_DECIDE,
        rules=[],
        metrics={},
        run_id=None,
        candidate=cand_ref.to_dict(),
        baseline=base_ref.to_dict(),
        null_reasons={"*": f"the candidate v{cand_ref.version} is the baseline {against} itself"},
    )


@dataclass
class _Comparer:
    """Decides on candidates against the baseline, over the gate's evaluation set, in-process or on Spark.

    ``gate.frame`` is the whole evaluation set in-process, and the validated sample on Spark, where
    the models predict the whole file inside the Spark job instead.
    """

    gate: _GateRun
    baseline: scoring.LoadedModel | None = None
    base_scores: pd.DataFrame | pd.Series | None = None  # the baseline's scores (or labels) on ``gate.frame``
    label_only: dict[str, str] = field(default_factory=dict)  # model URI -> why it answers with labels only
    single: Decision | None = None  # the candidate's own decision, once made (a repair's ItoC kept is against it)
    past: list[Generation] | None = None  # the champions before the baseline, read once (history rules)
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
        counted = usable_ks(cfg.ks if cfg.ks_given else None, widths, f"{cfg.source}: ks")
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
        if not first_generation:
            comparison.add(self.figures(samples))
        return Decision.judge(comparison, cfg, samples, ks, first_generation, cost)

    def figures(self, samples: pd.DataFrame) -> Figures:
        """The metrics measured beside the comparison (SPEC 5): over the champions' history when a
        rule names one, against the seed replica when a floor is configured."""
        gate, cfg = self.gate, self.gate.cfg
        figures = Figures()
        if cfg.needs_history:
            if self.past is None:
                self.past = champions_before(gate.client, gate.cand_ref.name, gate.base_ref.version)
            figures.update(history_figures(cfg.rules, self.past, samples, cfg.confidence, cfg.interval_method))
        if gate.floor_scores is not None:
            if samples.empty:
                for key in rules.FLOOR_METRICS:
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


def _gate_in_run(gate: _GateRun) -> GateResult:
    """The gate inside its run: load, validate, predict, decide, tag, remediate, promote."""
    cfg, cand_ref, base_ref, frame = gate.cfg, gate.cand_ref, gate.base_ref, gate.frame
    _log_params(gate)
    with gate.timed("registry"):
        models = [scoring.load_model(ref, cfg.classes) for ref in ([base_ref] if base_ref else []) + [cand_ref]]
    tensors = [m.ref.uri for m in models if _takes_shaped_tensors(m, gate)]
    if gate.engine == "spark" and tensors:
        raise UsageError(
            f"{tensors[0]} takes each sample as an array (a tensor input); --engine spark gates models with column "
            "signatures: gate it with --engine local, or on prediction files (--candidate-predictions)"
        )
    with gate.timed("validation"):
        _validate(gate, models)
    with gate.timed("logging"):
        if gate.engine == "spark":  # the whole file, as the Spark job reads it
            from consistency_gate.engines.spark import read_table, spark_session

            table = read_table(spark_session(gate.partitions), gate.data_path)
            gate.dataset = tracking.log_spark_evaluation_data(table, gate.data_path, gate.label_column)
        else:
            gate.dataset = tracking.log_evaluation_data(frame, gate.data_path, gate.label_column)
    with gate.timed("predict"):  # on Spark: the sample only (classes, diagnosis); the job predicts the rest
        frames = [scoring.predict(m, frame, gate.non_features) for m in models]
    label_only = {m.ref.uri: why for m, f in zip(models, frames, strict=True) if (why := scoring.label_only(f))}
    if label_only and gate.engine == "spark":
        raise UsageError(
            f"{next(iter(label_only))} answers with class labels only; --engine spark gates models that give class "
            "scores: gate it with --engine local"
        )
    if gate.measure_cost:
        _measure_cost(gate, models[-1])
    if cfg.floor is not None and base_ref is not None:
        with gate.timed("predict"):
            gate.floor_scores = _replica_scores(gate)
    gate.decision = binary_decision(cfg.decision, frames)
    base_scores = frames[0] if base_ref else None
    comparer = _Comparer(gate, models[0] if base_ref else None, base_scores, label_only)
    with gate.timed("metrics"):
        cost = gate.cost.metrics(gate.cost) if gate.cost else None
        single = comparer.decide(frames[-1], comparer.spark_model(models[-1], frames[-1]), cost)
        comparer.single = single
    baseline = base_ref.to_dict() if base_ref else None
    result = GateResult.of(single, cand_ref.to_dict(), baseline, gate.run_id)
    result.decision = gate.decision.to_dict() if gate.decision else None
    if label_only:  # said once, for every generation that gives labels only
        which = " and ".join(f"{uri} ({why})" for uri, why in label_only.items())
        result.warnings.append(
            f"class labels only from {which}: gated on what labels allow (agreement, flips, accuracy, BTC/BEC, "
            "rel_nfr); top-k, Pearson and cosine are null, and repairs that need class scores are skipped"
        )
    if base_ref and base_ref.model_id and base_ref.model_id == cand_ref.model_id:
        result.warnings.insert(
            0,
            f"the candidate v{cand_ref.version} and the baseline v{base_ref.version} are the same logged model "
            f"({cand_ref.model_id}): the same model registered twice",
        )
    with gate.timed("logging"):
        if comparer.past is not None and not single.samples.empty:  # a rule on the history: draw it
            _log_history(gate, comparer.past, single)
        single.log(cand_ref.model_id, gate.dataset)
        diagnosis = None if base_scores is None else _log_diagnosis(base_scores, frames[-1], frame[gate.label_column])
        side = _side_comparison(gate)
        if side:
            result.warnings.append(side)
        else:
            registry.tag_version(gate.client, cand_ref, single.verdict, _kind(cand_ref), gate.run_id)
            _describe(gate, cand_ref.version, single)
    promoted_version = cand_ref.version if single.verdict == "passed" else None
    if single.verdict == "failed" and cfg.remediation is not None:
        if not gate.quiet:  # why remediation runs now, before it does (the rule table comes with the verdict)
            failed = "; ".join(r.rule.describe() for r in single.rules if r.held is False)
            print(
                f"The candidate failed: {_remediation_plan(cfg.remediation)} ... (failed rules: {failed})",
                file=sys.stderr,
                flush=True,
            )
        if gate.cost is None:  # what remediation builds is weighed against the candidate's cost
            _measure_cost(gate, models[-1])
            result.cost = gate.cost.metrics(gate.cost)
        with gate.timed("remediation"):
            result.ensemble, result.attempts = _remediate_in_turn(gate, comparer, models[-1], frames[-1])
        if result.ensemble is not None:  # None: every method was skipped (the attempts say why)
            result.verdict = "passed" if result.ensemble["verdict"] == "passed" else "failed"
            result.registered_version = result.ensemble["registered_version"]
        promoted_version = result.registered_version
    with gate.timed("logging"):
        versions = {"candidate": cand_ref.version, "baseline": base_ref.version if base_ref else None}
        result.links = tracking.ui_links(
            gate.session.uri,
            gate.session.experiment_id,
            gate.run_id,
            cand_ref.name,
            {**versions, "registered": result.registered_version},
        )
        gate.session.log_verdict(result, single, diagnosis)  # everything is logged before an alias moves
    if gate.promote and promoted_version is not None:
        with gate.timed("promotion"):
            _promote(gate, result, promoted_version, lambda: gate.session.log_report(result, single, diagnosis))
    result.timings = dict(gate.timings)
    return result


def _promote(gate: _GateRun, result: GateResult, version: str, record: Callable[[], None]) -> None:
    """Move the baseline alias to ``version``, the gate's last act, and ``record`` the outcome in
    the run. The registry is the truth: a fault while recording it is a warning in the report
    (``promoted`` as read back), never an error that hides what the alias holds."""
    base_ref = gate.base_ref
    alias = (base_ref.alias if base_ref else None) or DEFAULT_BASELINE[1:]
    expected = base_ref.version if base_ref else None
    promotion = registry.promote(gate.client, gate.cand_ref.name, alias, version, expected, gate.run_id)
    result.promoted, result.promotion = promotion.promoted, promotion.to_dict()
    try:
        record()
    except Exception as exc:  # noqa: BLE001 - MLflow and requests raise many kinds; the alias is what it is
        holds = f"v{promotion.holds}" if promotion.holds not in (None, "unknown") else promotion.holds or "unset"
        result.warnings.append(
            f"@{alias} holds {holds} (read back from the registry), but the run could not record the promotion "
            f"({type(exc).__name__}: {redact_credentials(str(exc))[:300]}): its tags and report.json predate it"
        )


def _replica_scores(gate: _GateRun) -> pd.DataFrame | pd.Series:
    """The seed replica's scores (``floor:``, a version or @alias of the model, or its prediction file)
    on the gate's frame."""
    spec = gate.cfg.floor
    if spec.lower().endswith((".csv", ".parquet")):
        return _replica_file(gate, Path(spec))
    spec = spec[1:] if spec[:1] == "v" and spec[1:].isdigit() else spec  # v7 as 7
    ref = registry.resolve_version(gate.client, gate.cand_ref.name, spec)
    if ref.version in (gate.cand_ref.version, gate.base_ref.version):
        raise UsageError(
            f"floor: v{ref.version} is the {'candidate' if ref.version == gate.cand_ref.version else 'baseline'}; "
            "the floor is a replica of the baseline trained with another seed, registered as its own version"
        )
    replica = scoring.load_model(ref, gate.cfg.classes)
    return scoring.predict(replica, gate.frame, gate.non_features)


def _replica_file(gate: _GateRun, path: Path) -> pd.DataFrame | pd.Series:
    """A replica's prediction file (SPEC 6's format: a column per class, or ``prediction``) in the
    order of the gate's frame: by ``--id-column`` when the gate has one (every id of the evaluation data
    needed), else by position (as many rows). DataError naming the file otherwise."""
    source = io.inspect_prediction_file(path, gate.id_column)
    text = (gate.id_column,) if gate.id_column else ()
    frame = pd.concat(list(io.iter_frames(path, source.columns, text_columns=text)), ignore_index=True)
    if gate.id_column:
        frame = frame.set_index(io.unique_ids(frame[gate.id_column], path, gate.id_column))
        wanted = gate.frame[gate.id_column].astype(str)
        absent = wanted[~wanted.isin(frame.index)]
        if len(absent):
            raise DataError(
                f"{path}: the floor's predictions lack id {absent.iloc[0]!r} of the evaluation data "
                f"({len(absent)} ids in all); predict the replica on every sample of the evaluation set"
            )
        frame = frame.loc[wanted.to_numpy()].reset_index(drop=True)
    elif len(frame) != len(gate.frame):
        raise DataError(
            f"{path}: {len(frame)} rows of floor predictions for {len(gate.frame)} evaluation samples; without "
            "--id-column they align by position: predict every sample, in order, or give --id-column"
        )
    if not source.has_scores:
        return io.hard_labels(frame, source).set_axis(gate.frame.index)
    return frame[list(source.classes)].astype(np.float64).set_axis(gate.frame.index)


def _measure_cost(gate: _GateRun, candidate: scoring.LoadedModel) -> None:
    """The candidate's serving cost, in ``gate.cost``."""

    def predict(frame: pd.DataFrame) -> object:
        return scoring.predict(candidate, frame, gate.non_features)

    with gate.timed("cost"):
        gate.cost = _serving_cost(predict, gate.frame, gate.cand_ref.uri)


def _takes_shaped_tensors(model: scoring.LoadedModel, gate: _GateRun) -> bool:
    """Whether a model takes samples as arrays (an array column, or a tensor of more than one
    dimension per sample), which ``--engine spark`` does not feed."""
    if model.features:
        return False
    if model.tensor is not None and len(model.tensor.shape) > 2:
        return True
    return array_column(scoring.feature_frame(model, gate.frame, gate.non_features)) is not None


def _serving_cost(
    predict: Callable[[pd.DataFrame], object], frame: pd.DataFrame, model_uri: str, members: int = 1
) -> ServingCost:
    """A model's serving cost predicting ``frame`` (its size None where the store will not list it)."""
    try:
        size = model_size_mb(model_uri)
    except Exception:  # noqa: BLE001 - the size is reported, never needed: a store that cannot list gives none
        size = None
    return ServingCost(predict_latency(predict, frame), size, members)


def _log_params(gate: _GateRun) -> None:
    """The gate's inputs as run params, and its rules as ``gate/config.json``."""
    import mlflow

    base_ref, cfg = gate.base_ref, gate.cfg
    mlflow.log_params(
        {
            "model": gate.cand_ref.name,
            "candidate_version": gate.cand_ref.version,
            "baseline_version": base_ref.version if base_ref else "none (first generation)",
            "baseline_alias": base_ref.alias if base_ref else "",
            "data": str(gate.data_path),
            "n_rows": len(gate.frame)
            if gate.engine == "local"
            else f"spark (validated on the first {len(gate.frame)})",
            "label_column": gate.label_column,
            "engine": gate.engine,
            "config": cfg.source,
            "remediation": ", ".join(cfg.remediation.methods) if cfg.remediation else "off",
        }
    )
    tracking.log_json([{"metric": r.metric, r.kind: r.threshold} for r in cfg.rules], "gate/config.json")


def _log_diagnosis(base_scores: pd.DataFrame, cand_scores: pd.DataFrame, labels: pd.Series) -> dict:
    """Log the two-generation `diagnose` report, so a reviewer sees why the candidate flipped; returns it."""
    from consistency_gate.diagnostics.diagnose import diagnose, frames_to_arrays

    names, probs, y, classes = frames_to_arrays(
        {"previous": base_scores, "candidate": cand_scores}, labels.astype(str).reset_index(drop=True)
    )
    report = diagnose(names, probs, y, classes)
    tracking.log_json(report, "gate/diagnose.json")
    import mlflow

    mlflow.log_text("\n".join(f"- {line}" for line in report["explanation"]), "gate/diagnose.md")
    return report


def _log_history(gate: _GateRun, past: list[Generation], decision: Decision) -> None:
    """``gate/history.json``: the champions' updates and the candidate's, and their curve beside the
    decision's plots (``gate/plots/history.png``, in the HTML report too)."""
    from consistency_gate.report.plots import history_curve, png_bytes

    versions = (gate.base_ref.version, gate.cand_ref.version)
    report = gate_history(gate.cand_ref.name, past, decision.samples, versions, gate.cfg.confidence)
    tracking.log_json(report, "gate/history.json")
    decision.pngs["history.png"] = png_bytes(history_curve(report))


def _describe(gate: _GateRun, version: str, decision: Decision, replaces: str = "") -> None:
    """Lead registered ``version``'s description with what ``decision`` found (see
    :func:`~consistency_gate.gate.session.version_description`)."""
    base = gate.base_ref.to_dict() if gate.base_ref else None
    text = version_description(
        decision.verdict, decision.rules, base, Path(gate.data_path).name, decision.comparison.n, gate.run_id, replaces
    )
    registry.describe_version(gate.client, registry.ModelRef(gate.cand_ref.name, version), text)


def _side_comparison(gate: _GateRun) -> str | None:
    """Why this gate's verdict stays in its run and off the candidate's tags (None: it goes on them).

    A version's tags say what the gate that decides its production fate found: a promoting gate, a
    first generation's, or a gate against a baseline alias (the version it holds now). A baseline
    given by number is a side comparison unless it holds @champion: a what-if comparison (the
    production version against an older one) must not rewrite the production version's verdict.
    """
    base_ref, cand_ref = gate.base_ref, gate.cand_ref
    if gate.promote or base_ref is None or base_ref.alias:
        return None
    alias = DEFAULT_BASELINE[1:]
    holder = registry.read_alias(gate.client, cand_ref.name, alias)
    if holder == base_ref.version:
        return None
    now = f"v{holder} is" if holder else "no version is"
    return (
        f"v{cand_ref.version} was gated against v{base_ref.version}, and {now} @{alias}: a side comparison, so "
        f"v{cand_ref.version}'s tags are left as they were (this run holds its verdict)"
    )


def _kind(ref: registry.ModelRef) -> str:
    """The kind remediation tagged a version it registered with ('ensemble' or 'distilled'), else 'single'."""
    kind = ref.tags.get(registry.TAG_KIND)
    return kind if kind in REMEDIATION_KINDS else "single"


def _remediation_plan(remediation: RemediationConfig) -> str:
    """What remediation is about to train, for the line printed before it does."""
    methods = remediation.methods
    if len(methods) > 1:
        return f"trying {', '.join(methods)} in turn until one passes"
    settings = remediation.settings
    if methods[0] in REPAIR_METHODS:
        return f"correcting it with the previous generation ({methods[0]}, no training) to gate in its place"
    if remediation_kind(methods[0]) == "distilled":
        return f"training a {methods[0]} model to gate in its place"
    return f"training a {methods[0]} ensemble of {settings.m} members to gate in its place"


def _remediate_in_turn(
    gate: _GateRun, comparer: _Comparer, cand_model: scoring.LoadedModel, cand_scores: pd.DataFrame
) -> tuple[dict | None, list[dict]]:
    """Try the configured methods in turn (:attr:`RemediationConfig.methods`), each in its own nested
    run, until one passes and is registered; returns the last attempt's report (None when every
    method was skipped) and a summary row per attempt. A method that lacks what it needs (a previous
    generation, class scores, training data, more classes than its k) is reported as skipped with the
    reason, not as an error; a repair that is a rollback is reported as such and the next one tried."""
    remediation = gate.cfg.remediation
    methods = remediation.methods
    report, attempts = None, []
    classes = _classes_of(cand_scores, gate.frame[gate.label_column])
    for method in methods:
        skipped = _missing_for(method, comparer, remediation, len(classes))
        if skipped:
            attempts.append({"method": method, "verdict": "skipped", "note": skipped})
            if not gate.quiet:
                print(f"{method}: skipped ({skipped})", file=sys.stderr, flush=True)
            continue
        settings = remediation.for_method(method)
        if method == "bayesian-update":
            report = _bayes_repair(gate, comparer, cand_model, cand_scores, settings)
        elif method in REPAIR_METHODS:
            report = _repair(gate, comparer, cand_model, cand_scores, settings)
        else:
            report = _remediate(gate, comparer, cand_model, classes, settings)
        attempts.append(_attempt_summary(report))
        if len(methods) > 1 and not gate.quiet:
            print(f"{method}: {attempt_line(attempts[-1])}", file=sys.stderr, flush=True)
        if report["verdict"] == "passed":
            break
    return report, attempts


def _classes_of(scores: pd.DataFrame | pd.Series, labels: pd.Series) -> list[str]:
    """The classes what remediation builds answers in: the candidate's score columns, or for a label-only
    candidate the labels it and the evaluation set name (sorted as text)."""
    if isinstance(scores, pd.DataFrame):
        return list(scores.columns)
    return sorted({str(c) for c in scores.unique()} | {str(c) for c in labels.unique()})


def _missing_for(method: str, comparer: _Comparer, remediation: RemediationConfig, n_classes: int) -> str | None:
    """Why ``method`` cannot run here (None: it can): a repair and focal distillation learn from the
    previous generation's class scores (and a repair from the candidate's too); ``rerank`` picks among
    k < ``n_classes`` classes (of two, the previous generation's pick would be its own answer: a
    rollback); every method but a repair trains on data."""
    from consistency_gate.ensembles.repair import KS

    if method == "rerank" and (n_classes <= min(KS) or (remediation.k is not None and remediation.k >= n_classes)):
        k = remediation.k if remediation.k is not None else min(KS)
        return (
            f"rerank needs k < the number of classes, and k is {k} for {n_classes} classes: re-ranking every class "
            "by the previous generation is the previous generation (a rollback)"
        )
    learns_from_previous = method in REPAIR_METHODS or method == "focal-distillation"
    if comparer.baseline is None and learns_from_previous:
        return "no previous generation to learn from"
    if method == "bayesian-update":  # answers are enough; the generations' confusion matrices need labelled data
        if remediation.calibration is None and remediation.data is None:
            return (
                "it estimates each generation's confusion matrix on labelled data other than the evaluation set: "
                "name it with calibration: in the remediation block"
            )
        return None
    if learns_from_previous:
        needed = comparer.label_only if method in REPAIR_METHODS else [comparer.baseline.ref.uri]
        scoreless = [uri for uri in comparer.label_only if uri in needed]
        if scoreless:
            return f"it needs class scores and {scoreless[0]} gives class labels only"
    if method not in REPAIR_METHODS and not remediation.can_train:
        return "it trains, and the remediation block names no training data (data:, or a recipe of your own)"
    return None


def _attempt_summary(report: dict) -> dict:
    """One remediation attempt in a row: what it built, its verdict, what it buys and what it costs."""
    metrics, cost = report["metrics"], report.get("cost") or {}
    return {
        "method": report["method"],
        "kind": report["kind"],
        "verdict": report["verdict"],
        "con": metrics.get("con"),
        "ctoi": metrics.get("ctoi"),
        "acc": metrics.get("acc_candidate"),
        "itoc_kept": report.get("itoc_kept"),
        "failed_rules": [f"{r['quantity']} {r['condition']}" for r in report["rules"] if r["held"] is False],
        "members": report["members"],
        "latency_ratio": cost.get("latency_ratio"),
        "train_seconds": report["train_seconds"],
        "run_id": report["run_id"],
        "registered_version": report["registered_version"],
        **({"note": report["note"]} if "note" in report else {}),
    }


def _remediate(
    gate: _GateRun,
    comparer: _Comparer,
    cand_model: scoring.LoadedModel,
    classes: list[str],
    remediation: RemediationConfig,
) -> dict:
    """Train ``remediation``'s ensemble (or distilled model) in a nested run, gate it, and register it
    if it passes; ``classes`` are the candidate's (a recipe's class indices name them). The baseline
    is the teacher of ``focal-distillation``: it predicts the training samples."""
    from consistency_gate.ensembles.model import log_ensemble
    from consistency_gate.ensembles.remediation import log_build, train_ensemble

    frame, data_path = gate.frame, gate.data_path
    method = remediation.settings.method
    with gate.session.child_run(f"remediation: {method}") as child_run_id:
        input_shape = cand_model.tensor.shape[1:] if cand_model.tensor is not None else None
        baseline = comparer.baseline
        teacher = None if baseline is None else (lambda f: scoring.predict(baseline, f, gate.non_features))
        ensemble, build = train_ensemble(
            remediation, cand_model.features, gate.non_features, gate.quiet, classes, input_shape, teacher
        )
        log_build(build)
        model_info = log_ensemble(ensemble)
        missing = [c for c in ensemble.features or [] if c not in frame.columns]
        if missing:
            raise DataError(f"{data_path}: the ensemble's feature column '{missing[0]}' is missing")
        features = frame.drop(columns=[c for c in gate.non_features if c in frame.columns])
        scores = ensemble.predict_frame(features)
        cost = _serving_cost(ensemble.predict_frame, features, model_info.model_uri, len(build.members))
        built = {"members": len(build.members), "runs": len(build.runs), "kappa": build.kappa}
        return _judge_attempt(
            gate, comparer, method, model_info, scores, ensemble.features, cost,
            {**built, "train_seconds": build.seconds, "run_id": child_run_id},
        )  # fmt: skip


def _judge_attempt(
    gate: _GateRun,
    comparer: _Comparer,
    method: str,
    model_info: ModelInfo,
    scores: pd.DataFrame,
    features: list[str] | None,
    cost: ServingCost,
    built: dict,
) -> dict:
    """Gate what an attempt built (its ``scores`` on the evaluation set, its serving ``cost``) with the
    same rules against the same baseline, log the decision in the attempt's run, and register it if it
    passes; returns the attempt's report (``built``: what it built and what that took)."""
    spark_model = SparkModel(model_info.model_uri, "pyfunc", list(scores.columns), list(features or []))
    decision = comparer.decide(scores, spark_model, cost.metrics(gate.cost))
    rollback = comparer.baseline is not None and decision.metrics.get("con") == 1.0
    report = {
        "verdict": "rollback" if rollback else decision.verdict,
        **(
            {
                "note": f"its answers equal the previous generation's (v{gate.base_ref.version}) on every sample: "
                "a rollback at the cost of both models, not a repair; it is not registered"
            }
            if rollback
            else {}
        ),
        "itoc_kept": _itoc_kept(comparer.single, decision),
        "rules": [r.to_dict() for r in decision.rules],
        "metrics": decision.metrics,
        "intervals": decision.intervals,
        "tests": decision.tests,
        **({"slices": decision.slices} if decision.slices is not None else {}),
        "cost": decision.cost,
        "method": method,
        "kind": remediation_kind(method),
        **built,
        "registered_version": None,
    }
    decision.log(model_info.model_id, gate.dataset)
    if report["verdict"] == "passed":
        cand_ref = gate.cand_ref
        version = registry.register_version(model_info.model_uri, cand_ref.name)
        registry.tag_version(
            gate.client, registry.ModelRef(cand_ref.name, version), "passed", report["kind"], gate.run_id,
            replaces=cand_ref.version,
        )  # fmt: skip
        _describe(gate, version, decision, replaces=cand_ref.version)
        report["registered_version"] = version
    tracking.log_json(report, "gate/report.json")
    return report


def _itoc_kept(single: Decision | None, attempt: Decision) -> float | None:
    """The share of the candidate's positive flips (ItoC against the baseline) that an attempt answers
    right too; None when the candidate has none, or the flip tables do not hold every sample (Spark)."""
    if single is None or len(single.samples) != len(attempt.samples) or not len(single.samples):
        return None
    flipped = (single.samples["flip"] == "ItoC").to_numpy()
    if not flipped.any():
        return None
    right = attempt.samples["flip"].isin(["CtoC", "ItoC"]).to_numpy()
    return float(right[flipped].mean())


def _repair(
    gate: _GateRun,
    comparer: _Comparer,
    cand_model: scoring.LoadedModel,
    cand_scores: pd.DataFrame,
    remediation: RemediationConfig,
) -> dict:
    """A repair that needs no training (``blend``, ``rerank``) in a nested run: its setting fixed by the
    config or tuned on data other than the evaluation set, logged as one pyfunc model carrying both
    generations' models, checked to predict what was gated, then judged like any attempt."""
    import mlflow

    from consistency_gate.ensembles.repair import aligned, log_repair

    method = remediation.settings.method
    with gate.session.child_run(f"remediation: {method}") as child_run_id:
        start = time.perf_counter()
        repair = _repair_setting(gate, comparer, cand_model, remediation)
        previous, candidate, classes = aligned(comparer.base_scores, cand_scores)
        scores = pd.DataFrame(repair.apply(previous, candidate), columns=classes, index=cand_scores.index)
        seconds = time.perf_counter() - start
        mlflow.log_params({"method": method, **repair.setting})
        pairs = ((comparer.baseline, comparer.base_scores), (cand_model, cand_scores))
        model_info = log_repair(repair, *(_generation(model, scores) for model, scores in pairs))
        served = scoring.load_model(registry.ModelRef(model_info.model_uri, "", source=model_info.model_uri))
        features = scoring.feature_frame(served, gate.frame, gate.non_features)
        same = scoring.predict(served, gate.frame, gate.non_features)[classes].to_numpy()
        if not np.allclose(same, scores.to_numpy(), atol=1e-6):
            raise ModelError(f"{model_info.model_uri}: the logged {method} repair does not predict what was gated")
        cost = _serving_cost(lambda f: scoring.predict(served, f, ()), features, model_info.model_uri, members=2)
        built = {"members": 2, "runs": 0, "kappa": 0.0, "train_seconds": seconds, "setting": repair.setting}
        return _judge_attempt(
            gate, comparer, method, model_info, scores, cand_model.features, cost, {**built, "run_id": child_run_id}
        )


def _generation(model: scoring.LoadedModel, scores: pd.DataFrame | pd.Series) -> dict:
    """A generation as a repair carries it: its model URI, its classes (its score columns; none for a
    label-only model) and the tags that say how to read its outputs."""
    tags = {k: v for k, v in model.ref.tags.items() if k in (registry.CLASSES_TAG, registry.OUTPUTS_TAG)}
    classes = [str(c) for c in scores.columns] if isinstance(scores, pd.DataFrame) else None
    return {"uri": model.ref.uri, "classes": classes, "tags": tags}


def _bayes_repair(
    gate: _GateRun,
    comparer: _Comparer,
    cand_model: scoring.LoadedModel,
    cand_scores: pd.DataFrame | pd.Series,
    remediation: RemediationConfig,
) -> dict:
    """The Bayesian update over the last K generations (:mod:`consistency_gate.ensembles.bayes`) in a
    nested run: the champions before the baseline (as the model's gates promoted them), the baseline
    and the candidate, their confusion matrices estimated on the calibration data, the cost ratio fixed
    by the config or tuned there with the gate's rules; logged as one pyfunc carrying the K models,
    checked to predict what was gated, then judged like any attempt."""
    import mlflow

    from consistency_gate.ensembles import bayes

    with gate.session.child_run("remediation: bayesian-update") as child_run_id:
        start = time.perf_counter()
        count = remediation.generations or bayes.DEFAULT_GENERATIONS
        past = last(champions_before(gate.client, gate.cand_ref.name, gate.base_ref.version), count - 2)
        refs = [registry.resolve_version(gate.client, gate.cand_ref.name, v) for v, _ in past]
        models = [*(scoring.load_model(ref, gate.cfg.classes) for ref in refs), comparer.baseline, cand_model]
        on_eval = [*(scoring.predict(m, gate.frame, gate.non_features) for m in models[:-2])]
        on_eval += [comparer.base_scores, cand_scores]
        source = Path(remediation.calibration or remediation.data)
        label = remediation.label_column
        tuning = io.read_evaluation_data(source, label, None)
        on_tuning = [scoring.predict(m, tuning, scoring.non_features(label, None)) for m in models]
        said_eval = [bayes.answer_labels(s, gate.decision) for s in on_eval]
        said_tuning = [bayes.answer_labels(s, gate.decision) for s in on_tuning]
        seen = {str(c) for s in on_eval if isinstance(s, pd.DataFrame) for c in s.columns}
        seen |= {str(v) for v in tuning[label]} | {a for said in said_eval + said_tuning for a in said}
        classes = canonical_classes([sorted(seen)])
        update = bayes.BayesUpdate(classes, [bayes.confusion(tuning[label], s, classes) for s in said_tuning])
        tuning_idx = [bayes.class_indices(s, classes) for s in said_tuning]
        if remediation.cost_ratio is not None:
            update = replace(update, cost_ratio=remediation.cost_ratio, tuned_on="config")
        else:
            base = pd.DataFrame(np.eye(len(classes))[np.maximum(tuning_idx[-2], 0)], columns=classes)
            judge = _calibration_judge(gate, tuning[label], base, classes, source)
            update = bayes.tune_cost_ratio(update, tuning_idx, judge, str(source))
        eval_idx = [bayes.class_indices(s, classes) for s in said_eval]
        scores = pd.DataFrame(update.scores(eval_idx), columns=classes, index=gate.frame.index)
        seconds = time.perf_counter() - start
        mlflow.log_params({"method": "bayesian-update", **update.setting, "versions": ", ".join(v for v, _ in past)})
        generations = [_generation(m, s) for m, s in zip(models, on_eval, strict=True)]
        decision = gate.decision.to_dict() if gate.decision else None
        model_info = bayes.log_bayes(update, generations, decision)
        served = scoring.load_model(registry.ModelRef(model_info.model_uri, "", source=model_info.model_uri))
        features = scoring.feature_frame(served, gate.frame, gate.non_features)
        same = scoring.predict(served, gate.frame, gate.non_features)[classes].to_numpy()
        if not np.allclose(same, scores.to_numpy(), atol=1e-6):
            raise ModelError(f"{model_info.model_uri}: the logged bayesian-update does not predict what was gated")
        members = len(models)
        cost = _serving_cost(lambda f: scoring.predict(served, f, ()), features, model_info.model_uri, members=members)
        setting = {**update.setting, "versions": [*(v for v, _ in past), gate.base_ref.version, gate.cand_ref.version]}
        built = {"members": members, "runs": 0, "kappa": 0.0, "train_seconds": seconds, "setting": setting}
        return _judge_attempt(
            gate, comparer, "bayesian-update", model_info, scores, cand_model.features, cost,
            {**built, "run_id": child_run_id},
        )  # fmt: skip


def _repair_setting(
    gate: _GateRun, comparer: _Comparer, cand_model: scoring.LoadedModel, remediation: RemediationConfig
) -> Repair:
    """The repair's setting: as the config fixes it; else tuned with the gate's rules, each judged on its
    strict one-sided bound (:func:`~consistency_gate.gate.rules.with_margin`), on the ``calibration:``
    file (or the remediation's ``data:``), never on the evaluation set; else the default."""
    from consistency_gate.ensembles.repair import Repair, aligned, tune

    method = remediation.settings.method
    if method == "blend" and remediation.weight is not None:
        return Repair("blend", weight=remediation.weight, tuned_on="config")
    if method == "rerank" and remediation.k is not None:
        return Repair("rerank", k=remediation.k, tuned_on="config")
    source = remediation.calibration or remediation.data
    if source is None:
        return Repair(method)
    tuning = io.read_evaluation_data(Path(source), remediation.label_column, None)
    exclude = scoring.non_features(remediation.label_column, None)
    prev_scores, cand_scores = (scoring.predict(m, tuning, exclude) for m in (comparer.baseline, cand_model))
    previous, candidate, classes = aligned(prev_scores, cand_scores)
    base = pd.DataFrame(previous, columns=classes)
    judge = _calibration_judge(gate, tuning[remediation.label_column], base, classes, source)
    return tune(method, previous, candidate, judge, str(source))


def _calibration_judge(
    gate: _GateRun, labels: pd.Series, base: pd.DataFrame | pd.Series, classes: list[str], source: Path
) -> Callable[[np.ndarray], tuple[bool, float]]:
    """``judge(scores)`` for tuning a repair on calibration data (``labels``; the baseline's scores
    ``base`` there; the repair's over ``classes``): (whether the gate's rules pass, CtoI), each rule on
    its strict one-sided bound at the tuning confidence, wide enough for the evaluation set's sampling
    error as well: a setting that passes calibration by a hair fails the evaluation set. A serving cost,
    a slice and what is measured over the champions or against a replica are not measured there."""
    cfg = gate.cfg
    beside = (*rules.COST_METRICS, *rules.HISTORY_METRICS, *rules.FLOOR_METRICS)
    margin = [rules.with_margin(r) for r in cfg.rules if r.metric not in beside and not r.per_slice]
    kept = replace(cfg, rules=margin, confidence=rules.tuning_confidence(cfg.confidence))
    ks = usable_ks(None if not cfg.ks_given else cfg.ks, {str(source): len(classes)}, f"{cfg.source}: ks")

    def judge(probabilities: np.ndarray) -> tuple[bool, float]:
        repaired = pd.DataFrame(probabilities, columns=classes)
        evaluation = evaluate_frames(labels, [base, repaired], ks, str(source), decision=gate.decision)
        comparison = evaluation.result(confidence=kept.confidence, interval_method=cfg.interval_method)
        decision = Decision.judge(comparison, kept, pd.DataFrame(), ks)
        return decision.verdict == "passed", comparison.metrics["ctoi"]

    return judge


def _validate(gate: _GateRun, models: list[scoring.LoadedModel]) -> None:
    """Validate the evaluation data (great-expectations) before anything is predicted.

    A feature column a model reads but the data lacks is the first cause reported, and alone:
    without it the model cannot predict, so its classes are unknown and the labels are not
    checked against them (that check would only report every label as unexpected).
    """
    from consistency_gate.io.validation import validate_evaluation_data

    frame, label_column = gate.frame, gate.label_column
    features: dict[str, str | None] = {}
    arrays: dict[str, int | None] = {}
    for m in models:
        for name in m.features or []:
            features[name] = m.feature_types.get(name)
        column = array_column(scoring.feature_frame(m, frame, gate.non_features)) if not m.features else None
        if column is not None:
            arrays[column] = m.tensor.sample_size if m.tensor is not None else None
    missing = [name for name in features if name not in frame.columns]
    known = None
    if not missing:
        # a first sample the models cannot take (a text cell in a numeric column, a wrong shape): GX reports
        # why below; a model that cannot predict at all fails again when it predicts the set
        with contextlib.suppress(DataError, ModelError):
            classes = [scoring.model_classes(m, frame, gate.non_features) for m in models]
            # a label-only model's class set is unknown: its labels are checked when counted
            known = None if None in classes else sorted({str(c) for found in classes for c in found})
    report = validate_evaluation_data(frame, label_column, features, known, arrays)
    tracking.log_json(report.result, "gate/data_validation.json")
    if missing:
        reader = next(m for m in models if missing[0] in (m.features or []))
        others = f" (and {len(missing) - 1} more: {', '.join(missing[1:4])})" if len(missing) > 1 else ""
        raise DataError(
            f"{gate.data_path}: feature column '{missing[0]}' is missing{others}; {reader.ref.uri} reads it (its "
            "signature names it): add the column to the evaluation data, or gate a model logged with its columns"
        )
    empty = np.flatnonzero(frame[label_column].isna().to_numpy()) if label_column in frame.columns else []
    if len(empty):
        raise DataError(
            f"{gate.data_path}: row {empty[0] + 1}, column '{label_column}' is empty ({len(empty)} of {len(frame)} "
            "rows are); every sample needs its true label: fill it in or drop the row"
        )
    if not report.success:
        for m in models:  # a sample of the wrong shape: name the column, the row and both shapes
            tensor_batch(scoring.feature_frame(m, frame, gate.non_features), m.tensor, str(gate.data_path))
        if known is not None:
            _refuse_unknown_labels(frame[label_column], known, f"{gate.data_path}: column '{label_column}'")
        raise DataError(f"evaluation data failed validation ({len(report.failures)} expectations): {report.summary()}")


def _refuse_unknown_labels(labels: pd.Series, known: list[str], where: str) -> None:
    """DataError naming the labels that no generation knows, the classes the models do know and what to
    do; nothing when every label is a class of a generation.

    >>> _refuse_unknown_labels(pd.Series([2, 7, 2]), ["digit-2", "digit-7"], "eval.csv: column 'label'")
    Traceback (most recent call last):
    ...
    consistency_gate.errors.DataError: eval.csv: column 'label': 3 of 3 labels are no class of the models ('2', \
'7'); their classes are 'digit-2', 'digit-7': write the labels as the models name their classes (or name the \
models' outputs with the version tag consistency_gate.classes)
    """
    text = labels.astype(str)
    unknown = ~text.isin(known)
    if not unknown.any():
        return
    seen = list(dict.fromkeys(text[unknown]))
    shown = ", ".join(map(repr, seen[:5])) + (" ..." if len(seen) > 5 else "")
    classes = ", ".join(map(repr, known[:10])) + (f" ... ({len(known)} classes)" if len(known) > 10 else "")
    raise DataError(
        f"{where}: {int(unknown.sum())} of {len(labels)} labels are no class of the models ({shown}); their classes "
        f"are {classes}: write the labels as the models name their classes (or name the models' outputs with the "
        f"version tag {registry.CLASSES_TAG})"
    )
