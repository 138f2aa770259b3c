"""The ingest decision for one batch, without building a transaction aggregate per record.

``domain.metering.meter_batch`` is the reference: it builds a ``BillingTransaction``
per record and calls its methods. ``meter_batch_events`` decides the same (the same
pricing, ``BillingTransaction.metered_fields``; the same ``CustomerAccount.reserve_all``
and ``LineBook``; the same refusal) but keeps each new transaction as what decides its
history: the ``Metered`` fields, then either the account, line and line version it is
reserved on, or the limit's refusal. Every transaction of a batch is new, so its whole
history is known up front, and building and mutating an aggregate per record was most
of the ingest's CPU time. Accounts, lines and invoices are still aggregates (a handful
per batch).

From a ``NewTransaction`` come its two events (``metered``, ``then``: what
``BillingTransaction.from_usage`` and ``reserve`` or ``compensate`` record, built when
first asked for) or, for the store's fast path, its stored rows straight from the
fields (``store.ingest_rows``). ``tests/unit/test_perf_metering_events.py`` proves the
events are the aggregates' and ``tests/unit/test_ingest_rows.py`` that the rows are the
events' rows, byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from functools import cached_property
from typing import cast
from uuid import UUID

from eventsourcing.utils import get_topic

from domain.account import CustomerAccount
from domain.credit_line import CreditLine
from domain.errors import InvalidUsage
from domain.ids import account_id
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine
from domain.metering import (
    AccountLoader,
    InvoiceLoader,
    LineBook,
    LineLoader,
    Metering,
    Pending,
    settle_account,
)
from domain.periods import Period, PeriodPolicy
from domain.price_book import PriceSchedule, as_schedule
from domain.pricing import PriceList
from domain.transaction import BillingTransaction, TxnState

__all__ = ["MeteredBatch", "NewTransaction", "Reservation", "meter_batch_events"]

_TXN_TOPIC = get_topic(BillingTransaction)


@dataclass(frozen=True)
class Reservation:
    """Where a new transaction is reserved: its account, its line and the line's
    version (its sequence) after the batch's ``Settled``."""

    account_id: UUID
    line_id: UUID
    line_version: int


@dataclass(eq=False)
class NewTransaction(Pending):
    """A transaction a batch creates: its Metered fields (``BillingTransaction.
    metered_fields``, in the event's order), then its reservation or the limit's refusal
    (exactly one of the two once the batch is decided)."""

    reservation: Reservation | None = None

    @property
    def refusal(self) -> str | None:
        """Why the limit refused it, or None when it is reserved."""
        return self.refused

    @property
    def id(self) -> UUID:
        return self.metering.transaction_id

    @property
    def amount(self) -> Decimal:
        amount: Decimal = self.fields["amount"]
        return amount

    @property
    def compensation_reason(self) -> str | None:
        """Why the limit refused it, or None when it is reserved."""
        return self.refusal

    @cached_property
    def metered(self) -> BillingTransaction.Metered:
        """The Metered event ``BillingTransaction.from_usage`` records."""
        event_class = BillingTransaction.Metered
        return event_class(
            originator_id=self.id,
            originator_version=BillingTransaction.INITIAL_VERSION,
            timestamp=event_class.create_timestamp(),
            originator_topic=_TXN_TOPIC,
            **self.fields,
        )

    @cached_property
    def then(self) -> BillingTransaction.Reserved | BillingTransaction.Compensated:
        """What ``reserve`` or ``compensate`` records next on the just-Metered transaction."""
        version = BillingTransaction.INITIAL_VERSION + 1
        if self.refusal is not None:
            compensated = BillingTransaction.Compensated
            return compensated(  # type: ignore[call-arg]
                originator_id=self.id,
                originator_version=version,
                timestamp=compensated.create_timestamp(),
                reason=self.refusal,
                from_state=str(TxnState.METERED),
                stripe_reversal_id=None,
            )
        r = self.reservation
        if r is None:
            raise ValueError(f"transaction {self.id} is neither reserved nor refused")
        reserved = BillingTransaction.Reserved
        return reserved(  # type: ignore[call-arg]
            originator_id=self.id,
            originator_version=version,
            timestamp=reserved.create_timestamp(),
            account_id=r.account_id,
            line_id=r.line_id,
            line_version=r.line_version,
        )


