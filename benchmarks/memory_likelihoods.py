"""Which likelihood a memory of what users saw should multiply in, measured offline (no registry, the same
recipes, splits, generations and tuning rule as ``memory_generations.py``): the hard answer's through each
generation's confusion matrix (what ``strategy: [memory]`` does, Traeuble et al.), the model's class scores
(each generation's probabilities as its likelihood), either with the older evidence discounted (the log-
belief multiplied by ``decay`` before each generation's is added), and the answer's likelihood given what users
saw too (``update: correlated``, :class:`~consistency_gate.core.memory.Repeats` estimated on the tuning share),
against replacing. Recipes: digits (MLP), MNIST-1D (Conv1d), tabular (LightGBM) and forest (a random forest on
the same tabular data).

For each recipe and seed, 10 generations train on growing data with a new seed each time. The population is
the evaluation split: its first 20% tunes (the confusion matrices; the cost ratio, the largest of
``COST_RATIOS`` whose memory is within half a point of the candidate's accuracy there, as the gate tuned it
before it replayed), the next 20% stands for the judged share (unused here), and the flips are counted on the
other 60%. The ``replay-chosen`` rows choose the update and the ratio at each gate as the gate does now
(:func:`~consistency_gate.ensembles.memory_replay.choose`, on the tuning ids in halves), and on the ids that
estimated the confusion matrices. It prints
per recipe the ratio of replacing's cumulative negative flips to each policy's (mean over seeds, range) and
the final accuracy's change against replacing, in points.

    python benchmarks/memory_likelihoods.py [--data digits mnist1d tabular forest] [--seeds 3] [--generations 10]
                                            [--ratios 1.5 10 100]

``--ratios`` adds each policy at each fixed cost ratio (the frontier: negative flips against accuracy).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import pandas as pd
from generations import splits_of, train

from consistency_gate.core.memory import Repeats
from consistency_gate.ensembles.answers import COST_RATIOS, confusion
from consistency_gate.ensembles.memory_replay import History, choose

MARGIN = 0.005  # as the gate: the tuned ratio keeps the memory within half a point of the candidate
POLICIES = {  # name -> (likelihood, decay, update)
    "answers": ("answers", 1.0, "independent"),
    "answers, correlated": ("answers", 1.0, "correlated"),
    "answers, decay 0.5": ("answers", 0.5, "independent"),
    "scores": ("scores", 1.0, "independent"),
    "scores, decay 0.5": ("scores", 0.5, "independent"),
}


def generations(data: str, seed: int, count: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Each generation's class probabilities on the population, and the population's true classes (indices)."""
    splits = splits_of(data, seed)
    (x_fit, y_fit), (x_pop, y_pop) = splits["fit"], splits["test"]
    classes = sorted({str(v) for v in y_fit})
    out = []
    for t in range(count):
        size = int(len(x_fit) * (0.3 + 0.7 * t / max(1, count - 1)))
        fit = x_fit.iloc[:size] if isinstance(x_fit, pd.DataFrame) else x_fit[:size]
        predict = train(data, fit, y_fit[:size], 1000 * seed + t)
        out.append(np.asarray(predict(x_pop if data != "mnist1d" else np.asarray(x_pop, dtype=np.float32))))
    truth = np.array([classes.index(str(v)) for v in y_pop])
    return out, truth


def _kept(belief: np.ndarray, shown: np.ndarray, ratio: float) -> np.ndarray:
    """The answers users see after ``belief`` (log, each row's largest 0): changed where another class is more
    than ``ratio`` times as likely as the one shown."""
    change = -belief[np.arange(len(shown)), shown] > np.log(ratio) + 1e-6
    return np.where(change, belief.argmax(axis=1), shown)


Setting = tuple[tuple[str, float, str], float | None]  # (likelihood, decay, update), the ratio (None: tuned)


