"""Ten generations of one model: how many negative flips reach the users under seven update policies.

A team retrains on growing data with a new seed each time: generation t trains on the first 30% + 70% t/9
of the training split. Seven policies decide what is deployed (the answers users see on the evaluation set):

- ``replace``: every new generation is deployed;
- ``gate``: the gate's default rules (``consistency-gate config --default``) against the deployed model; a
  candidate that fails is not deployed and the champion stays;
- ``gate+repairs``: the same gate, and a failed candidate is repaired as ``strategy: cheapest`` does
  without training data (blend, rerank, then bayesian-update over the last 3 generations, each tuned on the
  calibration split with the rules on their strict bounds, and judged on the evaluation set); a repair that
  passes is deployed;
- ``gate+repairs, 2 models``: the same with ``max_models: 2``: a repair of a repaired champion combines the
  candidate with the generation the champion stands in for (flattened, as the gate does), so at most two
  models are served; the Bayesian update over three generations is over that budget and skipped.
- ``bayes``: Traeuble et al.'s update (NeurIPS 2021): every generation's answers combined per sample through
  their confusion matrices on the calibration split; the deployed answer changes only when the belief in
  another class is more than ``--cost-ratio`` times the belief in it. The answer it keeps is what was
  deployed, itself an update of every generation before: the model served carries every generation.
- ``bayes K=3``: the same update over the last 3 generations only, keeping the answer of the generation
  before the newest: what a budget of 3 models can serve (it carries those 3, at every retrain).
- ``bayes, distilled`` (MNIST-1D, whose training loop is the team's own): the single-model route. At each
  retrain the update over every generation, keeping what the served model answered, teaches one network
  (the served one, trained on from its weights with PCT's focal distillation toward the update's answers
  on the training data); that one network is served.

These run in memory through the library's own functions (the gate's decision, the repairs' tuning and
``BayesUpdate``). ``--registry`` runs what a team gets instead, on digits: every generation registered in a
SQLite store and ``consistency-gate check --promote`` run in a process of its own as CI would (the default
config, or ``--config FILE``); the flips are counted over what ``@champion`` held after each gate (its
answers through the gate's own loading and scoring), checked equal to ``consistency-gate history``'s figures,
and, with the default config, to the in-memory ``gate`` policy on the same seed.
Data: scikit-learn's digits (a small MLP, scikit-learn), MNIST-1D (``pip install mnist1d``;
``make_dataset``, generated offline; the Conv1d team model and loop of ``repairs.py``, 8 epochs) and a
tabular recipe (LightGBM on generated data with missing values and a category column).

Prints per data set and policy the cumulative negative flips after each generation and the deployed
accuracy, means with 95% t intervals over the seeds, the ratio of cumulative flips to ``replace``'s, the
final accuracy change and the models the deployed model carries after the last generation;
``--markdown FILE`` writes the tables, ``--plot FILE`` the curves.

    python benchmarks/generations.py [--seeds 5] [--generations 10] [--data digits mnist1d tabular] [--quick]
        [--confidence 0.99]
    python benchmarks/generations.py --registry [--seeds 3] [--config gate.yaml]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
from intervals import format_interval
from repairs import by_hand, mnist1d_splits, probabilities

from consistency_gate.core.evaluation import evaluate_frames
from consistency_gate.ensembles.answers import confusion
from consistency_gate.ensembles.bayes import BayesUpdate, tune_cost_ratio
from consistency_gate.ensembles.repair import tune
from consistency_gate.gate import config as gate_config
from consistency_gate.gate import rules
from consistency_gate.gate.decision import Decision

POLICIES = ("replace", "gate", "gate+repairs", "gate+repairs, 2 models", "bayes", "bayes K=3")
BUDGETS = {"gate+repairs": None, "gate+repairs, 2 models": 2}  # max_models of the repair policies
DISTILLED = "bayes, distilled"  # MNIST-1D only: the team's training loop distils the update into one model
WINDOW = 3  # the bounded Bayesian update combines the last WINDOW plain generations (and serves as many models)


def gate_configs(confidence: float | None = None) -> tuple[gate_config.GateConfig, gate_config.GateConfig]:
    """The packaged default rules (at ``confidence``, the level of their bounds and of ``unless:
    clearly-better``, when given), and the same with the margin the repairs are tuned with."""
    gate = gate_config.load_config(None)
    gate = gate if confidence is None else replace(gate, confidence=confidence)
    tuning = replace(
        gate, rules=[rules.with_margin(r) for r in gate.rules], confidence=rules.tuning_confidence(gate.confidence)
    )
    return gate, tuning


GATE, TUNING = gate_configs()


def digits_splits(seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """scikit-learn's digits: 60% training pool, 20% calibration, 20% evaluation."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(x))
    x = (x / 16.0).astype(np.float32)
    a, b = int(0.6 * len(x)), int(0.8 * len(x))
    return {k: (x[i], y[i]) for k, i in (("fit", order[:a]), ("calibration", order[a:b]), ("test", order[b:]))}


