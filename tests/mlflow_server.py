"""A real `mlflow server` process on 127.0.0.1 (free port, SQLite backend) for tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """Start, kill and restart a tracking server that keeps its store in ``root``."""

    def __init__(
        self, root: Path, port: int | None = None, extra_args: tuple[str, ...] = (), env: dict | None = None,
        gunicorn: bool = False,
    ) -> None:  # fmt: skip
        """``gunicorn``: the REST API served by gunicorn (``--gunicorn-opts``), which answers a request in ~6 ms
        where MLflow's default (FastAPI with the Flask API mounted) takes ~50 ms on 2 busy cores: for the tests
        of what the gate does against a server, not of the server's own front (allowed hosts, webhooks)."""
        self.root, self.port, self.env = root, port or free_port(), env or {}
        self.extra_args = [*extra_args, *(["--gunicorn-opts", "--workers 2"] if gunicorn else [])]
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = f"sqlite:///{root / 'server.db'}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 900) -> MlflowServer:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--backend-store-uri",
                self.db,
                "--artifacts-destination",
                str(self.root / "artifacts"),
                "--workers",
                "2",
                *self.extra_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # without MLflow 3's job runner (seven huey consumer processes, each importing MLflow: about 10
            # CPU-seconds a start on two cores), which runs GenAI jobs and trace roll-ups, nothing the gate uses
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **self.env},
            start_new_session=True,
        )
        # up when it accepts a connection (its own signal, however long a busy machine takes to import MLflow),
        # failed when its process ends; the bound only ends a test whose server hangs
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server ended while starting (exit {self.proc.returncode})")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.5)
        self.kill()
        raise RuntimeError(f"mlflow server did not start within {timeout} s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
