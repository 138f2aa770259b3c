"""``meter_batch_events`` names what it will load before loading it (``expect``), and
cutting a batch's usage into periods once per run of records in the same period
decides the same lines as cutting every record's (the reference, ``meter_batch``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from domain.account import CustomerAccount
from domain.credit_line import CreditLine
from domain.ids import account_id
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine
from domain.metering import Metering, meter_batch
from domain.metering_events import meter_batch_events
from domain.periods import PeriodPolicy
from domain.pricing import Price, PriceList
from domain.transaction import Source
from domain.usage import UsageRecord

PRICES = PriceList(
    {
        "api.requests": Price(Decimal("0.01"), "USD"),
        "eu.gpu.seconds": Price(Decimal("0.01"), "EUR"),
    }
)
NOW = datetime(2027, 1, 20, tzinfo=UTC)


def _usage(
    n: int, at: datetime, *, customer: str = "acme", meter: str = "api.requests"
) -> Metering:
    record = UsageRecord(
        usage_id=f"u-{n}", customer_id=customer, meter=meter, quantity=Decimal(n + 1),
        occurred_at=at,
    )  # fmt: skip
    return Metering(record, Source("usage", 0, n))


def _stored(aggregate: Any) -> Any:
    aggregate.collect_events()  # as if loaded from the store
    return aggregate


def test_expect_names_every_account_and_line_before_the_first_load() -> None:
    """All lines exist and are open: the decision loads exactly what it said it would,
    and only after saying so."""
    periods = PeriodPolicy()
    december = periods.period_of(datetime(2026, 12, 1, tzinfo=UTC))
    calls: list[tuple[str, Any]] = []
    lines: dict[UUID, InvoiceLine] = {}
    for customer, currency, meter in (
        ("acme", "USD", "api.requests"),
        ("acme", "EUR", "eu.gpu.seconds"),
        ("globex", "USD", "api.requests"),
    ):
        line = _stored(InvoiceLine.open(customer, currency, meter, december, None))
        lines[line.id] = line
    batch = [
        _usage(0, december.start),
        _usage(1, december.start + timedelta(days=3), meter="eu.gpu.seconds"),
        _usage(2, december.start + timedelta(days=9), customer="globex"),
        _usage(3, december.start + timedelta(days=30)),
    ]

    def load_account(customer_id: str, currency: str) -> CustomerAccount | None:
        calls.append(("load", account_id(customer_id, currency)))
        return None

    def load_line(line_id: UUID) -> InvoiceLine | None:
        calls.append(("load", line_id))
        return lines.get(line_id)

    def load_invoice(invoice_id: UUID) -> Invoice | None:
        calls.append(("load", invoice_id))
        return None

    decision = meter_batch_events(
        batch, PRICES, load_account=load_account, load_line=load_line,
        load_invoice=load_invoice, periods=periods, now=NOW,
        expect=lambda ids: calls.append(("expect", list(ids))),
    )  # fmt: skip

    assert calls[0][0] == "expect" and all(kind == "load" for kind, _ in calls[1:])
    expected, loaded = calls[0][1], [i for _, i in calls[1:]]
    # 3 accounts, 3 lines, and the credit line of each account's period (none has credit,
    # so none of those is loaded: they cost an id in the one query)
    assert len(expected) == len(set(expected)) == 9
    credit_lines = {
        CreditLine.id_for(c, cur, december) for c, cur in {("acme", "USD"), ("acme", "EUR"),
                                                          ("globex", "USD")}
    }  # fmt: skip
    assert sorted(map(str, loaded)) == sorted(str(i) for i in expected if i not in credit_lines)
    assert {ln.id for ln in decision.lines} == set(lines)


def test_usage_interleaved_across_periods_joins_the_same_lines_as_the_reference() -> None:
    """Records alternate between three months and two hours of one day: reusing the
    period of the record before must not put a record in its neighbour's period."""
    for periods, starts in (
        (PeriodPolicy(), [datetime(2026, 11, 30, 23, 59, 59, 999999, tzinfo=UTC),
                          datetime(2026, 12, 1, tzinfo=UTC),
                          datetime(2027, 1, 1, 5, tzinfo=UTC)]),
        (PeriodPolicy("hour"), [datetime(2026, 12, 1, 9, 59, 59, tzinfo=UTC),
                                datetime(2026, 12, 1, 10, tzinfo=UTC),
                                datetime(2026, 12, 1, 10, 59, tzinfo=UTC)]),
    ):  # fmt: skip
        batch = [_usage(n, starts[n * 7 % 3 if n % 4 else 0]) for n in range(40)]
        loaders: dict[str, Any] = {
            "load_account": lambda c, cur: None,
            "load_line": lambda i: None,
            "load_invoice": lambda i: None,
            "periods": periods,
            "now": NOW,
        }
        reference = meter_batch(batch, PRICES, **loaders)
        fast = meter_batch_events(batch, PRICES, **loaders, expect=lambda ids: None)
        assert [t.line_id for t in reference.transactions] == [
            t.reservation.line_id if t.reservation else None for t in fast.transactions
        ]
        assert len({t.line_id for t in reference.transactions}) == len(
            {periods.period_of(m.record.occurred_at) for m in batch}
        )
