"""Remediation: when the single candidate fails, train a DynSnap ensemble to gate instead.

The config's ``remediation:`` block names the recipe, the training data and the method:

    remediation:
      enabled: true
      recipe: mlp                # mlp, cnn, or package.module:function
      recipe_options: {hidden: [64]}
      data: train.csv            # CSV or Parquet with the feature columns and the label column
      label_column: label
      method: dynsnap-cyc        # dynsnap-step, snapshot, extbagging, mcdropout, singlebase
      m: 20
      N: 10
      epochs: 40
      beta: null                 # null: beta* per run
      combination: avg           # mv, wmv, avg, wavg
      seed: 0

Everything is checked before any training starts (exit 2 for the config, 3 for the data).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from consistency_gate.ensembles.config import RemediationConfig
from consistency_gate.ensembles.model import TorchEnsemble
from consistency_gate.ensembles.recipes import RecipeSpec, check_recipe
from consistency_gate.ensembles.snapshot import EnsembleBuild, build_ensemble
from consistency_gate.errors import DataError
from consistency_gate.io.predictions import file_columns, iter_frames, require_columns


def train_ensemble(
    config: RemediationConfig, features: list[str] | None, exclude: tuple[str, ...] = (), quiet: bool = False
) -> tuple[TorchEnsemble, EnsembleBuild]:
    """Read the training data, check the recipe, and build the ensemble.

    ``features`` are the columns the models take (None: every column but the label and ``exclude``).

    >>> config = parse_config(Path("gate.yaml").read_text()).remediation  # doctest: +SKIP
    >>> ensemble, build = train_ensemble(config, features=None, exclude=("label", "id"))  # doctest: +SKIP
    >>> len(build.members), round(build.kappa, 1)  # doctest: +SKIP
    (5, 1.8)
    """
    path = config.data
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
    return fit_ensemble(x, labels.to_numpy(), features, config, quiet=quiet)


def fit_ensemble(
    x: np.ndarray, labels: np.ndarray, features: list[str], config: RemediationConfig, quiet: bool = False
) -> tuple[TorchEnsemble, EnsembleBuild]:
    """Check the recipe, standardise the features and build the ensemble from arrays.

    ``labels`` are class labels (any type; stored as text, sorted, as the class names).

    >>> ensemble, build = fit_ensemble(x_train, y_train, ["amount", "age"], config)  # doctest: +SKIP
    """
    labels = np.asarray(labels).astype(str)
    classes = sorted(set(labels.tolist()))
    y = pd.Categorical(labels, categories=classes).codes.astype(np.int64)
    recipe = RecipeSpec(config.recipe, dict(config.recipe_options), n_features=len(features), n_classes=len(classes))
    check_recipe(recipe)
    mean, std = x.mean(axis=0), x.std(axis=0)
    std[std == 0] = 1.0
    build = build_ensemble(recipe, (x - mean) / std, y, config.settings, quiet=quiet)
    settings = config.settings
    metadata = {
        "method": settings.method,
        "m": settings.m,
        "N": settings.n_snapshots,
        "epochs": settings.epochs,
        "combination": config.combination,
        "classes": classes,
        "member_val_acc": [round(mb.val_acc, 6) for mb in build.members],
        "beta_per_run": [r.beta for r in build.runs],
        "tau_per_run": [r.tau for r in build.runs],
        "runs": len(build.runs),
        "kappa": build.kappa,
        "seed": settings.seed,
    }
    ensemble = TorchEnsemble(
        recipe,
        [mb.state for mb in build.members],
        [mb.val_acc for mb in build.members],
        classes,
        features,
        mean,
        std,
        config.combination,
        build.mc_passes,
        metadata,
    )
    return ensemble, build


def log_build(build: EnsembleBuild) -> None:
    """Log an ensemble's training to the active MLflow run: per-run accuracies, tau, kept, lr curve, kappa.

    >>> with mlflow.start_run():  # doctest: +SKIP
    ...     log_build(build)  # doctest: +SKIP
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import mlflow

    s = build.settings
    mlflow.log_params(
        {
            "method": s.method,
            "m": s.m,
            "N": s.n_snapshots,
            "epochs": s.epochs,
            "beta": "beta*" if s.beta is None else s.beta,
            "lr": s.lr,
            "seed": s.seed,
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
    mlflow.log_table(pd.DataFrame(rows), artifact_file="ensemble/snapshots.json")
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
