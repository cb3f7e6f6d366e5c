"""DynSnap pruning, schedules, combination rules, recipes and the baselines, on tiny data."""

import math

import numpy as np
import pytest
import torch

from consistency_gate.ensembles.combine import combine
from consistency_gate.ensembles.config import METHODS, SINGLE_RUN_METHODS, TrainSettings
from consistency_gate.ensembles.model import TorchEnsemble
from consistency_gate.ensembles.recipes import RecipeSpec, array_recipe, check_recipe
from consistency_gate.ensembles.snapshot import (
    beta_star,
    cyclic_cosine_lr,
    kept_snapshots,
    pruning_threshold,
    step_decay_lr,
    train_members,
)
from consistency_gate.errors import UsageError


def test_tau_and_beta_star_by_hand():
    w = [0.70, 0.80, 0.90, 0.60]  # max .9, min .6, mean .75
    assert beta_star(w) == pytest.approx((0.9 - 0.75) / 0.3)
    assert pruning_threshold(w, None) == pytest.approx(0.75)  # beta* puts tau at the mean
    assert kept_snapshots(w, None) == [1, 2]
    assert pruning_threshold(w, 0.0) == pytest.approx(0.9)  # beta 0: only the best
    assert kept_snapshots(w, 0.0) == [2]
    assert pruning_threshold(w, 1.0) == pytest.approx(0.6)  # beta 1 (Snapshot): keep all
    assert kept_snapshots(w, 1.0) == [0, 1, 2, 3]
    assert pruning_threshold(w, 0.5) == pytest.approx(0.75)
    assert kept_snapshots([0.8, 0.8, 0.8], None) == [0, 1, 2]  # max = min: keep all
    assert beta_star([0.8, 0.8]) is None


def test_learning_rate_schedules_by_hand():
    # T = 10 epochs, N = 5 cycles of ceil(10/5) = 2 epochs: alpha0, alpha0/2 * (cos(pi/2) + 1) = alpha0/2
    assert [cyclic_cosine_lr(0.1, t, 10, 5) for t in (1, 2, 3, 4)] == pytest.approx([0.1, 0.05, 0.1, 0.05])
    # T = 9, N = 2: cycles of 5 epochs
    assert cyclic_cosine_lr(1.0, 3, 9, 2) == pytest.approx(0.5 * (math.cos(math.pi * 2 / 5) + 1))
    assert [step_decay_lr(1.0, t, 10) for t in (1, 4, 5, 7, 9, 10)] == pytest.approx(
        [1.0, 1.0, 0.1, 0.01, 0.001, 0.001]
    )


def test_each_combination_rule_by_hand():
    probs = np.array(
        [
            [[0.6, 0.4, 0.0], [0.2, 0.3, 0.5]],
            [[0.1, 0.8, 0.1], [0.2, 0.5, 0.3]],
            [[0.5, 0.2, 0.3], [0.1, 0.1, 0.8]],
        ]
    )  # 3 members x 2 samples x 3 classes
    w = [0.5, 0.3, 0.2]
    assert combine(probs, "avg") == pytest.approx(probs.mean(0))
    assert combine(probs, "wavg", w) == pytest.approx(np.tensordot(np.array(w), probs, 1))
    # votes: sample 0 -> classes 0, 1, 0; sample 1 -> 2, 1, 2
    assert combine(probs, "mv") == pytest.approx(np.array([[2 / 3, 1 / 3, 0], [0, 1 / 3, 2 / 3]]))
    assert combine(probs, "wmv", w) == pytest.approx(np.array([[0.7, 0.3, 0], [0, 0.3, 0.7]]))
    # a vote tie goes to the lowest class index
    tie = np.array([[[0.9, 0.1]], [[0.1, 0.9]]])
    assert combine(tie, "mv").argmax(1).tolist() == [0]
    with pytest.raises(ValueError, match="needs one weight"):
        combine(probs, "wmv")


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"m": 0}, "m must be"),
        ({"n_snapshots": 0}, "N must be"),
        ({"beta": 1.5}, "beta must be in"),
        ({"beta": -0.1}, "beta must be in"),
        ({"method": "boosting"}, "unknown"),
    ],
)
def test_settings_refused_before_training(kwargs, text):
    with pytest.raises(UsageError, match=text):
        TrainSettings(**kwargs)


