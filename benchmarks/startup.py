"""Start-up cost of the command line, as ratios against a bare ``python -c pass``.

    python benchmarks/startup.py [--repeat 7] [--source DIR] [--check] [--versus-script]

Times, alternating with the bare interpreter so that a noisy machine slows both alike:
``consistency-gate --help``, ``consistency-gate config --check FILE`` (a config with a
remediation block) and the import of the CLI module; prints each one's median and its ratio
to the bare interpreter's median, and which heavy libraries the import pulls in
(``python -X importtime``). ``--source DIR`` measures another checkout (e.g. an older
commit in a git worktree) with ``PYTHONPATH=DIR``; ``config --check`` is skipped where
that checkout has no such option. ``--check`` also runs a cold ``consistency-gate check`` (no
remediation) on the demo's store and splits its wall time into the imports of each library
(``-X importtime``, self time summed per top-level package) and the rest (the gate's work).
``--versus-script`` times a cold ``consistency-gate check`` of a 4-class scikit-learn model on a SQLite
store (1,000 rows) against the plain script a user would write instead (both versions loaded with
``mlflow.pyfunc``, the negative flips counted), alternating, and prints their medians and ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("torch", "mlflow", "great_expectations", "pyspark", "matplotlib", "sklearn", "numba", "pandas")


def _seconds(argv: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def _heavy_imports(env: dict) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import consistency_gate.cli"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    top = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    return sorted(top & set(HEAVY))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--source", type=Path, default=None, help="a checkout to measure instead of the installed one")
    parser.add_argument("--check", action="store_true", help="also split a cold check into imports and work")
    parser.add_argument("--versus-script", action="store_true", help="also a cold check against a plain script")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.source:
        env["PYTHONPATH"] = str(args.source.resolve())
    config = Path(tempfile.mkdtemp(prefix="startup-")) / "gate.yaml"
    config.write_text("rules:\n  - {metric: con, min: 0.9}\nremediation:\n  data: train.csv\n  method: dynsnap-step\n")
    cli = [sys.executable, "-m", "consistency_gate"]
    cases = {
        "--help": cli + ["--help"],
        "config --check": cli + ["config", "--check", str(config)],
        "import consistency_gate.cli": [sys.executable, "-c", "import consistency_gate.cli"],
    }
    probe = subprocess.run(cases["config --check"], env=env, capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        del cases["config --check"]
    bare = [sys.executable, "-c", "pass"]
    times: dict[str, list[float]] = {name: [] for name in cases} | {"python -c pass": []}
    for _ in range(args.repeat):
        for name, argv in cases.items():
            times["python -c pass"].append(_seconds(bare, env))
            times[name].append(_seconds(argv, env))
    base = statistics.median(times["python -c pass"])
    print(f"{args.repeat} runs each, alternating with a bare interpreter; source: {args.source or 'installed'}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:30s} median {median:6.3f} s   x{median / base:5.1f} of python -c pass")
    print(f"  heavy libraries imported by the CLI module: {_heavy_imports(env) or 'none'}")
    if args.check:
        _cold_check(env)
    if args.versus_script:
        _versus_script(env, args.repeat)


def _cold_check(env: dict) -> None:
    """A cold ``check`` of the demo's generation 2 (default rules, no remediation): wall time, and the
    seconds spent importing each library."""
    from consistency_gate.demo import MODEL_NAME, prepare

    workdir = Path(tempfile.mkdtemp(prefix="startup-check-"))
    uri, data, _ = prepare(workdir)
    argv = [sys.executable, "-X", "importtime", "-m", "consistency_gate", "check", "--model", MODEL_NAME]
    argv += ["--candidate", "2", "--data", str(data), "--id-column", "id", "--tracking-uri", uri, "--quiet"]
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    per_package: dict[str, float] = {}
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            self_us, _, name = line.removeprefix("import time:").split("|")
            if self_us.strip().isdigit():
                top = name.strip().split(".")[0]
                per_package[top] = per_package.get(top, 0.0) + int(self_us) / 1e6
    imports = sum(per_package.values())
    print(f"cold check (exit {proc.returncode}): {wall:.1f} s, of which imports {imports:.1f} s; the largest:")
    for name, seconds in sorted(per_package.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {name:24s} {seconds:5.2f} s")
    print(f"  {'(the gate itself)':24s} {wall - imports:5.2f} s")


PLAIN = """
import sys
import mlflow
import pandas as pd
mlflow.set_tracking_uri(sys.argv[1])
data = pd.read_csv(sys.argv[2])
x, y = data.drop(columns="label"), data["label"]
old = mlflow.pyfunc.load_model("models:/four-classes@champion").predict(x)
new = mlflow.pyfunc.load_model("models:/four-classes/2").predict(x)
print(int(((old == y) & (new != y)).sum()), "negative flips")
"""


def _versus_script(env: dict, repeat: int) -> None:
    """A cold ``check`` of a 4-class logistic regression (2 versions, 1,000 evaluation rows, SQLite) against
    the plain script, alternating."""
    import mlflow
    import pandas as pd
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression

    folder = Path(tempfile.mkdtemp(prefix="startup-script-"))
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    x, y = make_classification(3000, 10, n_informative=6, n_classes=4, random_state=0)
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(10)])
    for c in (1.0, 0.05):
        model = LogisticRegression(max_iter=300, C=c).fit(frame.iloc[:2000], y[:2000])
        with mlflow.start_run():
            mlflow.sklearn.log_model(model, name="model", registered_model_name="four-classes", input_example=frame[:3])
    mlflow.MlflowClient().set_registered_model_alias("four-classes", "champion", "1")
    data = folder / "eval.csv"
    frame.iloc[2000:].assign(label=y[2000:]).to_csv(data, index=False)
    (folder / "plain.py").write_text(PLAIN)
    cases = {
        "plain script": [sys.executable, str(folder / "plain.py"), uri, str(data)],
        "consistency-gate check": [sys.executable, "-m", "consistency_gate", "check", "--model", "four-classes",
                                   "--candidate", "2", "--data", str(data), "--tracking-uri", uri],
    }  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, argv in cases.items():
            times[name].append(_seconds(argv, env))
    plain, ours = (statistics.median(times[name]) for name in cases)
    print(f"cold check of a 4-class model, 1,000 rows, SQLite, {repeat} runs each alternating:")
    print(f"  plain script (load both, count negative flips)  median {plain:6.2f} s")
    print(f"  consistency-gate check                          median {ours:6.2f} s   {ours / plain:.2f}x")


if __name__ == "__main__":
    main()
