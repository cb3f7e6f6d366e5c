"""The ``remediation:`` block of a gate config, checked without importing torch or MLflow
(``consistency-gate config --check`` and every gate parse it before anything heavy loads).

>>> block = RemediationBlock(data="train.csv", method="dynsnap-step", m=5, N=2, epochs=4)
>>> RemediationConfig.from_block(block).settings.m
5
>>> RemediationConfig.from_block(RemediationBlock(enabled=False)) is None
True
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from consistency_gate.ensembles.combine import RULES
from consistency_gate.ensembles.methods import METHODS, Options, cheapest_order, no_training, resolve
from consistency_gate.errors import UsageError

# the training engine's methods (every method is an entry of ensembles.methods.METHODS)
ENSEMBLE_METHODS = ("dynsnap-cyc", "dynsnap-step", "snapshot", "extbagging")  # m members
DISTILLATION_METHODS = ("focal-distillation", "ensemble-distillation")  # one model, from a teacher
OPTIMIZERS = ("sgd", "adam")
SINGLE_RUN_METHODS = ("mcdropout", "singlebase", *DISTILLATION_METHODS)  # one run, its best-on-validation model
DISTILLATION_LOSSES = ("kl", "lm")


def check_weight(weight: float) -> None:
    """UsageError unless ``weight`` (``blend``'s share of the previous generation) is a number in [0, 1].

    >>> check_weight(1.5)
    Traceback (most recent call last):
    ...
    consistency_gate.errors.UsageError: remediation weight (blend) must be in [0, 1], got 1.5
    """
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0.0 <= weight <= 1.0:
        raise UsageError(f"remediation weight (blend) must be in [0, 1], got {weight!r}")


def check_k(k: int, classes: int | None = None) -> None:
    """UsageError unless ``k`` (``rerank``'s choices) is an integer from 2 to the number of classes.

    >>> check_k(1)
    Traceback (most recent call last):
    ...
    consistency_gate.errors.UsageError: remediation k (rerank) must be an integer >= 2 (k = 1 is ...), got 1
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise UsageError(f"remediation k (rerank) must be an integer >= 2 (k = 1 is the candidate itself), got {k!r}")
    if classes is not None and k > classes:
        raise UsageError(f"remediation k (rerank) {k} is larger than the {classes} classes; use k <= {classes}")


@dataclass(frozen=True)
class Distillation:
    """The distillation term of ``focal-distillation`` and ``ensemble-distillation`` (see
    :mod:`consistency_gate.ensembles.distillation`): ``loss`` kl (FD-KL) or lm (FD-LM), the focal
    weights ``alpha`` (every sample) and ``beta`` (added where the teacher is right), the
    ``temperature`` of FD-KL and the term's ``weight`` against the cross-entropy (the loss is
    ``(CE + weight * term) / (1 + weight)``); ``clip``: the largest gradient norm while distilling
    (None: no clipping). The defaults are PCT's alpha and beta at temperature 4 (PCT: 100; why, in
    :mod:`~consistency_gate.ensembles.distillation`). Clipping is ours, not the paper's: a guard
    against a steep term under SGD (with PCT's loss at temperature 100, SGD at lr 0.05 diverged on
    digits without it).

    >>> Distillation(beta=-1.0)
    Traceback (most recent call last):
    ...
    consistency_gate.errors.UsageError: remediation distillation beta must be a finite number >= 0, got -1.0
    """

    loss: str = "kl"
    alpha: float = 1.0
    beta: float = 5.0
    temperature: float = 4.0
    weight: float = 1.0
    clip: float | None = 5.0

    def __post_init__(self) -> None:
        if self.loss not in DISTILLATION_LOSSES:
            raise UsageError(f"remediation distillation loss '{self.loss}' is unknown; use kl (FD-KL) or lm (FD-LM)")
        for name in ("alpha", "beta", "weight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise UsageError(f"remediation distillation {name} must be a finite number >= 0, got {value!r}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
            raise UsageError(f"remediation distillation temperature must be a finite number > 0, got {t!r}")
        c = self.clip
        if c is not None and (isinstance(c, bool) or not isinstance(c, int | float) or not math.isfinite(c) or c <= 0):
            raise UsageError(f"remediation distillation clip must be a finite number > 0 or null, got {c!r}")


# each distillation method's term where the config leaves it out: toward the previous generation PCT's
# focal distillation (alpha 1, beta 5; temperature 4); toward an ensemble plain knowledge distillation
# (beta 0) at Hinton's usual temperature 4
DEFAULT_DISTILLATION = {
    "focal-distillation": Distillation(),
    "ensemble-distillation": Distillation(beta=0.0),
}


@dataclass(frozen=True)
class TrainSettings:
    """Options of an ensemble build (the config's ``remediation:`` block)."""

    method: str = "dynsnap-cyc"
    m: int = 20
    n_snapshots: int = 10
    epochs: int = 40
    beta: float | None = None  # None: beta* per run
    lr: float = 0.05
    batch_size: int = 64
    val_fraction: float = 0.2
    seed: int = 0
    max_runs: int = 200
    threads: int | None = None  # CPU threads for training: None picks (snapshot.training_threads), 0 torch's
    distillation: Distillation | None = None  # the distillation methods' term; None: DEFAULT_DISTILLATION
    teacher_method: str = "dynsnap-cyc"  # ensemble-distillation: the ensemble the student learns from
    optimizer: str = "sgd"  # sgd: momentum 0.9, weight decay 5e-4; adam: Wang et al. 2023's Table 1 (with lr 1e-3)
    snapshot_one_run: bool = True  # snapshot: one run of m cycles (Huang et al. 2017); False: runs of N cycles

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UsageError(f"remediation method '{self.method}' is unknown; use one of {', '.join(METHODS)}")
        if self.optimizer not in OPTIMIZERS:
            raise UsageError(f"remediation optimizer '{self.optimizer}' is unknown; use one of {', '.join(OPTIMIZERS)}")
        for name in ("m", "n_snapshots", "epochs", "batch_size", "max_runs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                label = "N" if name == "n_snapshots" else name
                raise UsageError(f"remediation {label} must be an integer >= 1, got {value!r}")
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 0
        ):
            raise UsageError(
                "remediation threads must be an integer >= 0 (0: torch's default) or null (picked), "
                f"got {self.threads!r}"
            )
        if self.teacher_method not in ENSEMBLE_METHODS:
            raise UsageError(
                f"remediation teacher_method '{self.teacher_method}' cannot teach a student; use one of "
                f"{', '.join(ENSEMBLE_METHODS)}"
            )
        if self.beta is not None and not 0.0 <= float(self.beta) <= 1.0:
            raise UsageError(f"remediation beta must be in [0, 1] (or null for beta*), got {self.beta}")
        if not 0.0 < self.val_fraction < 1.0:
            raise UsageError(f"remediation val_fraction must be in (0, 1), got {self.val_fraction}")
        if (self.method.startswith("dynsnap") or self.method == "snapshot") and self.n_snapshots > self.epochs:
            raise UsageError(
                f"remediation N={self.n_snapshots} snapshots need at least as many epochs (epochs={self.epochs})"
            )

    @property
    def distillation_term(self) -> Distillation:
        """The distillation term a distillation method trains with (the method's default where unset).

        >>> TrainSettings(method="ensemble-distillation").distillation_term.temperature
        4.0
        """
        return self.distillation or DEFAULT_DISTILLATION.get(self.method, Distillation())


class DistillationBlock(BaseModel):
    """The ``distillation:`` sub-block of ``remediation:``; a key left out keeps the method's default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    loss: Literal[DISTILLATION_LOSSES] | None = None
    alpha: Annotated[float, Field(strict=True, ge=0)] | None = None
    beta: Annotated[float, Field(strict=True, ge=0)] | None = None
    temperature: Annotated[float, Field(strict=True, gt=0)] | None = None
    weight: Annotated[float, Field(strict=True, ge=0)] | None = None
    clip: Annotated[float, Field(strict=True, ge=0)] | None = None  # 0: no clipping


class RemediationBlock(BaseModel):
    """The ``remediation:`` block as written (pydantic: unknown keys and wrong types are refused
    with their field path; :func:`consistency_gate.gate.config.parse_config` adds the YAML line)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    data: Path | None = None  # required unless enabled is false
    enabled: StrictBool = True
    recipe: StrictStr = "mlp"
    recipe_options: dict[str, Any] = Field(default_factory=dict)
    label_column: StrictStr = "label"
    combination: Literal[RULES] = "avg"
    method: StrictStr = "dynsnap-cyc"
    m: StrictInt = 20
    N: StrictInt = 10
    epochs: StrictInt = 40
    beta: Annotated[float, Field(strict=True)] | None = None
    lr: Annotated[float, Field(strict=True, gt=0)] = 0.05
    batch_size: StrictInt = 64
    val_fraction: Annotated[float, Field(strict=True)] = 0.2
    seed: StrictInt = 0
    max_runs: StrictInt = 200
    threads: StrictInt | None = None
    distillation: DistillationBlock | None = None
    teacher_method: StrictStr = "dynsnap-cyc"
    optimizer: Literal[OPTIMIZERS] = "sgd"
    snapshot_one_run: StrictBool = True
    strategy: Literal["cheapest"] | Annotated[list[StrictStr], Field(min_length=1)] | None = None
    options: dict[StrictStr, dict[StrictStr, Any]] = Field(default_factory=dict)  # method -> its sub-block
    calibration: Path | None = None  # data to tune blend's weight and rerank's k on (never the gate's own set)
    tuning_share: Annotated[float, Field(strict=True, gt=0, lt=1)] | None = None  # held out of the evaluation set
    max_models: Annotated[int, Field(strict=True, ge=1)] | None = None  # the most models a repair may carry
    # short forms of options: keys (SHORT_FORMS), as configs wrote them before methods owned their options
    weight: Annotated[float, Field(strict=True)] | None = None  # options: blend: weight
    k: StrictInt | None = None  # options: rerank: k
    generations: Annotated[int, Field(strict=True, ge=2)] | None = None  # options: bayesian-update: generations
    cost_ratio: Annotated[float, Field(strict=True, ge=1)] | None = None  # options: bayesian-update: cost_ratio

    @field_validator("combination", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("options")
    @classmethod
    def _options(cls, value: dict[str, dict], info: ValidationInfo) -> dict[str, dict]:
        """Each sub-block checked by its method's options model (an unknown method or key refused); a method
        of your own that ``method:`` or ``strategy:`` names as ``module:ENTRY`` is registered first, so that
        its sub-block may use its name."""
        named = info.data.get("strategy")
        for name in [info.data.get("method"), *(named if isinstance(named, list) else [])]:
            if isinstance(name, str) and ":" in name:
                with contextlib.suppress(UsageError):  # one that does not resolve is refused where it is named
                    resolve(name)
        for name, block in value.items():
            method_options(name, block)
        return value


# the remediation block's own keys that are short for a method's option (key -> method)
SHORT_FORMS = {"weight": "blend", "k": "rerank", "generations": "bayesian-update", "cost_ratio": "bayesian-update"}


def method_options(name: str, block: Mapping[str, object]) -> Options:
    """The ``options: <name>:`` sub-block checked by the method's own options model; a ValueError saying
    which method and key, and what was expected.

    >>> method_options("rerank", {"k": 4}).k
    4
    >>> method_options("rerank", {"k": 1})
    Traceback (most recent call last):
    ...
    ValueError: rerank.k: Input should be greater than or equal to 2 (got 1)
    """
    try:
        entry = resolve(name)
    except UsageError as exc:
        raise ValueError(str(exc)) from None
    try:
        return entry.options.model_validate(dict(block))
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(str(part) for part in (name, *error["loc"]))
        if error["type"] == "extra_forbidden":
            known = ", ".join(entry.options.model_fields) or "none"
            raise ValueError(f"{key}: unknown option of {name} (its options: {known})") from None
        raise ValueError(f"{key}: {error['msg']} (got {error['input']!r})") from None


@dataclass(frozen=True)
class RemediationConfig:
    """The checked ``remediation:`` block: what to train the ensemble on, and how."""

    data: Path | None  # None: the recipe brings its own data (a TrainingRecipe)
    recipe: str = "mlp"
    recipe_options: dict = field(default_factory=dict)
    label_column: str = "label"
    combination: str = "avg"
    settings: TrainSettings = field(default_factory=TrainSettings)
    strategy: tuple[str, ...] = ()  # the methods to try in turn; () tries settings.method alone
    distillation_overrides: dict = field(default_factory=dict)  # the block's distillation: keys
    options: dict[str, Options] = field(default_factory=dict)  # each method's options: sub-block, checked
    calibration: Path | None = None  # where the repairs' settings are tuned (None: the held-out share, or ``data``)
    tuning_share: float | None = None  # the share of the evaluation set held out to tune on (None: none held out)
    max_models: int | None = None  # the most models what remediation registers may carry (None: no bound)

    @property
    def can_train(self) -> bool:
        """Whether there is data to train on: a ``data:`` file, or a recipe of the user's own."""
        return self.data is not None or ":" in self.recipe

    @property
    def methods(self) -> tuple[str, ...]:
        """The methods remediation tries, in order, until one passes.

        >>> RemediationConfig(None, strategy=cheapest_order("dynsnap-step")).methods
        ('blend', 'rerank', 'bayesian-update', 'focal-distillation', 'ensemble-distillation', 'dynsnap-step')
        >>> RemediationConfig(None).methods
        ('dynsnap-cyc',)
        """
        return self.strategy or (self.settings.method,)

    @property
    def own(self) -> Options:
        """The options of the method this config is for (``settings.method``): its sub-block, or its defaults.

        >>> RemediationConfig(None, settings=TrainSettings(method="rerank")).own.k is None
        True
        """
        method = self.settings.method
        return self.options.get(method) or resolve(method).options()

    def for_method(self, method: str) -> RemediationConfig:
        """This config training ``method``, with the distillation term the method defaults to and the
        block's ``distillation:`` keys on top."""
        term = None
        if self.distillation_overrides:
            term = replace(DEFAULT_DISTILLATION.get(method, Distillation()), **self.distillation_overrides)
        return replace(self, settings=replace(self.settings, method=method, distillation=term), strategy=())

    @classmethod
    def from_block(cls, block: RemediationBlock, source: str = "config") -> RemediationConfig | None:
        """The config of a validated block; None when ``enabled: false``. The training settings
        check themselves (:class:`TrainSettings`)."""
        if not block.enabled:
            return None
        if block.weight is not None:
            check_weight(block.weight)
        if block.k is not None:
            check_k(block.k)
        options = _options(block, source)
        if block.calibration is not None and block.tuning_share is not None:
            raise UsageError(
                f"{source}: remediation: calibration: and tuning_share: both name the data to tune on; keep one "
                "(a calibration file, or the share of the evaluation set held out)"
            )
        try:
            method = resolve(block.method).name
        except UsageError as exc:
            raise UsageError(f"{source}: {exc}") from None
        block = block.model_copy(update={"method": method})
        trains = block.strategy is None and method not in no_training()  # one method, which trains
        if trains and block.data is None and ":" not in block.recipe:
            raise UsageError(
                f"{source}: remediation: 'data' (the training data file) is required for recipe '{block.recipe}' "
                "(a recipe of your own, 'module:function' returning a TrainingRecipe, brings its own data)"
            )
        overrides = _distillation_overrides(block)
        strategy = _strategy(block, source)
        try:
            settings = _settings(block)
            for method in strategy:  # every attempt's settings check themselves before anything trains
                _settings(block.model_copy(update={"method": method}))
        except UsageError as exc:
            raise UsageError(f"{source}: {exc}") from None
        for name in strategy or (method,):  # options that cannot work for any model: refused now, not at the gate
            entry = resolve(name)
            if (why := entry.unconfigured(options.get(entry.name) or entry.options())) is not None:
                raise UsageError(f"{source}: remediation: {entry.name}: {why}")
        return cls(
            block.data, block.recipe, dict(block.recipe_options), block.label_column, block.combination, settings,
            strategy, overrides, options, block.calibration, block.tuning_share, block.max_models,
        )  # fmt: skip


def _options(block: RemediationBlock, source: str) -> dict[str, Options]:
    """Each method's checked options: its ``options:`` sub-block, with the block's short forms
    (:data:`SHORT_FORMS`) in it; a key given both ways is a UsageError."""
    blocks = {resolve(name).name: dict(options) for name, options in block.options.items()}
    for key, method in SHORT_FORMS.items():
        value = getattr(block, key)
        if value is None:
            continue
        if key in blocks.get(method, {}):
            raise UsageError(
                f"{source}: remediation: {key}: and options: {method}: {key}: both set {method}'s {key}; keep one"
            )
        blocks.setdefault(method, {})[key] = value
    return {name: method_options(name, options) for name, options in blocks.items()}


def _strategy(block: RemediationBlock, source: str) -> tuple[str, ...]:
    if block.strategy is None:
        return ()
    if block.strategy == "cheapest":
        return cheapest_order(block.method)
    try:
        names = [resolve(m).name for m in block.strategy]
    except UsageError as exc:
        raise UsageError(f"{source}: remediation strategy: {exc}; or 'cheapest'") from None
    if len(set(names)) < len(names):
        raise UsageError(f"{source}: remediation strategy names a method twice: {block.strategy}")
    return tuple(names)


def _settings(block: RemediationBlock) -> TrainSettings:
    """The block's training settings: every :class:`TrainSettings` field, by the block's name for it."""
    named = {name: getattr(block, name) for name in block_names(TrainSettings) if name != "distillation"}
    return train_settings(**named, distillation=_distillation(block))


def block_names(settings: type[TrainSettings]) -> list[str]:
    """The names of ``settings``' fields as the ``remediation:`` block and ``build_ensemble`` spell them
    (``N`` for ``n_snapshots``, the paper's name).

    >>> block_names(TrainSettings)[:4]
    ['method', 'm', 'N', 'epochs']
    """
    return [BLOCK_NAMES.get(f.name, f.name) for f in fields(settings)]


BLOCK_NAMES = {"n_snapshots": "N"}


def train_settings(**training: object) -> TrainSettings:
    """:class:`TrainSettings` from settings named as in the ``remediation:`` block (``N`` for the
    snapshots per run): the one spelling of training settings, for the config and for
    :func:`~consistency_gate.ensembles.remediation.build_ensemble`; ``distillation`` may be a
    :class:`Distillation` or a dict of the ``distillation:`` keys (the rest keep the method's
    default). An unknown name is a UsageError.

    >>> settings = train_settings(method="dynsnap-step", m=4, N=2, epochs=6, optimizer="adam")
    >>> settings.n_snapshots, settings.optimizer, settings.snapshot_one_run
    (2, 'adam', True)
    >>> train_settings(method="focal-distillation", distillation={"temperature": 4}).distillation_term.beta
    5.0
    >>> train_settings(n=3)
    Traceback (most recent call last):
    ...
    consistency_gate.errors.UsageError: unknown training setting 'n'; the settings are method, m, N, epochs, ...
    """
    known = block_names(TrainSettings)
    unknown = [name for name in training if name not in known]
    if unknown:
        raise UsageError(f"unknown training setting '{unknown[0]}'; the settings are {', '.join(known)}")
    term = training.get("distillation")
    if isinstance(term, Mapping):  # the block's distillation: keys over the method's default term
        names = [f.name for f in fields(Distillation)]
        unknown = [name for name in term if name not in names]
        if unknown:
            raise UsageError(f"unknown distillation setting '{unknown[0]}'; the settings are {', '.join(names)}")
        default = DEFAULT_DISTILLATION.get(str(training.get("method", TrainSettings.method)), Distillation())
        training = {**training, "distillation": replace(default, **{**term, **_no_clip(term)})}
    fields_by_block_name = {BLOCK_NAMES.get(f.name, f.name): f.name for f in fields(TrainSettings)}
    return TrainSettings(**{fields_by_block_name[name]: value for name, value in training.items()})


def _distillation(block: RemediationBlock) -> Distillation | None:
    """The block's distillation term: the method's default with the keys the config sets."""
    if block.distillation is None:
        return None
    return replace(DEFAULT_DISTILLATION.get(block.method, Distillation()), **_distillation_overrides(block))


def _distillation_overrides(block: RemediationBlock) -> dict:
    """The ``distillation:`` keys the block sets (``clip: 0`` as None: no clipping)."""
    overrides = block.distillation.model_dump(exclude_none=True) if block.distillation else {}
    return {**overrides, **_no_clip(overrides)}


def _no_clip(term: Mapping) -> dict:
    """``clip: 0`` as the term spells no clipping (None)."""
    return {"clip": None} if term.get("clip") == 0 else {}
