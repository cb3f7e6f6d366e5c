"""A model's gate history as its gate runs logged it: each gate's report and per-sample answers.

Every registry gate logs ``gate/report.json`` and the ledger ``gate/answers.parquet`` (each
sample's id, label, the baseline's and the candidate's answers; a repair's run logs its own). This
module reads them back in the order the gates ran, so ``consistency-gate history`` needs no model
loaded and no sample predicted again. Runs older than the ledger are read from ``gate/flips.json``.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from consistency_gate.errors import ModelError, error_line
from consistency_gate.mlops.tracking import LEDGER, experiment_name

REPORT = "gate/report.json"

if TYPE_CHECKING:
    from mlflow import MlflowClient


@dataclass(frozen=True)
class GateRecord:
    """One finished gate of a model: what it compared, what it decided and what it promoted."""

    run_id: str
    candidate: str
    baseline: str | None
    verdict: str
    outcome: str
    promoted: bool | None
    registered: str | None  # a repair registered in the candidate's place
    repair_run: str | None  # the run whose ledger holds the repair's answers
    n: int | None = None  # the samples the gate judged on: the rows its ledger must hold
    held_alias: bool = False  # its baseline held the baseline alias when it ran (gated against it, or promoting)
    refused: bool = False  # its move was refused: the alias had moved since it read the baseline
    kind: str = "gate"  # "gate", "shadow", or an alias move's (gate/alias.py MOVES: rollback, revert, authorize)
    unreadable: str | None = None  # why its report could not be read: what it saw and did is unknown
    moving: str | None = None  # the version its promotion asked the alias to hold (None: it asked none)
    undoes: bool = False  # a move back to the champion before (a rollback): its report says so
    moved_at: float | None = None  # when its move of the alias was asked for (its report's promotion ``at``)
    started: float = 0.0  # when its run started (seconds since the epoch)

    @property
    def promoted_version(self) -> str | None:
        """The version this gate moved the baseline alias to (None if it moved nothing)."""
        if self.promoted is not True:
            return None
        return self.registered or self.candidate


def gate_records(
    client: MlflowClient, name: str, ended: dict[str, GateRecord | None] | None = None
) -> list[GateRecord]:
    """The gates of model ``name`` that decided, in the order they started, from each run's report;
    ModelError (exit 4) when the model has no gate run to read. A gate that decided and then failed
    or was killed (at the alias move, say) counts: its report says what it compared and that its
    promotion is unknown. A run whose report exists but cannot be read is a record with
    ``unreadable`` set, never left out: what it promoted is unknown, and readers fail safe. ``ended``: the
    records of runs that had ended when read (their reports no longer change), kept by a caller that reads the
    records again and again (the guard), so that each run's report is read once.

    Example::

        [r.promoted_version for r in gate_records(client, "fraud-clf")]
        # ['2', None, '4']
    """
    experiment = client.get_experiment_by_name(experiment_name(name))
    runs = (  # a run's report decides, not its tags: tags set after a move may be lost with the move made
        client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
        if experiment is not None
        else []
    )
    records = [_kept(client, run, ended) for run in runs if run.data.params.get("model") == name]
    records = [r for r in records if r is not None]
    if not records:
        raise ModelError(
            f"model '{name}': no finished gate run in experiment '{experiment_name(name)}' to read a history from; "
            "gate a version first (consistency-gate check --model ...)"
        )
    return records


def _kept(client: MlflowClient, run: object, ended: dict[str, GateRecord | None] | None) -> GateRecord | None:
    """A run's record, from ``ended`` where it is kept there, else read (and kept when the run has ended)."""
    run_id = run.info.run_id
    if ended is not None and run_id in ended:
        return ended[run_id]
    record = _record(client, run_id, run.info.start_time / 1000 if run.info.start_time else 0.0)
    if ended is not None and run.info.status in ("FINISHED", "FAILED", "KILLED") and not (record and record.unreadable):
        ended[run_id] = record
    return record


