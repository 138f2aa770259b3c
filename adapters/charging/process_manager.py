"""The charge process manager: consumes ``billing.events`` and schedules line pushes.

Every change of an invoice line (``InvoiceLine.Settled`` or ``Removed``, published by
the relay in commit order, keyed by customer) is handed to the ``LineScheduler``,
which pushes the line when its settle interval allows, oldest change first. Nothing
here writes the event store, so the Kafka offsets are committed after each poll: a
message lost with a crash only delays a line until the reconciler finds its unsent
change in the database, and a message seen twice schedules a line that is already
scheduled. Other events are passed over.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any
from uuid import UUID

from eventsourcing.utils import get_topic
from kafka import KafkaConsumer
from kafka.errors import CommitFailedError

from adapters.charging.scheduler import LineScheduler
from domain.invoice_line import InvoiceLine

__all__ = ["ChargeWorker", "line_changed"]

log = logging.getLogger(__name__)

LINE_CHANGES = frozenset({get_topic(InvoiceLine.Settled), get_topic(InvoiceLine.Removed)})
_CHANGE_EVENTS = frozenset({b"Settled", b"Removed", None})  # None: no header, decode it


class ChargeWorker:
    """Schedules the push of every line a consumed event says has changed."""

    def __init__(self, scheduler: LineScheduler, consumer: KafkaConsumer) -> None:
        self.scheduler = scheduler
        self.consumer = consumer
        self.pulse: Callable[[], None] = lambda: None  # called each turn of the loop
        self.seen = 0
        self.scheduled = 0

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.pulse()
            self.poll_once()

    def poll_once(self, timeout_ms: int = 200) -> int:
        polled = self.consumer.poll(timeout_ms=timeout_ms)
        records = [r for batch in polled.values() for r in batch]
        for record in records:
            if _event_header(record) not in _CHANGE_EVENTS:
                continue  # most events: decided from the header, without decoding the body
            line = line_changed(record.value)
            if line is not None:
                customer = record.key.decode(errors="replace") if record.key else None
                self.scheduler.changed(line, customer=customer)
                self.scheduled += 1
        self.seen += len(records)
        if records:
            try:
                self.consumer.commit()
            except CommitFailedError as exc:  # rebalanced: the new owner reads them again
                log.warning("charge offsets not committed after a rebalance: %s", exc)
        return len(records)


def _event_header(record: Any) -> bytes | None:
    """The ``event`` header the relay puts on every message (None when absent)."""
    for key, value in record.headers or ():
        if key == "event":
            return bytes(value) if value is not None else None
    return None


def line_changed(value: Any) -> UUID | None:
    """The line a relayed event changed, or None (another event, or unreadable)."""
    try:
        body = json.loads(value)
        if body.get("topic") in LINE_CHANGES:
            return UUID(body["originator_id"])
    except (TypeError, ValueError, AttributeError, KeyError):
        log.warning("unreadable billing event passed over: %r", value[:200] if value else value)
    return None
