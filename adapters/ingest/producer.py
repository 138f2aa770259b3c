"""Producing usage records to the usage topic (the ``produce`` command, the demo, the
benchmarks): each send is a ``produce usage`` span in its transaction's trace."""

from __future__ import annotations

import contextlib
import json

from kafka import KafkaProducer

from adapters.observability import telemetry
from domain.ids import transaction_id

__all__ = ["send_usage"]


def send_usage(producer: KafkaProducer, topic: str, key: bytes | None, value: bytes) -> None:
    """Send one usage record in a ``produce usage`` span of its transaction's trace, with
    the span's context in the headers (W3C ``traceparent``): ingest continues it. A
    record without a string ``customer_id`` and ``usage_id`` gets a trace of its own."""
    txn_id, customer = None, None
    with contextlib.suppress(ValueError):
        doc = json.loads(value)
        if isinstance(doc, dict):
            customer, usage = doc.get("customer_id"), doc.get("usage_id")
            if isinstance(customer, str) and isinstance(usage, str):
                txn_id = transaction_id(customer, usage)
    with telemetry.span(
        "produce usage",
        telemetry.transaction_context(txn_id) if txn_id else None,
        billing__transaction_id=str(txn_id) if txn_id else None,
        billing__customer_id=customer if isinstance(customer, str) else None,
    ):
        producer.send(topic, key=key, value=value, headers=telemetry.inject_headers())
