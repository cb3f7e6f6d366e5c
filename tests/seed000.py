"""Seed 000 rebuilt synthetically: two correlated members on 1000 classes, 35.6% and 28.64% accurate."""

import numpy as np


def seed000_members(n: int = 5000, p: int = 1000, seed: int = 0):
    """Member A right on 35.6% of samples; B right on 28.64%, almost always where A is right too,
    and less confident. Returns (probs (2, n, p), y)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, p, n)
    a_right = rng.random(n) < 0.356
    order = np.flatnonzero(a_right)
    b_right = np.zeros(n, dtype=bool)
    b_right[order[: int(0.2864 * n) - 40]] = True  # B's hits are mostly A's hits ...
    b_right[rng.choice(np.flatnonzero(~a_right), 40, replace=False)] = True  # ... plus 40 of its own
    probs = np.empty((2, n, p))
    for k, (right, peak) in enumerate(((a_right, 7.0), (b_right, 5.0))):
        z = rng.normal(0, 1, (n, p))
        wrong_class = (y + 1 + rng.integers(0, p - 1, n)) % p
        target = np.where(right, y, wrong_class)
        z[np.arange(n), target] += peak
        e = np.exp(z - z.max(1, keepdims=True))
        probs[k] = e / e.sum(1, keepdims=True)
    return probs, y
