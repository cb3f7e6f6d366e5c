"""Training recipes: what DynSnap trains, on what data, with which loss and optimiser.

DynSnap keeps control of what Wang et al. 2023 specifies (runs, learning-rate schedule, snapshots,
pruning, combination); the user's code says the rest, as a :class:`TrainingRecipe`: a fresh
``nn.Module``, a ``Dataset`` of ``(x, y)``, and optionally the loss, optimiser, batch size,
``collate_fn``, ``num_workers``, an input example and the class names.

A recipe named in a config is one of:

- ``mlp`` (tabular data) or ``cnn`` (images as flat pixel columns plus ``image_shape``), trained
  on the config's ``data:`` file: :func:`array_recipe`;
- ``package.module:function`` whose first parameters are ``(n_features, n_classes, **options)``
  returning a module (a network for the ``data:`` file's columns), also through :func:`array_recipe`;
- any other ``package.module:function``, called with the config's ``recipe_options`` and
  returning a :class:`TrainingRecipe` (the user's own data pipeline): :func:`load_training_recipe`.

:func:`check_recipe` builds one network and runs a dummy batch, so a bad recipe is refused
before any training starts. A module is imported from the working directory or the installed
packages.

>>> spec = RecipeSpec("mlp", {"hidden": [8]}, n_features=4, n_classes=3)
>>> check_recipe(spec)
>>> build_module(spec)(__import__("torch").zeros(2, 4)).shape
torch.Size([2, 3])
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from consistency_gate.errors import UsageError


@dataclass(frozen=True)
class RecipeSpec:
    """How to build one member network again (an ensemble stores it next to the weights).

    ``kind`` says how ``name`` is called: ``factory`` (a built-in or ``function(n_features,
    n_classes, **options)``), ``model`` (``function()`` or a class: the recipe's ``model``
    itself) or ``recipe`` (``function(**options)`` returning a :class:`TrainingRecipe`).
    """

    name: str
    options: dict = field(default_factory=dict)
    n_features: int = 0
    n_classes: int = 0
    kind: str = "factory"

    def to_dict(self) -> dict:
        """As stored in an ensemble's ``ensemble.json``."""
        return {
            "name": self.name,
            "options": dict(self.options),
            "n_features": self.n_features,
            "n_classes": self.n_classes,
            "kind": self.kind,
        }


