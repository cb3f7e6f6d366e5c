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

A builder is ``build(inputs, remediation) -> Built`` (:mod:`~consistency_gate.ensembles.method` says what a
method is and what a builder receives): it receives the gate's :class:`Inputs` and the method's
:class:`~consistency_gate.ensembles.config.RemediationConfig`, runs inside the attempt's MLflow run, logs its
model there and returns what it built. Builders are named ``"module:function"`` (as training recipes are) and
imported when a method runs, so that reading a config imports nothing heavy (a function importing them would
close an import cycle: each builder reads the remediation config, which reads this table). A family of methods
with options and words of its own declares its entry in its own module (the memory's:
:mod:`~consistency_gate.ensembles.memory_method`).

>>> METHODS["rerank"].kind, METHODS["rerank"].cost < METHODS["dynsnap-cyc"].cost
('rerank', True)
>>> [m.name for m in METHODS.values() if not m.trains]
['blend', 'rerank', 'bayesian-update', 'memory']
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from pydantic import Field

from consistency_gate.ensembles.memory_method import MEMORY
from consistency_gate.ensembles.method import (
    Built,
    Described,
    Inputs,
    Method,
    Options,
    RemediationConfig,
    models_of,
)
from consistency_gate.errors import UsageError

DEFAULT_GENERATIONS = 3  # bayesian-update's K: the candidate, the baseline and the champion before it
KS = tuple(range(2, 11))  # rerank's k: 1 is the candidate itself; k = the number of classes, the previous generation


class BlendOptions(Options):
    """``blend``: the previous generation's share, fixed (None: tuned on data other than the evaluation set,
    else 0.5)."""

    weight: float | None = Field(default=None, strict=True, ge=0, le=1)


class RerankOptions(Options):
    """``rerank``: how many of the candidate's first choices the previous generation picks among, fixed
    (None: tuned, else 3)."""

    k: int | None = Field(default=None, strict=True, ge=2)


class BayesOptions(Options):
    """``bayesian-update``: K, the generations it combines (the candidate and the baseline included), and
    the cost ratio, fixed (None: tuned on the tuning data)."""

    generations: int | None = Field(default=None, strict=True, ge=2)
    cost_ratio: float | None = Field(default=None, strict=True, ge=1)


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


def _training_summary(remediation: RemediationConfig) -> str:
    settings = remediation.settings
    return f"epochs {settings.epochs}, optimizer {settings.optimizer}"


def _ensemble_summary(remediation: RemediationConfig) -> str:
    settings = remediation.settings
    return f"m {settings.m} members, N {settings.n_snapshots} snapshots, {_training_summary(remediation)}"


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


def _describe_ensemble(name: str, built: Built) -> Described:
    """An ensemble: its members and the runs it took.

    >>> _describe_ensemble("dynsnap-cyc", Built(None, None, 4, 0.0, None, runs=2, kappa=2.0)).title
    'dynsnap-cyc ensemble of 4 members from 2 runs (kappa 2.0)'
    """
    title = f"{name} ensemble of {built.members} members from {built.runs} runs (kappa {built.kappa:.1f})"
    return Described("ensemble", title, f"the ensemble of {built.members} members")


# the builders, imported when a method runs: named, not imported here, as each imports the remediation config, which
# reads this table (a function importing them would close an import cycle: tests/test_architecture.py)
_REPAIRS = "consistency_gate.ensembles.repair:build_repair"
_BAYES = "consistency_gate.ensembles.bayes:build_bayes"
TRAINED = "consistency_gate.ensembles.remediation:build_trained"  # every method that trains networks
_BOTH = ("previous", "candidate")


def _repair(
    name: str, cost: int, builder: str, models: Callable[[Inputs, RemediationConfig], int], **needs: object
) -> Method:
    """A repair of the generations' answers, no training: its kind is its name, it needs a previous generation."""
    return Method(name, name, cost, builder, _repair_plan, previous=True, models=models, **needs)


def _distilled(name: str, cost: int, **needs: object) -> Method:
    """A method that trains one model."""
    return Method(name, "distilled", cost, TRAINED, _distil_plan, trains=True, summary=_training_summary, **needs)


def _ensemble(name: str) -> Method:
    """A method that trains an ensemble of ``m`` members."""
    return Method(
        name,
        "ensemble",
        100,
        TRAINED,
        _ensemble_plan,
        trains=True,
        models=_members,
        describe=_describe_ensemble,
        summary=_ensemble_summary,
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
        MEMORY,
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
