"""Closing an invoice (pure): when it is due, whether its lines are final in Stripe,
and what one transaction's share of a rounded line is.

**The billed share.** A line bills its exact total rounded once, so a transaction has
no rounded amount of its own. Its *billed share* is what it added to the line's
rounded running total, in the order the line settled its transactions: for the
line's transactions t1..tn (those not removed), with S_k the exact sum of the first k,

    share(t_k) = round(S_k) - round(S_{k-1})

The shares add up to round(S_n), the line's billed total, exactly (the sum
telescopes), and none is negative (amounts are not negative and rounding half up is
monotone). So crediting transactions of a final invoice one by one, each by its
share, can never credit more than the line billed, and crediting all of them credits
exactly that. A transaction of 0.4 cents on a line of three such bills 0, 1 or 0
cents depending on its place: the rounding has to land somewhere, and this puts it on
the transaction whose usage carried the total over the half cent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from uuid import UUID

from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine, LineChange, LinePush
from domain.invoice_states import InvoiceState
from domain.money import add_exact, round_minor

__all__ = [
    "LineStatus",
    "billed_shares",
    "close_deadline",
    "due_to_close",
    "line_status",
    "shares_in_order",
]


def close_deadline(invoice: Invoice, grace: timedelta) -> datetime:
    """When the invoice closes by itself: its period's end plus the grace."""
    return invoice.period_end + grace


def due_to_close(invoice: Invoice, now: datetime, grace: timedelta) -> bool:
    return invoice.state is InvoiceState.OPEN and now >= close_deadline(invoice, grace)


@dataclass(frozen=True)
class LineStatus:
    """Whether a frozen line's final total is in Stripe and its charges recorded."""

    line_id: UUID
    sequence: int
    billed: int
    pushed: bool

    @property
    def final(self) -> tuple[UUID, int, int]:
        return (self.line_id, self.sequence, self.billed)


def line_status(line: InvoiceLine, push: LinePush | None) -> LineStatus:
    pushed = (
        push is not None
        and push.pushed_sequence >= line.sequence
        and push.charged_through >= push.pushed_sequence
    )
    return LineStatus(line.id, line.sequence, line.billed, pushed)


def billed_shares(changes: Sequence[LineChange]) -> dict[UUID, int]:
    """Each transaction's billed share of the line whose changes these are, all of
    them in order from the first (see the module docstring); a re-priced transaction
    counts at its new amount, in the place it was settled."""
    held: dict[str, Decimal] = {}
    for change in changes:
        pairs = zip(change.transaction_ids, change.amounts, strict=True)
        if isinstance(change, InvoiceLine.Settled):
            held.update((t, Decimal(a)) for t, a in pairs)
        elif isinstance(change, InvoiceLine.Repriced):  # the new amount, in its place
            held.update((t, Decimal(a)) for t, a in pairs if t in held)
        else:
            for t, _ in pairs:
                held.pop(t, None)
    return {UUID(t): share for t, share in shares_in_order(held).items()}


def shares_in_order(held: Mapping[str, Decimal]) -> dict[str, int]:
    """The billed share of each transaction a line holds, ``held`` in settlement order
    (transaction id: exact amount)."""
    shares: dict[str, int] = {}
    total = Decimal(0)
    billed = 0
    for txn, amount in held.items():
        total = add_exact(total, amount)
        now_billed = round_minor(total)
        shares[txn] = now_billed - billed
        billed = now_billed
    return shares
