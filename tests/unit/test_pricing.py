"""``domain.pricing``: parsing the price list and pricing a quantity, rounded once."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal, localcontext
from pathlib import Path

import pytest

from domain.errors import InvalidUsage, PriceListError, UnknownMeter
from domain.money import add_exact, round_minor
from domain.pricing import Price, PriceList
from domain.transaction import BillingTransaction, Source
from domain.usage import UsageRecord

EXAMPLE = Path(__file__).resolve().parents[2] / "infra" / "prices.example.toml"

# 2.50 USD per 1,000,000 tokens = 250 cents / 1,000,000 = 0.00025 cents per token.
TOKENS = Price(unit_price=Decimal("2.50"), currency="USD", per=1_000_000)
OK_PRICE = 'unit_price = "1"\ncurrency = "USD"\n'


def _toml(body: str) -> str:
    return '[meters."m"]\n' + body


# ---------------------------------------------------------------------------------------------
# PriceList.from_toml


def test_the_shipped_example_price_list_parses_every_meter() -> None:
    prices = PriceList.from_toml(EXAMPLE.read_text(encoding="utf-8"))
    assert set(prices.prices) == {
        "gpt-4o.input_tokens",
        "gpt-4o.output_tokens",
        "gpt-4o-mini.input_tokens",
        "gpt-4o-mini.output_tokens",
        "embeddings.tokens",
        "api.requests",
        "gpu.a100.seconds",
        "eu.gpu.h100.seconds",
    }
    assert prices.price_of("gpt-4o.input_tokens") == Price(Decimal("2.50"), "USD", 1_000_000)
    assert prices.price_of("eu.gpu.h100.seconds") == Price(Decimal("0.0025"), "EUR", 1)


def test_the_example_prices_are_exact_decimals_and_per_defaults_to_one() -> None:
    prices = PriceList.from_toml(EXAMPLE.read_text(encoding="utf-8"))
    gpu = prices.price_of("gpu.a100.seconds")
    assert gpu.unit_price == Decimal("0.0011")
    assert isinstance(gpu.unit_price, Decimal)
    assert gpu.per == 1  # no `per` in the file


def test_from_toml_upper_cases_the_currency() -> None:
    prices = PriceList.from_toml(_toml('unit_price = "1"\ncurrency = "eur"\n'))
    assert prices.price_of("m").currency == "EUR"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        pytest.param('[meters."m"\nunit_price = "1"', "not valid TOML", id="bad-toml"),
        pytest.param("", "no \\[meters.NAME\\] tables", id="empty-file"),
        pytest.param("[meters]\n", "no \\[meters.NAME\\] tables", id="no-meters"),
        pytest.param('meters = "all"\n', "no \\[meters.NAME\\] tables", id="meters-not-table"),
        pytest.param("[meters]\nm = 1\n", "'m': expected a table", id="meter-not-table"),
        pytest.param(_toml('currency = "USD"\n'), "missing 'unit_price'", id="no-unit-price"),
        pytest.param(_toml('unit_price = "1"\n'), "missing 'currency'", id="no-currency"),
        pytest.param(_toml('unit_price = "-0.01"\ncurrency = "USD"\n'), ">= 0", id="negative"),
        pytest.param(_toml('unit_price = "NaN"\ncurrency = "USD"\n'), ">= 0", id="nan-price"),
        pytest.param(_toml('unit_price = "cheap"\ncurrency = "USD"\n'), "'m'", id="garbage"),
        pytest.param(_toml(OK_PRICE + "per = 0\n"), "whole number above 0", id="per-0"),
        pytest.param(_toml(OK_PRICE + "per = -5\n"), "whole number above 0", id="per-negative"),
        pytest.param(_toml(OK_PRICE + 'per = "x"\n'), "'m'", id="per-text"),
        pytest.param(_toml('unit_price = "1"\ncurrency = "XYZ"\n'), "unknown currency", id="xyz"),
    ],
)
def test_from_toml_rejects_a_malformed_price_list_with_price_list_error(
    text: str, reason: str
) -> None:
    with pytest.raises(PriceListError, match=reason):
        PriceList.from_toml(text)


@pytest.mark.parametrize(
    "per",
    [
        pytest.param("2.5", id="float-truncated"),
        pytest.param("true", id="bool-read-as-1"),
        pytest.param("[1000]", id="list-raises-type-error"),
        pytest.param("{ n = 1000 }", id="table-raises-type-error"),
    ],
)
def test_from_toml_rejects_a_per_that_is_not_a_positive_integer(per: str) -> None:
    with pytest.raises(PriceListError, match="'m'"):
        PriceList.from_toml(_toml(OK_PRICE + f"per = {per}\n"))


# ---------------------------------------------------------------------------------------------
# Price.exact_amount: never rounded (a line rounds its sum once)


@pytest.mark.parametrize(
    ("tokens", "cents"),
    [
        (1, "0.00025"),
        (200, "0.05"),
        (1_520, "0.38"),  # the example: 1,520 tokens at 2.50 USD per million
        (1_999, "0.49975"),
        (2_000, "0.5"),
        (1_000_000, "250"),  # exactly the published 2.50 USD
    ],
)
def test_exact_amount_keeps_fractions_of_a_cent(tokens: int, cents: str) -> None:
    assert TOKENS.exact_amount(Decimal(tokens)) == Decimal(cents)


def test_exact_amount_prices_a_fractional_quantity_exactly() -> None:
    gpu = Price(unit_price=Decimal("0.0011"), currency="USD")
    # 1000.5 s x 0.0011 USD = 1.10055 USD = 110.055 cents, kept whole
    assert gpu.exact_amount(Decimal("1000.5")) == Decimal("110.055")


@pytest.mark.parametrize(
    ("price", "quantity", "minor"),
    [
        (Price(Decimal("0.5"), "JPY"), "3", "1.5"),  # exponent 0: yen
        (Price(Decimal("0.0015"), "KWD"), "1", "1.5"),  # exponent 3: 1.5 fils
        (Price(Decimal("0.0014"), "GBP"), "1", "0.14"),  # exponent 2: 0.14 pence
    ],
)
def test_exact_amount_is_in_the_minor_unit_of_the_price_currency(
    price: Price, quantity: str, minor: str
) -> None:
    assert price.exact_amount(Decimal(quantity)) == Decimal(minor)


def test_summing_exact_amounts_then_rounding_once_bills_what_the_usage_is_worth() -> None:
    # 100 records of 1,999 tokens: each 0.49975 cents. Rounded per record: 0 cents in all;
    # summed exactly then rounded once: 49.975 -> 50 cents.
    amounts = [TOKENS.exact_amount(Decimal(1_999)) for _ in range(100)]
    total = Decimal(0)
    for amount in amounts:
        total = add_exact(total, amount)
    assert total == Decimal("49.975")
    assert round_minor(total) == 50
    assert sum(round_minor(a) for a in amounts) == 0  # what rounding per record billed


def test_the_ledger_keeps_a_transaction_s_exact_amount() -> None:
    record = UsageRecord(
        usage_id="req-1",
        customer_id="acme",
        meter="gpt-4o.input_tokens",
        quantity=Decimal(3_000),
        occurred_at=datetime(2026, 12, 2, 10, 15, tzinfo=UTC),
    )
    prices = PriceList({"gpt-4o.input_tokens": TOKENS})
    txn = BillingTransaction.from_usage(record, prices, Source("usage", 0, 0))
    assert txn.amount == Decimal("0.75")


def test_exact_amount_of_a_28_digit_quantity_is_not_rounded() -> None:
    gpu = Price(unit_price=Decimal("0.0011"), currency="USD")
    quantity = Decimal("4.545454545454545454545454545")  # 28 significant digits
    with localcontext() as ctx:
        ctx.prec = 100
        exact_cents = quantity * gpu.unit_price * 100
    assert gpu.exact_amount(quantity) == exact_cents
    assert round_minor(gpu.exact_amount(quantity)) == 0  # 0.4999...95 rounds down, once


def test_an_amount_beyond_the_precision_is_refused_not_rounded() -> None:
    price = Price(unit_price=Decimal("0.0011"), currency="USD")
    quantity = Decimal("1." + "3" * 37)  # x 11: a product of 39 significant digits
    with pytest.raises(InvalidUsage, match="amount_not_exact"):
        price.exact_amount(quantity)


def test_an_amount_at_the_ceiling_is_refused_as_too_large() -> None:
    per_request = Price(unit_price=Decimal("0.001"), currency="USD")  # 0.1 cents a request
    assert per_request.exact_amount(Decimal(10**13 - 1)) == Decimal("999999999999.9")
    with pytest.raises(InvalidUsage, match="amount_too_large"):
        per_request.exact_amount(Decimal(10**13))
    with pytest.raises(InvalidUsage, match="amount_too_large"):
        per_request.exact_amount(Decimal("1" + "0" * 29))  # a 30-digit quantity


def test_a_price_list_whose_rate_does_not_terminate_is_refused_at_load() -> None:
    with pytest.raises(PriceListError, match="one unit cannot be priced"):
        PriceList.from_toml(_toml(OK_PRICE + "per = 3\n"))


# ---------------------------------------------------------------------------------------------
# PriceList.price_of


def test_price_of_an_unknown_meter_raises_unknown_meter_which_is_invalid_usage() -> None:
    prices = PriceList({"api.requests": Price(Decimal("0.001"), "USD")})
    with pytest.raises(UnknownMeter, match=r"unknown meter 'gpt-5\.tokens'") as caught:
        prices.price_of("gpt-5.tokens")
    assert isinstance(caught.value, InvalidUsage)


def test_a_free_meter_is_a_valid_price() -> None:
    prices = PriceList.from_toml(_toml('unit_price = 0\ncurrency = "EUR"\n'))
    assert prices.prices["m"] == Price(Decimal(0), "EUR")


def test_only_the_rate_of_one_unit_must_be_exact() -> None:
    """38 significant digits for one unit; two units would need 39 (a record of two
    units is refused on its own, not the whole price list)."""
    unit_price = "0." + "9" * 38
    price = PriceList.from_toml(_toml(f'unit_price = "{unit_price}"\ncurrency = "USD"\n'))
    assert price.prices["m"].exact_amount(Decimal(1)) == Decimal("99." + "9" * 36)
    with pytest.raises(InvalidUsage, match="amount_not_exact"):
        price.prices["m"].exact_amount(Decimal(2))


@pytest.mark.parametrize("text", ["", "[meters]\n", "[other]\nx = 1\n"])
def test_a_price_list_without_meters_is_refused_saying_what_it_needs(text: str) -> None:
    with pytest.raises(PriceListError, match=r"^price list has no \[meters\.NAME\] tables$"):
        PriceList.from_toml(text)
