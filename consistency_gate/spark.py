"""`compare --engine spark`: the same metrics on Apache Spark, for evaluation sets past one machine.

Each partition feeds its rows through an :class:`~consistency_gate.compare.Evaluation` (the
same code as in-process) and returns its :class:`~consistency_gate.accumulator.ConsistencyCounts`;
the driver merges them. Rows are joined on ``--id-column`` (Spark keeps no row order across
files), and both generations must give class scores (the class-id space is then fixed by the
headers, so every partition agrees on it).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from functools import reduce
from pathlib import Path

import pandas as pd

from consistency_gate import predictions as io
from consistency_gate.compare import ComparisonResult, Evaluation, resolve_ks
from consistency_gate.errors import DataError, UsageError

ROLES = ("previous", "candidate")


def spark_session(partitions: int | None = None):
    """The active Spark session, or a local one (``local[*]``)."""
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


def compare_spark(
    labels: str | Path,
    previous: str | Path,
    candidate: str | Path,
    *,
    label_column: str = "label",
    id_column: str | None = None,
    ks: Sequence[int] | None = None,
    partitions: int | None = None,
) -> ComparisonResult:
    """Compare two prediction files on Spark; the result equals :func:`~consistency_gate.compare.compare_files`."""
    if id_column is None:
        raise UsageError("--engine spark aligns rows by id: pass --id-column")
    spark = spark_session(partitions)
    from pyspark.sql import functions as F

    labels = Path(labels)
    io.require_columns(labels, io.file_columns(labels), [label_column, id_column])
    sources = [io.inspect_prediction_file(p, id_column) for p in (previous, candidate)]
    for source in sources:
        if not source.has_scores:
            raise UsageError(f"{source.path}: --engine spark needs class-score columns, not hard labels")
    ks = resolve_ks(ks, sources)
    class_sets = [list(s.classes) for s in sources]

    def read(path: Path):
        return (
            spark.read.parquet(str(path))
            if path.suffix.lower() in (".parquet", ".pq")
            else spark.read.csv(str(path), header=True, inferSchema=True)
        )

    joined = read(labels).select(
        F.col(id_column).cast("string").alias("__id"), F.col(label_column).cast("string").alias("__label")
    )
    for role, source in zip(ROLES, sources, strict=True):
        cols = [F.col(f"`{c}`").alias(f"{role}__{c}") for c in source.classes]
        joined = joined.join(read(source.path).select(F.col(id_column).cast("string").alias("__id"), *cols), "__id")
    if partitions:
        joined = joined.repartition(partitions)

    def partial(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        evaluation = Evaluation(list(ROLES), class_sets, ks=ks)
        for batch in batches:
            frames = [
                batch[[f"{role}__{c}" for c in cs]].set_axis(cs, axis=1)
                for role, cs in zip(ROLES, class_sets, strict=True)
            ]
            for frame, source in zip(frames, sources, strict=True):
                io.score_matrix(frame.set_axis(range(len(frame))), source)  # same checks as in-process
            evaluation.add(batch["__label"].reset_index(drop=True), [f.reset_index(drop=True) for f in frames])
        yield pd.DataFrame({"counts": [pickle.dumps(evaluation.pairs[(0, 1)])]})

    try:
        rows = joined.mapInPandas(partial, schema="counts binary").collect()
    except Exception as exc:  # noqa: BLE001 - errors from the Python workers come back wrapped
        message = str(exc)
        for kind in ("DataError", "UsageError"):
            marker = f"consistency_gate.errors.{kind}: "
            if marker in message:
                line = message.split(marker, 1)[1].splitlines()[0]
                raise (DataError if kind == "DataError" else UsageError)(line) from None
        raise
    counts = reduce(lambda a, b: a.merge(b), (pickle.loads(bytes(r["counts"])) for r in rows))
    n_labels = read(labels).count()
    if counts.n != n_labels:
        raise DataError(
            f"ids do not match across files: {counts.n} of the {n_labels} ids of {labels} are in both "
            "prediction files; every file needs the same ids"
        )
    reference = Evaluation(list(ROLES), class_sets, ks=ks)  # the class-id space every partition used
    values, reasons = counts.compute()
    return ComparisonResult(
        n=counts.n,
        metrics=values,
        null_reasons=reasons,
        classes=reference.index.labels,
        unknown_labels=counts.unknown_labels(),
        counts=counts,
    )
