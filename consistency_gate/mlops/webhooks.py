"""MLflow's webhooks, received (MLflow 3.3+; what ``mlflow server`` sends on registry events): the events the
listener wakes on (:data:`WAKES`, from which the webhook's event list is made); each delivery checked (its
HMAC-SHA256 signature over ``{delivery_id}.{timestamp}.{body}``, a timestamp within :data:`MAX_AGE_S`, a delivery
id not seen before) before its event is taken; an HTTP listener that answers at once and hands the event on; and
the webhook registered on the tracking server.

    deliveries = Deliveries("s3cret")
    event = deliveries.accept(headers, body)  # Rejected (401, 400 or 409) for a delivery that is not one
    event.kind, event.model, event.version
    # ('model_version.created', 'fraud-clf', '7')
"""

from __future__ import annotations

import base64
import errno
import hashlib
import hmac
import json
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from consistency_gate.errors import ModelError, TrackingError, UsageError, error_line
from consistency_gate.mlops.store import looks_unreachable

if TYPE_CHECKING:
    from mlflow import MlflowClient

SIGNATURE, DELIVERY, TIMESTAMP = "X-MLflow-Signature", "X-MLflow-Delivery-Id", "X-MLflow-Timestamp"
MAX_AGE_S = 300.0  # a delivery signed longer ago (or later) than this is stale: replayed, or a clock that is off
# each event the listener asks MLflow to send -> the part of a model's desired state it may have changed, which the
# listener reconciles at once (gate/watch.py); the webhook's event list is this table's keys
WAKES = {
    "model_version.created": "versions",  # a version to gate once
    "model_version_alias.created": "alias",  # an alias moved (also sent when it is pointed elsewhere): guard it
}
EVENTS = tuple(WAKES)
MAX_BODY = 1_000_000  # a webhook's payload is a few hundred bytes
BACKLOG = 128  # connections waiting to be accepted: MLflow delivers from 10 threads, each retrying 3 times
HANDLERS = 16  # deliveries answered at once (each is a few milliseconds: the work is queued)
CLIENT_TIMEOUT_S = 10.0  # a client that sends nothing for this long is hung up on


@dataclass(frozen=True)
class Event:
    """One registry event, as a delivery carried it: ``kind`` (``entity.action``), the model, its version, the
    alias (alias events), the delivery id and when it was signed (seconds since the epoch)."""

    kind: str
    model: str
    version: str
    alias: str | None
    delivery_id: str
    signed_at: float

    def to_dict(self) -> dict:
        """As the listener's status and a revert's report say it."""
        return {"kind": self.kind, "model": self.model, "version": self.version, "alias": self.alias,
                "delivery_id": self.delivery_id, "signed_at": self.signed_at}  # fmt: skip


