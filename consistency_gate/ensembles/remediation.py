"""Remediation: when the single candidate fails, train a DynSnap ensemble to gate instead.

The config's ``remediation:`` block names the recipe, the training data and the method:

    remediation:
      enabled: true
      recipe: mlp                # mlp, cnn, or package.module:function (see recipes.py)
      recipe_options: {hidden: [64]}
      data: train.csv            # CSV or Parquet with the feature columns and the label column
                                 # (not needed by a recipe function returning a TrainingRecipe)
      label_column: label
      method: dynsnap-cyc        # dynsnap-step, snapshot, extbagging, mcdropout, singlebase,
                                 # focal-distillation, ensemble-distillation (one model each)
      m: 20
      N: 10
      epochs: 40
      beta: null                 # null: beta* per run
      combination: avg           # mv, wmv, avg, wavg
      seed: 0
      distillation: {loss: kl, alpha: 1, beta: 5, temperature: 4, weight: 1}  # the distillation methods
      teacher_method: dynsnap-cyc  # ensemble-distillation: the ensemble its student learns from
      optimizer: sgd             # adam: Wang et al. 2023's Table 1 (with lr: 0.001)
      snapshot_one_run: true     # snapshot: one run of m cycles; false: runs of N cycles until m

``focal-distillation`` learns from the previous generation: the gate predicts the training samples
with the baseline version (the ``teacher`` below). Everything is checked before any training starts
(exit 2 for the config, 3 for the data).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from consistency_gate.ensembles.config import RemediationConfig, train_settings
from consistency_gate.ensembles.distillation import logits_of
from consistency_gate.ensembles.method import Built, Inputs
from consistency_gate.ensembles.model import TorchEnsemble
from consistency_gate.ensembles.recipes import (
    RecipeSpec,
    TrainingRecipe,
    array_recipe,
    check_recipe,
    is_training_recipe,
    load_training_recipe,
    recipe_spec,
)
from consistency_gate.ensembles.snapshot import EnsembleBuild, train_members
from consistency_gate.errors import DataError, GateError, ModelError, UsageError
from consistency_gate.io.predictions import file_columns, iter_frames, require_columns

# the previous generation as a teacher: class scores (one column per class label) for a frame of samples
Teacher = Callable[[pd.DataFrame], pd.DataFrame]


def train_ensemble(
    config: RemediationConfig,
    features: list[str] | None,
    exclude: tuple[str, ...] = (),
    quiet: bool = False,
    classes: list[str] | None = None,
    input_shape: tuple[int, ...] | None = None,
    teacher: Teacher | None = None,
) -> tuple[TorchEnsemble, EnsembleBuild]:
    """Check the recipe, read its training data and build the ensemble.

    ``teacher`` (needed by ``focal-distillation``, ignored by the other methods) scores the training
    samples with the previous generation: the feature columns of the ``data`` file, or for a
    :class:`TrainingRecipe` a frame with one column ``input`` holding each sample as an array.

    ``features`` are the columns the models take (None: every column but the label and ``exclude``).
    A recipe function returning a :class:`TrainingRecipe` brings its own data; its class indices
    name ``classes`` (those of the model replaced) unless it names them, and its samples must have
    ``input_shape`` (that model's, when it takes a tensor).

    Example::

        config = parse_config(Path("gate.yaml").read_text()).remediation
        ensemble, build = train_ensemble(config, features=None, exclude=("label", "id"))
        len(build.members), round(build.kappa, 1)
        # (5, 1.8)
    """
    if is_training_recipe(config.recipe):
        recipe, spec = load_training_recipe(config.recipe, config.recipe_options)
        logits = None
        if _needs_teacher(config, teacher):
            samples = pd.DataFrame(
                {"input": [np.asarray(recipe.train_dataset[i][0]) for i in range(len(recipe.labels()))]}
            )
            logits = teacher_logits(teacher, samples, recipe.classes or classes or [], f"recipe '{config.recipe}'")
        return fit_recipe(recipe, spec, config, classes, input_shape, quiet, teacher=logits)
    path = config.data
    if path is None:
        raise UsageError(f"remediation: recipe '{config.recipe}' builds a network for the 'data' file; give data")
    columns = file_columns(path)
    require_columns(path, columns, [config.label_column])
    if features is None:
        features = [c for c in columns if c != config.label_column and c not in exclude]
    require_columns(path, columns, features)
    frame = pd.concat(list(iter_frames(path, features + [config.label_column], text_columns=(config.label_column,))))
    if frame.empty:
        raise DataError(f"{path}: the training data has no rows")
    labels = frame[config.label_column]
    if labels.isna().any():
        raise DataError(f"{path}: column '{config.label_column}' has empty labels")
    try:
        x = frame[features].to_numpy(dtype=np.float32)
    except (TypeError, ValueError):
        bad = next(c for c in features if not pd.api.types.is_numeric_dtype(frame[c]))
        raise DataError(f"{path}: feature column '{bad}' is not numeric") from None
    if not np.isfinite(x).all():
        raise DataError(f"{path}: the features hold NaN or infinite values")
    logits = None
    if _needs_teacher(config, teacher):
        names = sorted(set(labels.astype(str).tolist()))  # fit_ensemble's class order
        logits = teacher_logits(teacher, frame[features], names, str(path))
    return fit_ensemble(x, labels.to_numpy(), features, config, quiet=quiet, teacher=logits)


def build_trained(inputs: Inputs, remediation: RemediationConfig) -> Built:
    """Every method that trains (the builder of :data:`~consistency_gate.ensembles.methods.METHODS`):
    the ensemble or distilled model of ``remediation``, trained (the baseline teaching
    ``focal-distillation``: it predicts the training samples), its training logged and the model
    logged as one pyfunc; its classes are the candidate's (a recipe's class indices name them)."""
    from consistency_gate.ensembles.model import log_ensemble
    from consistency_gate.mlops.scoring import predict

    candidate, baseline, exclude = inputs.candidate, inputs.baseline, inputs.non_features
    input_shape = candidate.tensor.shape[1:] if candidate.tensor is not None else None
    teacher = None if baseline is None else (lambda f: predict(baseline, f, exclude))
    ensemble, build = train_ensemble(
        remediation, candidate.features, exclude, inputs.quiet, inputs.classes, input_shape, teacher
    )
    log_build(build)
    model_info = log_ensemble(ensemble)
    missing = [c for c in ensemble.features or [] if c not in inputs.frame.columns]
    if missing:
        raise DataError(f"{inputs.data_path}: the ensemble's feature column '{missing[0]}' is missing")
    scores = ensemble.predict_frame(inputs.frame.drop(columns=[c for c in exclude if c in inputs.frame.columns]))
    members = len(build.members)
    return Built(model_info, scores, members, build.seconds, ensemble.features, runs=len(build.runs), kappa=build.kappa)


def _needs_teacher(config: RemediationConfig, teacher: Teacher | None) -> bool:
    if config.settings.method != "focal-distillation":
        return False
    if teacher is None:
        raise UsageError(
            "remediation method focal-distillation learns from the previous generation, and there is none "
            "(a first generation, or no baseline): use a DynSnap method"
        )
    return True


def teacher_logits(teacher: Teacher, samples: pd.DataFrame, classes: list[str], where: str) -> np.ndarray:
    """The previous generation's logits on the training ``samples``, one column per name in ``classes``
    (a class the teacher does not know gets probability 0; one it knows beyond them is dropped).

    >>> probs = lambda frame: pd.DataFrame({"b": [0.9], "a": [0.1]})
    >>> teacher_logits(probs, pd.DataFrame({"x": [1.0]}), ["a", "b"], "train.csv").astype(float).round(3).tolist()
    [[-2.303, -0.105]]
    """
    try:
        scores = teacher(samples)
    except GateError as exc:
        raise type(exc)(
            f"focal-distillation: predicting the training samples ({where}) with the baseline: {exc}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any failure of the user's model is reported as the model's
        raise ModelError(
            f"focal-distillation: the baseline could not score the training samples ({where}): "
            f"{type(exc).__name__}: {exc}"
        ) from None
    scores.columns = [str(c) for c in scores.columns]
    if not set(scores.columns) & set(classes):
        raise ModelError(
            f"focal-distillation: the baseline's classes {list(scores.columns)[:5]} share none with the training "
            f"classes {classes[:5]} ({where})"
        )
    return logits_of(scores.reindex(columns=classes, fill_value=0.0).to_numpy(dtype=np.float64))


def fit_ensemble(
    x: np.ndarray,
    labels: np.ndarray,
    features: list[str],
    config: RemediationConfig,
    quiet: bool = False,
    device: str | None = None,
    teacher: np.ndarray | None = None,
) -> tuple[TorchEnsemble, EnsembleBuild]:
    """Check the recipe, standardise the features and build the ensemble from arrays (on ``device``,
    default CUDA when present).

    ``labels`` are class labels (any type; stored as text, sorted, as the class names); ``teacher``
    the previous generation's logits on the rows of ``x`` over those classes (focal-distillation).

    Example::

        ensemble, build = fit_ensemble(x_train, y_train, ["amount", "age"], config)
    """
    labels = np.asarray(labels).astype(str)
    classes = sorted(set(labels.tolist()))
    y = pd.Categorical(labels, categories=classes).codes.astype(np.int64)
    spec = RecipeSpec(config.recipe, dict(config.recipe_options), n_features=len(features), n_classes=len(classes))
    check_recipe(spec)
    mean, std = x.mean(axis=0), x.std(axis=0)
    std[std == 0] = 1.0
    recipe = array_recipe(spec, (x - mean) / std, y)
    build = train_members(recipe, config.settings, quiet=quiet, device=device, teacher=teacher)
    ensemble = _assemble(build, spec, config, classes, features=features, mean=mean, std=std)
    return ensemble, build


def fit_recipe(
    recipe: TrainingRecipe,
    spec: RecipeSpec,
    config: RemediationConfig,
    classes: list[str] | None = None,
    input_shape: tuple[int, ...] | None = None,
    quiet: bool = False,
    device: str | None = None,
    teacher: np.ndarray | None = None,
) -> tuple[TorchEnsemble, EnsembleBuild]:
    """Build the ensemble from the user's :class:`TrainingRecipe` on ``device`` (default CUDA when
    present); its members take one tensor per sample, as the recipe's samples are shaped (which must
    be ``input_shape`` when given). ``teacher``: the previous generation's logits on the recipe's
    samples (focal-distillation).

    Example::

        recipe, spec = load_training_recipe("my_recipes:digits")
        ensemble, build = fit_recipe(recipe, spec, config, classes=[str(d) for d in range(10)])
    """
    shape = recipe.sample_shape()
    if input_shape is not None and tuple(input_shape) != shape:
        raise UsageError(
            f"recipe '{config.recipe}': its samples have shape {shape} but the model it replaces takes "
            f"{tuple(input_shape)}; the ensemble must take the same inputs"
        )
    names = recipe.classes or classes
    labels = recipe.labels()
    if not names:
        names = [str(c) for c in range(int(labels.max()) + 1)]
    if labels.min() < 0 or labels.max() >= len(names):
        raise DataError(
            f"recipe '{config.recipe}': labels must be class indices 0..{len(names) - 1} for the {len(names)} "
            f"classes {names[:5]}..., found {int(labels.min())}..{int(labels.max())}"
        )
    check_recipe(RecipeSpec(spec.name, spec.options, n_classes=len(names), kind=spec.kind), recipe.example())
    build = train_members(recipe, config.settings, quiet=quiet, device=device, teacher=teacher)
    return _assemble(build, spec, config, [str(c) for c in names], input_shape=shape), build


def _assemble(
    build: EnsembleBuild,
    spec: RecipeSpec,
    config: RemediationConfig,
    classes: list[str],
    features: list[str] | None = None,
    mean: np.ndarray | None = None,
    std: np.ndarray | None = None,
    input_shape: tuple[int, ...] | None = None,
) -> TorchEnsemble:
    """The ensemble of a build's members, with the metadata its logged model carries."""
    settings = config.settings
    metadata = {
        "method": settings.method,
        "m": settings.m,
        "N": settings.n_snapshots,
        "epochs": settings.epochs,
        "lr": settings.lr,
        "optimizer": settings.optimizer,
        "combination": config.combination,
        "classes": classes,
        "member_val_acc": [round(mb.val_acc, 6) for mb in build.members],
        "beta_per_run": [r.beta for r in build.runs],
        "tau_per_run": [r.tau for r in build.runs],
        "runs": len(build.runs),
        "kappa": build.kappa,
        "seed": settings.seed,
    }
    return TorchEnsemble(
        spec,
        [mb.state for mb in build.members],
        [mb.val_acc for mb in build.members],
        classes,
        features,
        mean,
        std,
        config.combination,
        build.mc_passes,
        metadata,
        input_shape,
    )


