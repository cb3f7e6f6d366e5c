"""Gate configuration (YAML) and rule evaluation: pure logic, no MLflow.

>>> config = parse_config("rules:\\n  - {metric: ctoi, max: 0.02}\\n  - {metric: acc, min_delta: 0}\\n")
>>> results = evaluate_rules(config.rules, {"ctoi": 0.05, "acc_candidate": 0.9, "acc_previous": 0.88})
>>> [(r.rule.metric, r.held) for r in results]
[('ctoi', False), ('acc', True)]
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
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

from consistency_gate.core import intervals as ci
from consistency_gate.core.intervals import METHODS
from consistency_gate.core.threshold import DEFAULT_THRESHOLD, BinaryDecision
from consistency_gate.ensembles.config import RemediationBlock
from consistency_gate.errors import UsageError

if TYPE_CHECKING:
    from consistency_gate.core.slices import SliceResult
    from consistency_gate.ensembles.config import RemediationConfig

# metrics that are a share of all evaluated samples (intervals: Wilson over n)
SHARES = ("acc_previous", "acc_candidate", "con", "acc_con", "ctoc", "ctoi", "itoc", "itoi")
PAIR_METRICS = (
    "con", "acc_con", "ctoc", "ctoi", "itoc", "itoi", "com", "pearson", "cosine", "btc", "bec", "rel_nfr",
)  # fmt: skip
LEARNER_METRICS = ("acc_previous", "acc_candidate")
# serving cost of what is gated relative to the candidate (mlops/cost.py): min/max on the estimate
COST_METRICS = ("latency_ratio", "size_ratio")
# measured over the model's champions (SPEC 5, gate/history.py): a rule names how many with `history: K`
HISTORY_METRICS = ("forgotten", "cumulative_nfr")
DEFAULT_HISTORY = 5
# measured against a seed replica of the baseline (`floor:` / --floor)
FLOOR_METRICS = ("ctoi_excess", "floor_ctoi", "floor_con")
# each kind of threshold and how it reads: value >= t, value <= t, (candidate - previous) >= t; a
# min_delta rule names what it compares "<metric> change" (Rule.quantity), never the metric itself
OPERATORS = {"min": ">=", "max": "<=", "min_delta": ">="}
KINDS = tuple(OPERATORS)
# what a rule compares with its threshold: the point estimate, or a bound of the metric's interval
DECIDE = ("estimate", "upper", "lower")
DEFAULT_SOURCE = "default config"
# a per-slice rule judges the slices with at least this many samples (smaller ones are reported only)
DEFAULT_MIN_SLICE_SIZE = 50
MAX_CONFIG_BYTES = 256_000  # a gate config is a few KB; 1,000 long class names fit
MAX_CONFIG_NODES = 100_000
_PER_K = re.compile(r"^(ccon|cacc_previous|cacc_candidate|cacc)@([1-9][0-9]*)$")


@dataclass(frozen=True)
class Rule:
    """One threshold: ``metric`` ``kind`` ``threshold`` (kind is min, max or min_delta).

    A Rule validates itself: an unknown kind or a threshold that is not a finite number is a
    UsageError (exit 2), whoever builds it.

    >>> Rule("con", "mx", 0.9)
    Traceback (most recent call last):
    ...
    consistency_gate.errors.UsageError: rule for 'con': kind must be one of min, max, min_delta, got 'mx'
    """

    metric: str
    kind: str
    threshold: float
    line: int | None = None
    decide: str = "estimate"  # or "upper"/"lower": compare that bound of the metric's interval
    per_slice: bool = False  # judge every slice of at least min_slice_size samples instead of the whole set
    min_slice_size: int = DEFAULT_MIN_SLICE_SIZE
    history: int | None = None  # a history metric's champions (the baseline and those before it)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(f"rule for '{self.metric}': kind must be one of {', '.join(KINDS)}, got '{self.kind}'")
        if not math.isfinite(self.threshold):
            raise UsageError(f"rule for '{self.metric}': the {self.kind} threshold must be a finite number")
        if self.decide not in DECIDE:
            choices = ", ".join(DECIDE)
            raise UsageError(f"rule for '{self.metric}': decide must be one of {choices}, got '{self.decide}'")
        if self.kind == "min_delta" and self.decide != "estimate" and self.metric != "acc":
            raise UsageError(
                f"rule for '{self.metric}': decide: {self.decide} on min_delta needs a paired interval, which "
                "acc has (Newcombe's); use decide: estimate for cacc@K deltas"
            )
        if self.metric in COST_METRICS and (self.decide != "estimate" or self.per_slice):
            raise UsageError(
                f"rule for '{self.metric}': a serving cost is measured once, without an interval or slices; "
                "use decide: estimate and no per_slice"
            )
        if self.min_slice_size < 1:
            raise UsageError(f"rule for '{self.metric}': min_slice_size must be at least 1, got {self.min_slice_size}")
        if (self.history is not None) != (self.metric in HISTORY_METRICS) or (self.history or 1) < 1:
            raise UsageError(
                f"rule for '{self.metric}': history: K (at least 1 champion) applies to "
                f"{', '.join(HISTORY_METRICS)} only"
            )
        if self.per_slice and self.metric in HISTORY_METRICS + FLOOR_METRICS:
            raise UsageError(f"rule for '{self.metric}': measured on the whole set, not per slice; drop per_slice")

    @property
    def single_model(self) -> bool:
        """Checkable without a previous generation (acc / cacc@K with min or max, serving cost)."""
        return self.kind != "min_delta" and (
            self.metric in ("acc", "acc_candidate", *COST_METRICS) or self.metric.startswith("cacc@")
        )

    @property
    def quantity(self) -> str:
        """What the rule compares with its threshold: the metric, or for min_delta its change from
        the previous generation to the candidate (``acc change``), so the row never reads like the
        accuracy itself.

        >>> Rule("acc", "min_delta", -0.01).quantity, Rule("acc", "min", 0.9).quantity
        ('acc change', 'acc')
        """
        return f"{self.metric} change" if self.kind == "min_delta" else self.metric

    @property
    def condition(self) -> str:
        """The threshold as it reads: ``>= 0.9``, ``<= 0.02``, ``>= -0.01`` (of the change, for min_delta),
        with the bound compared when it is not the estimate: ``<= 0.02 (upper bound)``, and the
        slices a per-slice rule judges: ``<= 0.05 in every slice of n >= 50``."""
        bound = "" if self.decide == "estimate" else f" ({self.decide} bound)"
        where = f" in every slice of n >= {self.min_slice_size}" if self.per_slice else ""
        if self.history is not None:
            where = f" over the last {self.history} champion{'s' if self.history != 1 else ''}"
        return f"{OPERATORS[self.kind]} {self.threshold:g}{bound}{where}"

    @property
    def interval_key(self) -> str:
        """The key of the interval a ``decide: upper/lower`` rule reads (``acc_delta`` for min_delta)."""
        return "acc_delta" if self.kind == "min_delta" else candidate_key(self.metric)

    def describe(self) -> str:
        """The rule as it reads: ``con >= 0.95``, ``acc change >= -0.01``."""
        return f"{self.quantity} {self.condition}"

    def holds(self, value: float) -> bool:
        """Whether a measured value (a delta for min_delta) meets the threshold; a tolerance of 1e-12
        absorbs float rounding (a delta of exactly -0.01 computed as -0.0100...02)."""
        if self.kind == "max":
            return value <= self.threshold + 1e-12
        return value >= self.threshold - 1e-12


@dataclass
class GateConfig:
    """A checked gate config: the rules, the k values, the remediation block and class names."""

    rules: list[Rule]
    ks: tuple[int, ...] = (1, 5)
    remediation: RemediationConfig | None = None
    classes: list[str] | None = None
    source: str = "default"
    ks_given: bool = False  # the user's config names ks (then each must fit the models' classes)
    confidence: float = 0.95  # the level of the metrics' intervals
    interval_method: str = "wilson"  # for proportions: wilson or clopper-pearson
    slices: tuple[str, ...] = ()  # slicing columns of the evaluation data (or TRUE_CLASS)
    decision: BinaryDecision | None = None  # a binary model's positive class and threshold (decision: block)
    floor: str | None = None  # a seed replica of the baseline: a version of the model ('7', '@replica')

    @property
    def needs_history(self) -> bool:
        """Whether a rule is judged over the model's champions (its gates' ledgers are read)."""
        return any(r.metric in HISTORY_METRICS for r in self.rules)


@dataclass(frozen=True)
class RuleResult:
    """A rule, the value it was checked against, and the outcome (``held`` None: skipped).

    ``interval`` is the metric's two-sided interval (for min_delta: of the difference) when known,
    ``compared`` what was compared with the threshold: the value, or the one-sided bound ``decide``
    names, described by ``judged_on``; ``false_pass`` the chance that a model exactly at the
    threshold passes this rule on a set of this size (see :func:`false_pass`).
    """

    rule: Rule
    value: float | None
    held: bool | None
    note: str = ""
    interval: list[float] | None = None
    compared: float | None = None
    slices: tuple[dict, ...] = ()  # a per-slice rule: each slice's outcome (value, interval, held)
    judged_on: str = "estimate"
    false_pass: float | None = None

    def record(self) -> dict:
        """The rule's row in the rule table logged to the run (``gate/rules.json``): short columns,
        the rule and its outcome first, so the MLflow UI shows them whole at its default width;
        numbers to 4 decimals (``gate/report.json`` keeps them whole).

        >>> rule = Rule("ctoi", "max", 0.02, decide="upper")
        >>> result = RuleResult(rule, 0.01, False, "", [0.004, 0.03], 0.027, (), "one-sided 95% upper bound", 0.0443)
        >>> record = result.record()
        >>> record["rule"], record["outcome"], record["bound"], record["judged on"], record["false pass"]
        ('ctoi <= 0.02', 'FAILED', 0.027, 'one-sided 95% upper bound', 0.0443)
        """
        low, high = (_rounded(v) for v in (self.interval or (None, None)))
        judged = self.judged_on
        if self.rule.per_slice:
            judged += f", worst slice of n >= {self.rule.min_slice_size}"
        return {
            "rule": f"{self.rule.quantity} {OPERATORS[self.rule.kind]} {self.rule.threshold:g}",
            "outcome": "skipped" if self.held is None else ("held" if self.held else "FAILED"),
            "value": _rounded(self.value),
            "low": low,
            "high": high,
            "bound": _rounded(self.compared) if self.rule.decide != "estimate" else None,
            "judged on": judged,
            "false pass": _rounded(self.false_pass),
            "note": self.note,
        }

    def to_dict(self) -> dict:
        """As in the JSON report (a per-slice rule adds ``slices``: each
        slice's outcome; ``value``, ``interval`` and ``compared`` are then the worst judged slice's)."""
        extra = {}
        if self.rule.per_slice:
            extra = {"per_slice": True, "min_slice_size": self.rule.min_slice_size, "slices": list(self.slices)}
        if self.rule.history is not None:
            extra["history"] = self.rule.history
        return {
            "metric": self.rule.metric,
            "quantity": self.rule.quantity,
            "kind": self.rule.kind,
            "threshold": self.rule.threshold,
            "decide": self.rule.decide,
            "condition": self.rule.condition,
            "value": self.value,
            "interval": self.interval,
            "compared": self.compared,
            "judged_on": self.judged_on,
            "false_pass": self.false_pass,
            "held": self.held,
            "note": self.note,
            **extra,
        }


def default_config_text() -> str:
    """The packaged default config (``consistency-gate config --default``).

    >>> default_config_text().splitlines()[0]
    '# consistency-gate: default gate configuration.'
    """
    return resources.files("consistency_gate").joinpath("default_config.yaml").read_text()


def load_config(path: str | Path | None) -> GateConfig:
    """The gate configuration from a YAML file, or the packaged default when ``path`` is None.

    >>> [r.describe() for r in load_config(None).rules][:2]
    ['acc change >= -0.01', 'ctoi <= 0.02']
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
        ks_given="ks" in data and source != DEFAULT_SOURCE,
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
    per_k = _PER_K.match(metric)
    if per_k and int(per_k.group(2)) not in ks:
        raise UsageError(f"{where}: metric '{metric}' needs k={per_k.group(2)} in 'ks' (now {list(ks)})")
    learner = metric == "acc" or (per_k is not None and per_k.group(1) == "cacc")
    if kind == "min_delta" and not learner:
        raise UsageError(f"{where}: min_delta applies to per-learner metrics (acc, cacc@K), not '{metric}'")
    known = PAIR_METRICS + LEARNER_METRICS + COST_METRICS + HISTORY_METRICS + FLOOR_METRICS
    if not (learner or per_k or metric in known):
        names = ", ".join(("acc", "cacc@K", "ccon@K") + known)
        raise UsageError(f"{where}: unknown metric '{metric}'; known: {names}")


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


