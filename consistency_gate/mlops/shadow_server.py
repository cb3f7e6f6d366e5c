"""``consistency-gate shadow serve``: the champion answers on MLflow's scoring protocol; the candidate is scored
off the request path; both answers go to a capture.

The HTTP side is MLflow's own scoring server (``mlflow.pyfunc.scoring_server.init``, what ``mlflow models
serve`` runs), given the champion: the same routes (``/invocations``, ``/ping``, ``/health``, ``/version``),
the same payloads (``dataframe_split``, ``dataframe_records``, ``instances``, ``inputs``, CSV, Parquet) and
the same responses. Each request gets an id (the client's ``X-Request-Id`` header, else a new one, returned
in the response's header); a request of n rows is n samples, ``ID#0`` .. ``ID#n-1`` (one row: ``ID``).

After the champion has answered, the request is queued (never waited on: a full queue records the candidate as not
scored) for the candidate, which runs in a process of its own (:class:`CandidateProcess`) and scores what queued in
``batch_s`` (0.1 s) in one call: its CPU per request is that of a batch, not of a call (on one-row requests to a
scikit-learn MLP, 140 us a call of one row against 8 us a row in a call of 256), and nothing on the request path
wakes it. A candidate that raises, hangs past ``timeout_s`` or kills its process is recorded as failed on that
request (the process is started again), and the champion's answers never change or wait. On SIGTERM or SIGINT the
server stops taking requests, finishes those in flight, scores what is queued (for up to ``drain_s``; what is left
is recorded as not scored) and writes the last part: every request answered is in the capture
(:class:`~consistency_gate.io.capture_writer.CaptureWriter`).
"""

from __future__ import annotations

import contextvars
import json
import multiprocessing
import os
import queue
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from consistency_gate.errors import ModelError, UsageError, error_line, redact_credentials
from consistency_gate.io.capture_writer import GROUP_S, UNSCORED, CaptureWriter

REQUEST = contextvars.ContextVar("consistency_gate_request", default=None)  # (id, time) of the request served
QUEUE_LIMIT = 10_000  # requests waiting for the candidate; past it a request is captured as not scored
BATCH_LIMIT = 256  # requests scored in one call at most
BATCH_S = 0.1  # the requests answered within this many seconds of the first are scored together


def answers(raw: Any, classes: tuple[str, ...] | None) -> list[str]:  # noqa: ANN401 - any pyfunc output
    """A model's answers as text, one per row: its labels as they are, or, for a score per class, the class of
    the highest score (named by ``classes``, else by the output's columns, else by position).

    >>> answers(np.array([1, 0]), None), answers(np.array([[0.2, 0.8]]), ("cat", "dog"))
    (['1', '0'], ['dog'])
    >>> answers(pd.DataFrame({"cat": [0.9], "dog": [0.1]}), None)
    ['cat']
    """
    if isinstance(raw, dict) and "predictions" in raw:
        raw = raw["predictions"]
    if isinstance(raw, pd.DataFrame) and raw.shape[1] > 1:
        classes = classes or tuple(map(str, raw.columns))
    values = np.asarray(raw)
    if values.ndim == 2 and values.shape[1] > 1:
        names = classes or tuple(str(i) for i in range(values.shape[1]))
        return [str(names[i]) for i in values.argmax(axis=1)]
    return [str(v) for v in values.reshape(len(values), -1)[:, 0]] if values.ndim else [str(values)]