def tabular_splits(seed: int, samples: int = 12_000) -> dict[str, tuple[pd.DataFrame, np.ndarray]]:
    """A tabular recipe's data, generated: 20 numeric features (scikit-learn's ``make_classification``, 5
    classes, 3% label noise) with 5% of the values missing (NaN), and a category column of 8 levels that
    moves the class; 60% training pool, 20% calibration, 20% evaluation (the same data for every seed,
    split by the seed)."""
    from sklearn.datasets import make_classification

    x, y = make_classification(
        n_samples=samples, n_features=20, n_informative=10, n_classes=5, flip_y=0.03, class_sep=0.8, random_state=7
    )
    rng = np.random.default_rng(7)
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(20)])
    frame = frame.mask(rng.random(frame.shape) < 0.05)
    region = (y + rng.integers(0, 4, len(y))) % 8  # a category that tells part of the class
    frame["region"] = pd.Categorical([f"r{r}" for r in region], categories=[f"r{r}" for r in range(8)])
    order = np.random.default_rng(seed).permutation(len(frame))
    a, b = int(0.6 * len(frame)), int(0.8 * len(frame))
    parts = (("fit", order[:a]), ("calibration", order[a:b]), ("test", order[b:]))
    return {k: (frame.iloc[i].reset_index(drop=True), y[i]) for k, i in parts}


def splits_of(data: str, seed: int) -> dict:
    """The fit / calibration / test splits of a recipe's data."""
    if data == "digits":
        return digits_splits(seed)
    if data in ("tabular", "forest"):
        return tabular_splits(seed)
    return mnist1d_splits(seed, samples=8_000)


def train(data: str, x: np.ndarray, y: np.ndarray, seed: int):  # noqa: ANN201 - a function x -> probabilities
    """One generation on (x, y) with ``seed``; returns its predict-probabilities function."""
    if data == "tabular":  # LightGBM with row and column subsampling: the seed changes the trees
        import lightgbm

        model = lightgbm.LGBMClassifier(
            n_estimators=150, learning_rate=0.1, num_leaves=31, subsample=0.8, subsample_freq=1,
            colsample_bytree=0.8, random_state=seed, verbose=-1,
        ).fit(x, y)  # fmt: skip
        return model.predict_proba
    if data == "forest":  # a random forest on the tabular data (missing values as they are, the region's code)
        from sklearn.compose import make_column_transformer
        from sklearn.ensemble import RandomForestClassifier
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import OrdinalEncoder

        codes = make_column_transformer((OrdinalEncoder(), ["region"]), remainder="passthrough")
        forest = RandomForestClassifier(n_estimators=100, min_samples_leaf=2, random_state=seed, n_jobs=2)
        return make_pipeline(codes, forest).fit(x, y).predict_proba
    if data == "digits":
        from sklearn.neural_network import MLPClassifier

        model = MLPClassifier(hidden_layer_sizes=(32,), max_iter=150, random_state=seed).fit(x, y)
        return model.predict_proba
    net = by_hand(x, y, seed, epochs=8)
    return partial(probabilities, net)


def passes(
    previous: np.ndarray, scores: np.ndarray, y: np.ndarray, config: gate_config.GateConfig
) -> tuple[bool, float]:
    """Whether ``scores`` pass ``config``'s rules against ``previous`` on labels ``y``, and its CtoI."""
    classes = [str(c) for c in range(previous.shape[1])]
    frames = [pd.DataFrame(previous, columns=classes), pd.DataFrame(scores, columns=classes)]
    comparison = evaluate_frames(pd.Series(y).astype(str), frames, [1, 5], "benchmark").result(
        confidence=config.confidence
    )
    return Decision.judge(comparison, config, pd.DataFrame(), [1, 5]).verdict == "passed", comparison.metrics["ctoi"]


