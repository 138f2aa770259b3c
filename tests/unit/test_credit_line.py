"""The invoice's credit line: minus the credit, rounded once per usage line, never more
than the usage it pays for; and the usage lines it names are on its invoice."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import uuid4

import pytest

from domain.account import CustomerAccount
from domain.credit_line import CREDIT_METER, CreditLine
from domain.errors import IllegalTransition
from domain.invoice_line import InvoiceLine
from domain.metering import Metering
from domain.metering_events import meter_batch_events
from domain.money import round_minor
from domain.periods import PeriodPolicy
from domain.pricing import Price, PriceList, Tier
from domain.transaction import Source
from domain.usage import UsageRecord

PERIOD = PeriodPolicy().period_of(datetime(2026, 12, 1, tzinfo=UTC))


def test_the_credit_is_rounded_once_per_usage_line_half_up() -> None:
    line = CreditLine.open_for("acme", "USD", PERIOD)
    a, b, c = uuid4(), uuid4(), uuid4()
    line.apply([(uuid4(), a, Decimal("0.25")), (uuid4(), a, Decimal("0.25"))])  # a: 0.5 -> 1
    line.apply([(uuid4(), b, Decimal("0.5")), (uuid4(), c, Decimal("0.4"))])  # 1, and 0
    # Not round(1.4) = 1: each usage line's credit is rounded as that line is.
    assert (line.billed, line.exact_total, line.transactions) == (-2, Decimal("-1.4"), 4)
    assert (
        line.meter == CREDIT_METER
        and line.invoice_id == InvoiceLine.open("acme", "USD", "api.requests", PERIOD).invoice_id
    )


def test_the_credit_never_exceeds_the_usage_it_pays_for() -> None:
    """Each usage line's credit is at most its exact total: then the rounded credit is at
    most the line's billed total, whatever the fractions (random usage, seeded)."""
    rng = random.Random(7)
    for _ in range(200):
        usage_lines = [uuid4() for _ in range(rng.randint(1, 6))]
        credit = CreditLine.open_for("acme", "USD", PERIOD)
        billed = 0
        for line in usage_lines:
            amounts = [Decimal(rng.randint(0, 300)) / 1000 for _ in range(rng.randint(1, 3))]
            taken = [a * Decimal(rng.randint(0, 100)) / 100 for a in amounts]
            billed += round_minor(sum(amounts, Decimal(0)))
            credit.apply([(uuid4(), line, t) for t in taken])
        assert 0 <= -credit.billed <= billed


def test_a_credit_line_takes_no_usage_and_no_credit_once_frozen() -> None:
    line = CreditLine.open_for("acme", "USD", PERIOD)
    with pytest.raises(IllegalTransition):
        line.settle([(uuid4(), Decimal(1))])
    line.freeze()
    with pytest.raises(IllegalTransition, match="frozen"):
        line.apply([(uuid4(), uuid4(), Decimal(1))])
    line.apply([(uuid4(), uuid4(), Decimal(0))])  # nothing to apply: nothing recorded
    assert line.billed == 0


@pytest.mark.parametrize("tiered", [False, True], ids=["flat", "graduated"])
@pytest.mark.parametrize("grant", [10**9, 5_000])
def test_an_ingest_batch_credits_each_usage_line_what_its_records_consumed(
    grant: int, tiered: bool
) -> None:
    """Through the ingest's decision (``meter_batch_events``), over two meters and two
    batches, priced flat or by line quantity (graduated tiers: decided one record at a
    time): the credit line holds, per usage line, exactly the credit its records
    consumed (every record's whole amount while the grant lasts; the last one it reaches
    in part; none after), and the grant's consumption is their sum."""
    prices = PriceList({
        "api.requests": Price(Decimal("0.01"), "USD"),
        "gpt.tokens": Price(Decimal("2.50"), "USD", per=1_000_000),
    })  # fmt: skip
    if tiered:  # its own rate up to 100,000 units, 90% of it above
        prices = PriceList({
            name: Price(p.unit_price, p.currency, p.per, "graduated",
                        (Tier(100_000, p.unit_price), Tier(None, p.unit_price * Decimal("0.9"))))
            for name, p in prices.prices.items()
        })  # fmt: skip
    now = datetime(2026, 12, 15, tzinfo=UTC)
    account = CustomerAccount.open("acme", "USD", None)
    account.grant_credit(
        "g", grant, effective_at=now - timedelta(days=1), source="promotional", reason="r"
    )
    account.collect_events()
    stored: dict[object, Any] = {account.id: account}
    rng = random.Random(7)
    expected: dict[str, Decimal] = {}
    left = Decimal(grant)
    for b in range(2):
        usage = [
            Metering(
                UsageRecord(
                    usage_id=f"u-{b}-{n}", customer_id="acme",
                    meter=rng.choice(("api.requests", "gpt.tokens")),
                    quantity=Decimal(rng.randint(1, 90_000)), occurred_at=now - timedelta(hours=1),
                ),
                Source("usage", 0, b * 100 + n),
            )
            for n in range(30)
        ]  # fmt: skip
        decision = meter_batch_events(
            usage, prices, load_account=lambda c, cur: stored[account.id],
            load_line=stored.get, load_invoice=stored.get, periods=PeriodPolicy(), now=now,
        )  # fmt: skip
        joined: dict[str, tuple[str, Decimal]] = {}  # transaction: its usage line, amount
        for aggregate in decision.touched:
            for event in aggregate.collect_events():
                if isinstance(event, InvoiceLine.Settled) and not isinstance(aggregate, CreditLine):
                    for txn, text in zip(event.transaction_ids, event.amounts, strict=True):
                        joined[txn] = (str(aggregate.id), Decimal(text))
            stored[aggregate.id] = aggregate
        for metering in usage:  # burnt in the batch's order, across its lines
            line_id, amount = joined[str(metering.transaction_id)]
            take = min(amount, left)
            left -= take
            if take:
                expected[line_id] = expected.get(line_id, Decimal(0)) + take
    credit_lines = [a for a in stored.values() if isinstance(a, CreditLine)]
    assert len(credit_lines) == 1 and len(expected) == 2
    credit_line = credit_lines[0]
    assert credit_line.per_line == expected
    assert credit_line.billed == -sum(round_minor(c) for c in expected.values())
    assert account.grants["g"].consumed == sum(expected.values())