def build_ensemble(
    recipe: TrainingRecipe | str,
    *,
    options: dict | None = None,
    teacher: np.ndarray | None = None,
    combination: str = "avg",
    classes: list[str] | None = None,
    device: str | None = None,
    quiet: bool = False,
    **training: object,
) -> TorchEnsemble:
    """DynSnap (or a baseline ``method``) on the user's own training code: ``recipe`` is a
    :class:`TrainingRecipe` or ``"module:function"`` (called with ``options``) returning one.

    ``training`` holds the training settings, named as in the config's ``remediation:`` block
    (``method``, ``m``, ``N``, ``epochs``, ``lr``, ``optimizer``, ``snapshot_one_run``, ...; see
    :func:`~consistency_gate.ensembles.config.train_settings`), with the same defaults. Trains on
    ``device`` (default CUDA when present; on CPU with the ``threads`` setting's threads, by default
    one for a small network, see :func:`~consistency_gate.ensembles.snapshot.training_threads`) with
    progress bars; the ensemble's ``metadata`` holds the build (runs, kappa, members' validation
    accuracy). The distillation methods train one model: ``focal-distillation`` toward ``teacher``,
    the previous generation's (n, p) logits on the recipe's samples
    (:func:`~consistency_gate.ensembles.distillation.logits_of` turns probabilities into logits),
    ``ensemble-distillation`` toward a ``teacher_method`` ensemble; ``distillation`` overrides the
    method's default term.

    Example (``Net`` a class of your module, which the ensemble imports again where it is loaded;
    docs/repairs.md has the whole recipe)::

        recipe = TrainingRecipe(Net, TensorDataset(x, y))
        ensemble = build_ensemble(recipe, method="dynsnap-step", m=8, N=4, epochs=40, optimizer="adam")
        ensemble.predict_proba(x[:3].numpy()).shape  # (3, number of classes)
    """
    settings = train_settings(**training)
    name = recipe if isinstance(recipe, str) else None
    if isinstance(recipe, str):
        recipe, spec = load_training_recipe(recipe, options)
    else:
        spec = recipe_spec(recipe)
    config = RemediationConfig(None, name or spec.name, dict(options or {}), combination=combination, settings=settings)
    ensemble, _ = fit_recipe(recipe, spec, config, classes, quiet=quiet, device=device, teacher=teacher)
    return ensemble


