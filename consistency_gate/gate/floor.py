"""The seed-noise floor: a replica of the baseline trained with another seed (the config's ``floor:``, a
version or ``@alias`` of the model, or its prediction file), predicted on the gate's evaluation set, so
the report can say how much churn no retrain avoids (``floor_ctoi``, ``ctoi_excess``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from consistency_gate.errors import DataError, UsageError
from consistency_gate.gate.comparer import GateRun
from consistency_gate.io import predictions as io
from consistency_gate.mlops import registry, scoring


def replica_scores(gate: GateRun, baseline: list[str] | None) -> pd.DataFrame | pd.Series:
    """The seed replica's scores (``floor:``, a version or @alias of the model, or its prediction file)
    on the gate's frame; ``baseline``: the baseline's classes (None: it answers with labels only)."""
    spec = gate.cfg.floor
    if spec.lower().endswith((".csv", ".parquet")):
        return _replica_file(gate, Path(spec), baseline)
    spec = spec[1:] if spec[:1] == "v" and spec[1:].isdigit() else spec  # v7 as 7
    ref = registry.resolve_version(gate.client, gate.cand_ref.name, spec)
    if ref.version in (gate.cand_ref.version, gate.base_ref.version):
        raise UsageError(
            f"floor: v{ref.version} is the {'candidate' if ref.version == gate.cand_ref.version else 'baseline'}; "
            "the floor is a replica of the baseline trained with another seed, registered as its own version"
        )
    replica = scoring.load_model(ref, gate.cfg.classes)
    return scoring.predict(replica, gate.frame, gate.non_features)


def _replica_file(gate: GateRun, path: Path, baseline: list[str] | None) -> pd.DataFrame | pd.Series:
    """A replica's prediction file (the format of docs/compare.md: a column per class, or ``prediction``)
    in the order of the gate's frame: by ``--id-column`` when the gate has one (every id of the evaluation data
    needed), else by position (as many rows). DataError naming the file otherwise."""
    source = io.inspect_prediction_file(path, gate.id_column)
    text = (gate.id_column,) if gate.id_column else ()
    chunks = list(io.iter_frames(path, source.columns, text_columns=text))
    if not chunks or not sum(len(c) for c in chunks):
        raise DataError(
            f"{path}: no rows of floor predictions (a header only); predict the replica on the evaluation set"
        )
    frame = pd.concat(chunks, ignore_index=True)
    _check_classes(path, source.classes, baseline)
    if gate.id_column:
        frame = frame.set_index(io.unique_ids(frame[gate.id_column], path, gate.id_column))
        wanted = gate.frame[gate.id_column].astype(str)
        absent = wanted[~wanted.isin(frame.index)]
        if len(absent):
            raise DataError(
                f"{path}: the floor's predictions lack id {absent.iloc[0]!r} of the evaluation data "
                f"({len(absent)} ids in all); predict the replica on every sample of the evaluation set"
            )
        frame = frame.loc[wanted.to_numpy()].reset_index(drop=True)
    else:
        split = gate.split
        rows = split.judged_rows if split is not None and split.judged_rows is not None else np.arange(len(gate.frame))
        every = split.rows if split is not None else len(gate.frame)
        if len(frame) != every:
            raise DataError(
                f"{path}: {len(frame)} rows of floor predictions for {every} evaluation samples; without "
                "--id-column they align by position: predict every sample, in order, or give --id-column"
            )
        frame = frame.iloc[rows].reset_index(drop=True)  # the samples judged on (tuning_share holds some out)
    if not source.has_scores:
        return io.hard_labels(frame, source).set_axis(gate.frame.index)
    return frame[list(source.classes)].astype(np.float64).set_axis(gate.frame.index)


def _check_classes(path: Path, classes: tuple[str, ...] | None, baseline: list[str] | None) -> None:
    """DataError naming the floor file when its class columns are not the baseline's (a hard-label file has
    none to check here: its labels are checked with the evaluation)."""
    if classes is None or not baseline or set(classes) == set(baseline):
        return
    raise DataError(
        f"{path}: the floor's class columns {', '.join(classes)} are not the baseline's classes "
        f"({', '.join(baseline)}); write one column per class of the baseline, headed by its name"
    )
