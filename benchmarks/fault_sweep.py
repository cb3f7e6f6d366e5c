"""Every request of a promoting gate failed once in turn: is any promotion wrong or misreported?

    python benchmarks/fault_sweep.py [--kinds 503 reset lost] [--retries 0 default] [--every 1]
                                     [--at-once 16] [--rounds 3] [--races 12]
                                     [--only races ledgers at-once faults]

Starts a real ``mlflow server`` on 127.0.0.1 with the test suite's iris model (v1 @champion, v2 a
candidate that passes ``con >= 0.5``), and a proxy in front of it. One clean ``check --candidate 2
--promote`` counts the requests a passing promotion makes; then, for each request number i and each
fault kind, @champion is put back on v1 and a gate runs whose i-th request fails:

- ``503``: the proxy answers 503 without forwarding (a gateway that lost the server);
- ``reset``: the proxy closes the connection without forwarding;
- ``lost``: the proxy forwards the request, the server acts on it, and the answer never comes back.

First, ``--rounds`` times, ``--at-once`` promoting gates of v2 start together (all compared against
v1): exactly one may say it promoted. Then each run is judged from what the registry and the
tracking server hold afterwards: a **wrong**
promotion moves @champion when the gate did not pass; a **misreported** one is a report whose
``promoted`` is not what @champion holds (or an exit code other than 0 while @champion moved, with no
report saying so); **running** counts runs left RUNNING. With ``--retries default`` MLflow's own retries
are on; ``0`` turns them off (every fault reaches the gate). Prints, per kind and retry setting, the
exit codes seen and the three counts (all three should be 0).

``--races N``: N promoting gates of v2 while another process moves @champion to v3 directly (no lock, as a
person or a script would) at a random moment of the gate. A **misreported** race is a report that
contradicts what the gate read back (says promoted while it read another version, or a ``passed_version``
other than the version it read); an **overwritten** one is a gate that promoted although the other move
went through during the gate, @champion holding v2 at its end (the registry keeps no record of alias
moves, so the gate cannot see it: counted, not judged).

Ledgers: v2 promoted, then each way a ledger can be damaged (no rows, other columns, an id twice, bytes
that are not Parquet) applied to the ledger that alone holds v1's answers, and a promoting gate of v3 with a
rule over three champions (``forgotten``): a **wrong** promotion is one made on figures over fewer champions
than the rule names; ``history`` must exit 0 and name v1 missing with the reason.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))

from http_proxy import ForwardProxy  # noqa: E402 - the test suite's proxy and fixtures
from mlflow_server import MlflowServer  # noqa: E402
from registry_fixtures import MODEL, build_store, check_args  # noqa: E402

KINDS = {"503": 503, "reset": 0}
SWEEP = "iris-ledger-sweep"  # the ledger section's model


class Injector:
    """Fails the ``at``-th request (1-based) of the next gate with ``kind``; counts requests."""

    def __init__(self) -> None:
        self.at, self.kind, self.seen = 0, "", 0

    def arm(self, at: int, kind: str) -> None:
        self.at, self.kind, self.seen = at, kind, 0

    def fail(self, method: str, path: str) -> int | None:
        self.seen += 1
        return KINDS[self.kind] if self.seen == self.at and self.kind in KINDS else None

    def drop(self, method: str, path: str) -> bool:
        return self.seen == self.at and self.kind == "lost"


def _gate(store: dict, config: Path, uri: str, report: Path, env: dict) -> subprocess.CompletedProcess:
    args = check_args("2", store["data"], config, uri, "--id-column", "id", "--promote", "--report", report, "--quiet")
    command = [sys.executable, "-m", "consistency_gate", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


def _judge(client, proc: subprocess.CompletedProcess, report: Path, experiment_id: str) -> dict:
    holds = str(client.get_model_version_by_alias(MODEL, "champion").version)
    moved = holds == "2"
    written = json.loads(report.read_text()) if report.exists() else None
    passed = written is not None and written.get("verdict") == "passed"
    # no report: misreported when the alias moved and nothing says so
    misreported = bool(written.get("promoted")) != moved if written is not None else moved
    running = len(client.search_runs([experiment_id], "attributes.status = 'RUNNING'"))
    return {"code": proc.returncode, "wrong": moved and not passed, "misreported": misreported, "running": running}


def _at_once(store: dict, config: Path, uri: str, env: dict, client, experiment_id: str, gates: int, root: Path):
    """``gates`` promoting gates of v2 against @champion v1 started together: how many say they promoted,
    what the alias holds, the exit codes, and the runs left RUNNING."""
    client.set_registered_model_alias(MODEL, "champion", "1")
    reports = [root / f"at-once-{i}.json" for i in range(gates)]
    for report in reports:
        report.unlink(missing_ok=True)
    procs = []
    for report in reports:
        args = check_args("2", store["data"], config, uri, "--id-column", "id", "--promote", "--report", report)
        command = [sys.executable, "-m", "consistency_gate", *map(str, args), "--quiet"]
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    codes = collections.Counter(proc.wait(timeout=900) for proc in procs)
    written = [json.loads(r.read_text()) for r in reports if r.exists()]
    holds = str(client.get_model_version_by_alias(MODEL, "champion").version)
    promoted = sum(bool(w.get("promoted")) for w in written)
    running = len(client.search_runs([experiment_id], "attributes.status = 'RUNNING'"))
    return codes, promoted, holds, running


def _races(store: dict, config: Path, uri: str, env: dict, client, rounds: int, root: Path, seconds: float) -> None:
    """Promoting gates of v2 while another process moves @champion to v3 at a random moment of the gate
    (``seconds``: how long a clean gate takes)."""
    import random
    import threading

    misreported = overwritten = 0
    codes = collections.Counter()
    for i in range(rounds):
        client.set_registered_model_alias(MODEL, "champion", "1")
        report = root / f"race-{i}.json"
        report.unlink(missing_ok=True)
        moved_at: list[float] = []

        def move(delay: float, moved_at: list[float]) -> None:
            time.sleep(delay)
            client.set_registered_model_alias(MODEL, "champion", "3")
            moved_at.append(time.monotonic())

        mover = threading.Thread(target=move, args=(random.uniform(0.6 * seconds, 1.05 * seconds), moved_at))
        mover.start()
        proc = _gate(store, config, uri, report, env)
        ended = time.monotonic()
        holds = str(client.get_model_version_by_alias(MODEL, "champion").version)  # at the gate's end
        mover.join()
        codes[proc.returncode] += 1
        written = json.loads(report.read_text()) if report.exists() else {}
        says, passed = written.get("promoted"), written.get("passed_version")
        seen = (written.get("promotion") or {}).get("holds")  # what the gate read back
        # misreported: the report contradicts what the gate itself read back
        bad = (says is True and seen != "2") or (passed is not None and passed != seen)
        misreported += bad
        during = bool(moved_at) and moved_at[0] < ended
        overwritten += says is True and during and holds == "2"
        if bad:
            print(f"  race {i}: exit {proc.returncode}, promoted {says}, passed_version {passed}, read back v{seen}")
    shown = ", ".join(f"{code}: {n}" for code, n in sorted(codes.items()))
    print(
        f"races: {rounds} gates, exit codes {shown}; {misreported} misreported (0 expected); {overwritten} "
        "promoted after the other move went through (undetectable: MLflow keeps no alias history)"
    )


def _ledgers(store: dict, uri: str, env: dict, client, root: Path) -> None:
    """A damaged ledger under a promoting gate with a history rule: never a promotion on fewer champions. A
    model of its own (``SWEEP``, the iris versions registered again), so that one ledger alone holds v1's
    answers: its gate of v2."""
    import mlflow
    import pandas as pd

    from consistency_gate.mlops.tracking import LEDGER

    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    for version in ("1", "2", "3"):
        mlflow.register_model(f"models:/{MODEL}/{version}", SWEEP)
    client.set_registered_model_alias(SWEEP, "champion", "1")

    def gate(candidate: str, rule: str, report: Path) -> subprocess.CompletedProcess:
        config = root / "ledger-gate.yaml"
        config.write_text(f"rules:\n  - {rule}\n")
        args = ["check", "--model", SWEEP, "--candidate", candidate, "--data", store["data"], "--id-column", "id"]
        args += ["--config", config, "--tracking-uri", uri, "--promote", "--report", report, "--quiet"]
        command = [sys.executable, "-m", "consistency_gate", *map(str, args)]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)

    first = gate("2", "{metric: con, min: 0.5}", root / "first.json")
    if first.returncode != 0:
        sys.exit(f"the gate of v2 failed (exit {first.returncode}): {first.stderr[-2000:]}")
    run_id = json.loads((root / "first.json").read_text())["run_id"]
    ledger = Path(client.download_artifacts(run_id, LEDGER, str(root / "original")))
    original = pd.read_parquet(ledger)
    damages = {
        "no rows": lambda path: original.head(0).to_parquet(path, index=False),
        "other columns": lambda path: original.rename(columns={"id": "sample"}).to_parquet(path, index=False),
        "an id twice": lambda path: pd.concat([original, original.head(1)]).to_parquet(path, index=False),
        "not Parquet": lambda path: path.write_bytes(b"these bytes are not Parquet"),
        "none (control: the rule passes)": lambda path: original.to_parquet(path, index=False),
    }
    history = ["history", "--model", SWEEP, "--tracking-uri", uri, "--format", "json"]
    wrong = 0
    for name, damage in damages.items():
        damaged = root / "damaged" / "answers.parquet"
        damaged.parent.mkdir(exist_ok=True)
        damage(damaged)
        client.log_artifact(run_id, str(damaged), "gate")  # over the ledger the gate of v2 logged
        client.set_registered_model_alias(SWEEP, "champion", "2")
        proc = gate("3", "{metric: forgotten, max: 0.99, history: 3}", root / "ledger.json")
        holds = str(client.get_model_version_by_alias(SWEEP, "champion").version)
        said = subprocess.run(
            [sys.executable, "-m", "consistency_gate", *history], env=env, capture_output=True, text=True
        )
        reasons = json.loads(said.stdout).get("missing_reasons", {}) if said.returncode == 0 else {}
        expected = "3" if name.startswith("none") else "2"
        wrong += holds != expected
        print(
            f"  {name}: gate exit {proc.returncode}, @champion v{holds} (v{expected} expected); history exit "
            f"{said.returncode}, v1: {reasons.get('1', 'answered')[:100]}"
        )
    print(f"ledgers: {len(damages) - 1} damages and a control, {wrong} wrong (0 expected)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", nargs="+", default=["503", "reset", "lost"], choices=["503", "reset", "lost"])
    parser.add_argument("--retries", nargs="+", default=["0", "default"], choices=["0", "default"])
    parser.add_argument("--every", type=int, default=1, help="fail every Nth request number only (a quicker sweep)")
    parser.add_argument("--at-once", type=int, default=16, help="gates started together in each round (0: none)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--races", type=int, default=12, help="gates raced by a direct alias move (0: none)")
    sections = ["races", "ledgers", "at-once", "faults"]
    parser.add_argument("--only", nargs="+", default=sections, choices=sections, help="the sections to run")
    args = parser.parse_args()
    from mlflow import MlflowClient

    with tempfile.TemporaryDirectory(prefix="fault-sweep-") as tmp:
        root = Path(tmp)
        server = MlflowServer(root).start()
        injector = Injector()
        proxy = ForwardProxy(server.port, drop=injector.drop, fail=injector.fail).start()
        try:
            store = build_store(root, uri=server.url)
            config = root / "gate.yaml"
            config.write_text("rules:\n  - {metric: con, min: 0.5}\n")
            client = MlflowClient(tracking_uri=server.url, registry_uri=server.url)
            base_env = proxy.env()
            base_env.pop("MLFLOW_HTTP_REQUEST_MAX_RETRIES", None)
            report = root / "report.json"
            injector.arm(0, "")
            started = time.monotonic()
            clean = _gate(store, config, server.url, report, base_env)
            seconds = time.monotonic() - started
            if clean.returncode != 0:
                sys.exit(f"the clean gate failed (exit {clean.returncode}): {clean.stderr[-2000:]}")
            requests = injector.seen
            experiment_id = client.get_experiment_by_name(f"consistency-gate/{MODEL}").experiment_id
            if "races" in args.only and args.races:
                _races(store, config, server.url, base_env, client, args.races, root, seconds)
            if "ledgers" in args.only:
                _ledgers(store, server.url, base_env, client, root)
            rounds = args.rounds if args.at_once and "at-once" in args.only else 0
            for round_ in range(1, rounds + 1):
                codes, promoted, holds, running = _at_once(
                    store, config, server.url, base_env, client, experiment_id, args.at_once, root
                )
                shown = ", ".join(f"{code}: {n}" for code, n in sorted(codes.items()))
                print(
                    f"round {round_}: {args.at_once} gates at once, exit codes {shown}; {promoted} report(s) say "
                    f"promoted (1 expected), @champion holds v{holds} (v2 expected), {running} runs left RUNNING"
                )
            if "faults" not in args.only:
                return
            print(f"a passing check --promote makes {requests} requests; each fails once in turn")
            header = ("kind", "retries", "faults", "exit codes", "wrong", "misreported", "running")
            print("{:>6} {:>8} {:>6}  {:<28} {:>5} {:>11} {:>7}".format(*header))
            for retries in args.retries:
                env = proxy.env("0") if retries == "0" else base_env
                for kind in args.kinds:
                    codes = collections.Counter()
                    wrong = misreported = running = faults = 0
                    for at in range(1, requests + 1, args.every):
                        client.set_registered_model_alias(MODEL, "champion", "1")
                        report.unlink(missing_ok=True)
                        injector.arm(at, kind)
                        proc = _gate(store, config, server.url, report, env)
                        seen = _judge(client, proc, report, experiment_id)
                        faults += 1
                        codes[seen["code"]] += 1
                        wrong += seen["wrong"]
                        misreported += seen["misreported"]
                        running = max(running, seen["running"])
                        if seen["wrong"] or seen["misreported"] or seen["running"]:
                            print(f"  request {at} ({kind}, retries {retries}): {seen}; {proc.stderr.strip()[-300:]}")
                    shown = ", ".join(f"{code}: {n}" for code, n in sorted(codes.items()))
                    print(f"{kind:>6} {retries:>8} {faults:>6}  {shown:<28} {wrong:>5} {misreported:>11} {running:>7}")
        finally:
            proxy.stop()
            server.kill()


if __name__ == "__main__":
    main()