def register_ensemble(
    ensemble: TorchEnsemble, model_name: str, *, tracking_uri: str | None = None, run_name: str | None = None
) -> str:
    """Log ``ensemble`` as a pyfunc model in a new run (or the active one) and register it as a
    new version of ``model_name``, tagged ``consistency_gate.kind=ensemble``; returns the version.
    Gate it with ``consistency-gate check --candidate <version>`` before promoting it.

    Example::

        register_ensemble(ensemble, "digits-cnn", tracking_uri="sqlite:///mlflow.db")
        # '3'
    """
    import mlflow
    from mlflow import MlflowClient

    from consistency_gate.ensembles.model import log_ensemble
    from consistency_gate.mlops.registry import TAG_KIND, register_version

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_registry_uri(tracking_uri)
    started = mlflow.active_run() is None
    if started:
        mlflow.start_run(run_name=run_name or f"ensemble for {model_name}")
    try:
        info = log_ensemble(ensemble)
        version = register_version(info.model_uri, model_name)
        MlflowClient().set_model_version_tag(model_name, version, TAG_KIND, "ensemble")
    finally:
        if started:
            mlflow.end_run()
    return version


def log_build(build: EnsembleBuild) -> None:
    """Log an ensemble's training to the active MLflow run: per-run accuracies, tau, kept, lr curve, kappa.

    Example::

        with mlflow.start_run():
            log_build(build)
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import mlflow

    from consistency_gate.mlops import tracking

    s = build.settings
    mlflow.log_params(
        {
            "method": s.method,
            "m": s.m,
            "N": s.n_snapshots,
            "epochs": s.epochs,
            "beta": "beta*" if s.beta is None else s.beta,
            "lr": s.lr,
            "optimizer": s.optimizer,
            "seed": s.seed,
            "threads": "picked" if s.threads is None else s.threads,
            **({"snapshot_one_run": s.snapshot_one_run} if s.method == "snapshot" else {}),
        }
    )
    mlflow.log_metrics(
        {"kappa": build.kappa, "runs": len(build.runs), "members": len(build.members), "train_seconds": build.seconds}
    )
    rows = [
        {
            "run": r.run,
            "snapshot": j,
            "epoch": r.epochs[j],
            "val_acc": acc,
            "beta": r.beta,
            "tau": r.tau,
            "kept": j in r.kept,
        }
        for r in build.runs
        for j, acc in enumerate(r.val_accs)
    ]
    tracking.log_table(pd.DataFrame(rows), "ensemble/snapshots.json")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for r in build.runs[:5]:
        ax.plot(range(1, len(r.lr_curve) + 1), r.lr_curve, label=f"run {r.run + 1}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("learning rate")
    ax.set_title(f"{s.method}: learning-rate schedule")
    ax.legend()
    fig.tight_layout()
    mlflow.log_figure(fig, "ensemble/lr_curve.png")
    plt.close(fig)