def candidate_key(metric: str) -> str:
    """The metrics-dict key a rule reads for the candidate (acc -> acc_candidate).

    >>> candidate_key("acc"), candidate_key("cacc@5"), candidate_key("ctoi")
    ('acc_candidate', 'cacc_candidate@5', 'ctoi')
    """
    if metric == "acc":
        return "acc_candidate"
    if metric.startswith("cacc@"):
        return "cacc_candidate@" + metric.split("@")[1]
    return metric


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def evaluate_rules(
    rules: list[Rule],
    metrics: dict[str, float | None],
    first_generation: bool = False,
    intervals: dict[str, list[float]] | None = None,
    bounds: dict[str, list[float]] | None = None,
    level: float = 0.95,
    n: int = 0,
    slices: Sequence[SliceResult] = (),
) -> list[RuleResult]:
    """Check each rule against the measured metrics; a ``decide: upper/lower`` rule against the
    one-sided ``bounds`` at ``level`` (``{key: [lower, upper]}``, see
    :meth:`~consistency_gate.core.counts.ConsistencyCounts.bounds`), reported beside the two-sided
    ``intervals``. A null metric, or a missing bound a rule needs, fails its rule. A rule on a share
    of the ``n`` samples that fails on its bound although its estimate meets the threshold says how
    many samples would pass it with 80% power. A ``per_slice`` rule is checked on each of the
    ``slices`` with at least ``min_slice_size`` samples, and holds when it holds on all of them.

    >>> rule = Rule("ctoi", "max", 0.02, decide="upper")
    >>> (result,) = evaluate_rules([rule], {"ctoi": 0.018}, bounds={"ctoi": [0.011, 0.029]}, n=600)
    >>> result.held, result.compared, result.judged_on, round(result.false_pass, 4)
    (False, 0.029, 'one-sided 95% upper bound (exact binomial)', 0.0443)
    """
    results = []
    for rule in rules:
        if first_generation and not rule.single_model:
            results.append(RuleResult(rule, None, None, "skipped: first generation, no baseline to compare with"))
        elif rule.per_slice:
            results.append(_check_slices(rule, slices, level))
        else:
            results.append(_check(rule, metrics, intervals or {}, bounds or {}, level, n))
    return results


