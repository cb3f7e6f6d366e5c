"""``consistency-gate config --check FILE --model NAME``: a gate config checked against the model it will gate,
before a gate runs: the classes each generation answers in (the config's ``ks`` that apply, the rules on a k that
does not), whether it gives class scores (the rules that need them), a ``decision:`` block on a model that is not
binary. A rule that cannot be judged for the model is one line, exit 2; what could not be checked is said.

What a generation answers is read, without the evaluation data, from one row of the input example logged with
it (``log_model(..., input_example=...)``), else from its classes tag (``consistency_gate.classes``); with
``--data``, from one row of the evaluation set.

    lines = check_against_model(load_config("gate.yaml"), "fraud-clf", "sqlite:///mlflow.db")
    # ['models:/fraud-clf/1 (@champion): 2 classes (its input example predicted)', ...]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from consistency_gate.core.evaluation import inapplicable_ks
from consistency_gate.errors import GateError, UsageError
from consistency_gate.gate.config import GateConfig
from consistency_gate.mlops.registry import ModelRef


@dataclass(frozen=True)
class Answers:
    """What one generation answers: its class names in output order (None: class labels only; an empty list: it
    could not be told) and what said so."""

    ref: ModelRef
    classes: list[str] | None
    found: str

    def describe(self) -> str:
        """The generation and what it answers, in words.

        >>> Answers(ModelRef("clf", "2", "champion"), ["no", "yes"], "its classes tag").describe()
        'models:/clf/2 (@champion): 2 classes: no, yes (its classes tag)'
        """
        name = self.ref.uri + (f" (@{self.ref.alias})" if self.ref.alias else "")
        if self.classes is None:
            return f"{name}: class labels only, no class scores ({self.found})"
        if not self.classes:
            return f"{name}: its classes could not be told ({self.found})"
        shown = ", ".join(self.classes[:10]) + (" ..." if len(self.classes) > 10 else "")
        return f"{name}: {len(self.classes)} classes: {shown} ({self.found})"


def check_against_model(
    cfg: GateConfig,
    name: str,
    tracking_uri: str | None,
    candidate: str | None = None,
    baseline: str = "@champion",
    data: Path | None = None,
    label_column: str = "label",
    id_column: str | None = None,
) -> list[str]:
    """Check ``cfg`` against the baseline (``@champion``; none set: a first generation) and the candidate (default
    the latest version) of model ``name``; the lines to print. A UsageError (exit 2) names the first rule that
    cannot be judged for them, ModelError (exit 4) a model or version that is not there."""
    from consistency_gate.mlops.registry import alias_exists, resolve_version
    from consistency_gate.mlops.store import connect

    _, client = connect(tracking_uri, existing=True)
    cand_ref = resolve_version(client, name, candidate)
    base_ref = None
    if not baseline.startswith("@") or alias_exists(client, name, baseline[1:]):
        base_ref = resolve_version(client, name, baseline)
    frame = None
    if data is not None:
        from consistency_gate.io.predictions import read_evaluation_data

        frame = read_evaluation_data(Path(data), label_column, id_column, max_rows=1)
    roles = {"previous": base_ref, "candidate": cand_ref} if base_ref else {"candidate": cand_ref}
    answers = {role: answers_of(ref, cfg.classes, frame, label_column, id_column) for role, ref in roles.items()}
    lines = [f"checked against model '{name}':", *(f"  {a.describe()}" for a in answers.values())]
    if base_ref is None:
        lines.append(f"  {baseline} is not set: the candidate is a first generation (only its own accuracy is judged)")
    cfg.unjudged_for_labels({role: a.ref.uri for role, a in answers.items() if a.classes is None})
    widths = {a.ref.uri: len(a.classes) for a in answers.values() if a.classes}
    cfg.counted_ks(widths)
    binary = next((a.classes for a in answers.values() if a.classes), None)
    if cfg.decision is not None and binary is not None:
        try:
            cfg.decision.resolved(binary, binary[-1])
        except UsageError as exc:
            raise UsageError(f"{cfg.source}: decision: {exc}") from None
    figures = inapplicable_ks(cfg.ks, widths)
    lines += [f"  ks: {why}: ccon@{key[5:]} and cacc@{key[5:]} are reported as null"
              for key, why in figures.null_reasons.items() if key.startswith("ccon@")]  # fmt: skip
    unknown = [a.ref.uri for a in answers.values() if a.classes == []]
    if unknown:
        lines.append(
            f"  not checked for {', '.join(unknown)}: its classes (ks, top-k rules, decision:) and whether it gives "
            "class scores; give --data EVAL_FILE, or log the model with an input example"
        )
    return lines


def answers_of(
    ref: ModelRef, hint: list[str] | None, frame: pd.DataFrame | None, label_column: str, id_column: str | None
) -> Answers:
    """What version ``ref`` answers (:class:`Answers`): one row of ``frame`` (the evaluation data) predicted, else
    one row of its logged input example, else its classes tag (or the config's ``classes:``, ``hint``)."""
    from consistency_gate.mlops import flavors, scoring

    model = scoring.load_model(ref, hint)
    if frame is not None:
        exclude = scoring.non_features(label_column, id_column)
        return Answers(ref, scoring.model_classes(model, frame, exclude), "one row of the evaluation data predicted")
    example = _input_example(ref)
    if example is not None:
        try:
            return Answers(ref, scoring.model_classes(model, example, ()), "its logged input example predicted")
        except GateError:
            pass  # an example the model does not take as given (a tensor's): the tag may still say
    tagged = flavors.tagged_classes(ref) or hint
    if tagged:
        return Answers(ref, tagged, "its classes tag" if flavors.tagged_classes(ref) else "the config's classes:")
    return Answers(ref, [], "no input example logged, no classes tag")


def _input_example(ref: ModelRef) -> pd.DataFrame | None:
    """One row of the input example logged with the version, as a frame (None: none logged, or not a table)."""
    import mlflow

    try:
        example = mlflow.models.Model.load(ref.uri).load_input_example(ref.uri)
    except Exception:  # noqa: BLE001 - an example that cannot be read is one the check does without
        return None
    if example is None:
        return None
    try:
        return pd.DataFrame(example).head(1)
    except (ValueError, TypeError):
        return None
