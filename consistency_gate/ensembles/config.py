"""The ``remediation:`` block of a gate config, checked without importing torch or MLflow
(``consistency-gate config --check`` and every gate parse it before anything heavy loads).

>>> parse_remediation({"data": "train.csv", "method": "dynsnap-step", "m": 5, "N": 2, "epochs": 4}).settings.m
5
>>> parse_remediation({"data": "train.csv", "enabled": False}) is None
True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from consistency_gate.ensembles.combine import RULES
from consistency_gate.errors import UsageError

METHODS = ("dynsnap-cyc", "dynsnap-step", "snapshot", "extbagging", "mcdropout", "singlebase")


@dataclass(frozen=True)
class TrainSettings:
    """Options of an ensemble build (the config's ``remediation:`` block)."""

    method: str = "dynsnap-cyc"
    m: int = 20
    n_snapshots: int = 10
    epochs: int = 40
    beta: float | None = None  # None: beta* per run
    lr: float = 0.05
    batch_size: int = 64
    val_fraction: float = 0.2
    seed: int = 0
    max_runs: int = 200

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UsageError(f"remediation method '{self.method}' is unknown; use one of {', '.join(METHODS)}")
        for name in ("m", "n_snapshots", "epochs", "batch_size", "max_runs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                label = "N" if name == "n_snapshots" else name
                raise UsageError(f"remediation {label} must be an integer >= 1, got {value!r}")
        if self.beta is not None and not 0.0 <= float(self.beta) <= 1.0:
            raise UsageError(f"remediation beta must be in [0, 1] (or null for beta*), got {self.beta}")
        if not 0.0 < self.val_fraction < 1.0:
            raise UsageError(f"remediation val_fraction must be in (0, 1), got {self.val_fraction}")
        if (self.method.startswith("dynsnap") or self.method == "snapshot") and self.n_snapshots > self.epochs:
            raise UsageError(
                f"remediation N={self.n_snapshots} snapshots need at least as many epochs (epochs={self.epochs})"
            )


_SETTING_KEYS = {
    "method": "method",
    "m": "m",
    "N": "n_snapshots",
    "epochs": "epochs",
    "beta": "beta",
    "lr": "lr",
    "batch_size": "batch_size",
    "val_fraction": "val_fraction",
    "seed": "seed",
    "max_runs": "max_runs",
}
_OTHER_KEYS = {"enabled", "recipe", "recipe_options", "data", "label_column", "combination"}


@dataclass(frozen=True)
class RemediationConfig:
    """The checked ``remediation:`` block: what to train the ensemble on, and how."""

    data: Path
    recipe: str = "mlp"
    recipe_options: dict = field(default_factory=dict)
    label_column: str = "label"
    combination: str = "avg"
    settings: TrainSettings = field(default_factory=TrainSettings)


def parse_remediation(block: object, source: str = "config") -> RemediationConfig | None:
    """The ``remediation:`` block, checked; None when absent or ``enabled: false``."""
    if block is None:
        return None
    where = f"{source}: remediation"
    if not isinstance(block, dict):
        raise UsageError(f"{where}: expected a mapping, got {block!r}")
    unknown = set(block) - set(_SETTING_KEYS) - _OTHER_KEYS
    if unknown:
        known = ", ".join(sorted(set(_SETTING_KEYS) | _OTHER_KEYS))
        raise UsageError(f"{where}: unknown key '{sorted(unknown)[0]}' (known: {known})")
    if not block.get("enabled", True):
        return None
    if "data" not in block:
        raise UsageError(f"{where}: 'data' (the training data file) is required")
    combination = str(block.get("combination", "avg")).lower()
    if combination not in RULES:
        raise UsageError(f"{where}: combination '{combination}' is unknown; use one of {', '.join(RULES)}")
    options = block.get("recipe_options") or {}
    if not isinstance(options, dict):
        raise UsageError(f"{where}: recipe_options must be a mapping, got {options!r}")
    settings = TrainSettings(**{_SETTING_KEYS[k]: v for k, v in block.items() if k in _SETTING_KEYS})
    return RemediationConfig(
        data=Path(block["data"]),
        recipe=str(block.get("recipe", "mlp")),
        recipe_options=options,
        label_column=str(block.get("label_column", "label")),
        combination=combination,
        settings=settings,
    )
