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
prices a record (``Price.exact_amount``). Tiered pricing models (a line's total is a
function of its total quantity; a record's amount its increment) will decide here too,
which is why the decision takes a line with its transactions rather than one
transaction: a tier's increments depend on the line's other usage in settlement order.

``apply_repricing`` records a decision on the aggregates, all to be saved in one save:
each transaction's ``Repriced`` (old and new version and amount), the line's
``Repriced`` (old and new amounts, the new exact total, billed rounded once) and the
account's ``AmountsRepriced`` (its hold moves by the differences, never refused by the
spend limit: ``domain.account``). A frozen line (its invoice has closed) is never
changed: its decision is reported (what the ledger bills now, what the new version
would make it), and what to do about it is the operator's call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from uuid import UUID

from domain.account import CustomerAccount
from domain.errors import IllegalTransition, InvalidUsage
from domain.invoice_line import InvoiceLine
from domain.money import add_exact, round_minor
from domain.periods import Period
from domain.price_book import PriceSchedule, PriceVersion
from domain.pricing import Price
from domain.transaction import ALLOWED_FROM, BillingTransaction

__all__ = ["LeftAlone", "LineRepricing", "Repricing", "apply_repricing", "decide_line"]


@dataclass(frozen=True)
class Repricing:
    """One transaction priced again: the version named before and the one in force now."""

    transaction_id: UUID
    old_version: int
    version: PriceVersion
    price: Price
    old_amount: Decimal
    amount: Decimal

    @property
    def changes_amount(self) -> bool:
        return self.amount != self.old_amount


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
    frozen: bool  # its invoice has closed: reported, never changed
    exact_total: Decimal  # the line's exact total now
    changes: tuple[Repricing, ...] = ()
    left: tuple[LeftAlone, ...] = ()

    @property
    def new_exact_total(self) -> Decimal:
        """The line's exact total once every change is recorded."""
        total = self.exact_total
        for change in self.changes:
            total = add_exact(add_exact(total, -change.old_amount), change.amount)
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
        decided = _priced(txn, version)
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


def _priced(txn: BillingTransaction, version: PriceVersion) -> Repricing | str:
    """``txn`` priced by ``version``, or why it cannot be."""
    price = version.prices.prices.get(txn.meter)
    if price is None:
        return f"version {version.number} has no price for meter {txn.meter!r}"
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
) -> None:
    """Record ``decision`` on the line, its transactions and the account (to be saved
    together); IllegalTransition when the line is frozen (nothing recorded)."""
    if line.frozen or decision.frozen:
        raise IllegalTransition(f"line {line.id} is frozen: its invoice has closed")
    if line.id != decision.line_id:
        raise ValueError(f"the decision is about line {decision.line_id}, not {line.id}")
    moved = [(c.transaction_id, c.old_amount, c.amount) for c in decision.changes]
    moved = [entry for entry in moved if entry[1] != entry[2]]
    line.reprice(moved)
    for change in decision.changes:
        transactions[change.transaction_id].reprice(change.version, change.price, change.amount)
    account.reprice(moved)
