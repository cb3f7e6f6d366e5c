"""Diversity decomposition and learner-collusion diagnostics (Jeffares et al. 2023).

DIV = weighted mean of member losses - ensemble loss. The identities, checked in tests:

- cross-entropy, probability averaging: DIV = sum_j w_j log(pbar(k*) / p_j(k*))
- cross-entropy, score (logit) averaging: DIV = sum_j w_j KL(qbar || p_j), qbar = softmax(sum_j w_j z_j)
- Brier (and MSE): DIV = sum_j w_j ||p_j - pbar||^2, the weighted variance around the ensemble

>>> import numpy as np
>>> probs = np.array([[[0.9, 0.1]], [[0.5, 0.5]]])          # 2 members, 1 sample
>>> round(diversity_ce_probs(probs, np.array([0])), 4)      # 0.5*log(.7/.9) + 0.5*log(.7/.5)
0.0426
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

_EPS = 1e-12


def _weights(m: int, weights: Sequence[float] | None = None) -> np.ndarray:
    w = np.full(m, 1.0 / m) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (m,) or (w < 0).any() or not np.isclose(w.sum(), 1.0):
        raise ValueError(f"weights must be {m} non-negative numbers summing to 1")
    return w


def diversity_ce_probs(member_probs: np.ndarray, y: np.ndarray, weights: Sequence[float] | None = None) -> float:
    """DIV for cross-entropy with probability averaging, mean over samples.

    >>> p = np.array([[[0.9, 0.1], [0.6, 0.4]], [[0.5, 0.5], [0.2, 0.8]]])  # 2 members, 2 samples, 2 classes
    >>> round(diversity_ce_probs(p, np.array([0, 1])), 4)
    0.0507
    """
    p = np.asarray(member_probs, dtype=np.float64)
    w = _weights(p.shape[0], weights)
    true = p[:, np.arange(p.shape[1]), y]  # (m, n): p_j(k*)
    pbar = np.tensordot(w, true, axes=1)
    return float(np.mean(np.tensordot(w, np.log(pbar + _EPS) - np.log(true + _EPS), axes=1)))


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def diversity_ce_scores(member_scores: np.ndarray, weights: Sequence[float] | None = None) -> float:
    """DIV for cross-entropy with score (logit) averaging: sum_j w_j KL(qbar || p_j), mean over samples.

    It does not depend on the labels: the true-class terms cancel.

    >>> same = np.array([[[2.0, 0.0]], [[2.0, 0.0]]])  # two members with the same logits
    >>> diversity_ce_scores(same), round(diversity_ce_scores(np.array([[[2.0, 0.0]], [[0.0, 2.0]]])), 4)
    (0.0, 0.4338)
    """
    z = np.asarray(member_scores, dtype=np.float64)
    w = _weights(z.shape[0], weights)
    log_q = _log_softmax(np.tensordot(w, z, axes=1))  # (n, p)
    log_p = _log_softmax(z)  # (m, n, p)
    kl = (np.exp(log_q)[None] * (log_q[None] - log_p)).sum(axis=-1)  # (m, n)
    return float(np.mean(np.tensordot(w, kl, axes=1)))


def diversity_brier(member_probs: np.ndarray, weights: Sequence[float] | None = None) -> float:
    """DIV for the Brier score (or MSE on any outputs): weighted variance of members around the ensemble.

    >>> diversity_brier(np.array([[[1.0, 0.0]], [[0.0, 1.0]]]))  # each member 0.5 from the mean in each class
    0.5
    """
    p = np.asarray(member_probs, dtype=np.float64)
    w = _weights(p.shape[0], weights)
    pbar = np.tensordot(w, p, axes=1)
    return float(np.mean(np.tensordot(w, ((p - pbar[None]) ** 2).sum(axis=-1), axes=1)))


def losses(member_probs: np.ndarray, y: np.ndarray, weights: Sequence[float] | None = None) -> dict[str, float]:
    """Weighted mean member loss and ensemble loss (probability averaging), for CE and Brier.

    >>> p = np.array([[[0.9, 0.1]], [[0.5, 0.5]]])
    >>> {k: round(v, 4) for k, v in losses(p, np.array([0])).items()}
    {'ce_members': 0.3993, 'ce_ensemble': 0.3567, 'brier_members': 0.26, 'brier_ensemble': 0.18}
    """
    p = np.asarray(member_probs, dtype=np.float64)
    w = _weights(p.shape[0], weights)
    onehot = np.eye(p.shape[2])[y]
    pbar = np.tensordot(w, p, axes=1)
    true = p[:, np.arange(p.shape[1]), y]
    return {
        "ce_members": float(np.mean(np.tensordot(w, -np.log(true + _EPS), axes=1))),
        "ce_ensemble": float(np.mean(-np.log(pbar[np.arange(len(y)), y] + _EPS))),
        "brier_members": float(np.mean(np.tensordot(w, ((p - onehot) ** 2).sum(-1), axes=1))),
        "brier_ensemble": float(np.mean(((pbar - onehot) ** 2).sum(-1))),
    }


def debiasing_share(member_outputs: np.ndarray, weights: Sequence[float] | None = None) -> float | None:
    """Share of the (Brier/MSE) diversity that optimal debiasing removes.

    Member j is shifted by b_j = mean_i f_j(x_i) - mean_i fbar(x_i); what diversity remains is
    the part that is not a constant offset. A high share means the members differ mostly by
    bias, not by sample-specific errors: learner collusion's signature. None if DIV = 0.

    >>> f = np.array([[[0.7, 0.3], [0.6, 0.4]], [[0.5, 0.5], [0.4, 0.6]]])  # member 1 = member 2 + a constant
    >>> round(debiasing_share(f), 4)
    1.0
    """
    f = np.asarray(member_outputs, dtype=np.float64)
    w = _weights(f.shape[0], weights)
    div = diversity_brier(f, w)
    if div <= _EPS:
        return None
    fbar = np.tensordot(w, f, axes=1)
    bias = f.mean(axis=1) - fbar.mean(axis=0)  # (m, p)
    return float((div - diversity_brier(f - bias[:, None, :], w)) / div)


def centred_log_probabilities(member_probs: np.ndarray) -> np.ndarray:
    """Each member's log-probabilities less their mean over classes: the logits up to the per-sample
    constant a softmax drops, so the score-space outputs that probability files still determine.

    >>> z = centred_log_probabilities(np.array([[[0.5, 0.5]], [[0.8, 0.2]]]))
    >>> [round(float(v), 4) for v in z[1, 0]]
    [0.6931, -0.6931]
    """
    log_p = np.log(np.clip(np.asarray(member_probs, dtype=np.float64), _EPS, None))
    return log_p - log_p.mean(axis=-1, keepdims=True)


def collusion_numbers(member_probs: np.ndarray, y: np.ndarray) -> dict[str, float | None]:
    """What Jeffares et al. 2023's collusion checks read on one labelled set: the mean member loss, DIV
    (cross-entropy, probability averaging), DIV as a share of the mean member loss (0: the members
    agree; near 1: the ensemble's loss is a small part of theirs), and the debiasing share of the
    members' centred log-probabilities (the diversity one constant offset per member explains). A
    share is None where its denominator is 0.

    >>> p = np.array([[[0.9, 0.1], [0.9, 0.1]], [[0.1, 0.9], [0.1, 0.9]]])  # CE 1.204 each, ensemble 0.693
    >>> {k: round(v, 3) for k, v in collusion_numbers(p, np.array([0, 1])).items()}
    {'ce_members': 1.204, 'div': 0.511, 'div_share': 0.424, 'debiasing_share_logits': 1.0}
    """
    p = np.asarray(member_probs, dtype=np.float64)
    loss = losses(p, y)
    members, div = loss["ce_members"], loss["ce_members"] - loss["ce_ensemble"]  # = diversity_ce_probs
    return {
        "ce_members": members,
        "div": div,
        "div_share": div / members if members > _EPS else None,
        "debiasing_share_logits": debiasing_share(centred_log_probabilities(p)),
    }


def codependence(
    member_probs: np.ndarray, y: np.ndarray, drop_fraction: float = 0.5, draws: int = 200, seed: int = 0
) -> float:
    """Mean increase of the averaged ensemble's error rate when ``drop_fraction`` of the members
    are dropped at random (at least one kept). Near 0: members stand alone; large: they lean on
    each other. A draw of members drawn before (in the same order) reuses its error rate: a gate's
    two generations have two draws to make, not ``draws`` (50,000 rows x 100 classes: 3.7 s before).

    >>> p = np.array([[[0.9, 0.1], [0.6, 0.4]], [[0.8, 0.2], [0.3, 0.7]], [[0.7, 0.3], [0.45, 0.55]]])
    >>> round(codependence(p, np.array([0, 1]), draws=50), 4)
    0.16
    """
    p = np.asarray(member_probs, dtype=np.float64)
    m = p.shape[0]
    keep = max(1, int(round(m * (1 - drop_fraction))))
    full = float(np.mean(p.mean(axis=0).argmax(axis=1) != y))
    rng = np.random.default_rng(seed)
    error_of: dict[tuple[int, ...], float] = {}
    errors = []
    for _ in range(draws):
        kept = tuple(rng.choice(m, keep, replace=False).tolist())
        if kept not in error_of:
            error_of[kept] = float(np.mean(p[list(kept)].mean(axis=0).argmax(axis=1) != y))
        errors.append(error_of[kept])
    return float(np.mean(errors) - full)


def augmented_loss(member_logits: torch.Tensor, y: torch.Tensor, beta: float = 0.0) -> torch.Tensor:
    """(1 - beta) * mean member cross-entropy + beta * ensemble cross-entropy (probability averaging).

    ``member_logits`` is a (members, batch, classes) torch tensor. beta = 0 is independent
    training (the default); beta must stay in [0, 1]: for beta > 1 the objective rewards members
    for diverging from one another and is unbounded below (Jeffares et al. 2023, Theorem 5.1).

    >>> import torch
    >>> logits = torch.tensor([[[2.0, 0.0]], [[0.0, 2.0]]])
    >>> round(float(augmented_loss(logits, torch.tensor([0]), beta=0.5)), 4)
    0.91
    """
    import torch
    import torch.nn.functional as F

    if beta > 1:
        raise ValueError(
            f"beta={beta} > 1 is refused: the augmented objective is then unbounded below "
            "(Jeffares et al. 2023, Theorem 5.1), and members learn to collude instead of to be right"
        )
    if beta < 0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    members = torch.stack([F.cross_entropy(z, y) for z in member_logits]).mean()
    ensemble_probs = torch.softmax(member_logits, dim=-1).mean(dim=0)
    ensemble = F.nll_loss(torch.log(ensemble_probs.clamp_min(1e-12)), y)
    return (1 - beta) * members + beta * ensemble