def served(probabilities: list[np.ndarray], truth: np.ndarray, tuning: np.ndarray, setting: Callable[[int], Setting]):
    """What users see after each generation (the first generation's answers first), gate ``t`` with ``setting(t)``:
    its policy and cost ratio (None: the largest keeping the candidate's accuracy on the tuning share)."""
    answers = [p.argmax(axis=1) for p in probabilities]
    classes = [str(i) for i in range(probabilities[0].shape[1])]

    def log_likelihood(t: int, shown: np.ndarray | None, likelihood: str, update: str) -> np.ndarray:
        if likelihood == "scores":
            return np.log(np.clip(probabilities[t], 1e-6, 1.0))
        matrix = confusion(truth[tuning].astype(str), answers[t][tuning].astype(str), classes)
        if update == "correlated" and shown is not None:
            repeats = Repeats.estimate(truth[tuning], shown[tuning], answers[t][tuning])
            return repeats.log_likelihood(matrix, answers[t], shown).astype(np.float64)
        return np.log(matrix).T[answers[t]]

    belief, shown = log_likelihood(0, None, setting(1)[0][0], "independent"), answers[0]
    belief -= belief.max(axis=1, keepdims=True)
    out = [shown]
    for t in range(1, len(probabilities)):
        (likelihood, decay, update), ratio = setting(t)
        belief = decay * belief + log_likelihood(t, shown, likelihood, update)
        belief -= belief.max(axis=1, keepdims=True)
        if ratio is None:
            floor = (answers[t][tuning] == truth[tuning]).mean() - MARGIN
            kept = (r for r in sorted(COST_RATIOS, reverse=True)
                    if (_kept(belief, shown, r) == truth)[tuning].mean() >= floor)  # fmt: skip
            ratio = next(kept, min(COST_RATIOS))
        shown = _kept(belief, shown, ratio)
        out.append(shown)
    return out


def replay_choice(
    probabilities: list[np.ndarray], truth: np.ndarray, tuning: np.ndarray, t: int, folds: int
) -> Setting:
    """The setting gate ``t`` chooses by replaying the history (generations 0..t) on the tuning ids alone, as the
    gate does (:func:`~consistency_gate.ensembles.memory_replay.choose`: the two updates at each ratio, the fewest
    cumulative negative flips among those within half a point of replacing on a paired bound); ``folds`` 1
    replays on the ids that estimated the confusion matrices."""
    ids = np.flatnonzero(tuning)
    answers = np.array([p[ids].argmax(axis=1) for p in probabilities[: t + 1]], dtype=np.int16)
    classes = [str(c) for c in range(probabilities[0].shape[1])]
    chosen = choose(History([str(i) for i in ids], answers), truth[ids], classes, folds=folds)
    return ("answers", 1.0, chosen.update), chosen.cost_ratio


def flips_and_accuracy(sequence: list[np.ndarray], truth: np.ndarray, counted: np.ndarray) -> tuple[int, float]:
    """Cumulative negative flips (right before, wrong after) and the final accuracy, on the counted ids."""
    negative = sum(
        int(((a == truth) & (b != truth))[counted].sum()) for a, b in zip(sequence[:-1], sequence[1:], strict=True)
    )
    return negative, float((sequence[-1] == truth)[counted].mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", default=["digits", "mnist1d", "tabular", "forest"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--generations", type=int, default=10)
    parser.add_argument("--ratios", type=float, nargs="*", default=[], help="also each policy at these fixed ratios")
    args = parser.parse_args()
    settings = [(name, None) for name in POLICIES] + [(name, r) for name in POLICIES for r in args.ratios]
    settings += [("replay-chosen (the product)", None), ("replay-chosen, on the ids that estimated", None)]
    print("| recipe | policy | fewer negative flips than replacing (mean, seeds' range) | final accuracy: change |")
    print("| --- | --- | --- | --- |")
    for data in args.data:
        results: dict[tuple[str, float | None], list[tuple[float, float]]] = {s: [] for s in settings}
        for seed in range(args.seeds):
            probabilities, truth = generations(data, seed, args.generations)
            n = len(truth)
            tuning, counted = np.arange(n) < int(0.2 * n), np.arange(n) >= int(0.4 * n)
            replace, replace_accuracy = flips_and_accuracy([p.argmax(axis=1) for p in probabilities], truth, counted)
            for name, ratio in settings:
                if name.startswith("replay-chosen"):
                    folds = 2 if name.endswith("(the product)") else 1
                    chosen = {
                        t: replay_choice(probabilities, truth, tuning, t, folds) for t in range(1, len(probabilities))
                    }
                    sequence = served(probabilities, truth, tuning, chosen.__getitem__)
                else:
                    sequence = served(probabilities, truth, tuning, lambda _, n=name, r=ratio: (POLICIES[n], r))
                flips, accuracy = flips_and_accuracy(sequence, truth, counted)
                results[(name, ratio)].append((replace / max(flips, 1), 100 * (accuracy - replace_accuracy)))
        for (name, ratio), runs in results.items():
            ratios, changes = [r for r, _ in runs], [c for _, c in runs]
            label = name if ratio is None else f"{name}, ratio {ratio:g}"
            print(f"| {data} | {label} | {np.mean(ratios):.1f}x ({min(ratios):.1f}-{max(ratios):.1f}) | "
                  f"{np.mean(changes):+.1f} pt ({min(changes):+.1f} to {max(changes):+.1f}) |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
