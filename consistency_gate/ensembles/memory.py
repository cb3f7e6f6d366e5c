"""``memory``: one model served plus a belief per item of the population it scores again and again
(the specification's "Population and memory"; Traeuble et al. 2021; the belief update of
:mod:`consistency_gate.core.memory`).

A remediation method that is built at every gate of a model with a population (``options: memory: population:
<file>``), whether or not the candidate passes alone: what deploys is the candidate and the memory, updated with the
candidate's answers on the population. The previous memory comes from the champion when it is a memory version (else
the memory starts from the champion's answers: what users saw); each generation's confusion matrix is estimated on
the tuning data (the ``tuning_share:`` held out of the evaluation set, or a ``calibration:`` file), never on the
samples the gate judges. The update and the cost ratio are the config's (``update:``, ``cost_ratio:``) or chosen by
replaying the team's history on the tuning ids (:mod:`~consistency_gate.ensembles.memory_replay`; each memory
version carries it); where it cannot be replayed, the ratio is the largest whose memory keeps the candidate's
accuracy on the tuning share (not the smallest that passes the gate's rules: a memory passes them at every ratio).
Each generation's likelihood is its answer's through its confusion matrix, or (``likelihood: scores``) its class
scores; ``decay:`` discounts the older evidence. The evaluation set's ids are added to the population when missing,
so the gate judges what users would see on them. The population is read and scored :data:`CHUNK` rows at a time
(:class:`Population`), and the memory updated in its own arrays: ten million ids of ten classes within 2 GB
(``benchmarks/memory_scale.py``). With ``--engine spark`` the update is Spark's joins
(:mod:`~consistency_gate.ensembles.memory_spark`): the population may be a table of Spark's catalog, and is never
collected.

It is served as one MLflow pyfunc (:class:`MemoryPyfunc`): the candidate's model and the memory table as
artifacts. A request whose id is in the memory gets the remembered answer (its class scores: the belief, with
that answer on top); an unknown id gets the model's answer. Whatever loads a pyfunc (``mlflow models serve``,
batch scoring, ``spark_udf``) asks it by id: its input is the model's columns and the id column.
"""

from __future__ import annotations

import importlib
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa

from consistency_gate.core.ids import as_text, lookup, sorted_keys
from consistency_gate.core.memory import ANSWER, Memory, Repeats, lean_scan
from consistency_gate.ensembles.answers import COST_RATIOS, answer_labels, class_indices, confusion
from consistency_gate.ensembles.carrying import carried, carried_models, input_frame, log_carrying
from consistency_gate.ensembles.memory_replay import ARTIFACT, Choice, History, gates, replayed, tuning_ids
from consistency_gate.ensembles.method import Built, Inputs, TuningData, tuning_data
from consistency_gate.errors import DataError, ModelError

if TYPE_CHECKING:
    from mlflow.models.model import ModelInfo
    from mlflow.pyfunc import PythonModelContext

    from consistency_gate.ensembles.config import RemediationConfig
    from consistency_gate.ensembles.memory_method import MemoryOptions
    from consistency_gate.mlops.scoring import LoadedModel

try:
    from mlflow.pyfunc import PythonModel
except ImportError:  # pragma: no cover - mlflow is a dependency; keeps the core importable without it
    PythonModel = object

KIND = "memory"  # the consistency_gate.kind of a memory version
DEFAULT_COST_RATIO = 3.0  # where it cannot be tuned: a negative flip costs three positive ones
ACCURACY_MARGIN = 0.005  # a tuned cost ratio keeps the memory within half a point of the candidate's accuracy
CHUNK = 200_000  # population rows scored at a time
# each engine's update of the memory: (Gathered, the table's path) -> Updated; the Spark one, which reads this
# module's types, is named and loaded only where it runs (importing it from here would close an import cycle)
UPDATES = {
    "local": "consistency_gate.ensembles.memory:update_here",
    "spark": "consistency_gate.ensembles.memory_spark:update_on_spark",
}


