"""The relay pinned down (``adapters.charging.relay``): the event store's log, in commit
order, published to ``billing.events`` through a fake producer, over a fake of the
PostgreSQL it reads. The fake knows the events table (committed rows, read after a
position in ``(xid, notification_id)`` order as ``store.eventlog.read_after`` asks),
``billing.relay_position``, and nothing else: any other statement is refused, and a
write on a connection without autocommit is lost when it closes (never committed)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg import sql

from adapters.alerts.messages import ALERT_EVENT_TOPIC
from adapters.broker import PublishFailed
from adapters.charging.messages import EventMessage, decode_event
from adapters.charging.relay import Relay
from adapters.observability import telemetry
from store.eventlog import _READ_AFTER
from store.schema import EVENTS_TABLE
from tests.fast.fakes import FakeProducer

TOPIC = "billing.events"
TXN, LINE, INVOICE = UUID(int=0xA1), UUID(int=0xB2), UUID(int=0xC3)
RESERVED = "domain.transaction:BillingTransaction.Reserved"
CHARGED = "domain.transaction:BillingTransaction.Charged"
SETTLED = "domain.invoice_line:InvoiceLine.Settled"
FINALIZED = "domain.invoice:Invoice.Finalized"

_STATEMENTS = {
    "position": "select xid::text, notification_id from billing.relay_position where name = %s",
    "save": "insert into billing.relay_position (name, xid, notification_id)"
    " values (%s, %s::xid8, %s) on conflict (name) do update"
    " set xid = excluded.xid, notification_id = excluded.notification_id",
    "first": sql.SQL("select state from {} where originator_id = %s and originator_version = 1")
    .format(sql.Identifier(EVENTS_TABLE))
    .as_string(None),
    "read": _READ_AFTER.as_string(None).lower(),
}


class EventStore:
    """The database the relay reads: committed events and stored positions."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, int, UUID, int, str, bytes]] = []
        self.positions: dict[str, tuple[str, int]] = {}
        self.connections: list[Connection] = []
        self.fail_next = False  # the next statement finds the server gone
        self.on_failure: Callable[[], object] = lambda: None
        self.arriving: list[tuple[str, int, UUID, int, str, bytes]] = []  # after a read

    def commit(self, xid: int, originator: UUID, version: int, topic: str, **state: Any) -> None:
        nid = len(self.rows) + 1
        self.rows.append((str(xid), nid, originator, version, topic, json.dumps(state).encode()))

    def dedicated(self, *, autocommit: bool = False) -> Connection:
        conn = Connection(self, bool(autocommit))
        self.connections.append(conn)
        return conn


class Connection:
    def __init__(self, store: EventStore, autocommit: bool) -> None:
        self.store = store
        self.autocommit = autocommit
        self.closed = False
        self.pending: dict[str, tuple[str, int]] = {}

    def close(self) -> None:
        self.closed = True
        self.pending.clear()  # never committed

    def execute(self, query: Any, params: tuple[Any, ...]) -> Rows:
        assert not self.closed, "a statement on a closed connection"
        if self.store.fail_next:
            self.store.fail_next = False
            self.store.on_failure()
            self.closed = True
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        text = query if isinstance(query, str) else query.as_string(None)
        if "%S" in text:
            raise psycopg.ProgrammingError("only '%s', '%b', '%t' are allowed as placeholders")
        statement = next((k for k, v in _STATEMENTS.items() if v == text.lower()), None)
        store = self.store
        if statement == "position":
            (name,) = params  # its own uncommitted write, else the committed one
            stored = self.pending.get(name) or store.positions.get(name)
            return Rows([stored] if stored else [])
        if statement == "read":
            xid, nid, limit = params
            after = [r for r in store.rows if (int(r[0]), r[1]) > (int(xid), nid)]
            store.rows += store.arriving  # committed while this read ran: seen next time
            store.arriving = []
            return Rows(sorted(after, key=lambda r: (int(r[0]), r[1]))[:limit])
        if statement == "first":
            (originator,) = params
            return Rows([(r[5],) for r in store.rows if r[2] == originator and r[3] == 1])
        if statement == "save":
            name, xid, nid = params
            (store.positions if self.autocommit else self.pending)[name] = (str(xid), nid)
            return Rows([])
        raise psycopg.errors.SyntaxError(f"not a statement this database knows: {text}")


