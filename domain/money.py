"""Money: amounts in minor units plus an ISO 4217 currency, exact, and the one rounding.

A usage record keeps its **exact** amount: a ``Decimal`` of the currency's minor unit
(cents for USD, yen for JPY), never rounded, because AI usage costs fractions of a
cent (1,520 tokens at 2.50 USD per million is 0.38 cents). Money is rounded **once,
on an invoice line** (the sum of a customer's usage of one meter in one period), half
up (``ROUND_HALF_UP``: 0.5 of a minor unit or more rounds away from zero), to an
integer of minor units: ``round_minor``.

Bounds (each a documented refusal, never a silent rounding):

* ``AMOUNT_DIGITS``: an exact amount may need at most 38 significant digits (what
  PostgreSQL's ``numeric`` and every read model keep); a price whose product with a
  quantity does not terminate within them (a ``per`` of 3, say) is refused;
* ``MAX_TRANSACTION_MINOR``: one transaction's exact amount is below 10^12 minor units
  (10 billion USD);
* ``MAX_SPEND_LIMIT_MINOR``: a spend limit is at most 10^15 minor units;
* ``MAX_LINE_MINOR``: an invoice line's total stays below 10^20 minor units (it is
  summed exactly in a 60-digit context; more would be refused, not rounded);
* ``MAX_ITEM_AMOUNT``: Stripe's largest invoice-item amount (99,999,999 minor units);
  a line's billed total above it continues on further items (``split_for_items``).
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from decimal import (
    ROUND_HALF_UP,
    Context,
    Decimal,
    DivisionByZero,
    Inexact,
    InvalidOperation,
    Overflow,
    localcontext,
)
from functools import reduce

from domain.errors import InvalidUsage

__all__ = [
    "AMOUNT_DIGITS",
    "CURRENCY_EXPONENTS",
    "MAX_ITEM_AMOUNT",
    "MAX_LINE_MINOR",
    "MAX_SPEND_LIMIT_MINOR",
    "MAX_TRANSACTION_MINOR",
    "ROUNDING",
    "add_exact",
    "add_quantity",
    "canonical",
    "check_currency",
    "check_increment",
    "check_spend_limit",
    "exact_arithmetic",
    "exact_minor",
    "format_money",
    "line_add",
    "line_minor",
    "line_product",
    "parse_exact_amount",
    "round_minor",
    "running_difference",
    "running_sum",
    "split_for_items",
    "subtract_exact",
    "sum_exact",
    "to_minor_units",
]

AMOUNT_DIGITS = 38
MAX_TRANSACTION_MINOR = Decimal(10) ** 12
MAX_SPEND_LIMIT_MINOR = 10**15
MAX_LINE_MINOR = Decimal(10) ** 20
MAX_ITEM_AMOUNT = 99_999_999

_TRAPS = [Inexact, InvalidOperation, DivisionByZero, Overflow]
# Products and quotients of one record: exact within AMOUNT_DIGITS, or Inexact.
_EXACT = Context(prec=AMOUNT_DIGITS, rounding=ROUND_HALF_UP, traps=_TRAPS)
# Sums of a line's amounts: wide enough for any sum below MAX_LINE_MINOR of amounts
# with up to AMOUNT_DIGITS digits each (their exponents differ, so digits add up).
_SUM = Context(prec=60, rounding=ROUND_HALF_UP, traps=_TRAPS)
_ZERO = Decimal(0)
# The one rounding (to whole minor units), which is inexact by design.
_ROUND = Context(prec=60, rounding=ROUND_HALF_UP, traps=[InvalidOperation])

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


def format_money(amount: int | Decimal, currency: str) -> str:
    """An amount in minor units as a person reads it, the one format every command and
    log line uses: major units, the currency's decimals at least, every digit of an
    exact amount kept (never rounded for show), and the currency code. ``1250, "USD"``
    -> ``"12.50 USD"``; ``Decimal("0.38"), "USD"`` -> ``"0.0038 USD"``; ``7, "JPY"`` ->
    ``"7 JPY"``."""
    code = currency.upper()
    exponent = CURRENCY_EXPONENTS.get(code, 2)
    whole, _, fraction = f"{canonical(Decimal(amount).scaleb(-exponent)):f}".partition(".")
    fraction = fraction.ljust(exponent, "0")
    return f"{whole}.{fraction} {code}" if fraction else f"{whole} {code}"


def canonical(amount: Decimal | int) -> Decimal:
    """One form per value, without exponents: 0.3800 -> 0.38, 380.00 -> 380, 1E+2 -> 100.

    The same value always encodes to the same text, so two paths that compute an
    amount (the aggregate and the ingest's fast path) store the same bytes."""
    amount = Decimal(amount)
    if amount == amount.to_integral_value():
        return amount.quantize(Decimal(1), context=_SUM)
    return amount.normalize(_SUM)


def exact_minor(quantity: Decimal, unit_price: Decimal, per: int, currency: str) -> Decimal:
    """The exact amount, in minor units, of ``quantity`` at ``unit_price`` (major units)
    per ``per`` units; raises InvalidUsage when it needs more than AMOUNT_DIGITS digits
    or is not below MAX_TRANSACTION_MINOR (never rounds)."""
    amount = _product(_EXACT, quantity, unit_price, per, currency)
    if amount >= MAX_TRANSACTION_MINOR:
        raise InvalidUsage(
            f"amount_too_large: {canonical(amount):f} minor units of {currency} is not below"
            f" the ceiling of {MAX_TRANSACTION_MINOR:f} per transaction"
        )
    return canonical(amount)


def line_minor(quantity: Decimal, unit_price: Decimal, per: int, currency: str) -> Decimal:
    """``quantity * unit_price / per`` in minor units for a *line's* total quantity (a
    pricing model's ``f(Q)``: ``domain.pricing``): exact in the 60-digit context a line's
    total is summed in; InvalidUsage when it is not exact there or not below
    MAX_LINE_MINOR (never rounds)."""
    amount = _product(_SUM, quantity, unit_price, per, currency)
    if amount >= MAX_LINE_MINOR:
        raise InvalidUsage(
            f"amount_too_large: a line total of {canonical(amount):f} minor units of"
            f" {currency} is not below {MAX_LINE_MINOR:f}"
        )
    return amount


def line_product(quantity: Decimal, rate: Decimal) -> Decimal:
    """``quantity x rate`` (a rate in minor units per unit) in a line's 60-digit context:
    exact or InvalidUsage, not canonical (a pricing model's inner step)."""
    try:
        return _SUM.multiply(quantity, rate)
    except (Inexact, InvalidOperation, Overflow):
        raise InvalidUsage(f"amount_not_exact: {quantity} x {rate} is not exact") from None


def line_add(a: Decimal, b: Decimal) -> Decimal:
    """``a + b`` in a line's 60-digit context: exact or InvalidUsage, not canonical."""
    try:
        return _SUM.add(a, b)
    except (Inexact, InvalidOperation, Overflow):
        raise InvalidUsage(f"amount_not_exact: {a} + {b} is not exact") from None


def _product(
    context: Context, quantity: Decimal, unit_price: Decimal, per: int, currency: str
) -> Decimal:
    """``quantity * unit_price / per`` in minor units, exact in ``context`` or InvalidUsage."""
    scale = _SCALES[CURRENCY_EXPONENTS[currency]]
    try:
        return context.divide(context.multiply(context.multiply(quantity, unit_price), scale), per)
    except Inexact:
        raise InvalidUsage(
            f"amount_not_exact: {quantity} x {unit_price} / {per} {currency} needs more than"
            f" {context.prec} significant digits"
        ) from None
    except (InvalidOperation, Overflow):
        raise InvalidUsage(f"amount_too_large: {quantity} x {unit_price} / {per}") from None


_SCALES = {e: Decimal(10) ** e for e in range(5)}


def check_increment(amount: Decimal, currency: str) -> Decimal:
    """A record's exact amount computed as what it adds to its line (``domain.pricing``):
    canonical, or InvalidUsage when its magnitude is not below MAX_TRANSACTION_MINOR or
    it needs more than AMOUNT_DIGITS significant digits. It may be negative (a volume
    tier: the line's total drops to a cheaper tier)."""
    amount = canonical(amount)
    if abs(amount) >= MAX_TRANSACTION_MINOR:
        raise InvalidUsage(
            f"amount_too_large: {amount:f} minor units of {currency} is not within the"
            f" ceiling of {MAX_TRANSACTION_MINOR:f} per transaction"
        )
    if len(amount.as_tuple().digits) > AMOUNT_DIGITS:
        raise InvalidUsage(
            f"amount_not_exact: {amount:f} {currency} needs more than {AMOUNT_DIGITS}"
            " significant digits"
        )
    return amount


def add_exact(total: Decimal, amount: Decimal) -> Decimal:
    """``total + amount`` exactly (a line's running total); ValueError past MAX_LINE_MINOR."""
    result = _SUM.add(total, amount)
    if abs(result) >= MAX_LINE_MINOR:
        raise ValueError(f"a line total of {result} minor units is beyond {MAX_LINE_MINOR:f}")
    return canonical(result)


def subtract_exact(total: Decimal, amount: Decimal) -> Decimal:
    """``total - amount`` exactly, with ``add_exact``'s checks. Never write
    ``add_exact(total, -amount)``: ``-amount`` is taken in the thread's context (28
    digits by default), which rounds an amount of more digits before it is added; here
    it is negated in the sums' context (60 digits, inexact trapped)."""
    return add_exact(total, _SUM.minus(amount))


def add_quantity(total: Decimal, quantity: Decimal) -> Decimal:
    """A line's total quantity plus a record's, exactly (InvalidUsage if it ever needed
    more than 60 digits: 10^30 records of the largest quantity)."""
    return line_add(total, quantity)


def running_difference(total: Decimal, amount: Decimal) -> Decimal:
    """``total - amount`` exactly (raises ``Inexact`` rather than round), not brought to
    canonical form: for a running balance that is compared, never stored."""
    return _SUM.subtract(total, amount)


def running_sum(total: Decimal, amount: Decimal) -> Decimal:
    """``total + amount`` exactly (raises ``Inexact`` rather than round), not brought to
    canonical form: for a running total that is compared, never stored as it is."""
    return _SUM.add(total, amount)


def sum_exact(amounts: Iterable[Decimal]) -> Decimal:
    """The exact sum of ``amounts`` (``add_exact`` of each, its checks once at the end)."""
    total = reduce(_SUM.add, amounts, _ZERO)
    if abs(total) >= MAX_LINE_MINOR:
        raise ValueError(f"a line total of {total} minor units is beyond {MAX_LINE_MINOR:f}")
    return canonical(total)


def round_minor(exact: Decimal) -> int:
    """The one rounding: an exact line total to whole minor units, half up."""
    return int(exact.quantize(Decimal(1), rounding=ROUNDING, context=_ROUND))


def split_for_items(billed: int, maximum: int = MAX_ITEM_AMOUNT) -> list[int]:
    """``billed`` as invoice-item amounts of at most ``maximum`` each, in order (always
    at least one, possibly 0): 250,000,000 -> [99,999,999, 99,999,999, 50,000,002]. A
    negative total (the credit line, ``domain.credit_line``) is split the same way, into
    items of at least ``-maximum``."""
    if billed < 0:
        return [-part for part in split_for_items(-billed, maximum)]
    parts = [maximum] * (billed // maximum)
    if billed % maximum or not parts:
        parts.append(billed % maximum)
    return parts


def check_spend_limit(limit: int | None, currency: str | None = None) -> int | None:
    """``limit`` if it is None or within 0..MAX_SPEND_LIMIT_MINOR (else ValueError, in
    the money format when the ``currency`` is known)."""
    if limit is not None and not 0 <= limit <= MAX_SPEND_LIMIT_MINOR:
        if currency is None:
            bound, got = f"{MAX_SPEND_LIMIT_MINOR:,} minor units", f"{limit:,}"
        else:
            bound = format_money(MAX_SPEND_LIMIT_MINOR, currency)
            got = format_money(limit, currency)
        raise ValueError(f"a spend limit must be from 0 to {bound}, got {got}")
    return limit
