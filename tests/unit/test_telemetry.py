"""Trace and log plumbing without services: ids, parents, the console exporter, JSON lines."""

from __future__ import annotations

import io
import json
import logging
from uuid import UUID

import pytest
from opentelemetry import trace
from pydantic import ValidationError

from adapters.cli.errors import EXIT_USAGE, explain
from adapters.observability import telemetry
from adapters.observability.logs import JsonFormatter, step_fields
from adapters.settings import Settings

TXN = UUID("6f1c2a3b-4d5e-5f60-8a7b-9c0d1e2f3a4b")


def _parent_context(ctx: object) -> trace.SpanContext:
    return trace.get_current_span(ctx).get_span_context()  # type: ignore[arg-type]


def test_a_transaction_context_has_the_transaction_id_as_its_trace_id() -> None:
    parent = _parent_context(telemetry.transaction_context(TXN))
    assert parent.is_valid and parent.is_remote
    assert trace.format_trace_id(parent.trace_id) == TXN.hex
    assert parent.trace_flags.sampled


def test_a_producer_span_in_the_transaction_trace_becomes_the_parent_of_the_ingest_span() -> None:
    produced = trace.SpanContext(TXN.int, 0x1234, is_remote=True)
    headers = [("traceparent", f"00-{TXN.hex}-{0x1234:016x}-01".encode())]
    parent, links = telemetry.usage_parent(headers, TXN)
    assert _parent_context(parent).span_id == produced.span_id
    assert links == []


def test_a_producer_span_of_another_trace_is_linked_and_the_transaction_trace_is_kept() -> None:
    other = "0af7651916cd43dd8448eb211c80319c"
    headers = [("traceparent", f"00-{other}-b7ad6b7169203331-01".encode())]
    parent, links = telemetry.usage_parent(headers, TXN)
    assert _parent_context(parent).trace_id == TXN.int
    assert [trace.format_trace_id(link.context.trace_id) for link in links] == [other]


def test_a_record_without_a_traceparent_starts_in_the_transaction_trace_unlinked() -> None:
    parent, links = telemetry.usage_parent(None, TXN)
    assert _parent_context(parent).trace_id == TXN.int
    assert links == []


def test_the_console_exporter_writes_each_span_as_json_with_the_service_name() -> None:
    out = io.StringIO()
    provider = telemetry.tracer_provider(
        Settings(trace_exporter="console", service_name="billing-test"), out=out
    )
    assert provider is not None
    with provider.get_tracer("test").start_as_current_span(
        "record", attributes={telemetry.TRANSACTION_ID: str(TXN)}
    ):
        pass
    provider.shutdown()  # flushes the batch processor

    span = json.loads(out.getvalue())
    assert span["name"] == "record"
    assert span["attributes"] == {"billing.transaction_id": str(TXN)}
    assert span["resource"]["attributes"]["service.name"] == "billing-test"


def test_no_exporter_by_default_installs_nothing() -> None:
    assert Settings().trace_exporter == "none"
    assert telemetry.tracer_provider(Settings()) is None


def test_an_unknown_exporter_is_a_one_line_settings_error() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(trace_exporter="jaeger")  # type: ignore[arg-type]
    assert explain(caught.value) == (
        "setting BILLING_LEDGER_TRACE_EXPORTER: Input should be 'none', 'console' or 'otlp'",
        EXIT_USAGE,
    )


def test_a_step_log_line_is_one_json_object_with_the_step_fields_and_the_trace_ids() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("test.telemetry")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        logger.info("outside", extra=step_fields("ingest", "ok", records=3))
        with telemetry.span("charge", telemetry.transaction_context(TXN)):
            logger.info(
                "charge retry",
                extra=step_fields("charge", "retry", transaction_id=TXN, error_code="http_503"),
            )
    finally:
        logger.removeHandler(handler)

    outside, inside = (json.loads(line) for line in out.getvalue().splitlines())
    assert outside["message"] == "outside"
    assert (outside["step"], outside["status"], outside["records"]) == ("ingest", "ok", 3)
    assert outside["transaction_id"] is None and outside["error_code"] is None
    assert "trace_id" not in outside
    assert inside["transaction_id"] == str(TXN)
    assert (inside["step"], inside["status"], inside["error_code"]) == (
        "charge",
        "retry",
        "http_503",
    )
    assert inside["trace_id"] == TXN.hex
    assert len(inside["span_id"]) == 16


@pytest.mark.parametrize("txn", [TXN, UUID(int=1 << 64), UUID(int=0xFFFF_FFFF_FFFF_FFFF)])
def test_root_headers_are_what_a_no_op_span_in_the_transaction_trace_injects(txn: UUID) -> None:
    tracer = trace.NoOpTracer()  # what every span is when no tracer provider is installed
    with tracer.start_as_current_span("relay publish", telemetry.transaction_context(txn)):
        injected = telemetry.inject_headers()
    assert telemetry.root_headers(txn) == injected
    assert dict(injected)["traceparent"].decode().split("-")[1] == txn.hex