def with_margin(rule: Rule) -> Rule:
    """``rule`` judged on its strict one-sided bound (upper for a max, lower for a min and for acc's
    min_delta): a setting tuned on a calibration set must pass there with room for the sampling error,
    not by a hair on the estimate, to pass the evaluation set too. Rules that have no such bound (a
    serving cost, a min_delta of another metric) are left as they are.

    >>> with_margin(Rule("ctoi", "max", 0.02)).decide, with_margin(Rule("con", "min", 0.9)).decide
    ('upper', 'lower')
    """
    if rule.metric in COST_METRICS or (rule.kind == "min_delta" and rule.metric != "acc"):
        return rule
    return replace(rule, decide="upper" if rule.kind == "max" else "lower")


def tuning_confidence(level: float) -> float:
    """The one-sided level a repair's setting is tuned at on a calibration set, for a gate at ``level``:
    twice the normal quantile, so the bound there leaves room for the sampling error of both sets (a rule
    already judged on its bound is judged on it again on the evaluation set).

    >>> round(tuning_confidence(0.95), 4)
    0.9995
    """
    from scipy.special import ndtr, ndtri

    return float(ndtr(2 * ndtri(level)))


def judged_on(rule: Rule, level: float) -> str:
    """What a rule compares with its threshold, in words.

    >>> judged_on(Rule("con", "min", 0.9, decide="lower"), 0.95)
    'one-sided 95% lower bound (exact binomial)'
    >>> judged_on(Rule("acc", "min_delta", 0, decide="lower"), 0.9)
    'one-sided 90% lower bound'
    """
    if rule.decide == "estimate":
        return "estimate"
    exact = " (exact binomial)" if rule.kind != "min_delta" and is_share_of_samples(rule.metric) else ""
    return f"one-sided {level:.0%} {rule.decide} bound{exact}"


