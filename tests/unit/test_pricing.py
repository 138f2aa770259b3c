"""``domain.pricing``: parsing the price list and pricing a quantity, rounded once."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal, localcontext
from pathlib import Path

import pytest

from domain.errors import InvalidUsage, PriceListError, UnknownMeter
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
# Price.amount_minor


@pytest.mark.parametrize(
    ("tokens", "cents"),
    [
        (1, 0),  # 1 x 0.00025 = 0.00025 cents -> 0
        (200, 0),  # 200 x 0.00025 = 0.05 cents -> 0
        (1_999, 0),  # 1,999 x 0.00025 = 0.49975 cents -> 0
        (2_000, 1),  # 2,000 x 0.00025 = 0.5 cents -> 1 (half up)
        (6_000, 2),  # 6,000 x 0.00025 = 1.5 cents -> 2
        (1_000_000, 250),  # exactly the published 2.50 USD
    ],
)
def test_amount_minor_prices_fractions_of_a_cent_and_rounds_half_up(
    tokens: int, cents: int
) -> None:
    assert TOKENS.amount_minor(Decimal(tokens)) == cents


def test_amount_minor_prices_a_fractional_quantity_exactly() -> None:
    gpu = Price(unit_price=Decimal("0.0011"), currency="USD")
    # 1000.5 s x 0.0011 USD = 1.10055 USD = 110.055 cents -> 110
    assert gpu.amount_minor(Decimal("1000.5")) == 110


@pytest.mark.parametrize(
    ("price", "quantity", "minor"),
    [
        (Price(Decimal("0.5"), "JPY"), "3", 2),  # 1.5 yen -> 2
        (Price(Decimal("0.5"), "JPY"), "1", 1),  # 0.5 yen -> 1
        (Price(Decimal("0.0015"), "KWD"), "1", 2),  # 1.5 fils -> 2
        (Price(Decimal("0.0014"), "KWD"), "1", 1),  # 1.4 fils -> 1
    ],
)
def test_amount_minor_rounds_to_the_minor_unit_of_the_price_currency(
    price: Price, quantity: str, minor: int
) -> None:
    assert price.amount_minor(Decimal(quantity)) == minor


def test_rounding_once_per_transaction_differs_from_rounding_per_part() -> None:
    # Three transactions of 1,000 tokens: each 0.25 cents -> 0, so 0 + 0 + 0 = 0.
    # One transaction of 3,000 tokens: 0.75 cents -> 1.
    per_part = sum(TOKENS.amount_minor(Decimal(1_000)) for _ in range(3))
    once = TOKENS.amount_minor(Decimal(3_000))
    assert (per_part, once) == (0, 1)


def test_the_ledger_prices_a_transaction_with_one_rounding_of_its_whole_quantity() -> None:
    record = UsageRecord(
        usage_id="req-1",
        customer_id="acme",
        meter="gpt-4o.input_tokens",
        quantity=Decimal(3_000),
        occurred_at=datetime(2026, 12, 2, 10, 15, tzinfo=UTC),
    )
    prices = PriceList({"gpt-4o.input_tokens": TOKENS})
    txn = BillingTransaction.from_usage(record, prices, Source("usage", 0, 0))
    # 3,000 x 0.00025 = 0.75 cents -> 1 (not 3 x round(0.25) = 0)
    assert txn.amount == 1


def test_amount_minor_rounds_only_once_even_for_a_long_quantity() -> None:
    gpu = Price(unit_price=Decimal("0.0011"), currency="USD")
    quantity = Decimal("4.545454545454545454545454545")  # 28 significant digits
    with localcontext() as ctx:
        ctx.prec = 100
        exact_cents = quantity * gpu.unit_price * 100
    # exact: 0.49999999999999999999999999995 cents, which rounds half up to 0. Rounded
    # first to 28 digits it becomes 0.5000000000000000000000000000, which rounds to 1.
    assert exact_cents < Decimal("0.5")
    assert gpu.amount_minor(quantity) == 0


# ---------------------------------------------------------------------------------------------
# PriceList.price_of


def test_price_of_an_unknown_meter_raises_unknown_meter_which_is_invalid_usage() -> None:
    prices = PriceList({"api.requests": Price(Decimal("0.001"), "USD")})
    with pytest.raises(UnknownMeter, match=r"unknown meter 'gpt-5\.tokens'") as caught:
        prices.price_of("gpt-5.tokens")
    assert isinstance(caught.value, InvalidUsage)
