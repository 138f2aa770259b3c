"""OpenTelemetry tracing, kept in one module the domain never imports.

Spans carry ``billing.transaction_id`` and ``billing.customer_id``; the trace context
travels in Kafka headers (W3C ``traceparent``), so the relay's publish and the
process manager's charge of one transaction are one trace. With no exporter
configured (the default) the API's no-op tracer makes all of this free.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import context, propagate, trace

__all__ = ["CUSTOMER_ID", "TRANSACTION_ID", "extract_headers", "inject_headers", "span"]

TRANSACTION_ID = "billing.transaction_id"
CUSTOMER_ID = "billing.customer_id"

_tracer = trace.get_tracer("billing-ledger")


@contextmanager
def span(name: str, parent: context.Context | None = None, **attributes: Any) -> Iterator[Any]:
    """A span named ``name`` with billing attributes (``None`` values are left out)."""
    attrs = {k.replace("__", "."): v for k, v in attributes.items() if v is not None}
    with _tracer.start_as_current_span(name, context=parent, attributes=attrs) as current:
        yield current


def inject_headers() -> list[tuple[str, bytes]]:
    """The current trace context as Kafka headers."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [(k, v.encode()) for k, v in carrier.items()]


def extract_headers(headers: Sequence[tuple[str, bytes]] | None) -> context.Context:
    """The trace context a producer put in Kafka headers (empty when none)."""
    carrier = {k: v.decode(errors="replace") for k, v in headers or () if v is not None}
    return propagate.extract(carrier)