def repaired(
    champions: list[dict], candidate: dict, y_cal: np.ndarray, y_test: np.ndarray, budget: int | None = None
) -> dict | None:
    """``strategy: cheapest`` without training data: the first of blend, rerank and bayesian-update (each
    tuned on calibration) that passes the gate on the evaluation set, as {"cal", "test"} scores, the models
    it carries and the plain generation it stands in for; None if none. With a ``budget`` (``max_models``),
    a method over it is skipped, and blend and rerank of a repaired champion are flattened as the gate does:
    they combine the candidate with the generation the champion stands in for, judged against the champion."""
    base = champions[-1]

    def judge(scores: np.ndarray) -> tuple[bool, float]:
        return passes(base["cal"], scores, y_cal, TUNING)

    def within(models: int) -> bool:
        return budget is None or models <= budget

    partner = base if within(base["models"] + 1) else base.get("plain", base)
    for method in ("blend", "rerank"):
        if not within(partner["models"] + 1):
            break
        repair = tune(method, partner["cal"], candidate["cal"], judge, "calibration")
        built = {k: repair.apply(partner[k], candidate[k]) for k in ("cal", "test")}
        if passes(base["test"], built["test"], y_test, GATE)[0]:
            return {**built, "models": partner["models"] + 1, "plain": candidate}
    generations = [*champions[-2:], candidate]  # K = 3: the champion before, the champion, the candidate
    if not within(sum(g["models"] for g in generations)):
        return None
    classes = [str(c) for c in range(base["cal"].shape[1])]
    said = {k: [g[k].argmax(axis=1) for g in generations] for k in ("cal", "test")}
    update = BayesUpdate(classes, [confusion(y_cal, s, [int(c) for c in classes]) for s in said["cal"]])
    update = tune_cost_ratio(update, said["cal"], judge, "calibration")
    built = {k: update.scores(said[k]) for k in ("cal", "test")}
    built["models"], built["plain"] = sum(g["models"] for g in generations), candidate
    return built if passes(base["test"], built["test"], y_test, GATE)[0] else None


def distil(x: np.ndarray, y: np.ndarray, teacher: np.ndarray, seed: int, start=None, epochs: int = 8):  # noqa: ANN001, ANN201
    """One Conv1d trained by the team's loop (``repairs.by_hand``: Adam, batches of 64) toward ``teacher``'s
    class probabilities with PCT's focal distillation (FD-KL, alpha 1, beta 5, temperature 4, weight 1),
    from the weights of ``start`` (the model served now) when given; returns the network."""
    import torch
    from mnist1d_model import Conv1dNet
    from repairs import BATCH, LR
    from torch.nn import functional

    from consistency_gate.ensembles.config import Distillation
    from consistency_gate.ensembles.distillation import logits_of, with_distillation

    torch.manual_seed(seed)
    net, term = Conv1dNet(), Distillation()
    if start is not None:
        net.load_state_dict(start.state_dict())
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    xs, ys, targets = torch.as_tensor(x), torch.as_tensor(y), torch.as_tensor(logits_of(teacher))
    for _ in range(epochs):
        net.train()
        for batch in torch.randperm(len(xs)).split(BATCH):
            optimizer.zero_grad()
            out = net(xs[batch])
            with_distillation(functional.cross_entropy(out, ys[batch]), out, targets[batch], ys[batch], term).backward()
            optimizer.step()
    return net.eval()


def distilled_update(update: BayesUpdate, said: list[np.ndarray], kept: np.ndarray) -> np.ndarray:
    """The update's class scores with its answers (``kept`` unless the belief says otherwise) on top: what
    the one model is taught."""
    belief, chosen = update.belief(said), update.answers(said, kept=kept)
    rows, top = np.arange(len(belief)), belief.argmax(axis=1)
    out = belief.copy()
    out[rows, top], out[rows, chosen] = belief[rows, chosen], belief[rows, top]
    return out


