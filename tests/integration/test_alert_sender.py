"""The alert webhook sender over real loopback HTTP (no database, no broker): a lane
thread's connection is kept while the receiver keeps it open, replaced when the receiver
closed it (the request then sent once, on the new one), and never kept past an answer
that closes it, an idle time, or a change of the checked address."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from adapters.alerts import sender
from adapters.alerts.endpoints import Target, resolve_target
from adapters.alerts.sender import Kept, post
from billing_ledger_webhooks import EVENT_ID_HEADER

pytestmark = pytest.mark.integration


class _Receiver:
    """HTTP/1.1 on 127.0.0.1; notes each request's event id and the client's port (one
    port a connection). ``mode``: keep (keep-alive), drop (answers, then closes the
    connection without saying so, as an idle timeout does), close (answers with
    ``Connection: close``)."""

    def __init__(self, mode: str) -> None:
        self.requests: list[tuple[str, int]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append((self.headers[EVENT_ID_HEADER], self.client_address[1]))
                self.send_response(204)
                if mode == "close":
                    self.send_header("Connection", "close")
                self.send_header("Content-Length", "0")
                self.end_headers()
                if mode == "drop":
                    self.close_connection = True

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.target: Target = resolve_target(
            f"http://127.0.0.1:{self.server.server_address[1]}/hooks", allow_private=True
        )

    @property
    def event_ids(self) -> list[str]:
        return [event for event, _ in self.requests]

    @property
    def connections(self) -> int:
        return len({port for _, port in self.requests})


@pytest.fixture
def kept() -> Iterator[Kept]:
    connections = Kept()
    yield connections
    connections.close()


@pytest.fixture
def receiver() -> Iterator[Any]:
    made: list[_Receiver] = []

    def make(mode: str) -> _Receiver:
        made.append(_Receiver(mode))
        return made[-1]

    yield make
    for r in made:
        r.server.shutdown()
        r.server.server_close()


def _post(to: _Receiver, event: str, kept: Kept | None) -> sender.Outcome:
    return post(to.target, b'{"id": "e"}', "whsec_test", event, 5.0, kept)


def test_a_lane_reuses_its_connection_while_the_receiver_keeps_it_open(
    receiver: Any, kept: Kept
) -> None:
    keeping = receiver("keep")
    outcomes = [_post(keeping, f"e{i}", kept) for i in range(5)]
    assert all(o.delivered for o in outcomes)
    assert keeping.event_ids == ["e0", "e1", "e2", "e3", "e4"]
    assert keeping.connections == 1
    held = kept.take(keeping.target)
    assert held is not None
    kept.keep(keeping.target, held)
    # Without a Kept, each request has a connection of its own.
    assert all(_post(keeping, f"f{i}", None).delivered for i in range(3))
    assert keeping.connections == 4


def test_a_connection_the_receiver_closed_is_replaced_and_the_request_sent_once(
    receiver: Any, kept: Kept
) -> None:
    dropping = receiver("drop")
    outcomes = [_post(dropping, f"e{i}", kept) for i in range(4)]
    assert [o.delivered for o in outcomes] == [True] * 4
    assert dropping.event_ids == ["e0", "e1", "e2", "e3"]  # each once, none lost
    assert dropping.connections == 4


def test_an_answer_that_closes_the_connection_is_not_kept(receiver: Any, kept: Kept) -> None:
    closing = receiver("close")
    assert all(_post(closing, f"e{i}", kept).delivered for i in range(3))
    assert closing.connections == 3
    assert kept.take(closing.target) is None  # closed after the answer, not held


def test_a_connection_idle_too_long_is_not_reused(
    receiver: Any, kept: Kept, monkeypatch: pytest.MonkeyPatch
) -> None:
    keeping = receiver("keep")
    monkeypatch.setattr(sender, "KEEP_IDLE_S", 0.0)
    assert all(_post(keeping, f"e{i}", kept).delivered for i in range(3))
    assert keeping.connections == 3


def test_each_checked_address_gets_its_own_connection(receiver: Any, kept: Kept) -> None:
    first, second = receiver("keep"), receiver("keep")
    for to, event in ((first, "a1"), (second, "b1"), (first, "a2"), (first, "a3")):
        assert _post(to, event, kept).delivered
    assert (first.event_ids, second.event_ids) == (["a1", "a2", "a3"], ["b1"])
    # The lane's connection moved to the second address and back: a new one for a2.
    assert (first.connections, second.connections) == (2, 1)


def test_kept_connections_are_the_threads_own(receiver: Any, kept: Kept) -> None:
    keeping = receiver("keep")

    def lane(name: str) -> None:
        for i in range(3):
            assert _post(keeping, f"{name}{i}", kept).delivered

    threads = [threading.Thread(target=lane, args=(n,)) for n in ("x", "y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(keeping.event_ids) == ["x0", "x1", "x2", "y0", "y1", "y2"]
    assert keeping.connections == 2
