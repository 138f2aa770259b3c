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

**The true-up of a minimum commitment.** A customer's contract may set a minimum per
period in the invoice's currency, for the whole invoice or for one meter
(``domain.contract``). When the invoice closes, the contract version in force at the
period's last moment decides: for each meter minimum its lines (usage and late usage
alike, each rounded once) fall short of, a *true-up line* of that meter (meter
``TRUE_UP_PREFIX`` + its name); then, if all the lines, those included, sum below the
invoice's minimum, a true-up line of the invoice (meter ``TRUE_UP_METER``). Each holds one
entry, the shortfall ``max(0, minimum - usage)`` in whole minor units
(``domain.contract.true_up``: nothing to round), recorded in the save of ``Closed`` with
the lines frozen. From there it is a line like any other: pushed to its own
Stripe invoice item under the line's keys, part of ``FinalizeStarted``'s total, compared
by the read-back. Only usage lines count toward a minimum: the prepaid credit line
(``domain.credit_line``) does not, so credit pays the true-up like the usage. Its entry's
id is ``domain.ids.true_up_id(invoice, meter)``: no transaction, no account (a minimum
does not count against a spend limit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from uuid import UUID

from domain.contract import ContractSchedule, true_up
from domain.credit_line import CREDIT_METER
from domain.ids import true_up_id
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine, LineChange, LinePush
from domain.invoice_states import InvoiceState
from domain.money import add_exact, round_minor

__all__ = [
    "TRUE_UP_METER",
    "TRUE_UP_PREFIX",
    "LineStatus",
    "billed_shares",
    "close_deadline",
    "due_to_close",
    "is_true_up",
    "line_status",
    "shares_in_order",
    "true_up_lines",
    "true_ups",
]

TRUE_UP_METER = "(minimum commitment)"
"""The meter name of the invoice's true-up line (a price book meter of this name would
share it); a meter's own true-up line is ``TRUE_UP_PREFIX`` and the meter's name."""
TRUE_UP_PREFIX = TRUE_UP_METER + " "


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


def counts_toward_minimum(meter: str) -> bool:
    """Whether a line of ``meter`` counts toward a minimum commitment: usage lines do;
    true-up lines (the minimum's own) and the prepaid credit line do not (a minimum is
    of usage: credit the customer paid in advance pays the invoice, it is not usage)."""
    return meter != CREDIT_METER and not is_true_up(meter)


def is_true_up(meter: str) -> bool:
    """Whether a line of ``meter`` is a true-up line (of the whole invoice or of a meter)."""
    return meter == TRUE_UP_METER or meter.startswith(TRUE_UP_PREFIX)


def true_up_lines(
    invoice: Invoice, lines: Sequence[InvoiceLine], contract: ContractSchedule | None
) -> list[InvoiceLine]:
    """The true-up lines closing ``invoice`` (with ``lines``, as they are frozen) adds, each
    with its shortfall settled; none when no minimum applies or the lines reach them (see
    the module docstring)."""
    billed: dict[str, int] = {}
    for line in lines:
        if counts_toward_minimum(line.meter):
            billed[line.meter] = billed.get(line.meter, 0) + line.billed
    out = []
    for meter, owed in true_ups(contract, invoice.period_end, invoice.currency, billed).items():
        line = InvoiceLine.open(invoice.customer_id, invoice.currency, meter, invoice.period)
        line.settle([(true_up_id(invoice.id, meter), Decimal(owed))])
        out.append(line)
    return out


def true_ups(
    contract: ContractSchedule | None,
    period_end: datetime,
    currency: str,
    billed: Mapping[str, int],
) -> dict[str, int]:
    """The true-up lines an invoice of ``currency`` for the period ending at ``period_end``
    owes, by their meter name, given what its usage lines bill by meter (``billed``): a
    meter's minimum against that meter's lines, then the invoice's minimum against every
    line, the meters' true-ups included. Only those owing more than 0. The close's rule,
    the preview's and the audit's."""
    version = None if contract is None else contract.at_end_of(period_end)
    if version is None:
        return {}
    out: dict[str, int] = {}
    for meter, minimum in sorted(version.meter_minimums.get(currency, {}).items()):
        owed = true_up(minimum, billed.get(meter, 0))
        if owed:
            out[TRUE_UP_PREFIX + meter] = owed
    whole = version.minimums.get(currency)
    if whole is not None:
        owed = true_up(whole, sum(billed.values()) + sum(out.values()))
        if owed:
            out[TRUE_UP_METER] = owed
    return out
