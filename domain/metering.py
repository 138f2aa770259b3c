"""The ingest decision for one batch of usage records (pure; the adapter saves the result).

Given valid usage records, the price list and a way to load accounts, decide which
transactions to create, which accounts change, which records are duplicates and
which cannot be priced. Records whose transaction is already recorded are skipped
without a write; a reservation the spend limit refuses becomes a Compensated
transaction with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from uuid import UUID

from domain.account import CustomerAccount
from domain.errors import InvalidUsage
from domain.ids import transaction_id
from domain.pricing import PriceList
from domain.transaction import BillingTransaction, Source
from domain.usage import UsageRecord

__all__ = ["Metering", "MeteringDecision", "meter_batch"]

AccountLoader = Callable[[str, str], CustomerAccount | None]


@dataclass(frozen=True)
class Metering:
    """A valid usage record and where it came from."""

    record: UsageRecord
    source: Source

    @property
    def transaction_id(self) -> UUID:
        return transaction_id(self.record.customer_id, self.record.usage_id)


@dataclass
class MeteringDecision:
    """What one batch changes."""

    transactions: list[BillingTransaction] = field(default_factory=list)
    accounts: list[CustomerAccount] = field(default_factory=list)
    duplicates: list[Metering] = field(default_factory=list)
    rejected: list[tuple[Metering, str]] = field(default_factory=list)

    @property
    def refused(self) -> list[BillingTransaction]:
        """Transactions compensated at ingest because the limit refused them."""
        return [t for t in self.transactions if t.compensation_reason is not None]

    @property
    def aggregates(self) -> list[CustomerAccount | BillingTransaction]:
        return [*self.accounts, *self.transactions]


def meter_batch(
    batch: Sequence[Metering],
    prices: PriceList,
    *,
    load_account: AccountLoader,
    already_recorded: Collection[UUID] = (),
) -> MeteringDecision:
    """Decide the events for ``batch`` (see the module docstring)."""
    decision = MeteringDecision()
    seen: set[UUID] = set(already_recorded)
    by_account: dict[tuple[str, str], list[BillingTransaction]] = {}
    for metering in batch:
        txn_id = metering.transaction_id
        if txn_id in seen:
            decision.duplicates.append(metering)
            continue
        try:
            txn = BillingTransaction.from_usage(metering.record, prices, metering.source)
        except InvalidUsage as exc:
            decision.rejected.append((metering, str(exc)))
            continue
        seen.add(txn_id)
        decision.transactions.append(txn)
        by_account.setdefault((txn.customer_id, txn.currency), []).append(txn)

    for (customer_id, currency), txns in by_account.items():
        account = load_account(customer_id, currency) or CustomerAccount.open(customer_id, currency)
        granted = account.reserve_all([(t.id, t.amount) for t in txns])
        for txn, ok in zip(txns, granted, strict=True):
            if ok:
                txn.reserve(account.id)
            else:
                txn.compensate(_refusal(account, txn))
        decision.accounts.append(account)
    return decision


def _refusal(account: CustomerAccount, txn: BillingTransaction) -> str:
    return (
        f"spend limit: {txn.amount} {txn.currency} would exceed the limit of "
        f"{account.spend_limit} {txn.currency}"
    )
