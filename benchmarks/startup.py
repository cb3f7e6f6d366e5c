"""Start-up cost of the command line, as ratios against a bare ``python -c pass``.

    python benchmarks/startup.py [--repeat 7] [--source DIR] [--check]

Times, alternating with the bare interpreter so that a noisy machine slows both alike:
``consistency-gate --help``, ``consistency-gate config --check FILE`` (a config with a
remediation block) and the import of the CLI module; prints each one's median and its ratio
to the bare interpreter's median, and which heavy libraries the import pulls in
(``python -X importtime``). ``--source DIR`` measures another checkout (e.g. an older
commit in a git worktree) with ``PYTHONPATH=DIR``; ``config --check`` is skipped where
that checkout has no such option. ``--check`` also runs a cold ``consistency-gate check`` (no
remediation) on the demo's store and splits its wall time into the imports of each library
(``-X importtime``, self time summed per top-level package) and the rest (the gate's work).
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


if __name__ == "__main__":
    main()
