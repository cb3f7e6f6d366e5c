"""A binary model's answer at a decision threshold: the positive class where P(positive) >= t.

Credit and fraud teams decide at a cutoff, not at 0.5: the config's ``decision:`` block names the
positive class and the threshold on its probability, and every metric, rule and repair then uses
that answer. Without the block a binary model's answer is its positive class (the second of its
classes, as in scikit-learn) where P(positive) >= 0.5.

>>> decision = BinaryDecision("fraud", 0.2)
>>> decision.answers(np.array([0.1, 0.2, 0.9]), positive_id=1, negative_id=0).tolist()
[0, 1, 1]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from consistency_gate.errors import UsageError, plain

DEFAULT_THRESHOLD = 0.5


@dataclass(frozen=True)
class BinaryDecision:
    """The positive class (None: the candidate's second class) and the threshold on its probability.

    >>> BinaryDecision("yes", 1.5)
    Traceback (most recent call last):
    ...
    consistency_gate.errors.UsageError: decision.threshold must be a probability strictly between 0 and 1, got 1.5
    """

    positive: str | None = None
    threshold: float = DEFAULT_THRESHOLD
    configured: bool = False  # the config's decision: block says it (not the default at 0.5)

    def __post_init__(self) -> None:
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, int | float):
            raise UsageError(f"decision.threshold must be a number, got {self.threshold!r}")
        if not 0.0 < float(self.threshold) < 1.0:
            raise UsageError(
                f"decision.threshold must be a probability strictly between 0 and 1, got {self.threshold!r}"
            )

    def resolved(self, classes: Sequence[str], default_positive: str | None) -> BinaryDecision:
        """This decision on a binary model's ``classes``: its positive class named (``default_positive``
        when the config names none); a UsageError when the models are not binary or the positive class
        is not one of theirs.

        >>> BinaryDecision(threshold=0.3).resolved(["bad", "good"], "good")
        BinaryDecision(positive='good', threshold=0.3, configured=False)
        """
        positive = self.positive if self.positive is not None else default_positive
        if len(classes) != 2:
            raise UsageError(
                f"decision: applies to binary models, and these have {len(classes)} classes "
                f"({', '.join(map(plain, classes[:5]))}{' ...' if len(classes) > 5 else ''}); remove the block"
            )
        if positive is None or str(positive) not in classes:
            raise UsageError(
                f"decision.positive {plain(positive)} is not a class of the models ({', '.join(map(plain, classes))}); "
                "name one of them"
            )
        return BinaryDecision(str(positive), float(self.threshold), self.configured)

    def answers(self, p_positive: np.ndarray, positive_id: int, negative_id: int) -> np.ndarray:
        """The class ids answered: ``positive_id`` where ``p_positive >= threshold``, else ``negative_id``."""
        return np.where(np.asarray(p_positive) >= self.threshold, positive_id, negative_id).astype(np.int64)

    def to_dict(self) -> dict:
        """The report's ``decision``: the positive class, the threshold, and whether the config set them."""
        return {"positive": self.positive, "threshold": self.threshold, "configured": self.configured}

    def describe(self) -> str:
        """'good when P(good) >= 0.3' for the report."""
        return f"{self.positive} when P({self.positive}) >= {self.threshold:g}, else the other class"
