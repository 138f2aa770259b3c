"""``domain.money``: the one rounding rule, currency codes, exact parsing and formatting."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

import pytest

from domain.errors import BillingError, InvalidUsage
from domain.money import (
    CURRENCY_EXPONENTS,
    ROUNDING,
    check_currency,
    format_money,
    parse_exact_amount,
    subtract_exact,
    to_minor_units,
)

# ---------------------------------------------------------------------------------------------
# to_minor_units


def test_minor_unit_exponents_are_0_for_jpy_2_for_usd_3_for_kwd() -> None:
    assert (CURRENCY_EXPONENTS["JPY"], CURRENCY_EXPONENTS["USD"], CURRENCY_EXPONENTS["KWD"]) == (
        0,
        2,
        3,
    )


def test_the_documented_rounding_rule_is_round_half_up() -> None:
    assert ROUNDING == ROUND_HALF_UP


@pytest.mark.parametrize(
    ("major", "currency", "minor"),
    [
        ("1.004", "USD", 100),  # 100.4 cents -> 100
        ("1.005", "USD", 101),  # 100.5 cents -> 101 (half up; half-even would give 100)
        ("0.025", "USD", 3),  # 2.5 cents -> 3 (half-even would give 2)
        ("0.0049", "USD", 0),  # 0.49 cents -> 0
        ("12.50", "USD", 1250),  # exact: no rounding at all
        ("100.4", "JPY", 100),  # exponent 0: 100.4 yen -> 100
        ("100.5", "JPY", 101),  # 100.5 yen -> 101
        ("0.5", "JPY", 1),  # 0.5 yen -> 1
        ("1.2344", "KWD", 1234),  # exponent 3: 1234.4 fils -> 1234
        ("1.2345", "KWD", 1235),  # 1234.5 fils -> 1235
        ("-1.005", "USD", -101),  # -100.5 cents -> -101: half rounds away from zero
    ],
)
def test_to_minor_units_rounds_half_up_to_the_currency_minor_unit(
    major: str, currency: str, minor: int
) -> None:
    assert to_minor_units(Decimal(major), currency) == minor


def test_to_minor_units_rounds_once_not_in_stages() -> None:
    # 1.0049 USD = 100.49 cents -> 100. Rounding in two stages (first to 1.005, then
    # to cents) would give 100.5 -> 101.
    assert to_minor_units(Decimal("1.0049"), "USD") == 100


def test_to_minor_units_accepts_a_lower_case_currency() -> None:
    assert to_minor_units(Decimal("1.5"), "jpy") == 2  # 1.5 yen -> 2


def test_to_minor_units_rejects_an_unknown_currency() -> None:
    with pytest.raises(InvalidUsage, match="unknown currency 'XYZ'"):
        to_minor_units(Decimal(1), "XYZ")


# ---------------------------------------------------------------------------------------------
# check_currency


@pytest.mark.parametrize(("code", "expected"), [("usd", "USD"), ("Jpy", "JPY"), ("KWD", "KWD")])
def test_check_currency_accepts_any_case_and_returns_upper_case(code: str, expected: str) -> None:
    assert check_currency(code) == expected


@pytest.mark.parametrize("code", ["XYZ", "US", "USDD", "", "dollar", "U$D"])
def test_check_currency_rejects_an_unknown_code_with_invalid_usage(code: str) -> None:
    with pytest.raises(InvalidUsage, match="unknown currency") as caught:
        check_currency(code)
    assert isinstance(caught.value, BillingError)
    assert repr(code) in str(caught.value)


# ---------------------------------------------------------------------------------------------
# parse_exact_amount


@pytest.mark.parametrize(
    ("text", "currency", "minor"),
    [
        ("12.50", "USD", 1250),
        ("12.5", "USD", 1250),
        ("12", "USD", 1200),
        ("0", "USD", 0),
        ("0.01", "USD", 1),
        ("12.500", "USD", 1250),  # trailing zeros are not extra precision: 1250.0 is whole
        ("1E+2", "USD", 10000),  # 100 dollars
        ("1500", "JPY", 1500),
        ("1.234", "KWD", 1234),
        ("12.50", "usd", 1250),
    ],
)
def test_parse_exact_amount_converts_exactly_to_minor_units(
    text: str, currency: str, minor: int
) -> None:
    assert parse_exact_amount(text, currency) == minor


@pytest.mark.parametrize(
    ("text", "currency"),
    [("12.505", "USD"), ("0.001", "USD"), ("1.5", "JPY"), ("1.2345", "KWD")],
)
def test_parse_exact_amount_rejects_more_decimals_than_the_currency_has(
    text: str, currency: str
) -> None:
    with pytest.raises(ValueError, match="more decimals than"):
        parse_exact_amount(text, currency)


@pytest.mark.parametrize("text", ["-1", "-0.01", "-12.50"])
def test_parse_exact_amount_rejects_a_negative_amount(text: str) -> None:
    with pytest.raises(ValueError, match="non-negative"):
        parse_exact_amount(text, "USD")


@pytest.mark.parametrize("text", ["NaN", "sNaN", "Infinity", "-Infinity", "inf"])
def test_parse_exact_amount_rejects_nan_and_infinity(text: str) -> None:
    with pytest.raises(ValueError, match="non-negative amount"):
        parse_exact_amount(text, "USD")


@pytest.mark.parametrize("text", ["", "abc", "12,50", "1.2.3", "$12", "12 USD", "0x10"])
def test_parse_exact_amount_rejects_text_that_is_not_a_number(text: str) -> None:
    with pytest.raises(ValueError, match="is not an amount"):
        parse_exact_amount(text, "USD")


def test_parse_exact_amount_rejects_an_unknown_currency_with_invalid_usage() -> None:
    with pytest.raises(InvalidUsage, match="unknown currency"):
        parse_exact_amount("1.00", "XYZ")


def test_parse_exact_amount_never_rounds_a_long_input_silently() -> None:
    text = "1234567890123456789012345678.901"  # three decimals: too many for USD
    # x 100 = 123456789012345678901234567890.1 (31 digits), which the 28-digit context
    # rounds to 1.234567890123456789012345679E+29: a whole number, so it is accepted
    # as 123456789012345678901234567900 instead of being refused.
    with pytest.raises(ValueError, match="more decimals than"):
        parse_exact_amount(text, "USD")


# ---------------------------------------------------------------------------------------------
# format_money


@pytest.mark.parametrize(
    ("amount", "currency", "text"),
    [
        (1250, "USD", "12.50 USD"),
        (5, "USD", "0.05 USD"),
        (0, "USD", "0.00 USD"),
        (123456789, "USD", "1234567.89 USD"),
        (-5, "USD", "-0.05 USD"),
        (1250, "JPY", "1250 JPY"),  # exponent 0: no decimal point
        (1234, "KWD", "1.234 KWD"),  # exponent 3
        (5, "KWD", "0.005 KWD"),
    ],
)
def test_format_money_shows_major_units_with_the_currency_decimals(
    amount: int, currency: str, text: str
) -> None:
    assert format_money(amount, currency) == text


@pytest.mark.parametrize(("amount", "currency"), [(1250, "USD"), (7, "JPY"), (1001, "KWD")])
def test_format_money_output_parses_back_to_the_same_amount(amount: int, currency: str) -> None:
    major, code = format_money(amount, currency).split(" ")
    assert code == currency
    assert parse_exact_amount(major, code) == amount


def test_subtracting_an_amount_of_many_digits_is_exact() -> None:
    """``subtract_exact``: an amount of up to 38 digits (``AMOUNT_DIGITS``) taken off
    exactly, where negating it first (``-amount``) rounds it to the context's 28."""
    amount = Decimal("99.50000000000000000000000000123")  # 31 digits
    assert subtract_exact(Decimal(100), amount) == Decimal("0.49999999999999999999999999877")
    assert -amount == Decimal("-99.50000000000000000000000000")  # why it exists
    assert subtract_exact(amount, amount) == 0
    with pytest.raises(ValueError, match="beyond"):
        subtract_exact(Decimal(0), Decimal(10) ** 20)