def _record(client: MlflowClient, run_id: str, started: float) -> GateRecord | None:
    """A gate run's record from its report (None for a run without one: a gate that never decided)."""
    try:
        report = _artifact_json(client, run_id, REPORT)
    except UnreadableArtifact as exc:
        return GateRecord(run_id, "unknown", None, "unknown", "unknown", None, None, None, unreadable=str(exc),
                          started=started)  # fmt: skip
    if report is None or report.get("verdict") == "error" or not report.get("candidate"):
        return None
    base = report.get("baseline") or {}
    repair = report.get("ensemble") or {}
    kind, candidate = report.get("kind", "gate"), str(report["candidate"]["version"])
    return GateRecord(
        run_id,
        candidate,
        str(base["version"]) if base.get("version") else None,
        report["candidate_verdict"],
        report["outcome"],
        report.get("promoted"),
        report.get("registered_version"),
        repair.get("run_id") if report.get("registered_version") else None,
        report.get("n"),
        bool(base.get("alias")) or report.get("promotion") is not None,
        bool((report.get("promotion") or {}).get("refused")),
        kind,
        # a rollback's report from before the move's meaning was recorded in it says neither: its kind does
        moving=(report.get("promotion") or {}).get("version") or (candidate if kind == "rollback" else None),
        undoes=report.get("undoes", kind == "rollback"),
        moved_at=(report.get("promotion") or {}).get("at"),
        started=started,
    )


def unreadable_reports(records: list[GateRecord]) -> dict[str, str]:
    """Each run whose report could not be read, and why.

    >>> unreadable_reports([GateRecord("r1", "unknown", None, "unknown", "unknown", None, None, None,
    ...     unreadable="run r1: gate/report.json is not JSON")])
    {'r1': 'run r1: gate/report.json is not JSON'}
    """
    return {r.run_id: r.unreadable for r in records if r.unreadable}


@dataclass(frozen=True)
class Answers:
    """Each version's answers (``id``, ``label``, ``answer``) from the gates' ledgers, and for a version a
    ledger should have answered but could not (unreadable, wrong columns, repeated ids, not the rows its
    gate judged), why."""

    by_version: dict[str, pd.DataFrame]
    unread: dict[str, str]  # version -> why a ledger that would hold its answers was not used

    def get(self, version: str) -> pd.DataFrame | None:
        """The version's answers, or None."""
        return self.by_version.get(version)

    def why_missing(self, version: str) -> str:
        """Why ``version`` has no answers, in words.

        >>> Answers({}, {"3": "run abc: gate/answers.parquet has 0 rows, its gate judged 500"}).why_missing("3")
        'run abc: gate/answers.parquet has 0 rows, its gate judged 500'
        >>> Answers({}, {}).why_missing("2")
        'no gate run of the model logged its answers'
        """
        return self.unread.get(version, "no gate run of the model logged its answers")


def answers_of(client: MlflowClient, records: list[GateRecord]) -> Answers:
    """Each version's answers: the union of every ledger that holds them, so a version gated on 500 samples
    and later compared against on 620 answers all 620. An id answered in several ledgers takes its answer
    from the latest gate that judged the version itself (its own gate as a candidate, or a repair's own run),
    then from the latest gate that compared against it. Each ledger is checked first (:func:`checked_ledger`);
    one that fails is not used, and the versions it would have answered say why.

    Example::

        answers_of(client, gate_records(client, "fraud-clf")).get("3").head(2)
    """
    held: dict[str, list[pd.DataFrame]] = {}
    unread: dict[str, str] = {}
    ledgers: dict[str, tuple[pd.DataFrame | None, str | None]] = {}  # each run's read once

    def read(run_id: str, n: int | None, versions: dict[str, str]) -> None:
        if run_id not in ledgers:
            ledgers[run_id] = checked_ledger(client, run_id, n)
        ledger, why = ledgers[run_id]
        for version, column in versions.items():
            if ledger is not None:
                held.setdefault(version, []).append(_column(ledger, column))
            elif why:
                unread.setdefault(version, why)

    for record in reversed(records):  # the version's own answers first, the latest first
        read(record.run_id, record.n, {record.candidate: "candidate"})
        if record.registered and record.repair_run:
            read(record.repair_run, record.n, {record.registered: "candidate"})
    for record in reversed(records):  # then the answers gates compared against
        if record.baseline:
            read(record.run_id, record.n, {record.baseline: "previous"})
    answers = {
        version: pd.concat(frames, ignore_index=True).drop_duplicates("id", keep="first").reset_index(drop=True)
        for version, frames in held.items()
    }
    return Answers(answers, {v: why for v, why in unread.items() if v not in answers})


