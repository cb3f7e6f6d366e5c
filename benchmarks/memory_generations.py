"""Ten generations through the registry with a memory of what users saw: cumulative negative flips and final
accuracy of what ``@champion`` serves on population ids that neither tuned nor were judged on, against
replacing the model at every retrain.

For each recipe and seed, a team retrains on growing data with a new seed each time (generation t trains on
the first 30% + 70% t/9 of the training split, as ``generations.py`` does). The population is the recipe's
evaluation split, scored again at every generation (ids and features, no labels). Its first 40% is labelled:
the gate's evaluation set, half of it held out to tune on (``tuning_share: 0.5``), half judged on; the other
60% of the population is neither, and is where the flips are counted. Every generation is registered in a
SQLite store and gated with ``consistency-gate check --promote`` in a process of its own, as CI runs it, with
the default rules and ``remediation: strategy: [memory]`` naming the population; after each gate the flips are
counted on what ``@champion`` serves (loaded as a server would and asked by id).

Recipes: scikit-learn's digits (a small MLP), MNIST-1D (``mnist1d``'s ``make_dataset``; the Conv1d team loop
of ``repairs.py``, logged as a pyfunc over 40 columns), the tabular recipe (LightGBM on generated data with
missing values and a category column) and forest (a scikit-learn random forest on the same tabular data).
With no ``--update`` and no ``--cost-ratio`` each gate chooses them by replaying the history on the tuning ids
(the default); the row says what each gate chose (``i``: independent, ``c``: correlated, then the ratio).

    python benchmarks/memory_generations.py [--data digits mnist1d tabular forest] [--seeds 5] [--generations 10]
        [--cost-ratio R] [--likelihood answers|scores] [--decay D] [--update independent|correlated]
        [--markdown FILE]

Prints one row per recipe and seed and a summary per recipe: the ratio of replacing's cumulative negative
flips to the memory's (mean over seeds, and the seeds' range), the final accuracy of each and its change,
and what is served (one model and the table's rows and bytes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from generations import splits_of, train
from intervals import format_interval

LABELLED = 0.4  # the share of the population the gate's evaluation set labels (half tuned on, half judged)

try:
    from mlflow.pyfunc import PythonModel
except ImportError:  # pragma: no cover
    PythonModel = object


class Columns(PythonModel):
    """A generation as a pyfunc over named columns: its predict-probabilities function, one column per class."""

    def __init__(self, predict_proba, classes: list[str]) -> None:  # noqa: ANN001
        self.predict_proba, self.classes = predict_proba, classes

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:  # noqa: ANN001
        values = model_input.to_numpy(dtype=np.float32)
        return pd.DataFrame(np.asarray(self.predict_proba(values)), columns=self.classes)


def _frame(x: object, columns: list[str]) -> pd.DataFrame:
    return x.reset_index(drop=True) if isinstance(x, pd.DataFrame) else pd.DataFrame(x, columns=columns)


def _log(data: str, predict, x: pd.DataFrame, name: str) -> str:  # noqa: ANN001
    """Register one generation (its own flavor where it has one) and return its version."""
    import mlflow
    from mlflow.models import infer_signature

    example = x.head()
    if data == "mnist1d":
        classes = [str(c) for c in range(10)]
        model = Columns(predict, classes)
        signature = infer_signature(example, model.predict(None, example))
        with mlflow.start_run():
            info = mlflow.pyfunc.log_model(name="model", python_model=model, signature=signature,
                                           registered_model_name=name, pip_requirements=["torch"])  # fmt: skip
        return str(info.registered_model_version)
    estimator = predict.__self__
    signature = infer_signature(example, estimator.predict_proba(example))
    with mlflow.start_run():
        common = {"name": "model", "registered_model_name": name, "signature": signature}
        if data == "tabular":
            info = mlflow.lightgbm.log_model(estimator, pip_requirements=["lightgbm"], **common)
        else:
            info = mlflow.sklearn.log_model(
                estimator, pip_requirements=["scikit-learn"], serialization_format="cloudpickle", **common
            )
    return str(info.registered_model_version)


def one_seed(data: str, seed: int, generations: int, cost_ratio: float | None, extra: str = "") -> dict:
    """One recipe and seed through the registry: per generation the cumulative negative flips and accuracy of
    what @champion serves and of replacing, on the population ids neither tuned nor judged on."""
    import mlflow
    from mlflow import MlflowClient

    from consistency_gate.mlops.registry import ModelRef
    from consistency_gate.mlops.scoring import load_model
    from consistency_gate.mlops.scoring import predict as predict_with

    splits = splits_of(data, seed)
    (x_fit, y_fit), (x_pop, y_pop) = splits["fit"], splits["test"]
    columns = list(x_fit.columns) if isinstance(x_fit, pd.DataFrame) else [f"p{i}" for i in range(x_fit.shape[1])]
    folder = Path(tempfile.mkdtemp(prefix=f"memory-{data}-{seed}-"))
    uri, name = f"sqlite:///{folder / 'mlflow.db'}", f"{data}-clf"
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    mlflow.set_experiment("training")
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    population = _frame(x_pop, columns).assign(id=[f"i{i}" for i in range(len(y_pop))])
    labelled = np.arange(len(population)) < int(LABELLED * len(population))
    unseen = ~labelled
    population.to_parquet(folder / "population.parquet", index=False)
    population[labelled].assign(label=np.asarray(y_pop)[labelled]).to_parquet(folder / "eval.parquet", index=False)
    ratio = (f", cost_ratio: {cost_ratio}" if cost_ratio else "") + extra
    (folder / "gate.yaml").write_text(
        subprocess.run(
            [sys.executable, "-m", "consistency_gate", "config", "--default"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout  # fmt: skip
        + "remediation:\n  strategy: [memory]\n  tuning_share: 0.5\n"
        f"  options:\n    memory: {{population: {folder / 'population.parquet'}{ratio}}}\n"
    )
    y = np.asarray(y_pop).astype(str)
    served, replaced, outcomes, setting, chosen = [], [], [], {}, []
    for t in range(generations):
        size = int(len(x_fit) * (0.3 + 0.7 * t / max(1, generations - 1)))
        fit = x_fit.iloc[:size] if isinstance(x_fit, pd.DataFrame) else _frame(x_fit[:size], columns)
        predict = train(data, fit if data != "mnist1d" else x_fit[:size], y_fit[:size], 1000 * seed + t)
        version = _log(data, predict, _frame(x_pop, columns), name)
        features = population.drop(columns=["id"])
        raw = np.asarray(predict(features if data != "mnist1d" else features.to_numpy(np.float32))).argmax(axis=1)
        replaced.append(raw.astype(str))
        if t == 0:
            client.set_registered_model_alias(name, "champion", version)
        else:
            check = ["check", "--model", name, "--candidate", version, "--data", str(folder / "eval.parquet"),
                     "--config", str(folder / "gate.yaml"), "--id-column", "id", "--tracking-uri", uri, "--promote",
                     "--quiet", "--report", str(folder / "report.json")]  # fmt: skip
            proc = subprocess.run([sys.executable, "-m", "consistency_gate", *check], capture_output=True, text=True)
            if proc.returncode not in (0, 1):
                raise RuntimeError(f"{data} generation {t}: exit {proc.returncode}: {proc.stderr.strip()[-400:]}")
            report = json.loads((folder / "report.json").read_text())
            outcomes.append(report["outcome"])
            setting = (report.get("ensemble") or {}).get("setting") or setting
            chosen.append(f"{setting.get('update', '?')[0]}{setting.get('cost_ratio', 0):g}")
        champion = str(client.get_model_version_by_alias(name, "champion").version)
        answers = predict_with(load_model(ModelRef(name, champion)), population, ("id",))  # as the gate loads it
        served.append(answers.idxmax(axis=1).astype(str).to_numpy() if t else raw.astype(str))

    def flips(sequence: list[np.ndarray]) -> list[int]:
        steps = [int(((a == y) & (b != y) & unseen).sum()) for a, b in zip(sequence, sequence[1:], strict=False)]
        return list(np.cumsum([0, *steps]))

    latency = (setting.get("latency_ratio_1"), setting.get("latency_ratio_1000"))
    return {
        "memory": flips(served), "replace": flips(replaced), "n": int(unseen.sum()),
        "accuracy": float((served[-1] == y)[unseen].mean()),
        "replace_accuracy": float((replaced[-1] == y)[unseen].mean()), "outcomes": outcomes,
        "rows": setting.get("rows"), "bytes": setting.get("bytes"), "cost_ratio": setting.get("cost_ratio"),
        "latency": latency, "chosen": chosen,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", default=["digits", "mnist1d", "tabular", "forest"])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--generations", type=int, default=10)
    parser.add_argument("--cost-ratio", type=float, default=None, help="fixed (default: replayed by the gate)")
    parser.add_argument("--likelihood", choices=["answers", "scores"], default="answers")
    parser.add_argument("--decay", type=float, default=1.0, help="of the older evidence, in (0, 1]")
    parser.add_argument("--update", choices=["independent", "correlated"], default=None, help="default: replayed")
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args()
    lines = [
        f"\n### {args.generations} generations through the registry, `check --promote` with the default rules and "
        "`strategy: [memory]`\n",
        "| recipe | seed | population ids counted | cumulative negative flips: memory | replace | fewer | "
        "final accuracy: memory | replace | change | served | latency ratio (1 / 1,000) | gates remediated | "
        "update and ratio per gate |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    print("\n".join(lines), flush=True)
    summary = []
    for data in args.data:
        runs = []
        for seed in range(args.seeds):
            start = time.perf_counter()
            extra = f", likelihood: {args.likelihood}, decay: {args.decay}" + (
                f", update: {args.update}" if args.update else ""
            )
            run = one_seed(data, seed, args.generations, args.cost_ratio, extra)
            runs.append(run)
            mem, rep = run["memory"][-1], run["replace"][-1]
            fewer = f"{rep / mem:.1f}x" if mem else "none at all"
            change = run["accuracy"] - run["replace_accuracy"]
            lines.append(
                f"| {data} | {seed} | {run['n']} | {mem} | {rep} | {fewer} | {run['accuracy']:.4f} | "
                f"{run['replace_accuracy']:.4f} | {change:+.4f} | 1 model + {run['rows']} rows ({run['bytes']} B) | "
                f"{run['latency'][0]} / {run['latency'][1]} | {run['outcomes'].count('remediated')} of "
                f"{len(run['outcomes'])} | {' '.join(run['chosen'])} |"
            )
            print(lines[-1], f"({time.perf_counter() - start:.0f} s)", flush=True)
        memory = [r["memory"][-1] for r in runs]
        replace = [r["replace"][-1] for r in runs]
        seeds = [rp / m for m, rp in zip(memory, replace, strict=True) if m]
        change = [r["accuracy"] - r["replace_accuracy"] for r in runs]
        fewer = "none at all"
        if np.mean(memory):
            fewer = f"{float(np.mean(replace)) / float(np.mean(memory)):.1f}x"
            none = ", and none at all" if len(seeds) < len(runs) else ""
            fewer += f" (seeds {min(seeds):.1f}-{max(seeds):.1f}x{none})"
        summary.append(f"| {data} | {fewer} | {format_interval(change, 4, signed=True)} |")
    lines += ["", "| recipe | fewer cumulative negative flips than replace | final accuracy change |",
              "| --- | --- | --- |", *summary]  # fmt: skip
    print("\n".join(lines[-(len(summary) + 3) :]), flush=True)
    if args.markdown:
        args.markdown.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
