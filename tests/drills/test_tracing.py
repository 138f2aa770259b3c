"""Traces and logs: one usage record's path is one trace (trace id = transaction id),
across the Kafka hops and the database; each step's span carries the transaction id;
each step's JSON log line carries the step fields and the trace ids."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from uuid import UUID

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from adapters.bootstrap import (
    build_charge_worker,
    build_charger,
    build_ingest_worker,
    build_reconciler,
    close_worker,
)
from adapters.broker import make_producer
from adapters.ingest.producer import send_usage
from adapters.observability.logs import JsonFormatter
from adapters.settings import Settings
from domain.ids import transaction_id
from domain.transaction import TxnState
from infra.stripe_emulator import StripeEmulator
from store.ledger import BillingLedger
from tests.drills.support import reserve
from tests.drills.test_charging_drills import _pump_until, _relay_all
from tests.integration.support import drive, usage, wait_for

pytestmark = pytest.mark.integration

FOREIGN_TRACE = 0x0AF7651916CD43DD8448EB211C80319C
FOREIGN_SPAN = 0xB7AD6B7169203331


@pytest.fixture
def json_lines() -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """Every log line of the test as the workers write them (JsonFormatter), parsed."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield lambda: [json.loads(line) for line in out.getvalue().splitlines()]
    root.removeHandler(handler)
    root.setLevel(level)


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _one(spans: Sequence[ReadableSpan], name: str, **attrs: Any) -> ReadableSpan:
    found = [
        s for s in spans if s.name == name and all(_attrs(s).get(k) == v for k, v in attrs.items())
    ]
    assert len(found) == 1, (name, attrs, [(s.name, _attrs(s)) for s in spans])
    return found[0]


def _in_trace(spans: Sequence[ReadableSpan], txn_id: UUID) -> list[ReadableSpan]:
    return [s for s in spans if s.context is not None and s.context.trace_id == txn_id.int]


def _parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def _span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def test_one_usage_record_is_one_trace_from_the_producer_to_the_recorded_charge(
    spans: InMemorySpanExporter,
    json_lines: Callable[[], list[dict[str, Any]]],
    charge_settings: Settings,
    ledger: BillingLedger,
    emulator: StripeEmulator,
) -> None:
    traced, foreign = usage("trace-1", quantity=2000), usage("trace-2", quantity=3000)
    txn_id, foreign_id = transaction_id("acme", "trace-1"), transaction_id("acme", "trace-2")
    producer = make_producer(charge_settings.kafka_bootstrap)
    topic = charge_settings.usage_topic
    send_usage(producer, topic, b"acme", traced.to_json())  # as `billing-ledger produce` does
    traceparent = f"00-{FOREIGN_TRACE:032x}-{FOREIGN_SPAN:016x}-01".encode()  # its own trace
    producer.send(
        topic, key=b"acme", value=foreign.to_json(), headers=[("traceparent", traceparent)]
    )
    producer.send(topic, key=b"acme", value=b'{"usage_id": ')  # a dead letter
    producer.flush()
    producer.close()

    worker = build_ingest_worker(charge_settings, ledger)
    try:
        drive(worker, until=lambda: worker.stats.records == 3)
    finally:
        close_worker(worker)
    _relay_all(charge_settings)
    charges = build_charge_worker(charge_settings, build_charger(charge_settings, ledger))
    try:
        _pump_until(
            charges,
            lambda: all(
                ledger.transaction(i).state is TxnState.CHARGED for i in (txn_id, foreign_id)
            ),
        )
    finally:
        charges.consumer.close()
        charges.pool.shutdown()

    finished = spans.get_finished_spans()
    mine = _in_trace(finished, txn_id)
    assert {s.name for s in mine} == {
        "produce usage", "reserve", "relay publish", "charge", "stripe charge", "record",
    }  # fmt: skip
    for s in mine:
        assert _attrs(s).get("billing.transaction_id") == str(txn_id), (s.name, _attrs(s))
        assert _attrs(s)["billing.customer_id"] == "acme", s.name

    produced = _one(mine, "produce usage")
    reserved = _one(mine, "reserve")
    assert _parent_id(reserved) == _span_id(produced)  # ingest continued the producer's span
    assert _attrs(reserved)["billing.result"] == "reserved"
    batches = {_span_id(s): s for s in finished if s.name == "ingest batch"}
    (batch_link,) = reserved.links
    assert batch_link.context.span_id in batches  # the batch span is its own trace, linked
    assert sum(_attrs(b)["billing.records"] for b in batches.values()) == 3

    publish = _one(mine, "relay publish", **{"billing.event": "Reserved"})
    charge = _one(mine, "charge")
    assert _parent_id(charge) == _span_id(publish)  # across the billing.events hop
    stripe_call = _one(mine, "stripe charge")
    recorded = _one(mine, "record")
    assert _parent_id(stripe_call) == _parent_id(recorded) == _span_id(charge)
    assert _attrs(stripe_call)["billing.outcome"] == "ok"
    assert _attrs(stripe_call)["http.response.status_code"] == 200
    assert _attrs(recorded)["billing.events"] == "Charged"

    # A producer tracing in its own trace: linked from the transaction's trace.
    theirs = _one(_in_trace(finished, foreign_id), "reserve")
    assert [(link.context.trace_id, link.context.span_id) for link in theirs.links[:1]] == [
        (FOREIGN_TRACE, FOREIGN_SPAN)
    ]

    lines = json_lines()
    (summary,) = [line for line in lines if line["message"] == "ingest batch"]
    assert (summary["step"], summary["status"], summary["records"]) == ("ingest", "ok", 3)
    assert summary["dead_letters"] == 1
    assert int(summary["trace_id"], 16) == batches[int(summary["span_id"], 16)].context.trace_id
    (letter,) = [line for line in lines if line.get("status") == "dead_letter"]
    assert letter["error_code"] == "not_json" and letter["reason"].startswith("not valid JSON")
    charged = [line for line in lines if line.get("transaction_id") == str(txn_id)]
    assert [(line["step"], line["status"]) for line in charged] == [
        ("charge", "attempted"),
        ("charge", "charged"),
    ]
    for line in charged:
        assert line["trace_id"] == txn_id.hex
        assert int(line["span_id"], 16) == _span_id(charge)
        assert line["error_code"] is None


