"""Snapshot ensembles in PyTorch: DynSnap (paper 003, Algorithm 1) and the paper's baselines.

Methods (paper 003, Sec. 4 and its baselines):

- ``dynsnap-cyc``: cyclic cosine learning rate, the best-on-validation snapshot of each of
  the N cycles, dynamic pruning (keep snapshot j if W_j >= tau).
- ``dynsnap-step``: step decay (x0.1 / x0.01 / x0.001 at 40 / 60 / 80 percent of the epochs),
  the top-N epochs on validation, dynamic pruning.
- ``snapshot``: DynSnap-cyc with beta = 1 (tau = min: nothing pruned).
- ``extbagging``: m independent runs, each its final model.
- ``mcdropout``: one run, m stochastic forward passes with dropout active.
- ``singlebase``: one run, its final model.

Each run resamples the train/validation split, re-initialises the model and reshuffles.
Runs repeat until the ensemble holds m members. Seeds make a build reproducible.

>>> beta_star([0.8, 0.9, 1.0])
0.5
>>> pruning_threshold([0.8, 0.9, 1.0], beta=None)   # beta* gives tau = mean(w)
0.9
>>> kept_snapshots([0.8, 0.9, 1.0, 0.85], beta=None)
[1, 2]
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from consistency_gate.ensembles.config import TrainSettings
from consistency_gate.ensembles.recipes import RecipeSpec, build_module
from consistency_gate.errors import UsageError


@dataclass
class Member:
    """One kept snapshot: its weights, validation accuracy, and the run and epoch it came from."""

    state: dict
    val_acc: float
    run: int
    epoch: int


@dataclass
class RunLog:
    """What one training run produced: the snapshots' validation accuracies and what was kept."""

    run: int
    val_accs: list[float]
    epochs: list[int]
    beta: float | None
    tau: float | None
    kept: list[int]
    lr_curve: list[float]
    seconds: float


@dataclass
class EnsembleBuild:
    """What a build produced: the members, each run's log, the settings and the time spent."""

    members: list[Member]
    runs: list[RunLog]
    settings: TrainSettings
    mc_passes: int = 1
    seconds: float = 0.0
    epochs_trained: int = 0

    @property
    def kappa(self) -> float:
        """Training cost relative to one single training run (epochs trained / epochs of one run)."""
        return self.epochs_trained / self.settings.epochs


def beta_star(w: Sequence[float]) -> float | None:
    """(max - mean) / (max - min): the beta that puts tau at mean(w). None when max = min.

    >>> round(beta_star([0.9, 0.8, 0.7]), 6)  # (max - mean) / (max - min)
    0.5
    """
    w = np.asarray(w, dtype=np.float64)
    spread = w.max() - w.min()
    return None if spread == 0 else float((w.max() - w.mean()) / spread)


def pruning_threshold(w: Sequence[float], beta: float | None) -> float:
    """tau = (1 - beta) * max(w) + beta * min(w); beta None means beta*.

    >>> round(pruning_threshold([0.9, 0.8, 0.7], 0.25), 3)  # (1 - beta) max + beta min
    0.85
    """
    w = np.asarray(w, dtype=np.float64)
    if beta is None:
        beta = beta_star(w)
        if beta is None:  # all equal: keep all
            return float(w.min())
    return float((1 - beta) * w.max() + beta * w.min())


def kept_snapshots(w: Sequence[float], beta: float | None) -> list[int]:
    """Indices of the snapshots with W_j >= tau (a tiny tolerance absorbs float rounding).

    >>> kept_snapshots([0.9, 0.8, 0.7], 0.25)
    [0]
    """
    tau = pruning_threshold(w, beta)
    return [j for j, value in enumerate(w) if value >= tau - 1e-12]


