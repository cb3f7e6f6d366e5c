"""`--engine spark`: the same metrics on Apache Spark, for evaluation sets past one machine.

Each partition feeds its rows through an :class:`~consistency_gate.core.evaluation.Evaluation` (the
same code as in-process) and returns its :class:`~consistency_gate.core.counts.ConsistencyCounts`;
the driver merges them. Both generations must give class scores (the class-id space is then
fixed up front, so every partition agrees on it).

- :func:`compare_spark` (``compare --engine spark``): prediction files joined on
  ``--id-column`` (Spark keeps no row order across files).
- :func:`gate_comparison` (``check --engine spark``): both model versions predict the
  evaluation data with :func:`mlflow.pyfunc.spark_udf`, in the same job that counts.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from consistency_gate.core.counts import ROLES, ConsistencyCounts
from consistency_gate.core.evaluation import ComparisonResult, Evaluation, flip_table
from consistency_gate.core.slices import TRUE_CLASS, SliceCounts
from consistency_gate.core.threshold import BinaryDecision
from consistency_gate.engines.local import resolve_ks
from consistency_gate.errors import DataError, ModelError, UsageError
from consistency_gate.io import predictions as io
from consistency_gate.mlops.flavors import FLAVORS

if TYPE_CHECKING:
    from collections.abc import Iterable

    from pyspark.sql import Column, SparkSession
    from pyspark.sql import DataFrame as SparkDataFrame

    from consistency_gate.core.memory import Repeats

# flipped samples (CtoI, ItoC) each partition sends back for the logged flip table
MAX_FLIPS_PER_PARTITION = 100_000


def spark_session(partitions: int | None = None) -> SparkSession:
    """The active Spark session, or a local one (``local[*]``).

    Example::

        spark_session(partitions=8).sparkContext.master
        # 'local[*]'
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise UsageError("--engine spark needs pyspark: pip install 'consistency-gate[spark]'") from None
    builder = (
        SparkSession.builder.appName("consistency-gate")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")  # a local session talks over loopback only
        .config("spark.driver.bindAddress", "127.0.0.1")
    )
    if partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(partitions))
    return (
        builder.master("local[*]").getOrCreate() if SparkSession.getActiveSession() is None else builder.getOrCreate()
    )


def read_table(spark: SparkSession, path: Path) -> SparkDataFrame:
    """A Spark DataFrame of a CSV file (header, inferred types) or a Parquet file or directory.

    Example::

        read_table(spark, Path("eval.parquet")).count()
        # 1000000
    """
    if path.is_dir() or path.suffix.lower() in (".parquet", ".pq"):
        return spark.read.parquet(str(path))
    return spark.read.csv(str(path), header=True, inferSchema=True)


_SPARK_TYPES = {"float32": "float", "float64": "double", "int32": "int", "int64": "bigint"}

# what each partition returns: its pickled counts, per-slice counts (or none) and flip rows (or none)
PARTIAL = "counts binary, slices binary, flips binary"


@dataclass
class Partial:
    """One partition's share: its counts, its per-slice counts and its flipped samples."""

    counts: ConsistencyCounts
    slices: SliceCounts | None = None
    flips: pd.DataFrame | None = None


def _partial_row(evaluation: Evaluation, flips: pd.DataFrame | None = None) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "counts": [pickle.dumps(evaluation.pairs[(0, 1)])],
            "slices": [pickle.dumps(evaluation.slice_counts)],
            "flips": [pickle.dumps(flips)],
        }
    )


def _merged(parts: list[Partial], ks: Sequence[int]) -> tuple[ConsistencyCounts, SliceCounts | None]:
    """The partitions' counts and slice counts, merged (the map-reduce's reduce step)."""
    counts = reduce(ConsistencyCounts.merge, (p.counts for p in parts), ConsistencyCounts(ks=tuple(ks)))
    sliced = [p.slices for p in parts if p.slices is not None]
    return counts, (reduce(SliceCounts.merge, sliced, SliceCounts(ks=counts.ks)) if sliced else None)


def collect_partials(partials: Iterable[bytes]) -> list[Partial]:
    """Run the job and unpickle each partition's share. A consistency-gate error raised in a
    Python worker comes back wrapped by Spark; it is raised here again as itself.

    Example::

        parts = collect_partials(frame.mapInPandas(partial, PARTIAL))
        sum(p.counts.n for p in parts)
        # 1000000
    """
    try:
        rows = partials.collect()
    except Exception as exc:  # noqa: BLE001 - errors from the Python workers come back wrapped
        message = str(exc)
        for kind in (DataError, UsageError, ModelError):
            marker = f"consistency_gate.errors.{kind.__name__}: "
            if marker in message:
                raise kind(message.split(marker, 1)[1].splitlines()[0]) from None
        if "mlflow/pyfunc" in message:  # the model itself failed inside spark_udf
            raise ModelError(f"prediction on Spark failed: {_last_error_line(message)}") from None
        raise
    return [Partial(*(pickle.loads(bytes(r[name])) for name in ("counts", "slices", "flips"))) for r in rows]