@dataclass
class MeteredBatch:
    """What one batch changes: new transactions, accounts, lines and invoices."""

    transactions: list[NewTransaction] = field(default_factory=list)
    accounts: list[CustomerAccount] = field(default_factory=list)
    lines: list[InvoiceLine] = field(default_factory=list)
    invoices: list[Invoice] = field(default_factory=list)  # opened or given a new line
    duplicates: list[Metering] = field(default_factory=list)
    rejected: list[tuple[Metering, str]] = field(default_factory=list)

    @property
    def refused(self) -> list[NewTransaction]:
        """Transactions compensated at ingest because the limit refused them."""
        return [t for t in self.transactions if t.refusal is not None]

    @property
    def touched(self) -> list[CustomerAccount | InvoiceLine | Invoice]:
        """The aggregates the batch changes, in the order they are saved."""
        return [*self.accounts, *self.lines, *self.invoices]

    @property
    def transaction_events(self) -> list[BillingTransaction.Event]:
        """Every new transaction's events, in batch order (Metered, then the next)."""
        return [e for t in self.transactions for e in (t.metered, t.then)]


def meter_batch_events(
    batch: Sequence[Metering],
    prices: PriceList | PriceSchedule,
    *,
    load_account: AccountLoader,
    load_line: LineLoader,
    load_invoice: InvoiceLoader,
    periods: PeriodPolicy,
    now: datetime,
    already_recorded: Collection[UUID] = (),
    expect: Callable[[Sequence[UUID]], None] | None = None,
) -> MeteredBatch:
    """``meter_batch``'s decision, without the transactions' aggregates (see the module
    docstring).

    ``expect``, when given, is called once before anything is loaded with the ids of
    the accounts and lines the batch will load (each meter and period's own line: a
    late line or an invoice is loaded only when that one is closed or new; and each
    period's credit line, loaded only for an account with credit), so the caller can
    read them all in one query instead of one by one. It decides nothing.
    """
    result = MeteredBatch()
    schedule = as_schedule(prices)
    seen: set[UUID] = set(already_recorded)
    by_account: dict[tuple[str, str], list[NewTransaction]] = {}
    by_line: set[tuple[str, str]] = set()  # accounts with records priced by line quantity
    last: Period | None = None
    for metering in batch:
        txn_id = metering.transaction_id
        if txn_id in seen:
            result.duplicates.append(metering)
            continue
        occurred_at = metering.record.occurred_at
        # A batch's usage mostly falls in one period: reuse it rather than cut it again.
        if last is None or not last.start <= occurred_at < last.end:
            last = periods.period_of(occurred_at)
        try:
            fields, price = BillingTransaction.priced(
                metering.record, schedule, metering.source, last.start
            )
        except InvalidUsage as exc:
            result.rejected.append((metering, str(exc)))
            continue
        seen.add(txn_id)
        new = NewTransaction(metering, fields, last)
        result.transactions.append(new)
        key = (fields["customer_id"], fields["currency"])
        by_account.setdefault(key, []).append(new)
        if fields["amount"] is None:
            new.price = price
            by_line.add(key)

    if expect is not None:
        expect(_expected(by_account))
    for key, txns in by_account.items():
        customer_id, currency = key
        account = load_account(customer_id, currency) or CustomerAccount.open(customer_id, currency)
        book = LineBook(customer_id, currency, load_line, load_invoice, periods, now)
        settled_lines, credit_lines = settle_account(account, book, txns, by_line=key in by_line)
        for settled in settled_lines:
            line = settled.line
            reservation = Reservation(account.id, line.id, line.sequence)
            for txn in cast("list[NewTransaction]", settled.members):
                txn.reservation = reservation
            result.lines.append(line)
        result.lines.extend(credit_lines)
        result.invoices.extend(book.touched_invoices())
        result.accounts.append(account)
    if by_line:  # a record priced on its line may yet be rejected (its amount is too large)
        result.rejected += [(t.metering, t.rejected) for t in result.transactions if t.rejected]
        result.transactions = [t for t in result.transactions if t.rejected is None]
    return result


def _expected(by_account: dict[tuple[str, str], list[NewTransaction]]) -> list[UUID]:
    """The accounts, and each meter and period's own line, a decision loads first."""
    ids: list[UUID] = []
    for (customer_id, currency), txns in by_account.items():
        ids.append(account_id(customer_id, currency))
        keys = {
            (
                t.fields["meter"],
                t.period,
                t.fields["price_version"] if t.fields["amount"] is None else None,
            )
            for t in txns
        }
        ids.extend(
            InvoiceLine.create_id(
                customer_id, currency, meter, period.start, None, price_version=version
            )
            for meter, period, version in keys
        )
        # Each period's credit line, in the same read: loaded only for an account with
        # credit (domain.credit_line), it costs the others nothing but an id in the query.
        ids.extend(CreditLine.id_for(customer_id, currency, p) for p in {p for _, p, _ in keys})
    return ids
