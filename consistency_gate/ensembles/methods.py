"""The remediation methods, one entry each: what a method needs, what it costs, how it is built.

The gate's remediation (:mod:`consistency_gate.gate.remediate`) reads this table and nothing else about
a method: it skips a method whose needs the gate cannot meet (with the reason), tries the others in
turn, and puts what each builds through one tail that reloads it, checks it predicts what was gated,
measures its serving cost, judges it with the gate's rules and registers it if it passes.
``strategy: cheapest`` orders the methods by their declared ``cost``.

A method owns everything that is particular to it: its options (the ``remediation: options: <name>:``
sub-block, a pydantic model), its builder, the model it serves, and ``describe(name, built)``, the words
the report, the run and the version's description use for what it built (stored in the report, so
nothing outside the method reads its setting's keys). Adding a method is one module (its builder) and
one entry: in :data:`METHODS`, or, for a method of your own, named in the config as ``"module:ENTRY"``
(:func:`resolve`), which registers it.

A builder is ``build(inputs, remediation) -> Built``: it receives the gate's :class:`Inputs` and the
method's :class:`~consistency_gate.ensembles.config.RemediationConfig`, runs inside the attempt's MLflow
run, logs its model there and returns what it built. Builders are named ``"module:function"`` (as
training recipes are) and imported when a method runs, so that reading a config imports nothing heavy.

>>> METHODS["rerank"].kind, METHODS["rerank"].cost < METHODS["dynsnap-cyc"].cost
('rerank', True)
>>> [m.name for m in METHODS.values() if not m.trains]
['blend', 'rerank', 'bayesian-update', 'memory']
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from consistency_gate.errors import DataError, UsageError

if TYPE_CHECKING:
    import pandas as pd
    from mlflow.models.model import ModelInfo

    from consistency_gate.core.threshold import BinaryDecision
    from consistency_gate.mlops.scoring import LoadedModel

DEFAULT_GENERATIONS = 3  # bayesian-update's K: the candidate, the baseline and the champion before it
KS = tuple(range(2, 11))  # rerank's k: 1 is the candidate itself; k = the number of classes, the previous generation
TRAINED = "consistency_gate.ensembles.remediation:build_trained"  # every method that trains networks

# judge(scores) on tuning data: (whether the gate's rules pass there, CtoI there)
Judge = Callable[..., tuple[bool, float]]


class RemediationConfig(Protocol):
    """What the table reads of the ``remediation:`` block: the checked
    :class:`consistency_gate.ensembles.config.RemediationConfig`, which reads this table to check it."""

    data: Path | None
    calibration: Path | None
    tuning_share: float | None  # the share of the evaluation set held out to tune on
    label_column: str
    max_models: int | None  # the most models what remediation registers may carry (None: no bound)
    settings: object  # its TrainSettings (``m``: an ensemble's members)

    @property
    def can_train(self) -> bool:
        """Whether there is data to train on."""

    @property
    def own(self) -> BaseModel:
        """The options of the method this config is for (its ``options:`` sub-block, checked)."""


@dataclass(frozen=True)
class TuningData:
    """Labelled samples a repair's setting is tuned on, never those it is judged on: a ``calibration:``
    file, the share of the evaluation set the gate held out (``tuning_share:``), or the training data."""

    frame: pd.DataFrame
    label_column: str
    non_features: tuple[str, ...]  # the columns no model reads
    source: str  # how the report names them (a file, or the held-out share)

    def check_labels(self, known: set[str]) -> None:
        """DataError (exit 3) naming the first row whose label is not one of the ``known`` classes (what
        the generations answer): tuned on labels no model knows, a repair would fit noise.

        >>> import pandas as pd
        >>> frame = pd.DataFrame({"label": ["cat", "tulip"]})
        >>> TuningData(frame, "label", ("label",), "calib.csv").check_labels({"cat", "dog"})
        Traceback (most recent call last):
        ...
        consistency_gate.errors.DataError: calib.csv: row 2: label 'tulip' is not a class of any generation ...
        """
        labels = self.frame[self.label_column].astype(str)
        unknown = ~labels.isin(known)
        if unknown.any():
            row = int(unknown.to_numpy().argmax())
            raise DataError(
                f"{self.source}: row {row + 1}: label {labels.iloc[row]!r} is not a class of any generation "
                f"(known classes: {', '.join(sorted(known)[:10])}{' ...' if len(known) > 10 else ''}); "
                f"{int(unknown.sum())} of {len(labels)} rows are: label the tuning data with the models' classes"
            )


@dataclass(frozen=True)
class Inputs:
    """What the gate hands a builder: the evaluation set, both generations with their scores on it,
    the classes the answers are in, the binary decision, and two services of the gate's: a judge of
    the gate's rules on tuning data, and the champions before the baseline."""

    frame: pd.DataFrame  # the evaluation set (features and the columns no model reads)
    data_path: Path
    non_features: tuple[str, ...]  # label, id and slicing columns
    candidate: LoadedModel
    cand_scores: pd.DataFrame | pd.Series
    baseline: LoadedModel | None
    base_scores: pd.DataFrame | pd.Series | None
    versions: tuple[str, str]  # (baseline, candidate)
    classes: list[str]  # the candidate's classes (a label-only candidate's: the labels seen)
    decision: BinaryDecision | None
    quiet: bool
    # calibration_judge(labels, baseline's scores, classes, source) -> Judge, each rule on its strict bound
    calibration_judge: Callable[..., Judge]
    # past(count) -> [(version, model)]: the last ``count`` champions before the baseline, oldest first
    past: Callable[[int], list[tuple[str, LoadedModel]]]
    # carried(version) -> the models that version carries (1, or a registered repair's, nested ones included)
    carried: Callable[[str], int]
    held_out: TuningData | None = None  # the share of the evaluation set held out to tune on (tuning_share:)
    no_held_out: str | None = None  # why the share the config asks for was not held out
    label_column: str = "label"  # the evaluation set's true class
    id_column: str | None = None  # the evaluation set's id column (--id-column)
    engine: str = "local"  # where the gate predicts: "local", or "spark" (--engine spark; frame: a sample)


