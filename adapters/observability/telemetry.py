"""OpenTelemetry tracing, kept in one module the domain never imports.

Spans carry ``billing.transaction_id`` and ``billing.customer_id``. One transaction is
one trace, and its trace id IS the transaction id (its 128 bits, as 32 hex digits):
every step that starts work on a transaction without a span to continue (ingest,
the relay, the reconciler) opens its span under ``transaction_context(txn_id)``, a
remote parent derived from the id alone. So no trace context has to be stored in
the events to cross the database, and a trace is found by the transaction id. Across
Kafka the W3C ``traceparent`` travels in the headers (``inject_headers`` /
``extract_headers``), so the charge continues the relay's publish span.

``configure_tracing`` installs the SDK (exporter by settings); with none configured
(the default) the API's no-op tracer makes all of this nearly free.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any
from uuid import UUID

from opentelemetry import context, propagate, trace
from opentelemetry.trace import Link, SpanContext, TraceFlags

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from adapters.settings import Settings

__all__ = [
    "CUSTOMER_ID",
    "TRANSACTION_ID",
    "Span",
    "configure_tracing",
    "current_ids",
    "current_span",
    "end_failed",
    "ending",
    "extract_headers",
    "inject_headers",
    "link_to",
    "root_headers",
    "span",
    "start_span",
    "tracer_provider",
    "tracing_installed",
    "transaction_context",
    "usage_parent",
]

Span = trace.Span
TRANSACTION_ID = "billing.transaction_id"
CUSTOMER_ID = "billing.customer_id"

_tracer = trace.get_tracer("billing-ledger")


@contextmanager
def span(
    name: str,
    parent: context.Context | None = None,
    links: Sequence[Link] = (),
    **attributes: Any,
) -> Iterator[trace.Span]:
    """A current span named ``name``; ``billing__x=v`` becomes attribute ``billing.x``
    (``None`` values are left out). An exception escaping it is recorded on it."""
    attrs = {k.replace("__", "."): v for k, v in attributes.items() if v is not None}
    with _tracer.start_as_current_span(
        name, context=parent, links=links, attributes=attrs
    ) as current:
        yield current


def end_failed(started: trace.Span, exc: BaseException) -> None:
    """End a span from ``start_span`` as failed by ``exc``."""
    started.record_exception(exc)
    started.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    started.end()


@contextmanager
def ending(started: trace.Span) -> Iterator[trace.Span]:
    """Make a span from ``start_span`` current for a while, then end it (an exception
    escaping it is recorded on it)."""
    with trace.use_span(started, end_on_exit=True) as current:
        yield current


def start_span(
    name: str,
    parent: context.Context | None = None,
    links: Sequence[Link] = (),
    start_time: int | None = None,
    **attributes: Any,
) -> trace.Span:
    """A span that is not made current (for spans timed by the caller); end it yourself."""
    attrs = {k.replace("__", "."): v for k, v in attributes.items() if v is not None}
    return _tracer.start_span(
        name, context=parent, links=links, attributes=attrs, start_time=start_time
    )


def transaction_context(txn_id: UUID) -> context.Context:
    """The parent of a transaction's (or an invoice line's) spans: trace id = its id.

    Its span id (the id's low 64 bits) names a root that is never exported, so a
    trace viewer shows the transaction's steps as siblings under a missing root.
    """
    root = SpanContext(
        txn_id.int, _root_span_id(txn_id), is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )  # fmt: skip
    return trace.set_span_in_context(trace.NonRecordingSpan(root))


def _root_span_id(txn_id: UUID) -> int:
    return (txn_id.int & 0xFFFF_FFFF_FFFF_FFFF) or 1


def tracing_installed() -> bool:
    """Whether a tracer provider is installed (``configure_tracing`` with an exporter):
    without one every span is the API's no-op, and what it would carry is known."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def root_headers(txn_id: UUID) -> list[tuple[str, bytes]]:
    """The Kafka headers ``inject_headers`` writes inside a span under
    ``transaction_context(txn_id)`` when no tracer provider is installed (the no-op span
    is its parent: the transaction's root), written without making the span: a hot
    path (the relay, every event) pays for no span it would not record."""
    return [("traceparent", f"00-{txn_id.hex}-{_root_span_id(txn_id):016x}-01".encode())]


def usage_parent(
    headers: Sequence[tuple[str, bytes]] | None, txn_id: UUID
) -> tuple[context.Context, list[Link]]:
    """Where a usage record's ingest span goes: under the producer's span when the
    producer traced it in the transaction's trace (``billing-ledger produce`` does),
    else under ``transaction_context`` with a link to the producer's span, if any."""
    produced = trace.get_current_span(extract_headers(headers)).get_span_context()
    if produced.is_valid and produced.trace_id == txn_id.int:
        return trace.set_span_in_context(trace.NonRecordingSpan(produced)), []
    return transaction_context(txn_id), [Link(produced)] if produced.is_valid else []


def current_span() -> trace.Span:
    """The active span (a no-op one outside any span)."""
    return trace.get_current_span()


def link_to(other: trace.Span) -> Link:
    """A link to ``other`` (a span of another trace this one relates to)."""
    return Link(other.get_span_context())


def inject_headers(parent: context.Context | None = None) -> list[tuple[str, bytes]]:
    """The current (or ``parent``'s) trace context as Kafka headers."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=parent)
    return [(k, v.encode()) for k, v in carrier.items()]


def extract_headers(headers: Sequence[tuple[str, bytes]] | None) -> context.Context:
    """The trace context a producer put in Kafka headers (empty when none)."""
    carrier = {k: v.decode(errors="replace") for k, v in headers or () if v is not None}
    return propagate.extract(carrier)


def current_ids() -> tuple[str, str] | None:
    """The active span's trace id and span id in hex, or None outside any span."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return trace.format_trace_id(ctx.trace_id), trace.format_span_id(ctx.span_id)


# -- SDK setup ------------------------------------------------------------------------


def tracer_provider(settings: Settings, out: IO[str] | None = None) -> TracerProvider | None:
    """A TracerProvider exporting in batches as ``settings.trace_exporter`` says (console:
    one JSON object per span on ``out``, default stdout; otlp: OTLP/HTTP protobuf to
    ``settings.otlp_endpoint``), or None for ``none``."""
    if settings.trace_exporter == "none":
        return None
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )

    exporter: SpanExporter
    if settings.trace_exporter == "console":
        exporter = ConsoleSpanExporter(out=out or sys.stdout)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=settings.otlp_endpoint)
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: settings.service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def configure_tracing(settings: Settings) -> Callable[[], None]:
    """Install the process's tracer provider from settings; returns the shutdown to call
    on exit (it flushes the spans still queued). Call once per process, first thing."""
    provider = tracer_provider(settings)
    if provider is None:
        return lambda: None
    trace.set_tracer_provider(provider)
    return provider.shutdown
