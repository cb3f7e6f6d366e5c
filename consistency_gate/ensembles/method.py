"""What a remediation method is: :class:`Method`, one entry of the table
:data:`~consistency_gate.ensembles.methods.METHODS` (its needs, its cost, its builder, the words for what it
built), and what a builder receives and returns (:class:`Inputs`, :class:`Built`, the :class:`TuningData` it
tunes on). A family of methods declares its entries with these in a module of its own (the memory's:
:mod:`~consistency_gate.ensembles.memory_method`); :mod:`~consistency_gate.ensembles.methods` collects them. A
method of your own is a :class:`Method` too (docs/python-api.md).

>>> toy = Method("toy", "toy", 0, print, lambda name, m: f"trying {name}", previous=True)
>>> toy.plan("toy", 1), toy.missing(None, 3, has_previous=False, scoreless={})
('trying toy', 'no previous generation to learn from')
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict

from consistency_gate.errors import DataError

if TYPE_CHECKING:
    import pandas as pd
    from mlflow.models.model import ModelInfo

    from consistency_gate.core.threshold import BinaryDecision
    from consistency_gate.mlops.scoring import LoadedModel

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

    >>> Method("toy", "toy", 0, print, lambda name, m: f"trying {name}").plan(name="toy", m=1)
    'trying toy'
    """

    name: str
    kind: str
    cost: int
    builder: str | Callable[[Inputs, RemediationConfig], Built]  # or "module:function", imported when it runs
    plan: Callable[[str, int], str]
    previous: bool = False
    scores: tuple[str, ...] = ()
    labelled: bool = False
    trains: bool = False
    check: Callable[[RemediationConfig, int], str | None] | None = None
    configured: Callable[[Any], str | None] | None = None  # why its options cannot work for any model, or None
    models: Callable[[Inputs, RemediationConfig], int] = lambda inputs, remediation: 1  # one model: a distilled one
    flattens: bool = False  # over the budget, it may combine the generations repaired champions stand in for
    options: type[Options] = Options
    describe: Callable[[str, Built], Described] = lambda name, built: _one_model(name, built)
    # its settings as ``config --check`` prints them, from its config (for_method): its options by default
    summary: Callable[[RemediationConfig], str] = lambda remediation: options_summary(remediation.own)
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

        >>> Method("toy", "toy", 0, print, str, previous=True).missing(None, 10, False, {})
        'no previous generation to learn from'
        """
        if self.check is not None and (why := self.check(remediation, n_classes)):
            return why
        if self.configured is not None and (why := self.configured(remediation.own)) is not None:
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

    def unconfigured(self, options: Options) -> str | None:
        """Why this method's ``options`` cannot work whatever the model (``configured``), or None: the config is
        refused as it is read (exit 2), before any model is loaded.

        >>> Method("toy", "toy", 0, print, str, configured=lambda options: "it needs a file").unconfigured(Options())
        'it needs a file'
        """
        return None if self.configured is None else self.configured(options)

    def over_budget(self, inputs: Inputs, remediation: RemediationConfig) -> str | None:
        """Why what this method would build is over the config's ``max_models`` (None: within it, or no
        bound): the models it would carry, counted before anything is built."""
        if remediation.max_models is None:
            return None
        carries = self.models(inputs, remediation)
        if carries <= remediation.max_models:
            return None
        return f"it would carry {carries} models, over the budget of {remediation.max_models} (max_models)"


def models_of(inputs: Inputs, versions: Sequence[str]) -> int:
    """The models a repair combining ``versions`` carries: every model of each (a repaired champion's all
    of its own, from its ``consistency_gate.models`` tag)."""
    return sum(inputs.carried(v) for v in versions)


def options_summary(options: Options) -> str:
    """A method's options as ``config --check`` prints them (those left unset, to be tuned or defaulted, left out).

    >>> class Toy(Options):
    ...     margin: float | None = None
    ...     k: int = 3
    >>> options_summary(Toy()), options_summary(Options())
    ('k 3', 'its defaults (tuned where they can be)')
    """
    values = [f"{key} {value}" for key, value in options.model_dump().items() if value is not None]
    return ", ".join(values) or "its defaults (tuned where they can be)"


def _one_model(name: str, built: Built) -> Described:
    """A distilled model (and the default for a method of one model).

    >>> _one_model("ensemble-distillation", Built(None, None, 1, 0.0, None, runs=5, kappa=5.0)).title
    'ensemble-distillation model, one model from 5 runs (kappa 5.0)'
    """
    noun = f"{name} model"
    return Described(noun, f"{noun}, one model from {built.runs} runs (kappa {built.kappa:.1f})", f"the {noun}")
