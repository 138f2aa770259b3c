"""Producing usage records to the usage topic: ``UsageProducer``, the client a service
uses to send its usage (and the ``produce`` command, the demo and the benchmarks).

    from adapters.ingest.producer import UsageProducer

    with UsageProducer("127.0.0.1:9092", prices=Settings().load_prices()) as usage:
        usage.send(customer_id="acme", usage_id="req-42", meter="gpt-4o.input_tokens",
                   quantity=1200)

Each record is checked before it is sent, by the rules the ingest applies (and, given
a price list, that its meter has a price): a record the ledger would set aside raises
``InvalidUsage`` with the dead letter's reason, and nothing is sent. It is keyed by its
customer, so one customer's records stay in order on one partition. Each send is a
``produce usage`` span in its transaction's trace, with the span's context in the
headers (W3C ``traceparent``): ingest continues it. ``flush`` (and leaving the ``with``)
waits for the broker and raises ``adapters.broker.PublishFailed`` when it did not
acknowledge some of the records sent (kafka-python gives up on a message after
``delivery_timeout_ms``, two minutes): send them again, the ledger records each usage id
once.
"""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime
from decimal import Decimal
from types import TracebackType
from typing import Any, Self
from uuid import UUID

from kafka import KafkaProducer

from adapters.broker import Refusals, make_producer
from adapters.observability import telemetry
from domain.ids import transaction_id
from domain.price_book import PriceSchedule
from domain.pricing import PriceList
from domain.transaction import price_of_record
from domain.usage import DEFAULT_MAX_RECORD_BYTES, UsageRecord, UsageWindow, decode_usage
from store.schema import DEFAULT_USAGE_TOPIC

__all__ = ["UsageProducer", "check_record", "send_usage"]

_WINDOW = UsageWindow()


def check_record(
    value: bytes,
    prices: PriceList | PriceSchedule | None,
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    window: UsageWindow = _WINDOW,
) -> UsageRecord:
    """The record ``value`` holds, by the rules the ingest applies (its ``occurred_at``
    within ``window`` of this machine's clock; given the price list or the price book's
    versions, with a meter priced when the usage occurred); raises ``InvalidUsage`` with
    the dead letter's reason."""
    record = window.check(decode_usage(value, max_bytes=max_bytes), datetime.now(UTC))
    if prices is not None:
        price_of_record(record, prices)  # InvalidUsage: the meter or the currency
    return record


class UsageProducer:
    """Sends usage records to the ledger's usage topic, each checked first."""

    def __init__(
        self,
        bootstrap: str | KafkaProducer,
        topic: str = DEFAULT_USAGE_TOPIC,
        *,
        prices: PriceList | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        check: bool = True,
        usage_window: UsageWindow = _WINDOW,
    ) -> None:
        self.producer = make_producer(bootstrap) if isinstance(bootstrap, str) else bootstrap
        self.topic = topic
        self.prices = prices
        self.max_record_bytes = max_record_bytes
        self.usage_window = usage_window
        # False: the caller made the records itself (a benchmark, whose load generator
        # must not take the CPU the pipeline it measures needs); they are still keyed.
        self.check = check
        self.sent = 0
        self.refusals = Refusals("usage records")  # counted as the broker answers

    def send(
        self,
        record: UsageRecord | None = None,
        *,
        customer_id: str | None = None,
        usage_id: str | None = None,
        meter: str | None = None,
        quantity: int | str | Decimal | None = None,
        occurred_at: datetime | None = None,
    ) -> UsageRecord:
        """Check and send ``record``, or the record the fields make (``occurred_at``:
        now); the record sent. Raises ``InvalidUsage`` (nothing sent) when the ledger
        would set it aside."""
        if record is None:
            record = self.record(customer_id, usage_id, meter, quantity, occurred_at)
        value = record.to_json()
        if self.check:
            check_record(value, self.prices, self.max_record_bytes, self.usage_window)
        txn = transaction_id(record.customer_id, record.usage_id)
        self.refusals.watch(
            _send(
                self.producer,
                self.topic,
                record.customer_id.encode(),
                value,
                txn,
                record.customer_id,
            )
        )
        self.sent += 1
        return record

    @staticmethod
    def record(
        customer_id: str | None,
        usage_id: str | None,
        meter: str | None,
        quantity: int | str | Decimal | None,
        occurred_at: datetime | None,
    ) -> UsageRecord:
        """The record of these fields, validated as ingest validates it."""
        body = {
            "customer_id": customer_id,
            "usage_id": usage_id,
            "meter": meter,
            "quantity": str(quantity) if quantity is not None else None,
            "occurred_at": (occurred_at or datetime.now(UTC)).isoformat(),
        }
        return decode_usage(json.dumps(body).encode())

    def send_raw(self, key: bytes | None, value: bytes) -> None:
        """Send bytes as they are, unchecked (a replay of a file, the demo's poison)."""
        self.refusals.watch(send_usage(self.producer, self.topic, key, value))
        self.sent += 1

    def flush(self) -> None:
        """Wait for the broker's answers; ``PublishFailed`` if it refused any record sent
        since the last flush."""
        self.producer.flush()
        self.refusals.check()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.producer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def send_usage(producer: KafkaProducer, topic: str, key: bytes | None, value: bytes) -> Any:
    """Send one usage record in a ``produce usage`` span of its transaction's trace, with
    the span's context in the headers (W3C ``traceparent``): ingest continues it. A
    record without a string ``customer_id`` and ``usage_id`` gets a trace of its own. The
    send's future is returned (``adapters.broker.Refusals`` watches it)."""
    txn_id, customer = None, None
    with contextlib.suppress(ValueError):
        doc = json.loads(value)
        if isinstance(doc, dict):
            customer, usage = doc.get("customer_id"), doc.get("usage_id")
            if isinstance(customer, str) and isinstance(usage, str):
                txn_id = transaction_id(customer, usage)
    return _send(
        producer, topic, key, value, txn_id, customer if isinstance(customer, str) else None
    )


def _send(  # noqa: PLR0917
    producer: KafkaProducer,
    topic: str,
    key: bytes | None,
    value: bytes,
    txn_id: UUID | None,
    customer: str | None,
) -> Any:
    with telemetry.span(
        "produce usage",
        telemetry.transaction_context(txn_id) if txn_id else None,
        billing__transaction_id=str(txn_id) if txn_id else None,
        billing__customer_id=customer,
    ):
        return producer.send(topic, key=key, value=value, headers=telemetry.inject_headers())
