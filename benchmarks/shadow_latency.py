"""The latency `shadow serve` adds to the champion's answer, against `mlflow models serve` of the champion alone.

The servers run at once on this machine (one uvicorn worker each, as `mlflow models serve` starts by default),
serving the same registered champion, a scikit-learn MLP on digits (v1): `mlflow models serve` alone, and the
`shadow serve`s of ``--servers`` scoring v2 (another MLP) off the request path: the default (journal by group
commit, the candidate scoring what queued in 0.1 s in one call), `--no-journal`, `--candidate-batch-seconds 0` (the
candidate called as soon as it is free, as before), `--candidate-idle` (Linux). 4 client threads (each one request
at a time, one row, JSON ``dataframe_split``, a kept-alive connection) drive one server at a time for ``--requests``
requests, in blocks that alternate between the servers so that all see the same machine load. Prints each server's
p50 and p99 over all its requests, its requests per second (median of its blocks) and the ratios to the champion
alone, and the CPU its process tree used per request (steadier than the latencies on a noisy machine); the rows
each capture holds after SIGTERM against the requests it answered (all of them is the promise); then ``--kills``
times a fresh `shadow serve` killed with SIGKILL under the same load, counting the answered requests its journal
lost (the last group).

    python benchmarks/shadow_latency.py [--requests 2000] [--blocks 6] [--kills 5] [--servers shadow 'batch 0']
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

SHADOWS = {  # the shadow servers that can be measured: their options
    "shadow": (),
    "no journal": ("--no-journal",),
    "candidate idle": ("--candidate-idle",),
    "batch 0": ("--candidate-batch-seconds", "0"),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def register(folder: Path) -> str:
    """Two MLPs on digits registered as digits-shadow v1 and v2 in a SQLite store; returns its URI."""
    import mlflow
    from sklearn.datasets import load_digits
    from sklearn.neural_network import MLPClassifier

    uri = f"sqlite:///{folder / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    x, y = load_digits(return_X_y=True)
    for seed in (0, 1):
        model = MLPClassifier((64,), max_iter=200, random_state=seed).fit(x / 16.0, y)
        with mlflow.start_run():
            mlflow.sklearn.log_model(model, name="model", registered_model_name="digits-shadow",
                                     serialization_format="cloudpickle")  # fmt: skip
    mlflow.MlflowClient().set_registered_model_alias("digits-shadow", "champion", "1")
    return uri


def wait_up(port: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"a server on port {port} ended with exit {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"no server on port {port} after 180 s")


class Client:
    """One client: requests one at a time on a kept-alive connection."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def send(self, body: bytes, request_id: str = "") -> float:
        started = time.perf_counter()
        headers = {"Content-Type": "application/json", **({"X-Request-Id": request_id} if request_id else {})}
        self.connection.request("POST", "/invocations", body=body, headers=headers)
        response = self.connection.getresponse()
        response.read()
        if response.status != 200:
            raise SystemExit(f"port {self.port} answered {response.status}")
        return time.perf_counter() - started


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user and system) a process and its descendants have used so far (Linux's /proc; 0 where
    there is none): a server's own cost per request, steadier than the latencies on a noisy machine."""
    total, pending = 0, [pid]
    while pending:
        process = pending.pop()
        try:
            fields = Path(f"/proc/{process}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
            for task in Path(f"/proc/{process}/task").iterdir():
                pending += [int(child) for child in (task / "children").read_text().split()]
        except (OSError, IndexError, ValueError):  # ended meanwhile, or no /proc
            continue
    return total / os.sysconf("SC_CLK_TCK") if total else 0.0


def block(port: int, bodies: list[bytes], requests: int, clients: int = 4) -> tuple[list[float], float]:
    """``requests`` requests from ``clients`` threads at once; their latencies and the requests per second."""
    latencies: list[float] = []
    share = requests // clients

    def client(offset: int) -> None:
        session = Client(port)
        mine = [session.send(bodies[(offset + n) % len(bodies)]) for n in range(share)]
        latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(i * 97,)) for i in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, share * clients / (time.perf_counter() - started)