def test_recipe_errors_before_training():
    with pytest.raises(UsageError, match="cannot import module"):
        check_recipe(RecipeSpec("no_such_pkg.models:build", {}, 4, 3))
    with pytest.raises(UsageError, match="not a torch.nn.Module"):
        check_recipe(RecipeSpec("builtins:max", {}, 4, 3))
    with pytest.raises(UsageError, match=r"expected \(batch, 3\)"):
        check_recipe(RecipeSpec("torch.nn:Identity", {}, 4, 3))  # 4 outputs for 3 classes
    check_recipe(RecipeSpec("cnn", {"image_shape": [1, 4, 4]}, 16, 3))


def _blobs(n=240, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    centers = rng.normal(0, 2.5, (classes, 5))
    return (centers[y] + rng.normal(0, 1.0, (n, 5))).astype(np.float32), y


@pytest.mark.parametrize("method", METHODS)
def test_every_method_builds_m_members(method):
    x, y = _blobs()
    settings = TrainSettings(method=method, m=4, n_snapshots=3, epochs=6, seed=3)
    teacher = np.eye(3, dtype=np.float32)[y] * 4 if method == "focal-distillation" else None
    recipe = array_recipe(RecipeSpec("mlp", {"hidden": [16]}, 5, 3), x, y)
    build = train_members(recipe, settings, quiet=True, teacher=teacher)
    expected = 1 if method in SINGLE_RUN_METHODS else 4
    assert len(build.members) == expected
    assert build.mc_passes == (4 if method == "mcdropout" else 1)
    if method == "snapshot":  # one run of 4 cycles of ceil(6/3) epochs; beta = 1 keeps every snapshot
        assert len(build.runs) == 1 and build.runs[0].kept == [0, 1, 2, 3] and build.kappa == 8 / 6
    else:
        assert build.kappa == len(build.runs)
    if method == "extbagging":
        assert len(build.runs) == 4
    for run in build.runs:
        if run.tau is not None:
            assert run.kept == [j for j, acc in enumerate(run.val_accs) if acc >= run.tau - 1e-12]


def test_snapshot_one_long_run_or_runs_of_n_cycles():
    x, y = _blobs()
    recipe = array_recipe(RecipeSpec("mlp", {"hidden": [16]}, 5, 3), x, y)
    one = train_members(recipe, TrainSettings(method="snapshot", m=4, n_snapshots=2, epochs=6, seed=1), quiet=True)
    (run,) = one.runs
    assert len(run.lr_curve) == 12 and run.lr_curve[0] == run.lr_curve[3] == run.lr_curve[9]  # 4 cycles of 3
    assert len(one.members) == 4 and one.kappa == 2.0  # 4 cycles of ceil(6/2) epochs, 2x one run
    assert [(e - 1) // 3 for e in run.epochs] == [0, 1, 2, 3]  # the best snapshot of each cycle
    split = TrainSettings(method="snapshot", m=4, n_snapshots=2, epochs=6, seed=1, snapshot_one_run=False)
    runs = train_members(recipe, split, quiet=True)
    assert [len(r.kept) for r in runs.runs] == [2, 2] and runs.kappa == 2.0 and len(runs.members) == 4


def test_last_places_go_to_the_best_snapshots_and_adam_trains():
    x, y = _blobs()
    recipe = array_recipe(RecipeSpec("mlp", {"hidden": [16]}, 5, 3), x, y)
    settings = TrainSettings(method="snapshot", m=3, n_snapshots=2, epochs=4, seed=2, snapshot_one_run=False)
    build = train_members(recipe, settings, quiet=True)
    last = build.runs[-1]
    taken = [m.epoch for m in build.members if m.run == last.run]
    assert len(taken) == 1 and taken[0] == max(zip(last.val_accs, last.epochs, strict=True))[1]  # best (later on a tie)
    adam, sgd = (
        train_members(recipe, TrainSettings(method="singlebase", epochs=10, lr=1e-2, optimizer=name), quiet=True)
        for name in ("adam", "sgd")
    )
    assert adam.members[0].val_acc > 0.8
    assert not torch.equal(adam.members[0].state["0.weight"], sgd.members[0].state["0.weight"])  # same seed
    with pytest.raises(UsageError, match="optimizer 'rmsprop' is unknown"):
        TrainSettings(optimizer="rmsprop")


def test_seeds_make_builds_reproducible_and_ensemble_predicts():
    x, y = _blobs()
    spec = RecipeSpec("mlp", {"hidden": [16]}, 5, 3)
    settings = TrainSettings(method="dynsnap-step", m=3, n_snapshots=3, epochs=6, seed=7)
    a = train_members(array_recipe(spec, x, y), settings, quiet=True)
    b = train_members(array_recipe(spec, x, y), settings, quiet=True)
    assert [r.val_accs for r in a.runs] == [r.val_accs for r in b.runs]
    for ma, mb in zip(a.members, b.members, strict=True):
        assert all(torch.equal(ma.state[k], mb.state[k]) for k in ma.state)
    ens = TorchEnsemble(
        spec,
        [m.state for m in a.members],
        [m.val_acc for m in a.members],
        ["a", "b", "c"],
        [f"f{i}" for i in range(5)],
        np.zeros(5, np.float32),
        np.ones(5, np.float32),
        "wavg",
    )
    probs = ens.predict_proba(x)
    assert probs.shape == (len(x), 3) and np.allclose(probs.sum(1), 1)
    assert (probs.argmax(1) == y).mean() > 0.8


def test_single_runs_follow_the_recipes_scheduler_else_train_at_the_configured_rate():
    import torch
    from torch.utils.data import TensorDataset

    from consistency_gate.ensembles.recipes import TrainingRecipe

    x = torch.randn(60, 4)
    data = TensorDataset(x, (x[:, 0] > 0).long())
    settings = TrainSettings(method="singlebase", epochs=6, lr=0.1)
    halving = TrainingRecipe(
        lambda: torch.nn.Linear(4, 2), data, scheduler=lambda opt, epochs: torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
    )
    assert train_members(halving, settings, quiet=True).runs[0].lr_curve == pytest.approx(
        [0.1 * 0.5**t for t in range(6)]
    )
    plain = TrainingRecipe(lambda: torch.nn.Linear(4, 2), data)
    curve = train_members(plain, settings, quiet=True).runs[0].lr_curve
    assert curve == pytest.approx([0.1] * 6)  # no schedule of its own: the rate a plain loop keeps
    dynsnap = TrainSettings(method="dynsnap-step", m=1, n_snapshots=1, epochs=5, lr=0.1)  # the paper's schedule
    expected = [step_decay_lr(0.1, t, 5) for t in range(1, 6)]
    assert train_members(halving, dynsnap, quiet=True).runs[0].lr_curve == pytest.approx(expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on a GPU machine)")
def test_trained_on_cuda_the_members_live_on_cpu_and_predict_alike_on_a_cpu_only_machine(tmp_path):
    """A GPU runner's repair is served on CPU machines: the members' weights come back as CPU
    tensors, from the sliced-tensor path and from the DataLoader path (pinned memory) alike, and the
    saved ensemble predicts in a process that sees no GPU what it predicts on CUDA."""
    import functools
    import os
    import subprocess
    import sys

    from torch.utils.data import Dataset, TensorDataset

    from consistency_gate.ensembles.recipes import TrainingRecipe, build_module

    class Pairs(Dataset):  # a map-style dataset that is no TensorDataset: a DataLoader with pin_memory
        def __init__(self, x, y):
            self.x, self.y = x, y

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return self.x[i], int(self.y[i])

    x, y = _blobs()
    xs, ys = torch.as_tensor(x), torch.as_tensor(y)
    spec = RecipeSpec("mlp", {"hidden": [16]}, 5, 3)
    settings = TrainSettings(method="dynsnap-cyc", m=2, n_snapshots=2, epochs=4, seed=5)
    for data in (TensorDataset(xs, ys), Pairs(xs, ys)):
        recipe = TrainingRecipe(functools.partial(build_module, spec), data)
        build = train_members(recipe, settings, quiet=True, device="cuda")
        assert all(t.device.type == "cpu" for m in build.members for t in m.state.values())
        assert max(r.val_accs[-1] for r in build.runs) > 0.8
    features = [f"f{i}" for i in range(5)]
    states, weights = [m.state for m in build.members], [1.0] * len(build.members)
    mean, std = np.zeros(5, np.float32), np.ones(5, np.float32)
    ens = TorchEnsemble(spec, states, weights, ["a", "b", "c"], features, mean, std)
    ens.save(tmp_path)
    np.save(tmp_path / "x.npy", x)
    on_cuda = ens.predict_proba(x)
    script = (
        "import sys, numpy as np, torch; from consistency_gate.ensembles.model import TorchEnsemble; "
        "assert not torch.cuda.is_available(); folder = sys.argv[1]; "
        "np.save(folder + '/cpu.npy', TorchEnsemble.load(folder).predict_proba(np.load(folder + '/x.npy')))"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, env=env)
    np.testing.assert_allclose(np.load(tmp_path / "cpu.npy"), on_cuda, atol=1e-5)
