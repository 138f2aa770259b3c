"""``domain.contract``: per-customer overrides and minimums, and which price a record pays."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from domain import ids
from domain.closing import TRUE_UP_METER, is_true_up, true_up_lines, true_ups
from domain.contract import (
    Contract,
    ContractError,
    ContractTerms,
    discounted,
    true_up,
)
from domain.credit_line import CreditLine
from domain.errors import InvalidUsage
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine
from domain.money import MAX_ITEM_AMOUNT
from domain.periods import PeriodPolicy
from domain.price_book import PriceBook
from domain.pricing import Price, PriceList
from domain.transaction import BillingTransaction, Source, price_of_record
from domain.usage import UsageRecord
from tests.fast.fakes import memory_ledger

JAN = datetime(2027, 1, 1, tzinfo=UTC)
FEB = datetime(2027, 2, 1, tzinfo=UTC)
TICK = timedelta(microseconds=1)
LIST = PriceList(
    {
        "in": Price(Decimal("2.50"), "USD", 1_000_000),
        "out": Price(Decimal("10"), "USD", 1_000_000),
        "eur": Price(Decimal("0.01"), "EUR"),
    }
)
SOURCE = Source("usage", 0, 1)


def _terms(text: str) -> ContractTerms:
    return ContractTerms.from_toml(text, LIST)


def _record(customer: str, meter: str, quantity: str, at: datetime) -> UsageRecord:
    return UsageRecord.model_validate(
        {"customer_id": customer, "usage_id": f"{meter}-{at.isoformat()}", "meter": meter,
         "quantity": quantity, "occurred_at": at.isoformat()}
    )  # fmt: skip


def _contract(*versions: tuple[str, datetime], customer: str = "acme") -> Contract:
    contract = Contract(customer)
    for text, moment in versions:
        contract.set(_terms(text), moment)
    return contract


DISCOUNT = '[meters.in]\ndiscount = "12.5"\n'
REPLACE = '[meters.out]\nunit_price = "8"\ncurrency = "USD"\nper = 1000000\n'


# ---------------------------------------------------------------------------------------------
# Identity


def test_a_contracts_id_is_derived_from_its_customer_alone() -> None:
    namespace = uuid.UUID("7d3e9b20-5a1c-5f64-8e2b-1c9f4a6d0e35")
    assert ids.contract_id("acme") == uuid.uuid5(namespace, "acme")
    assert Contract("acme").id == ids.contract_id("acme") != ids.contract_id("acme2")
    assert ids.contract_id("acme") not in {ids.customer_link_id("acme"), ids.price_book_id()}


# ---------------------------------------------------------------------------------------------
# Checking a contract file: whole, every problem with its reason


def test_a_discount_and_a_replacement_are_read_from_the_file() -> None:
    terms = _terms(DISCOUNT + REPLACE + '[minimum]\nUSD = "100.00"\n')
    assert terms.overrides["in"].discount == Decimal("12.5")
    assert terms.overrides["out"].price == Price(Decimal(8), "USD", 1_000_000)
    assert terms.minimums == {"USD": 10_000}


def test_every_problem_of_a_file_is_listed_with_its_reason() -> None:
    text = (
        '[meters.nope]\ndiscount = "5"\n'
        '[meters.in]\ndiscount = "100.5"\n'
        '[meters.out]\nunit_price = "8"\ncurrency = "EUR"\n'
        '[meters.eur]\nunit_price = "-1"\ncurrency = "EUR"\n'
        '[minimum]\nUSD = "-3"\n'
        "[other]\n"
    )
    with pytest.raises(ContractError) as raised:
        _terms(text)
    problems = raised.value.problems
    assert len(problems) == 6, problems
    joined = "\n".join(problems)
    assert "'other'" in joined
    assert "meter 'nope': not in the price book" in joined
    assert "discount '100.5' is not a percentage from 0 to 100" in joined
    assert "currency EUR differs from its list price's (USD)" in joined
    assert "unit_price must be a number >= 0" in joined
    assert "minimum USD: '-3' is not a non-negative amount" in joined


@pytest.mark.parametrize("discount", ["-1", "100.0001", "nan", "abc", "1.0000001", "true"])
def test_a_bad_discount_is_refused(discount: str) -> None:
    with pytest.raises(ContractError, match="meter 'in': discount"):
        _terms(f'[meters.in]\ndiscount = "{discount}"\n'.replace('"true"', "true"))


def test_a_discount_that_makes_a_rate_beyond_exact_digits_is_refused() -> None:
    long = PriceList({"in": Price(Decimal("1." + "3" * 36), "USD")})
    with pytest.raises(ContractError, match="not exact"):
        ContractTerms.from_toml('[meters.in]\ndiscount = "12.5"\n', long)
    assert ContractTerms.from_toml('[meters.in]\ndiscount = "0"\n', long)  # 0 % is exact


def test_discounts_of_0_and_100_percent_are_the_list_price_and_free() -> None:
    price = LIST.prices["in"]
    assert discounted(price, Decimal(0)).unit_price == Decimal("2.50")
    assert discounted(price, Decimal(100)).unit_price == 0
    assert discounted(price, Decimal("12.5")).unit_price == Decimal("2.1875")


def test_a_minimum_beyond_one_stripe_item_or_with_too_many_decimals_is_refused() -> None:
    with pytest.raises(ContractError, match="above"):
        _terms(f'[minimum]\nUSD = "{MAX_ITEM_AMOUNT / 100 + 1}"\n')
    with pytest.raises(ContractError, match="more decimals"):
        _terms('[minimum]\nUSD = "1.001"\n')
    with pytest.raises(ContractError, match="write it as text"):
        _terms("[minimum]\nUSD = 1.5\n")


def test_an_empty_contract_is_refused() -> None:
    with pytest.raises(ContractError, match="overrides no meter and sets no minimum"):
        _terms("")


def test_a_moment_without_a_time_zone_is_refused_and_nothing_is_recorded() -> None:
    contract = Contract("acme")
    with pytest.raises(ContractError, match="no time zone"):
        contract.set(_terms(DISCOUNT), datetime(2027, 1, 1))
    assert contract.versions == []
    assert len(contract.pending_events) == 1  # Opened only


# ---------------------------------------------------------------------------------------------
# Which version is in force, and what a record pays


def test_the_version_in_force_is_the_latest_effective_and_none_before_the_first() -> None:
    contract = _contract((DISCOUNT, JAN), (REPLACE, FEB))
    schedule = contract.schedule
    assert schedule.at(JAN - TICK) is None
    assert schedule.at(JAN).number == 1  # type: ignore[union-attr]
    assert schedule.at(FEB - TICK).number == 1  # type: ignore[union-attr]
    assert schedule.at(FEB).number == 2  # type: ignore[union-attr]
    later_zone = timezone(timedelta(hours=-5))
    contract.set(_terms(DISCOUNT), datetime(2027, 1, 31, 19, tzinfo=later_zone))  # = FEB in UTC
    assert contract.schedule.at(FEB).number == 3  # type: ignore[union-attr]


def test_a_record_is_priced_by_the_contract_when_it_overrides_the_meter() -> None:
    book = PriceBook.start(LIST)
    contract = _contract((DISCOUNT, JAN))
    schedule = book.schedule.with_contracts({"acme": contract.schedule})
    mine = price_of_record(_record("acme", "in", "1000000", JAN), schedule)
    assert (mine.contract_version, mine.price.unit_price) == (1, Decimal("2.1875"))
    other_meter = price_of_record(_record("acme", "out", "1", JAN), schedule)
    assert (other_meter.contract_version, other_meter.price) == (None, LIST.prices["out"])
    other_customer = price_of_record(_record("beta", "in", "1", JAN), schedule)
    assert (other_customer.contract_version, other_customer.price) == (None, LIST.prices["in"])
    before = price_of_record(_record("acme", "in", "1", JAN - TICK), schedule)
    assert before.contract_version is None


def test_a_contract_effective_mid_period_prices_only_usage_from_its_moment() -> None:
    book = PriceBook.start(LIST)
    mid = JAN + timedelta(days=15)
    schedule = book.schedule.with_contracts({"acme": _contract((REPLACE, mid)).schedule})
    early = BillingTransaction.from_usage(
        _record("acme", "out", "1000000", mid - TICK), schedule, SOURCE
    )
    late = BillingTransaction.from_usage(_record("acme", "out", "1000000", mid), schedule, SOURCE)
    assert (early.amount, early.contract_version) == (1000, None)
    assert (late.amount, late.contract_version) == (800, 1)


def test_a_discount_follows_the_list_price_in_force() -> None:
    book = PriceBook.start(LIST)
    book.publish(PriceList({**LIST.prices, "in": Price(Decimal(4), "USD", 1_000_000)}), FEB)
    schedule = book.schedule.with_contracts({"acme": _contract((DISCOUNT, JAN)).schedule})
    jan = price_of_record(_record("acme", "in", "1", JAN), schedule)
    feb = price_of_record(_record("acme", "in", "1", FEB), schedule)
    assert (jan.version.number, jan.price.unit_price) == (1, Decimal("2.1875"))
    assert (feb.version.number, feb.price.unit_price) == (2, Decimal("3.5"))


def test_a_replacement_in_another_currency_than_the_list_then_cannot_price_the_meter() -> None:
    book = PriceBook.start(LIST)
    book.publish(PriceList({**LIST.prices, "out": Price(Decimal(1), "EUR")}), FEB)
    schedule = book.schedule.with_contracts({"acme": _contract((REPLACE, JAN)).schedule})
    with pytest.raises(
        InvalidUsage, match="contract prices the meter in USD, the price book in EUR"
    ):
        price_of_record(_record("acme", "out", "1", FEB), schedule)


# ---------------------------------------------------------------------------------------------
# Minimums


def test_the_minimum_of_a_period_is_the_version_in_force_at_its_last_moment() -> None:
    contract = _contract(('[minimum]\nUSD = "100"\n', JAN), ('[minimum]\nUSD = "50"\n', FEB))
    schedule = contract.schedule
    assert schedule.minimum_for(FEB, "USD") == (1, 10_000)  # January ends at FEB
    assert schedule.minimum_for(FEB + TICK, "USD") == (2, 5_000)
    assert schedule.minimum_for(FEB, "EUR") is None
    assert schedule.minimum_for(JAN, "USD") is None  # December: before the contract


def test_the_true_up_is_the_shortfall_and_never_negative() -> None:
    assert true_up(10_000, 2_501) == 7_499
    assert true_up(10_000, 10_000) == 0
    assert true_up(10_000, 12_000) == 0


# ---------------------------------------------------------------------------------------------
# Stored


def test_a_contract_loads_from_its_events_as_it_was_set() -> None:
    ledger = memory_ledger()
    version = ledger.set_contract("acme", _terms(DISCOUNT + REPLACE), JAN)
    ledger.set_contract("acme", _terms('[minimum]\nJPY = "5000"\n'), FEB)
    loaded = ledger.contract("acme")
    assert loaded is not None
    assert [v.number for v in loaded.versions] == [1, 2]
    assert loaded.versions[0].overrides == version.overrides
    assert loaded.versions[1].minimums == {"JPY": 5000}
    assert ledger.contract("beta") is None


def test_the_ledger_prices_by_a_contract_set_after_it_started() -> None:
    ledger = memory_ledger()
    assert ledger.refresh_contracts({"acme", "beta"}) == {}
    ledger.set_contract("acme", _terms(DISCOUNT), JAN)
    first = ledger.refresh_contracts({"acme", "beta"})
    assert list(first) == ["acme"]
    assert [v.number for v in first["acme"].versions] == [1]
    ledger.set_contract("acme", _terms(REPLACE), FEB)
    assert [v.number for v in ledger.refresh_contracts({"acme"})["acme"].versions] == [1, 2]


# ---------------------------------------------------------------------------------------------
# The true-up line a close adds


def _closing(
    usage: int, minimum: str | None, meters: str = ""
) -> tuple[Invoice, list[InvoiceLine], Contract]:
    period = PeriodPolicy.parse("month").period_of(JAN)
    line = InvoiceLine.open("acme", "USD", "in", period)
    line.settle([(uuid.uuid4(), Decimal(usage))])
    invoice = Invoice.open("acme", "USD", period, line.id)
    contract = Contract("acme")
    if minimum is not None or meters:
        whole = "" if minimum is None else f'USD = "{minimum}"\n'
        contract.set(_terms(f"[minimum]\n{whole}{meters}"), JAN - TICK)
    return invoice, [line], contract


def test_a_close_below_the_minimum_adds_a_true_up_line_of_the_shortfall() -> None:
    invoice, lines, contract = _closing(2_499, "100.00")
    [line] = true_up_lines(invoice, lines, contract.schedule)
    assert (line.meter, line.billed, line.exact_total) == (TRUE_UP_METER, 7_501, 7_501)
    assert line.invoice_id == invoice.id
    assert line.id == InvoiceLine.create_id("acme", "USD", TRUE_UP_METER, invoice.period_start)
    settled = [e for e in line.pending_events if isinstance(e, InvoiceLine.Settled)]
    assert settled[0].transaction_ids == [str(ids.true_up_id(invoice.id, TRUE_UP_METER))]


def test_the_prepaid_credit_line_does_not_count_toward_the_minimum() -> None:
    # 100.00 of usage meets the minimum; 30.00 of it paid by credit changes nothing.
    invoice, lines, contract = _closing(10_000, "100.00")
    credit = CreditLine.open_for("acme", "USD", invoice.period)
    credit.apply([(uuid.uuid4(), lines[0].id, Decimal(3_000))])
    assert credit.billed == -3_000
    assert true_up_lines(invoice, [*lines, credit], contract.schedule) == []


def test_no_true_up_at_or_above_the_minimum_without_one_or_without_a_contract() -> None:
    invoice, lines, contract = _closing(10_000, "100.00")
    assert true_up_lines(invoice, lines, contract.schedule) == []
    invoice, lines, contract = _closing(1, None)
    assert true_up_lines(invoice, lines, contract.schedule) == []
    assert true_up_lines(invoice, lines, None) == []
    assert true_ups(None, FEB, "USD", {"in": 0}) == {}


def test_a_meters_minimum_is_trued_up_first_and_counts_toward_the_invoices() -> None:
    meters = '[minimum.meters]\nin = "30.00"\nout = "5.00"\neur = "1.00"\n'
    invoice, lines, contract = _closing(2_000, "100.00", meters)
    found = {line.meter: line.billed for line in true_up_lines(invoice, lines, contract.schedule)}
    assert found == {
        f"{TRUE_UP_METER} in": 1_000,  # 30.00 less the 20.00 it billed
        f"{TRUE_UP_METER} out": 500,  # none billed
        TRUE_UP_METER: 6_500,  # 100.00 less 20.00 of usage and 15.00 of meters' true-ups
    }  # the EUR meter's minimum is another invoice's
    assert all(is_true_up(m) for m in found) and not is_true_up("in")
    assert contract.versions[0].meter_minimums == {
        "USD": {"in": 3_000, "out": 500},
        "EUR": {"eur": 100},
    }
    invoice, lines, contract = _closing(2_000, None, '[minimum.meters]\nin = "10.00"\n')
    assert true_up_lines(invoice, lines, contract.schedule) == []


def test_a_meter_minimum_of_an_unknown_meter_is_refused() -> None:
    with pytest.raises(ContractError, match="minimum of meter 'nope': not in the price book"):
        _terms('[minimum.meters]\nnope = "1.00"\n')
