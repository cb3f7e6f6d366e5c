"""Snapshot ensembles in PyTorch: DynSnap (Wang et al. 2023, Algorithm 1) and the paper's baselines.

Methods (Wang et al. 2023, Sec. 4 and its baselines):

- ``dynsnap-cyc``: cyclic cosine learning rate, the best-on-validation snapshot of each of
  the N cycles, dynamic pruning (keep snapshot j if W_j >= tau).
- ``dynsnap-step``: step decay (x0.1 / x0.01 / x0.001 at 40 / 60 / 80 percent of the epochs),
  the top-N epochs on validation, dynamic pruning.
- ``snapshot``: Snapshot Ensembles (Huang et al.), 003's baseline: one run of m cosine cycles as long
  as DynSnap-cyc's (``ceil(epochs/N)`` epochs), the best-on-validation snapshot of each, nothing pruned
  (``snapshot_one_run: false``: DynSnap-cyc with beta = 1, m/N runs of N cycles on new splits).
- ``extbagging``: m independent runs, each its best-on-validation epoch's model.
- ``mcdropout``: one run, its best-on-validation epoch's model, m stochastic forward passes with
  dropout active.
- ``singlebase``: one run, its best-on-validation epoch's model.
- ``focal-distillation``: one run, its best-on-validation model, trained with cross-entropy plus
  focal distillation toward the previous generation's outputs on the training samples (the
  ``teacher``; :mod:`~consistency_gate.ensembles.distillation`).
- ``ensemble-distillation``: an ensemble of ``teacher_method`` first, then one student trained
  toward the ensemble's averaged outputs; kappa counts both.

Each run resamples the train/validation split (stratified by class, as 003 Appendix J does),
re-initialises the model and reshuffles. Runs repeat until the ensemble holds m members; where a
run keeps more snapshots than places are left, the best on validation fill them (Algorithm 1
sorts the kept snapshots). The optimiser is SGD (momentum 0.9, weight decay 5e-4) or, with
``optimizer: adam``, Adam as in 003's Table 1 (set ``lr: 0.001`` as there). Seeds
make a build reproducible. The model, data, loss and optimiser come from a
:class:`~consistency_gate.ensembles.recipes.TrainingRecipe`. The learning rate: DynSnap, Snapshot and
ExtBagging keep the paper's schedules (cyclic cosine, step decay); the single-run methods
(SingleBase, MCDropout, the distillations) follow the recipe's ``scheduler`` when it brings one, else
train at the configured rate throughout, as a plain training loop does: on MNIST-1D's 12-epoch Adam
budget both the step decay (a tenth of the rate from 40% of the epochs) and a cosine annealing left the
model under-trained (benchmarks/repairs.py: cosine 0.755 against 0.828 at a constant rate).

>>> beta_star([0.8, 0.9, 1.0])
0.5
>>> pruning_threshold([0.8, 0.9, 1.0], beta=None)   # beta* gives tau = mean(w)
0.9
>>> kept_snapshots([0.8, 0.9, 1.0, 0.85], beta=None)
[1, 2]
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from consistency_gate.ensembles.config import SINGLE_RUN_METHODS, TrainSettings
from consistency_gate.ensembles.distillation import logits_of, with_distillation
from consistency_gate.ensembles.recipes import TrainingRecipe
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


def stratified_split(
    labels: np.ndarray, val_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Train and validation indices: ``val_fraction`` of each class (rounded) to validation, at
    least one sample in all, each part shuffled.

    >>> train, val = stratified_split(np.array([0] * 8 + [1] * 2), 0.5, np.random.default_rng(0))
    >>> sorted(np.bincount(np.array([0] * 8 + [1] * 2)[val]).tolist()), len(train)
    ([1, 4], 5)
    """
    train, val = [], []
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        n_val = int(round(val_fraction * len(members)))
        val.append(members[:n_val])
        train.append(members[n_val:])
    train_idx, val_idx = np.concatenate(train), np.concatenate(val)
    if len(val_idx) == 0:
        train_idx, val_idx = train_idx[1:], train_idx[:1]
    if len(train_idx) == 0:
        raise UsageError(f"{len(labels)} training samples leave none to train on after the validation split")
    return rng.permutation(train_idx), rng.permutation(val_idx)


