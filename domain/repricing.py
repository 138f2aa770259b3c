"""Re-pricing recorded usage (pure): what a price book version published for a moment in
the past changes on a line that is still open.

A version may take effect before the moment it is published (``domain.price_book``):
usage recorded before it was published names the version that was in force then, no
longer the one in force at its ``occurred_at`` now. ``decide_line`` is the **one**
decision of what such usage costs now, per line: given an invoice line, the
transactions of it to look at and the schedule, it says, per transaction, the version
in force at its ``occurred_at`` and its new exact amount (``Repricing``), or why it is
left alone (``LeftAlone``: the new version has no price for its meter, prices it in
another currency, or cannot price its quantity within the bounds of ``domain.money``).
A transaction already priced by the version in force, or not in the line, or
compensated (released usage is not owed) needs nothing and is not listed.

Per-unit prices: the new amount is quantity x the version's price, exact, as ingest
prices a record (``Price.exact_amount``). Left alone, with the reason in the report: a
line priced by quantity (tiers, packages, a flat fee: the version in force at its
period's start prices it whole, so a version for a later moment does not apply to it,
and one for the period's very start opens a line of its own for what comes after it),
and usage a contract priced (a contract's prices are not re-priced yet). Re-pricing a
tiered line (its increments depend on the line's other usage in settlement order) would
decide here too, which is why the decision takes a line with its transactions rather
than one transaction.

**While the invoice is a draft** (open, or closed and not yet finalizing: the states
in which a removal still lowers a line), ``apply_repricing`` records a decision on the
aggregates, all to be saved in one save: each transaction's ``Repriced`` (old and new
version and amount), the line's ``Repriced`` (old and new amounts, the new exact total,
billed rounded once), the account's ``AmountsRepriced`` (its hold moves by the
differences, never refused by the spend limit: ``domain.account``) and, on a closed
invoice, its ``Adjusted`` (so a closer that starts finalizing meanwhile loses the
version race, and the line's new total is pushed before the invoice finalizes).
Prepaid credit a re-priced transaction consumed (``domain.credit_line``) stays as it
was: its grant and the invoice's credit line are not changed (a limitation, documented
with the credits: a lower price can leave the credit line above its usage line).

**Once the invoice is finalizing or final** nothing is changed: the decision is reported
(what the ledger bills, what the version in force would make it). On a final invoice
whose billed total would change, ``final_attention`` is the reason the invoice needs an
operator (``Invoice.need_attention``: counted by queue health, listed with the
invoices that need attention): a credit note for a lower price, or billing the
difference later, is the operator's call, recorded with ``billing-ledger invoices
settle``. The same reason is raised once, even after it was settled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from uuid import UUID

from domain.account import CustomerAccount
from domain.errors import IllegalTransition, InvalidUsage
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine
from domain.invoice_states import FINAL_STATES, InvoiceState
from domain.money import add_exact, format_money, round_minor, subtract_exact
from domain.periods import Period
from domain.price_book import PriceSchedule, PriceVersion
from domain.pricing import Price
from domain.transaction import ALLOWED_FROM, BillingTransaction

__all__ = [
    "DRAFT_STATES",
    "LeftAlone",
    "LineRepricing",
    "Repricing",
    "apply_repricing",
    "decide_line",
    "final_attention",
]

DRAFT_STATES = (InvoiceState.OPEN, InvoiceState.CLOSED)
"""The invoice states in which a line is re-priced (Stripe's invoice is a draft and no
finalizing has started)."""


@dataclass(frozen=True)
class Repricing:
    """One transaction priced again: the version named before and the one in force now."""

    transaction_id: UUID
    old_version: int
    version: PriceVersion
    price: Price
    old_amount: Decimal
    amount: Decimal


@dataclass(frozen=True)
class LeftAlone:
    """A transaction priced by a version no longer in force that is not priced again."""

    transaction_id: UUID
    reason: str


@dataclass(frozen=True)
class LineRepricing:
    """What re-pricing decides for one line (``decide_line``)."""

    line_id: UUID
    customer_id: str
    currency: str
    meter: str
    period: Period
    frozen: bool  # its invoice has closed (re-priced while not finalizing)
    exact_total: Decimal  # the line's exact total now
    changes: tuple[Repricing, ...] = ()
    left: tuple[LeftAlone, ...] = ()

    @property
    def new_exact_total(self) -> Decimal:
        """The line's exact total once every change is recorded."""
        total = self.exact_total
        for change in self.changes:
            total = add_exact(subtract_exact(total, change.old_amount), change.amount)
        return total

    @property
    def billed(self) -> int:
        return round_minor(self.exact_total)

    @property
    def new_billed(self) -> int:
        """The billed amount once every change is recorded (rounded once)."""
        return round_minor(self.new_exact_total)