def _candidate_loop(
    model_uri: str,
    tracking_uri: str,
    classes: tuple[str, ...] | None,
    nice: int,
    idle: bool,
    inbox: Any,  # noqa: ANN401 - multiprocessing queues
    outbox: Any,  # noqa: ANN401
) -> None:
    """The candidate's process: lower its priority by ``nice`` (and with ``idle``, into the idle scheduling class:
    only the CPU nothing else wants), load the model, say ready (or why not), then answer each batch; it ends with
    the server (a server killed with ``kill -9`` leaves no candidate behind)."""
    if nice and hasattr(os, "nice"):
        os.nice(nice)  # the champion's process goes first when the cores are busy
    if idle:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    try:
        import mlflow

        mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_registry_uri(tracking_uri)
        model = mlflow.pyfunc.load_model(model_uri)
    except Exception as exc:  # noqa: BLE001 - any load failure is the candidate's: said in one line
        outbox.put(("error", error_line(exc, 300)))
        return
    outbox.put(("ready", None))
    threading.Thread(target=_end_with, args=(multiprocessing.parent_process(),), daemon=True).start()
    while (item := inbox.get()) is not None:
        number, data = item
        try:
            outbox.put((number, answers(model.predict(data), classes)))
        except Exception as exc:  # noqa: BLE001 - the candidate failed on this request: recorded, not fatal
            outbox.put((number, error_line(exc, 200)))


def _end_with(server: multiprocessing.process.BaseProcess | None) -> None:
    """End this process once ``server`` has ended, even in the middle of a prediction that never returns."""
    if server is not None:
        server.join()
        os._exit(0)


class CandidateProcess:
    """The candidate in a process of its own, restarted after it dies or hangs.

    Example::

        candidate = CandidateProcess("models:/fraud-clf/4", "sqlite:///mlflow.db", None, timeout_s=10)
        candidate.start()  # ModelError (exit 4) if it cannot load
        candidate.score(frame)  # (['0', '1'], None) or (None, 'TimeoutError: ...')
    """

    def __init__(
        self,
        model_uri: str,
        tracking_uri: str,
        classes: tuple[str, ...] | None,
        timeout_s: float,
        nice: int = 0,
        idle: bool = False,
    ) -> None:
        self.args = (model_uri, tracking_uri, classes, nice, idle)
        self.timeout_s = timeout_s
        self.context = multiprocessing.get_context("spawn")
        self.process = None
        self.number = 0

    def start(self, load_s: float = 300.0) -> None:
        """Start the process and wait until the candidate is loaded (ModelError if it cannot be)."""
        self.inbox, self.outbox = self.context.Queue(), self.context.Queue()
        self.process = self.context.Process(
            target=_candidate_loop, args=(*self.args, self.inbox, self.outbox), daemon=True
        )
        self.process.start()
        deadline = time.monotonic() + load_s
        kind, said = "error", f"not loaded within {load_s:.0f} s"
        while time.monotonic() < deadline:
            try:
                kind, said = self.outbox.get(timeout=0.5)
                break
            except queue.Empty:
                if not self.process.is_alive():  # ended before it could say why (an import failed, a crash)
                    kind, said = "error", f"its process ended while loading (exit {self.process.exitcode})"
                    break
        if kind != "ready":
            self.stop()
            raise ModelError(
                f"candidate {self.args[0]} cannot be loaded: {redact_credentials(said)}; serve a candidate that loads"
            )

    def score(self, data: Any) -> tuple[list[str] | None, str | None]:  # noqa: ANN401 - a request's input
        """The candidate's answers to one request's rows, or why there are none (its error, a timeout, its process
        ended, a restart that failed); a hung or dead process is ended at once and started again for the next
        request, so a registry that fails one restart does not stop the candidate for the server's life."""
        if self.process is None or not self.process.is_alive():
            try:
                self.start()
            except ModelError as exc:
                return None, f"not scored: {exc}"
        self.number += 1
        self.inbox.put((self.number, data))
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                number, said = self.outbox.get(timeout=max(0.01, min(0.5, deadline - time.monotonic())))
            except queue.Empty:
                if not self.process.is_alive():
                    return None, "the candidate's process ended while scoring (crashed); started again for the next"
                if time.monotonic() >= deadline:
                    self.stop()
                    return None, f"TimeoutError: no answer within {self.timeout_s:g} s; started again for the next"
                continue
            if number == self.number:  # an answer to an earlier request that timed out is dropped
                return (said, None) if isinstance(said, list) else (None, said)

    def stop(self) -> None:
        """End the process."""
        if self.process is not None and self.process.is_alive():
            self.inbox.put(None)
            self.process.join(timeout=2)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()


