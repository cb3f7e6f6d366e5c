"""`consistency-gate history`: a model's champions in the order they were promoted, the negative
flips of each update and their sum, and what the newest candidate forgets, read from the
ledgers its gates logged (:mod:`consistency_gate.mlops.ledger`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd

from consistency_gate.core.history import (
    Figures,
    answers,
    cumulative_figures,
    forgotten,
    forgotten_figures,
    history,
)
from consistency_gate.core.names import HISTORY_METRICS
from consistency_gate.errors import ModelError
from consistency_gate.gate.rules import Rule
from consistency_gate.mlops.ledger import answers_of, gate_records, unreadable_reports
from consistency_gate.mlops.promotion import DEFAULT_ALIAS, chain_doubt, champions, read_alias

if TYPE_CHECKING:
    from mlflow import MlflowClient

Generation = tuple[str, pd.DataFrame | None]  # a version and its logged answers (None: not logged)

DEFAULT_LAST = 5  # champions a candidate is compared with for `forgotten`
UNKNOWN_CHAIN = "*"  # in :func:`champions_before`'s reasons: why the chain itself may miss a champion


def model_history(client: MlflowClient, name: str, last: int = DEFAULT_LAST, level: float = 0.95) -> dict:
    """The history report of model ``name`` (the JSON of ``consistency-gate history``).

    Example::

        report = model_history(client, "fraud-clf")
        report["cumulative_negative_flips"], report["newest_candidate"]["forgotten"]
        # (41, 0.012)
    """
    every = gate_records(client, name)
    unreadable = unreadable_reports(every)
    records = [r for r in every if not r.unreadable]
    if not records:
        raise ModelError(f"model '{name}': no gate run's report can be read ({next(iter(unreadable.values()))})")
    found = answers_of(client, records)
    answers = found.by_version
    chain = champions(records, holder(client, name))
    h = history([(v, answers.get(v)) for v in chain], level)
    newest = records[-1]
    before = [v for v in chain if v != newest.candidate][-last:]
    held = [answers[v] for v in before if v in answers]
    lost = forgotten(answers[newest.candidate], held) if newest.candidate in answers and held else None
    gates = []
    for record in records:
        pair = [(record.baseline, answers.get(record.baseline)), (record.candidate, answers.get(record.candidate))]
        step = history(pair, level).steps if record.baseline else []
        gates.append(
            {
                "run_id": record.run_id,
                "candidate": record.candidate,
                "baseline": record.baseline,
                "verdict": record.verdict,
                "outcome": record.outcome,
                "promoted_version": record.promoted_version,
                "negative_flips": step[0].negative_flips if step else None,
                "n": step[0].n if step else None,
            }
        )
    return {
        "model": name,
        "confidence": level,
        "champions": chain,
        "missing": (missing := [v for v in dict.fromkeys([*chain, newest.candidate]) if v not in answers]),
        "missing_reasons": {v: found.why_missing(v) for v in missing},
        "steps": [s.to_dict() for s in h.steps],
        "cumulative_negative_flips": h.cumulative_negative_flips,
        "ever_regressed": h.ever_regressed,
        "samples": h.samples,
        "gates": gates,
        "newest_candidate": {"version": newest.candidate, "against": before, "forgotten": lost},
        "unreadable": unreadable,
        "gated": sum(r.kind == "gate" for r in records),
    }


def holder(client: MlflowClient, name: str) -> str | None:
    """The version ``@champion`` of model ``name`` holds now (None when unset or the registry cannot say)."""
    try:
        return read_alias(client, name, DEFAULT_ALIAS)
    except Exception:  # noqa: BLE001 - the registry failing: the chain ends with what the gates recorded
        return None


def pair_answers(samples: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A gate's flip table (id, label, both answers) as the baseline's and the candidate's answers.

    >>> said = {"previous_prediction": ["x"], "candidate_prediction": ["y"]}
    >>> samples = pd.DataFrame({"id": ["a"], "label": ["x"], **said})
    >>> [a["answer"].tolist() for a in pair_answers(samples)]
    [['x'], ['y']]
    """
    said = (samples["previous_prediction"], samples["candidate_prediction"])
    return tuple(answers(samples["id"], samples["label"], s) for s in said)


def champions_before(client: MlflowClient, name: str, baseline: str) -> tuple[list[Generation], dict[str, str]]:
    """The champions promoted before ``baseline`` (the gate's baseline, today's champion), oldest
    first, each with its answers from the gates' ledgers (none when the model has no gate yet), and
    for each champion without answers, why (:meth:`~consistency_gate.mlops.ledger.Answers.why_missing`).

    Example::

        past, unread = champions_before(client, "fraud-clf", "5")
        [v for v, _ in past]
        # ['1', '2', '3']
    """
    try:
        records = gate_records(client, name)
    except ModelError:  # no gate has run: the baseline is the only champion known
        return [], {}
    doubt = chain_doubt(unreadable_reports(records))
    records = [r for r in records if not r.unreadable]
    chain = champions(records)
    if baseline in chain:
        chain = chain[: len(chain) - chain[::-1].index(baseline) - 1]
    found = answers_of(client, records)
    unread = {v: found.why_missing(v) for v in chain if found.get(v) is None}
    return [(v, found.get(v)) for v in chain], {**unread, **({UNKNOWN_CHAIN: doubt} if doubt else {})}


