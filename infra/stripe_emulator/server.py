"""The HTTP side: a standard-library ``ThreadingHTTPServer`` and its request handler.

This module owns the sockets: it reads a request (method, path, query, headers, body),
sends API paths to the API pipeline and ``/_emulator/`` paths to the control API, and writes
the reply, or closes the connection unanswered when the pipeline says so (a refused
connection or a dropped response).  One request per connection: no stale keep-alive sockets.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final, Protocol, cast
from urllib.parse import urlsplit

from .api import Reply
from .forms import dumps

__all__ = ["CONTROL_PREFIX", "ApiHandler", "ControlHandler", "HttpServer"]

CONTROL_PREFIX: Final = "/_emulator"


class ApiHandler(Protocol):
    def __call__(
        self,
        method: str,
        path: str,
        query: str,
        body: bytes,
        *,
        authorization: str | None,
        idempotency_key: str | None,
        stripe_version: str | None,
    ) -> Reply | None: ...


ControlHandler = Callable[[str, str, str, bytes], Reply]


class HttpServer(ThreadingHTTPServer):
    """Serves the API and the control API; handler threads are daemons."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        api: ApiHandler,
        control: ControlHandler,
        log_requests: Callable[[], bool],
    ) -> None:
        self.api = api
        self.control = control
        self.log_requests = log_requests
        super().__init__(address, _RequestHandler)


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "stripe-emulator/1.0"

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def log_message(self, format: str, *args: Any) -> None:
        if cast(HttpServer, self.server).log_requests():
            sys.stderr.write(f"stripe-emulator {self.address_string()} {format % args}\n")

    def _dispatch(self) -> None:
        self.close_connection = True
        server = cast(HttpServer, self.server)
        try:
            length = int(self.headers.get("Content-Length") or "0")
        except ValueError:
            length = -1
        if length < 0:
            self._write(Reply(400, dumps({"error": {"message": "bad Content-Length"}})))
            return
        body = self.rfile.read(length) if length else b""
        split = urlsplit(self.path)
        if split.path == CONTROL_PREFIX or split.path.startswith(CONTROL_PREFIX + "/"):
            reply: Reply | None = server.control(self.command, split.path, split.query, body)
        else:
            reply = server.api(
                self.command,
                split.path,
                split.query,
                body,
                authorization=self.headers.get("Authorization"),
                idempotency_key=self.headers.get("Idempotency-Key"),
                stripe_version=self.headers.get("Stripe-Version"),
            )
        if reply is None:
            return  # close the connection without a response
        self._write(reply)

    def _write(self, reply: Reply) -> None:
        try:
            self.send_response(reply.status)
            for name, value in reply.headers:
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply.body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(reply.body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up; nothing to tell it
