"""The gate's inputs checked before anything is predicted: the evaluation data against what the models
read (great-expectations), its labels against the models' classes, and what ``--engine spark`` can feed.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pandas as pd

from consistency_gate.errors import DataError, ModelError
from consistency_gate.gate.comparer import GateRun
from consistency_gate.io.tensors import array_column, tensor_batch
from consistency_gate.mlops import registry, scoring, tracking


def validate_inputs(gate: GateRun, models: list[scoring.LoadedModel]) -> None:
    """Validate the evaluation data (great-expectations) before anything is predicted.

    A feature column a model reads but the data lacks is the first cause reported, and alone:
    without it the model cannot predict, so its classes are unknown and the labels are not
    checked against them (that check would only report every label as unexpected).
    """
    from consistency_gate.io.validation import validate_evaluation_data

    frame, label_column = gate.frame, gate.label_column
    features: dict[str, str | None] = {}
    arrays: dict[str, int | None] = {}
    for m in models:
        for name in m.features or []:
            features[name] = m.feature_types.get(name)
        column = array_column(scoring.feature_frame(m, frame, gate.non_features)) if not m.features else None
        if column is not None:
            arrays[column] = m.tensor.sample_size if m.tensor is not None else None
    missing = [name for name in features if name not in frame.columns]
    known = None
    if not missing:
        # a first sample the models cannot take (a text cell in a numeric column, a wrong shape): GX reports
        # why below; a model that cannot predict at all fails again when it predicts the set
        with contextlib.suppress(DataError, ModelError):
            classes = [scoring.model_classes(m, frame, gate.non_features) for m in models]
            # a label-only model's class set is unknown: its labels are checked when counted
            known = None if None in classes else sorted({str(c) for found in classes for c in found})
    report = validate_evaluation_data(frame, label_column, features, known, arrays)
    tracking.log_json(report.result, "gate/data_validation.json")
    if missing:
        reader = next(m for m in models if missing[0] in (m.features or []))
        others = f" (and {len(missing) - 1} more: {', '.join(missing[1:4])})" if len(missing) > 1 else ""
        raise DataError(
            f"{gate.data_path}: feature column '{missing[0]}' is missing{others}; {reader.ref.uri} reads it (its "
            "signature names it): add the column to the evaluation data, or gate a model logged with its columns"
        )
    empty = np.flatnonzero(frame[label_column].isna().to_numpy()) if label_column in frame.columns else []
    if len(empty):
        raise DataError(
            f"{gate.data_path}: row {empty[0] + 1}, column '{label_column}' is empty ({len(empty)} of {len(frame)} "
            "rows are); every sample needs its true label: fill it in or drop the row"
        )
    if not report.success:
        for m in models:  # a sample of the wrong shape: name the column, the row and both shapes
            tensor_batch(scoring.feature_frame(m, frame, gate.non_features), m.tensor, str(gate.data_path))
        if known is not None:
            refuse_unknown_labels(frame[label_column], known, f"{gate.data_path}: column '{label_column}'")
        raise DataError(f"evaluation data failed validation ({len(report.failures)} expectations): {report.summary()}")


def refuse_unknown_labels(labels: pd.Series, known: list[str], where: str) -> None:
    """DataError naming the labels that no generation knows, the classes the models do know and what to
    do; nothing when every label is a class of a generation.

    >>> refuse_unknown_labels(pd.Series([2, 7, 2]), ["digit-2", "digit-7"], "eval.csv: column 'label'")
    Traceback (most recent call last):
    ...
    consistency_gate.errors.DataError: eval.csv: column 'label': 3 of 3 labels are no class of the models ('2', \
'7'); their classes are 'digit-2', 'digit-7': write the labels as the models name their classes (or name the \
models' outputs with the version tag consistency_gate.classes)
    """
    text = labels.astype(str)
    unknown = ~text.isin(known)
    if not unknown.any():
        return
    seen = list(dict.fromkeys(text[unknown]))
    shown = ", ".join(map(repr, seen[:5])) + (" ..." if len(seen) > 5 else "")
    classes = ", ".join(map(repr, known[:10])) + (f" ... ({len(known)} classes)" if len(known) > 10 else "")
    raise DataError(
        f"{where}: {int(unknown.sum())} of {len(labels)} labels are no class of the models ({shown}); their classes "
        f"are {classes}: write the labels as the models name their classes (or name the models' outputs with the "
        f"version tag {registry.CLASSES_TAG})"
    )


def takes_shaped_tensors(model: scoring.LoadedModel, gate: GateRun) -> bool:
    """Whether a model takes samples as arrays (an array column, or a tensor of more than one
    dimension per sample), which ``--engine spark`` does not feed."""
    if model.features:
        return False
    if model.tensor is not None and len(model.tensor.shape) > 2:
        return True
    return array_column(scoring.feature_frame(model, gate.frame, gate.non_features)) is not None
