"""End-to-end time of the demo's gate, split into registry load, validation, predict, metrics, logging.

    python benchmarks/gate_overhead.py [--workdir DIR] [--repeat 3]

Prepares the demo store once (not timed), then runs the gate `--repeat` times in this
process and prints each phase's time, its share of the total, and the logging share.
Targets: under 30 s end to end, logging under a third of it; the gate's own work, all
but resolving and loading the models ("registry") and their predictions, at most 0.5 s when warm
(the median over the runs after the first is printed last).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from consistency_gate.demo import MODEL_NAME, prepare
from consistency_gate.gate.run import run_gate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gate-bench-"))
    uri, data, _ = prepare(workdir)  # default rules, no remediation: the single gate's overhead
    print(f"store {uri}, data {data}")
    owns: list[float] = []
    for i in range(args.repeat):
        t0 = time.perf_counter()
        result = run_gate(MODEL_NAME, data, candidate="2", id_column="id", tracking_uri=uri)
        total = time.perf_counter() - t0
        phases = dict(result.timings)
        phases["other (imports, run setup)"] = total - sum(phases.values())
        label = "first run (cold imports)" if i == 0 else f"run {i + 1}"
        print(f"\n{label}: total {total:.2f} s, verdict {result.verdict}")
        for name, seconds in phases.items():
            print(f"  {name:28s} {seconds:7.2f} s  {seconds / total:6.1%}")
        print(f"  logging / total = {phases.get('logging', 0) / total:.2f} (target < 0.33)")
        own = total - phases.get("registry", 0) - phases.get("predict", 0)
        print(f"  own work (all but registry and predict) = {own:.2f} s (target <= 0.5 s when warm)")
        if i:
            owns.append(own)
    if owns:
        print(f"\nown work when warm, median of {len(owns)}: {statistics.median(owns):.2f} s (target <= 0.5 s)")


if __name__ == "__main__":
    main()