@dataclass
class TrainingRecipe:
    """The user's training code, as DynSnap takes it.

    ``model()`` returns a fresh network whose output has one logit per class; ``train_dataset``
    yields ``(x, y)`` with ``y`` the class index (DynSnap splits its indices into train and
    validation per run, stratified by class, and reshuffles). ``loss`` defaults to cross-entropy,
    ``optimizer(params, lr)`` to the config's ``optimizer`` (SGD with momentum 0.9 and weight decay
    5e-4, or Adam; DynSnap sets the learning rate every epoch), ``batch_size`` to the config's.
    ``scheduler(optimizer, epochs)`` returns your learning-rate scheduler (any
    ``torch.optim.lr_scheduler``), stepped once per epoch: the single-run methods (``singlebase``,
    ``mcdropout``, the distillations) train on your schedule; DynSnap keeps the paper's.
    ``input_example`` (one batch) gives the logged ensemble its signature (default: the first
    sample); ``classes`` names the class indices (default: those of the model the ensemble
    replaces). A ``targets`` attribute on the dataset (as torchvision's have) saves one pass over it
    to read the labels.

    >>> recipe = TrainingRecipe(lambda: nn.Linear(4, 3), TensorDataset(torch.zeros(6, 4), torch.arange(6) % 3))
    >>> recipe.sample_shape(), recipe.labels().tolist()
    ((4,), [0, 1, 2, 0, 1, 2])
    """

    model: Callable[[], nn.Module]
    train_dataset: Dataset
    loss: Callable[..., torch.Tensor] | None = None
    optimizer: Callable[[Iterable[nn.Parameter], float], torch.optim.Optimizer] | None = None
    scheduler: Callable[[torch.optim.Optimizer, int], Any] | None = None
    batch_size: int | None = None
    collate_fn: Callable | None = None
    num_workers: int = 0
    input_example: Any = None
    classes: list[str] | None = None

    def labels(self) -> np.ndarray:
        """The class index of every sample (from ``targets``, the tensors, or one pass over the data)."""
        dataset = self.train_dataset
        if isinstance(dataset, TensorDataset):
            return dataset.tensors[1].cpu().numpy().astype(np.int64)
        targets = getattr(dataset, "targets", None)
        if targets is not None:
            return np.asarray(targets, dtype=np.int64)
        return np.array([int(dataset[i][1]) for i in range(len(dataset))], dtype=np.int64)

    def example(self) -> np.ndarray:
        """One input batch as an array: ``input_example``, else the first sample with a batch axis."""
        if self.input_example is not None:
            return np.asarray(self.input_example)
        return np.asarray(self.train_dataset[0][0])[None]

    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one input sample."""
        return tuple(self.example().shape[1:])


def array_recipe(spec: RecipeSpec, x: np.ndarray, y: np.ndarray) -> TrainingRecipe:
    """A module factory (``mlp``, ``cnn`` or the user's) trained on arrays: ``x`` (n, features)
    float, ``y`` (n,) class indices.

    >>> recipe = array_recipe(RecipeSpec("mlp", {"hidden": [8]}, 4, 2), np.zeros((6, 4)), np.arange(6) % 2)
    >>> type(recipe.model()).__name__, len(recipe.train_dataset)
    ('Sequential', 6)
    """
    dataset = TensorDataset(torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.long))
    return TrainingRecipe(model=lambda: build_module(spec), train_dataset=dataset)


def is_training_recipe(name: str) -> bool:
    """Whether a recipe name is the user's ``function(**options)`` returning a :class:`TrainingRecipe`,
    rather than a module factory ``function(n_features, n_classes, ...)`` (told by its first
    parameter's name).

    >>> is_training_recipe("mlp"), is_training_recipe("consistency_gate.ensembles.recipes:cnn")
    (False, False)
    """
    if name in BUILT_IN:
        return False
    try:
        parameters = list(inspect.signature(_factory(name)).parameters)
    except (TypeError, ValueError):  # builtins without a signature: called as factories, refused there
        return False
    return parameters[:1] != ["n_features"]


def load_training_recipe(name: str, options: dict | None = None) -> tuple[TrainingRecipe, RecipeSpec]:
    """Call the user's ``package.module:function(**options)``; returns its recipe and how an
    ensemble rebuilds the network: ``recipe.model`` itself where it is importable (a class or a
    top-level function), else the recipe function again.

    Example::

        recipe, spec = load_training_recipe("my_recipes:digits", {"epochs_hint": 3})
        spec.name, spec.kind
        # ('my_recipes:DigitsNet', 'model')
    """
    options = dict(options or {})
    try:
        recipe = _factory(name)(**options)
    except UsageError:
        raise
    except TypeError as exc:
        raise UsageError(f"recipe '{name}': bad options {options} ({exc})") from None
    if not isinstance(recipe, TrainingRecipe):
        raise UsageError(
            f"recipe '{name}' returned {type(recipe).__name__}; a recipe function returns a TrainingRecipe "
            "(or takes n_features, n_classes and returns a torch.nn.Module)"
        )
    return recipe, recipe_spec(recipe, name, options)


def recipe_spec(recipe: TrainingRecipe, name: str | None = None, options: dict | None = None) -> RecipeSpec:
    """How an ensemble rebuilds the recipe's network: ``recipe.model`` itself where it is
    importable (a class or a top-level function), else the recipe function ``name`` again.

    >>> recipe_spec(TrainingRecipe(nn.Identity, TensorDataset(torch.zeros(2, 1), torch.zeros(2)))).to_dict()["name"]
    'torch.nn.modules.linear:Identity'
    """
    if not callable(recipe.model):
        raise UsageError(f"recipe '{name}': model must be a callable returning a fresh torch.nn.Module")
    qualname = getattr(recipe.model, "__qualname__", "<")
    module = getattr(recipe.model, "__module__", None)
    if module and module != "__main__" and "<" not in qualname and "." not in qualname:
        return RecipeSpec(f"{module}:{qualname}", kind="model")
    if name is None:
        raise UsageError(
            f"the recipe's model ({qualname}) cannot be imported again where the ensemble is loaded: make it a "
            "class or a top-level function of a module, or pass the recipe as 'module:function'"
        )
    return RecipeSpec(name, dict(options or {}), kind="recipe")


def code_paths(spec: RecipeSpec) -> list[str]:
    """The source a logged ensemble must carry to rebuild its networks where it is served: the
    user's top-level module or package, unless it is installed (or built in).

    >>> code_paths(RecipeSpec("mlp"))
    []
    """
    if spec.name in BUILT_IN:
        return []
    top = spec.name.partition(":")[0].split(".")[0]
    module = sys.modules.get(top) or importlib.import_module(top)
    path = getattr(module, "__file__", None)
    if path is None:
        return []
    path = os.path.abspath(path)
    installed = [os.path.abspath(p) for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    if any(path.startswith(p + os.sep) for p in installed) or path.startswith(os.path.abspath(sys.base_prefix)):
        return []
    return [os.path.dirname(path)] if os.path.basename(path) == "__init__.py" else [path]


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
        nn.AdaptiveAvgPool2d(POOLED),  # a 4x4 map, not one value per channel: where a digit's strokes are
        nn.Flatten(),
        nn.Dropout(dropout),
        nn.Linear(c2 * POOLED * POOLED, n_classes),
    )


POOLED = 4  # the cnn's feature map before its linear head (global average pooling left 16 numbers: ~0.56 on digits)


BUILT_IN = {"mlp": mlp, "cnn": cnn}


def _factory(name: str) -> Callable[..., nn.Module]:
    if name in BUILT_IN:
        return BUILT_IN[name]
    module_name, sep, func_name = name.partition(":")
    if not sep or not module_name or not func_name:
        raise UsageError(f"recipe '{name}': use a built-in ({', '.join(BUILT_IN)}) or 'package.module:function'")
    if os.getcwd() not in sys.path:  # a recipe module beside the config, as with `python -m`
        sys.path.append(os.getcwd())
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
        factory = _factory(spec.name)
        if spec.kind == "model":
            module = factory()
        elif spec.kind == "recipe":
            module = factory(**spec.options).model()
        else:
            module = factory(spec.n_features, spec.n_classes, **spec.options)
    except UsageError:
        raise
    except TypeError as exc:
        raise UsageError(f"recipe '{spec.name}': bad options {spec.options} ({exc})") from None
    if not isinstance(module, nn.Module):
        raise UsageError(f"recipe '{spec.name}' returned {type(module).__name__}, not a torch.nn.Module")
    return module


def check_recipe(spec: RecipeSpec, example: np.ndarray | None = None) -> None:
    """Build the network once and check its output width on a dummy batch, or on ``example``
    (before any training starts).

    >>> check_recipe(RecipeSpec("cnn", {"image_shape": [1, 8, 8]}, n_features=64, n_classes=10))  # fine: no error
    """
    module = build_module(spec)
    module.eval()
    batch = torch.zeros(2, spec.n_features) if example is None else torch.as_tensor(np.asarray(example))
    shape = tuple(batch.shape[1:])
    with torch.no_grad():
        try:
            out = module(batch)
        except Exception as exc:  # noqa: BLE001 - any failure of the user's module
            raise UsageError(f"recipe '{spec.name}' fails on a batch of samples of shape {shape}: {exc}") from None
    if spec.n_classes and (out.ndim != 2 or out.shape[1] != spec.n_classes):
        raise UsageError(
            f"recipe '{spec.name}' outputs shape {tuple(out.shape)}; expected (batch, {spec.n_classes}) "
            f"for the {spec.n_classes} classes of the training data"
        )