class Rejected(Exception):
    """A delivery that is not taken: its HTTP status (401 bad signature, 400 stale or malformed, 409 replayed)."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


def signature(secret: str, delivery_id: str, timestamp: str, body: str) -> str:
    """MLflow's signature of a delivery: ``v1,`` and the base64 HMAC-SHA256 of ``{delivery_id}.{timestamp}.{body}``.

    >>> signature("s3cret", "d1", "1700000000", '{"a": 1}')
    'v1,SL09e/IZgMeXvzZRPOdF+ztEGcfCg48OkhwoQmVq2JE='
    """
    digest = hmac.new(secret.encode(), f"{delivery_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


class Deliveries:
    """Checks deliveries against the shared ``secret``, and remembers the ids it took for twice :data:`MAX_AGE_S`
    (an older one is stale anyway), so that a replayed or retried delivery changes nothing."""

    def __init__(self, secret: str, max_age_s: float = MAX_AGE_S, clock: Callable[[], float] = time.time) -> None:
        if not secret:
            raise UsageError("the webhook secret is empty: set it in the environment variable the watch config names")
        self.secret, self.max_age_s, self.clock = secret, max_age_s, clock
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self.rejected: deque[dict] = deque(maxlen=20)  # the last deliveries refused, and why (for /health)

    def accept(self, headers: Mapping[str, str], body: bytes) -> Event:
        """The delivery's event; Rejected unless it is signed with the secret, fresh and new."""
        delivery, stamp, signed = (headers.get(h) or "" for h in (DELIVERY, TIMESTAMP, SIGNATURE))
        if not delivery or not stamp or not signed:
            raise Rejected(401, f"not a signed MLflow webhook (headers {DELIVERY}, {TIMESTAMP} and {SIGNATURE})")
        text = body.decode("utf-8", errors="replace")
        if not hmac.compare_digest(signed.encode(), signature(self.secret, delivery, stamp, text).encode()):
            raise Rejected(401, f"delivery {delivery}: the signature is not the secret's")
        try:
            signed_at = float(stamp)
        except ValueError:
            raise Rejected(400, f"delivery {delivery}: the timestamp {stamp!r} is not a number") from None
        now = self.clock()
        if abs(now - signed_at) > self.max_age_s:
            raise Rejected(400, f"delivery {delivery}: signed {now - signed_at:.0f} s from now: stale")
        with self._lock:
            self._seen = {d: t for d, t in self._seen.items() if now - t <= 2 * self.max_age_s}
            if delivery in self._seen:
                raise Rejected(409, f"delivery {delivery}: seen before (a replay or a retry): nothing done again")
            self._seen[delivery] = now
        return _event(text, delivery, signed_at)


def _event(text: str, delivery: str, signed_at: float) -> Event:
    """The event a delivery's JSON payload names; Rejected (400) when it names none."""
    try:
        payload = json.loads(text)
        data = payload["data"]
        kind = f"{payload['entity']}.{payload['action']}"
        return Event(kind, str(data["name"]), str(data.get("version", "")), data.get("alias"), delivery, signed_at)
    except (ValueError, KeyError, TypeError) as exc:
        raise Rejected(
            400, f"delivery {delivery}: not an MLflow registry event ({type(exc).__name__}: {exc})"
        ) from None


