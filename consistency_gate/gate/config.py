"""The gate config: YAML checked into a :class:`GateConfig` (pydantic models of the file as written; every
error one line naming the key and the YAML line, exit 2). The rules it holds are
:mod:`consistency_gate.gate.rules`' value objects.

>>> config = parse_config("rules:\\n  - {metric: ctoi, max: 0.02}\\nks: [1]\\n", "gate.yaml")
>>> [r.describe() for r in config.rules], config.ks
(['ctoi <= 0.02'], (1,))
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from consistency_gate.core.intervals import METHODS
from consistency_gate.core.names import (
    COST_METRICS,
    FLOOR_METRICS,
    HISTORY_METRICS,
    LEARNER_METRICS,
    PAIR_METRICS,
    PER_K,
    score_roles,
)
from consistency_gate.core.threshold import DEFAULT_THRESHOLD, BinaryDecision
from consistency_gate.ensembles.config import RemediationBlock
from consistency_gate.errors import UsageError
from consistency_gate.gate.rules import DECIDE, DEFAULT_MIN_SLICE_SIZE, KINDS, UNLESS, Rule

if TYPE_CHECKING:
    from consistency_gate.ensembles.config import RemediationConfig

DEFAULT_SOURCE = "default config"
DEFAULT_HISTORY = 5  # the champions a history rule looks back on when it names none
MAX_CONFIG_BYTES = 256_000  # a gate config is a few KB; 1,000 long class names fit
MAX_CONFIG_NODES = 100_000


@dataclass
class GateConfig:
    """A checked gate config: the rules, the k values, the remediation block and class names."""

    rules: list[Rule]
    ks: tuple[int, ...] = (1, 5)
    remediation: RemediationConfig | None = None
    classes: list[str] | None = None
    source: str = "default"
    confidence: float = 0.95  # the level of the metrics' intervals
    interval_method: str = "wilson"  # for proportions: wilson or clopper-pearson
    slices: tuple[str, ...] = ()  # slicing columns of the evaluation data (or TRUE_CLASS)
    decision: BinaryDecision | None = None  # a binary model's positive class and threshold (decision: block)
    floor: str | None = None  # a seed replica of the baseline: a version of the model ('7', '@replica')

    @property
    def needs_history(self) -> bool:
        """Whether a rule is judged over the model's champions (its gates' ledgers are read)."""
        return any(r.metric in HISTORY_METRICS for r in self.rules)

    @property
    def rule_ks(self) -> tuple[int, ...]:
        """The k values the rules name (``cacc@5``): each must apply to the models gated; the other ``ks`` are
        reported as not applicable where a model has fewer classes (:func:`~consistency_gate.core.evaluation.
        usable_ks`).

        >>> parse_config("ks: [1, 3, 5]\\nrules:\\n  - {metric: ccon@3, min: 0.9}\\n").rule_ks
        (3,)
        """
        return tuple(sorted({int(m.group(2)) for r in self.rules if (m := PER_K.match(r.metric))}))

    def counted_ks(self, widths: dict[str, int]) -> tuple[int, ...]:
        """The k values to count for generations of these class counts (``widths``: a name for each generation
        that gives scores, its class count): the config's ``ks`` that apply; a UsageError naming the first rule
        whose k does not.

        >>> load_config(None).counted_ks({"models:/bin/1": 2})  # k=5 does not apply to a binary model
        (1,)
        >>> parse_config("ks: [1, 5]\\nrules:\\n  - {metric: cacc@5, min: 0.9}\\n", "gate.yaml").counted_ks({"m": 2})
        Traceback (most recent call last):
        ...
        consistency_gate.errors.UsageError: gate.yaml: line 3: rule cacc@5 >= 0.9 cannot be judged for m: k=5 is ...
        """
        from consistency_gate.core.evaluation import usable_ks

        if widths:
            source, width = min(widths.items(), key=lambda item: item[1])
            for rule in self.rules:
                per_k = PER_K.match(rule.metric)
                if per_k and int(per_k.group(2)) > width:
                    raise UsageError(
                        f"{self.source}: line {rule.line}: rule {rule.describe()} cannot be judged for {source}: "
                        f"k={per_k.group(2)} is larger than its {width} classes; use k <= {width} in the rule, or "
                        "remove it"
                    )
        return usable_ks(self.ks, widths, f"{self.source}: ks", needed=())

    def unjudged_for_labels(self, label_only: dict[str, str]) -> None:
        """A UsageError naming the first rule that cannot be judged because a generation answers with class labels
        only (``label_only``: role, ``previous`` or ``candidate`` -> what it is, e.g. its model's URI).

        >>> parse_config("rules:\\n  - {metric: pearson, min: 0.9}\\n", "g.yaml").unjudged_for_labels({"previous": "m"})
        Traceback (most recent call last):
        ...
        consistency_gate.errors.UsageError: g.yaml: line 2: rule pearson >= 0.9 cannot be judged for m: it answers ...
        """
        for rule in self.rules:
            role = next((r for r in score_roles(rule.metric) if r in label_only), None)
            if role is not None:
                raise UsageError(
                    f"{self.source}: line {rule.line}: rule {rule.describe()} cannot be judged for {label_only[role]}: "
                    f"it answers with class labels only, and {rule.metric} needs class scores; remove the rule, or "
                    "register a model that gives class scores (predict_proba)"
                )


def default_config_text() -> str:
    """The packaged default config (``consistency-gate config --default``).

    >>> default_config_text().splitlines()[0]
    '# consistency-gate: default gate configuration.'
    """
    return resources.files("consistency_gate").joinpath("default_config.yaml").read_text()


def load_config(path: str | Path | None) -> GateConfig:
    """The gate configuration from a YAML file, or the packaged default when ``path`` is None.

    >>> [r.describe() for r in load_config(None).rules][:2]
    ['acc change >= -0.01', 'ctoi <= 0.02 unless clearly better']
    """
    if path is None:
        return parse_config(default_config_text(), DEFAULT_SOURCE)
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(
            f"{path}: cannot read the config file ({exc.strerror}); give a YAML config "
            "(`consistency-gate config --default > gate.yaml` writes the default one to edit)"
        ) from None
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{path}: not UTF-8 text (byte {exc.start}: {exc.object[exc.start : exc.start + 1]!r}); a gate config is "
            "YAML saved as UTF-8: save it so, or check that --config names the config and not a data file"
        ) from None
    return parse_config(text, str(path))


def parse_config(text: str, source: str = "config") -> GateConfig:
    """Parse and check a configuration; errors name the key and line (exit 2).

    A config is refused before it is expanded when it is larger than ``MAX_CONFIG_BYTES`` or its
    YAML aliases would expand it past ``MAX_CONFIG_NODES`` values (an "alias bomb").

    >>> config = parse_config("slices: [true_class]\\nrules:\\n  - {metric: ctoi, max: 0.05, per_slice: true}\\n")
    >>> config.slices, [r.describe() for r in config.rules]
    (('true_class',), ['ctoi <= 0.05 in every slice of n >= 50'])
    >>> parse_config("rules:\\n  - {metric: con, mn: 0.9}\\n", "gate.yaml")
    Traceback (most recent call last):
    ...
    consistency_gate.errors.UsageError: gate.yaml: line 2: unknown key 'mn' in rules[0] (known: decide, history, ...)
    """
    if len(text) > MAX_CONFIG_BYTES:
        raise UsageError(
            f"{source}: {len(text):,} characters; a gate config needs a few thousand and may hold at most "
            f"{MAX_CONFIG_BYTES:,}: check that it is the config"
        )
    try:  # the pure-Python loader: libyaml's composer overflows the C stack on deep nesting (a crash)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        _check_expanded_size(root, source)
        data = yaml.safe_load(text)
    except RecursionError:
        raise UsageError(f"{source}: nested too deeply to be a gate config (thousands of levels)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UsageError(f"{source}:{where} malformed YAML: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UsageError(f"{source}: expected a mapping with a 'rules' list at the top level")
    try:
        document = _Document.model_validate(data)
    except ValidationError as exc:
        raise _usage_error(exc, root, source) from None
    ks = tuple(sorted(set(document.ks)))
    rules = [_rule(spec, source, _line(root, ("rules", i)), ks) for i, spec in enumerate(document.rules)]
    sliced = next((r for r in rules if r.per_slice), None)
    if sliced is not None and not document.slices:
        from consistency_gate.core.slices import TRUE_CLASS

        raise UsageError(
            f"{source}: line {sliced.line}: rule for '{sliced.metric}' is per_slice but the config names no "
            f"slices; add e.g. `slices: [{TRUE_CLASS}]` (the true class) or columns of the evaluation data"
        )
    remediation = None
    if document.remediation is not None:
        from consistency_gate.ensembles.config import RemediationConfig

        remediation = RemediationConfig.from_block(document.remediation, source)
    if not rules:
        raise UsageError(
            f"{source}: no rules: a gate with nothing to check would pass any candidate; add rules "
            "(`consistency-gate config --default` prints a starting point)"
        )
    return GateConfig(
        rules=rules,
        ks=ks,
        remediation=remediation,
        classes=[str(c) for c in document.classes] if document.classes else None,
        source=source,
        confidence=document.confidence,
        interval_method=document.intervals,
        slices=tuple(document.slices or ()),
        decision=_decision(document.decision, source, _line(root, ("decision",))),
        floor=None if document.floor is None else str(document.floor),
    )


def _decision(spec: _DecisionSpec | None, source: str, line: int) -> BinaryDecision | None:
    """The ``decision:`` block as a checked value (None without the block)."""
    if spec is None:
        return None
    positive = None if spec.positive is None else str(spec.positive)
    try:
        return BinaryDecision(positive, spec.threshold, configured=True)
    except UsageError as exc:
        raise UsageError(f"{source}: line {line}: {exc}") from None


FiniteNumber = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class _RuleSpec(BaseModel):
    """One item of ``rules:`` as written: a metric and exactly one threshold."""

    model_config = ConfigDict(extra="forbid")

    metric: StrictStr
    min: FiniteNumber | None = None
    max: FiniteNumber | None = None
    min_delta: FiniteNumber | None = None
    decide: Literal[DECIDE] = "estimate"
    per_slice: StrictBool = False
    min_slice_size: Annotated[int, Field(strict=True, ge=1)] | None = None
    history: Annotated[int, Field(strict=True, ge=1)] | None = None
    unless: Literal[UNLESS] | None = None

    @model_validator(mode="after")
    def _one_threshold(self) -> _RuleSpec:
        given = [kind for kind in KINDS if getattr(self, kind) is not None]
        if len(given) != 1:
            raise ValueError(f"rule for '{self.metric}' needs exactly one of min, max, min_delta; got {given}")
        if self.min_slice_size is not None and not self.per_slice:
            raise ValueError(f"rule for '{self.metric}': min_slice_size applies to per_slice: true rules only")
        return self


class _DecisionSpec(BaseModel):
    """``decision:`` as written: a binary model's positive class and the threshold on its probability."""

    model_config = ConfigDict(extra="forbid")

    positive: StrictStr | StrictInt | None = None
    threshold: FiniteNumber = DEFAULT_THRESHOLD


class _Document(BaseModel):
    """A gate config file as written (the top-level keys)."""

    model_config = ConfigDict(extra="forbid")

    rules: list[_RuleSpec] = Field(default_factory=list)
    ks: Annotated[list[Annotated[int, Field(strict=True, ge=1)]], Field(min_length=1)] = [1, 5]
    remediation: RemediationBlock | None = None
    classes: Annotated[list[StrictStr | StrictInt], Field(min_length=1)] | None = None
    confidence: Annotated[float, Field(gt=0.5, lt=1)] = 0.95
    intervals: Literal[METHODS] = "wilson"
    slices: Annotated[list[StrictStr], Field(min_length=1)] | None = None
    decision: _DecisionSpec | None = None
    floor: StrictStr | StrictInt | None = None

    @model_validator(mode="after")
    def _distinct_slices(self) -> _Document:
        if self.slices and len(set(self.slices)) != len(self.slices):
            raise ValueError(f"slices names a column twice: {self.slices}")
        return self

    @model_validator(mode="after")
    def _one_history_per_metric(self) -> _Document:
        for metric in HISTORY_METRICS:
            counts = {r.history or DEFAULT_HISTORY for r in self.rules if r.metric == metric}
            if len(counts) > 1:
                raise ValueError(f"the rules on {metric} name different history: {sorted(counts)}; give them one")
        return self


def _usage_error(exc: ValidationError, root: yaml.Node | None, source: str) -> UsageError:
    """The first of pydantic's errors as one line: the YAML line, the key path, what was wrong."""
    error = exc.errors()[0]
    loc = tuple(error["loc"])
    path = _key_path(loc) or "config"
    if error["type"] == "extra_forbidden":
        where, model = loc[:-1], _Document
        for part in where:
            model = {"remediation": RemediationBlock, "rules": _RuleSpec, "decision": _DecisionSpec}.get(
                str(part), model
            )
        known = ", ".join(sorted(model.model_fields))
        what = f"unknown key '{loc[-1]}'" + (f" in {_key_path(where)}" if where else "")
        return UsageError(f"{source}: line {_line(root, loc)}: {what} (known: {known})")
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] in ("model_type", "model_attributes_type", "dict_type"):
        message = "expected a mapping (key: value)"
    shown = "" if error["type"] == "value_error" else f" (got {error['input']!r})"
    return UsageError(f"{source}: line {_line(root, loc)}: {path}: {message}{shown}")