class Rows:
    def __init__(self, rows: list[Any]) -> None:
        self.rows = rows

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Any]:
        return self.rows


def _relay(store: EventStore, batch: int = 10) -> tuple[Relay, FakeProducer]:
    producer = FakeProducer()
    relay = Relay(store, producer, TOPIC, batch=batch)  # type: ignore[arg-type]
    return relay, producer


def _sent(producer: FakeProducer) -> list[tuple[str, bytes | None, EventMessage]]:
    """What was published: (topic, key, message read back as a consumer reads it)."""
    return [(topic, key, decode_event(value)) for topic, key, value, _ in producer.sent]


def test_each_event_is_published_in_commit_order_keyed_by_its_customer() -> None:
    store = EventStore()
    store.commit(7, TXN, 1, RESERVED, customer_id="acme")
    store.commit(5, LINE, 1, SETTLED, customer_id="zed")  # committed first: older xid
    store.commit(7, TXN, 2, CHARGED)  # no customer in it: its aggregate's first has one
    relay, producer = _relay(store)
    assert relay.pump() == 3
    assert _sent(producer) == [
        (TOPIC, b"zed", EventMessage(2, LINE, 1, SETTLED, "Settled")),
        (TOPIC, b"acme", EventMessage(1, TXN, 1, RESERVED, "Reserved")),
        (TOPIC, b"acme", EventMessage(3, TXN, 2, CHARGED, "Charged")),
    ]
    assert [h[:2] for *_, h in producer.sent] == [
        [("notification_id", b"2"), ("event", b"Settled")],
        [("notification_id", b"1"), ("event", b"Reserved")],
        [("notification_id", b"3"), ("event", b"Charged")],
    ]
    assert producer.flushes == 1 and relay.published == 3


def _crossing(alert_id: UUID, usage_id: str) -> dict[str, Any]:
    return {
        "alert_id": str(alert_id),
        "customer_id": "acme",
        "currency": "USD",
        "threshold": "spend:100",
        "period": "2026-12",
        "usage_id": usage_id,
        "transaction_id": str(TXN),
        "value": "100",
    }


def test_a_crossing_is_an_event_like_the_others_here_its_alert_is_another_relays() -> None:
    store = EventStore()
    account = UUID(int=0xD4)
    store.commit(5, TXN, 1, RESERVED, customer_id="acme")
    store.commit(6, account, 1, ALERT_EVENT_TOPIC, **_crossing(UUID(int=1), "u-1"))
    relay, producer = _relay(store)
    assert relay.pump() == 2
    assert [(topic, key, m.event) for topic, key, m in _sent(producer)] == [
        (TOPIC, b"acme", "Reserved"),
        (TOPIC, b"acme", "AlertCrossed"),
    ]


def test_an_aggregate_whose_events_carry_no_customer_is_keyed_by_its_first_events_or_its_id() -> (
    None
):
    store = EventStore()
    store.commit(1, INVOICE, 1, FINALIZED)  # no customer anywhere
    store.commit(2, LINE, 2, SETTLED)  # its first event is not in the store
    relay, producer = _relay(store)
    relay.pump()
    store.rows.append(("3", 3, TXN, 2, CHARGED, b'["not", "an", "object"]'))
    store.commit(4, UUID(int=0xD4), 2, CHARGED, customer_id=42)  # not a customer id
    relay.pump()
    assert [key for _, key, _ in _sent(producer)] == [
        str(INVOICE).encode(),
        str(LINE).encode(),
        str(TXN).encode(),
        str(UUID(int=0xD4)).encode(),
    ]


OTHER = UUID(int=0xE5)


def test_a_first_event_the_relay_cannot_read_a_customer_from_never_stops_it() -> None:
    store = EventStore()
    store.rows.append(("1", 1, TXN, 1, RESERVED, b"[1, 2]"))  # not an object
    store.rows.append(("2", 2, LINE, 1, SETTLED, b'{"customer_id": null}'))
    store.rows.append(("3", 3, INVOICE, 1, FINALIZED, b"{not json"))
    store.rows.append(("4", 4, OTHER, 1, RESERVED, b'{"customer_id": 42}'))
    store.commit(5, TXN, 2, CHARGED)
    store.commit(6, LINE, 2, SETTLED)
    store.commit(7, INVOICE, 2, FINALIZED)
    store.commit(8, OTHER, 2, CHARGED)
    relay, producer = _relay(store)
    assert relay.pump() == 8
    assert [key for _, key, _ in _sent(producer)][4:] == [
        str(TXN).encode(), str(LINE).encode(), str(INVOICE).encode(), str(OTHER).encode(),
    ]  # fmt: skip


