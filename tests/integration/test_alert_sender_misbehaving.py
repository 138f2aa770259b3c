"""The kept-connection sender against raw-socket receivers that misbehave in ways
``http.server`` cannot: an interim 1xx answer, a receiver that closes a kept
connection while the deadline is nearly spent and whose new connections then hang."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from adapters.alerts.endpoints import Target, resolve_target
from adapters.alerts.sender import Kept, Outcome, post

pytestmark = pytest.mark.integration

Script = Callable[[int, socket.socket, "_Raw"], bool]  # request number, socket: keep going?


def _read_request(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head


class _Raw:
    """A loopback listener; each connection's requests answered by ``script``."""

    def __init__(self, script: Script, backlog: int = 8) -> None:
        self.script = script
        self.heads: list[bytes] = []
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=backlog)
        self.port = self.listener.getsockname()[1]
        self.accept = threading.Event()
        self.accept.set()
        self.fillers: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()
        self.target: Target = resolve_target(
            f"http://127.0.0.1:{self.port}/hooks", allow_private=True
        )

    def _serve(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self.listener], [], [], 0.05)
                if not ready or not self.accept.is_set():
                    continue
                conn, _ = self.listener.accept()
            except (OSError, ValueError):
                return
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while True:
                head = _read_request(conn)
                if not head:
                    return
                self.heads.append(head)
                if not self.script(len(self.heads), conn, self):
                    return

    def fill_backlog(self) -> None:
        """Stop accepting and fill the accept queue: a new connection's SYN is then
        dropped (its connect hangs, as to a host that went away)."""
        self.accept.clear()
        time.sleep(0.1)
        for _ in range(8):
            s = socket.socket()
            s.settimeout(0.1)
            self.fillers.append(s)
            try:
                s.connect(("127.0.0.1", self.port))
            except TimeoutError:
                return  # the queue is full

    @property
    def event_ids(self) -> list[str]:
        return [
            line.split(b":", 1)[1].strip().decode()
            for head in self.heads
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"billing-ledger-event-id:")
        ]

    def close(self) -> None:
        self.listener.close()
        for s in self.fillers:
            s.close()


@pytest.fixture
def kept() -> Iterator[Kept]:
    connections = Kept()
    yield connections
    connections.close()


def _post(to: _Raw, event: str, kept: Kept, timeout_s: float = 3.0) -> Outcome:
    return post(to.target, b'{"id": "e"}', "whsec_test", event, timeout_s, kept)


NO_CONTENT = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"


def test_an_interim_answer_does_not_become_the_next_requests_answer(kept: Kept) -> None:
    """103 Early Hints (or 102 Processing) is not the answer: the next request on a
    kept connection must not read the first request's final answer as its own."""

    def script(n: int, sock: socket.socket, _: _Raw) -> bool:
        if n == 1:  # early hints, then the real answer: delivered
            sock.sendall(b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n")
            time.sleep(0.2)  # the final answer comes when the work is done
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        else:  # the receiver is failing now: not delivered
            sock.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
        return True

    raw = _Raw(script)
    try:
        _post(raw, "e1", kept)
        second = _post(raw, "e2", kept)
        # The receiver answered 503 to e2: recording it delivered would lose it.
        assert not second.delivered, second
        assert second.status == 503, second
    finally:
        raw.close()


def test_the_retry_on_a_new_connection_stays_within_the_deadline(kept: Kept) -> None:
    """The receiver takes the second request on a kept connection, holds it most of the
    deadline, then drops the connection; its host then stops taking connections. The
    whole post is still bounded by timeout_s."""

    def script(n: int, sock: socket.socket, raw: _Raw) -> bool:
        if n == 1:
            sock.sendall(NO_CONTENT)
            return True
        time.sleep(1.0)
        raw.fill_backlog()
        return False  # closes the kept connection without an answer

    raw = _Raw(script, backlog=0)
    try:
        assert _post(raw, "e1", kept, timeout_s=2.0).delivered
        started = time.monotonic()
        outcome = _post(raw, "e2", kept, timeout_s=2.0)
        took = time.monotonic() - started
        print(outcome, took, raw.event_ids)
        assert not outcome.delivered
        assert took < 2.0 + 0.3, f"a 2 s request took {took:.2f} s ({outcome})"
    finally:
        raw.close()


def test_a_connection_the_receiver_closed_while_idle_is_not_sent_on(kept: Kept) -> None:
    """A receiver that closed the kept connection while idle (its keep-alive timeout,
    shorter than KEEP_IDLE_S, as Node.js's 5 s) and said so with a 408: that 408 is not
    the next request's answer."""

    def script(n: int, sock: socket.socket, _: _Raw) -> bool:
        sock.sendall(NO_CONTENT)
        if n == 1:
            time.sleep(0.2)  # idle timeout: says so, then closes, lingering (as nginx does)
            sock.sendall(
                b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
            )
            sock.shutdown(socket.SHUT_WR)
            time.sleep(1.0)  # lingering close: reads and drops what comes meanwhile
            return False
        return True

    raw = _Raw(script)
    try:
        assert _post(raw, "e1", kept).delivered
        time.sleep(0.5)
        second = _post(raw, "e2", kept)
        assert second.delivered, second
    finally:
        raw.close()


def test_a_late_answer_on_a_kept_connection_is_a_timeout_and_never_read_again(
    kept: Kept,
) -> None:
    """The second request on a kept connection trickles its answer past the deadline:
    timed out at the deadline, the connection dropped, and the third request does not
    read what came late."""

    def script(n: int, sock: socket.socket, _: _Raw) -> bool:
        if n == 2:
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
                sock.sendall(bytes([byte]))
                time.sleep(0.05)
            return True
        if n == 3:
            sock.sendall(b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n")
            return True
        sock.sendall(NO_CONTENT)
        return True

    raw = _Raw(script)
    try:
        assert _post(raw, "e1", kept, timeout_s=1.0).delivered
        started = time.monotonic()
        late = _post(raw, "e2", kept, timeout_s=1.0)
        assert time.monotonic() - started < 1.3
        assert late == Outcome(False, None, "timed out after 1 s")
        third = _post(raw, "e3", kept, timeout_s=1.0)
        assert not third.delivered and third.status in (None, 500), third
    finally:
        raw.close()
