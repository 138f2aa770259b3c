"""How commands print: plain tables for people, JSON for programs.

A person reads money in one format (``domain.money.format_money``: major units, every
digit of an exact amount, the currency code); ``--json`` keeps the read models' own
values for programs: integer minor units, and exact amounts as decimal text in minor
units (``"96.34675"`` is 0.9634675 USD)."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from domain.money import format_money

__all__ = ["MONEY_COLUMNS", "ROUNDING_NOTE", "event_row", "money_cell", "print_table"]

# The columns of the read models that hold an amount in minor units of the row's currency.
MONEY_COLUMNS = frozenset({
    "amount", "metered", "in_flight", "charged", "compensated", "spend_limit", "available",
    "held", "exact_total", "billed", "stripe_amount", "expected_total", "total",
    "amount_paid", "credited", "stripe_total", "invoice_total",
    "consumed", "expired", "voided", "remaining", "granted",
})  # fmt: skip

ROUNDING_NOTE = (
    "Exact amounts keep fractions of a minor unit; an invoice bills each line's exact"
    " total rounded once (half up), so a customer's exact charges and its invoice can"
    " differ by up to half a minor unit per line."
)


def money_cell(value: Any, currency: Any) -> str:
    """``value`` (minor units) as a person reads it, or as it is when it is no amount."""
    if value is None:
        return ""
    if isinstance(currency, str) and isinstance(value, int | Decimal | str):
        try:
            return format_money(Decimal(value), currency)
        except ArithmeticError:
            return str(value)
    return str(value)


def print_table(
    rows: list[dict[str, Any]], columns: Sequence[str], *, note: str | None = None
) -> None:
    """``rows`` as a table of ``columns``; amounts in the money format, with ``note``
    under the table when it has rows."""
    if not rows:
        print("(no rows)")
        return
    cells = [
        [
            money_cell(r[c], r.get("currency")) if c in MONEY_COLUMNS
            else ("" if r[c] is None else str(r[c]))
            for c in columns
        ]
        for r in rows
    ]  # fmt: skip
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    if note:
        print(f"\n{note}")


def event_row(event: Any) -> dict[str, Any]:
    """One domain event as a row of ``history``: version, time, name, its fields."""
    data = {
        k: v
        for k, v in vars(event).items()
        if k not in ("originator_id", "originator_version", "timestamp", "originator_topic")
    }
    return {
        "version": event.originator_version,
        "timestamp": event.timestamp.isoformat(),
        "event": type(event).__name__,
        "data": {k: str(v) if v is not None else None for k, v in data.items()},
    }