def false_pass(rule: Rule, level: float, n: int) -> float | None:
    """The chance that a model exactly at the threshold passes ``rule`` on ``n`` samples: exact
    (binomial) for a share of the samples; for other metrics the nominal rate of how it decides
    (a strict bound ``1 - level``, the estimate 0.5, a lenient bound ``level``); None for a
    serving cost, which is measured, not sampled.

    >>> round(false_pass(Rule("ctoi", "max", 0.02, decide="upper"), 0.95, 600), 4)
    0.0443
    >>> false_pass(Rule("pearson", "min", 0.9, decide="lower"), 0.95, 600)
    0.05
    """
    if rule.metric in COST_METRICS:
        return None
    at_most = rule.kind == "max"
    if rule.kind != "min_delta" and is_share_of_samples(rule.metric):
        if n <= 0:
            return None
        return float(ci.pass_probability(n, rule.threshold, rule.threshold, at_most, rule.decide, level))
    if rule.decide == "estimate":
        return 0.5
    strict = rule.decide == ("upper" if at_most else "lower")
    return round(1 - level, 12) if strict else level


def _check(
    rule: Rule,
    metrics: dict[str, float | None],
    intervals: dict[str, list[float]],
    bounds: dict[str, list[float]],
    level: float,
    n: int,
) -> RuleResult:
    """One rule on one set of metrics (the whole evaluation set, or one slice)."""
    value = metrics.get(candidate_key(rule.metric))
    if rule.kind == "min_delta" and value is not None:
        previous = metrics.get(candidate_key(rule.metric).replace("candidate", "previous"))
        value = None if previous is None else value - previous
    interval = intervals.get(rule.interval_key)
    basis = {"judged_on": judged_on(rule, level), "false_pass": false_pass(rule, level, n)}
    if value is None:
        return RuleResult(rule, None, False, "metric is null: rule fails", interval, **basis)
    if rule.decide == "estimate":
        return RuleResult(rule, value, rule.holds(value), "", interval, value, **basis)
    bound = bounds.get(rule.interval_key)
    if bound is None:
        return RuleResult(rule, value, False, "no bound for this metric: rule fails", interval, **basis)
    compared = bound[1] if rule.decide == "upper" else bound[0]
    held = rule.holds(compared)
    note = "" if held else _advice(rule, value, level, n)
    return RuleResult(rule, value, held, note, interval, compared, **basis)