def _key_path(loc: tuple) -> str:
    """A pydantic location as the config spells it: ``rules[0].min``."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")


def _rule(spec: _RuleSpec, source: str, line: int, ks: tuple[int, ...]) -> Rule:
    kind = next(kind for kind in KINDS if getattr(spec, kind) is not None)
    _check_metric(spec.metric, kind, f"{source}: line {line}", ks)
    try:
        return Rule(
            spec.metric,
            kind,
            float(getattr(spec, kind)),
            line,
            spec.decide,
            spec.per_slice,
            spec.min_slice_size or DEFAULT_MIN_SLICE_SIZE,
            spec.history if spec.history is not None or spec.metric not in HISTORY_METRICS else DEFAULT_HISTORY,
            spec.unless,
        )
    except UsageError as exc:
        raise UsageError(f"{source}: line {line}: {exc}") from None


def _check_expanded_size(root: yaml.Node | None, source: str) -> None:
    """Refuse a document of more than ``MAX_CONFIG_NODES`` values once its YAML aliases are expanded
    (an "alias bomb"), counting each node once (linear in the document, however deep the aliases
    nest); the message says whether aliases made it so."""
    sizes: dict[int, int] = {}
    shared = False

    def size(node: yaml.Node) -> int:
        nonlocal shared
        if id(node) in sizes:
            shared = True
            return sizes[id(node)]
        sizes[id(node)] = 1  # a recursive alias counts once
        if isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        else:
            total = 1
        sizes[id(node)] = min(total, MAX_CONFIG_NODES + 1)
        return sizes[id(node)]

    if root is not None and size(root) > MAX_CONFIG_NODES:
        what = "its YAML aliases expand it to" if shared else "it holds"
        raise UsageError(
            f"{source}: {what} more than {MAX_CONFIG_NODES:,} values; a gate config needs a few dozen: refused"
        )


def _check_metric(metric: str, kind: str, where: str, ks: tuple[int, ...]) -> None:
    per_k = PER_K.match(metric)
    if per_k and int(per_k.group(2)) not in ks:
        raise UsageError(f"{where}: metric '{metric}' needs k={per_k.group(2)} in 'ks' (now {list(ks)})")
    learner = metric == "acc" or (per_k is not None and per_k.group(1) == "cacc")
    if kind == "min_delta" and not learner:
        raise UsageError(f"{where}: min_delta applies to per-learner metrics (acc, cacc@K), not '{metric}'")
    known = PAIR_METRICS + LEARNER_METRICS + COST_METRICS + HISTORY_METRICS + FLOOR_METRICS
    if not (learner or per_k or metric in known):
        names = ("acc", "cacc@K", "ccon@K") + known
        close = difflib.get_close_matches(metric, names, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise UsageError(f"{where}: unknown metric '{metric}'; {hint}known: {', '.join(names)}")


def _line(root: yaml.Node | None, loc: tuple) -> int:
    """The 1-based YAML line of the value at ``loc`` (keys and list indices), or of the nearest
    enclosing one that exists."""
    node, line = root, 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if match is None:
                break
            line, node = match[0].start_mark.line + 1, match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line
