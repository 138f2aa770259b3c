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
Each spend alert crossing (``CustomerAccount.AlertCrossed``) is also published to the
alerts topic (``billing.alerts``) as its alert document (``adapters.alerts.messages``),
keyed by customer id, in the same pass: exactly the crossings, in commit order, each
batch's before its events (an alert waits for no event read with it). The position is
stored in ``billing.relay_position`` after the broker acknowledged the batch (both
topics' sends): after a crash the relay resumes there and may publish the last batch
again (at-least-once; consumers are idempotent).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any
from uuid import UUID

import psycopg
from kafka import KafkaProducer
from psycopg import sql

from adapters.alerts.messages import ALERT_EVENT_TOPIC, alert_document
from adapters.charging.messages import EventMessage
from adapters.observability import telemetry
from store.connections import Database
from store.eventlog import START, LogRow, Position, follow, read_after
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
        alerts_topic: str | None = None,
    ) -> None:
        self.database = database
        self.pulse: Callable[[], None] = lambda: None  # called each turn of the loop
        self.producer = producer
        self.topic = topic
        self.name = name
        self.batch = batch
        self.alerts_topic = alerts_topic
        self.alerts = 0  # alert documents published
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
            rows = read_after(conn, self._position(conn), self.batch)
            if not rows:
                return 0
            if self.alerts_topic is not None:  # the batch's crossings first (see _alerts)
                self._alerts(rows)
            traced = telemetry.tracing_installed()
            for row in rows:
                self._publish(conn, row, traced=traced)
            self.producer.flush()
            last = rows[-1]
            conn.execute(
                "INSERT INTO billing.relay_position (name, xid, notification_id)"
                " VALUES (%s, %s::xid8, %s) ON CONFLICT (name) DO UPDATE"
                " SET xid = EXCLUDED.xid, notification_id = EXCLUDED.notification_id",
                (self.name, last.xid, last.notification_id),
            )
        except psycopg.OperationalError:
            self.close()  # reconnect on the next pump
            raise
        self.published += len(rows)
        return len(rows)

    def _position(self, conn: psycopg.Connection[Any]) -> Position:
        row = conn.execute(
            "SELECT xid::text, notification_id FROM billing.relay_position WHERE name = %s",
            (self.name,),
        ).fetchone()
        return Position(str(row[0]), int(row[1])) if row else START

    def _publish(self, conn: psycopg.Connection[Any], row: LogRow, *, traced: bool) -> None:
        _, nid, originator_id, _, topic, state = row
        # An aggregate's customer never changes: its state is read once (an alert's was
        # read for the alerts topic already, ``_alerts``).
        body = _json(state) if originator_id not in self._customers else None
        customer = self._customer(conn, originator_id, body)
        message, headers = event_message(row)
        if traced:
            with _trace_publish(originator_id, topic, customer, message.event, nid):
                self._send(customer, message, [*headers, *telemetry.inject_headers()])
        else:  # no span would be recorded: the trace context it would carry, at no cost
            self._send(customer, message, [*headers, *root_trace_headers(row)])

    def _send(self, customer: str, message: EventMessage, headers: list[tuple[str, bytes]]) -> None:
        self.producer.send(
            self.topic, key=customer.encode(), value=message.to_json(), headers=headers
        )

    def _alerts(self, rows: list[LogRow]) -> None:
        """The batch's crossings to the alerts topic, in commit order, before its events:
        a crossing waits for no event of the batch (publishing 2,000 events takes the
        relay 0.3-1.7 s on a busy 2-core machine: a crossing late in a batch waited that
        long). Each topic stays in commit order; the position is stored after both."""
        for _, nid, _, _, topic, state in rows:
            if topic == ALERT_EVENT_TOPIC:
                self._publish_alert(_json(state), nid)

    def _publish_alert(self, body: Any, nid: int) -> None:
        alert = alert_document(body, nid)
        if alert is None:  # not what AlertCrossed stores: say so, never stop on a row
            log.warning("alert event %s unreadable, not published", nid)
            return
        self.producer.send(
            self.alerts_topic,
            key=alert.customer_id.encode(),
            value=alert.body,
            headers=[("event", alert.type.encode()), ("event_id", alert.id.encode())],
        )
        self.alerts += 1

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


def _json(state: Any) -> Any:
    """An event's stored state read as JSON (None when it is not: the relay never stops
    on a row, whatever a hand or an old build wrote)."""
    try:
        return json.loads(bytes(state)) if state is not None else None
    except ValueError:
        return None


def _first_customer(state: Any) -> str:
    """The customer an aggregate's first event names ("" when it names none: a state that
    is not an object, a customer id that is not text)."""
    created = _json(state)
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