def test_a_failed_stripe_call_is_traced_and_logged_with_its_error_class_and_retried_in_one_trace(
    spans: InMemorySpanExporter,
    json_lines: Callable[[], list[dict[str, Any]]],
    charge_settings: Settings,
    ledger: BillingLedger,
    emulator: StripeEmulator,
) -> None:
    (txn_id,) = reserve(ledger, 1)
    charger = build_charger(charge_settings, ledger)
    charger.stripe.customer("acme")
    reconciler = build_reconciler(charge_settings, charger)
    emulator.set_faults(outage=True, outage_mode="503")
    wait_for(lambda: reconciler.pass_once().driven, what="the stale transaction driven")
    assert ledger.transaction(txn_id).state is TxnState.CHARGE_FAILED
    emulator.set_faults(outage=False)
    wait_for(
        lambda: (
            reconciler.pass_once().driven and ledger.transaction(txn_id).state is TxnState.CHARGED
        ),
        what="the retry charged",
    )

    mine = _in_trace(spans.get_finished_spans(), txn_id)
    failed_drive = _one(mine, "reconcile", **{"billing.result": "retry"})
    charged_drive = _one(mine, "reconcile", **{"billing.result": "charged"})
    root = txn_id.int & 0xFFFF_FFFF_FFFF_FFFF
    assert _parent_id(failed_drive) == _parent_id(charged_drive) == root
    failed = _one(mine, "stripe charge", **{"billing.outcome": "error"})
    assert _attrs(failed)["error.type"] == "http_503"
    assert _attrs(failed)["http.response.status_code"] == 503
    assert _attrs(failed)["billing.retryable"] is True
    assert failed.status.status_code is StatusCode.ERROR
    assert _parent_id(failed) == _span_id(failed_drive)
    ok = _one(mine, "stripe charge", **{"billing.outcome": "ok"})
    assert _parent_id(ok) == _span_id(charged_drive)
    assert _attrs(_one(mine, "record", **{"billing.events": "ChargeFailed"}))[
        "billing.transaction_id"
    ] == str(txn_id)
    assert _parent_id(_one(mine, "record", **{"billing.events": "Charged"})) == _span_id(
        charged_drive
    )

    lines = [line for line in json_lines() if line.get("transaction_id") == str(txn_id)]
    retry = next(line for line in lines if line["status"] == "retry" and line["step"] == "charge")
    assert retry["error_code"] == "http_503"
    assert retry["trace_id"] == txn_id.hex
    assert int(retry["span_id"], 16) == _span_id(failed_drive)
    assert [(line["step"], line["status"]) for line in lines if line["step"] == "reconcile"] == [
        ("reconcile", "retry"),
        ("reconcile", "charged"),
    ]
