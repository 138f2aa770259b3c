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
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.errors import CommitFailedError

from adapters.charging.charger import Charger
from adapters.observability import telemetry
from store.connections import Database
from store.recorder import ConsumerPosition, stored_positions

__all__ = ["ChargeWorker", "SeekToStored"]

log = logging.getLogger(__name__)


class ChargeWorker:
    def __init__(
        self,
        charger: Charger,
        consumer: KafkaConsumer,
        *,
        group: str,
        topic: str,
        parallel: int = 8,
    ) -> None:
        self.charger = charger
        self.pulse: Callable[[], None] = lambda: None  # called each turn of the loop
        self.consumer = consumer
        self.group = group
        self.topic = topic
        self.pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="charge")
        self.driven = 0

    def run(self, stop: threading.Event) -> None:
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
        for _ in self.pool.map(self._partition, batches):
            pass
        try:
            self.consumer.commit()
        except CommitFailedError as exc:  # rebalanced: the new owner starts at the stored positions
            log.warning("charge offsets not committed to Kafka after a rebalance: %s", exc)
        return sum(len(b) for b in batches)

    def _partition(self, records: list[Any]) -> None:
        """One partition's events, in order; then its position, if no step recorded it."""
        recorded_up_to = -1
        for record in records:
            txn_id = _reserved(record)
            if txn_id is None:
                continue
            with telemetry.span(
                "charge",
                parent=telemetry.extract_headers(record.headers),
                billing__transaction_id=str(txn_id),
                billing__customer_id=(record.key or b"").decode(errors="replace") or None,
            ) as current:
                result = self.charger.drive(txn_id, self._position(record))
                current.set_attribute("billing.result", str(result))
            self.driven += 1
            if result.recorded:
                recorded_up_to = record.offset
        last = records[-1]
        if last.offset > recorded_up_to:
            self.charger.ledger.save(positions=[self._position(last)])

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


def _reserved(record: Any) -> UUID | None:
    try:
        body = json.loads(record.value)
    except (TypeError, ValueError):
        log.error("unreadable billing event at %s/%s", record.partition, record.offset)
        return None
    if body.get("event") != "Reserved":
        return None
    return UUID(body["originator_id"])
