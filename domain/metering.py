"""The ingest decision for one batch of usage records (pure; the adapter saves the result).

Given valid usage records, the price list and a way to load accounts and invoice
lines, decide which transactions to create, which accounts and lines change, which
records are duplicates and which cannot be priced. Records whose transaction is
already recorded are skipped without a write; a reservation the spend limit refuses
becomes a Compensated transaction with the reason. Every reserved transaction joins
the invoice line of its customer, currency, meter and period (the period its usage
occurred in), in one ``Settled`` event per line per batch, and its ``Reserved``
names that line and the line's version: all in the batch's one save.

Two forms of the same decision:

* ``meter_batch`` builds ``BillingTransaction`` aggregates and calls their methods:
  the reference, and what a reader should follow;
* ``meter_batch_events`` returns the very events those methods record, without
  building the aggregates. Every transaction of a batch is new, so its whole
  history is known up front (Metered, then Reserved or Compensated); building and
  mutating an aggregate per record was most of the ingest's CPU time. Accounts are
  still aggregates (a handful per batch). ``tests/unit/test_perf_metering_events.py``
  proves both forms record the same events.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cached_property
from uuid import UUID

from eventsourcing.utils import get_topic

from domain.account import CustomerAccount
from domain.errors import InvalidUsage
from domain.ids import transaction_id
from domain.invoice_line import InvoiceLine
from domain.periods import Period, PeriodPolicy
from domain.pricing import PriceList
from domain.transaction import BillingTransaction, Source, TxnState
from domain.usage import UsageRecord

__all__ = [
    "MeteredBatch",
    "Metering",
    "MeteringDecision",
    "NewTransaction",
    "meter_batch",
    "meter_batch_events",
]

AccountLoader = Callable[[str, str], CustomerAccount | None]
LineLoader = Callable[[str, str, str, Period], InvoiceLine | None]

_TXN_TOPIC = get_topic(BillingTransaction)


@dataclass(frozen=True)
class Metering:
    """A valid usage record and where it came from."""

    record: UsageRecord
    source: Source

    @cached_property
    def transaction_id(self) -> UUID:
        """Computed once per record (a uuid5 is a SHA-1 and a UUID object)."""
        return transaction_id(self.record.customer_id, self.record.usage_id)


@dataclass
class MeteringDecision:
    """What one batch changes."""

    transactions: list[BillingTransaction] = field(default_factory=list)
    accounts: list[CustomerAccount] = field(default_factory=list)
    lines: list[InvoiceLine] = field(default_factory=list)
    duplicates: list[Metering] = field(default_factory=list)
    rejected: list[tuple[Metering, str]] = field(default_factory=list)

    @property
    def refused(self) -> list[BillingTransaction]:
        """Transactions compensated at ingest because the limit refused them."""
        return [t for t in self.transactions if t.compensation_reason is not None]

    @property
    def aggregates(self) -> list[CustomerAccount | InvoiceLine | BillingTransaction]:
        return [*self.accounts, *self.lines, *self.transactions]


def meter_batch(
    batch: Sequence[Metering],
    prices: PriceList,
    *,
    load_account: AccountLoader,
    load_line: LineLoader,
    periods: PeriodPolicy,
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
        by_line: dict[tuple[str, Period], list[BillingTransaction]] = {}
        for txn, ok in zip(txns, granted, strict=True):
            if ok:
                by_line.setdefault((txn.meter, periods.period_of(txn.occurred_at)), []).append(txn)
            else:
                txn.compensate(_refusal(account, txn.amount))
        for (meter, period), members in by_line.items():
            line = _line(load_line, customer_id, currency, meter, period)
            line.settle([(t.id, t.amount) for t in members])
            for txn in members:
                txn.reserve(account.id, line.id, line.sequence)
            decision.lines.append(line)
        decision.accounts.append(account)
    return decision


def _line(
    load_line: LineLoader, customer_id: str, currency: str, meter: str, period: Period
) -> InvoiceLine:
    return load_line(customer_id, currency, meter, period) or InvoiceLine.open(
        customer_id, currency, meter, period
    )


# -- the same decision, as events --------------------------------------------------------


@dataclass(frozen=True)
class NewTransaction:
    """A transaction a batch creates, as the events that start its history."""

    metered: BillingTransaction.Metered
    then: BillingTransaction.Reserved | BillingTransaction.Compensated

    @property
    def id(self) -> UUID:
        return self.metered.originator_id

    @property
    def amount(self) -> Decimal:
        return self.metered.amount

    @property
    def compensation_reason(self) -> str | None:
        """Why the limit refused it, or None when it is reserved."""
        if isinstance(self.then, BillingTransaction.Compensated):
            return self.then.reason
        return None


@dataclass
class MeteredBatch:
    """What one batch changes: new transactions as events, accounts as aggregates."""

    transactions: list[NewTransaction] = field(default_factory=list)
    accounts: list[CustomerAccount] = field(default_factory=list)
    lines: list[InvoiceLine] = field(default_factory=list)
    duplicates: list[Metering] = field(default_factory=list)
    rejected: list[tuple[Metering, str]] = field(default_factory=list)

    @property
    def refused(self) -> list[NewTransaction]:
        """Transactions compensated at ingest because the limit refused them."""
        return [t for t in self.transactions if t.compensation_reason is not None]

    @property
    def transaction_events(self) -> list[BillingTransaction.Event]:
        """Every new transaction's events, in batch order (Metered, then the next)."""
        return [e for t in self.transactions for e in (t.metered, t.then)]


