"""Jeffares et al. 2023: does joint training make ensemble members collude?

    python benchmarks/reproduce_collusion.py [--seeds 6] [--betas 0 0.2 0.4 0.6 0.8 0.95 1] [--label-noise 0 0.2]
                                             [--json FILE]

A setting that can overfit: scikit-learn's bundled digits, a small stratified training set (300 samples)
and the rest (1,497) as the test set, once with clean labels and once with 20% of the training labels
replaced by another class at random (samples that can only be memorised). Ensembles of M = 5 wide MLPs
(64 -> 512 -> 10, no dropout) are trained together on 001's augmented objective
``(1 - beta) * mean member CE + beta * ensemble CE`` (probability averaging, the library's
``consistency_gate.diagnostics.decomposition.augmented_loss``), with Adam 1e-3 without decay for a fixed
number of epochs and no early stopping, as 001 Section 6.2 does.

Per beta, over the seeds (mean and 95% t interval): the ensemble's cross-entropy on train and test and
the generalisation gap (test - train), the ensemble's test accuracy, DIV (mean member CE - ensemble CE)
on train and test, the debiasing share of the members' centred logits (the part of their MSE diversity
that one constant offset per member removes, 001 Section 6.1) on train and test, and the codependence
(the test error added by dropping half the members at random); then the paired differences between the
largest and the smallest beta. Last, ``consistency-gate diagnose``'s collusion check on each run's test
and train probabilities (as a user's prediction files would give them): how many runs per beta it flags.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from intervals import format_interval

from consistency_gate.diagnostics import decomposition as dec
from consistency_gate.diagnostics.diagnose import collusion_warnings
from consistency_gate.report.text import table

QUANTITIES = {  # key: column title
    "train_loss": "train CE",
    "test_loss": "test CE",
    "gap": "gap (test - train)",
    "test_acc": "test acc",
    "div_train": "DIV train",
    "div_test": "DIV test",
    "debias_train": "debiasing share train",
    "debias_test": "debiasing share test",
    "codependence": "codependence",
}


def split(seed: int, n_train: int, label_noise: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A stratified training set of ``n_train`` digits (standardised on it; a ``label_noise`` share of its
    labels replaced by another class) and the rest, with true labels, as the test set."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, train_size=n_train, stratify=y, random_state=seed)
    rng = np.random.default_rng(seed)
    noisy = rng.random(len(y_tr)) < label_noise
    y_tr = np.where(noisy, (y_tr + rng.integers(1, 10, len(y_tr))) % 10, y_tr)
    mean, std = x_tr.mean(axis=0), x_tr.std(axis=0) + 1.0
    return (x_tr - mean) / std, (x_te - mean) / std, y_tr, y_te


def train_ensemble(x: np.ndarray, y: np.ndarray, beta: float, seed: int, members: int, width: int, epochs: int):
    """Members trained jointly on the augmented objective; returns a function giving (M, n, p) logits."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    nets = nn.ModuleList(
        nn.Sequential(nn.Linear(x.shape[1], width), nn.ReLU(), nn.Linear(width, 10)) for _ in range(members)
    )
    opt = torch.optim.Adam(nets.parameters(), lr=1e-3)
    xt, yt = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for batch in torch.randperm(len(yt), generator=generator).split(32):
            logits = torch.stack([net(xt[batch]) for net in nets])
            opt.zero_grad()
            dec.augmented_loss(logits, yt[batch], beta).backward()
            opt.step()

    @torch.no_grad()
    def logits_of(data: np.ndarray) -> np.ndarray:
        inputs = torch.as_tensor(data, dtype=torch.float32)
        return torch.stack([net(inputs) for net in nets]).double().numpy()

    return logits_of


def centred(z: np.ndarray) -> np.ndarray:
    """Logits less their per-sample mean over classes: what a softmax output determines of them (the
    library's ``centred_log_probabilities`` recovers the same from probabilities, but clips them at 1e-12,
    which the confident training outputs here would reach)."""
    return z - z.mean(axis=-1, keepdims=True)


