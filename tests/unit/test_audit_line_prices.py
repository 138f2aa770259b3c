"""The audit of lines priced by quantity (``domain.audit_prices.check_line_prices``): each
record's amount is its increment in settlement order, each line's total is ``f`` of its
quantity, and a line never holds records of another version."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from domain.account import CustomerAccount
from domain.audit import TxnAudit
from domain.audit_lines import LineAudit
from domain.audit_prices import check_line_prices, check_prices
from domain.invoice_line import InvoiceLine
from domain.metering import Metering
from domain.metering_events import MeteredBatch, meter_batch_events
from domain.periods import PeriodPolicy
from domain.price_book import PRICE_BOOK_ID
from domain.pricing import Price, PriceList, Tier
from domain.transaction import Source
from domain.usage import UsageRecord

AT = datetime(2026, 12, 2, 10, tzinfo=UTC)
GRADUATED = Price(
    Decimal(3), "USD", model="graduated",
    tiers=(Tier(10, Decimal(3)), Tier(None, Decimal(1))), flat_fee=Decimal("0.5"),
)  # fmt: skip
PRICES = PriceList({"m": GRADUATED, "flat": Price(Decimal(1), "USD")})
VERSIONS = {(str(PRICE_BOOK_ID), 1): PRICES.to_meters()}


def _batch(quantities: list[int], meter: str = "m") -> MeteredBatch:
    batch = [
        Metering(
            UsageRecord(
                usage_id=f"{meter}{n}", customer_id="acme", meter=meter, quantity=Decimal(q),
                occurred_at=AT + timedelta(seconds=n),
            ),
            Source("usage", 0, n),
        )
        for n, q in enumerate(quantities)
    ]  # fmt: skip
    return meter_batch_events(
        batch, PRICES,
        load_account=CustomerAccount.open,
        load_line=lambda _: None, load_invoice=lambda _: None,
        periods=PeriodPolicy(), now=AT,
    )  # fmt: skip


def _audit(
    result: MeteredBatch, tamper: Any = None
) -> tuple[dict[str, LineAudit], dict[str, TxnAudit]]:
    lines: dict[str, LineAudit] = {}
    for line in result.lines:
        opened, *changes = line.pending_events
        audit = LineAudit.opened(str(line.id), vars(opened))
        for event in changes:
            data = dict(vars(event))
            if tamper is not None:
                tamper(data)
            audit.apply(type(event).__name__, data, event.originator_version)
        lines[audit.line_id] = audit
    txns = {str(t.id): TxnAudit.metered(str(t.id), vars(t.metered)) for t in result.transactions}
    return lines, txns


def test_a_line_priced_by_quantity_audits_clean() -> None:
    result = _batch([4, 8, 3])  # 4 x 3.00 + the 0.50 fee; 6 x 3.00 + 2 x 1.00; 3 x 1.00
    lines, txns = _audit(result)
    assert [t.amount for t in result.transactions] == [1250, 2000, 300]
    assert check_line_prices(lines, txns, VERSIONS) == []
    assert check_prices(txns.values(), VERSIONS) == []
    [line] = lines.values()
    assert (line.quantity, line.price_version) == (15, 1)


def test_an_amount_moved_between_records_is_found_on_both() -> None:
    def tamper(data: dict[str, Any]) -> None:
        data["amounts"] = ["1249", "2001", "300"]  # the same total

    lines, txns = _audit(_batch([4, 8, 3]), tamper)
    findings = check_line_prices(lines, txns, VERSIONS)
    assert [(f.kind, f.subject) for f in findings] == [("price", str(t)) for t in list(txns)[:2]]
    assert "its increment there is 12.50 USD" in findings[0].detail


def test_a_line_total_other_than_f_of_its_quantity_is_found() -> None:
    def tamper(data: dict[str, Any]) -> None:
        data["amounts"] = ["1250", "2000", "301"]
        data["exact_total"] = Decimal(3551)
        data["billed"] = 3551

    lines, txns = _audit(_batch([4, 8, 3]), tamper)
    findings = check_line_prices(lines, txns, VERSIONS)
    assert [f.detail for f in findings if f.subject in lines] == [
        "totals 35.51 USD; f(15) less removals is 35.50 USD"
    ]


def test_a_line_whose_recorded_quantity_is_wrong_is_a_line_problem() -> None:
    def tamper(data: dict[str, Any]) -> None:
        data["quantity"] = Decimal(16)

    lines, _ = _audit(_batch([4, 8, 3]), tamper)
    [line] = lines.values()
    assert line.problems == ["records quantity 16; its records make 15"]


def test_a_record_of_another_version_on_the_line_is_found() -> None:
    result = _batch([4])
    lines, txns = _audit(result)
    [txn] = txns.values()
    txn.priced_by = (str(PRICE_BOOK_ID), 2)
    [finding] = check_line_prices(lines, txns, {**VERSIONS, (str(PRICE_BOOK_ID), 2): {}})
    assert finding.detail == "priced by version 2, on a line of version 1"


def test_a_record_priced_by_quantity_on_a_per_unit_line_is_found() -> None:
    result = _batch([4], meter="flat")
    lines, txns = _audit(result)
    assert check_line_prices(lines, txns, VERSIONS) == []
    [txn] = txns.values()
    txn.meter = "m"  # as if "m" (graduated) had been settled on a per-unit line
    [finding] = check_line_prices(lines, txns, VERSIONS)
    assert finding.detail.startswith("priced by quantity, on per-unit line")


def test_removals_are_taken_from_f_of_the_quantity() -> None:
    period = PeriodPolicy().period_of(AT)
    line = InvoiceLine.open("acme", "USD", "m", period, price_version=1, model="graduated")
    ids = [t.id for t in _batch([4, 8]).transactions]
    entries = [(ids[0], Decimal(1250)), (ids[1], Decimal(2000))]
    line.settle(entries, [Decimal(4), Decimal(8)], tier=2)
    line.remove([(ids[1], Decimal(2000))], "reversed")
    opened, *changes = line.collect_events()
    audit = LineAudit.opened(str(line.id), vars(opened))
    for event in changes:
        audit.apply(type(event).__name__, vars(event), event.originator_version)
    assert (audit.quantity, audit.removed, audit.exact_total) == (12, 2000, 1250)
    assert check_line_prices({audit.line_id: audit}, {}, VERSIONS) == []


def test_a_line_recording_another_model_or_tier_is_found() -> None:
    def tamper(data: dict[str, Any]) -> None:
        data["tier"] = 1  # 15 units reach tier 2

    lines, txns = _audit(_batch([4, 8, 3]), tamper)
    [finding] = check_line_prices(lines, txns, VERSIONS)
    assert finding.detail == (
        "records model graduated, tier 1; its version prices it graduated, tier 2 at 15"
    )
