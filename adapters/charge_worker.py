"""The charge process manager: consumes ``billing.events`` and charges Reserved transactions.

For each ``Reserved`` event it asks the ``Charger`` to take the transaction's next
step; the events of one poll are driven concurrently (bounded by the Stripe client's
own limits). Offsets are committed after the steps are recorded. A redelivered event
has no second effect: the transaction has moved on (the saga says NOTHING), and a
repeated Stripe call carries the same idempotency key. Retries of failed attempts are
the reconciler's, from their recorded due times, not this consumer's.
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

from kafka import KafkaConsumer
from kafka.errors import CommitFailedError

from adapters.charging import Charger

__all__ = ["ChargeWorker"]

log = logging.getLogger(__name__)


class ChargeWorker:
    def __init__(self, charger: Charger, consumer: KafkaConsumer, *, parallel: int = 8) -> None:
        self.charger = charger
        self.consumer = consumer
        self.pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="charge")
        self.driven = 0

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                self.poll_once()
        finally:
            self.pool.shutdown(wait=True)

    def poll_once(self, timeout_ms: int = 200) -> int:
        polled = self.consumer.poll(timeout_ms=timeout_ms)
        records = [r for rs in polled.values() for r in rs]
        if not records:
            return 0
        txn_ids = list(dict.fromkeys(_reserved(r) for r in records if _reserved(r)))
        for result in self.pool.map(self.charger.drive, txn_ids):
            log.debug("driven: %s", result)
        self.driven += len(txn_ids)
        try:
            self.consumer.commit()
        except CommitFailedError as exc:  # rebalanced: the new owner redrives, harmlessly
            log.warning("charge offsets not committed after a rebalance: %s", exc)
        return len(records)


def _reserved(record: Any) -> UUID | None:
    try:
        body = json.loads(record.value)
    except (TypeError, ValueError):
        log.error("unreadable billing event at %s/%s", record.partition, record.offset)
        return None
    if body.get("event") != "Reserved":
        return None
    return UUID(body["originator_id"])