def _check_slices(rule: Rule, slices: Sequence[SliceResult], level: float) -> RuleResult:
    """A per-slice rule: checked on every slice of at least ``min_slice_size`` samples; its value,
    interval and compared bound are those of the worst judged slice."""
    judged = [
        (s, _check(rule, s.metrics, s.intervals, s.bounds, level, s.n)) for s in slices if s.n >= rule.min_slice_size
    ]
    small = len(slices) - len(judged)
    rows = tuple(
        {"slice": s.name, "n": s.n, "value": r.value, "interval": r.interval, "compared": r.compared, "held": r.held}
        for s, r in judged
    )
    under = f"{small} slice{'s' if small != 1 else ''} under {rule.min_slice_size} samples not judged" if small else ""
    if not judged:
        note = f"no slice has {rule.min_slice_size} samples: nothing judged" + (f" ({under})" if small else "")
        return RuleResult(rule, None, None, note)

    def badness(pair: tuple[SliceResult, RuleResult]) -> tuple[bool, float]:
        compared = pair[1].compared
        if compared is None:  # a null metric or a missing interval fails: worst of all
            return (True, math.inf)
        return (not pair[1].held, compared if rule.kind == "max" else -compared)

    worst, result = max(judged, key=badness)
    failing = sum(r.held is False for _, r in judged)
    parts = [
        f"worst slice {worst.name} (n={worst.n})",
        f"{failing} of {len(judged)} slices fail" if failing else f"all {len(judged)} slices hold",
    ]
    if under:
        parts.append(under)
    if result.note:
        parts.append(result.note)
    return RuleResult(
        rule, result.value, failing == 0, "; ".join(parts), result.interval, result.compared, rows,
        result.judged_on, result.false_pass,
    )  # fmt: skip


