"""The listener's gate worker: a process of its own that has paid the imports once (MLflow, scikit-learn, PyTorch,
matplotlib, the metric kernels: 4-5 s of CPU on 2 cores) and runs the gates the listener hands it, one at a
time, each as ``consistency-gate check`` runs (the same run, report, tags and exit code), in seconds instead of a
fresh process's start.

The worker is the crash boundary: a gate that kills it (a model's native code, the memory running out) ends the
worker, not the listener, which says so, starts a new worker and gates the version again; a gate that decided
before it died is a record already (its report, its promotion unknown) and is not gated again. The worker ends
with its listener, even mid-gate (on Linux the kernel kills it with its parent; elsewhere it sees its parent gone
within half a second), so a gate never outlives the listener that started it, and a restarted listener's
reconcile finds the killed gate's run and gates the version once more.

    worker = GateWorker()
    code, said = worker.run(["check", "--model", "fraud-clf", "--candidate", "7", ...], {"X": "y"})

The worker's own side, what runs in its process, is :mod:`consistency_gate.cli.worker`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path


class WorkerEnded(Exception):
    """The worker ended while it ran a gate (a crash, a kill): what its log said last."""


class GateWorker:
    """The listener's side of the worker: started on first use, restarted after it ends; :meth:`run` one gate at a
    time (callers on several threads wait their turn)."""

    def __init__(self, log_dir: str | Path | None = None) -> None:
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="consistency-gate-worker-"))
        self.proc: subprocess.Popen | None = None
        self.replies: io.TextIOWrapper | None = None
        self.lock = threading.Lock()
        self.started = 0  # workers started (1 + restarts)
        self.ready = False  # a worker has imported what a gate needs and waits for one

    @property
    def log(self) -> Path:
        """The worker's own output (what a gate printed beyond its report: library warnings, a crash's last words)."""
        return self.log_dir / "worker.log"

    def start(self) -> None:
        """Start a worker and wait until it has imported what a gate needs (its own signal: a line on its pipe)."""
        read, write = os.pipe()
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "consistency_gate.cli.worker", str(write)],
                stdin=subprocess.PIPE, stdout=log, stderr=log, pass_fds=(write,), text=True,
                start_new_session=True,  # a Ctrl-C at the listener's terminal is the listener's to handle
            )  # fmt: skip
        os.close(write)
        self.replies = os.fdopen(read, "r", encoding="utf-8")
        self.started += 1
        if not self.replies.readline():
            raise WorkerEnded(f"the gate worker ended while starting (exit {self.proc.wait()}): {self.last_words()}")
        self.ready = True

    def run(self, argv: list[str], env: dict[str, str]) -> tuple[int, str]:
        """Run ``consistency-gate ARGV`` in the worker with ``env`` set; its exit code and the last line it wrote
        to stderr. WorkerEnded when the worker ended during it (it is started again at the next call)."""
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.start()
            try:
                self.proc.stdin.write(json.dumps({"argv": argv, "env": env}) + "\n")
                self.proc.stdin.flush()
                reply = self.replies.readline()
            except (BrokenPipeError, OSError):
                reply = ""
            if not reply:
                code = self.proc.wait()
                self.proc, self.ready = None, False
                how = f"signal {-code}" if code < 0 else f"exit {code}"
                raise WorkerEnded(f"the gate worker ended ({how}) during the gate: {self.last_words()}")
            said = json.loads(reply)
            return said["code"], said["said"]

    def last_words(self) -> str:
        """The worker log's last line (why it ended, when it says)."""
        lines = self.log.read_text(errors="replace").strip().splitlines() if self.log.exists() else []
        return lines[-1][:300] if lines else "it wrote nothing"

    def stop(self) -> None:
        """End the worker: its requests' pipe closes and it exits (a gate it runs is killed)."""
        proc = self.proc
        if proc is None:
            return
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self.proc = None