def _column(ledger: pd.DataFrame, which: str) -> pd.DataFrame:
    return pd.DataFrame({"id": ledger["id"], "label": ledger["label"], "answer": ledger[which]}).astype(str)


LEDGER_COLUMNS = ("id", "label", "previous", "candidate")


def checked_ledger(client: MlflowClient, run_id: str, n: int | None) -> tuple[pd.DataFrame | None, str | None]:
    """A gate run's ledger (``id``, ``label``, ``previous``, ``candidate``, as text) and None, or None and
    why it cannot be used: not Parquet, other columns, an id twice, or not the ``n`` rows its gate judged.
    A run that logged no ledger (older than it) is read from its flip table (None, None when it has
    neither)."""
    where = f"run {run_id}: {LEDGER}"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(run_id, LEDGER, tmp)
        except Exception as exc:  # noqa: BLE001 - no ledger (a run before it, or on Spark), or the store failing
            if _listed(client, run_id, LEDGER):
                return None, f"{where} cannot be read ({error_line(exc, 200)})"
            try:
                return _flip_table(client, run_id), None
            except UnreadableArtifact as unreadable:
                return None, str(unreadable)
        try:
            ledger = pd.read_parquet(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a file that is not Parquet
            return None, f"{where} is not a readable Parquet file ({type(exc).__name__}: {str(exc)[:120]})"
    absent = [c for c in LEDGER_COLUMNS if c not in ledger.columns]
    if absent:
        return None, f"{where} has columns {list(map(str, ledger.columns))}, not {', '.join(LEDGER_COLUMNS)}"
    ledger = ledger[list(LEDGER_COLUMNS)].astype(str)
    repeated = ledger["id"][ledger["id"].duplicated()]
    if len(repeated):
        return None, f"{where} holds id '{repeated.iloc[0]}' more than once"
    if n is not None and len(ledger) != n:
        return None, f"{where} holds {len(ledger)} rows where its gate judged {n} samples"
    return ledger, None


def _flip_table(client: MlflowClient, run_id: str) -> pd.DataFrame | None:
    """A run's answers from its flip table (``gate/flips.json``), for runs older than the ledger."""
    flips = _artifact_json(client, run_id, "gate/flips.json")
    if not flips:
        return None
    table = pd.DataFrame(flips["data"], columns=flips["columns"])
    names = {"previous_prediction": "previous", "candidate_prediction": "candidate"}
    return table.rename(columns=names)[list(LEDGER_COLUMNS)].astype(str)


class UnreadableArtifact(Exception):
    """A run's artifact that exists, or may exist, and cannot be read (damaged, or the store failing)."""


def _artifact_json(client: MlflowClient, run_id: str, path: str) -> dict | None:
    """A run's JSON artifact, or None when the run has none; :class:`UnreadableArtifact` when it is there
    but cannot be read, or the store cannot say whether it is there."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            text = Path(client.download_artifacts(run_id, path, tmp)).read_text()
        except Exception as exc:  # noqa: BLE001 - missing, or the store failing (MLflow raises several kinds)
            if not _listed(client, run_id, path):
                return None
            raise UnreadableArtifact(f"run {run_id}: {path} cannot be read ({error_line(exc, 200)})") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UnreadableArtifact(f"run {run_id}: {path} is not JSON ({error_line(exc, 200)})") from None


def _listed(client: MlflowClient, run_id: str, path: str) -> bool:
    """Whether ``path`` is among the run's artifacts; True when the store cannot list them (it may be)."""
    folder = path.rpartition("/")[0] or None
    try:
        return path in {a.path for a in client.list_artifacts(run_id, folder)}
    except Exception:  # noqa: BLE001 - the store failing: whether it is there is unknown
        return True
