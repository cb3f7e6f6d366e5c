"""Single-model remediation by distillation: focal distillation toward the previous generation,
and distillation of a consistent ensemble into one student.

Focal distillation is the loss of positive-congruent training (Yan et al., CVPR 2021): the new
model learns the labels and, through a distillation term, the previous generation's outputs,
weighted up on the samples the previous generation got right, where a flip would be a negative
flip:

    loss = CE(z, y) + weight * mean_i (alpha + beta * [teacher right on i]) * D(z_i, t_i)

with D the KL divergence of the softmax outputs at temperature T, times T² (FD-KL), or half the mean
squared difference of the logits (FD-LM, as PCT's own code computes it). A teacher that gives
probabilities has log-probabilities as logits (softmax gives back the same probabilities). alpha = 1,
beta = 0 is plain knowledge distillation, as ``ensemble-distillation`` uses toward the ensemble's averaged outputs.

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
    """The distillation term of a batch: ``weight * mean_i (alpha + beta * [teacher right on i]) * D_i``.

    Parameters
    ----------
    student, teacher : (n, p) logits of the model in training and of the teacher (no gradient).
    y : (n,) true class indices.
    settings : D (FD-KL or FD-LM), the focal weights, the temperature and the term's weight.

    Returns
    -------
    A scalar tensor; add it to the classification loss.

    Example
    -------
    >>> student, teacher = torch.zeros(2, 2), torch.tensor([[4.0, 0.0], [4.0, 0.0]])
    >>> y = torch.tensor([0, 1])  # the teacher is right on the first sample only
    >>> lm = focal_distillation_loss(student, teacher, y, Distillation(loss="lm"))
    >>> float(lm)  # per sample D = mean((0 - 4)², (0 - 0)²) / 2 = 4; weights 6 and 1
    14.0
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
    return settings.weight * ((settings.alpha + settings.beta * focus) * per_sample).mean()


def logits_of(probabilities: np.ndarray) -> np.ndarray:
    """float32 logits of class probabilities: their logarithms (softmax returns the same probabilities),
    with zeros floored at 1e-8 so that the logits stay finite.

    >>> p = np.array([[0.5, 0.5], [1.0, 0.0]])
    >>> z = logits_of(p)
    >>> bool(np.allclose(np.exp(z), p, atol=1e-7)), round(float(z[1, 1]), 2)
    (True, -18.42)
    """
    return np.log(np.clip(np.asarray(probabilities, dtype=np.float64), 1e-8, None)).astype(np.float32)