def tuning_data(inputs: Inputs, remediation: RemediationConfig) -> TuningData | None:
    """What a repair's setting is tuned on: the ``calibration:`` file, else the evaluation set's held-out
    share, else the remediation's training ``data:`` (None: nothing, so the setting is the config's or the
    default). A file is read and checked as evaluation data is."""
    if inputs.held_out is not None and remediation.calibration is None:
        return inputs.held_out
    source = remediation.calibration or remediation.data
    if source is None:
        return None
    from consistency_gate.io.predictions import read_evaluation_data
    from consistency_gate.mlops.scoring import non_features

    label = remediation.label_column
    frame = read_evaluation_data(Path(source), label, None)
    return TuningData(frame, label, non_features(label, None), str(source))


@dataclass(frozen=True)
class Built:
    """What a builder built: its model, logged in the attempt's run, and its scores on the evaluation set."""

    model_info: ModelInfo
    scores: pd.DataFrame  # one column per class, on ``Inputs.frame``'s rows
    members: int  # the models it carries (its serving cost grows with them)
    seconds: float  # the time it took to build
    features: list[str] | None  # the columns it reads (None: every column but the non-features)
    setting: dict | None = None  # a no-training repair's setting, as the report shows it (its describe reads it)
    runs: int = 0  # training runs (a snapshot ensemble's)
    kappa: float = 0.0  # the ensemble's diversity


@dataclass(frozen=True)
class Described:
    """What a method built, in the words every record uses (a method's ``describe`` returns it; the report
    stores it as ``described``): ``noun`` ("rerank repair", "ensemble"), ``title`` (the verdict's section
    title: the noun, its setting and what it cost to build) and ``served`` (the cost line's subject: what
    serves, with the models it carries).

    >>> Described("toy repair", "toy repair (margin 0.2)", "the toy repair").to_dict()["noun"]
    'toy repair'
    """

    noun: str
    title: str
    served: str

    def to_dict(self) -> dict:
        """As the report holds it."""
        return {"noun": self.noun, "title": self.title, "served": self.served}


