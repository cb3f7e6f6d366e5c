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
import time

WARM = (  # what a gate imports, paid once by the worker (each skipped where it is not installed)
    "consistency_gate.gate.run", "consistency_gate.cli.app", "consistency_gate.io.validation", "mlflow.pyfunc",
    "mlflow.sklearn", "sklearn.linear_model", "matplotlib.pyplot", "great_expectations", "torch", "mlflow.pytorch",
)  # fmt: skip


def _die_with_parent() -> None:
    """On Linux, ask the kernel to kill this process when the thread that started it ends (the listener killed by
    ``kill -9``): a gate never outlives its listener."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


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
    _die_with_parent()
    replies = os.fdopen(replies_fd, "w", encoding="utf-8")
    _warm()
    replies.write("ready\n")
    replies.flush()
    for line in sys.stdin:
        request = json.loads(line)
        replies.write(json.dumps(_gate(request["argv"], request["env"])) + "\n")
        replies.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
