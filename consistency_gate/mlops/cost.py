"""What a model costs to serve: predict latency, size on disk, member count.

An ensemble of m members costs about m times the inference of one model; a reviewer weighs that
against the consistency it buys. :class:`ServingCost` measures one model; its :meth:`metrics`
against the candidate's give the gateable ratios ``latency_ratio`` and ``size_ratio``.

>>> candidate = ServingCost(latency_ms=2.0, size_mb=0.5, members=1)
>>> ServingCost(latency_ms=9.0, size_mb=2.0, members=4).metrics(candidate)["latency_ratio"]
4.5
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

LATENCY_ROWS = 1000  # samples per timed prediction (fewer when the evaluation set is smaller)
LATENCY_REPEATS = 5  # timed predictions; the median is reported


@dataclass(frozen=True)
class ServingCost:
    """One model's predict latency (ms per 1,000 samples), size on disk (MB; None when the store
    does not say) and member count."""

    latency_ms: float
    size_mb: float | None
    members: int = 1

    def metrics(self, reference: ServingCost) -> dict[str, float | None]:
        """The cost as metrics, with the ratios to ``reference`` (the candidate's cost).

        >>> ServingCost(3.0, None).metrics(ServingCost(3.0, None))
        {'latency_ms_per_1000': 3.0, 'size_mb': None, 'members': 1, 'latency_ratio': 1.0, 'size_ratio': None}
        """
        size_ratio = None
        if self.size_mb is not None and reference.size_mb:
            size_ratio = self.size_mb / reference.size_mb
        return {
            "latency_ms_per_1000": self.latency_ms,
            "size_mb": self.size_mb,
            "members": self.members,
            "latency_ratio": self.latency_ms / reference.latency_ms if reference.latency_ms > 0 else None,
            "size_ratio": size_ratio,
        }


def predict_latency(
    predict: Callable[[pd.DataFrame], object],
    frame: pd.DataFrame,
    rows: int = LATENCY_ROWS,
    repeats: int = LATENCY_REPEATS,
) -> float:
    """Median wall time of ``predict`` on the first ``rows`` rows of ``frame`` over ``repeats``
    timed calls (after one untimed warm-up), in ms per 1,000 samples.

    >>> frame = pd.DataFrame({"x": range(10)})
    >>> predict_latency(lambda f: f["x"] * 2, frame) >= 0
    True
    """
    sample = frame.head(rows)
    predict(sample)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        predict(sample)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000 * 1000 / max(len(sample), 1)


def model_size_mb(model_uri: str) -> float | None:
    """The size of a model's artifacts in MB, from the artifact store's listing (nothing is
    downloaded); None when the store gives no sizes.

    Example::

        model_size_mb("models:/digits-cnn/3")
        # 0.031738
    """
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    repo = get_artifact_repository(model_uri)
    unknown = False

    def walk(path: str | None) -> int:
        nonlocal unknown
        total = 0
        for entry in repo.list_artifacts(path):
            if entry.is_dir:
                total += walk(entry.path)
            elif entry.file_size is None:
                unknown = True
            else:
                total += entry.file_size
        return total

    size = walk(None)
    return None if unknown else size / 1e6


def serving_cost(
    predict: Callable[[pd.DataFrame], object], frame: pd.DataFrame, model_uri: str, members: int = 1
) -> ServingCost:
    """A model's serving cost predicting ``frame``: its latency, its size on disk (None where the store
    will not list it) and the ``members`` it carries."""
    try:
        size = model_size_mb(model_uri)
    except Exception:  # noqa: BLE001 - the size is reported, never needed: a store that cannot list gives none
        size = None
    return ServingCost(predict_latency(predict, frame), size, members)
