"""MLflow's webhooks, received (MLflow 3.3+; what ``mlflow server`` sends on registry events): each delivery is
checked (its HMAC-SHA256 signature over ``{delivery_id}.{timestamp}.{body}``, a timestamp within
:data:`MAX_AGE_S`, a delivery id not seen before) before its event is taken; an HTTP listener that answers at
once and hands the event on; and the webhook registered on the tracking server.

    deliveries = Deliveries("s3cret")
    event = deliveries.accept(headers, body)  # Rejected (401, 400 or 409) for a delivery that is not one
    event.kind, event.model, event.version
    # ('model_version.created', 'fraud-clf', '7')
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from consistency_gate.errors import ModelError, TrackingError, UsageError, error_line
from consistency_gate.mlops.store import looks_unreachable

if TYPE_CHECKING:
    from mlflow import MlflowClient

SIGNATURE, DELIVERY, TIMESTAMP = "X-MLflow-Signature", "X-MLflow-Delivery-Id", "X-MLflow-Timestamp"
MAX_AGE_S = 300.0  # a delivery signed longer ago (or later) than this is stale: replayed, or a clock that is off
EVENTS = ("model_version.created", "model_version_alias.created")  # what the listener asks MLflow to send
MAX_BODY = 1_000_000  # a webhook's payload is a few hundred bytes


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


def listener(
    host: str, port: int, deliveries: Deliveries, on_event: Callable[[Event], str], status: Callable[[], dict]
) -> ThreadingHTTPServer:
    """An HTTP server (not yet serving) that takes webhook deliveries by POST on any path, answers at once (200
    with what ``on_event`` said, or the rejection's status) and answers ``GET /health`` with ``status()``."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                return self._answer(413, {"error": f"a delivery of {length} bytes is not a webhook's"})
            try:
                event = deliveries.accept(self.headers, self.rfile.read(length))
            except Rejected as exc:
                deliveries.rejected.append({"at": time.time(), "status": exc.status, "why": str(exc)})
                return self._answer(exc.status, {"error": str(exc)})
            return self._answer(200, {"event": event.kind, "delivery_id": event.delivery_id, "done": on_event(event)})

        def do_GET(self) -> None:  # noqa: N802
            if self.path.rstrip("/") != "/health":
                return self._answer(404, {"error": "GET /health, or POST a webhook delivery"})
            said = status()
            return self._answer(200 if said.get("healthy", True) else 503, said)

        def _answer(self, code: int, body: dict) -> None:
            data = json.dumps(body, default=str).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
            """Quiet: the listener says what it does with each event itself."""

    return ThreadingHTTPServer((host, port), Handler)


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