class MemoryPyfunc(PythonModel):
    """MLflow pyfunc of a model and its memory: the model (artifact ``model``), the memory table (artifact
    ``memory``), the id column, the classes and the model's confusion matrix in its model config."""

    def load_context(self, context: PythonModelContext) -> None:
        """Load the model and the table from the model's own artifacts (no registry needed)."""
        config = context.model_config
        self.classes = list(config["memory_classes"])
        self.id_column = config["id_column"]
        self.confusion = np.array(config["confusion"])
        self.model = carried_models(context, ("model",))[0]
        self.table, self.model_path = Path(context.artifacts["memory"]), context.artifacts["model"]
        self.model_classes = config["classes"]["model"]
        self.memory = Memory.read(self.table, self.classes)
        self.history = History.read(context.artifacts.get("replay"))  # None: logged before histories were kept

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:  # noqa: ANN001
        """One score column per class: the remembered answer's on top for a known id, the model's for another."""
        frame = input_frame(model_input)
        if self.id_column not in frame.columns:
            raise DataError(f"the request has no '{self.id_column}' column: a memory answers by id")
        return served(self.memory, self.model, frame, self.id_column)


def served(memory: Memory, model: LoadedModel, frame: pd.DataFrame, id_column: str) -> pd.DataFrame:
    """What users see for ``frame``'s rows: the memory's answer where it knows the id, else the model's scores."""
    from consistency_gate.mlops.scoring import predict

    rows = memory.find(frame[id_column])
    out = np.zeros((len(frame), len(memory.classes)))
    known = rows >= 0
    if known.any():
        out[known] = memory.scores(rows[known])
    if not known.all():
        scores = predict(model, frame.loc[~known], (id_column,))
        out[~known] = _over(scores, memory.classes)
    return pd.DataFrame(out, columns=memory.classes, index=frame.index)


def _over(scores: pd.DataFrame | pd.Series, classes: list[str]) -> np.ndarray:
    """A model's output as scores over ``classes`` (a label-only model's answers as 1 and 0)."""
    if isinstance(scores, pd.Series):
        return np.eye(len(classes))[np.maximum(class_indices(scores, classes), 0)]
    frame = scores.set_axis([str(c) for c in scores.columns], axis=1)
    return frame.reindex(columns=classes, fill_value=0.0).to_numpy(dtype=np.float64)


class Population:
    """The population a memory serves, read :data:`CHUNK` rows at a time (a CSV or Parquet file, or a folder of
    them, through ``pyarrow.dataset``): its id column and the model's columns, then the evaluation set's rows
    (``features``) whose ids it lacks. A DataError names the file and what is wrong: no such file, not
    readable, no id column, or a column of the evaluation set it lacks."""

    def __init__(self, path: Path, id_column: str, features: pd.DataFrame) -> None:
        import pyarrow.dataset as ds

        self.path, self.id_column, self.features = Path(path), id_column, features
        if not self.path.exists():
            raise DataError(f"{path}: the population file does not exist; check options: memory: population:")
        files = sorted(self.path.rglob("*")) if self.path.is_dir() else [self.path]
        kind = "csv" if any(f.suffix.lower() == ".csv" for f in files) else "parquet"
        try:
            self.dataset = ds.dataset(self.path, format=kind)
            names = self.dataset.schema.names
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for an unreadable file
            raise DataError(f"{path}: the population cannot be read ({type(exc).__name__}: {exc})") from None
        check_columns(path, names, id_column, list(features.columns))
        self.files = [Path(f) for f in self.dataset.files]
        self.stamps = _stamps(self.files)
        self.rows_read = 0  # the population's own rows, once read

    def batches(self) -> Iterator[tuple[pa.Array, pd.DataFrame]]:
        """Its rows as (their ids as text, a frame of the id column and the model's columns), the evaluation
        set's missing ids last. A DataError when the population has no rows."""
        evaluation = as_text(self.features[self.id_column])
        keys, order = sorted_keys(evaluation, "the evaluation set")
        ordered, found = evaluation.take(pa.array(order)), np.zeros(len(evaluation), dtype=bool)
        try:
            for batch in self.dataset.to_batches(
                columns=list(self.features.columns), batch_size=CHUNK, **lean_scan(self.dataset)
            ):
                if batch.num_rows:
                    ids = as_text(batch.column(self.id_column))
                    at = lookup(keys, ordered, ids)
                    found[at[at >= 0]] = True
                    self.rows_read += batch.num_rows
                    yield ids, batch.to_pandas()
        except pa.ArrowException as exc:
            raise DataError(f"{self.path}: the population cannot be read ({type(exc).__name__}: {exc})") from None
        if not self.rows_read:
            raise no_rows(self.path)
        missing = np.zeros(len(evaluation), dtype=bool)
        missing[order[~found]] = True
        if missing.any():
            yield evaluation.filter(pa.array(missing)), self.features.loc[missing].reset_index(drop=True)

    def read(self) -> str:
        """Which rows the memory was built from: how many were read, and whether a file changed while it was read
        (a population appended to while the gate reads it: its rows as read, a count the report states).

        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "population.csv"
        >>> _ = path.write_text("id,x\\na,1\\nb,2\\n")
        >>> population = Population(path, "id", pd.DataFrame({"id": ["a"], "x": [1]}))
        >>> rows = list(population.batches())
        >>> population.read()
        '2 rows of population.csv'
        """
        where = self.path.name if len(self.files) == 1 else f"{len(self.files)} files of {self.path}"
        said = f"{self.rows_read:,} rows of {where}"
        if _stamps(self.files) != self.stamps:
            said += " (it changed while it was read: the rows as read then)"
        return said


