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


def replica_scores(gate: GateRun) -> pd.DataFrame | pd.Series:
    """The seed replica's scores (``floor:``, a version or @alias of the model, or its prediction file)
    on the gate's frame."""
    spec = gate.cfg.floor
    if spec.lower().endswith((".csv", ".parquet")):
        return _replica_file(gate, Path(spec))
    spec = spec[1:] if spec[:1] == "v" and spec[1:].isdigit() else spec  # v7 as 7
    ref = registry.resolve_version(gate.client, gate.cand_ref.name, spec)
    if ref.version in (gate.cand_ref.version, gate.base_ref.version):
        raise UsageError(
            f"floor: v{ref.version} is the {'candidate' if ref.version == gate.cand_ref.version else 'baseline'}; "
            "the floor is a replica of the baseline trained with another seed, registered as its own version"
        )
    replica = scoring.load_model(ref, gate.cfg.classes)
    return scoring.predict(replica, gate.frame, gate.non_features)


def _replica_file(gate: GateRun, path: Path) -> pd.DataFrame | pd.Series:
    """A replica's prediction file (the format of docs/compare.md: a column per class, or ``prediction``)
    in the order of the gate's frame: by ``--id-column`` when the gate has one (every id of the evaluation data
    needed), else by position (as many rows). DataError naming the file otherwise."""
    source = io.inspect_prediction_file(path, gate.id_column)
    text = (gate.id_column,) if gate.id_column else ()
    frame = pd.concat(list(io.iter_frames(path, source.columns, text_columns=text)), ignore_index=True)
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
    elif len(frame) != len(gate.frame):
        raise DataError(
            f"{path}: {len(frame)} rows of floor predictions for {len(gate.frame)} evaluation samples; without "
            "--id-column they align by position: predict every sample, in order, or give --id-column"
        )
    if not source.has_scores:
        return io.hard_labels(frame, source).set_axis(gate.frame.index)
    return frame[list(source.classes)].astype(np.float64).set_axis(gate.frame.index)
