"""Money: integer minor units plus an ISO 4217 currency, and the one rounding rule.

Amounts are always integers of the currency's minor unit (cents for USD, yen for
JPY). Unit prices may be fractions of a minor unit (AI tokens cost fractions of a
cent), so pricing multiplies in ``Decimal`` and rounds **once per transaction**,
half up (``ROUND_HALF_UP``: 0.5 of a minor unit or more rounds away from zero).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation, localcontext

from domain.errors import InvalidUsage

__all__ = [
    "CURRENCY_EXPONENTS",
    "ROUNDING",
    "check_currency",
    "exact_arithmetic",
    "format_minor",
    "parse_exact_amount",
    "to_minor_units",
]

ROUNDING = ROUND_HALF_UP

# ISO 4217 codes this ledger accepts, with their minor-unit exponent.
CURRENCY_EXPONENTS: dict[str, int] = {
    "AUD": 2, "BRL": 2, "CAD": 2, "CHF": 2, "CNY": 2, "CZK": 2, "DKK": 2, "EUR": 2,
    "GBP": 2, "HKD": 2, "HUF": 2, "IDR": 2, "ILS": 2, "INR": 2, "JPY": 0, "KRW": 0,
    "MXN": 2, "NOK": 2, "NZD": 2, "PLN": 2, "SEK": 2, "SGD": 2, "THB": 2, "TRY": 2,
    "TWD": 2, "USD": 2, "ZAR": 2, "BHD": 3, "KWD": 3, "JOD": 3,
}  # fmt: skip


def exact_arithmetic() -> AbstractContextManager[Context]:
    """A decimal context wide enough that products and quotients of usage-sized
    numbers are exact, so the only rounding is the one ``to_minor_units`` does."""
    return localcontext(prec=200)


def check_currency(code: str) -> str:
    """Return the upper-case ISO 4217 code, or raise InvalidUsage if it is unknown."""
    upper = code.upper()
    if upper not in CURRENCY_EXPONENTS:
        raise InvalidUsage(f"unknown currency {code!r}")
    return upper


def to_minor_units(major: Decimal, currency: str) -> int:
    """Convert an exact amount in major units (e.g. dollars) to rounded minor units."""
    exponent = CURRENCY_EXPONENTS[check_currency(currency)]
    with exact_arithmetic():
        return int((major * (Decimal(10) ** exponent)).quantize(Decimal(1), rounding=ROUNDING))


def parse_exact_amount(text: str, currency: str) -> int:
    """Parse a major-unit amount typed by a person ("12.50") to minor units, exactly.

    Raises ValueError when the text is not a non-negative number or has more
    decimals than the currency has minor units (no silent rounding of an input).
    """
    code = check_currency(currency)
    try:
        major = Decimal(text)
    except InvalidOperation:
        raise ValueError(f"{text!r} is not an amount") from None
    if not major.is_finite() or major < 0:
        raise ValueError(f"{text!r} is not a non-negative amount")
    with exact_arithmetic():
        minor = major * (Decimal(10) ** CURRENCY_EXPONENTS[code])
    if minor != minor.to_integral_value():
        raise ValueError(f"{text!r} has more decimals than {code} allows")
    return int(minor)


def format_minor(amount: int, currency: str) -> str:
    """``1250, "USD"`` -> ``"12.50 USD"``."""
    code = currency.upper()
    exponent = CURRENCY_EXPONENTS.get(code, 2)
    return f"{Decimal(amount).scaleb(-exponent):.{exponent}f} {code}"