def test_a_relay_resuming_past_an_aggregates_first_event_keys_its_next_by_that_ones_customer() -> (
    None
):
    store = EventStore()
    store.commit(1, TXN, 1, RESERVED, customer_id="acme")
    store.positions[TOPIC] = ("1", 1)  # published before a restart
    store.commit(2, TXN, 2, CHARGED)
    relay, producer = _relay(store)
    assert relay.pump() == 1
    assert [(key, m.notification_id) for _, key, m in _sent(producer)] == [(b"acme", 2)]


def test_an_aggregates_customer_is_remembered_from_its_own_events() -> None:
    store = EventStore()
    store.commit(1, TXN, 2, CHARGED, customer_id="acme")  # read from the middle of its life
    store.commit(2, TXN, 3, CHARGED)
    store.commit(3, TXN, 1, RESERVED, customer_id="other")  # what the store says first
    relay, producer = _relay(store)
    relay.pump()
    # Read once: every event of an aggregate has one key, so one partition and one order.
    assert [key for _, key, _ in _sent(producer)] == [b"acme", b"acme", b"acme"]


def test_past_the_customers_it_remembers_the_relay_looks_them_up_again() -> None:
    store = EventStore()
    store.commit(1, TXN, 1, RESERVED, customer_id="acme")
    store.commit(2, LINE, 1, SETTLED, customer_id="zed")
    store.commit(3, TXN, 2, CHARGED)
    relay, producer = _relay(store)
    relay.remembered_customers = 2
    relay.pump()
    # The third event finds two remembered: forgotten, and the transaction's first
    # event read from the store again.
    assert [key for _, key, _ in _sent(producer)] == [b"acme", b"zed", b"acme"]
    assert len(relay._customers) == 1


def test_the_position_is_stored_after_each_batch_and_the_next_pump_resumes_after_it() -> None:
    store = EventStore()
    for version in range(1, 4):
        store.commit(10 + version, TXN, version, CHARGED, customer_id="acme")
    relay, producer = _relay(store, batch=2)
    assert relay.pump() == 2
    assert store.positions == {TOPIC: ("12", 2)}
    store.commit(11, LINE, 1, SETTLED, customer_id="acme")  # an older xid, seen already
    assert relay.pump() == 1
    assert store.positions == {TOPIC: ("13", 3)}
    assert relay.pump() == 0
    assert [m.notification_id for *_, m in _sent(producer)] == [1, 2, 3]
    assert (producer.flushes, relay.published) == (2, 3)


def test_a_restarted_relay_resumes_at_the_stored_position() -> None:
    store = EventStore()
    for version in range(1, 4):
        store.commit(20 + version, TXN, version, CHARGED, customer_id="acme")
    first, _ = _relay(store, batch=2)
    first.pump()
    first.close()
    store.commit(30, LINE, 1, SETTLED, customer_id="acme")
    relay, producer = _relay(store)
    assert relay.pump() == 2
    assert [m.notification_id for *_, m in _sent(producer)] == [3, 4]


def test_after_the_database_goes_away_the_relay_reconnects_and_publishes_on() -> None:
    store = EventStore()
    store.commit(1, TXN, 1, RESERVED, customer_id="acme")
    relay, producer = _relay(store)
    store.fail_next = True
    with pytest.raises(psycopg.OperationalError):
        relay.pump()
    assert relay.pump() == 1
    store.connections[-1].close()  # closed under it between pumps
    store.commit(2, TXN, 2, CHARGED)
    assert relay.pump() == 1
    assert len(store.connections) == 3 and not store.connections[-1].closed
    assert [m.notification_id for *_, m in _sent(producer)] == [1, 2]
    relay.close()
    relay.close()  # closing twice is harmless
    assert store.connections[-1].closed


