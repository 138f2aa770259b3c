"""Traces and logs: one usage record's path is one trace (trace id = transaction id),
across the Kafka hops and the database, ending with the span of its charge; the pushes of
an invoice line are the line's trace (trace id = line id), linked from each charge; each
step's JSON log line carries the step fields and the trace ids."""

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

from adapters.bootstrap import build_ingest_worker, build_pusher, close_worker
from adapters.broker import make_producer
from adapters.ingest.producer import send_usage
from adapters.observability.logs import JsonFormatter
from adapters.settings import Settings
from domain.ids import transaction_id
from domain.saga import StepResult
from domain.transaction import TxnState
from infra.stripe_emulator import StripeEmulator
from store.ledger import BillingLedger
from tests.drills.support import reserve
from tests.drills.test_charging_drills import _relay_all
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


def test_one_usage_record_is_one_trace_from_the_producer_to_its_recorded_charge(
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
    line = ledger.transaction(txn_id).line_id
    assert line is not None
    assert build_pusher(charge_settings, ledger).push(line).result is StepResult.CHARGED
    assert ledger.transaction(foreign_id).state is TxnState.CHARGED

    finished = spans.get_finished_spans()
    mine = _in_trace(finished, txn_id)
    assert {s.name for s in mine} == {"produce usage", "reserve", "relay publish", "charged"}
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
    _one(mine, "relay publish", **{"billing.event": "Reserved"})

    # The push of the line is a trace of its own (trace id = the line id); each charge
    # it made is a span in its transaction's trace, linked to it.
    pushes = _in_trace(finished, line)
    push = _one(pushes, "push line", **{"billing.result": "charged"})
    assert _attrs(push)["billing.charged"] == 2 and _attrs(push)["billing.requests"] == 3
    stripe_call = _one(pushes, "stripe push_line")
    assert _parent_id(stripe_call) == _span_id(push)
    assert _attrs(stripe_call)["billing.outcome"] == "ok"
    _one(pushes, "relay publish", **{"billing.event": "Settled"})
    charged = _one(mine, "charged")
    assert [link.context.span_id for link in charged.links] == [_span_id(push)]
    assert _attrs(charged)["billing.line_id"] == str(line)

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
    (pushed,) = [line for line in lines if line.get("message") == "line pushed"]
    assert (pushed["step"], pushed["status"], pushed["charged"]) == ("push", "pushed", 2)
    assert pushed["line_id"] == str(line) and pushed["trace_id"] == line.hex
    assert int(pushed["span_id"], 16) == _span_id(push)


def test_a_failed_push_is_traced_and_logged_with_its_error_class_and_retried_in_its_trace(
    spans: InMemorySpanExporter,
    json_lines: Callable[[], list[dict[str, Any]]],
    charge_settings: Settings,
    ledger: BillingLedger,
    emulator: StripeEmulator,
) -> None:
    first = reserve(ledger, 1)
    pusher = build_pusher(charge_settings, ledger)
    line = ledger.transaction(first[0]).line_id
    assert line is not None
    pusher.push(line)  # the customer, the draft and the item exist
    (later,) = reserve(ledger, 1, prefix="later")
    emulator.set_faults(outage=True, outage_mode="503")
    failed_push = pusher.push(line)
    assert failed_push.result is StepResult.RETRY
    emulator.set_faults(outage=False)
    wait_for(
        lambda: (
            pusher.push(line).result is StepResult.CHARGED
            or ledger.transaction(later).state is TxnState.CHARGED
        ),
        what="the retry charged",
    )

    mine = _in_trace(spans.get_finished_spans(), line)
    failed_drive = _one(mine, "push line", **{"billing.result": "retry"})
    charged_drives = [s for s in mine if _attrs(s).get("billing.result") == "charged"]
    root = line.int & 0xFFFF_FFFF_FFFF_FFFF
    assert {_parent_id(s) for s in [failed_drive, *charged_drives]} == {root}
    # The item exists, so the push reads the draft's line items first, to set the new
    # amount in its invoice's one update_lines request: that read is what failed.
    failed = _one(mine, "stripe line_items", **{"billing.outcome": "error"})
    assert _attrs(failed)["error.type"] == "http_503"
    assert failed.status.status_code is StatusCode.ERROR
    assert _parent_id(failed) == _span_id(failed_drive)

    logged = [line_ for line_ in json_lines() if line_.get("line_id") == str(line)]
    retry = next(x for x in logged if x["status"] == "retry")
    assert (retry["step"], retry["error_code"], retry["attempt"]) == ("push", "http_503", 1)
    assert retry["trace_id"] == line.hex
    assert int(retry["span_id"], 16) == _span_id(failed_drive)
    assert [x["status"] for x in logged] == ["pushed", "retry", "pushed"]