class Options(BaseModel):
    """A method's ``remediation: options: <method>:`` sub-block; a method without options has this one,
    which takes no key (pydantic: an unknown key or a wrong type is refused with its path)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class BlendOptions(Options):
    """``blend``: the previous generation's share, fixed (None: tuned on data other than the evaluation set,
    else 0.5)."""

    weight: float | None = Field(default=None, strict=True, ge=0, le=1)


class RerankOptions(Options):
    """``rerank``: how many of the candidate's first choices the previous generation picks among, fixed
    (None: tuned, else 3)."""

    k: int | None = Field(default=None, strict=True, ge=2)


class MemoryOptions(Options):
    """``memory``: the population the model serves (a CSV or Parquet file, or a folder of them: ids and
    features, no labels), its id column (None: the gate's ``--id-column``), the cost ratio (how many positive
    flips a negative flip costs: fixed, or None: the largest that keeps the candidate's accuracy on the tuning
    share), ids to forget at this gate, the likelihood each generation multiplies in (``answers``: its answer's,
    through its confusion matrix; ``scores``: its class scores) and the decay of the older evidence (1: none;
    0.5: the belief so far counts half before each generation's is added)."""

    population: Path | None = None
    id_column: str | None = Field(default=None, strict=True, min_length=1)
    cost_ratio: float | None = Field(default=None, strict=True, ge=1)  # fixed; None: tuned on the tuning share
    forget: Path | None = None  # a file of ids (CSV with the id column, or one id per line) the memory drops
    likelihood: Literal["answers", "scores"] = "answers"
    decay: float = Field(default=1.0, gt=0, le=1)


class BayesOptions(Options):
    """``bayesian-update``: K, the generations it combines (the candidate and the baseline included), and
    the cost ratio, fixed (None: tuned on the tuning data)."""

    generations: int | None = Field(default=None, strict=True, ge=2)
    cost_ratio: float | None = Field(default=None, strict=True, ge=1)


@dataclass(frozen=True)
class Method:
    """One remediation method: its name (the config's ``method:``), the kind of version it registers
    (the ``consistency_gate.kind`` tag), its ``cost`` (``strategy: cheapest`` tries lower first),
    its builder, ``plan(name, m)``: the line printed before it runs alone (``m``: an ensemble's
    members), ``models(inputs, remediation)``: how many models what it builds will carry (its serving
    cost, known before it builds; the config's ``max_models`` bounds it), and its needs:
    a previous generation (``previous``), class scores from the named generations (``scores``,
    'previous' and/or 'candidate'), labelled data other than the evaluation set (``labelled``), data to
    train on (``trains``), and ``check(remediation, n_classes)``: why it cannot run here, or None.
    ``flattens``: a repair of generations that, when repaired champions would put it over the budget,
    combines the generations they stand in for instead (each one's ``consistency_gate.replaces``).

    >>> Method("toy", "toy", 0, "pkg.mod:build", lambda name, m: f"trying {name}").plan(name="toy", m=1)
    'trying toy'
    """

    name: str
    kind: str
    cost: int
    builder: str | Callable
    plan: Callable[[str, int], str]
    previous: bool = False
    scores: tuple[str, ...] = ()
    labelled: bool = False
    trains: bool = False
    check: Callable[[RemediationConfig, int], str | None] | None = None
    models: Callable[[Inputs, RemediationConfig], int] = lambda inputs, remediation: 1  # one model: a distilled one
    flattens: bool = False  # over the budget, it may combine the generations repaired champions stand in for
    options: type[Options] = Options
    describe: Callable[[str, Built], Described] = lambda name, built: _one_model(name, built)
    always: bool = False  # deployed in place of every candidate, passed or not (the memory of what users saw)
    # answers equal to the baseline's on every sample make it a rollback at the cost of more models, never
    # registered; False for what deploys something new all the same (the memory: a new model for new items)
    same_is_rollback: bool = True

    def build(self, inputs: Inputs, remediation: RemediationConfig) -> Built:
        """Run the builder (imported now when named ``"module:function"``)."""
        build = self.builder
        if isinstance(build, str):
            module, _, function = build.partition(":")
            build = getattr(importlib.import_module(module), function)
        return build(inputs, remediation)

    def plan_line(self, remediation: RemediationConfig) -> str:
        """What the gate prints before this method runs alone."""
        return self.plan(self.name, remediation.settings.m)

    def missing(
        self,
        remediation: RemediationConfig,
        n_classes: int,
        has_previous: bool,
        scoreless: dict[str, str],
        no_held_out: str | None = None,
    ) -> str | None:
        """Why this method cannot run (None: it can): ``scoreless`` maps a generation's role
        ('previous', 'candidate') to the URI of its model when that model gives class labels only;
        ``no_held_out``: why the evaluation set's share the config asks for was not held out to tune on.

        >>> METHODS["blend"].missing(None, 10, False, {})
        'no previous generation to learn from'
        """
        if self.check is not None and (why := self.check(remediation, n_classes)):
            return why
        if self.previous and not has_previous:
            return "no previous generation to learn from"
        if self.labelled and remediation.calibration is None and remediation.data is None:
            if remediation.tuning_share is None:
                return (
                    "it estimates each generation's confusion matrix on labelled data other than the evaluation "
                    "set: name it with calibration: in the remediation block, or hold out a share of the "
                    "evaluation set with tuning_share:"
                )
            if no_held_out is not None:  # the share was too small to hold out
                return no_held_out
        needed = [scoreless[role] for role in ("previous", "candidate") if role in self.scores and role in scoreless]
        if needed:
            return f"it needs class scores and {needed[0]} gives class labels only"
        if self.trains and not remediation.can_train:
            return "it trains, and the remediation block names no training data (data:, or a recipe of your own)"
        return None

    def over_budget(self, inputs: Inputs, remediation: RemediationConfig) -> str | None:
        """Why what this method would build is over the config's ``max_models`` (None: within it, or no
        bound): the models it would carry, counted before anything is built."""
        if remediation.max_models is None:
            return None
        carries = self.models(inputs, remediation)
        if carries <= remediation.max_models:
            return None
        return f"it would carry {carries} models, over the budget of {remediation.max_models} (max_models)"


def _rerank_fits(remediation: RemediationConfig, n_classes: int) -> str | None:
    """Re-ranking picks among k < the number of classes (of all of them, the previous generation's pick
    is its own answer: a rollback)."""
    k = remediation.own.k if remediation.own.k is not None else min(KS)
    if n_classes <= min(KS) or k >= n_classes:
        return (
            f"rerank needs k < the number of classes, and k is {k} for {n_classes} classes: re-ranking every class "
            "by the previous generation is the previous generation (a rollback)"
        )
    return None


def models_of(inputs: Inputs, versions: Sequence[str]) -> int:
    """The models a repair combining ``versions`` carries: every model of each (a repaired champion's all
    of its own, from its ``consistency_gate.models`` tag)."""
    return sum(inputs.carried(v) for v in versions)


def _pair(inputs: Inputs, remediation: RemediationConfig) -> int:
    """A repair of both generations (blend, rerank)."""
    return models_of(inputs, inputs.versions)


def _generations(inputs: Inputs, remediation: RemediationConfig) -> int:
    """The Bayesian update of its K generations."""
    past = inputs.past((remediation.own.generations or DEFAULT_GENERATIONS) - 2)
    return models_of(inputs, [*(v for v, _ in past), *inputs.versions])


def _members(inputs: Inputs, remediation: RemediationConfig) -> int:
    """An ensemble carries its ``m`` members."""
    return remediation.settings.m


def _repair_plan(method: str, m: int) -> str:
    return f"correcting it with the previous generation ({method}, no training) to gate in its place"


def _distil_plan(method: str, m: int) -> str:
    return f"training a {method} model to gate in its place"


def _ensemble_plan(method: str, m: int) -> str:
    return f"training a {method} ensemble of {m} members to gate in its place"


def _tuned(setting: dict) -> str:
    """Where a repair's setting came from, as a title says it."""
    where = setting.get("tuned_on", "defaults")
    return "default" if where == "defaults" else f"from {where}"


_BOTH_IN_ONE = "both generations' models in one, no training"


def _carried(built: Built) -> str:
    return f"{built.members} generations' models"


def _describe_blend(name: str, built: Built) -> Described:
    """blend: its weight.

    >>> built = Built(None, None, 2, 0.0, None, setting={"weight": 0.3, "tuned_on": "calib.csv"})
    >>> _describe_blend("blend", built).title
    "blend repair (w 0.3, from calib.csv): both generations' models in one, no training"
    """
    noun = f"{name} repair"
    title = (
        f"{noun} (w {built.setting['weight']}, {_tuned(built.setting)}): both generations' models in one, no training"
    )
    return Described(noun, title, f"the {noun} ({_carried(built)})")


def _describe_rerank(name: str, built: Built) -> Described:
    """rerank: its k.

    >>> _describe_rerank("rerank", Built(None, None, 2, 0.0, None, setting={"k": 3, "tuned_on": "defaults"})).served
    "the rerank repair (2 generations' models)"
    """
    noun = f"{name} repair"
    title = f"{noun} (k {built.setting['k']}, {_tuned(built.setting)}): {_BOTH_IN_ONE}"
    return Described(noun, title, f"the {noun} ({_carried(built)})")


def _describe_update(name: str, built: Built) -> Described:
    """bayesian-update: its cost ratio and the versions it combines.

    >>> setting = {"cost_ratio": 2.0, "tuned_on": "config", "versions": ["1", "2", "3"]}
    >>> _describe_update("bayesian-update", Built(None, None, 3, 0.0, None, setting=setting)).title
    'bayesian-update repair (cost ratio 2, from config): v1, v2, v3 in one, no training'
    """
    noun = f"{name} repair"
    versions = ", ".join(f"v{v}" for v in built.setting["versions"])
    title = (
        f"{noun} (cost ratio {built.setting['cost_ratio']:g}, {_tuned(built.setting)}): {versions} in one, no training"
    )
    return Described(noun, title, f"the {noun} ({_carried(built)})")


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
    return Described(name, title, f"the model and its memory ({s['rows']:,} ids)")


def _population(remediation: RemediationConfig, n_classes: int) -> str | None:
    """A memory needs the population it serves."""
    if remediation.own.population is None:
        return "it remembers the answers of a population: name it with options: memory: population: <file>"
    return None


def _one_model(name: str, built: Built) -> Described:
    """A distilled model (and the default for a method of one model).

    >>> _one_model("ensemble-distillation", Built(None, None, 1, 0.0, None, runs=5, kappa=5.0)).title
    'ensemble-distillation model, one model from 5 runs (kappa 5.0)'
    """
    noun = f"{name} model"
    return Described(noun, f"{noun}, one model from {built.runs} runs (kappa {built.kappa:.1f})", f"the {noun}")


def _describe_ensemble(name: str, built: Built) -> Described:
    """An ensemble: its members and the runs it took.

    >>> _describe_ensemble("dynsnap-cyc", Built(None, None, 4, 0.0, None, runs=2, kappa=2.0)).title
    'dynsnap-cyc ensemble of 4 members from 2 runs (kappa 2.0)'
    """
    title = f"{name} ensemble of {built.members} members from {built.runs} runs (kappa {built.kappa:.1f})"
    return Described("ensemble", title, f"the ensemble of {built.members} members")


_REPAIRS = "consistency_gate.ensembles.repair:build_repair"
_BAYES = "consistency_gate.ensembles.bayes:build_bayes"
_BOTH = ("previous", "candidate")


def _repair(
    name: str, cost: int, builder: str, models: Callable[[Inputs, RemediationConfig], int], **needs: object
) -> Method:
    """A repair of the generations' answers, no training: its kind is its name, it needs a previous generation."""
    return Method(name, name, cost, builder, _repair_plan, previous=True, models=models, **needs)


def _distilled(name: str, cost: int, **needs: object) -> Method:
    """A method that trains one model."""
    return Method(name, "distilled", cost, TRAINED, _distil_plan, trains=True, **needs)


def _ensemble(name: str) -> Method:
    """A method that trains an ensemble of ``m`` members."""
    return Method(
        name, "ensemble", 100, TRAINED, _ensemble_plan, trains=True, models=_members, describe=_describe_ensemble
    )


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        _repair("blend", 10, _REPAIRS, _pair, scores=_BOTH, flattens=True, options=BlendOptions,
                describe=_describe_blend),
        _repair("rerank", 20, _REPAIRS, _pair, scores=_BOTH, check=_rerank_fits, flattens=True,
                options=RerankOptions, describe=_describe_rerank),
        _repair("bayesian-update", 30, _BAYES, _generations, labelled=True, flattens=True, options=BayesOptions,
                describe=_describe_update),
        Method("memory", "memory", 35, "consistency_gate.ensembles.memory:build_memory",
               lambda name, m: "updating the memory of what users saw with its answers, to deploy in its place",
               previous=True, labelled=True, check=_population, options=MemoryOptions, describe=_describe_memory,
               always=True, same_is_rollback=False),
        _distilled("focal-distillation", 40, previous=True, scores=("previous",)),
        _distilled("ensemble-distillation", 50),
        *map(_ensemble, ("dynsnap-cyc", "dynsnap-step", "snapshot", "extbagging", "mcdropout", "singlebase")),
    )
}  # fmt: skip