def is_share_of_samples(metric: str) -> bool:
    """Whether a rule's metric is a proportion of all evaluated samples (sample sizes apply).

    >>> is_share_of_samples("ctoi"), is_share_of_samples("ccon@5"), is_share_of_samples("pearson")
    (True, True, False)
    """
    key = candidate_key(metric)
    return key in (*SHARES, "forgotten", "floor_ctoi", "floor_con") or _PER_K.match(key) is not None


def _advice(rule: Rule, value: float, level: float, n: int) -> str:
    """How many samples would pass the rule with 80% power at the measured rate; empty if none would."""
    if rule.kind == "min_delta" or not is_share_of_samples(rule.metric) or not rule.holds(value):
        return ""
    needed = ci.samples_needed(value, rule.threshold, rule.kind == "max", level, rule.decide, coarse=True)
    if needed is None:
        return ""
    return (
        f"the estimate meets it, its {rule.decide} bound does not: at this rate about {needed:,} samples "
        f"would pass it with 80% power (this set has {n:,})"
    )


def plan_sizes(rules: list[Rule], rates: dict[str, float], level: float, power: float = 0.8) -> list[dict]:
    """For each rule, the evaluation-set size at which it gives the right answer with probability
    ``power`` for a model at the expected ``rates`` (``{metric: rate}``): passes it when the rate
    meets the threshold, fails it when not, deciding as the rule does at one-sided ``level``
    (``consistency-gate plan``; exact binomial, see :func:`consistency_gate.core.intervals.samples_needed`).
    Each row also gives the rule's false-pass rate at that size.

    >>> row = plan_sizes([Rule("ctoi", "max", 0.02, decide="upper")], {"ctoi": 0.01}, 0.95)[0]
    >>> row["samples"], round(row["power"], 3), round(row["false_pass"], 3)
    (969, 0.821, 0.05)
    >>> estimate = plan_sizes([Rule("ctoi", "max", 0.02)], {"ctoi": 0.0}, 0.95)[0]
    >>> estimate["samples"], estimate["note"]
    (1, 'judged on the estimate, a model exactly at the threshold passes 98% of the time at this size (about \
half on large sets): decide: upper bounds that at 5%')
    """
    rows = []
    for rule in rules:
        row = {"rule": rule.describe(), "decide": rule.decide, "rate": rates.get(rule.metric), "samples": None}
        row |= {"power": None, "false_pass": None, "note": ""}
        rate, at_most = row["rate"], rule.kind == "max"
        if rule.kind == "min_delta" or not is_share_of_samples(rule.metric):
            row["note"] = "not a share of the samples: no size formula"
        elif rate is None:
            row["note"] = f"give --rate {rule.metric}=R, the rate you expect"
        else:
            row["samples"] = ci.samples_needed(rate, rule.threshold, at_most, level, rule.decide, power)
            if row["samples"] is None:
                meets = rate < rule.threshold if at_most else rate > rule.threshold
                row["note"] = (
                    "no size passes it: the expected rate is at or past the threshold"
                    if not meets or rate == rule.threshold
                    else "no size up to 10,000,000 reaches the power"
                )
            else:
                passes = float(ci.pass_probability(row["samples"], rate, rule.threshold, at_most, rule.decide, level))
                meets = rate < rule.threshold if at_most else rate > rule.threshold
                row["power"] = passes if meets else 1 - passes
                row["false_pass"] = false_pass(rule, level, row["samples"])
                if not meets:
                    row["note"] = "the expected rate breaks the rule: the size that fails it"
                elif rule.decide == "estimate":  # any size passes a model at its rate; the false pass is the issue
                    row["note"] = (
                        f"judged on the estimate, a model exactly at the threshold passes {row['false_pass']:.0%} of "
                        f"the time at this size (about half on large sets): decide: "
                        f"{'upper' if at_most else 'lower'} bounds that at {1 - level:.0%}"
                    )
        rows.append(row)
    return rows


def verdict(results: list[RuleResult]) -> str:
    """'passed' when no checked rule failed.

    >>> verdict(evaluate_rules([Rule("con", "min", 0.9)], {"con": 0.95}))
    'passed'
    """
    return "failed" if any(r.held is False for r in results) else "passed"