def measure(logits_train: np.ndarray, y_train: np.ndarray, logits_test: np.ndarray, y_test: np.ndarray) -> dict:
    from scipy.special import softmax

    p_tr, p_te = softmax(logits_train, axis=-1), softmax(logits_test, axis=-1)
    loss_tr, loss_te = dec.losses(p_tr, y_train), dec.losses(p_te, y_test)
    flagged = collusion_warnings(dec.collusion_numbers(p_te, y_test), dec.collusion_numbers(p_tr, y_train))
    return {
        "train_loss": loss_tr["ce_ensemble"],
        "test_loss": loss_te["ce_ensemble"],
        "gap": loss_te["ce_ensemble"] - loss_tr["ce_ensemble"],
        "test_acc": float((p_te.mean(axis=0).argmax(axis=1) == y_test).mean()),
        "div_train": dec.diversity_ce_probs(p_tr, y_train),
        "div_test": dec.diversity_ce_probs(p_te, y_test),
        "debias_train": dec.debiasing_share(centred(logits_train)),
        "debias_test": dec.debiasing_share(centred(logits_test)),
        "codependence": dec.codependence(p_te, y_test),
        "flagged": bool(flagged),
    }


def run_setting(args: argparse.Namespace, label_noise: float) -> dict[float, list[dict]]:
    """Every beta on every seed for one label-noise level; prints the table and the paired differences."""
    t0 = time.perf_counter()
    runs: dict[float, list[dict]] = {beta: [] for beta in args.betas}
    for seed in range(args.seeds):
        x_tr, x_te, y_tr, y_te = split(seed, args.n_train, label_noise)
        for beta in args.betas:
            logits_of = train_ensemble(x_tr, y_tr, beta, seed, args.members, args.width, args.epochs)
            runs[beta].append(measure(logits_of(x_tr), y_tr, logits_of(x_te), y_te))
        print(f"  seed {seed + 1} of {args.seeds} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    print(
        f"\ndigits: {args.n_train} training samples ({label_noise:.0%} noisy labels), {len(y_te)} test; "
        f"M={args.members} MLPs of width {args.width}, Adam 1e-3, {args.epochs} epochs; {args.seeds} seeds; "
        "mean [95% t interval]\n"
    )
    header = ["beta"] + list(QUANTITIES.values()) + ["flagged by diagnose"]
    rows = [
        [f"{beta:g}"]
        + [format_interval([r[key] for r in rs], 3) for key in QUANTITIES]
        + [f"{sum(r['flagged'] for r in rs)} of {len(rs)}"]
        for beta, rs in runs.items()
    ]
    print(table(rows, header))
    first, last = args.betas[0], args.betas[-1]
    paired = [
        [title, format_interval([b[key] - a[key] for a, b in zip(runs[first], runs[last], strict=True)], 3, True)]
        for key, title in QUANTITIES.items()
    ]
    print(f"\npaired over seeds, beta={last:g} minus beta={first:g}:\n")
    print(table(paired, ["quantity", "difference [95% t interval]"]))
    print(f"\n{time.perf_counter() - t0:.0f} s for this setting\n")
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--betas", type=float, nargs="+", default=[0.0, 0.2, 0.4, 0.6, 0.8, 0.95, 1.0])
    parser.add_argument("--label-noise", type=float, nargs="+", default=[0.0, 0.2])
    parser.add_argument("--n-train", type=int, default=300)
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    args = parser.parse_args()
    t0 = time.perf_counter()
    settings = {noise: run_setting(args, noise) for noise in args.label_noise}
    print(f"{time.perf_counter() - t0:.0f} s in all")
    if args.json_path:
        options = {k: v for k, v in vars(args).items() if k != "json_path"}
        runs = {str(noise): {str(b): r for b, r in by_beta.items()} for noise, by_beta in settings.items()}
        args.json_path.write_text(json.dumps({"settings": options, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
