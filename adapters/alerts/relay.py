"""The alerts relay: the log's spend alert crossings, in commit order, to ``billing.alerts``.

The event store is the outbox here too. The relay of ``billing.events``
(``adapters.charging.relay``) publishes every event of the log; on two busy cores it can
fall seconds behind the log (each event is a kafka-python ``send`` in pure Python), and
an alert read with those events would wait as long. This relay follows the same log on
a position of its own (``billing.relay_position``, named ``alerts``) and
reads only the crossings (``CustomerAccount.AlertCrossed``), with
``store.eventlog.read_topics_after``: the other rows are moved past without being read,
so an alert waits for the crossing's commit and one poll, not for the events before it.

Each crossing goes out as its alert document (``adapters.alerts.messages``), keyed by
customer id, with the document's type and id in headers. The position is stored after
the broker acknowledged every send of the batch (``adapters.broker.flush_acknowledged``:
one it did not ends the role, which restarts from the stored position; at least once:
after a crash the last batch may be published again, and a receiver deduplicates by the
alert's id), and, when only other events went by, at most once a second (what it skips
is read again after a crash, and holds no crossing).

Before this relay existed the events relay published the crossings with the events:
migration 17 started this relay's position at that relay's, so no crossing is skipped
and none before it is published again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from kafka import KafkaProducer

from adapters.alerts.messages import ALERT_EVENT_TOPIC, alert_document
from adapters.broker import flush_acknowledged
from store.connections import Database
from store.eventlog import (
    LogRow,
    Position,
    follow,
    read_topics_after,
    relay_position,
    store_relay_position,
)

__all__ = ["POSITION_NAME", "AlertRelay"]

POSITION_NAME = "alerts"  # its row in billing.relay_position (migration 17 names it)

log = logging.getLogger(__name__)


class AlertRelay:
    """Publishes new alert crossings; ``pump()`` once, or ``run(stop)`` until stopped."""

    save_every_s = 1.0  # how often a position past other events only is stored

    def __init__(
        self,
        database: Database,
        producer: KafkaProducer,
        topic: str,
        *,
        batch: int = 500,
    ) -> None:
        self.database = database
        self.pulse: Callable[[], None] = lambda: None  # called each turn of the loop
        self.producer = producer
        self.topic = topic
        self.name = POSITION_NAME
        self.batch = batch
        self.published = 0  # alert documents published
        self.unreadable = 0  # crossings whose stored state is not one (logged, skipped)
        self._conn: psycopg.Connection[Any] | None = None
        self._position: Position | None = None  # read from the database on (re)connect
        self._saved: Position | None = None
        self._saved_at = 0.0

    def run(self, stop: threading.Event, idle_wait_s: float = 0.01) -> None:
        try:
            follow(
                self.pump, stop, name="alerts relay", idle_wait_s=idle_wait_s, on_round=self.pulse
            )
        finally:
            self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._position = None

    def pump(self) -> int:
        """Publish the next crossings; returns how many rows of them were read."""
        if self._conn is None or self._conn.closed:
            self._conn = self.database.dedicated(autocommit=True)
            self._position = None
        conn = self._conn
        try:
            if self._position is None:
                self._position = relay_position(conn, self.name)
                self._saved = self._position
            rows, position = read_topics_after(
                conn, self._position, self.batch, [ALERT_EVENT_TOPIC]
            )
            sent = [f for f in (self._publish(row) for row in rows) if f is not None]
            if rows:  # acknowledged before the position moves past them, else none stored
                flush_acknowledged(self.producer, sent)
            self._position = position
            if rows or (
                position != self._saved and time.monotonic() - self._saved_at >= self.save_every_s
            ):
                store_relay_position(conn, self.name, position)
                self._saved, self._saved_at = position, time.monotonic()
        except psycopg.OperationalError:
            self.close()  # reconnect on the next pump, from the stored position
            raise
        return len(rows)

    def _publish(self, row: LogRow) -> Any:
        """The send's future, or None for a row that is not a crossing."""
        alert = alert_document(row.json(), row.notification_id)
        if alert is None:  # not what AlertCrossed stores: say so, never stop on a row
            self.unreadable += 1
            log.warning("alert event %s unreadable, not published", row.notification_id)
            return None
        future = self.producer.send(
            self.topic,
            key=alert.customer_id.encode(),
            value=alert.body,
            headers=[("event", alert.type.encode()), ("event_id", alert.id.encode())],
        )
        self.published += 1
        return future