def _stamps(files: list[Path]) -> list[tuple[int, int]]:
    """Each file's size and modification time, to tell whether it changed while it was read."""
    stats = [f.stat() if f.exists() else None for f in files]
    return [(s.st_size, s.st_mtime_ns) if s else (-1, -1) for s in stats]


def no_rows(source: object) -> DataError:
    """The error of a population ``source`` without rows (a memory built from it would change nothing)."""
    return DataError(
        f"{source}: the population has no rows; a memory remembers the answers users see: give the file of the "
        "items the model serves (ids and features)"
    )


def check_columns(source: object, names: list[str], id_column: str, columns: list[str]) -> None:
    """A DataError naming the population ``source`` unless its column ``names`` hold the id column and ``columns``
    (the model's)."""
    if id_column not in names:
        raise DataError(
            f"{source}: the population has no id column '{id_column}' (columns: {', '.join(names[:8])}); "
            "a memory remembers items by id: add it, or name it with options: memory: id_column:"
        )
    missing = [c for c in columns if c not in names]
    if missing:
        raise DataError(
            f"{source}: the population lacks the column '{missing[0]}' the model reads (its columns must be the "
            "evaluation set's, less the label)"
        )


def _forgotten(path: Path, id_column: str) -> list[str]:
    """The ids ``options: memory: forget:`` names: a CSV with the id column, or a text file of one id per line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: the file of ids to forget does not exist; check options: memory: forget:")
    if path.suffix.lower() == ".csv":
        frame = pd.read_csv(path, dtype=str)
        if id_column not in frame.columns:
            raise DataError(f"{path}: no column '{id_column}': the ids to forget are in the population's id column")
        return frame[id_column].dropna().tolist()
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class Said:
    """A model's answers on some rows (class indices) and, where the memory multiplies in scores, its class scores
    over the memory's classes."""

    answers: np.ndarray
    scores: np.ndarray | None = None

    def rows(self, mask: np.ndarray) -> Said:
        """These answers (and scores) at ``mask``'s rows (a boolean mask or row indices)."""
        return Said(self.answers[mask], None if self.scores is None else self.scores[mask])

    @classmethod
    def joined(cls, parts: list[Said]) -> Said:
        """The parts' answers (and scores) one after the other."""
        scores = [p.scores for p in parts if p.scores is not None]
        return cls(np.concatenate([p.answers for p in parts]), np.concatenate(scores) if scores else None)


def _answers(model: LoadedModel, frame: pd.DataFrame, exclude: tuple[str, ...], inputs: Inputs, scores: bool) -> Said:
    """The model's answers for ``frame``'s rows (less the columns no model reads, ``exclude``) as indices into the
    candidate's classes, and its class scores when ``scores`` (a ModelError for a model that gives labels only)."""
    from consistency_gate.mlops.scoring import predict

    classes = list(inputs.classes)
    if not len(frame):
        return Said(np.zeros(0, dtype=ANSWER), np.zeros((0, len(classes)), dtype=np.float32) if scores else None)
    output = predict(model, frame, exclude)
    answers = class_indices(answer_labels(output, inputs.decision), classes).astype(ANSWER)
    if not scores:
        return Said(answers)
    if isinstance(output, pd.Series):
        raise ModelError(
            f"{model.ref.uri}: answers with class labels only; a memory with likelihood: scores multiplies in class "
            "scores: use likelihood: answers"
        )
    return Said(answers, _over(output, classes).astype(np.float32))


