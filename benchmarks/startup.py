"""Start-up cost of the command line, as ratios against a bare ``python -c pass``.

    python benchmarks/startup.py [--repeat 7] [--source DIR]

Times, alternating with the bare interpreter so that a noisy machine slows both alike:
``consistency-gate --help``, ``consistency-gate config --check FILE`` (a config with a
remediation block) and the import of the CLI module; prints each one's median and its ratio
to the bare interpreter's median, and which heavy libraries the import pulls in
(``python -X importtime``). ``--source DIR`` measures another checkout (e.g. an older
commit in a git worktree) with ``PYTHONPATH=DIR``; ``config --check`` is skipped where
that checkout has no such option.
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


if __name__ == "__main__":
    main()
