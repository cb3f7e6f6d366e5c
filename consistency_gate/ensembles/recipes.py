"""Training recipes: how remediation builds a fresh ``torch.nn.Module``.

A recipe is ``mlp`` (tabular data), ``cnn`` (images given as flat pixel columns plus
``image_shape``) or the user's own ``package.module:function``, called as
``function(n_features, n_classes, **options)`` and returning a fresh module whose output
has one logit per class. :func:`check_recipe` builds one and runs a dummy batch, so a bad
recipe is refused before any training starts.

>>> spec = RecipeSpec("mlp", {"hidden": [8]}, n_features=4, n_classes=3)
>>> check_recipe(spec)
>>> build_module(spec)(__import__("torch").zeros(2, 4)).shape
torch.Size([2, 3])
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from consistency_gate.errors import UsageError


@dataclass(frozen=True)
class RecipeSpec:
    """A network to build: a recipe name (built-in or ``package.module:function``), its options,
    and the input and output widths."""

    name: str
    options: dict = field(default_factory=dict)
    n_features: int = 0
    n_classes: int = 0

    def to_dict(self) -> dict:
        """As stored in an ensemble's ``ensemble.json``."""
        return {
            "name": self.name,
            "options": dict(self.options),
            "n_features": self.n_features,
            "n_classes": self.n_classes,
        }


def mlp(
    n_features: int, n_classes: int, hidden: list[int] | tuple[int, ...] = (64,), dropout: float = 0.1
) -> nn.Module:
    """A multilayer perceptron with ReLU and dropout after each hidden layer.

    >>> mlp(4, 3, hidden=[8])
    Sequential(
      (0): Linear(in_features=4, out_features=8, bias=True)
      (1): ReLU()
      (2): Dropout(p=0.1, inplace=False)
      (3): Linear(in_features=8, out_features=3, bias=True)
    )
    """
    layers: list[nn.Module] = []
    width = n_features
    for size in hidden:
        layers += [nn.Linear(width, int(size)), nn.ReLU(), nn.Dropout(dropout)]
        width = int(size)
    layers.append(nn.Linear(width, n_classes))
    return nn.Sequential(*layers)


def cnn(
    n_features: int,
    n_classes: int,
    image_shape: list[int] | tuple[int, ...] = (),
    channels: tuple = (8, 16),
    dropout: float = 0.1,
) -> nn.Module:
    """A small CNN over flat pixel columns reshaped to ``image_shape`` = (C, H, W).

    >>> cnn(64, 10, image_shape=[1, 8, 8])(torch.zeros(2, 64)).shape
    torch.Size([2, 10])
    """
    if len(image_shape) != 3 or int(torch.tensor(image_shape).prod()) != n_features:
        raise UsageError(
            f"recipe cnn: image_shape must be [C, H, W] with C*H*W = {n_features} features, got {list(image_shape)}"
        )
    c, h, w = (int(v) for v in image_shape)
    c1, c2 = (int(v) for v in channels)
    return nn.Sequential(
        nn.Unflatten(1, (c, h, w)),
        nn.Conv2d(c, c1, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2) if min(h, w) >= 4 else nn.Identity(),
        nn.Conv2d(c1, c2, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(dropout),
        nn.Linear(c2, n_classes),
    )


BUILT_IN = {"mlp": mlp, "cnn": cnn}


def _factory(name: str) -> Callable[..., nn.Module]:
    if name in BUILT_IN:
        return BUILT_IN[name]
    module_name, sep, func_name = name.partition(":")
    if not sep or not module_name or not func_name:
        raise UsageError(f"recipe '{name}': use a built-in ({', '.join(BUILT_IN)}) or 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"recipe '{name}': cannot import module '{module_name}' ({exc})") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise UsageError(f"recipe '{name}': module '{module_name}' has no function '{func_name}'")
    return func


def build_module(spec: RecipeSpec) -> nn.Module:
    """A fresh module from the recipe (random initialisation from torch's current seed).

    >>> build_module(RecipeSpec("mlp", {"hidden": [16, 16]}, n_features=4, n_classes=3))[0]
    Linear(in_features=4, out_features=16, bias=True)
    """
    try:
        module = _factory(spec.name)(spec.n_features, spec.n_classes, **spec.options)
    except UsageError:
        raise
    except TypeError as exc:
        raise UsageError(f"recipe '{spec.name}': bad options {spec.options} ({exc})") from None
    if not isinstance(module, nn.Module):
        raise UsageError(f"recipe '{spec.name}' returned {type(module).__name__}, not a torch.nn.Module")
    return module


def check_recipe(spec: RecipeSpec) -> None:
    """Build the recipe once and check its output width on a dummy batch (before any training).

    >>> check_recipe(RecipeSpec("cnn", {"image_shape": [1, 8, 8]}, n_features=64, n_classes=10))  # fine: no error
    """
    module = build_module(spec)
    module.eval()
    with torch.no_grad():
        try:
            out = module(torch.zeros(2, spec.n_features))
        except Exception as exc:  # noqa: BLE001 - any failure of the user's module
            raise UsageError(f"recipe '{spec.name}' fails on a batch of {spec.n_features} features: {exc}") from None
    if out.ndim != 2 or out.shape[1] != spec.n_classes:
        raise UsageError(
            f"recipe '{spec.name}' outputs shape {tuple(out.shape)}; expected (batch, {spec.n_classes}) "
            f"for the {spec.n_classes} classes of the training data"
        )
