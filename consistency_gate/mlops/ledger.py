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

from consistency_gate.errors import ModelError
from consistency_gate.mlops.tracking import LEDGER, experiment_name

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

    @property
    def promoted_version(self) -> str | None:
        """The version this gate moved the baseline alias to (None if it moved nothing)."""
        if self.promoted is not True:
            return None
        return self.registered or self.candidate


def gate_records(client: MlflowClient, name: str) -> list[GateRecord]:
    """The finished gates of model ``name`` in the order they started, from each run's report;
    ModelError (exit 4) when the model has no gate run to read.

    Example::

        [r.promoted_version for r in gate_records(client, "fraud-clf")]
        # ['2', None, '4']
    """
    experiment = client.get_experiment_by_name(experiment_name(name))
    query = "attributes.status = 'FINISHED' and tags.`consistency_gate.outcome` != 'pending'"
    runs = (
        client.search_runs([experiment.experiment_id], filter_string=query, order_by=["attributes.start_time ASC"])
        if experiment is not None
        else []
    )
    records = [_record(client, run.info.run_id) for run in runs if run.data.params.get("model") == name]
    records = [r for r in records if r is not None]
    if not records:
        raise ModelError(
            f"model '{name}': no finished gate run in experiment '{experiment_name(name)}' to read a history from; "
            "gate a version first (consistency-gate check --model ...)"
        )
    return records


def _record(client: MlflowClient, run_id: str) -> GateRecord | None:
    """A gate run's record from its report (None for a run without one: a gate that never decided)."""
    report = _artifact_json(client, run_id, "gate/report.json")
    if report is None or report.get("verdict") == "error" or not report.get("candidate"):
        return None
    base = report.get("baseline") or {}
    repair = report.get("ensemble") or {}
    return GateRecord(
        run_id,
        str(report["candidate"]["version"]),
        str(base["version"]) if base.get("version") else None,
        report["candidate_verdict"],
        report["outcome"],
        report.get("promoted"),
        report.get("registered_version"),
        repair.get("run_id") if report.get("registered_version") else None,
    )


def answers_of(client: MlflowClient, records: list[GateRecord]) -> dict[str, pd.DataFrame]:
    """Each version's answers (``id``, ``label``, ``answer``): the union of every ledger that holds them,
    so a version gated on 500 samples and later compared against on 620 answers all 620. An id answered
    in several ledgers takes its answer from the latest gate that judged the version itself (its own gate as
    a candidate, or a repair's own run), then from the latest gate that compared against it.

    Example::

        answers_of(client, gate_records(client, "fraud-clf"))["3"].head(2)
    """
    ledgers = {r.run_id: _ledger(client, r.run_id) for r in records}  # each read once
    held: dict[str, list[pd.DataFrame]] = {}
    for record in reversed(records):  # the version's own answers first, the latest first
        if ledgers[record.run_id] is not None:
            held.setdefault(record.candidate, []).append(_column(ledgers[record.run_id], "candidate"))
        if record.registered and record.repair_run:
            repair = _ledger(client, record.repair_run)
            if repair is not None:
                held.setdefault(record.registered, []).append(_column(repair, "candidate"))
    for record in reversed(records):  # then the answers gates compared against
        if record.baseline and ledgers[record.run_id] is not None:
            held.setdefault(record.baseline, []).append(_column(ledgers[record.run_id], "previous"))
    return {
        version: pd.concat(frames, ignore_index=True).drop_duplicates("id", keep="first").reset_index(drop=True)
        for version, frames in held.items()
    }


def _column(ledger: pd.DataFrame, which: str) -> pd.DataFrame:
    return pd.DataFrame({"id": ledger["id"], "label": ledger["label"], "answer": ledger[which]}).astype(str)


def _ledger(client: MlflowClient, run_id: str) -> pd.DataFrame | None:
    """A gate run's ledger (``id``, ``label``, ``previous``, ``candidate``), or None if it logged none."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(run_id, LEDGER, tmp)
            return pd.read_parquet(path).astype(str)
        except Exception:  # noqa: BLE001 - a run before the ledger: its flip table holds the same answers
            flips = _artifact_json(client, run_id, "gate/flips.json")
    if not flips:
        return None
    table = pd.DataFrame(flips["data"], columns=flips["columns"])
    names = {"previous_prediction": "previous", "candidate_prediction": "candidate"}
    return table.rename(columns=names)[["id", "label", "previous", "candidate"]].astype(str)


def _artifact_json(client: MlflowClient, run_id: str, path: str) -> dict | None:
    """A run's JSON artifact, or None when the run has none."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            return json.loads(Path(client.download_artifacts(run_id, path, tmp)).read_text())
        except Exception:  # noqa: BLE001 - missing (MLflow raises several kinds for that)
            return None
