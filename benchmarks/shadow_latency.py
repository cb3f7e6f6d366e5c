"""The latency `shadow serve` adds to the champion's answer, against `mlflow models serve` of the champion alone.

Both servers run at once on this machine (one uvicorn worker each, as `mlflow models serve` starts by default),
serving the same registered champion: a scikit-learn MLP on digits (v1); the shadow server scores v2 (another
MLP) off the request path and writes the capture. Requests (one row, JSON ``dataframe_split``) go to the two
servers in turn, one at a time, so both see the same machine load; then each server is driven by 4 client
threads for ``--seconds`` (alternating blocks) for requests per second. Prints p50 and p99 of each and their
ratios (shadow / alone), and the rows the capture holds after the stop (all of them is the promise).

    python benchmarks/shadow_latency.py [--requests 2000] [--seconds 10]
"""

from __future__ import annotations

import argparse
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


def request(port: int, body: bytes) -> float:
    started = time.perf_counter()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as response:
        response.read()
    return time.perf_counter() - started


def throughput(port: int, bodies: list[bytes], seconds: float, clients: int = 4) -> float:
    done = []
    stop = time.monotonic() + seconds

    def client(offset: int) -> None:
        n = 0
        while time.monotonic() < stop:
            request(port, bodies[(offset + n) % len(bodies)])
            n += 1
        done.append(n)

    threads = [threading.Thread(target=client, args=(i * 97,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    from sklearn.datasets import load_digits

    folder = Path(tempfile.mkdtemp(prefix="shadow-latency-"))
    uri = register(folder)
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    alone_port, shadow_port = free_port(), free_port()
    logs = {name: open(folder / f"{name}.log", "w") for name in ("alone", "shadow")}  # noqa: SIM115 - closed below
    alone = subprocess.Popen(
        ["mlflow", "models", "serve", "-m", "models:/digits-shadow/1", "--env-manager", "local", "-p", str(alone_port)],
        env=env, stdout=subprocess.DEVNULL, stderr=logs["alone"],
    )  # fmt: skip
    capture = folder / "capture"
    shadow = subprocess.Popen(
        [sys.executable, "-m", "consistency_gate", "shadow", "serve", "--model", "digits-shadow", "--candidate", "2",
         "--capture", str(capture), "--port", str(shadow_port), "--tracking-uri", uri],
        env=env, stdout=subprocess.DEVNULL, stderr=logs["shadow"],
    )  # fmt: skip
    try:
        wait_up(alone_port, alone)
        wait_up(shadow_port, shadow)
        x = load_digits().data / 16.0
        columns = [str(i) for i in range(64)]
        bodies = [
            json.dumps({"dataframe_split": {"columns": columns, "data": [row.tolist()]}}).encode() for row in x[:500]
        ]
        for body in bodies[:50]:  # warm both
            request(alone_port, body), request(shadow_port, body)
        times = {"alone": [], "shadow": []}
        for i in range(args.requests):
            body = bodies[i % len(bodies)]
            pair = (("alone", alone_port), ("shadow", shadow_port))
            for name, port in pair if i % 2 == 0 else pair[::-1]:
                times[name].append(request(port, body))
        rates = {"alone": [], "shadow": []}
        for block in range(4):
            for name, port in (("alone", alone_port), ("shadow", shadow_port))[:: 1 if block % 2 == 0 else -1]:
                rates[name].append(throughput(port, bodies, args.seconds / 2))
    finally:
        for process in (alone, shadow):
            process.send_signal(signal.SIGTERM)
        shadow.wait(timeout=180)
        alone.wait(timeout=60)
        for log in logs.values():
            log.close()
    import pandas as pd

    rows = len(pd.read_parquet(capture)) if capture.exists() else 0
    sent = 50 + args.requests  # warm-up and latency requests; the throughput blocks' below
    p = {name: np.percentile(np.array(v) * 1000, [50, 99]) for name, v in times.items()}
    print(f"{args.requests} requests to each server in turn, one row each (2 cores: `nproc` = {os.cpu_count()}):")
    print("| server | p50 ms | p99 ms | requests/s, 4 clients |")
    print("|---|---|---|---|")
    for name in ("alone", "shadow"):
        print(f"| {name} | {p[name][0]:.2f} | {p[name][1]:.2f} | {np.median(rates[name]):.0f} |")
    print(
        f"ratio shadow / alone: p50 {p['shadow'][0] / p['alone'][0]:.2f}x, p99 {p['shadow'][1] / p['alone'][1]:.2f}x, "
        f"requests/s {np.median(rates['shadow']) / np.median(rates['alone']):.2f}x"
    )
    served = sent + int(sum(rates["shadow"]) * args.seconds / 2)
    print(f"capture after SIGTERM: {rows} rows (requests answered by the shadow server: about {served})")
    said = (folder / "shadow.log").read_text().strip().splitlines()
    print(said[-1] if said else "")


if __name__ == "__main__":
    main()
