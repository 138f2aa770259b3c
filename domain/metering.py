"""The ingest decision for one batch of usage records (pure; the adapter saves the result).

Given valid usage records, the price list and a way to load accounts and invoice
lines, decide which transactions to create, which accounts and lines change, which
records are duplicates and which cannot be priced. Records whose transaction is
already recorded are skipped without a write; a reservation the spend limit refuses
becomes a Compensated transaction with the reason. Every reserved transaction joins
the invoice line of its customer, currency, meter and period (the period its usage
occurred in), in one ``Settled`` event per line per batch, and its ``Reserved``
names that line and the line's version: all in the batch's one save. A new line is
added to its invoice (``Invoice.Opened`` or ``LineAdded``) in the same save.

**Late usage.** Usage whose period's invoice has closed (its line frozen, or the invoice
closed before the line existed) is never dropped and never changes a closed invoice: it
goes to a *late* line of the customer's open period (the period of ``now``, or the one
after the usage's own if that is later), marked with the period it occurred in; if that
invoice has closed too (closed early by an operator), to the next period's. ``LineBook``
is that rule, shared by both forms below and by the pushers' adoption of older history.

Two forms of the same decision:

* ``meter_batch`` builds ``BillingTransaction`` aggregates and calls their methods:
  the reference, and what a reader should follow;
* ``domain.metering_events.meter_batch_events`` decides the same without building
  the transactions' aggregates: every transaction of a batch is new, so its whole
  history is known up front (Metered, then Reserved or Compensated); building and
  mutating an aggregate per record was most of the ingest's CPU time. Accounts, lines
  and invoices are still aggregates (a handful per batch).
  ``tests/unit/test_perf_metering_events.py`` proves both forms record the same events.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from functools import cached_property
from uuid import UUID

from domain.account import Burn, CustomerAccount
from domain.credit_line import CreditLine
from domain.credits import CREDITS_EXHAUSTED
from domain.errors import IllegalTransition, InvalidUsage
from domain.ids import transaction_id
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine
from domain.money import format_money
from domain.periods import Period, PeriodPolicy
from domain.price_book import PriceSchedule
from domain.pricing import PriceList
from domain.transaction import BillingTransaction, Source
from domain.usage import UsageRecord

__all__ = ["LineBook", "Metering", "MeteringDecision", "meter_batch", "refusal"]

AccountLoader = Callable[[str, str], CustomerAccount | None]
LineLoader = Callable[[UUID], InvoiceLine | None]
InvoiceLoader = Callable[[UUID], Invoice | None]

MAX_LATE_HOPS = 1000  # periods tried after a closed one (each closed early by hand)


@dataclass(frozen=True)
class Metering:
    """A valid usage record and where it came from."""

    record: UsageRecord
    source: Source

    @cached_property
    def transaction_id(self) -> UUID:
        """Computed once per record (a SHA-1 and a UUID object)."""
        return transaction_id(self.record.customer_id, self.record.usage_id)


@dataclass
class MeteringDecision:
    """What one batch changes."""

    transactions: list[BillingTransaction] = field(default_factory=list)
    accounts: list[CustomerAccount] = field(default_factory=list)
    lines: list[InvoiceLine] = field(default_factory=list)
    invoices: list[Invoice] = field(default_factory=list)  # opened or given a new line
    duplicates: list[Metering] = field(default_factory=list)
    rejected: list[tuple[Metering, str]] = field(default_factory=list)

    @property
    def refused(self) -> list[BillingTransaction]:
        """Transactions compensated at ingest because the limit refused them."""
        return [t for t in self.transactions if t.compensation_reason is not None]

    @property
    def aggregates(self) -> list[CustomerAccount | InvoiceLine | Invoice | BillingTransaction]:
        return [*self.accounts, *self.lines, *self.invoices, *self.transactions]


def meter_batch(
    batch: Sequence[Metering],
    prices: PriceList | PriceSchedule,
    *,
    load_account: AccountLoader,
    load_line: LineLoader,
    load_invoice: InvoiceLoader,
    periods: PeriodPolicy,
    now: datetime,
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
        burns = account.reserve_and_burn([(t.id, t.amount) for t in txns], now)
        book = LineBook(customer_id, currency, load_line, load_invoice, periods, now)
        by_line: dict[UUID, list[BillingTransaction]] = {}
        credited: list[tuple[UUID, InvoiceLine, Decimal]] = []
        for txn, burn in zip(txns, burns, strict=True):
            if burn.reserved:
                line = book.line_for(txn.meter, periods.period_of(txn.occurred_at))
                by_line.setdefault(line.id, []).append(txn)
                if burn.credit:
                    credited.append((txn.id, line, burn.credit))
            else:
                txn.compensate(refusal(account, txn.amount, burn))
        for line_id, members in by_line.items():
            line = book.lines[line_id]
            line.settle([(t.id, t.amount) for t in members])
            for txn in members:
                txn.reserve(account.id, line.id, line.sequence)
            decision.lines.append(line)
        decision.lines.extend(book.apply_credits(credited))
        decision.invoices.extend(book.touched_invoices())
        decision.accounts.append(account)
    return decision


class LineBook:
    """Which line a customer's usage in one currency joins (see the module docstring's
    late usage), loading each line and invoice once; the lines and invoices it opens
    or changes are the caller's to save with the usage."""

    def __init__(  # noqa: PLR0917
        self,
        customer_id: str,
        currency: str,
        load_line: LineLoader,
        load_invoice: InvoiceLoader,
        periods: PeriodPolicy,
        now: datetime,
    ) -> None:
        self.customer_id = customer_id
        self.currency = currency
        self.load_line = load_line
        self.load_invoice = load_invoice
        self.periods = periods
        self.now = now
        self.lines: dict[UUID, InvoiceLine] = {}
        self.invoices: dict[UUID, Invoice | None] = {}
        self._chosen: dict[tuple[str, Period], InvoiceLine] = {}
        self._credit_lines: dict[Period, CreditLine] = {}  # by the period of their invoice

    def line_for(self, meter: str, occurred: Period) -> InvoiceLine:
        """The line usage of ``meter`` that occurred in ``occurred`` joins (the same line
        for the rest of the batch: nothing in a batch freezes a line or closes an invoice,
        so the answer is kept rather than its id derived again per record)."""
        key = (meter, occurred)
        found = self._chosen.get(key)
        if found is None:
            found = self._chosen[key] = self._line_for(meter, occurred)
        return found

    def _line_for(self, meter: str, occurred: Period) -> InvoiceLine:
        found = self._usable(meter, occurred, None)
        if found is not None:
            return found
        period = max(self.periods.period_of(self.now), self.periods.next(occurred))
        for _ in range(MAX_LATE_HOPS):
            found = self._usable(meter, period, occurred)
            if found is not None:
                return found
            period = self.periods.next(period)
        # Every one of them closed early by hand: not this record's fault, nor a reason to
        # stop billing (the ingest worker sets the record aside with this reason).
        raise IllegalTransition(
            f"no open invoice within {MAX_LATE_HOPS} periods after {occurred.key}"
        )

    def apply_credits(
        self, credited: Sequence[tuple[UUID, InvoiceLine, Decimal]]
    ) -> list[CreditLine]:
        """Record each (transaction, its usage line, credit it consumed) on the credit line
        of the usage line's invoice (``domain.credit_line``), one event per credit line;
        the credit lines changed."""
        by_credit_line: dict[UUID, tuple[CreditLine, list[tuple[UUID, UUID, Decimal]]]] = {}
        of_line: dict[UUID, list[tuple[UUID, UUID, Decimal]]] = {}
        for txn_id, line, credit in credited:
            found = of_line.get(line.id)
            if found is None:
                credit_line = self._credit_line(line.period)
                found = by_credit_line.setdefault(credit_line.id, (credit_line, []))[1]
                of_line[line.id] = found
            found.append((txn_id, line.id, credit))
        for credit_line, entries in by_credit_line.values():
            credit_line.apply(entries)
        return [credit_line for credit_line, _ in by_credit_line.values()]

    def _credit_line(self, period: Period) -> CreditLine:
        """The credit line of ``period``'s invoice (open: a usage line of it took usage in
        this batch), opened and added to the invoice when new."""
        found = self._credit_lines.get(period)
        if found is None:
            loaded = self.load_line(CreditLine.id_for(self.customer_id, self.currency, period))
            if isinstance(loaded, CreditLine):
                found = loaded
            else:
                found = CreditLine.open_for(self.customer_id, self.currency, period)
                invoice = self._invoice(period)
                assert invoice is not None  # opened with its first usage line
                invoice.add_line(found.id)
            self._credit_lines[period] = found
        return found

    def touched_invoices(self) -> list[Invoice]:
        return [i for i in self.invoices.values() if i is not None and i.pending_events]

    def _usable(self, meter: str, period: Period, late_of: Period | None) -> InvoiceLine | None:
        """The line of ``meter`` on ``period``'s invoice if it takes usage, opened (and
        added to its invoice) when new; None when that invoice has closed."""
        line_id = InvoiceLine.create_id(
            self.customer_id, self.currency, meter, period.start,
            late_of.start if late_of is not None else None,
        )  # fmt: skip
        if line_id not in self.lines:
            loaded = self.load_line(line_id)
            if loaded is not None:
                self.lines[line_id] = loaded
        line = self.lines.get(line_id)
        if line is not None:
            return None if line.frozen else line
        invoice = self._invoice(period)
        if invoice is not None and invoice.is_closed:
            return None
        line = InvoiceLine.open(self.customer_id, self.currency, meter, period, late_of)
        if invoice is None:
            self.invoices[line.invoice_id] = Invoice.open(
                self.customer_id, self.currency, period, line.id
            )
        else:
            invoice.add_line(line.id)
        self.lines[line_id] = line
        return line

    def _invoice(self, period: Period) -> Invoice | None:
        key = Invoice.create_id(self.customer_id, self.currency, period.start)
        if key not in self.invoices:
            self.invoices[key] = self.load_invoice(key)
        return self.invoices[key]


def refusal(account: CustomerAccount, amount: Decimal, burn: Burn | None = None) -> str:
    """Why the account refuses ``amount`` (the Compensated event's reason): the credit
    policy ``block`` when its grants could not cover it, else the limit."""
    if burn is not None and burn.blocked:
        return CREDITS_EXHAUSTED
    assert account.spend_limit is not None  # only a limit refuses
    return (
        f"spend limit: {format_money(amount, account.currency)} would exceed the limit of"
        f" {format_money(account.spend_limit, account.currency)}"
    )