def test_a_relay_that_cannot_reach_the_database_says_so_in_its_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = EventStore()
    stop = threading.Event()
    store.fail_next, store.on_failure = True, stop.set  # stopped while it is down
    relay, _ = _relay(store)
    with caplog.at_level(logging.WARNING, logger="store.eventlog"):
        relay.run(stop)
    assert caplog.messages == [
        "relay cannot reach the database: server closed the connection unexpectedly"
    ]
    assert [c.closed for c in store.connections] == [True]


def test_run_publishes_until_stopped_then_closes_its_connection() -> None:
    store = EventStore()
    store.commit(1, TXN, 1, RESERVED, customer_id="acme")
    stop = threading.Event()

    class StopOnFlush(FakeProducer):
        def flush(self) -> None:
            super().flush()
            stop.set()

    producer = StopOnFlush()
    relay = Relay(store, producer, TOPIC)  # type: ignore[arg-type]
    turns: list[int] = []
    relay.pulse = lambda: turns.append(relay.published)
    relay.run(stop)
    assert turns == [0] and relay.published == 1
    assert [c.closed for c in store.connections] == [True]


def test_an_idle_relay_reads_again_at_once_when_told_not_to_wait() -> None:
    store = EventStore()
    store.arriving.append(("1", 1, TXN, 1, RESERVED, b'{"customer_id": "acme"}'))
    stop = threading.Event()

    class StopOnFlush(FakeProducer):
        def flush(self) -> None:
            super().flush()
            stop.set()

    relay = Relay(store, StopOnFlush(), TOPIC)  # type: ignore[arg-type]
    watchdog = threading.Timer(5.0, stop.set)  # a relay that waits forever is stopped
    watchdog.start()
    try:
        relay.run(stop, idle_wait_s=0)  # the first read finds nothing, the second one row
    finally:
        watchdog.cancel()
        watchdog.join()
    assert relay.published == 1 and store.positions == {TOPIC: ("1", 1)}


@pytest.mark.parametrize("installed", [False, True])
def test_a_transactions_or_lines_event_carries_its_trace_to_the_consumer(
    installed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With a tracer provider or without one (then no span is made per event).
    monkeypatch.setattr(telemetry, "tracing_installed", lambda: installed)
    store = EventStore()
    store.commit(1, TXN, 1, RESERVED, customer_id="acme")
    store.commit(2, LINE, 1, SETTLED, customer_id="zed")
    store.commit(3, INVOICE, 1, FINALIZED, customer_id="zed")
    relay, producer = _relay(store)
    relay.pump()
    carried = [dict(headers).get("traceparent", b"").decode() for *_, headers in producer.sent]
    traces = [t.split("-")[1] if t else None for t in carried]
    # One transaction (or line) is one trace whose id is its own; an invoice's event
    # starts none of its own there.
    assert traces[:2] == [TXN.hex, LINE.hex]
    assert traces[2] not in (TXN.hex, LINE.hex, INVOICE.hex)
    if not installed:  # the transaction's (line's) root, as the no-op span carries it
        roots = [dict(telemetry.root_headers(i))["traceparent"].decode() for i in (TXN, LINE)]
        assert carried == [*roots, ""]
    assert [dict(h)["event"] for *_, h in producer.sent] == [b"Reserved", b"Settled", b"Finalized"]


def test_a_batch_the_broker_did_not_acknowledge_stores_no_position_and_goes_out_again() -> None:
    # kafka-python's flush returns once every send completed, failed ones too (a message
    # that outlived delivery_timeout_ms while the broker was away): the relay checks.
    store = EventStore()
    store.commit(1, TXN, 1, RESERVED, customer_id="acme")
    store.commit(2, LINE, 1, SETTLED, customer_id="zed")
    relay, producer = _relay(store)
    producer.refusing = "expired after 120000 ms"
    with pytest.raises(PublishFailed, match=r"2 of 2 messages not acknowledged.*expired"):
        relay.pump()
    assert store.positions == {} and producer.sent == []
    producer.refusing = None  # the broker is back; the role restarts
    again, producer = _relay(store)
    assert again.pump() == 2
    assert [m.notification_id for _, _, m in _sent(producer)] == [1, 2]
    assert store.positions == {TOPIC: ("2", 2)}
