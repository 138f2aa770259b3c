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

**Kept connections.** With a ``Kept``, a thread's connection stays open after a final
answer (not a 1xx) the receiver did not mark ``Connection: close`` (and whose body was
read whole), and that thread's next request to the same checked address reuses it,
unless it has something to read by then (the receiver closed it, or sent what no
request asked for, as a 408 before closing): that would be read as the next answer. A
receiver may close an idle connection at any time: a reused connection that fails
before any answer is read (reset, broken pipe, closed without a status line) is
replaced and the request sent once more within the same deadline (the new connect
too; nothing is sent once it has passed). The receiver may then get the request twice,
as with any retry: it deduplicates by the event id.
"""

from __future__ import annotations

import contextlib
import http.client
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass

from adapters.alerts.endpoints import Target
from billing_ledger_webhooks import EVENT_ID_HEADER, SIGNATURE_HEADER, signature_header

__all__ = ["Kept", "Outcome", "post"]

MAX_ANSWER_BYTES = 4096
USER_AGENT = "billing-ledger-webhooks/1"


@dataclass(frozen=True)
class Outcome:
    """What one attempt came to."""

    delivered: bool
    status: int | None
    error: str  # "" when delivered


class Kept:
    """Each thread's open connection to the address it last posted to, kept while the
    receiver keeps it open (HTTP/1.1 keep-alive) and reused for that thread's next
    request to the same checked address: a lane's attempts skip a connect (and a TLS
    handshake) each. A connection is never shared between threads, idle connections are
    not reused after ``KEEP_IDLE_S``, and an address checked again to something else is
    a new connection. ``close`` closes every one kept."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[tuple[object, ...], float, http.client.HTTPConnection]] = {}
        self._guard = threading.Lock()

    def take(self, target: Target) -> http.client.HTTPConnection | None:
        with self._guard:
            kept = self._kept.pop(threading.get_ident(), None)
        if kept is None:
            return None
        key, since, conn = kept
        fresh = time.monotonic() - since < KEEP_IDLE_S
        if key == _key(target) and fresh and not _readable(conn):
            return conn
        conn.close()
        return None

    def keep(self, target: Target, conn: http.client.HTTPConnection) -> None:
        with self._guard:
            old = self._kept.pop(threading.get_ident(), None)
            self._kept[threading.get_ident()] = (_key(target), time.monotonic(), conn)
        if old is not None:
            old[2].close()

    def close(self) -> None:
        with self._guard:
            kept, self._kept = list(self._kept.values()), {}
        for _, _, conn in kept:
            conn.close()


KEEP_IDLE_S = 15.0  # under the idle timeouts of common servers (nginx 75 s, Node.js 5 s+)
# What a kept connection the receiver closed meanwhile answers (nothing was read yet):
# the request is sent once more on a new connection.
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


def _key(target: Target) -> tuple[object, ...]:
    return (target.scheme, target.host, target.address, target.port)


def _readable(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle kept connection has something to read: the receiver closed it
    (end of file, a reset) or sent what no request asked for (a 408 before closing, the
    rest of an answer). Either way it is not reused: what it holds would be read as
    the next request's answer."""
    sock = conn.sock
    if sock is None:
        return True
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def post(  # noqa: PLR0917
    target: Target,
    body: bytes,
    secret: str,
    event_id: str,
    timeout_s: float,
    kept: Kept | None = None,
) -> Outcome:
    """Send ``body`` to ``target`` (see the module docstring), on the connection
    ``kept`` holds for this thread and address if there is one."""
    deadline = time.monotonic() + timeout_s
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        SIGNATURE_HEADER: signature_header(body, secret, int(time.time())),
        EVENT_ID_HEADER: event_id,
    }
    reused = kept.take(target) if kept is not None else None
    try:
        return _exchange(reused, target, body, headers, deadline, timeout_s, kept)
    except _Stale:  # the receiver had closed the kept connection: once more, on a new one
        if time.monotonic() >= deadline:
            return Outcome(False, None, f"timed out after {timeout_s:g} s")
        return _exchange(None, target, body, headers, deadline, timeout_s, kept)


class _Stale(Exception):
    """Raised when a reused connection turns out closed before any answer was read."""


def _exchange(  # noqa: PLR0917
    reused: http.client.HTTPConnection | None,
    target: Target,
    body: bytes,
    headers: dict[str, str],
    deadline: float,
    timeout_s: float,
    kept: Kept | None,
) -> Outcome:
    # A new connection's connect gets what is left of the deadline (the watchdog cannot
    # cut a connect short: there is no socket to shut until it returns).
    conn = reused or _connection(target, max(deadline - time.monotonic(), 0.001))
    # A receiver trickling its answer a byte at a time would reset each read's timeout:
    # the watchdog shuts the socket at the deadline, whatever is being read then.
    fired = threading.Event()
    watchdog = threading.Timer(deadline - time.monotonic(), _shut, (conn, fired))
    watchdog.daemon = True
    watchdog.start()
    keep = answered = False
    try:
        if conn.sock is None:
            conn.connect()
        _limit(conn, deadline)  # nothing is sent once the deadline has passed
        conn.request("POST", target.path, body=body, headers=headers)
        _limit(conn, deadline)
        answer = conn.getresponse()
        answered = True
        _limit(conn, deadline)
        text = answer.read(MAX_ANSWER_BYTES)
        # An interim answer (1xx other than 100) is not the answer: the final one is
        # still to come on this connection, and must not be read as the next request's.
        keep = (
            kept is not None
            and answer.status >= 200
            and not answer.will_close
            and answer.isclosed()
        )
    except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
        stale = reused is not None and not answered and isinstance(exc, _STALE)
        if stale and not fired.is_set() and time.monotonic() < deadline:
            raise _Stale from exc
        if isinstance(exc, TimeoutError) or time.monotonic() >= deadline:
            return Outcome(False, None, f"timed out after {timeout_s:g} s")
        return Outcome(False, None, f"{type(exc).__name__}: {exc}"[:500])
    finally:
        watchdog.cancel()
        watchdog.join()
        if keep and not fired.is_set() and kept is not None:
            kept.keep(target, conn)
        else:
            conn.close()
    if fired.is_set() or time.monotonic() >= deadline:  # the watchdog cut an answer short
        return Outcome(False, None, f"timed out after {timeout_s:g} s")
    status = answer.status
    if 200 <= status < 300:
        return Outcome(True, status, "")
    if 300 <= status < 400:
        where = answer.getheader("Location", "")[:200]
        return Outcome(False, status, f"redirect to {where!r} not followed")
    return Outcome(False, status, f"HTTP {status}: {text[:200].decode(errors='replace')}")


def _shut(conn: http.client.HTTPConnection, fired: threading.Event) -> None:
    fired.set()
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