def meter_batch_events(
    batch: Sequence[Metering],
    prices: PriceList,
    *,
    load_account: AccountLoader,
    load_line: LineLoader,
    periods: PeriodPolicy,
    already_recorded: Collection[UUID] = (),
) -> MeteredBatch:
    """``meter_batch``'s decision as the events it records (see the module docstring)."""
    result = MeteredBatch()
    seen: set[UUID] = set(already_recorded)
    metered: list[BillingTransaction.Metered] = []
    by_account: dict[tuple[str, str], list[BillingTransaction.Metered]] = {}
    for metering in batch:
        txn_id = metering.transaction_id
        if txn_id in seen:
            result.duplicates.append(metering)
            continue
        try:
            event = metered_event(txn_id, metering.record, prices, metering.source)
        except InvalidUsage as exc:
            result.rejected.append((metering, str(exc)))
            continue
        seen.add(txn_id)
        metered.append(event)
        by_account.setdefault((event.customer_id, event.currency), []).append(event)

    then: dict[UUID, BillingTransaction.Reserved | BillingTransaction.Compensated] = {}
    for (customer_id, currency), events in by_account.items():
        account = load_account(customer_id, currency) or CustomerAccount.open(customer_id, currency)
        granted = account.reserve_all([(e.originator_id, e.amount) for e in events])
        by_line: dict[tuple[str, Period], list[BillingTransaction.Metered]] = {}
        for event, ok in zip(events, granted, strict=True):
            if ok:
                key = (event.meter, periods.period_of(event.occurred_at))
                by_line.setdefault(key, []).append(event)
            else:
                then[event.originator_id] = _compensated(event, account)
        for (meter, period), members in by_line.items():
            line = _line(load_line, customer_id, currency, meter, period)
            line.settle([(e.originator_id, e.amount) for e in members])
            for event in members:
                then[event.originator_id] = _reserved(event, account.id, line)
            result.lines.append(line)
        result.accounts.append(account)
    result.transactions = [NewTransaction(m, then[m.originator_id]) for m in metered]
    return result


def metered_event(
    txn_id: UUID, record: UsageRecord, prices: PriceList, source: Source
) -> BillingTransaction.Metered:
    """The Metered event ``BillingTransaction.from_usage`` records for ``record``
    (priced by the same ``BillingTransaction.metered_fields``)."""
    event_class = BillingTransaction.Metered
    return event_class(
        originator_id=txn_id,
        originator_version=BillingTransaction.INITIAL_VERSION,
        timestamp=event_class.create_timestamp(),
        originator_topic=_TXN_TOPIC,
        **BillingTransaction.metered_fields(record, prices, source),
    )


def _reserved(
    metered: BillingTransaction.Metered, account_id: UUID, line: InvoiceLine
) -> BillingTransaction.Reserved:
    """What ``BillingTransaction.reserve`` records on a just-Metered transaction."""
    event_class = BillingTransaction.Reserved
    return event_class(  # type: ignore[call-arg]
        originator_id=metered.originator_id,
        originator_version=metered.originator_version + 1,
        timestamp=event_class.create_timestamp(),
        account_id=account_id,
        line_id=line.id,
        line_version=line.sequence,
    )


def _compensated(
    metered: BillingTransaction.Metered, account: CustomerAccount
) -> BillingTransaction.Compensated:
    """What ``BillingTransaction.compensate`` records on a just-Metered transaction."""
    event_class = BillingTransaction.Compensated
    return event_class(  # type: ignore[call-arg]
        originator_id=metered.originator_id,
        originator_version=metered.originator_version + 1,
        timestamp=event_class.create_timestamp(),
        reason=_refusal(account, metered.amount),
        from_state=str(TxnState.METERED),
        stripe_reversal_id=None,
    )


def _refusal(account: CustomerAccount, amount: Decimal) -> str:
    return (
        f"spend limit: {amount:f} {account.currency} would exceed the limit of "
        f"{account.spend_limit} {account.currency}"
    )