class Server(ThreadingHTTPServer):
    """The listener's HTTP server: a listen backlog that takes a burst of MLflow's deliveries, a bounded pool of
    handler threads, and clients that hang up or stall ended quietly (they are the clients' faults, not ours)."""

    request_queue_size = BACKLOG
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self.pool = ThreadPoolExecutor(HANDLERS, thread_name_prefix="consistency-gate-http")
        super().__init__(address, handler)  # binds; on failure it closes the server (and the pool) itself

    def process_request(self, request: object, client_address: object) -> None:
        """Handle a connection on the pool (the stdlib starts a thread for each)."""
        self.pool.submit(self.process_request_thread, request, client_address)

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hung up or stalled is its own business; anything else, one line on stderr."""
        error = sys.exc_info()[1]
        if not isinstance(error, ConnectionError | TimeoutError):
            print(f"listener: a request from {client_address[0]} failed: {error_line(error)}", file=sys.stderr)

    def server_close(self) -> None:
        """Stop listening, and let the deliveries being answered finish."""
        super().server_close()
        self.pool.shutdown(wait=True)


def listener(
    host: str,
    port: int,
    deliveries: Deliveries | None,
    on_event: Callable[[Event], str],
    status: Callable[[], dict],
    on_refused: Callable[[str], None] = lambda line: None,
) -> Server:
    """An HTTP server bound to ``host:port`` (not yet serving) that takes webhook deliveries by POST on any path,
    answers at once (200 with what ``on_event`` said, or the rejection's status, said by ``on_refused`` in one
    line) and answers ``GET /health`` with ``status()``. ``deliveries`` None: a listener that polls the registry
    and takes no delivery. A host or port it cannot listen on is a UsageError (exit 2) before anything else."""

    class Handler(BaseHTTPRequestHandler):
        timeout = CLIENT_TIMEOUT_S

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            if deliveries is None:
                return self._answer(405, {"error": "this listener polls the registry (--poll): it takes no webhook"})
            raw = self.headers.get("Content-Length") or "0"
            if not raw.strip().isdigit():
                self.close_connection = True  # what follows the headers is not a body of known length
                return self._refuse(400, f"Content-Length {raw[:40]!r} is not a number of bytes")
            length = int(raw)
            if length > MAX_BODY:
                self.close_connection = True
                return self._refuse(413, f"a delivery of {length} bytes is not a webhook's")
            try:
                event = deliveries.accept(self.headers, self.rfile.read(length))
            except Rejected as exc:
                return self._refuse(exc.status, str(exc))
            return self._answer(200, {"event": event.kind, "delivery_id": event.delivery_id, "done": on_event(event)})

        def do_GET(self) -> None:  # noqa: N802
            if self.path.rstrip("/") != "/health":
                return self._answer(404, {"error": "GET /health, or POST a webhook delivery"})
            said = status()
            return self._answer(200 if said.get("healthy", True) else 503, said)

        def _refuse(self, code: int, why: str) -> None:
            if deliveries is not None:
                deliveries.rejected.append({"at": time.time(), "status": code, "why": why})
            on_refused(f"refused a delivery from {self.client_address[0]}: {code} {why}")
            self._answer(code, {"error": why})

        def _answer(self, code: int, body: dict) -> None:
            data = json.dumps(body, default=str).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
            """Quiet: the listener says what it does with each event itself."""

    try:
        return Server((host, port), Handler)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host}: not an address this machine can listen on ({exc.strerror}); give one of "
                         "its addresses, e.g. 127.0.0.1, or 0.0.0.0 for all") from None  # fmt: skip
    except OSError as exc:
        why = {
            errno.EADDRINUSE: f"port {port} is in use on {host} (another listener, or another program): give another "
            "--port, or stop what holds it",
            errno.EADDRNOTAVAIL: f"--host {host} is not an address of this machine: give one of its addresses, e.g. "
            "127.0.0.1, or 0.0.0.0 for all",
            errno.EACCES: f"port {port} needs privileges this process does not have: give a port above 1023",
        }.get(exc.errno, f"cannot listen on {host}:{port} ({exc.strerror})")
        raise UsageError(why) from None


def register(client: MlflowClient, name: str, url: str, secret: str) -> str:
    """Register (or update) the webhook ``name`` that sends :data:`EVENTS` to ``url``, signed with ``secret``, on
    the tracking server; returns its id. The server must allow the address (``MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS``,
    ``MLFLOW_WEBHOOK_ALLOWED_SCHEMES`` for http) and keep secrets (``MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY``)."""
    try:
        for hook in client.list_webhooks():
            if hook.name == name:
                client.update_webhook(hook.webhook_id, url=url, events=list(EVENTS), secret=secret, status="ACTIVE")
                return hook.webhook_id
        return client.create_webhook(name=name, url=url, events=list(EVENTS), secret=secret).webhook_id
    except Exception as exc:  # noqa: BLE001 - MLflow's REST errors: the server's settings, or the server gone
        if looks_unreachable(exc):
            raise TrackingError(f"cannot register the webhook: the tracking server does not answer ({error_line(exc)})"
                                ) from None  # fmt: skip
        raise ModelError(
            f"the tracking server refused the webhook to {url} ({error_line(exc)}); for an http or private address it "
            "must run with MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS=true and MLFLOW_WEBHOOK_ALLOWED_SCHEMES=http,https, and "
            "keep secrets with one MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY for all its workers (docs/watch.md)"
        ) from None


def webhooks_unsent(uri: str) -> str | None:
    """Why the registry at ``uri`` sends no webhooks (None: it can: an ``mlflow server`` over http or https).

    >>> webhooks_unsent("http://mlflow:5000") is None
    True
    >>> webhooks_unsent("sqlite:///mlflow.db")[:50]
    'sqlite:///mlflow.db is a store written directly, a'
    """
    scheme = uri.split(":", 1)[0].lower()
    if scheme in ("http", "https"):
        return None
    if scheme.startswith("databricks"):
        return f"{uri}: Databricks sends no MLflow webhooks for Models in Unity Catalog"
    return f"{uri} is a store written directly, and MLflow sends webhooks from a tracking server (mlflow server) only"
