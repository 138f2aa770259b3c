"""A database as an earlier version of billing-ledger left it: before migrations, every
process ran ``prepare()``, which let eventsourcing create its tables (``CREATE_TABLE=y``,
the stock recorder's DDL) and then ran the DDL of ``legacy_prepare.sql`` (copied from
commit 56a5b80, the same as the last release before it). Its history is of version-1
events (integer amounts rounded per record, one Stripe invoice item per transaction):
``version_1_history`` writes one, ``old_stripe_item`` what that version left in Stripe.
Tests use them to check that the migrations adopt and upgrade such a database."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson
import psycopg
import stripe
from eventsourcing.persistence import StoredEvent

from adapters.settings import Settings
from domain.ids import account_id, transaction_id
from infra.stripe_emulator import StripeEmulator
from store.ledger import BillingLedger
from store.recorder import postgres_env

__all__ = [
    "CHARGED",
    "LEGACY_SQL",
    "RESERVED",
    "legacy_prepare",
    "old_stripe_item",
    "version_1_history",
]

LEGACY_SQL = (Path(__file__).parent / "legacy_prepare.sql").read_text(encoding="utf-8")

TXN = "domain.transaction:BillingTransaction."
ACCOUNT = "domain.account:CustomerAccount."
CHARGED, RESERVED = transaction_id("acme", "old-1"), transaction_id("acme", "old-2")


def legacy_prepare(settings: Settings) -> None:
    """Make the schema the way ``prepare()`` did before migrations (no version table)."""
    env = {**postgres_env(settings.database_url, lock_free=False), "CREATE_TABLE": "y"}
    BillingLedger(settings.load_prices(), env=env).close()  # eventsourcing's own tables
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(LEGACY_SQL.encode())


def old_stripe_item(emulator: StripeEmulator) -> str:
    """What version 1 left in Stripe for ``CHARGED``: its own invoice item (25 cents)."""
    client = stripe.StripeClient("sk_test_x", base_addresses={"api": emulator.url})
    customer = client.v1.customers.create(
        params={"name": "acme", "metadata": {"customer_id": "acme"}},
        options={"idempotency_key": "customer:acme"},
    )
    item = client.v1.invoice_items.create(
        params={"customer": customer.id, "amount": 25, "currency": "usd",
                "metadata": {"txn_id": str(CHARGED), "usage_id": "old-1"}},
        options={"idempotency_key": f"charge:{CHARGED}"},
    )  # fmt: skip
    return str(item.id)


def version_1_history(item_id: str) -> list[StoredEvent]:
    """acme's account, ``CHARGED`` (250 requests, 25 cents, charged as ``item_id``) and
    ``RESERVED`` (400 requests, 40 cents, not charged yet), as version 1 stored them."""
    account = account_id("acme", "USD")
    hexed = {"_type_": "uuid_hex", "_data_": account.hex}
    return [
        _stored(account, 1, ACCOUNT + "Opened", {
            "originator_topic": ACCOUNT.rstrip("."), "customer_id": "acme",
            "currency": "USD", "spend_limit": None,
        }),
        _stored(account, 2, ACCOUNT + "AmountsReserved", {
            "transaction_ids": [str(CHARGED), str(RESERVED)], "amounts": [25, 40],
        }),
        _metered(CHARGED, "old-1", 250),
        _stored(CHARGED, 2, TXN + "Reserved", {"account_id": hexed}),
        _stored(CHARGED, 3, TXN + "Charged", {"stripe_object_id": item_id}),
        _metered(RESERVED, "old-2", 400),
        _stored(RESERVED, 2, TXN + "Reserved", {"account_id": hexed}),
    ]  # fmt: skip


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