def train_members(
    recipe: TrainingRecipe,
    settings: TrainSettings,
    quiet: bool = False,
    device: str | None = None,
    teacher: np.ndarray | None = None,
) -> EnsembleBuild:
    """Train an ensemble of ``settings.m`` members with ``settings.method`` (see module docstring).

    ``teacher`` (``focal-distillation`` only, and required there): the previous generation's (n, p)
    logits on the recipe's n training samples, in their order, over the recipe's p classes
    (:func:`~consistency_gate.ensembles.distillation.logits_of` makes logits of probabilities).

    >>> from consistency_gate.ensembles.recipes import RecipeSpec, array_recipe
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(60, 4)).astype(np.float32)
    >>> recipe = array_recipe(RecipeSpec("mlp", {"hidden": [8]}, 4, 2), x, (x[:, 0] > 0).astype(np.int64))
    >>> settings = TrainSettings(method="dynsnap-step", m=2, n_snapshots=2, epochs=3, seed=0)
    >>> build = train_members(recipe, settings, quiet=True, device="cpu")
    >>> len(build.members) >= 2
    True
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    n = len(recipe.labels())
    if settings.method == "focal-distillation":
        if teacher is None:
            raise UsageError(
                "focal-distillation learns from the previous generation's outputs on the training samples; "
                "none were given (the gate predicts them with the baseline version)"
            )
        teacher = np.asarray(teacher, dtype=np.float32)
        if teacher.ndim != 2 or teacher.shape[0] != n or not np.isfinite(teacher).all():
            raise UsageError(
                f"focal-distillation: the teacher's outputs must be finite (n, p) logits for the {n} training "
                f"samples, got shape {teacher.shape}"
            )
    elif teacher is not None:
        raise UsageError(f"{settings.method} takes no teacher outputs (only focal-distillation does)")
    with training_threads(settings.threads, recipe, device):
        if settings.method != "ensemble-distillation":
            return _train_members(recipe, settings, quiet, device, teacher)
        ensemble = _train_members(recipe, replace(settings, method=settings.teacher_method), quiet, device)
        probs = ensemble_probabilities(recipe, ensemble.members, device)
        student = _train_members(recipe, settings, quiet, device, logits_of(probs))
        return replace(
            student,
            runs=ensemble.runs + [replace(r, run=len(ensemble.runs) + r.run) for r in student.runs],
            seconds=ensemble.seconds + student.seconds,
            epochs_trained=ensemble.epochs_trained + student.epochs_trained,
        )


def ensemble_probabilities(recipe: TrainingRecipe, members: Sequence[Member], device: str) -> np.ndarray:
    """(n, p) float32: the members' softmax outputs on the recipe's n training samples, averaged.

    >>> from consistency_gate.ensembles.recipes import RecipeSpec, array_recipe
    >>> x = np.zeros((3, 4), dtype=np.float32)
    >>> recipe = array_recipe(RecipeSpec("mlp", {"hidden": [8]}, 4, 2), x, np.array([0, 1, 0]))
    >>> member = Member(recipe.model().state_dict(), 1.0, 0, 1)
    >>> ensemble_probabilities(recipe, [member, member], "cpu").sum(axis=1).round(4).tolist()
    [1.0, 1.0, 1.0]
    """
    data = _Data(recipe, device)
    order = np.arange(len(recipe.labels()))
    total: np.ndarray | None = None
    model = recipe.model().to(device)
    model.eval()
    for member in members:
        model.load_state_dict(member.state)
        with torch.no_grad():
            probs = torch.cat([torch.softmax(model(x), dim=1) for x, _, _ in data.batches(order, 1024)])
        total = probs.cpu().numpy() if total is None else total + probs.cpu().numpy()
    return (total / len(members)).astype(np.float32)


# a network with fewer parameters trains on one CPU thread by default: its batches are too small for
# torch's intra-op threads to pay, and on a busy machine they contend (benchmarks/training_threads.py)
SMALL_MODEL_PARAMETERS = 1_000_000


@contextlib.contextmanager
def training_threads(threads: int | None, recipe: TrainingRecipe, device: str) -> Iterator[int]:
    """Run the block with torch's CPU threads set for training, and restore them afterwards.

    ``threads`` None picks: one thread for a network of fewer than :data:`SMALL_MODEL_PARAMETERS`
    parameters, torch's default otherwise; 0 keeps torch's default; n uses n. On CUDA nothing changes.
    Yields the thread count in force.

    >>> from torch import nn
    >>> from torch.utils.data import TensorDataset
    >>> recipe = TrainingRecipe(lambda: nn.Linear(4, 2), TensorDataset(torch.zeros(4, 4), torch.zeros(4).long()))
    >>> with training_threads(None, recipe, "cpu") as n:
    ...     n, torch.get_num_threads()
    (1, 1)
    """
    before = torch.get_num_threads()
    if device != "cpu" or threads == 0:
        yield before
        return
    if threads is None:
        size = sum(p.numel() for p in recipe.model().parameters())
        threads = 1 if size < SMALL_MODEL_PARAMETERS else before
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)


def _train_members(
    recipe: TrainingRecipe, settings: TrainSettings, quiet: bool, device: str, teacher: np.ndarray | None = None
) -> EnsembleBuild:
    from tqdm.auto import tqdm

    rng = np.random.default_rng(settings.seed)
    labels = recipe.labels()
    data = _Data(recipe, device, teacher)
    target = 1 if settings.method in SINGLE_RUN_METHODS else settings.m
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
    run_settings = settings
    if settings.method == "snapshot" and settings.snapshot_one_run:  # one long run of m DynSnap-cyc cycles
        cycle = math.ceil(settings.epochs / settings.n_snapshots)
        run_settings = replace(settings, epochs=settings.m * cycle, n_snapshots=settings.m)
    run = 0
    while len(members) < target:
        if run >= settings.max_runs:
            raise UsageError(
                f"{settings.method}: {settings.max_runs} runs gave only {len(members)} of "
                f"{target} members; raise max_runs or lower m"
            )
        torch.manual_seed(settings.seed * 1_000_003 + run)
        snapshots, log = _train_run(recipe, data, labels, run_settings, rng, run, quiet)
        runs.append(log)
        for j in best_first(snapshots, log.kept, target - len(members)):
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
        epochs_trained=run_settings.epochs * len(runs),
    )
    return build


def best_first(snapshots: Sequence[Member], kept: Sequence[int], places: int) -> list[int]:
    """Which of a run's kept snapshots fill the ``places`` left: all when they fit, else the best on
    validation (a later epoch first on a tie), listed in epoch order.

    >>> shots = [Member({}, acc, 0, epoch) for epoch, acc in enumerate([0.9, 0.95, 0.9, 0.97], start=1)]
    >>> best_first(shots, [0, 1, 2, 3], 2), best_first(shots, [0, 2], 1), best_first(shots, [0, 2], 5)
    ([1, 3], [2], [0, 2])
    """
    ranked = sorted(kept, key=lambda j: (snapshots[j].val_acc, snapshots[j].epoch), reverse=True)
    return sorted(ranked[: max(places, 0)])


class _Data:
    """The recipe's dataset in batches on ``device``: tensors sliced directly for a TensorDataset
    (no per-sample calls), a DataLoader over given index batches otherwise; with the teacher's
    logits of each batch's samples when there is a teacher."""

    def __init__(self, recipe: TrainingRecipe, device: str, teacher: np.ndarray | None = None) -> None:
        self.recipe, self.device = recipe, device
        self.teacher = None if teacher is None else torch.as_tensor(teacher, dtype=torch.float32).to(device)
        dataset = recipe.train_dataset
        self.tensors = None
        if isinstance(dataset, TensorDataset) and recipe.collate_fn is None:
            self.tensors = tuple(t.to(device) for t in dataset.tensors[:2])

    def batches(
        self, indices: np.ndarray, batch_size: int, generator: torch.Generator | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """``(x, y, teacher logits or None)`` batches over ``indices``, reshuffled with ``generator``
        (in order without)."""
        order = torch.as_tensor(indices)
        if generator is not None:
            order = order[torch.randperm(len(order), generator=generator)]
        batches = [b.to(self.device) for b in order.split(batch_size)]
        if self.tensors is not None:
            loaded = ((self.tensors[0][b], self.tensors[1][b]) for b in batches)
        else:
            recipe = self.recipe
            loaded = DataLoader(
                recipe.train_dataset,
                batch_sampler=[b.tolist() for b in batches],
                collate_fn=recipe.collate_fn,
                num_workers=recipe.num_workers,
                pin_memory=self.device.startswith("cuda"),
            )
        for (x, y), batch in zip(loaded, batches, strict=True):
            teacher = None if self.teacher is None else self.teacher[batch]
            yield x.to(self.device, non_blocking=True), torch.as_tensor(y).to(self.device, non_blocking=True), teacher


def _optimizer(settings: TrainSettings) -> Callable[[Iterable[nn.Parameter], float], torch.optim.Optimizer]:
    """The settings' optimiser: SGD with momentum 0.9 and weight decay 5e-4, or Adam (003's Table 1)."""
    if settings.optimizer == "adam":
        return lambda params, lr: torch.optim.Adam(params, lr=lr)
    return lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=5e-4)


