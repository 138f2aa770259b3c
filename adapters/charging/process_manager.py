"""The charge process manager: consumes ``billing.events`` and schedules line pushes.

Every change of an invoice line (``InvoiceLine.Settled``, ``Removed`` or ``Repriced``, or
a credit line's ``CreditsApplied``, published by the relay in commit order, keyed by
customer) is handed to the ``LineScheduler``,
which pushes the line when its settle interval allows, oldest change first. Nothing
here writes the event store, so the Kafka offsets are committed after each poll: a
message lost with a crash only delays a line until the reconciler finds its unsent
change in the database, and a message seen twice schedules a line that is already
scheduled. Other events are passed over.

No message can stop it. A message it cannot read (``adapters.charging.messages``: not
JSON, ``[]``, a missing or malformed field, an unknown event, no value) and, as a last
resort, anything unexpected one message raises is *set aside*: recorded in
``billing.dead_letters`` (keyed by its topic, partition and offset, so queue health
counts it), counted (``billing_events_set_aside_total{code}``), logged with its
partition and offset, and passed. ``stop`` is checked between messages.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from eventsourcing.utils import get_topic
from kafka import KafkaConsumer
from kafka.errors import CommitFailedError

from adapters.charging.messages import MalformedEvent, decode_event, event_error_code
from adapters.charging.scheduler import LineScheduler
from adapters.observability.logs import step_fields
from adapters.observability.metrics import metrics
from domain.credit_line import CreditLine
from domain.invoice_line import InvoiceLine
from domain.ports import DeadLetter, DeadLetterSink

__all__ = ["ChargeWorker"]

log = logging.getLogger(__name__)

LINE_CHANGES = frozenset(
    get_topic(e)
    for e in (
        InvoiceLine.Settled,
        InvoiceLine.Removed,
        InvoiceLine.Repriced,
        CreditLine.CreditsApplied,
    )
)


class ChargeWorker:
    """Schedules the push of every line a consumed event says has changed."""

    def __init__(
        self, scheduler: LineScheduler, consumer: KafkaConsumer, dead_letters: DeadLetterSink
    ) -> None:
        self.scheduler = scheduler
        self.consumer = consumer
        self.dead_letters = dead_letters
        self.pulse: Callable[[], None] = lambda: None  # called each turn of the loop
        self.seen = 0
        self.scheduled = 0
        self.set_aside = 0
        self._stop = threading.Event()  # run()'s; never set when polled directly

    def run(self, stop: threading.Event) -> None:
        self._stop = stop
        while not stop.is_set():
            self.pulse()
            self.poll_once()

    def poll_once(self, timeout_ms: int = 200) -> int:
        polled = self.consumer.poll(timeout_ms=timeout_ms)
        records = [r for batch in polled.values() for r in batch]
        handled = 0
        for record in records:
            if self._stop.is_set():
                return handled  # not committed: the rest is read again
            self._handle(record)
            handled += 1
        self.seen += handled
        if records:
            try:
                self.consumer.commit()
            except CommitFailedError as exc:  # rebalanced: the new owner reads them again
                log.warning("charge offsets not committed after a rebalance: %s", exc)
        return handled

    def _handle(self, record: Any) -> None:
        """Schedule the line a change names; set aside a message that cannot be read."""
        try:
            message = decode_event(record.value)
        except MalformedEvent as exc:
            self._set_aside(record, str(exc))
            return
        if message.topic not in LINE_CHANGES:
            return
        try:
            customer = record.key.decode(errors="replace") if record.key else None
            self.scheduler.changed(message.originator_id, customer=customer)
            self.scheduled += 1
        except Exception as exc:  # the last resort: one message never stops charging
            log.error("billing event failed unexpectedly", exc_info=exc)
            self._set_aside(record, f"internal: {type(exc).__name__}")

    def _set_aside(self, record: Any, reason: str) -> None:
        """Record, count and log a message that cannot be handled; it is then passed."""
        code = event_error_code(reason)
        self.dead_letters.record(
            [DeadLetter(record.topic, record.partition, record.offset, record.key,
                        record.value, reason, code=code)]
        )  # fmt: skip
        self.set_aside += 1
        m = metrics()
        m.events_set_aside.add(1, {"code": code})
        m.dead_letters.add(1)
        log.warning(
            "billing event set aside",
            extra=step_fields("charge", "set_aside", error_code=code, reason=reason,
                              topic=record.topic, partition=record.partition,
                              offset=record.offset),
        )  # fmt: skip
