"""The gate worker's own process (``python -m consistency_gate.cli.worker FD``, started by
:class:`~consistency_gate.gate.worker.GateWorker`): it imports what a gate needs once, says so on the pipe ``FD``,
then runs each request read from stdin (``{"argv": [...], "env": {...}}``) as the command line runs it, and
answers its exit code on the pipe, until stdin closes (its listener ended)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
import threading
import time

KEEP_LOADED = 4  # model versions kept loaded between gates: the champion is the next gate's baseline too
# What a gate imports, paid once by the worker (each skipped where it is not installed). Not great-expectations:
# a gate loads it only when an expectation of its data fails (io.validation), and warming it cost each worker 2 s
# of CPU and 86 MB (4.0-4.9 s and 557 MB without it, 6.0-7.6 s and 643 MB with it, on 2 cores).
WARM = (
    "consistency_gate.gate.run", "consistency_gate.cli.app", "consistency_gate.io.validation", "mlflow.pyfunc",
    "mlflow.sklearn", "sklearn.linear_model", "matplotlib.pyplot", "torch", "mlflow.pytorch",
)  # fmt: skip


def _die_with_parent() -> None:
    """End this process when its listener ends, even during a gate: on Linux the kernel kills it when the thread
    that started it ends (``PR_SET_PDEATHSIG``); everywhere, a thread sees the parent change (an orphan is given
    to another) and ends it. A gate never outlives the listener that started it."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch_parent, name="consistency-gate-parent", daemon=True).start()


def _warm() -> None:
    """Import what a gate needs, and compile the metric kernels, once."""
    import importlib

    for module in WARM:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    from consistency_gate.core import kernels

    kernels.precompile()


def _gate(argv: list[str], env: dict[str, str]) -> dict:
    """One gate in this process, as the command line runs it: its exit code and the last line of its stderr; the
    environment as it was after it."""
    from consistency_gate.cli.app import main

    before, out, err = dict(os.environ), io.StringIO(), io.StringIO()
    os.environ.update(env)
    started = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        os.environ.clear()
        os.environ.update(before)
    lines = err.getvalue().strip().splitlines()
    return {"code": code, "said": lines[-1] if lines else "", "seconds": round(time.perf_counter() - started, 3)}


def serve(replies_fd: int) -> None:
    """The worker's side: warm up, say so, then run each request read from stdin until it closes."""
    from consistency_gate.mlops.scoring import keep_loaded

    _die_with_parent()
    replies = os.fdopen(replies_fd, "w", encoding="utf-8")
    _warm()
    keep_loaded(KEEP_LOADED)
    replies.write("ready\n")
    replies.flush()
    for line in sys.stdin:
        request = json.loads(line)
        replies.write(json.dumps(_gate(request["argv"], request["env"])) + "\n")
        replies.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
