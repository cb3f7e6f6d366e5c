"""A tiny forward HTTP proxy on 127.0.0.1 for tests: it sends every request to one upstream server
on 127.0.0.1, keeping the Host header the client sent (so a client can call ``http://mlflow:5000``
as in docker/compose.yaml), and can drop chosen responses after the upstream has acted on them."""

from __future__ import annotations

import http.client
import json
import os
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "content-length"}


class ForwardProxy:
    """``drop(method, path)`` True: forward the request, then close the connection unanswered
    (the upstream did the work; the client never hears of it). ``fail(method, path)`` a status
    code: answer it at once without forwarding (a 503 from a gateway; the upstream never saw it), a
    (status, JSON body) pair (an answer the server could give), or 0: close the connection without
    forwarding or answering (a reset)."""

    def __init__(
        self,
        upstream_port: int,
        drop: Callable[[str, str], bool] | None = None,
        fail: Callable[[str, str], int | tuple[int, dict] | None] | None = None,
    ) -> None:
        self.upstream_port = upstream_port
        self.drop = drop
        self.fail = fail
        self.dropped: list[str] = []
        self.failed: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def forward(self) -> None:
                target = urlsplit(self.path)
                path = (target.path or "/") + (f"?{target.query}" if target.query else "")
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                answer = proxy.fail(self.command, path) if proxy.fail is not None else None
                if answer is not None:
                    proxy.failed.append(f"{self.command} {path}")
                    status, payload = answer if isinstance(answer, tuple) else (answer, None)
                    if status == 0:  # a reset: the connection closes, nothing forwarded or answered
                        self.close_connection = True
                        return
                    data = json.dumps(payload).encode() if payload is not None else b""
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=120)
                upstream.request(self.command, path, body=body, headers=headers)
                response = upstream.getresponse()
                data = response.read()
                upstream.close()
                if proxy.drop is not None and proxy.drop(self.command, path):
                    proxy.dropped.append(f"{self.command} {path}")
                    self.close_connection = True
                    return
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in _HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def env(self, retries: str | None = None) -> dict[str, str]:
        """The environment of a process whose HTTP requests go through this proxy (MLflow's retries
        set to ``retries`` where given)."""
        env = {**os.environ, "HTTP_PROXY": self.url, "http_proxy": self.url, "NO_PROXY": "", "no_proxy": ""}
        if retries is not None:
            env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = retries
        return env

    def start(self) -> ForwardProxy:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
