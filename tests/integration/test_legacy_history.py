"""A history written by the ledger before exact amounts and invoice lines existed
(version 1 events: integer amounts rounded per record, one Stripe invoice item per
transaction) loads, audits clean against Stripe, and its open transactions join lines.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import orjson
import pytest
import stripe
from eventsourcing.persistence import StoredEvent

from adapters.audit.replay import Scope
from adapters.audit.report import audit, stripe_invoice_items
from adapters.bootstrap import build_projector, build_pusher, build_reconciler, build_scheduler
from adapters.settings import Settings
from domain.ids import account_id, transaction_id
from domain.transaction import TxnState
from infra.stripe_emulator import StripeEmulator
from store.connections import Database
from store.ledger import BillingLedger

pytestmark = pytest.mark.integration

TXN = "domain.transaction:BillingTransaction."
ACCOUNT = "domain.account:CustomerAccount."


def _stored(originator: UUID, version: int, topic: str, state: dict[str, Any]) -> StoredEvent:
    at = {"_type_": "datetime_iso", "_data_": datetime.now(UTC).isoformat()}
    return StoredEvent(originator, version, topic, orjson.dumps({"timestamp": at, **state}))


def _metered(txn: UUID, usage_id: str, quantity: int) -> StoredEvent:
    return _stored(
        txn,
        1,
        TXN + "Metered",
        {
            "originator_topic": TXN.rstrip("."),
            "customer_id": "acme",
            "usage_id": usage_id,
            "meter": "api.requests",
            "quantity": {"_type_": "decimal_str", "_data_": str(quantity)},
            "unit_price": {"_type_": "decimal_str", "_data_": "0.001"},
            "per": 1,
            "amount": quantity // 10,  # 0.1 cent a request, rounded per record (v1)
            "currency": "USD",
            "occurred_at": {"_type_": "datetime_iso", "_data_": "2026-12-01T10:00:00+00:00"},
            "source": f"usage/0@{usage_id}",
        },
    )


def _write_version_1_history(ledger: BillingLedger, item_id: str) -> tuple[UUID, UUID]:
    charged, reserved = transaction_id("acme", "old-1"), transaction_id("acme", "old-2")
    account = account_id("acme", "USD")
    hexed = {"_type_": "uuid_hex", "_data_": account.hex}
    ledger.recorder.insert_events(
        [
            _stored(account, 1, ACCOUNT + "Opened", {
                "originator_topic": ACCOUNT.rstrip("."), "customer_id": "acme",
                "currency": "USD", "spend_limit": None,
            }),
            _stored(account, 2, ACCOUNT + "AmountsReserved", {
                "transaction_ids": [str(charged), str(reserved)], "amounts": [25, 40],
            }),
            _metered(charged, "old-1", 250),
            _stored(charged, 2, TXN + "Reserved", {"account_id": hexed}),
            _stored(charged, 3, TXN + "Charged", {"stripe_object_id": item_id}),
            _metered(reserved, "old-2", 400),
            _stored(reserved, 2, TXN + "Reserved", {"account_id": hexed}),
        ]
    )  # fmt: skip
    return charged, reserved


def test_a_history_from_before_lines_audits_clean_and_its_open_transaction_joins_a_line(
    stripe_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    # What the previous version left in Stripe: one invoice item for the charged record.
    client = stripe.StripeClient("sk_test_x", base_addresses={"api": emulator.url})
    customer = client.v1.customers.create(
        params={"name": "acme", "metadata": {"customer_id": "acme"}},
        options={"idempotency_key": "customer:acme"},
    )
    charged, reserved = transaction_id("acme", "old-1"), transaction_id("acme", "old-2")
    item = client.v1.invoice_items.create(
        params={"customer": customer.id, "amount": 25, "currency": "usd",
                "metadata": {"txn_id": str(charged), "usage_id": "old-1"}},
        options={"idempotency_key": f"charge:{charged}"},
    )  # fmt: skip
    _write_version_1_history(ledger, item.id)
    assert ledger.transaction(charged).amount == Decimal(25)
    assert ledger.transaction(reserved).line_id is None

    def audited() -> list[str]:
        with build_projector(stripe_settings, ledger) as projector:
            projector.pump_all()
        report = audit(
            Database(stripe_settings.database_url),
            Scope(),
            horizon=stripe_settings.overdue_after(),
            stripe_items=lambda: stripe_invoice_items(stripe_settings.stripe()),
            progress=False,
        )
        return [f"{f.kind} {f.subject}: {f.detail}" for f in report.findings]

    assert audited() == []

    pusher = build_pusher(stripe_settings, ledger)
    reconciler = build_reconciler(stripe_settings, pusher, build_scheduler(stripe_settings, pusher))
    assert reconciler.pass_once().adopted == 1
    adopted = ledger.transaction(reserved)
    assert adopted.line_id is not None and adopted.state is TxnState.RESERVED
    pusher.push(adopted.line_id)
    assert ledger.transaction(reserved).state is TxnState.CHARGED
    assert reconciler.pass_once().adopted == 0  # joined one line, once
    assert audited() == []
    lines = [i for i in emulator.live_invoice_items() if "line_id" in i["metadata"]]
    assert [i["amount"] for i in lines] == [40]  # the old integer amount, now on a line
