"""The memory of what users saw as an entry of the table of remediation methods: its options (``remediation:
options: memory:``), what it needs (a population), the words for what it built, and its builder,
:func:`consistency_gate.ensembles.memory.build_memory`, named and imported when a gate builds a memory (its
update runs in this process, or on Spark: :mod:`~consistency_gate.ensembles.memory_spark`); the model a memory
version serves is :mod:`~consistency_gate.ensembles.memory_code`'s.

>>> MEMORY.always, MEMORY.same_is_rollback
(True, False)
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from consistency_gate.ensembles.memory_replay import gates
from consistency_gate.ensembles.method import Built, Described, Method, Options, options_summary


class MemoryOptions(Options):
    """``memory``: the population the model serves (a CSV or Parquet file, or a folder of them: ids and features, no
    labels), its id column (None: the gate's ``--id-column``), the cost ratio (how many positive flips a negative
    flip costs: fixed, or None: chosen by replaying the team's history on the tuning ids,
    :mod:`~consistency_gate.ensembles.memory_replay`), ids to forget at this gate, the likelihood each generation
    multiplies in (``answers``: its answer's, through its confusion matrix; ``scores``: its class scores), the decay
    of the older evidence (1: none; 0.5: the belief so far counts half before each generation's is added), and how
    an answer's likelihood is read (``independent``: through the confusion matrix alone, as if the generations were
    independent witnesses; ``correlated``: given what users saw too, :class:`~consistency_gate.core.memory.Repeats`,
    estimated on the tuning share: an answer that repeats what users saw counts little, one that departs from it
    much; None: the one the replay chooses)."""

    population: Path | None = None
    id_column: str | None = Field(default=None, strict=True, min_length=1)
    cost_ratio: float | None = Field(default=None, strict=True, ge=1)  # fixed; None: chosen by the replay
    forget: Path | None = None  # a file of ids (CSV with the id column, or one id per line) the memory drops
    likelihood: Literal["answers", "scores"] = "answers"
    decay: float = Field(default=1.0, gt=0, le=1)
    update: Literal["independent", "correlated"] | None = None  # None: chosen by replaying the history


def _describe_memory(name: str, built: Built) -> Described:
    """memory: the table it carries beside its one model.

    >>> setting = {"rows": 1200, "bytes": 52000, "cost_ratio": 2.0, "changed": 3, "from": "v2's memory"}
    >>> _describe_memory("memory", Built(None, None, 1, 0.0, None, setting=setting)).title
    "memory of 1,200 ids (0.052 MB; cost ratio 2), updated from v2's memory: 3 answers changed, one model"
    """
    s = built.setting
    title = (
        f"{name} of {s['rows']:,} ids ({s['bytes'] / 1e6:.2g} MB; cost ratio {s['cost_ratio']:g}), updated from "
        f"{s['from']}: {s['changed']:,} answers changed, one model"
    )
    if "population_read" in s:  # which rows of the population it was built from
        title += f", from {s['population_read']}"
    if "repeats_repeats" in s:  # how correlated the generations are, whichever update ran
        title += (
            f"; the candidate repeats {s['repeats_repeats']:.0%} of the wrong answers users saw "
            f"({s['repeats_if_independent']:.0%} if independent; update: {s.get('update', 'independent')})"
        )
    if "replayed_generations" in s:  # the setting chosen from the team's history (memory_replay)
        title += (
            f"; chosen by replaying {gates(s['replayed_generations'])} on {s['replayed_ids']:,} tuning ids: "
            f"{s['replayed_flips']} negative flips there against replacing's {s['replayed_replace_flips']}, "
            f"accuracy {100 * s['replayed_accuracy_change']:+.1f} pt"
        )
    return Described(name, title, f"the model and its memory ({s['rows']:,} ids)")


def _population(options: MemoryOptions) -> str | None:
    """A memory needs the population it serves.

    >>> _population(MemoryOptions())
    'it remembers the answers of a population: name it with options: memory: population: <file>'
    """
    if options.population is None:
        return "it remembers the answers of a population: name it with options: memory: population: <file>"
    return None


def _summary(options: MemoryOptions) -> str:
    """Its options as ``config --check`` prints them, and what each gate chooses by replaying the team's history.

    >>> _summary(MemoryOptions(population="p.csv", update="correlated"))
    'population p.csv, likelihood answers, decay 1.0, update correlated; cost_ratio replayed at each gate'
    """
    left = [name for name in ("update", "cost_ratio") if getattr(options, name) is None]
    if options.likelihood == "scores":  # the history keeps answers: the ratio is tuned as before
        return options_summary(options) + ("; cost_ratio tuned at each gate" if options.cost_ratio is None else "")
    return options_summary(options) + (f"; {' and '.join(left)} replayed at each gate" if left else "")


def _plan(name: str, m: int) -> str:
    return "updating the memory of what users saw with its answers, to deploy in its place"


MEMORY = Method(
    "memory", "memory", 35, "consistency_gate.ensembles.memory:build_memory", _plan, previous=True, labelled=True,
    configured=_population, options=MemoryOptions, summary=lambda remediation: _summary(remediation.own),
    describe=_describe_memory, always=True, same_is_rollback=False,
)  # fmt: skip
