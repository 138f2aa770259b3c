"""The relay: the event store's log, in commit order, published to Kafka.

The event store is the outbox (DESIGN principle 4). The relay reads the events table
gap-free without taking a lock, with ``store.eventlog.read_after`` (the reader the
projectors use too): it takes only rows whose writing transaction (``xid``, set by
``LedgerRecorder``) is older than every transaction still open
(``pg_snapshot_xmin``), ordered by ``(xid, notification_id)``. A row that commits
late always has an xid at or above that horizon, so it cannot be skipped.

Each event goes to the ``billing.events`` topic keyed by customer id, with its
notification id, event type and trace context in headers (a transaction's
``relay publish`` span is in the transaction's trace: ``adapters.observability.telemetry``).
The position is stored in ``billing.relay_position`` after the broker acknowledged every
message of the batch (``adapters.broker.flush_acknowledged``; one it did not ends the
role, which restarts from the stored position): after a crash the relay resumes there
and may publish the last batch again (at least once; consumers are idempotent). Spend
alert crossings are events like the others here; their alert documents go to
``billing.alerts`` through a relay of their own (``adapters.alerts.relay``), which waits
for none of these events.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any
from uuid import UUID

import psycopg
from kafka import KafkaProducer
from psycopg import sql

from adapters.broker import flush_acknowledged
from adapters.charging.messages import EventMessage
from adapters.observability import telemetry
from store.connections import Database
from store.eventlog import (
    LogRow,
    follow,
    read_after,
    relay_position,
    state_json,
    store_relay_position,
)
from store.schema import DEFAULT_EVENTS_TOPIC, EVENTS_TABLE

__all__ = ["Relay", "event_message", "root_trace_headers"]

log = logging.getLogger(__name__)


class Relay:
    """Publishes new events; ``pump()`` once, or ``run(stop)`` until stopped."""

    remembered_customers = 200_000  # aggregates whose customer is kept (then forgotten)

    def __init__(
        self,
        database: Database,
        producer: KafkaProducer,
        topic: str,
        *,
        name: str = DEFAULT_EVENTS_TOPIC,
        batch: int = 2000,
    ) -> None:
        self.database = database
        self.pulse: Callable[[], None] = lambda: None  # called each turn of the loop
        self.producer = producer
        self.topic = topic
        self.name = name
        self.batch = batch
        self._customers: dict[UUID, str] = {}
        self._conn: psycopg.Connection[Any] | None = None
        self.published = 0

    def run(self, stop: threading.Event, idle_wait_s: float = 0.01) -> None:
        try:
            follow(self.pump, stop, name="relay", idle_wait_s=idle_wait_s, on_round=self.pulse)
        finally:
            self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def pump(self) -> int:
        """Publish the next batch of visible events; returns how many."""
        if self._conn is None or self._conn.closed:
            self._conn = self.database.dedicated(autocommit=True)
        conn = self._conn
        try:
            rows = read_after(conn, relay_position(conn, self.name), self.batch)
            if not rows:
                return 0
            traced = telemetry.tracing_installed()
            sent = [self._publish(conn, row, traced=traced) for row in rows]
            flush_acknowledged(self.producer, sent)  # else no position: published again
            store_relay_position(conn, self.name, rows[-1].position)
        except psycopg.OperationalError:
            self.close()  # reconnect on the next pump
            raise
        self.published += len(rows)
        return len(rows)

    def _publish(self, conn: psycopg.Connection[Any], row: LogRow, *, traced: bool) -> Any:
        _, nid, originator_id, _, topic, _ = row
        # An aggregate's customer never changes: its state is read once.
        body = row.json() if originator_id not in self._customers else None
        customer = self._customer(conn, originator_id, body)
        message, headers = event_message(row)
        if traced:
            with _trace_publish(originator_id, topic, customer, message.event, nid):
                return self._send(customer, message, [*headers, *telemetry.inject_headers()])
        # no span would be recorded: the trace context it would carry, at no cost
        return self._send(customer, message, [*headers, *root_trace_headers(row)])

    def _send(self, customer: str, message: EventMessage, headers: list[tuple[str, bytes]]) -> Any:
        """The send's future (``flush_acknowledged`` checks it)."""
        return self.producer.send(
            self.topic, key=customer.encode(), value=message.to_json(), headers=headers
        )

    def _customer(self, conn: psycopg.Connection[Any], originator_id: UUID, body: Any) -> str:
        if len(self._customers) >= self.remembered_customers:
            self._customers.clear()  # looked up again from their first events
        if isinstance(body, dict) and isinstance(body.get("customer_id"), str):
            self._customers[originator_id] = body["customer_id"]
        if originator_id not in self._customers:
            first = conn.execute(
                sql.SQL(
                    "SELECT state FROM {} WHERE originator_id = %s AND originator_version = 1"
                ).format(sql.Identifier(EVENTS_TABLE)),
                (originator_id,),
            ).fetchone()
            named = _first_customer(first[0] if first else None)
            self._customers[originator_id] = named or str(originator_id)
        return self._customers[originator_id]


def _first_customer(state: Any) -> str:
    """The customer an aggregate's first event names ("" when it names none: a state that
    is not an object, a customer id that is not text)."""
    created = state_json(state)
    customer = created.get("customer_id") if isinstance(created, dict) else None
    return customer if isinstance(customer, str) else ""


def event_message(row: LogRow) -> tuple[EventMessage, list[tuple[str, bytes]]]:
    """``row``'s message on ``billing.events`` and the headers every message carries (its
    notification id and event name)."""
    _, nid, originator_id, version, topic, _ = row
    event = topic.rsplit(".", 1)[-1]
    headers = [("notification_id", str(nid).encode()), ("event", event.encode())]
    return EventMessage(nid, originator_id, version, topic, event), headers


def root_trace_headers(row: LogRow) -> list[tuple[str, bytes]]:
    """With no tracer provider installed, the trace context ``row``'s message carries: a
    transaction's or a line's event, its aggregate's own trace root; any other, none."""
    _, _, originator_id, _, topic, _ = row
    own = ":BillingTransaction." in topic or ":InvoiceLine." in topic
    return telemetry.root_headers(originator_id) if own else []


def _trace_publish(
    originator_id: UUID, topic: str, customer: str, event: str, nid: int
) -> AbstractContextManager[Any]:  # pragma: no mutate block
    """The ``relay publish`` span, in the transaction's (or line's) own trace."""
    txn = str(originator_id) if ":BillingTransaction." in topic else None
    line = str(originator_id) if ":InvoiceLine." in topic else None
    span = telemetry.span(
        "relay publish",
        telemetry.transaction_context(originator_id) if txn or line else None,
        billing__transaction_id=txn,
        billing__line_id=line,
        billing__customer_id=customer,
        billing__event=event,
        billing__notification_id=nid,
    )
    return span
