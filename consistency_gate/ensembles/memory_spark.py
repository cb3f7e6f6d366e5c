"""The memory's update on Apache Spark (``check --engine spark`` with ``strategy: [memory]``): the population a
file, a folder or a table of Spark's catalog; the model users saw and the candidate answer it with
``spark_udf``; the table is :func:`~consistency_gate.engines.spark.update_memory`'s joins, written by Spark.
Nothing is collected but the tuning and evaluation samples' rows. The champion's memory is also read in
process, as wherever a memory version serves (its table is held whole by the pyfunc that serves it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa

from consistency_gate.core.ids import as_text
from consistency_gate.core.memory import Memory
from consistency_gate.ensembles.memory import Gathered, Updated, check_columns, no_rows
from consistency_gate.errors import DataError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame as SparkDataFrame
    from pyspark.sql import SparkSession

    from consistency_gate.engines.spark import SparkModel


def update_on_spark(gathered: Gathered, table: Path) -> Updated:
    """The update as Spark joins (:func:`~consistency_gate.engines.spark.update_memory`; nothing collected but
    the tuning and evaluation samples' rows): the population a file, a folder or a Spark table; both models'
    answers with ``spark_udf``; the table written by Spark to the folder ``table``."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from consistency_gate.core.memory import ID
    from consistency_gate.engines.spark import MEMORY_ADDED, MEMORY_CHANGED, model_answers, spark_session, update_memory

    inputs, options, id_column = gathered.inputs, gathered.options, gathered.id_column
    classes, spark = list(inputs.classes), spark_session()
    population, head, rows = _spark_population(spark, options.population, id_column, gathered.keep, inputs.data_path)
    read = f"{rows:,} rows of {options.population} (as Spark read it)"
    memory, forgotten = gathered.remembered()  # in process too: where it serves, the table is loaded whole
    previous = None
    if gathered.previous is not None:
        previous = spark.read.parquet(str(gathered.previous.table))
        if gathered.forget:
            previous = previous.join(spark.createDataFrame([(i,) for i in gathered.forget], f"{ID} string"), ID,
                                     "left_anti")  # fmt: skip
    candidate, before = _spark_models(gathered)
    lacking = (population if previous is None
               else population.join(previous.select(F.col(ID).alias(id_column)), id_column, "left_anti"))  # fmt: skip
    first = model_answers(spark, lacking, id_column, before, classes, gathered.with_scores)
    answers = model_answers(spark, population, id_column, candidate, classes, gathered.with_scores)
    cost_ratio, chosen = gathered.cost_ratio(lambda: _tuning_memories(spark, gathered, population, memory))
    updated = update_memory(
        spark, previous, first, answers, classes, (gathered.matrices["before"], gathered.matrices["candidate"]),
        cost_ratio, decay=options.decay, repeats=gathered.repeats,
    ).persist(StorageLevel.DISK_ONLY)  # fmt: skip
    try:
        counts = updated.agg(F.count(F.lit(1)), F.sum(F.col(MEMORY_ADDED).cast("long")),
                             F.sum(F.col(MEMORY_CHANGED).cast("long"))).first()  # fmt: skip
        updated.drop(MEMORY_ADDED, MEMORY_CHANGED).write.parquet(str(table))
    finally:
        updated.unpersist()
    judged = Memory.read(table, classes, only=inputs.frame[id_column])  # the evaluation samples' rows alone
    scores = judged.scores(judged.find(inputs.frame[id_column]))
    scores = pd.DataFrame(scores, columns=classes, index=inputs.frame.index)
    size = sum(f.stat().st_size for f in table.rglob("*.parquet"))
    rows, added, changed = (int(v or 0) for v in counts)
    return Updated(scores, rows, size, added, changed, forgotten, cost_ratio, chosen, head, read)


def _spark_population(
    spark: SparkSession, source: Path, id_column: str, keep: list[str], data_path: Path
) -> tuple[SparkDataFrame, pd.DataFrame, int]:
    """The population as a Spark DataFrame (a CSV or Parquet file or folder, else a table of Spark's catalog):
    the id column as text and the model's columns, the evaluation set's rows it lacks added; its first 1,000
    rows as they are; and its own row count. A DataError names it when it is none of these, lacks a column, has
    no rows or repeats an id."""
    from pyspark.sql import functions as F

    from consistency_gate.engines.spark import read_table

    if Path(source).exists():
        frame = read_table(spark, Path(source))
    elif _is_table(spark, str(source)):
        frame = spark.table(str(source))
    else:
        raise DataError(
            f"{source}: the population is not a file, a folder or a table of Spark's catalog; check options: "
            "memory: population:"
        )
    check_columns(source, frame.columns, id_column, keep)
    frame = frame.select(*(F.col(f"`{c}`") for c in keep))
    rows = frame.count()
    if not rows:
        raise no_rows(source)
    evaluation = read_table(spark, data_path).select(*(F.col(f"`{c}`").cast(frame.schema[c].dataType) for c in keep))
    frame = frame.unionByName(evaluation.join(frame.select(id_column), id_column, "left_anti"))
    repeated = (frame.groupBy(id_column).count().where(F.col(id_column).isNull() | (F.col("count") > 1))
                .limit(1).collect())  # fmt: skip
    if repeated:
        name, times = repeated[0]
        if name is None:
            raise DataError(f"{source}: an id is empty; every item of a population needs one")
        raise DataError(f"{source}: id {str(name)!r} appears {times} times; a population names each item once: drop "
                        "the repeats")  # fmt: skip
    head = frame.limit(1000).toPandas()
    return frame.withColumn(id_column, F.col(f"`{id_column}`").cast("string")), head, rows


def _is_table(spark: SparkSession, name: str) -> bool:
    """Whether ``name`` is a table of Spark's catalog (False for a name it cannot parse, such as a path)."""
    try:
        return bool(spark.catalog.tableExists(name))
    except Exception:  # noqa: BLE001 - a path is not a table name: Spark raises its parse error
        return False


def _spark_models(gathered: Gathered) -> tuple[SparkModel, SparkModel]:
    """How Spark loads the candidate and the model users saw (the champion's own model, or the one its memory
    version carries)."""
    from consistency_gate.engines.spark import SparkModel

    inputs, features = gathered.inputs, [c for c in gathered.keep if c != gathered.id_column]
    candidate = SparkModel(inputs.candidate.ref.uri, inputs.candidate.flavor, _columns(inputs.cand_scores), features)
    if gathered.previous is not None:
        previous = gathered.previous
        return candidate, SparkModel(previous.model_path, previous.model.flavor, previous.model_classes, features)
    return candidate, SparkModel(inputs.baseline.ref.uri, inputs.baseline.flavor, _columns(inputs.base_scores),
                                 features)  # fmt: skip


def _columns(scores: pd.DataFrame | pd.Series | None) -> list[str]:
    """A model's score columns as class labels (none for a label-only model, which Spark refuses)."""
    return [str(c) for c in scores.columns] if isinstance(scores, pd.DataFrame) else []


def _tuning_memories(spark: SparkSession, gathered: Gathered, population: SparkDataFrame,
                     memory: Memory | None) -> list[Memory]:  # fmt: skip
    """The tuning samples' memory before the update, for :func:`_tuned_ratio`: the champion's memory, and the
    first answers (of the model users saw) of the tuning ids in the population it lacks."""
    from pyspark.sql import functions as F

    held, id_column = gathered.held, gathered.id_column
    if id_column not in held.frame.columns:
        return [m for m in (memory,) if m is not None]
    ids = as_text(held.frame[id_column])
    wanted = spark.createDataFrame([(i,) for i in ids.to_pylist()], f"`{id_column}` string")
    there = {row[0] for row in population.join(F.broadcast(wanted), id_column).select(id_column).collect()}
    lacks = np.array([i in there for i in ids.to_pylist()], dtype=bool)
    if memory is not None:
        lacks &= memory.find(ids) < 0
    first = gathered.said["before"].rows(lacks)
    block = Memory.first(list(gathered.inputs.classes), ids.filter(pa.array(lacks)), first.answers,
                         gathered.matrices["before"], first.scores)  # fmt: skip
    return [m for m in (memory, block) if m is not None]