def last(generations: Sequence[Generation], count: int) -> list[Generation]:
    """The last ``count`` of ``generations`` (none for 0).

    >>> last([("1", None), ("2", None)], 1), last([("1", None)], 0)
    ([('2', None)], [])
    """
    return list(generations[len(generations) - count :]) if count > 0 else []


def history_figures(
    rules: Sequence[Rule],
    past: Sequence[Generation],
    samples: pd.DataFrame,
    level: float,
    method: str = "wilson",
    unread: dict[str, str] | None = None,
) -> Figures:
    """The history metrics the ``rules`` name, for the candidate of a gate whose flip table is
    ``samples`` (id, label, both answers): ``forgotten`` against the baseline and the champions of
    ``past`` before it, ``cumulative_nfr`` over their updates and the candidate's, each over the
    last K champions its rule names (``history: K``, the baseline included). A champion its rule names
    without answers (``unread``: why) makes the metric null with the reason, so its rule fails: a
    figure over fewer champions than the rule names would pass a candidate that was never judged on them.

    >>> samples = pd.DataFrame({"id": ["a", "b"], "label": ["x", "x"], "previous_prediction": ["x", "x"],
    ...     "candidate_prediction": ["y", "x"]})
    >>> past = [("1", answers(["a", "b"], ["x", "x"], ["x", "y"]))]
    >>> rules = [Rule("forgotten", "max", 0.1, history=2), Rule("cumulative_nfr", "max", 0.1, history=2)]
    >>> history_figures(rules, past, samples, 0.95).metrics
    {'forgotten': 0.5, 'cumulative_nfr': 0.5}
    >>> figures = history_figures(rules, [("1", None)], samples, 0.95, unread={"1": "run r: bad ledger"})
    >>> figures.metrics["forgotten"], figures.null_reasons["forgotten"][:43]
    (None, "v1's answers are in no usable ledger (run r")
    """
    figures = Figures()
    doubt = (unread or {}).get(UNKNOWN_CHAIN)
    if samples.empty:
        for key in {r.metric for r in rules if r.metric in HISTORY_METRICS}:
            figures.null(key, "needs every sample's answers, which --engine spark does not keep")
        return figures
    base, cand = pair_answers(samples)
    for rule in rules:
        before = last(past, (rule.history or 1) - 1)
        absent = [v for v, a in before if a is None]
        if rule.metric in HISTORY_METRICS and doubt and (rule.history or 1) > 1:
            figures.null(
                rule.metric,
                f"{doubt}: {rule.metric} cannot be measured over the {rule.history} champions its rule names, so "
                "the rule fails; repair or delete that run's gate/report.json, or name fewer champions (history: 1)",
            )
        elif rule.metric in HISTORY_METRICS and absent:
            why = (unread or {}).get(absent[0], "no gate run of the model logged its answers")
            figures.null(
                rule.metric,
                f"v{absent[0]}'s answers are in no usable ledger ({why}): {rule.metric} cannot be measured over the "
                f"{rule.history} champions its rule names, so the rule fails; gate v{absent[0]} again to log its "
                "answers, or name fewer champions (history:)",
            )
        elif rule.metric == "forgotten":
            held = [a for _, a in before if a is not None]
            figures.update(forgotten_figures(cand, [*held, base], level, method))
        elif rule.metric == "cumulative_nfr":
            steps = history([*before, ("baseline", base), ("candidate", cand)], level).steps
            figures.update(cumulative_figures([(s.negative_flips, s.n) for s in steps], level))
    return figures


def gate_history(
    name: str, past: Sequence[Generation], samples: pd.DataFrame, versions: tuple[str, str], level: float
) -> dict:
    """The champions' updates as a gate sees them, its candidate's last (``versions``: the baseline's and
    the candidate's): ``gate/history.json`` in the run, drawn as ``gate/plots/history.png``.

    >>> samples = pd.DataFrame({"id": ["a", "b"], "label": ["x", "x"], "previous_prediction": ["x", "x"],
    ...     "candidate_prediction": ["y", "x"]})
    >>> report = gate_history("clf", [("1", answers(["a", "b"], ["x", "x"], ["x", "y"]))], samples, ("2", "3"), 0.95)
    >>> [(s["version"], s["negative_flips"]) for s in report["steps"]], report["cumulative_negative_flips"]
    ([('2', 0), ('3', 1)], 1)
    """
    base, cand = pair_answers(samples)
    h = history([*past, (versions[0], base), (versions[1], cand)], level)
    return {
        "model": name,
        "confidence": level,
        "champions": [v for v, _ in past] + [versions[0]],
        "candidate": versions[1],
        "steps": [s.to_dict() for s in h.steps],
        "cumulative_negative_flips": h.cumulative_negative_flips,
        "ever_regressed": h.ever_regressed,
        "missing": [v for v, a in past if a is None],
    }
