"""An ASGI app served by uvicorn in a thread of its own, with the deadlines and limits
an endpoint open to the network needs.

uvicorn (with h11) is the server, Starlette the framework: both well kept and small.
What uvicorn does not bound by itself, this module adds:

* **a header deadline**: a connection that has not sent a whole request head within
  ``header_timeout_s`` of connecting (or of its previous response) is closed, so idle
  or trickling sockets do not pile up (uvicorn's keep-alive timer is reset by every
  byte, so a client sending one byte a second would otherwise stay for ever);
* **a body deadline and size limit** (``read_body``): the whole body within
  ``body_timeout_s`` (408 otherwise) and at most ``max_body_bytes`` (413, refused from
  ``Content-Length`` before reading when it says so);
* bounded concurrency: uvicorn answers 503 past ``limit_concurrency`` connections or
  requests, and the head is at most 16 KiB (h11's limit).

``HttpServer.start()`` binds the socket first (port 0 picks a free one, read back from
``port``), then serves from a daemon thread; ``stop()`` asks uvicorn to finish the
requests in flight and waits. No ``Server`` header is sent.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.requests import Request
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["BodyRefused", "HttpLimits", "HttpServer", "read_body"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HttpLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    max_body_bytes: int = 1 << 20
    limit_concurrency: int = 64
    keep_alive_s: int = 5


class BodyRefused(Exception):
    """The body was too large (413) or too slow (408)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


async def read_body(request: Request, limits: HttpLimits) -> bytes:
    """The request's whole body, within the limits (else ``BodyRefused``)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise BodyRefused(413, f"body of {declared} bytes is over {limits.max_body_bytes}")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limits.max_body_bytes:
                    raise BodyRefused(413, f"body is over {limits.max_body_bytes} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise BodyRefused(408, f"body not received within {limits.body_timeout_s} s") from None
    return b"".join(chunks)


class _DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request head."""

    header_timeout_s = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        self._cycle_at_arm = self.cycle
        self._deadline = self.loop.call_later(self.header_timeout_s, self._expire)

    def _expire(self) -> None:
        if self.cycle is self._cycle_at_arm and not self.transport.is_closing():
            self.transport.close()  # no whole request head in time

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._deadline.cancel()
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadline.cancel()
        super().connection_lost(exc)


class HttpServer:
    """Serves ``app`` on ``host:port`` from a thread (see the module docstring)."""

    def __init__(self, app: Any, host: str, port: int, limits: HttpLimits, *, name: str) -> None:
        self.app = app
        self.host = host
        self.requested_port = port
        self.limits = limits
        self.name = name
        self.port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.on_stop: Callable[[], object] = lambda: None  # e.g. close the app's pool

    def start(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say so,
        # and without it every response waited ~40 ms (Nagle against a delayed ACK).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.requested_port))
        sock.listen(512)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        protocol = type(
            "DeadlineProtocol",
            (_DeadlineProtocol,),
            {"header_timeout_s": self.limits.header_timeout_s},
        )
        config = uvicorn.Config(
            self.app,
            http=protocol,
            lifespan="off",
            log_level="warning",
            access_log=False,
            server_header=False,
            limit_concurrency=self.limits.limit_concurrency,
            timeout_keep_alive=self.limits.keep_alive_s,
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        server = self._server
        self._thread = threading.Thread(
            target=lambda: server.run(sockets=[sock]), name=self.name, daemon=True
        )
        self._thread.start()
        log.info("%s listening on %s:%d", self.name, self.host, self.port)

    def wait_started(self, timeout_s: float = 10.0) -> bool:
        """Whether the server is accepting connections within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._server is not None and self._server.started:
                return True
            if not self.alive:
                return False
            time.sleep(0.01)
        return False

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.on_stop()