def resolve(name: str) -> Method:
    """The method a config names: an entry of :data:`METHODS`, or ``"module:ENTRY"``, a :class:`Method` of
    your own in an importable module, which is registered (under its ``name``) on first use; a UsageError
    (exit 2) names what is wrong.

    >>> resolve("rerank").kind
    'rerank'
    >>> resolve("no-such")
    Traceback (most recent call last):
    ...
    consistency_gate.errors.UsageError: remediation method 'no-such' is unknown; use one of blend, rerank, ...
    """
    if name in METHODS:
        return METHODS[name]
    module, colon, attribute = name.partition(":")
    if not colon:
        raise UsageError(
            f"remediation method '{name}' is unknown; use one of {', '.join(METHODS)}, or 'module:ENTRY' naming a "
            "Method of your own"
        )
    try:
        entry = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise UsageError(
            f"remediation method '{name}': cannot import it ({exc}); check the module and the name"
        ) from None
    if not isinstance(entry, Method):
        raise UsageError(
            f"remediation method '{name}' is a {type(entry).__name__}, not a consistency_gate.ensembles.methods.Method"
        )
    known = METHODS.setdefault(entry.name, entry)
    if known is not entry:
        raise UsageError(f"remediation method '{name}' is named '{entry.name}', which another method already has")
    return entry


