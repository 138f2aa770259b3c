"""One webhook request: a signed POST to a checked address, bounded in time, no redirects.

``post`` connects to the address ``adapters.alerts.endpoints`` checked (never to what a
second lookup of the name answers), sends the body with its signature header
(``billing_ledger_webhooks``), and reads the status within one deadline for the whole
exchange (``timeout_s``, 10 s by default: connecting, sending and the answer together; a
receiver that answers after it has timed out, whatever it answers later). A redirect is
not followed: a 3xx is a failure, recorded with where it pointed. The answer's body is
read only up to 4 KiB (for the error recorded).

The outcome is an ``Outcome``: delivered (2xx), or failed with the HTTP status (if any)
and a one-line error; ``post`` never raises for anything the receiver or the network
does.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
from dataclasses import dataclass

from adapters.alerts.endpoints import Target
from billing_ledger_webhooks import EVENT_ID_HEADER, SIGNATURE_HEADER, signature_header

__all__ = ["Outcome", "post"]

MAX_ANSWER_BYTES = 4096
USER_AGENT = "billing-ledger-webhooks/1"


@dataclass(frozen=True)
class Outcome:
    """What one attempt came to."""

    delivered: bool
    status: int | None
    error: str  # "" when delivered


def post(target: Target, body: bytes, secret: str, event_id: str, timeout_s: float) -> Outcome:
    """Send ``body`` to ``target`` (see the module docstring)."""
    deadline = time.monotonic() + timeout_s
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        SIGNATURE_HEADER: signature_header(body, secret, int(time.time())),
        EVENT_ID_HEADER: event_id,
    }
    conn = _connection(target, timeout_s)
    # A receiver trickling its answer a byte at a time would reset each read's timeout:
    # the watchdog shuts the socket at the deadline, whatever is being read then.
    watchdog = threading.Timer(timeout_s, _shut, (conn,))
    watchdog.daemon = True
    watchdog.start()
    try:
        conn.request("POST", target.path, body=body, headers=headers)
        _limit(conn, deadline)
        answer = conn.getresponse()
        _limit(conn, deadline)
        text = answer.read(MAX_ANSWER_BYTES)
    except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
        if isinstance(exc, TimeoutError) or time.monotonic() >= deadline:
            return Outcome(False, None, f"timed out after {timeout_s:g} s")
        return Outcome(False, None, f"{type(exc).__name__}: {exc}"[:500])
    finally:
        watchdog.cancel()
        conn.close()
    if time.monotonic() >= deadline:  # the watchdog cut an answer short
        return Outcome(False, None, f"timed out after {timeout_s:g} s")
    status = answer.status
    if 200 <= status < 300:
        return Outcome(True, status, "")
    if 300 <= status < 400:
        where = answer.getheader("Location", "")[:200]
        return Outcome(False, status, f"redirect to {where!r} not followed")
    return Outcome(False, status, f"HTTP {status}: {text[:200].decode(errors='replace')}")


def _shut(conn: http.client.HTTPConnection) -> None:
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _limit(conn: http.client.HTTPConnection, deadline: float) -> None:
    """What is left of the deadline becomes the socket's timeout (TimeoutError if none)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    if conn.sock is not None:
        conn.sock.settimeout(left)


def _connection(target: Target, timeout_s: float) -> http.client.HTTPConnection:
    if target.scheme == "https":
        return _PinnedHTTPS(target, timeout_s)
    return _PinnedHTTP(target, timeout_s)


class _PinnedHTTP(http.client.HTTPConnection):
    """Connects to the checked address; the Host header names the URL's host."""

    def __init__(self, target: Target, timeout_s: float) -> None:
        super().__init__(target.host, target.port, timeout=timeout_s)
        self.address = target.address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """TLS to the checked address, the certificate verified for the URL's host."""

    def __init__(self, target: Target, timeout_s: float) -> None:
        super().__init__(
            target.host, target.port, timeout=timeout_s, context=ssl.create_default_context()
        )
        self.address = target.address

    def connect(self) -> None:
        raw = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(raw, server_hostname=self.host)  # type: ignore[attr-defined]