def one_seed(data: str, seed: int, generations: int, cost_ratio: float) -> dict[str, dict[str, list[float]]]:
    """Per policy: the cumulative negative flips and the deployed accuracy after each generation."""
    splits = splits_of(data, seed)
    (x_fit, y_fit), (x_cal, y_cal), (x_test, y_test) = splits["fit"], splits["calibration"], splits["test"]
    scored, sizes = [], []
    for t in range(generations):
        sizes.append(int(len(x_fit) * (0.3 + 0.7 * t / max(1, generations - 1))))
        predict = train(data, x_fit[: sizes[-1]], y_fit[: sizes[-1]], 1000 * seed + t)
        scored.append({"cal": predict(x_cal), "test": predict(x_test), "models": 1})
        if data == "mnist1d":  # the distilled policy's teacher answers the training data too
            scored[-1]["fit"], scored[-1]["net"] = predict(x_fit), predict.args[0]
    policies = (*POLICIES, DISTILLED) if data == "mnist1d" else POLICIES
    deployed = {p: [scored[0]["test"].argmax(axis=1)] for p in policies}
    models = {p: 1 for p in policies}  # what the deployed model carries after the last generation
    student_fit = scored[0]["fit"].argmax(axis=1) if data == "mnist1d" else None
    student = scored[0].get("net")
    champions = {"gate": [scored[0]], **{policy: [scored[0]] for policy in BUDGETS}}
    for t in range(1, generations):
        candidate = scored[t]
        deployed["replace"].append(candidate["test"].argmax(axis=1))
        for policy in ("gate", *BUDGETS):
            chain = champions[policy]
            if passes(chain[-1]["test"], candidate["test"], y_test, GATE)[0]:
                chain.append(candidate)
            elif policy in BUDGETS:
                fixed = repaired(chain, candidate, y_cal, y_test, BUDGETS[policy])
                if fixed is not None:
                    chain.append(fixed)
            deployed[policy].append(chain[-1]["test"].argmax(axis=1))
            models[policy] = chain[-1]["models"]
        classes = list(range(candidate["test"].shape[1]))
        confusions = [confusion(y_cal, g["cal"].argmax(axis=1), classes) for g in scored[: t + 1]]
        said = [g["test"].argmax(axis=1) for g in scored[: t + 1]]
        update = BayesUpdate([str(c) for c in classes], confusions, cost_ratio)
        deployed["bayes"].append(update.answers(said, kept=deployed["bayes"][-1]))  # what was deployed: all of it
        window = slice(max(0, t + 1 - WINDOW), t + 1)  # the last plain generations, the one before the newest kept
        bounded = BayesUpdate([str(c) for c in classes], confusions[window], cost_ratio)
        deployed["bayes K=3"].append(bounded.answers(said[window], kept=said[-2]))
        models["bayes"], models["bayes K=3"] = t + 1, len(said[window])
        if student_fit is not None:  # the update over every generation, kept what the one model answered
            teacher = distilled_update(update, [g["fit"].argmax(axis=1) for g in scored[: t + 1]], student_fit)
            student = distil(x_fit[: sizes[t]], y_fit[: sizes[t]], teacher[: sizes[t]], 1000 * seed + t, student)
            student_fit = probabilities(student, x_fit).argmax(axis=1)
            deployed[DISTILLED].append(probabilities(student, x_test).argmax(axis=1))
    out = {}
    for policy, answers in deployed.items():
        right = [a == y_test for a in answers]
        flips = [0] + [int((r0 & ~r1).sum()) for r0, r1 in zip(right, right[1:], strict=False)]
        out[policy] = {
            "cumulative": list(np.cumsum(flips)), "accuracy": [float(r.mean()) for r in right], "models": models[policy]
        }  # fmt: skip
    out["n"] = len(y_test)
    return out


