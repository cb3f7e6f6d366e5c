"""`consistency-gate history`: a model's champions in the order they were promoted, the negative
flips of each update and their sum, and what the newest candidate forgets (SPEC 5), read from the
ledgers its gates logged (:mod:`consistency_gate.mlops.ledger`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from consistency_gate.core.history import forgotten, history
from consistency_gate.mlops.ledger import GateRecord, answers_of, gate_records

if TYPE_CHECKING:
    from mlflow import MlflowClient

DEFAULT_LAST = 5  # champions a candidate is compared with for `forgotten`


def champions(records: list[GateRecord]) -> list[str]:
    """The versions that held the baseline alias, in the order they were promoted: the first
    promoting gate's baseline, then each version a gate promoted (a repair where one was registered).

    >>> r = lambda c, b, p: GateRecord("run", c, b, "passed", "passed", p, None, None)
    >>> champions([r("2", "1", True), r("3", "2", False), r("4", "2", True)])
    ['1', '2', '4']
    """
    promoted = [r for r in records if r.promoted_version is not None]
    first = (promoted[0] if promoted else records[-1]).baseline
    chain = [first] if first else []
    for record in promoted:
        if not chain or chain[-1] != record.promoted_version:
            chain.append(record.promoted_version)
    return chain


def model_history(client: MlflowClient, name: str, last: int = DEFAULT_LAST, level: float = 0.95) -> dict:
    """The history report of model ``name`` (the JSON of ``consistency-gate history``).

    Example::

        report = model_history(client, "fraud-clf")
        report["cumulative_negative_flips"], report["newest_candidate"]["forgotten"]
        # (41, 0.012)
    """
    records = gate_records(client, name)
    answers = answers_of(client, records)
    chain = champions(records)
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
        "missing": [v for v in dict.fromkeys([*chain, newest.candidate]) if v not in answers],
        "steps": [s.to_dict() for s in h.steps],
        "cumulative_negative_flips": h.cumulative_negative_flips,
        "ever_regressed": h.ever_regressed,
        "samples": h.samples,
        "gates": gates,
        "newest_candidate": {"version": newest.candidate, "against": before, "forgotten": lost},
    }
