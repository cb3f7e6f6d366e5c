"""The MNIST-1D team's model of benchmarks/repairs.py, in a module of its own so that the library can
import it again where a model trained from it is loaded (a recipe's model must be importable)."""

from torch import nn


class Conv1dNet(nn.Sequential):
    """The team's model: three Conv1d layers and a linear head (a top-level class: the library imports it)."""

    def __init__(self) -> None:
        super().__init__(
            nn.Unflatten(1, (1, 40)),
            nn.Conv1d(1, 25, 5, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv1d(25, 25, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv1d(25, 25, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(125, 10),
        )