def through_the_registry(seed: int, generations: int, config: Path | None) -> dict:
    """One seed of digits as CI runs it: each generation registered, then gated with ``check --promote``
    in a process of its own. Returns per gate the version @champion holds after it, the cumulative negative
    flips and the accuracy of what it holds (``None`` before a first champion), the models it carries,
    and ``history``'s cumulative negative flips."""
    import json
    import subprocess
    import sys
    import tempfile

    import mlflow
    from mlflow import MlflowClient
    from mlflow.models import infer_signature

    from consistency_gate.mlops.registry import ModelRef, models_carried
    from consistency_gate.mlops.scoring import load_model, predict

    splits = digits_splits(seed)
    (x_fit, y_fit), (x_test, y_test) = splits["fit"], splits["test"]
    columns = [f"p{i}" for i in range(x_fit.shape[1])]
    folder = Path(tempfile.mkdtemp(prefix=f"generations-{seed}-"))
    uri, name, data = f"sqlite:///{folder / 'mlflow.db'}", "digits-mlp", folder / "eval.csv"
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    mlflow.set_experiment("training")
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    features = pd.DataFrame(x_test, columns=columns)
    features.assign(label=y_test, id=[f"t{i}" for i in range(len(y_test))]).to_csv(data, index=False)
    frame = pd.read_csv(data)
    held, answers, out = None, None, {"champion": [], "cumulative": [], "accuracy": [], "models": []}
    flips, judged_flips = 0, 0
    judged = _judged(frame["id"], config)  # history counts over the samples gates judged on
    for t in range(generations):
        size = int(len(x_fit) * (0.3 + 0.7 * t / max(1, generations - 1)))
        model = train("digits", pd.DataFrame(x_fit[:size], columns=columns), y_fit[:size], 1000 * seed + t).__self__
        with mlflow.start_run():
            info = mlflow.sklearn.log_model(
                model, name="model", registered_model_name=name, pip_requirements=["scikit-learn"],
                signature=infer_signature(features.head(), model.predict_proba(features.head())),
                serialization_format="cloudpickle",
            )  # fmt: skip
        check = ["check", "--model", name, "--candidate", str(info.registered_model_version), "--data", str(data)]
        check += ["--id-column", "id", "--tracking-uri", uri, "--promote", "--quiet"]
        check += ["--config", str(config)] if config else []
        proc = subprocess.run([sys.executable, "-m", "consistency_gate", *check], capture_output=True, text=True)
        if proc.returncode not in (0, 1):
            raise RuntimeError(f"generation {t}: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
        try:
            champion = str(client.get_model_version_by_alias(name, "champion").version)
        except mlflow.exceptions.MlflowException:  # no first generation has passed yet
            champion = None
        if champion != held and champion is not None:
            scores = predict(load_model(ModelRef(name, champion)), frame, ("label", "id"))
            now = scores.idxmax(axis=1).astype(int).to_numpy()
            if answers is not None:
                negative = (answers == y_test) & (now != y_test)
                flips, judged_flips = flips + int(negative.sum()), judged_flips + int(negative[judged].sum())
            held, answers = champion, now
        out["champion"].append(held)
        out["cumulative"].append(flips if answers is not None else None)
        out["accuracy"].append(float((answers == y_test).mean()) if answers is not None else None)
        out["models"].append(models_carried(client, name, held) if held else None)
    history = ["history", "--model", name, "--tracking-uri", uri, "--format", "json"]
    history = subprocess.run([sys.executable, "-m", "consistency_gate", *history], capture_output=True, text=True)
    out["history"] = json.loads(history.stdout)["cumulative_negative_flips"]
    out["judged"] = judged_flips
    return out


def _judged(ids: pd.Series, config: Path | None) -> np.ndarray:
    """Which evaluation samples the gates judge on: all of them, or those the config's ``tuning_share``
    does not hold out to tune repairs on (the ledgers, and so ``history``, hold those only)."""
    from consistency_gate.gate.tuning import held_out_mask

    remediation = gate_config.load_config(config).remediation if config else None
    share = remediation.tuning_share if remediation else None
    return np.ones(len(ids), dtype=bool) if share is None else ~held_out_mask(ids, share)


def registry_table(seeds: int, generations: int, config: Path | None, cost_ratio: float) -> list[str]:
    """``--registry``: per seed what ``check --promote`` deployed, beside replacing at every retrain (and the
    in-memory ``gate`` policy, which the default config must equal)."""
    lines = [
        f"\n### digits through the registry: {generations} generations, `check --promote` with "
        f"{config or 'the default config'}\n",
        "| seed | champions | cumulative negative flips | history says | in memory (gate) | replace | "
        "final accuracy | replace's | models carried |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for seed in range(seeds):
        start = time.perf_counter()
        run = through_the_registry(seed, generations, config)
        memory = one_seed("digits", seed, generations, cost_ratio)
        gate, replaced = memory["gate"], memory["replace"]
        same = config is None and gate["cumulative"][-1] == run["cumulative"][-1]
        judged = run["judged"]
        history = f"{run['history']} ({'equal' if run['history'] == judged else f'judged samples: {judged}'})"
        lines.append(
            f"| {seed} | {' '.join(f'v{c}' for c in dict.fromkeys(run['champion']) if c)} | {run['cumulative'][-1]} | "
            f"{history} | {gate['cumulative'][-1]}{' (equal)' if same else ''} | {replaced['cumulative'][-1]} | "
            f"{run['accuracy'][-1]:.4f} | {replaced['accuracy'][-1]:.4f} | {run['models'][-1]} |"
        )
        print(lines[-1], f"({time.perf_counter() - start:.0f} s)", flush=True)
    return lines


def _served(models: list[int]) -> str:
    """The models the deployed model carries after the last generation, over the seeds.

    >>> _served([1, 1]), _served([2, 5])
    ('1', '2-5')
    """
    return str(min(models)) if min(models) == max(models) else f"{min(models)}-{max(models)}"


def _fewer(total: list[float], replace_total: list[float]) -> str:
    """How many times fewer cumulative negative flips than ``replace`` (mean over seeds, and the seeds' range).

    >>> _fewer([2.0, 4.0], [20.0, 20.0]), _fewer([0.0, 0.0], [20.0, 20.0]), _fewer([5.0], [5.0])
    ('6.7x fewer (seeds 5.0-10.0x)', 'none at all', '-')
    """
    if total == replace_total:
        return "-"
    if not any(total):
        return "none at all"
    seeds = [rt / t for t, rt in zip(total, replace_total, strict=True) if t]
    mean = float(np.mean(replace_total)) / float(np.mean(total))
    return f"{mean:.1f}x fewer (seeds {min(seeds):.1f}-{max(seeds):.1f}x)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=None, help="5 (--registry: 3)")
    parser.add_argument("--generations", type=int, default=10)
    parser.add_argument(
        "--data", nargs="+", default=["digits", "mnist1d", "tabular"], choices=["digits", "mnist1d", "tabular"]
    )
    parser.add_argument("--cost-ratio", type=float, default=3.0, help="the bayes policy's cost ratio")
    parser.add_argument("--quick", action="store_true", help="2 seeds, 5 generations")
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--registry", action="store_true", help="digits through check --promote in a SQLite store")
    parser.add_argument("--config", type=Path, default=None, help="--registry: the gate's config (default: packaged)")
    parser.add_argument("--confidence", type=float, default=None, help="the default rules at this confidence")
    args = parser.parse_args()
    if args.confidence is not None:
        global GATE, TUNING  # noqa: PLW0603 - the policies read the rules as module constants
        GATE, TUNING = gate_configs(args.confidence)
    if args.registry:
        lines = registry_table(args.seeds or 3, args.generations, args.config, args.cost_ratio)
        if args.markdown:
            args.markdown.write_text("\n".join(lines) + "\n")
        return
    args.seeds = args.seeds or 5
    if args.quick:
        args.seeds, args.generations = 2, 5
    lines, curves = [], {}
    for data in args.data:
        start = time.perf_counter()
        runs = [one_seed(data, seed, args.generations, args.cost_ratio) for seed in range(args.seeds)]
        n = runs[0]["n"]
        lines += [
            f"\n### {data}: {args.generations} generations, {args.seeds} seeds, {n:,} evaluation samples "
            f"({time.perf_counter() - start:.0f} s)\n",
            "| policy | cumulative negative flips | per update | vs replace | final accuracy | change vs replace | "
            "models served |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        replace_total = [r["replace"]["cumulative"][-1] for r in runs]
        replace_acc = [r["replace"]["accuracy"][-1] for r in runs]
        policies = [p for p in runs[0] if p != "n"]
        for policy in policies:
            total = [float(r[policy]["cumulative"][-1]) for r in runs]
            share = [t / n / (args.generations - 1) for t in total]
            acc = [r[policy]["accuracy"][-1] for r in runs]
            change = [a - ra for a, ra in zip(acc, replace_acc, strict=True)]
            lines.append(
                f"| {policy} | {format_interval(total, 1)} | {format_interval(share, 4)} | "
                f"{_fewer(total, replace_total)} | {format_interval(acc, 4)} | "
                f"{format_interval(change, 4, signed=True)} | {_served([r[policy]['models'] for r in runs])} |"
            )
            curves[(data, policy)] = np.mean([r[policy]["cumulative"] for r in runs], axis=0)
        print("\n".join(lines[-(len(policies) + 3) :]), flush=True)
    if args.markdown:
        args.markdown.write_text("\n".join(lines) + "\n")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(args.data), figsize=(5 * len(args.data), 3.5), squeeze=False)
        for ax, data in zip(axes[0], args.data, strict=True):
            for (recipe, policy), curve in curves.items():
                if recipe == data:
                    ax.plot(range(args.generations), curve, marker="o", label=policy)
            ax.set_title(f"{data}: cumulative negative flips")
            ax.set_xlabel("generation")
        axes[0][0].set_ylabel(f"samples (mean of {args.seeds} seeds)")
        for ax in axes[0]:
            ax.legend(fontsize="x-small")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)


if __name__ == "__main__":
    main()