def cyclic_cosine_lr(alpha0: float, epoch: int, epochs: int, n_cycles: int) -> float:
    """alpha(t) = alpha0 / 2 * (cos(pi * ((t - 1) mod ceil(T/N)) / ceil(T/N)) + 1), t = 1..T.

    >>> [round(cyclic_cosine_lr(0.1, t, 10, 2), 4) for t in (1, 3, 6)]  # cycles of 5 epochs restart at t = 6
    [0.1, 0.0655, 0.1]
    """
    length = math.ceil(epochs / n_cycles)
    return alpha0 / 2 * (math.cos(math.pi * ((epoch - 1) % length) / length) + 1)


def step_decay_lr(alpha0: float, epoch: int, epochs: int) -> float:
    """x1 before 40% of the epochs, x0.1 from 40%, x0.01 from 60%, x0.001 from 80% (epochs 1..T).

    >>> [round(step_decay_lr(0.1, t, 10), 6) for t in (1, 5, 7, 9)]
    [0.1, 0.01, 0.001, 0.0001]
    """
    done = (epoch - 1) / epochs
    factor = 1.0 if done < 0.4 else 0.1 if done < 0.6 else 0.01 if done < 0.8 else 0.001
    return alpha0 * factor


def build_ensemble(
    recipe: RecipeSpec,
    x: np.ndarray,
    y: np.ndarray,
    settings: TrainSettings,
    quiet: bool = False,
    device: str | None = None,
) -> EnsembleBuild:
    """Train an ensemble of ``settings.m`` members with ``settings.method`` (see module docstring).

    ``x`` is (n, features) float, ``y`` (n,) class indices 0..n_classes-1.

    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(60, 4)).astype(np.float32)
    >>> y = (x[:, 0] > 0).astype(np.int64)
    >>> settings = TrainSettings(method="dynsnap-step", m=2, n_snapshots=2, epochs=3, seed=0)
    >>> build = build_ensemble(RecipeSpec("mlp", {"hidden": [8]}, 4, 2), x, y, settings, quiet=True, device="cpu")
    >>> len(build.members) >= 2
    True
    """
    from tqdm.auto import tqdm

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    rng = np.random.default_rng(settings.seed)
    xt = torch.as_tensor(x, dtype=torch.float32)
    yt = torch.as_tensor(y, dtype=torch.long)
    target = 1 if settings.method in ("mcdropout", "singlebase") else settings.m
    members: list[Member] = []
    runs: list[RunLog] = []
    started = time.perf_counter()
    bar = tqdm(
        total=target,
        desc=f"{settings.method} members",
        unit="member",
        disable=quiet or not sys.stderr.isatty(),
        leave=False,
    )
    run = 0
    while len(members) < target:
        if run >= settings.max_runs:
            raise UsageError(
                f"{settings.method}: {settings.max_runs} runs gave only {len(members)} of "
                f"{target} members; raise max_runs or lower m"
            )
        torch.manual_seed(settings.seed * 1_000_003 + run)
        snapshots, log = _train_run(recipe, xt, yt, settings, rng, run, device, quiet)
        runs.append(log)
        for j in log.kept:
            if len(members) < target:
                members.append(snapshots[j])
                bar.update(1)
        run += 1
    bar.close()
    seconds = time.perf_counter() - started
    build = EnsembleBuild(
        members=members,
        runs=runs,
        settings=settings,
        mc_passes=settings.m if settings.method == "mcdropout" else 1,
        seconds=seconds,
        epochs_trained=settings.epochs * len(runs),
    )
    return build