def _last_error_line(message: str) -> str:
    """The last 'SomeError: what' line of a Python traceback that Spark passed on.

    >>> _last_error_line("Job aborted\\nTraceback:\\n  File x\\nRuntimeError: dtype mismatch\\n\\tat org.apache")
    'RuntimeError: dtype mismatch'
    """
    lines = [line.strip() for line in message.splitlines()]
    errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception): ", line)]
    return errors[-1] if errors else lines[-1] if lines else message


def compare_spark(
    labels: str | Path,
    previous: str | Path,
    candidate: str | Path,
    *,
    label_column: str = "label",
    id_column: str | None = None,
    ks: Sequence[int] | None = None,
    partitions: int | None = None,
    confidence: float = 0.95,
    slices: Sequence[str] = (),
) -> ComparisonResult:
    """Compare two prediction files on Spark (per value of the ``slices`` columns of the labels
    file too); the result equals :func:`~consistency_gate.engines.local.compare_files`.

    Example::

        files = "labels.parquet", "gen1.parquet", "gen2.parquet"
        result = compare_spark(*files, id_column="id", slices=["region"])
        result.metrics["ctoi"], result.intervals["ctoi"]
        # (0.0123, [0.0121, 0.0125])
    """
    if id_column is None:
        raise UsageError("--engine spark aligns rows by id: pass --id-column")
    spark = spark_session(partitions)
    from pyspark.sql import functions as F

    labels = Path(labels)
    data_slices = [c for c in slices if c != TRUE_CLASS]
    io.require_columns(labels, io.file_columns(labels), [label_column, id_column, *data_slices])
    sources = [io.inspect_prediction_file(p, id_column) for p in (previous, candidate)]
    for source in sources:
        if not source.has_scores:
            raise UsageError(f"{source.path}: --engine spark needs class-score columns, not hard labels")
    ks = resolve_ks(ks, sources)
    class_sets = [list(s.classes) for s in sources]

    joined = read_table(spark, labels).select(
        F.col(id_column).cast("string").alias("__id"),
        F.col(label_column).cast("string").alias("__label"),
        *(F.col(f"`{c}`").cast("string").alias(f"__slice{i}") for i, c in enumerate(data_slices)),
    )
    for role, source in zip(ROLES, sources, strict=True):
        cols = [F.col(f"`{c}`").alias(f"{role}__{c}") for c in source.classes]
        joined = joined.join(
            read_table(spark, source.path).select(F.col(id_column).cast("string").alias("__id"), *cols), "__id"
        )
    if partitions:
        joined = joined.repartition(partitions)

    def partial(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        evaluation = Evaluation(list(ROLES), class_sets, ks=ks, slices=slices)
        for batch in batches:
            frames = [
                batch[[f"{role}__{c}" for c in cs]].set_axis(cs, axis=1)
                for role, cs in zip(ROLES, class_sets, strict=True)
            ]
            for frame, source in zip(frames, sources, strict=True):
                io.score_matrix(frame.set_axis(range(len(frame))), source)  # same checks as in-process
            keys = {c: batch[f"__slice{i}"].reset_index(drop=True) for i, c in enumerate(data_slices)}
            evaluation.add(
                batch["__label"].reset_index(drop=True), [f.reset_index(drop=True) for f in frames], slices=keys
            )
        yield _partial_row(evaluation)

    counts, slice_counts = _merged(collect_partials(joined.mapInPandas(partial, PARTIAL)), ks)
    n_labels = read_table(spark, labels).count()
    if counts.n != n_labels:
        raise DataError(
            f"ids do not match across files: {counts.n} of the {n_labels} ids of {labels} are in both "
            "prediction files; every file needs the same ids"
        )
    # the class-id space every partition used
    return Evaluation(list(ROLES), class_sets, ks=ks).result(
        counts=counts, confidence=confidence, slice_counts=slice_counts
    )


@dataclass(frozen=True)
class SparkModel:
    """What a Spark job needs of one generation: the model to load with ``spark_udf``, its
    flavor (an entry of :data:`~consistency_gate.mlops.flavors.FLAVORS`: it says whether the outputs are
    logits, turned into probabilities by softmax), the class
    label of each output column, and the feature columns it reads."""

    uri: str
    flavor: str
    classes: list[str]
    features: list[str]

    def require_scores(self) -> None:
        """ModelError unless the model's pyfunc returns class scores (checked before Spark starts)."""
        import mlflow

        check = FLAVORS[self.flavor].spark_check
        if check is not None:
            check(self.uri, mlflow.models.get_model_info(self.uri).flavors.get("python_function") or {})

    def predict_column(self, spark: SparkSession) -> Column:
        """A column of this model's class scores (arrays), predicted with :func:`mlflow.pyfunc.spark_udf`.

        The UDF reads a struct of the feature columns, or an array of them when the model's
        signature is tensor-based.
        """
        import mlflow.pyfunc
        from pyspark.sql import functions as F

        info = mlflow.models.get_model_info(self.uri)
        try:
            udf = mlflow.pyfunc.spark_udf(spark, self.uri, result_type="array<double>", env_manager="local")
        except Exception as exc:  # noqa: BLE001 - MLflow raises many kinds here
            raise ModelError(f"{self.uri}: cannot make a Spark UDF of it ({type(exc).__name__}: {exc})") from None
        columns = [F.col(f"`{c}`") for c in self.features]
        inputs = info.signature.inputs if info.signature is not None else None
        if inputs is None or not inputs.is_tensor_spec():
            return udf(F.struct(*columns))
        dtype = np.dtype(inputs.numpy_types()[0])  # a tensor signature: one array of its element type
        return udf(F.array(*columns).cast(f"array<{_SPARK_TYPES.get(dtype.name, 'double')}>"))

    def scores(self, values: pd.Series) -> pd.DataFrame:
        """The (n, classes) score frame from the UDF's column of arrays."""
        matrix = np.stack(values.to_numpy()) if len(values) else np.zeros((0, len(self.classes)))
        if matrix.shape[1] != len(self.classes):
            raise ModelError(f"{self.uri}: spark_udf gave {matrix.shape[1]} scores per row, expected one per class")
        if FLAVORS[self.flavor].spark_logits:  # as the in-process scorer: softmax of float32 outputs
            import torch

            matrix = torch.softmax(torch.as_tensor(matrix, dtype=torch.float32), dim=1).numpy()
        return pd.DataFrame(matrix, columns=self.classes)


def gate_comparison(
    data: str | Path,
    models: Sequence[SparkModel],
    *,
    label_column: str,
    id_column: str | None,
    ks: Sequence[int],
    partitions: int | None = None,
    slices: Sequence[str] = (),
    decision: BinaryDecision | None = None,
) -> tuple[ComparisonResult, pd.DataFrame]:
    """Predict ``data`` with each model (previous generation first; one model for a first
    generation) on Spark and compare them: the counts of :meth:`Evaluation.result` (per slice of
    the ``slices`` columns too) and the flip table of the flipped samples (CtoI and ItoC, at most
    ``MAX_FLIPS_PER_PARTITION`` of a partition). Without ``id_column`` the flip table's ids are
    Spark row ids. ``decision`` answers binary scores at a threshold, as in-process.

    Example::

        models = [previous, candidate]  # SparkModel of each generation
        comparison, flips = gate_comparison("eval.parquet", models, label_column="label",
                                        id_column="id", ks=[1, 5])
    """
    for model in models:
        model.require_scores()
    spark = spark_session(partitions)
    from pyspark.sql import functions as F

    frame = read_table(spark, Path(data))
    nulls = frame.filter(F.col(f"`{label_column}`").isNull()).count()
    if nulls:
        raise DataError(f"{data}: column '{label_column}' has {nulls} empty labels; every sample needs its label")
    ids = F.col(f"`{id_column}`").cast("string") if id_column else F.monotonically_increasing_id().cast("string")
    columns = [ids.alias("__id"), F.col(f"`{label_column}`").cast("string").alias("__label")]
    columns += [model.predict_column(spark).alias(f"__g{i}") for i, model in enumerate(models)]
    data_slices = [c for c in slices if c != TRUE_CLASS]  # part of the counting key: counted per value
    columns += [F.col(f"`{c}`").cast("string").alias(f"__slice{i}") for i, c in enumerate(data_slices)]
    scored = frame.select(*columns)
    if partitions:
        scored = scored.repartition(partitions)
    # a first generation is predicted once and compared with itself, as in-process
    pair = [(models[0], "__g0")] * 2 if len(models) == 1 else [(models[0], "__g0"), (models[1], "__g1")]
    class_sets = [m.classes for m, _ in pair]

    def partial(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        evaluation = Evaluation(list(ROLES), class_sets, ks=ks, keep_samples=True, slices=slices, decision=decision)
        row_ids: list[np.ndarray] = []
        for batch in batches:
            batch = batch.reset_index(drop=True)
            frames = [m.scores(batch[slot]) for m, slot in pair]
            keys = {c: batch[f"__slice{i}"] for i, c in enumerate(data_slices)}
            evaluation.add(batch["__label"], frames, where=str(data), slices=keys)
            row_ids.append(batch["__id"].to_numpy())
        table = flip_table(evaluation.samples(), np.concatenate(row_ids)) if row_ids else None
        flips = None if table is None else table[table["flip"].isin(["CtoI", "ItoC"])].head(MAX_FLIPS_PER_PARTITION)
        yield _partial_row(evaluation, flips)

    parts = collect_partials(scored.mapInPandas(partial, PARTIAL))
    counts, slice_counts = _merged(parts, ks)
    # over the partitions' class-id space
    result = Evaluation(list(ROLES), class_sets, ks=ks).result(counts=counts, slice_counts=slice_counts)
    flips = [p.flips for p in parts if p.flips is not None and len(p.flips)]
    return result, (pd.concat(flips, ignore_index=True) if flips else pd.DataFrame(columns=_FLIP_COLUMNS))


_FLIP_COLUMNS = ["id", "label", "previous_prediction", "candidate_prediction", "flip"]


# The memory of what users saw (consistency_gate.core.memory) on Spark: the same update as
# Memory.extended then Memory.update, as joins of the population's answers with the memory table.
MEMORY_CHANGED, MEMORY_ADDED = "__changed", "__added"  # the update's flags, beside the table's columns


def model_answers(spark: SparkSession, frame: SparkDataFrame, id_column: str, model: SparkModel,
                  classes: Sequence[str], scores: bool = False) -> SparkDataFrame:  # fmt: skip
    """``(id, answer)``: ``model``'s highest-scoring class for each row of ``frame``, as an index into
    ``classes`` (-1 for a class outside them), predicted with ``spark_udf``; ids as text. With ``scores``, a third
    column ``scores``: its class scores over ``classes`` (0 for a class it does not score)."""
    from pyspark.sql import functions as F

    model.require_scores()
    index = [classes.index(c) if c in classes else -1 for c in model.classes]  # the model's column -> ours
    predicted = model.predict_column(spark)
    top = F.array_position(predicted, F.array_max(predicted)).cast("int")  # 1-based, the lowest on a tie: argmax
    answer = F.element_at(F.array(*(F.lit(i) for i in index)), top)
    columns = [F.col(f"`{id_column}`").cast("string").alias("id"), answer.alias("answer")]
    if scores:
        over = [predicted[model.classes.index(c)] if c in model.classes else F.lit(0.0) for c in classes]
        columns.append(F.array(*over).cast("array<float>").alias("scores"))
    return frame.select(*columns)


MAX_PAIR_CELLS = 20_000_000  # the correlated update's broadcast table on Spark: classes cubed (271 classes)


def _pair_likelihoods(spark: SparkSession, repeats: Repeats, confusion: np.ndarray) -> SparkDataFrame:
    """``(answer, shown, lik)``: :meth:`Repeats.log_likelihood` of every answer for every answer users saw; a
    UsageError past :data:`MAX_PAIR_CELLS` (too many classes to broadcast)."""
    p = len(confusion)
    if p**3 > MAX_PAIR_CELLS:
        raise UsageError(
            f"update: correlated on Spark broadcasts a likelihood per pair of classes: {p} classes are too many "
            f"(at most {round(MAX_PAIR_CELLS ** (1 / 3))}); run the gate without --engine spark, or use update: "
            "independent"
        )
    answers, shown = np.repeat(np.arange(p), p), np.tile(np.arange(p), p)
    lik = repeats.log_likelihood(confusion, answers, shown)
    rows = [(int(a), int(s), [float(v) for v in row]) for a, s, row in zip(answers, shown, lik, strict=True)]
    return spark.createDataFrame(rows, "answer int, shown int, lik array<float>")


def update_memory(
    spark: SparkSession,
    table: SparkDataFrame | None,
    first: SparkDataFrame,
    answers: SparkDataFrame,
    classes: Sequence[str],
    confusions: tuple[np.ndarray, np.ndarray],
    cost_ratio: float,
    decay: float = 1.0,
    repeats: Repeats | None = None,
) -> SparkDataFrame:
    """The memory table after a generation: ``table`` (the previous one: ``id``, ``shown``, ``belief:<class>``;
    None for a first memory) extended by ``first`` (``(id, answer)`` of the model users saw, for ids it lacks)
    and updated with ``answers`` (``(id, answer)`` of the new generation); ``confusions`` are (that of the model
    users saw, the new generation's). Joins, no collect: it is :meth:`Memory.extended` then
    :meth:`Memory.update` (float32, the same rule), with the flags ``__changed`` and ``__added``. A ``scores``
    column in ``first`` or ``answers`` (:func:`model_answers`' ``scores=True``) is that generation's likelihood
    (``likelihood: scores``) instead of its answer's; ``decay`` weighs the belief so far as in :meth:`Memory.update`;
    ``repeats`` (``update: correlated``) makes an answer's likelihood depend on what users saw, one vector per
    (answer, answer seen) pair broadcast (:data:`MAX_PAIR_CELLS` at most).

    Example::

        updated = update_memory(spark, spark.read.parquet("memory/"), seen, answers, classes, (before, after), 3.0)
        updated.drop("__changed", "__added").write.parquet("memory-next/")
    """
    from pyspark.sql import functions as F

    from consistency_gate.core.memory import BELIEF, ID, SHOWN, SMALLEST

    p = len(classes)

    def evidence(said: SparkDataFrame, matrix: np.ndarray) -> SparkDataFrame:  # (id, answer, lik: log-likelihoods)
        if "scores" in said.columns:  # its class scores, as Memory's _log_scores takes them
            log = F.transform("scores", lambda x: F.log(F.greatest(F.least(x, F.lit(1.0)), F.lit(SMALLEST))))
            return said.select(ID, "answer", log.cast("array<float>").alias("lik"))
        log = np.log(np.asarray(matrix, dtype=np.float64)).T.astype(np.float32)  # answer -> each class's
        rows = [(j, [float(v) for v in log[j]]) for j in range(p)] + [(-1, [0.0] * p)]
        return said.select(ID, "answer").join(F.broadcast(spark.createDataFrame(rows, "answer int, lik array<float>")),
                                               "answer")  # fmt: skip

    def normalised(belief: Column) -> Column:
        return F.transform(belief, lambda x: x - F.array_max(belief))

    labels = F.array(*(F.lit(c) for c in classes))
    known = first.join(table.select(ID), ID, "left_anti") if table is not None else first
    added = evidence(known, confusions[0]).select(
        ID, normalised(F.col("lik")).alias("belief"), F.col("answer").alias("shown"), F.lit(True).alias(MEMORY_ADDED)
    )
    if table is not None:
        beliefs = F.array(*(F.col(f"`{BELIEF}{c}`").cast("float") for c in classes))
        shown = (F.array_position(labels, F.col(SHOWN)) - 1).cast("int")
        added = table.select(ID, beliefs.alias("belief"), shown.alias("shown"), F.lit(False).alias(MEMORY_ADDED)).union(
            added
        )
    if repeats is None:
        scored = added.join(evidence(answers, confusions[1]).drop("answer"), ID, "left")
    else:  # the likelihood of each (answer, answer users saw) pair, as Memory.update's with repeats
        scored = added.join(answers.select(ID, "answer"), ID, "left").join(
            F.broadcast(_pair_likelihoods(spark, repeats, confusions[1])), ["answer", "shown"], "left"
        )
    weight = F.lit(float(decay)).cast("float")  # float32 arithmetic, as Memory.update's
    summed = F.zip_with(F.col("belief"), F.col("lik"), lambda x, y: (x if decay == 1 else x * weight) + y)
    belief = F.when(F.col("lik").isNull(), F.col("belief")).otherwise(normalised(summed))  # not scored: as it was
    scored = scored.select(ID, belief.alias("belief"), "shown", MEMORY_ADDED)
    seen = F.element_at(F.col("belief"), F.col("shown") + 1)
    change = -seen > F.lit(float(np.float32(np.log(cost_ratio)) + np.float32(1e-6))).cast("float")
    best = F.array_position(F.col("belief"), F.array_max(F.col("belief"))) - 1
    shown = F.when(change, best).otherwise(F.col("shown"))
    return scored.select(
        F.col(ID),
        F.element_at(labels, shown.cast("int") + 1).alias(SHOWN),
        *(F.col("belief")[i].alias(f"{BELIEF}{c}") for i, c in enumerate(classes)),
        change.alias(MEMORY_CHANGED),
        F.col(MEMORY_ADDED),
    )
