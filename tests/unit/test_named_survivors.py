"""Behaviours outside the audit that mutation testing found unpinned (issue 15): a
reversal of exactly the whole charge, a free meter, and the wall-clock timestamp of
the events the ingest's fast path builds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from domain.account import CustomerAccount
from domain.ids import transaction_id
from domain.metering import Metering
from domain.metering_events import MeteredBatch, meter_batch_events
from domain.periods import PeriodPolicy
from domain.pricing import Price, PriceList
from domain.transaction import BillingTransaction, Source, TxnState
from domain.usage import UsageRecord

A = transaction_id("acme", "req-1")
FREE = PriceList({"free.requests": Price(Decimal(0), "EUR"), "api": Price(Decimal("0.01"), "USD")})


def _usage(meter: str, quantity: int, usage_id: str = "r-1") -> Metering:
    record = UsageRecord(
        usage_id=usage_id,
        customer_id="acme",
        meter=meter,
        quantity=Decimal(quantity),
        occurred_at=datetime(2026, 12, 2, tzinfo=UTC),
    )
    return Metering(record, Source("usage", 0, 1))


def _meter(batch: list[Metering], limit: int) -> MeteredBatch:
    return meter_batch_events(
        batch,
        FREE,
        load_account=lambda c, cur: CustomerAccount.open(c, cur, limit),
        load_line=lambda _: None,
        load_invoice=lambda _: None,
        periods=PeriodPolicy(),
        now=datetime(2026, 12, 15, tzinfo=UTC),
    )


def _charged(amount: Decimal) -> CustomerAccount:
    account = CustomerAccount.open("acme", "USD", 500)
    account.reserve_all([(A, amount)])
    account.settle(A, amount)
    account.collect_events()
    return account


def test_reversing_exactly_the_whole_charge_is_allowed_and_frees_all_of_it() -> None:
    account = _charged(Decimal("37.25"))
    account.reverse_charge(A, Decimal("37.25"))
    assert (account.charged, account.committed, account.available) == (0, 0, 500)


def test_reversing_a_hair_more_than_the_charge_is_refused() -> None:
    account = _charged(Decimal("37.25"))
    with pytest.raises(ValueError, match=r"cannot reverse 0\.3726 USD: only 0\.3725 USD charged"):
        account.reverse_charge(A, Decimal("37.26"))
    assert account.charged == Decimal("37.25")


def test_a_free_meter_prices_any_quantity_at_zero_and_is_reserved_under_a_zero_limit() -> None:
    txn = BillingTransaction.from_usage(
        _usage("free.requests", 10**9).record, FREE, Source("u", 0, 1)
    )
    assert (txn.amount, txn.unit_price, txn.currency) == (Decimal(0), Decimal(0), "EUR")
    batch = _meter([_usage("free.requests", 7)], limit=0)
    (new,) = batch.transactions
    assert (new.amount, new.compensation_reason) == (Decimal(0), None)
    assert isinstance(new.then, BillingTransaction.Reserved)
    (line,) = batch.lines
    assert (line.exact_total, line.billed, line.transactions) == (0, 0, 1)


def test_the_fast_path_stamps_each_event_with_the_time_it_was_built() -> None:
    before = datetime.now(UTC)
    # r-2 is over the limit
    batch = _meter([_usage("api", 3, "r-1"), _usage("api", 9 * 10**6, "r-2")], limit=100)
    after = datetime.now(UTC)
    events = batch.transaction_events
    assert [type(e).__name__ for e in events] == ["Metered", "Reserved", "Metered", "Compensated"]
    for event in events:
        assert event.timestamp.tzinfo is not None
        assert before - timedelta(seconds=1) <= event.timestamp <= after + timedelta(seconds=1)
    refused = batch.transactions[1]
    assert refused.then.originator_version == 2
    rebuilt = refused.then.mutate(refused.metered.mutate(None))
    assert isinstance(rebuilt, BillingTransaction)
    assert rebuilt.state is TxnState.COMPENSATED