def _train_run(
    recipe: RecipeSpec,
    xt: torch.Tensor,
    yt: torch.Tensor,
    settings: TrainSettings,
    rng: np.random.Generator,
    run: int,
    device: str,
    quiet: bool,
) -> tuple[list[tuple[float, int, dict]], RunLog]:
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    order = rng.permutation(len(xt))
    n_val = max(1, int(round(settings.val_fraction * len(xt))))
    val_idx, train_idx = order[:n_val], order[n_val:]
    x_train, y_train = xt[train_idx].to(device), yt[train_idx].to(device)
    x_val, y_val = xt[val_idx].to(device), yt[val_idx].to(device)
    model = build_module(recipe).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=settings.lr, momentum=0.9, weight_decay=5e-4)
    loss_fn = nn.CrossEntropyLoss()
    epochs, method = settings.epochs, settings.method
    cyclic = method in ("dynsnap-cyc", "snapshot")
    keeper = _SnapshotKeeper(settings)
    lr_curve: list[float] = []
    generator = torch.Generator().manual_seed(int(rng.integers(2**31)))
    for epoch in tqdm(
        range(1, epochs + 1),
        desc=f"run {run + 1} epochs",
        unit="epoch",
        leave=False,
        disable=quiet or not sys.stderr.isatty(),
    ):
        if cyclic:
            lr = cyclic_cosine_lr(settings.lr, epoch, epochs, settings.n_snapshots)
        else:
            lr = step_decay_lr(settings.lr, epoch, epochs)
        for group in optimizer.param_groups:
            group["lr"] = lr
        lr_curve.append(lr)
        model.train()
        perm = torch.randperm(len(x_train), generator=generator)
        for start in range(0, len(perm), settings.batch_size):
            batch = perm[start : start + settings.batch_size]
            optimizer.zero_grad()
            loss_fn(model(x_train[batch]), y_train[batch]).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            acc = float((model(x_val).argmax(1) == y_val).float().mean())
        keeper.offer(acc, epoch, model)
    snapshots, beta, tau, kept = _select(keeper.chosen(), settings, run)
    log = RunLog(
        run=run,
        val_accs=[s.val_acc for s in snapshots],
        epochs=[s.epoch for s in snapshots],
        beta=beta,
        tau=tau,
        kept=kept,
        lr_curve=lr_curve,
        seconds=time.perf_counter() - t0,
    )
    return snapshots, log


class _SnapshotKeeper:
    """Holds only the states a method can still choose: the final one (single-model methods),
    the best of each cycle (cyclic saving) or the N best so far (top-N saving). A later epoch
    wins a tie on validation accuracy."""

    def __init__(self, settings: TrainSettings) -> None:
        self.method = settings.method
        self.n = settings.n_snapshots
        self.cycle_length = math.ceil(settings.epochs / settings.n_snapshots)
        self.kept: dict[int, tuple[float, int, dict]] = {}  # slot -> (acc, epoch, state)

    def offer(self, acc: float, epoch: int, model: nn.Module) -> None:
        if self.method in ("extbagging", "mcdropout", "singlebase"):
            slot = 0
        elif self.method in ("dynsnap-cyc", "snapshot"):
            slot = (epoch - 1) // self.cycle_length
        else:
            slot = epoch
        current = self.kept.get(slot)
        if slot != epoch and current is not None and current[0] > acc:
            return
        self.kept[slot] = (acc, epoch, {k: v.detach().cpu().clone() for k, v in model.state_dict().items()})
        if self.method == "dynsnap-step" and len(self.kept) > self.n:
            worst = min(self.kept, key=lambda s: (self.kept[s][0], self.kept[s][1]))
            del self.kept[worst]

    def chosen(self) -> list[tuple[float, int, dict]]:
        return [self.kept[slot] for slot in sorted(self.kept)]


def _select(
    chosen: list[tuple[float, int, dict]], settings: TrainSettings, run: int
) -> tuple[list[Member], float | None, float | None, list[int]]:
    """The run's snapshots and the pruning decision (beta used, tau, kept indices)."""
    method = settings.method
    if method in ("extbagging", "mcdropout", "singlebase"):
        acc, epoch, state = chosen[-1]
        return [Member(state, acc, run, epoch)], None, None, [0]
    snapshots = [Member(state, acc, run, epoch) for acc, epoch, state in chosen]
    w = [s.val_acc for s in snapshots]
    beta = 1.0 if method == "snapshot" else settings.beta
    used_beta = beta if beta is not None else beta_star(w)
    return snapshots, used_beta, pruning_threshold(w, beta), kept_snapshots(w, beta)
