"""``meter_batch`` and existing lines and invoices: usage of a closed period goes late,
onto the first open invoice after it (and not before the current period); a new meter
joins an open invoice; an invoice nothing changed is not saved again."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from uuid import UUID

import pytest

from domain.errors import IllegalTransition
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine
from domain.metering import MAX_LATE_HOPS, Metering, MeteringDecision, meter_batch
from domain.periods import Period, PeriodPolicy
from domain.pricing import Price, PriceList
from domain.transaction import Source
from domain.usage import UsageRecord

PRICES = PriceList(
    {"api.requests": Price(Decimal("0.01"), "USD"), "gpu.s": Price(Decimal(1), "USD")}
)
MONTHLY = PeriodPolicy()
AT = datetime(2026, 12, 2, 10, 15, tzinfo=UTC)
DEC = MONTHLY.period_of(AT)
JAN = MONTHLY.next(DEC)
FEB = MONTHLY.next(JAN)
MAR = MONTHLY.next(FEB)


def _usage(usage_id: str, meter: str = "api.requests", quantity: int = 7) -> Metering:
    record = UsageRecord(
        usage_id=usage_id,
        customer_id="acme",
        meter=meter,
        quantity=Decimal(quantity),
        occurred_at=AT,
    )
    return Metering(record=record, source=Source("usage", 0, 1))


def _invoice(period: Period, *, closed: bool) -> Invoice:
    """An invoice as loaded from the store (nothing pending), with one other line."""
    other = InvoiceLine.open("acme", "USD", "storage.gb", period)
    invoice = Invoice.open("acme", "USD", period, other.id)
    if closed:
        invoice.close("closed early by hand")
    invoice.collect_events()
    return invoice


def _meter(
    batch: list[Metering],
    invoices: list[Invoice],
    lines: Sequence[InvoiceLine] = (),
    now: datetime = AT,
) -> MeteringDecision:
    by_invoice = {i.id: i for i in invoices}
    by_line = {line.id: line for line in lines}
    return meter_batch(
        batch,
        PRICES,
        load_account=lambda customer_id, currency: None,
        load_line=by_line.get,
        load_invoice=by_invoice.get,
        periods=MONTHLY,
        now=now,
    )


def test_usage_of_a_closed_period_joins_a_late_line_on_the_next_period() -> None:
    decision = _meter([_usage("u-1")], [_invoice(DEC, closed=True)])
    [line] = decision.lines
    assert (line.meter, line.period, line.late_of_start) == ("api.requests", JAN, DEC.start)
    [invoice] = decision.invoices
    assert (invoice.period_start, invoice.lines) == (JAN.start, [line.id])


def test_late_usage_goes_no_earlier_than_the_current_period() -> None:
    now = datetime(2027, 3, 9, tzinfo=UTC)
    decision = _meter([_usage("u-1")], [_invoice(DEC, closed=True)], now=now)
    [line] = decision.lines
    assert (line.period, line.late_of_start) == (MAR, DEC.start)


def test_late_usage_passes_every_closed_invoice_after_its_period() -> None:
    closed = [_invoice(p, closed=True) for p in (DEC, JAN, FEB)]
    decision = _meter([_usage("u-1", "gpu.s")], closed)
    [line] = decision.lines
    assert (line.meter, line.period, line.late_of_start) == ("gpu.s", MAR, DEC.start)


def test_usage_with_every_invoice_after_it_closed_is_refused_saying_how_far_it_looked() -> None:
    closed = _invoice(DEC, closed=True)

    def always_closed(invoice_id: UUID) -> Invoice:
        return closed

    message = f"no open invoice within {MAX_LATE_HOPS} periods after 2026-12-01T00:00:00Z"
    with pytest.raises(IllegalTransition, match=f"^{re.escape(message)}$"):
        meter_batch(
            [_usage("u-1")],
            PRICES,
            load_account=lambda customer_id, currency: None,
            load_line=lambda line_id: None,
            load_invoice=always_closed,
            periods=MONTHLY,
            now=AT,
        )


def test_a_new_meter_is_added_to_its_open_invoice() -> None:
    invoice = _invoice(DEC, closed=False)
    decision = _meter([_usage("u-1")], [invoice])
    [line] = decision.lines
    assert decision.invoices == [invoice]
    assert invoice.lines[-1] == line.id
    assert len(invoice.lines) == 2


def test_an_invoice_whose_line_already_exists_is_not_saved_again() -> None:
    invoice = _invoice(DEC, closed=False)
    line = InvoiceLine.open("acme", "USD", "api.requests", DEC)
    invoice.add_line(line.id)
    invoice.collect_events()
    line.collect_events()
    decision = _meter([_usage("u-1")], [invoice], [line])
    assert decision.lines == [line]
    assert decision.invoices == []
    assert line.transactions == 1