def _train_run(
    recipe: TrainingRecipe,
    data: _Data,
    labels: np.ndarray,
    settings: TrainSettings,
    rng: np.random.Generator,
    run: int,
    quiet: bool,
) -> tuple[list[Member], RunLog]:
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    train_idx, val_idx = stratified_split(labels, settings.val_fraction, rng)
    model = recipe.model().to(data.device)
    optimizer = (recipe.optimizer or _optimizer(settings))(model.parameters(), settings.lr)
    loss_fn = recipe.loss or nn.CrossEntropyLoss()
    batch_size = recipe.batch_size or settings.batch_size
    epochs, method = settings.epochs, settings.method
    cyclic = method in ("dynsnap-cyc", "snapshot")
    single = method in SINGLE_RUN_METHODS
    # a single run follows the recipe's own schedule when it brings one (stepped once per epoch)
    scheduler = recipe.scheduler(optimizer, epochs) if single and recipe.scheduler is not None else None
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
        if scheduler is None:
            if cyclic:
                lr = cyclic_cosine_lr(settings.lr, epoch, epochs, settings.n_snapshots)
            elif single:  # the optimiser's own rate, as a team's plain loop trains (benchmarks/repairs.py)
                lr = settings.lr
            else:
                lr = step_decay_lr(settings.lr, epoch, epochs)
            for group in optimizer.param_groups:
                group["lr"] = lr
        lr_curve.append(optimizer.param_groups[0]["lr"])
        model.train()
        for x, y, teacher in data.batches(train_idx, batch_size, generator):
            optimizer.zero_grad()
            out = model(x)
            loss = loss_fn(out, y)
            if teacher is not None:
                loss = with_distillation(loss, out, teacher, y, settings.distillation_term)
            loss.backward()
            if teacher is not None and settings.distillation_term.clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), settings.distillation_term.clip)
            optimizer.step()
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y, _ in data.batches(val_idx, max(batch_size, 1024)):
                correct += int((model(x).argmax(1) == y).sum())
        keeper.offer(correct / len(val_idx), epoch, model)
        if scheduler is not None:
            scheduler.step()
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
        if self.method in ("extbagging", *SINGLE_RUN_METHODS):
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
    if method in ("extbagging", *SINGLE_RUN_METHODS):
        acc, epoch, state = chosen[-1]
        return [Member(state, acc, run, epoch)], None, None, [0]
    snapshots = [Member(state, acc, run, epoch) for acc, epoch, state in chosen]
    w = [s.val_acc for s in snapshots]
    beta = 1.0 if method == "snapshot" else settings.beta
    used_beta = beta if beta is not None else beta_star(w)
    return snapshots, used_beta, pruning_threshold(w, beta), kept_snapshots(w, beta)
