"""Traces: one transaction's relay publish and charge are one trace across the Kafka hop."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from adapters.ledger import BillingLedger
from adapters.runtime import build_charge_worker, build_charger
from adapters.settings import Settings
from domain.transaction import TxnState
from infra.stripe_emulator import StripeEmulator
from tests.drills.support import reserve
from tests.drills.test_charging_drills import _pump_until, _relay_all

pytestmark = pytest.mark.integration


def test_the_trace_context_travels_from_the_relay_to_the_charge_in_kafka_headers(
    spans: InMemorySpanExporter,
    charge_settings: Settings,
    ledger: BillingLedger,
    emulator: StripeEmulator,
) -> None:
    ids = reserve(ledger, 3)
    _relay_all(charge_settings)
    worker = build_charge_worker(charge_settings, build_charger(charge_settings, ledger))
    try:
        _pump_until(
            worker, lambda: all(ledger.transaction(i).state is TxnState.CHARGED for i in ids)
        )
    finally:
        worker.consumer.close()
        worker.pool.shutdown()

    finished = spans.get_finished_spans()
    published = {
        (s.attributes or {}).get("billing.transaction_id"): s
        for s in finished
        if s.name == "relay publish" and (s.attributes or {}).get("billing.event") == "Reserved"
    }
    charges = {
        (s.attributes or {}).get("billing.transaction_id"): s
        for s in finished
        if s.name == "charge"
    }
    assert set(published) == set(charges) == {str(i) for i in ids}
    for txn_id, charge in charges.items():
        publish = published[txn_id]
        assert charge.context.trace_id == publish.context.trace_id
        assert charge.parent is not None and charge.parent.span_id == publish.context.span_id
        assert (charge.attributes or {}).get("billing.customer_id") == "acme"
        assert (charge.attributes or {}).get("billing.result") == "charged"