def decide_line(
    line: InvoiceLine, transactions: Iterable[BillingTransaction], schedule: PriceSchedule
) -> LineRepricing:
    """What ``schedule`` makes of ``transactions`` of ``line`` now (see the module
    docstring): the one decision of re-pricing."""
    changes: list[Repricing] = []
    left: list[LeftAlone] = []
    for txn in transactions:
        if txn.line_id != line.id or txn.state not in ALLOWED_FROM["Repriced"]:
            continue
        version = schedule.price_at(txn.occurred_at)
        if (version.book_id, version.number) == (txn.price_book_id, txn.price_version):
            continue
        decided = _priced(txn, version, line)
        if isinstance(decided, str):
            left.append(LeftAlone(txn.id, decided))
        else:
            changes.append(decided)
    return LineRepricing(
        line.id,
        line.customer_id,
        line.currency,
        line.meter,
        line.period,
        line.frozen,
        line.exact_total,
        tuple(changes),
        tuple(left),
    )


def _priced(txn: BillingTransaction, version: PriceVersion, line: InvoiceLine) -> Repricing | str:
    """``txn`` priced by ``version``, or why it cannot be."""
    price = version.prices.prices.get(txn.meter)
    if price is None:
        return f"version {version.number} has no price for meter {txn.meter!r}"
    if line.price_version is not None or price.by_line:
        return (
            f"priced by line quantity: the tiers in force at the period's start price the"
            f" whole line (version {version.number} is not applied to it)"
        )
    if txn.contract_version is not None:
        return (
            f"priced by contract version {txn.contract_version}: a contract's prices are"
            " not re-priced"
        )
    if price.currency != txn.currency:
        return (
            f"version {version.number} prices {txn.meter!r} in {price.currency}, the usage is"
            f" in {txn.currency}"
        )
    try:
        amount = price.exact_amount(txn.quantity)
    except InvalidUsage as exc:
        return f"version {version.number} cannot price {txn.quantity} of {txn.meter!r}: {exc}"
    return Repricing(txn.id, txn.price_version, version, price, txn.amount, amount)


def apply_repricing(
    decision: LineRepricing,
    line: InvoiceLine,
    transactions: Mapping[UUID, BillingTransaction],
    account: CustomerAccount,
    invoice: Invoice,
) -> None:
    """Record ``decision`` on the line, its transactions, the account and, when it has
    closed, the invoice (to be saved together); IllegalTransition, and nothing recorded,
    when the invoice is finalizing or final (see the module docstring)."""
    if invoice.state not in DRAFT_STATES or invoice.id != line.invoice_id:
        raise IllegalTransition(
            f"line {line.id}: its invoice {invoice.id} is {invoice.state}, not a draft"
        )
    if line.id != decision.line_id:
        raise ValueError(f"the decision is about line {decision.line_id}, not {line.id}")
    moved = [(c.transaction_id, c.old_amount, c.amount) for c in decision.changes]
    moved = [entry for entry in moved if entry[1] != entry[2]]
    if moved and invoice.state is InvoiceState.CLOSED:
        invoice.adjust(line.id, [t for t, _, _ in moved], _adjusted(decision))
    line.reprice(moved)
    for change in decision.changes:
        transactions[change.transaction_id].reprice(change.version, change.price, change.amount)
    account.reprice(moved)


def _adjusted(decision: LineRepricing) -> str:
    versions = sorted({c.version.number for c in decision.changes})
    return f"re-priced by price book version {', '.join(map(str, versions))}"


def final_attention(decision: LineRepricing, invoice: Invoice) -> str | None:
    """Why ``invoice``, final, needs an operator after ``decision`` about one of its lines:
    what it bills and what the versions in force would make it; None when it is not
    final, when the billed amount would not change, or when that was raised before."""
    if invoice.state not in FINAL_STATES or decision.new_billed == decision.billed:
        return None
    versions = sorted({c.version.number for c in decision.changes})
    reason = (
        f"re-priced by price book version {', '.join(map(str, versions))} after it was"
        f" finalized: line {decision.line_id} ({decision.meter}) bills"
        f" {format_money(decision.billed, decision.currency)}, the prices in force make it"
        f" {format_money(decision.new_billed, decision.currency)}; issue a credit note or"
        " bill the difference, then settle"
    )
    return None if reason in invoice.raised else reason
