"""``store.ingest_rows.transaction_rows`` writes the rows the events would be stored as:
the mapper's bytes and the recorder's hash chain, for every meter, currency, quantity
and reservation case, under a pinned clock (issue 14).

The whole store under both paths is compared through PostgreSQL in
``tests/integration/test_ingest_rows_stored.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import eventsourcing.domain
import pytest

from domain.account import CustomerAccount
from domain.chain import GENESIS, event_hash
from domain.ids import transaction_id
from domain.metering import Metering
from domain.metering_events import MeteredBatch, NewTransaction, meter_batch_events
from domain.periods import PeriodPolicy
from domain.pricing import Price, PriceList
from domain.transaction import Source
from domain.usage import UsageRecord
from store.ingest_rows import Row, transaction_rows
from store.ledger import BillingLedger

PINNED = datetime(2026, 12, 3, 9, 30, 1, 123456, tzinfo=UTC)
PRICES = PriceList(
    {
        "api.requests": Price(Decimal("0.001"), "USD"),
        "gpt.tokens": Price(Decimal("2.50"), "USD", per=1_000_000),
        "eu.gpu.seconds": Price(Decimal("0.0025"), "EUR"),
        "jp.images": Price(Decimal("3"), "JPY"),
        "kw.calls": Price(Decimal("0.125"), "KWD", per=8),
        "grüße.tokens": Price(Decimal("1.5"), "EUR", per=1000),  # escaped as orjson writes it
    }
)
LINES: dict[str, Any] = {
    "load_line": lambda line_id: None,
    "load_invoice": lambda invoice_id: None,
    "periods": PeriodPolicy("day"),
    "now": datetime(2026, 12, 15, tzinfo=UTC),
}
QUANTITIES = ["0", "1", "1520", "0.000001", "1E+3", "1234567.123456789012345678901", "7.25"]
WHEN = [
    datetime(2026, 12, 2, 10, 15, tzinfo=UTC),
    datetime(2026, 12, 2, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(2026, 12, 3, 0, 30, tzinfo=timezone(timedelta(hours=5, minutes=30))),
]


@pytest.fixture(autouse=True)
def pinned_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(eventsourcing.domain, "datetime_now_with_tzinfo", lambda: PINNED)
    yield


def _batch() -> list[Metering]:
    out = []
    for i, (meter, price) in enumerate(sorted(PRICES.prices.items())):
        for j, quantity in enumerate(QUANTITIES):
            record = UsageRecord(
                usage_id=f"u/{i}:{j}+x=@.-_",
                customer_id=f"cust-{j % 3}",
                meter=meter,
                quantity=Decimal(quantity),
                occurred_at=WHEN[(i + j) % len(WHEN)],
                currency=price.currency if j % 2 else None,
            )
            out.append(Metering(record, Source(f"usage-{i % 2}", j, 10**12 + i * 100 + j)))
    return out


def _decide(batch: list[Metering], accounts: list[CustomerAccount] = ()) -> MeteredBatch:  # type: ignore[assignment]
    by_key = {(a.customer_id, a.currency): a for a in accounts}
    return meter_batch_events(
        batch, PRICES, load_account=lambda c, cur: by_key.get((c, cur)), **LINES
    )


def _reference(transactions: list[NewTransaction]) -> list[Row]:
    """The mapper's stored events, chained as the recorder chains a new aggregate."""
    mapper = BillingLedger(PRICES, env={"PERSISTENCE_MODULE": "eventsourcing.popo"}).mapper
    rows: list[Row] = []
    for txn in transactions:
        prev = GENESIS
        for event in (txn.metered, txn.then):
            stored = mapper.to_stored_event(event)
            digest = event_hash(prev, txn.id, stored.originator_version, stored.topic, stored.state)
            rows.append(
                (txn.id, stored.originator_version, stored.topic, stored.state, prev, digest)
            )
            prev = digest
    return rows


def _rows(decision: MeteredBatch) -> list[Row]:
    mapper = BillingLedger(PRICES, env={"PERSISTENCE_MODULE": "eventsourcing.popo"}).mapper
    return transaction_rows(decision.transactions, mapper.transcoder)


def test_the_rows_of_every_meter_currency_and_quantity_are_the_events_rows() -> None:
    decision = _decide(_batch())
    assert not decision.rejected and not decision.refused
    assert len(decision.transactions) == len(PRICES.prices) * len(QUANTITIES)
    assert _rows(decision) == _reference(decision.transactions)


def test_the_rows_under_a_limit_that_grants_everything_are_the_events_rows() -> None:
    accounts = []
    for customer in ("cust-0", "cust-1", "cust-2"):
        for currency in ("USD", "EUR", "JPY", "KWD"):
            account = CustomerAccount.open(customer, currency, 10**15)
            account.reserve_all([(transaction_id(customer, "earlier"), Decimal("12.5"))])
            account.collect_events()  # as if loaded from the store
            accounts.append(account)
    decision = _decide(_batch(), accounts)
    assert not decision.refused
    assert _rows(decision) == _reference(decision.transactions)


def test_a_refused_transaction_has_no_rows_of_its_own() -> None:
    account = CustomerAccount.open("cust-0", "USD", 0)
    account.collect_events()
    decision = _decide(_batch(), [account])
    assert decision.refused
    with pytest.raises(ValueError, match="not reserved"):
        _rows(decision)
    reserved = [t for t in decision.transactions if t.refusal is None]
    assert transaction_rows(reserved, _transcoder()) == _reference(reserved)


def test_a_value_orjson_cannot_write_is_written_by_the_transcoder() -> None:
    decision = _decide(_batch()[:2])
    decision.transactions[0].fields["per"] = 2**70  # beyond 64 bits: orjson refuses
    rows = transaction_rows(decision.transactions, _transcoder())
    assert rows == _reference(decision.transactions)
    assert b'"per":1180591620717411303424' in rows[0][3]


def _transcoder() -> Any:
    return BillingLedger(PRICES, env={"PERSISTENCE_MODULE": "eventsourcing.popo"}).mapper.transcoder
