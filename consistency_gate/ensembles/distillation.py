"""Single-model remediation by distillation: focal distillation toward the previous generation,
and distillation of a consistent ensemble into one student.

Focal distillation is the loss of positive-congruent training (Yan et al., CVPR 2021): the new
model learns the labels and, through a distillation term, the previous generation's outputs,
weighted up on the samples the previous generation got right, where a flip would be a negative
flip. Per batch:

    D_bar = sum_i w_i D(z_i, t_i) / sum_i w_i,   w_i = alpha + beta * [teacher right on i]
    loss  = (CE(z, y) + weight * D_bar) / (1 + weight)

with D the KL divergence of the softmax outputs at temperature T, times T² (FD-KL), or half the mean
squared difference of the logits (FD-LM, as PCT's own code computes it). A teacher that gives
probabilities has log-probabilities as logits (softmax gives back the same probabilities). alpha = 1,
beta = 0 is plain knowledge distillation, as ``ensemble-distillation`` uses toward the ensemble's
averaged outputs.

The two normalisations are ours, not the paper's. PCT adds ``mean_i w_i D_i`` to the cross-entropy,
so the loss, and SGD's step with it, grows with alpha + beta: on a teacher that is right and sure,
where D is about the cross-entropy, the sum is about 1 + alpha + beta = 7 times it, a seven times
larger learning rate; a plain retrain then beat focal distillation on CtoI on every seed and recipe
measured (digits MLP and CNN under SGD). Normalising the focal weights and mixing the two terms as a
weighted mean keeps the loss on the cross-entropy's scale, whatever the weights, so the recipe's
learning rate keeps its meaning. The default temperature is 4, not the paper's 100: at high T the
T²-scaled KL approaches half the squared difference of the centred logits, and a confident teacher's
log-probabilities differ by up to 18 (the 1e-8 floor), a term that outweighs the labels within a
short budget (MNIST-1D, 12 epochs: CtoI 0.13 at T 100 against 0.10 at T 4, 5 seeds;
``benchmarks/repairs.py``, ``benchmarks/remediation_tradeoff.py``).

>>> import torch
>>> z = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
>>> float(focal_distillation_loss(z, z, torch.tensor([0, 0]), Distillation()))  # student = teacher
0.0
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F  # noqa: N812 - torch's own alias

from consistency_gate.ensembles.config import Distillation


def focal_distillation_loss(
    student: torch.Tensor, teacher: torch.Tensor, y: torch.Tensor, settings: Distillation
) -> torch.Tensor:
    """The batch's focal-weighted mean distillation term: ``sum_i w_i D_i / sum_i w_i`` with
    ``w_i = alpha + beta * [teacher right on i]`` (0 where every weight is 0).

    Parameters
    ----------
    student, teacher : (n, p) logits of the model in training and of the teacher (no gradient).
    y : (n,) true class indices.
    settings : D (FD-KL or FD-LM), the focal weights and the temperature.

    Returns
    -------
    A scalar tensor; :func:`with_distillation` mixes it with the classification loss.

    Example
    -------
    >>> student, teacher = torch.zeros(2, 2), torch.tensor([[4.0, 0.0], [2.0, 0.0]])
    >>> y = torch.tensor([0, 1])  # the teacher is right on the first sample only: weights 6 and 1
    >>> lm = focal_distillation_loss(student, teacher, y, Distillation(loss="lm"))
    >>> float(lm)  # D = mean((0 - 4)², 0) / 2 = 4 and mean((0 - 2)², 0) / 2 = 1: (6 * 4 + 1 * 1) / 7
    3.5714...
    """
    teacher = teacher.detach()
    if settings.loss == "kl":
        t = settings.temperature
        per_sample = F.kl_div(
            F.log_softmax(student / t, dim=1), F.log_softmax(teacher / t, dim=1), reduction="none", log_target=True
        ).sum(dim=1) * (t * t)
    else:
        per_sample = ((student - teacher) ** 2).mean(dim=1) / 2
    focus = (teacher.argmax(dim=1) == y).to(student.dtype)
    weights = settings.alpha + settings.beta * focus
    return (weights * per_sample).sum() / weights.sum().clamp_min(torch.finfo(student.dtype).tiny)


def with_distillation(
    classification: torch.Tensor, student: torch.Tensor, teacher: torch.Tensor, y: torch.Tensor, settings: Distillation
) -> torch.Tensor:
    """The training loss of a distillation method: ``(classification + weight * D_bar) / (1 + weight)``,
    a weighted mean of the classification loss and :func:`focal_distillation_loss`.

    Example
    -------
    >>> teacher, y = torch.tensor([[30.0, 0.0], [0.0, 30.0]]), torch.tensor([0, 1])
    >>> student = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    >>> ce = F.cross_entropy(student, y)  # a sure and right teacher at T 1: D is about the cross-entropy
    >>> loss = with_distillation(ce, student, teacher, y, Distillation(temperature=1.0, weight=3.0))
    >>> round(float(loss), 4) == round(float(ce), 4)
    True
    """
    term = focal_distillation_loss(student, teacher, y, settings)
    return (classification + settings.weight * term) / (1 + settings.weight)


def logits_of(probabilities: np.ndarray) -> np.ndarray:
    """float32 logits of class probabilities: their logarithms (softmax returns the same probabilities),
    with zeros floored at 1e-8 so that the logits stay finite.

    >>> p = np.array([[0.5, 0.5], [1.0, 0.0]])
    >>> z = logits_of(p)
    >>> bool(np.allclose(np.exp(z), p, atol=1e-7)), round(float(z[1, 1]), 2)
    (True, -18.42)
    """
    return np.log(np.clip(np.asarray(probabilities, dtype=np.float64), 1e-8, None)).astype(np.float32)