@dataclass
class Shadow:
    """What the served requests feed: a queue the candidate's thread empties into the capture.

    ``submit`` is the request path's one call: it never waits.
    """

    candidate: CandidateProcess
    writer: CaptureWriter
    classes: tuple[str, ...] | None
    batch_s: float = BATCH_S

    def __post_init__(self) -> None:
        self.pending: queue.Queue = queue.Queue(maxsize=QUEUE_LIMIT)
        self.failures = 0
        self.hurry = threading.Event()  # the stop: score what is queued without waiting for more
        self.stopping = threading.Event()  # past the drain: what is left is not scored, for its reason
        self.left = 0  # requests left unscored by the stop
        self.stop_reason = ""
        self.worker = threading.Thread(target=self._work, name="candidate", daemon=True)
        self.worker.start()

    def submit(self, request_id: str, at: float, data: Any, raw: Any) -> None:  # noqa: ANN401
        """Queue a served request (its id, arrival in seconds since 1970, input and the champion's raw output) for
        the candidate, noted for the journal's next group first: a crash after that group keeps the champion's
        answer."""
        rows = self._rows(request_id, at, raw)
        number = self.writer.answered(rows)
        try:
            self.pending.put_nowait((number, rows, data))
        except queue.Full:
            self._capture(number, rows, None, f"not scored: {QUEUE_LIMIT} requests waited for the candidate")

    @property
    def requests(self) -> int:
        """Requests served so far."""
        return self.writer.requests

    def _work(self) -> None:
        while (batch := self._batch()) is not None:
            for (number, rows, _), (said, error) in zip(batch, self._score(batch), strict=True):
                self._capture(number, rows, said, error)
                self.pending.task_done()
        self.pending.task_done()

    def _batch(self) -> list[tuple] | None:
        """The requests waiting for the candidate, up to :data:`BATCH_LIMIT`, taken ``batch_s`` after the first of
        them (at least one: waits for it, and for no other request: a request never wakes this thread until the
        batch is due); None once the server has stopped."""
        if (first := self.pending.get()) is None:
            return None
        if self.pending.qsize() < BATCH_LIMIT - 1:
            self.hurry.wait(self.batch_s)
        batch = [first]
        while len(batch) < BATCH_LIMIT:
            try:
                item = self.pending.get_nowait()
            except queue.Empty:
                break
            if item is None:  # the stop: after this batch
                self.pending.task_done()
                self.pending.put(None)
                break
            batch.append(item)
        return batch

    def _score(self, batch: list[tuple]) -> list[tuple[list[str] | None, str | None]]:
        """The candidate's answers to each request of ``batch``: in one call where the requests are tables of the
        same columns (what queued while the candidate was busy: one prediction instead of many), else, and where
        that call fails, one request at a time, so that a failure is the request's that causes it."""
        frames = [data for _, _, data in batch]
        if len(batch) > 1 and all(isinstance(f, pd.DataFrame) and f.columns.equals(frames[0].columns) for f in frames):
            said, _ = self._score_one(pd.concat(frames, ignore_index=True))
            if said is not None and len(said) == sum(map(len, frames)):
                ends = np.cumsum([len(f) for f in frames])
                return [(said[end - len(f) : end], None) for f, end in zip(frames, ends, strict=True)]
        return [self._score_one(data) if not self.stopping.is_set() else self._left() for data in frames]

    def _left(self) -> tuple[None, str]:
        """A request left unscored by a stop."""
        self.left += 1
        return None, self.stop_reason

    def _score_one(self, data: Any) -> tuple[list[str] | None, str | None]:  # noqa: ANN401 - a request's input
        try:
            return self.candidate.score(data)
        except Exception as exc:  # noqa: BLE001 - whatever went wrong is this request's, never the thread's end
            return None, f"not scored: {error_line(exc, 300)}"

    def _rows(self, request_id: str, at: float, raw: Any) -> list[dict]:  # noqa: ANN401
        """A request's capture rows as the champion answered it: one per row, ``ID`` or ``ID#i``."""
        served = answers(raw, self.classes)
        when = pd.Timestamp(at, unit="s", tz="UTC")
        ids = [request_id] if len(served) == 1 else [f"{request_id}#{i}" for i in range(len(served))]
        return [{"id": i, "time": when, "champion": c, "candidate": None, "candidate_error": UNSCORED}
                for i, c in zip(ids, served, strict=True)]  # fmt: skip

    def _capture(self, number: int, rows: list[dict], said: list[str] | None, error: str | None) -> None:
        if said is not None and len(said) != len(rows):
            said, error = None, f"the candidate gave {len(said)} answers to {len(rows)} rows"
        self.failures += error is not None
        answered = [{**row, "candidate": None if said is None else said[n], "candidate_error": error}
                    for n, row in enumerate(rows)]  # fmt: skip
        self.writer.add(answered, number)

    def drain(self, drain_s: float) -> int:
        """Score what is queued for up to ``drain_s`` seconds, capture what is left as not scored, and write the
        last part; returns the requests left unscored."""
        deadline = time.monotonic() + drain_s
        self.hurry.set()
        while self.pending.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.05)
        self.stop_reason = f"not scored: the server stopped ({drain_s:g} s to drain)"
        self.stopping.set()
        while True:
            try:
                number, rows, _ = self.pending.get_nowait()
            except queue.Empty:
                break
            self._capture(number, rows, *self._left())
            self.pending.task_done()
        self.pending.put(None)  # the worker ends after the request it is scoring, if any
        self.worker.join(timeout=self.candidate.timeout_s + 5)
        self.writer.close()
        return self.left