def _previous(inputs: Inputs) -> MemoryPyfunc | None:
    """The champion's memory (its table, the model it serves, its confusion matrix) when the champion is a memory
    version (None: it is a plain model)."""
    from consistency_gate.mlops.registry import TAG_KIND

    if inputs.baseline is None or inputs.baseline.ref.tags.get(TAG_KIND) != KIND:
        return None
    import mlflow

    uri = inputs.baseline.ref.uri
    try:
        loaded = mlflow.pyfunc.load_model(uri).unwrap_python_model()
    except DataError as exc:  # its table: damaged, missing, of other classes
        raise ModelError(f"{uri}: the champion's memory cannot be updated: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - MLflow raises several kinds for a damaged model
        raise ModelError(
            f"{uri}: the champion's memory cannot be loaded ({type(exc).__name__}: {exc}); roll back to the version "
            "before it"
        ) from None
    if loaded.classes != list(inputs.classes):
        raise DataError(
            f"{uri}: the champion's memory is of the classes {loaded.classes[:6]}, the candidate answers "
            f"{list(inputs.classes)[:6]}: a memory of other classes cannot be updated"
        )
    return loaded


def _scored(
    population: Population, memory: Memory | None, before: LoadedModel, inputs: Inputs, scores: bool
) -> tuple[pa.Array, np.ndarray, Said, Said, pd.DataFrame]:
    """One pass over the population: its ids; which of them the memory lacks; the candidate's answers for each;
    what users saw for each the memory lacks (the model served before); its first rows."""
    ids, new, said, seen, head = [], [], [], [], None
    for batch, frame in population.batches():
        lacks = np.ones(len(frame), dtype=bool) if memory is None else memory.find(batch) < 0
        seen.append(_answers(before, frame.loc[lacks], (population.id_column,), inputs, scores))
        said.append(_answers(inputs.candidate, frame, (population.id_column,), inputs, scores))
        ids.append(batch)
        new.append(lacks)
        head = frame.iloc[:1000] if head is None else head
    everyone = pa.concat_arrays(ids)
    sorted_keys(everyone, str(population.path))  # each id once
    return everyone, np.concatenate(new), Said.joined(said), Said.joined(seen), head


@dataclass(frozen=True)
class Gathered:
    """What a gate's update of the memory starts from, whichever engine runs it: the options, the id column and
    the columns the candidate reads (after it), the tuning data, the champion's memory (None: the champion is a
    plain model), the model users saw, both models' answers and confusion matrices on the tuning samples
    (``before``, ``candidate``), and the ids to forget."""

    inputs: Inputs
    options: MemoryOptions
    id_column: str
    keep: list[str]
    held: TuningData
    previous: MemoryPyfunc | None
    before: LoadedModel
    said: dict[str, Said]
    matrices: dict[str, np.ndarray]
    forget: list[str]
    history: History

    @property
    def with_scores(self) -> bool:
        """Whether each generation's likelihood is its class scores (``likelihood: scores``)."""
        return self.options.likelihood == "scores"

    @cached_property
    def truth(self) -> np.ndarray:
        """The tuning samples' true classes, as indices into the candidate's (-1: a label outside them)."""
        return class_indices(self.held.frame[self.held.label_column].to_numpy(), list(self.inputs.classes))

    @cached_property  # read by the tuned ratio, the update and the report: estimated once
    def measured(self) -> tuple[Repeats, float]:
        """How the candidate's answers depend on what users saw, estimated on the tuning samples (their labels, the
        answers of the model users saw and the candidate's), and how often it would repeat their wrong answers
        were it independent of them (:meth:`Repeats.if_independent`): measured at every gate, the report says it."""
        seen = self.said["before"].answers
        repeats = Repeats.estimate(self.truth, seen, self.said["candidate"].answers)
        return repeats, Repeats.if_independent(self.truth, seen, self.matrices["candidate"])

    @cached_property
    def replayed(self) -> Choice | None:
        """The setting the history's replay on the tuning ids chooses for what the config leaves to the gate
        (:func:`~consistency_gate.ensembles.memory_replay.replayed`; None: not replayed)."""
        options = self.options
        if options.likelihood == "scores":  # the history keeps answers: the ratio is tuned
            return None
        return replayed(self.history, self.truth, list(self.inputs.classes), (options.update, options.cost_ratio),
                        options.decay)  # fmt: skip

    @property
    def update(self) -> str:
        """The update that runs: the config's, else the replayed choice's, else the independent one."""
        return self.options.update or (self.replayed.update if self.replayed else "independent")

    @property
    def repeats(self) -> Repeats | None:
        """What the update reads of :attr:`measured` (``update: correlated``); None for the independent update."""
        return self.measured[0] if self.update == "correlated" else None

    def remembered(self) -> tuple[Memory | None, int]:
        """The champion's memory less the ids to forget (None: there is none), and how many it forgot."""
        if self.previous is None:
            return None, 0
        return self.previous.memory.without(self.forget) if self.forget else (self.previous.memory, 0)

    def cost_ratio(self, memories: Callable[[], list[Memory]]) -> tuple[float, str]:
        """The config's cost ratio, else the one :func:`_tuned_ratio` tunes on the tuning samples' rows of
        ``memories()`` (before the update), and where it came from."""
        if self.options.cost_ratio is not None:
            return self.options.cost_ratio, "config"
        if (chosen := self.replayed) is not None:
            return chosen.cost_ratio, f"replayed over {gates(chosen.generations)} on {chosen.ids} tuning ids"
        return _tuned_ratio(memories(), self.held, self.id_column, self.said["candidate"], self.matrices["candidate"],
                            self.options.decay, self.repeats)  # fmt: skip


@dataclass(frozen=True)
class Updated:
    """The memory after a gate's update, as the report and the version say it: its class scores on the evaluation
    set's rows, its rows and bytes on disk, the ids added, the answers changed and the ids forgotten, the cost
    ratio and where it came from, the population's first rows (the served model's example), and which of its rows
    it was built from (:meth:`Population.read`)."""

    scores: pd.DataFrame
    rows: int
    bytes: int
    added: int
    changed: int
    forgotten: int
    cost_ratio: float
    cost_ratio_from: str
    head: pd.DataFrame
    read: str


def _gathered(inputs: Inputs, remediation: RemediationConfig) -> Gathered:
    """What the update starts from (:class:`Gathered`); a DataError when the gate has no id column."""
    options = remediation.own
    id_column = options.id_column or inputs.id_column
    if id_column is None:
        raise DataError(
            f"{inputs.data_path}: a memory judges what users saw by id: give the gate --id-column (the ids of the "
            "population)"
        )
    if id_column not in inputs.frame.columns:
        named = "options: memory: id_column" if options.id_column else "--id-column"
        what = f"its columns: {', '.join(map(str, inputs.frame.columns[:12]))}; name the column of the population's ids"
        if options.id_column and inputs.id_column:
            what = f"the gate's --id-column is '{inputs.id_column}': drop id_column: to use it, or name a column it has"
        raise DataError(f"{inputs.data_path}: no column '{id_column}', the memory's id column ({named}); {what}")
    classes = list(inputs.classes)
    reads = inputs.candidate.features or [c for c in inputs.frame.columns if c not in inputs.non_features]
    keep = [id_column, *(c for c in reads if c != id_column)]  # the columns the candidate reads, and the ids
    held = tuning_data(inputs, remediation)  # the method's entry needs one (labelled=True)
    previous = _previous(inputs)
    before = inputs.baseline if previous is None else previous.model
    scores = options.likelihood == "scores"
    said = {name: _answers(m, held.frame, (*held.non_features, id_column), inputs, scores)
            for name, m in (("before", before), ("candidate", inputs.candidate))}  # fmt: skip
    labels = np.array(classes, dtype=object)
    matrices = {name: confusion(held.frame[held.label_column], labels[np.maximum(a.answers, 0)], classes)
                for name, a in said.items()}  # fmt: skip
    if previous is not None:  # the confusion matrix the champion's memory was updated with
        matrices["before"] = previous.confusion
    forget = _forgotten(options.forget, id_column) if previous is not None and options.forget is not None else []
    history = History.started(previous.history if previous is not None else None, tuning_ids(held, id_column),
                              said["before"].answers).appended(said["candidate"].answers)  # fmt: skip
    return Gathered(inputs, options, id_column, keep, held, previous, before, said, matrices, forget, history)


def build_memory(inputs: Inputs, remediation: RemediationConfig) -> Built:
    """The candidate plus the memory updated with its answers on the population (the builder of
    :data:`~consistency_gate.ensembles.methods.METHODS`' ``memory``): the previous memory (the champion's, or
    the champion's answers), each generation's confusion matrix and the cost ratio from the tuning data, logged
    as one pyfunc carrying the candidate's model and the table; the update is the gate's engine's
    (:data:`UPDATES`)."""
    import mlflow

    start = time.perf_counter()
    gathered = _gathered(inputs, remediation)
    module, _, function = UPDATES[inputs.engine].partition(":")
    update = getattr(importlib.import_module(module), function)
    with tempfile.TemporaryDirectory() as folder:
        table, history = Path(folder) / "memory.parquet", Path(folder) / ARTIFACT
        done = update(gathered, table)
        gathered.history.write(history)
        seconds = time.perf_counter() - start
        info = _log(inputs, done.rows, (table, history), gathered.id_column, gathered.matrices["candidate"], done.head)
    options, id_column = gathered.options, gathered.id_column
    setting = {
        "cost_ratio": done.cost_ratio, "cost_ratio_from": done.cost_ratio_from,
        "confusions_from": gathered.held.source, "population": str(options.population),
        "rows": done.rows, "bytes": done.bytes, "added": done.added, "changed": done.changed,
        "likelihood": options.likelihood, "decay": options.decay, "forgotten": done.forgotten,
        "update": gathered.update, **_repeats_said(*gathered.measured),
        **(gathered.replayed.said() if gathered.replayed else {}),
        "id_column": id_column, "engine": inputs.engine, "population_read": done.read,
        "from": f"v{inputs.versions[0]}'s {'memory' if gathered.previous is not None else 'answers'}",
    }  # fmt: skip
    setting.update(_latency(info.model_uri, inputs.candidate, done.head, id_column))
    mlflow.log_params({k: v for k, v in setting.items() if not isinstance(v, dict)})
    return Built(info, done.scores, 1, seconds, [id_column, *(inputs.candidate.features or [])], setting)


def update_here(gathered: Gathered, table: Path) -> Updated:
    """The update in this process: the population read and scored :data:`CHUNK` rows at a time, the memory
    held once, with one copy while it is updated; the table written to ``table``."""
    inputs, options, id_column = gathered.inputs, gathered.options, gathered.id_column
    classes = list(inputs.classes)
    memory, forgotten = gathered.remembered()
    population = Population(options.population, id_column, inputs.frame[gathered.keep])
    ids, new, answers, first, head = _scored(population, memory, gathered.before, inputs, gathered.with_scores)
    block = Memory.first(classes, ids.filter(pa.array(new)), first.answers, gathered.matrices["before"], first.scores)
    cost_ratio, chosen = gathered.cost_ratio(partial(_present, memory, block))
    # the new ids updated in their own memory, the known ones in the memory's arrays, then the two merged: the
    # beliefs are held once and copied once (10M ids of 10 classes within 2 GB: benchmarks/memory_scale.py)
    rule = {"confusion": gathered.matrices["candidate"], "cost_ratio": cost_ratio, "copy": False,
            "decay": options.decay, "repeats": gathered.repeats}  # fmt: skip
    mine = answers.rows(new)
    block, changed = block.update(ids.filter(pa.array(new)), mine.answers, scores=mine.scores, **rule)
    if memory is None:
        memory = block
    else:
        theirs = answers.rows(~new)
        memory, known = memory.update(ids.filter(pa.array(~new)), theirs.answers, scores=theirs.scores, **rule)
        memory, changed = memory.merged(block), changed + known
    del block, ids
    rows = memory.find(inputs.frame[id_column])
    scores = pd.DataFrame(memory.scores(rows), columns=classes, index=inputs.frame.index)
    size = memory.write(table)
    said = population.read()
    return Updated(scores, len(memory), size, int(new.sum()), changed, forgotten, cost_ratio, chosen, head, said)


def _present(*memories: Memory | None) -> list[Memory]:
    """The memories that are there (a first generation has no champion's memory)."""
    return [m for m in memories if m is not None]


def _repeats_said(repeats: Repeats, if_independent: float) -> dict:
    """How the candidate depends on what users saw, as the run's parameters and the title say it."""
    said = {"right": repeats.right, "repeats": repeats.repeats, "corrects": repeats.corrects,
            "if_independent": if_independent}  # fmt: skip
    return {f"repeats_{k}": round(v, 4) for k, v in said.items()}


def _tuned_ratio(
    memories: list[Memory],
    held: TuningData,
    id_column: str,
    said: Said,
    matrix: np.ndarray,
    decay: float = 1.0,
    repeats: Repeats | None = None,
) -> tuple[float, str]:
    """The largest cost ratio of :data:`COST_RATIOS` whose memory (the tuning samples' rows of ``memories``,
    before the update), on the tuning samples, is at most :data:`ACCURACY_MARGIN` less accurate than the
    candidate there (the fewest answers changed that keep the candidate's accuracy); the default when the tuning
    samples have no ids in the population."""
    if id_column not in held.frame.columns:
        return DEFAULT_COST_RATIO, "default (the tuning samples have no ids)"
    tuning, found = None, np.zeros(len(held.frame), dtype=bool)
    for memory in memories:
        rows = memory.find(held.frame[id_column])
        found |= rows >= 0
        part = memory.take(np.sort(rows[rows >= 0]))
        tuning = part if tuning is None else tuning.merged(part)
    if not found.all():
        return DEFAULT_COST_RATIO, "default (the tuning samples are not in the population)"
    order = np.argsort(tuning.find(held.frame[id_column]))  # the tuning samples in the memory's row order
    truth = class_indices(held.frame[held.label_column].to_numpy()[order], tuning.classes)
    mine = said.rows(order)
    candidate = float((mine.answers == truth).mean())
    for ratio in sorted(COST_RATIOS, reverse=True):
        after, _ = tuning.update(tuning.ids, mine.answers, matrix, ratio, decay=decay, scores=mine.scores,
                                 repeats=repeats)  # fmt: skip
        if float((after.shown == truth).mean()) >= candidate - ACCURACY_MARGIN:
            return ratio, held.source
    return min(COST_RATIOS), held.source


def _log(
    inputs: Inputs, rows: int, files: tuple[Path, Path], id_column: str, matrix: np.ndarray, head: pd.DataFrame
) -> ModelInfo:
    """Log the candidate's model, the memory table and its history (``files``) as one pyfunc in the active run;
    its input is the id column and the model's columns."""
    import mlflow
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, Schema

    model = carried(inputs.candidate, inputs.cand_scores)
    signature = mlflow.models.get_model_info(model["uri"]).signature
    if signature is None or signature.inputs is None or not signature.inputs.has_input_names():
        raise ModelError(
            f"{model['uri']}: a memory serves a model whose signature names its columns (the id column goes beside "
            "them); log the model with a column signature"
        )
    id_type = "long" if pd.api.types.is_integer_dtype(head[id_column]) else "string"
    inputs_schema = Schema([ColSpec(id_type, id_column), *signature.inputs.inputs])
    config = {"memory_classes": list(inputs.classes), "id_column": id_column, "confusion": np.asarray(matrix).tolist()}
    extra = {"memory": str(files[0]), "replay": str(files[1])}
    return log_carrying(
        "memory_code.py", {"model": model}, config, {"method": KIND, "rows": rows}, "memory",
        signature=ModelSignature(inputs=inputs_schema, outputs=signature.outputs), extra=extra,
    )  # fmt: skip


def _latency(uri: str, model: LoadedModel, head: pd.DataFrame, id_column: str) -> dict:
    """The served memory's latency against the model alone, at a batch of 1 and of 1,000 (medians of 7)."""
    from consistency_gate.mlops.registry import ModelRef
    from consistency_gate.mlops.scoring import load_model, predict

    served_model = load_model(ModelRef(uri, "", source=uri))  # as a server loads it, its inputs cast to its signature
    ratios = {}
    for size in (1, 1000):
        batch = head.iloc[:size]
        times = {"memory": [], "model": []}
        for _ in range(7):  # alternating, so that both see the same machine
            for name in times:
                begin = time.perf_counter()
                predict(served_model, batch, ()) if name == "memory" else predict(model, batch, (id_column,))
                times[name].append(time.perf_counter() - begin)
        ratios[f"latency_ratio_{size}"] = round(float(np.median(times["memory"]) / np.median(times["model"])), 2)
    return ratios
