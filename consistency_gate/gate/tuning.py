"""The samples a gate tunes on, apart from those it judges on (``tuning_share:`` in ``remediation:``).

A repair's setting (blend's weight, rerank's k, the Bayesian update's confusion matrices and cost ratio)
is tuned on labelled samples; tuned on the samples it is then judged on, it would pass by fitting them.
Without a ``calibration:`` file, the gate holds a share of the evaluation set out before it decides
anything: the candidate and every repair are judged on the rest, the repairs are tuned on the share.
Which samples are held out depends only on each sample's id (a hash of it; the row number without an
id column), so every gate of a model holds out the same ids, and an evaluation set that grows keeps
its old samples where they were.

>>> frame = pd.DataFrame({"id": range(200), "label": ["a", "b"] * 100})
>>> split = hold_out(frame, 0.3, "id", "label", ("id", "label"))
>>> len(split.judged) + len(split.held_out.frame), split.held_out.source
(200, "the evaluation set's held-out share (68 samples, tuning_share 0.3)")
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from consistency_gate.ensembles.method import TuningData

MIN_TUNING = 30  # the fewest samples a repair is tuned on, and the fewest the gate is left to judge on
TUNING_IDS = "gate/tuning_ids.json"  # the held-out ids, logged in the gate's run


@dataclass(frozen=True)
class Split:
    """The evaluation set cut in two: the samples judged on, and the share held out to tune on (None, with
    ``why_not``, when the share would be too small to tune on or leave too few to judge)."""

    judged: pd.DataFrame
    held_out: TuningData | None
    share: float
    by: str  # "id" (a hash of each sample's id) or "row" (of its row number, from 0)
    held_ids: tuple[str, ...] = ()  # the held-out samples' ids (or row numbers), as text
    why_not: str | None = None
    judged_rows: np.ndarray | None = None  # the judged samples' row numbers in the evaluation set (None: all)

    @property
    def rows(self) -> int:
        """The evaluation set's samples, judged and held out."""
        return len(self.judged) + (0 if self.held_out is None else len(self.held_out.frame))

    def to_dict(self) -> dict:
        """What the report says about it (``samples``)."""
        tuned = 0 if self.held_out is None else len(self.held_out.frame)
        return {
            "judged": len(self.judged),
            "tuning": tuned,
            "tuning_share": self.share,
            "held_out_by": self.by,
            "tuning_ids": TUNING_IDS if tuned else None,
            **({"note": self.why_not} if self.why_not else {}),
        }


def held_out_mask(ids: pd.Series | np.ndarray | list, share: float) -> np.ndarray:
    """Whether each sample is held out: a hash of its id (as text) below ``share`` of the hash range. The
    same id is on the same side at every share-``share`` gate, whatever else the set holds.

    >>> one, reordered = held_out_mask(["a", "b", "c", "d"], 0.5), held_out_mask(["d", "c", "b", "a"], 0.5)
    >>> one.tolist() == reordered[::-1].tolist()
    True
    """
    text = pd.Series(ids).astype(str).to_numpy(dtype=object)
    hashes = pd.util.hash_array(text, categorize=False)
    return hashes < np.uint64(share * float(np.iinfo(np.uint64).max))


def hold_out(
    frame: pd.DataFrame, share: float, id_column: str | None, label_column: str, non_features: tuple[str, ...]
) -> Split:
    """Hold ``share`` of ``frame`` out to tune on (see the module docstring); too small a share (fewer than
    :data:`MIN_TUNING` samples on either side) holds none out and says why."""
    by = "id" if id_column else "row"
    ids = frame[id_column].reset_index(drop=True) if id_column else pd.Series(np.arange(len(frame)))
    mask = held_out_mask(ids, share)
    tuned, judged = int(mask.sum()), int((~mask).sum())
    if min(tuned, judged) < MIN_TUNING:
        why = (
            f"tuning_share {share} of the evaluation set's {len(frame)} samples holds out {tuned} to tune on and "
            f"leaves {judged} to judge on; each needs at least {MIN_TUNING}: give more evaluation samples, another "
            "share, or a calibration: file"
        )
        return Split(frame, None, share, by, why_not=why)
    source = f"the evaluation set's held-out share ({tuned} samples, tuning_share {share})"
    held = TuningData(frame[mask].reset_index(drop=True), label_column, non_features, source)
    held_ids = tuple(ids[mask].astype(str))
    return Split(frame[~mask].reset_index(drop=True), held, share, by, held_ids, judged_rows=np.flatnonzero(~mask))