def cheapest_order(configured: str) -> tuple[str, ...]:
    """``strategy: cheapest``: every method cheaper than an ensemble by its declared cost (the repairs
    that need no training, then the single-model distillations), then the ``configured`` ensemble
    method (DynSnap-cyc when ``configured`` is itself one of the cheaper ones).

    >>> cheapest_order("focal-distillation")
    ('blend', 'rerank', 'bayesian-update', 'focal-distillation', 'ensemble-distillation', 'dynsnap-cyc')
    """
    cheaper = sorted((m for m in METHODS.values() if m.kind != "ensemble" and not m.always), key=lambda m: m.cost)
    names = tuple(m.name for m in cheaper)
    return (*names, "dynsnap-cyc" if configured in names else configured)


def no_training() -> tuple[str, ...]:
    """The methods that build without training (a repair of the generations' answers).

    >>> no_training()
    ('blend', 'rerank', 'bayesian-update', 'memory')
    """
    return tuple(m.name for m in METHODS.values() if not m.trains)


def kinds() -> tuple[str, ...]:
    """Every ``consistency_gate.kind`` a remediation can tag a version with.

    >>> kinds()
    ('blend', 'rerank', 'bayesian-update', 'memory', 'distilled', 'ensemble')
    """
    return tuple(dict.fromkeys(m.kind for m in METHODS.values()))