def start_shadow(uri: str, capture: Path, port: int, log, *extra: str) -> subprocess.Popen:  # noqa: ANN001
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    return subprocess.Popen(
        [sys.executable, "-m", "consistency_gate", "shadow", "serve", "--model", "digits-shadow", "--candidate", "2",
         "--capture", str(capture), "--port", str(port), "--tracking-uri", uri, *extra],
        env=env, stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip


def killed_under_load(uri: str, folder: Path, bodies: list[bytes], kills: int) -> list[tuple[int, int]]:
    """``kills`` times: a fresh shadow server driven by 4 clients, SIGKILL after 200 answered requests; returns
    (answered, lost from the capture) for each."""
    from consistency_gate.io.capture import read_capture

    counts = []
    for round_ in range(kills):
        capture, port = folder / f"killed-{round_}", free_port()
        with open(folder / f"killed-{round_}.log", "w") as log:
            server = start_shadow(uri, capture, port, log)
            wait_up(port, server)
            answered: list[str] = []

            def client(k: int, port: int = port, answered: list = answered, round_: int = round_) -> None:
                session = Client(port)
                for n in range(10**6):
                    try:
                        session.send(bodies[(k * 97 + n) % len(bodies)], f"{round_}-{k}-{n}")
                    except (OSError, http.client.HTTPException):
                        return
                    answered.append(f"{round_}-{k}-{n}")

            threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
            for t in threads:
                t.start()
            while len(answered) < 200:
                time.sleep(0.001)
            server.kill()
            server.wait()
            for t in threads:
                t.join()
        kept = set(read_capture(capture)["id"]) if capture.exists() else set()
        counts.append((len(answered), len(set(answered) - kept)))
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per server per block")
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--servers", nargs="+", choices=list(SHADOWS), default=["shadow", "no journal", "batch 0"],
                        help="the shadow servers measured beside `mlflow models serve`")  # fmt: skip
    args = parser.parse_args()
    from sklearn.datasets import load_digits

    folder = Path(tempfile.mkdtemp(prefix="shadow-latency-"))
    uri = register(folder)
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    names = ("alone", *args.servers)
    ports = {name: free_port() for name in names}
    logs = {name: open(folder / f"{name}.log", "w") for name in names}  # noqa: SIM115 - closed below
    captures = {name: folder / f"capture-{name.replace(' ', '-')}" for name in names[1:]}
    alone = ["mlflow", "models", "serve", "-m", "models:/digits-shadow/1", "--env-manager", "local", "-p"]
    servers = {"alone": subprocess.Popen([*alone, str(ports["alone"])], env=env, stdout=subprocess.DEVNULL,
                                         stderr=logs["alone"])}  # fmt: skip
    for name in names[1:]:
        servers[name] = start_shadow(uri, captures[name], ports[name], logs[name], *SHADOWS[name])
    x = load_digits().data / 16.0
    columns = [str(i) for i in range(64)]
    bodies = [json.dumps({"dataframe_split": {"columns": columns, "data": [row.tolist()]}}).encode() for row in x[:500]]
    times = {name: [] for name in names}
    rates = {name: [] for name in names}
    cpu = {name: [] for name in names}  # each block's CPU ms per request of the server's process tree
    per_block = {name: [] for name in names}  # each block's p50 and p99: paired with the champion alone's
    sent = dict.fromkeys(names, 0)
    try:
        for name in names:
            wait_up(ports[name], servers[name])
            block(ports[name], bodies, 200)  # warm
            sent[name] += 200
        for b in range(args.blocks):
            order = names[b % len(names) :] + names[: b % len(names)]
            for name in order if b % 2 == 0 else order[::-1]:
                used = tree_cpu_s(servers[name].pid)
                latencies, rate = block(ports[name], bodies, args.requests)
                cpu[name].append((tree_cpu_s(servers[name].pid) - used) / len(latencies) * 1000)
                times[name] += latencies
                rates[name].append(rate)
                per_block[name].append(np.percentile(latencies, [50, 99]))
                sent[name] += len(latencies)
    finally:
        for server in servers.values():
            server.send_signal(signal.SIGTERM)
        for server in servers.values():
            server.wait(timeout=300)
        for log in logs.values():
            log.close()
    import pandas as pd

    p = {name: np.percentile(np.array(v) * 1000, [50, 99]) for name, v in times.items()}
    rate = {name: float(np.median(v)) for name, v in rates.items()}
    print(f"{args.blocks} blocks of {args.requests} requests per server, 4 clients, one row each "
          f"(`nproc` = {os.cpu_count()}):")  # fmt: skip
    print("| server | p50 ms | p99 ms | requests/s | p50 | p99 | requests/s |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        print(f"| {name} | {p[name][0]:.2f} | {p[name][1]:.2f} | {rate[name]:.0f} | {p[name][0] / p['alone'][0]:.2f}x "
              f"| {p[name][1] / p['alone'][1]:.2f}x | {rate[name] / rate['alone']:.2f}x |")  # fmt: skip
    print("Paired by block (the median over blocks of each block's ratio to the champion alone's block in the same "
          "round: slow drifts of the machine's load cancel):")  # fmt: skip
    for name in names[1:]:
        paired = np.median(
            [
                [*(mine / alone), r / r_alone]
                for mine, alone, r, r_alone in zip(
                    per_block[name], per_block["alone"], rates[name], rates["alone"], strict=True
                )
            ],
            axis=0,
        )
        print(f"  {name}: p50 {paired[0]:.2f}x, p99 {paired[1]:.2f}x, requests/s {paired[2]:.2f}x")  # fmt: skip
    used = {name: float(np.median(v)) for name, v in cpu.items()}
    if used["alone"] > 0:  # a machine without /proc measures none
        each = ", ".join(f"{name} {used[name]:.2f} ms ({used[name] / used['alone']:.2f}x)" for name in names)
        print(f"CPU per request of each server's process tree (the median of its blocks; /proc): {each}")
    for name, capture in captures.items():
        frame = pd.read_parquet(capture) if capture.exists() else pd.DataFrame({"candidate": []})
        print(f"{name}: capture after SIGTERM {len(frame)} rows of {sent[name]} requests answered, "
              f"{int(frame['candidate'].notna().sum())} scored by the candidate")  # fmt: skip
    if args.kills:
        counts = killed_under_load(uri, folder, bodies, args.kills)
        lost = [n for _, n in counts]
        print(
            f"SIGKILL under 4 clients, {args.kills} times after ~200 answered requests: lost "
            f"{', '.join(f'{n} of {a}' for a, n in counts)} (most {max(lost)}, median {np.median(lost):.0f})"
        )


if __name__ == "__main__":
    main()
