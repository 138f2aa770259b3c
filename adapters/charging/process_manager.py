"""The charge process manager: consumes ``billing.events`` and charges Reserved transactions.

For each ``Reserved`` event it asks the ``Charger`` for the transaction's next step.
What the step records and the consumer's position after that event are committed in
ONE database transaction (``billing.consumer_positions``); when partitions are
assigned, the consumer seeks to the positions stored there, so an event whose
effect was recorded is not processed again even if the Kafka offset commit was
lost. (Offsets are committed to Kafka too, for lag monitoring.) Partitions are
processed in parallel, the events of one partition in order, so a partition's
stored position never passes an event that has not been handled.

Retries of failed attempts are the reconciler's, from their recorded due times.

No message can stop it. A message it cannot read (``adapters.charging.messages``:
not JSON, ``[]``, a missing or malformed field, an unknown event, no value), a
``Reserved`` of a transaction the ledger does not have, and, as a last resort,
anything unexpected a single message raises while it is handled is *set aside*:
recorded in ``billing.dead_letters`` (keyed by its topic, partition and offset, so
queue health counts it), counted (``billing_events_set_aside_total{code}``), logged
with its partition and offset, and passed: the partition's position moves beyond it
like any other message's. What the database raises is not a message's fault: it
fails the poll, and the role is restarted to read again from the stored positions.
Skipping a ``Reserved`` never loses a charge: the reconciler drives every reservation
nobody charged within ``stale_after``.

Stopping: ``stop`` is checked between messages; a partition stopped part way stores
no position beyond the last message handled, and no offset is committed to Kafka.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError
from eventsourcing.utils import get_topic
from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.errors import CommitFailedError

from adapters.charging.charger import Charger
from adapters.charging.messages import MalformedEvent, decode_event, event_error_code
from adapters.observability import telemetry
from adapters.observability.logs import step_fields
from adapters.observability.metrics import metrics
from domain.ports import DeadLetter, DeadLetterSink
from domain.transaction import BillingTransaction
from store.connections import Database
from store.errors import DATABASE_ERRORS
from store.recorder import ConsumerPosition, stored_positions

__all__ = ["ChargeWorker", "SeekToStored"]

log = logging.getLogger(__name__)

_RESERVED = get_topic(BillingTransaction.Reserved)


class ChargeWorker:
    def __init__(
        self,
        charger: Charger,
        consumer: KafkaConsumer,
        dead_letters: DeadLetterSink,
        *,
        group: str,
        topic: str,
        parallel: int = 8,
    ) -> None:
        self.charger = charger
        self.pulse: Callable[[], None] = lambda: None  # called each turn of the loop
        self.consumer = consumer
        self.dead_letters = dead_letters
        self.group = group
        self.topic = topic
        self.pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="charge")
        self.driven = 0
        self.set_aside = 0
        self._stop = threading.Event()  # run()'s; never set when polled directly

    def run(self, stop: threading.Event) -> None:
        self._stop = stop
        try:
            while not stop.is_set():
                self.pulse()
                self.poll_once()
        finally:
            self.pool.shutdown(wait=True)

    def poll_once(self, timeout_ms: int = 200) -> int:
        polled = self.consumer.poll(timeout_ms=timeout_ms)
        batches = [records for records in polled.values() if records]
        if not batches:
            return 0
        handled = sum(self.pool.map(self._partition, batches))
        if handled < sum(len(b) for b in batches):
            return handled  # stopped part way: the stored positions say where to resume
        try:
            self.consumer.commit()
        except CommitFailedError as exc:  # rebalanced: the new owner starts at the stored positions
            log.warning("charge offsets not committed to Kafka after a rebalance: %s", exc)
        return handled

    def _partition(self, records: list[Any]) -> int:
        """One partition's events, in order, until stopped; then the position after the
        last one handled, if no step recorded it. Returns how many were handled."""
        recorded_up_to = -1
        handled: Any = None
        for record in records:
            if self._stop.is_set():
                break
            if self._handle(record):
                recorded_up_to = record.offset
            handled = record
        if handled is not None and handled.offset > recorded_up_to:
            self.charger.ledger.save(positions=[self._position(handled)])
        return 0 if handled is None else records.index(handled) + 1

    def _handle(self, record: Any) -> bool:
        """Charge the transaction a ``Reserved`` names; set aside a message that cannot
        be handled. True when the step recorded the position with its events."""
        try:
            message = decode_event(record.value)
        except MalformedEvent as exc:
            self._set_aside(record, str(exc))
            return False
        if message.topic != _RESERVED:
            return False
        try:
            return self._charge(record, message.originator_id)
        except AggregateNotFoundError:
            self._set_aside(record, f"unknown transaction {message.originator_id}")
        except DATABASE_ERRORS:
            raise  # not this message's fault: fail the poll, read it again after a restart
        except Exception as exc:  # the last resort: one message never stops charging
            log.error("billing event failed unexpectedly", exc_info=exc)
            self._set_aside(record, f"internal: {type(exc).__name__}")
        return False

    def _charge(self, record: Any, txn_id: UUID) -> bool:
        with telemetry.span(
            "charge",
            parent=telemetry.extract_headers(record.headers),
            billing__transaction_id=str(txn_id),
            billing__customer_id=(record.key or b"").decode(errors="replace") or None,
        ) as current:
            result = self.charger.drive(txn_id, self._position(record))
            current.set_attribute("billing.result", str(result))
        self.driven += 1
        return result.recorded

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

    def _position(self, record: Any) -> ConsumerPosition:
        return ConsumerPosition(self.group, record.topic, record.partition, record.offset + 1)


class SeekToStored(ConsumerRebalanceListener):  # type: ignore[misc]
    """On assignment, moves the consumer to the positions stored with the steps."""

    def __init__(self, database: Database, group: str, topic: str) -> None:
        self.database = database
        self.group = group
        self.topic = topic
        self.consumer: KafkaConsumer | None = None  # set once the consumer exists

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        """Nothing to flush: every step's position was committed with the step."""

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        assert self.consumer is not None
        with self.database.connection() as conn:
            stored = stored_positions(
                conn, self.group, self.topic, [tp.partition for tp in assigned]
            )
        for partition, offset in stored.items():
            self.consumer.seek(TopicPartition(self.topic, partition), offset)