class _Served:
    """The champion as MLflow's scoring server sees it: its own predict, then the request handed to the shadow."""

    def __init__(self, model: Any, shadow: Shadow) -> None:  # noqa: ANN401 - a PyFuncModel
        self._model, self._shadow = model, shadow

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401 - metadata and the rest, as the model has them
        return getattr(self._model, name)

    def predict(self, data: Any, params: dict | None = None) -> Any:  # noqa: ANN401
        raw = self._model.predict(data, params=params) if params else self._model.predict(data)
        request_id, at = REQUEST.get() or (uuid.uuid4().hex, time.time())
        self._shadow.submit(request_id, at, data, raw)
        return raw


class RequestIds:
    """ASGI middleware (plain, not Starlette's slower BaseHTTPMiddleware): each request's id (the client's
    ``X-Request-Id``, else a new one) and arrival time for the capture, and the id in the response's headers.
    ``/ping`` and ``/health`` answer 503 with ``failing()``'s reason while it has one (a capture that cannot be
    written), so a load balancer or an orchestrator sees it."""

    def __init__(self, app: Any, failing: Callable[[], str | None] = lambda: None) -> None:  # noqa: ANN401 - ASGI
        self.app, self.failing = app, failing

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:  # noqa: ANN401
        """Serve one ASGI connection scope."""
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        why = self.failing() if scope["path"] in ("/ping", "/health") else None
        if why:
            body = json.dumps({"status": "failing", "reason": why}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            return await send({"type": "http.response.body", "body": body})
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        rid = given or uuid.uuid4().hex
        REQUEST.set((rid, time.time()))

        async def with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode("latin-1"))]
            await send(message)

        return await self.app(scope, receive, with_id)


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (UsageError, exit 2, when the port is in use or not ours to take)."""
    # IPPROTO_TCP named: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on sockets that say they are
    # TCP, and with it on, a kept-alive connection waits ~40 ms for the client's delayed ACK on each response
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}): the port is in use or not allowed; "
            "give another with --port"
        ) from None
    sock.listen(2048)  # connections wait in the backlog while the models load, never refused
    return sock


@dataclass(frozen=True)
class ServeOptions:
    """Where and how the shadow server runs."""

    host: str = "127.0.0.1"
    port: int = 5001
    roll_rows: int = 10_000
    roll_seconds: float = 60.0
    timeout_s: float = 10.0  # the candidate's time per request
    drain_s: float = 60.0  # what a stop waits for the queued requests
    journal: bool = True  # group commit of the answered requests: a crash loses at most the last group
    candidate_nice: int = 10  # the candidate's process runs at this lower priority: the champion's goes first
    candidate_idle: bool = False  # Linux: the candidate only gets the CPU nothing else wants (SCHED_IDLE)
    batch_s: float = BATCH_S  # the candidate scores the requests answered in this time in one call
    journal_s: float = GROUP_S  # the journal's group commit: the requests answered in this time in one write


def serve(
    champion_uri: str, candidate_uri: str, tracking_uri: str, capture: str | Path,
    classes: tuple[str, ...] | None, options: ServeOptions, said: Any = print,  # noqa: ANN401
) -> dict:  # fmt: skip
    """Serve the champion with the candidate in shadow until SIGTERM or SIGINT; returns what was captured.

    Example::

        serve("models:/fraud-clf/3", "models:/fraud-clf/4", "sqlite:///mlflow.db", "capture/", None, ServeOptions())
        # {'requests': 1200, 'rows': 1200, 'candidate_failures': 0, 'not_scored': 0, 'parts': 1}
    """
    import mlflow
    import uvicorn
    from mlflow.pyfunc import scoring_server

    sock = listening_socket(options.host, options.port)
    stops = []
    previous = {sig: signal.signal(sig, lambda s, f: stops.append(s)) for sig in (signal.SIGTERM, signal.SIGINT)}
    candidate = CandidateProcess(
        candidate_uri, tracking_uri, classes, options.timeout_s, options.candidate_nice, options.candidate_idle
    )
    try:
        said(f"loading the champion {champion_uri} ...")
        try:
            model = mlflow.pyfunc.load_model(champion_uri)
        except Exception as exc:  # noqa: BLE001 - MLflow raises many kinds for a model it cannot load
            raise ModelError(f"champion {champion_uri} cannot be loaded: {error_line(exc, 300)}") from None
        said(f"loading the candidate {candidate_uri} in a process of its own ...")
        candidate.start()
        writer = CaptureWriter(capture, options.roll_rows, options.roll_seconds, options.journal_s, options.journal)
        if writer.recovered:
            said(f"recovered {writer.recovered} rows a stopped server had journaled in {capture}")
        shadow = Shadow(candidate, writer, classes, options.batch_s)
        app = scoring_server.init(_Served(model, shadow))

        server = uvicorn.Server(
            uvicorn.Config(RequestIds(app, lambda: writer.failure), log_level="warning", timeout_graceful_shutdown=30)
        )
        said(f"serving {champion_uri} on http://{options.host}:{options.port}/invocations, {candidate_uri} in shadow; "
             f"capturing to {capture}")  # fmt: skip
        if not stops:
            server.run(sockets=[sock])
        left = shadow.drain(options.drain_s)
    finally:
        candidate.stop()
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    summary = {"requests": shadow.requests, "rows": writer.written, "candidate_failures": shadow.failures,
               "not_scored": left, "parts": writer.next_part, "fallback": str(writer.fallback or "")}  # fmt: skip
    said(f"stopped: {summary['requests']} requests, {summary['rows']} rows captured in {capture} "
         f"({summary['candidate_failures']} the candidate did not answer)")  # fmt: skip
    if writer.fallback is not None:
        said(f"warning: {writer.failure}; those rows are in {writer.fallback}: move it into {capture}")
    return summary
