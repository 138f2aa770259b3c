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

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from functools import cached_property
from typing import Any
from uuid import UUID

from domain.account import Burn, CustomerAccount
from domain.alerts import Spend
from domain.credit_line import CreditLine
from domain.credits import CREDITS_EXHAUSTED
from domain.errors import IllegalTransition, InvalidUsage
from domain.ids import transaction_id
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine
from domain.money import canonical, format_money
from domain.periods import Period, PeriodPolicy
from domain.price_book import PriceSchedule, as_schedule
from domain.pricing import Price, PriceList
from domain.transaction import BillingTransaction, Source
from domain.usage import UsageRecord

__all__ = [
    "LineBook",
    "Metering",
    "MeteringDecision",
    "Pending",
    "SettledLine",
    "batch_order",
    "meter_batch",
    "refusal",
    "settle_account",
]

AccountLoader = Callable[[str, str], CustomerAccount | None]
LineLoader = Callable[[UUID], InvoiceLine | None]
InvoiceLoader = Callable[[UUID], Invoice | None]

MAX_LATE_HOPS = 1000
_0 = Decimal(0)  # periods tried after a closed one (each closed early by hand)


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
    schedule = as_schedule(prices)
    seen: set[UUID] = set(already_recorded)
    by_account: dict[tuple[str, str], list[Pending]] = {}
    by_line: set[tuple[str, str]] = set()  # accounts with records priced by line quantity
    for metering in batch:
        txn_id = metering.transaction_id
        if txn_id in seen:
            decision.duplicates.append(metering)
            continue
        period = periods.period_of(metering.record.occurred_at)
        try:
            fields, price = BillingTransaction.priced(
                metering.record, schedule, metering.source, period.start
            )
        except InvalidUsage as exc:
            decision.rejected.append((metering, str(exc)))
            continue
        seen.add(txn_id)
        key = (fields["customer_id"], fields["currency"])
        if fields["amount"] is None:
            by_line.add(key)
            by_account.setdefault(key, []).append(Pending(metering, fields, period, price=price))
        else:
            by_account.setdefault(key, []).append(Pending(metering, fields, period))

    for key, items in by_account.items():
        customer_id, currency = key
        account = load_account(customer_id, currency) or CustomerAccount.open(customer_id, currency)
        book = LineBook(customer_id, currency, load_line, load_invoice, periods, now)
        settled, credit_lines = settle_account(account, book, items, by_line=key in by_line)
        for item in items:
            if item.rejected is not None:
                decision.rejected.append((item.metering, item.rejected))
                continue
            txn = BillingTransaction(**item.fields)
            if item.refused is not None:
                txn.compensate(item.refused)
            decision.transactions.append(txn)
            item.transaction = txn
        for line in settled:
            for item in line.members:
                assert item.transaction is not None
                item.transaction.reserve(account.id, line.line.id, line.line.sequence)
            decision.lines.append(line.line)
        decision.lines.extend(credit_lines)
        decision.invoices.extend(book.touched_invoices())
        decision.accounts.append(account)
    decision.transactions.sort(key=batch_order(batch))
    return decision


def batch_order(batch: Sequence[Metering]) -> Callable[[Any], int]:
    """A sort key putting a batch's transactions (anything with an ``id``) in batch order."""
    order: dict[UUID, int] = {}
    for n, metering in enumerate(batch):
        order.setdefault(metering.transaction_id, n)  # a duplicate's first place
    return lambda txn: order[txn.id]


@dataclass(eq=False)
class Pending:
    """A priced record of a batch, before its account decides it: its ``Metered`` fields
    (``amount`` None until its line prices it, for a price by line quantity), the period
    it occurred in, and then the limit's refusal or a reason it cannot be priced."""

    metering: Metering
    fields: dict[str, Any]
    period: Period
    refused: str | None = None
    rejected: str | None = None
    transaction: Any = None  # the form's own transaction, for its caller
    price: Price | None = None  # the price that prices it on its line (by line quantity)


@dataclass
class SettledLine:
    """A line and the records a batch settles into it, in order (and, for a line priced
    by quantity, its price and its quantity after them)."""

    line: InvoiceLine
    members: list[Pending] = field(default_factory=list)
    price: Price | None = None
    quantity: Decimal = Decimal(0)
    credits: list[Decimal] = field(default_factory=list)  # the prepaid credit they consumed


def settle_account(
    account: CustomerAccount,
    book: LineBook,
    items: Sequence[Pending],
    *,
    by_line: bool,
) -> tuple[list[SettledLine], list[CreditLine]]:
    """Decide one account's records of a batch, in order: reserve each against the limit
    and burn it down the account's prepaid credit (``CustomerAccount.reserve_and_burn``),
    settle each reserved one into its line (one ``Settled`` per line), record the credit
    it consumed on its invoice's credit line (``LineBook.apply_credits``), mark the
    refused (``Pending.refused``: by the limit, or by the credit policy ``block``) and
    those that cannot be priced on their line (``Pending.rejected``: a dead letter).
    Shared by both forms of the decision. The usage lines, and the credit lines changed.

    A record priced by line quantity is priced when its line is chosen, *before* the
    account reserves it: its amount is what it adds to the line's quantity so far in
    settlement order (``BillingTransaction.priced_on_line``); a refused one adds nothing.
    A batch with no such record (``by_line`` False) reserves as it always has, at once.
    A negative amount (a cheaper volume tier reached) consumes no credit and gives none
    back (``domain.account.Burner``). With an automatic top-up rule, the live balance's
    fall below its threshold records the purchase's start in the same save
    (``CustomerAccount.check_top_up``)."""
    lines: dict[UUID, SettledLine] = {}
    topping = account.top_up_below is not None  # an automatic top-up rule: its balance
    before = account.live_credit(book.now) if topping else Decimal(0)
    watched = None  # the alerts' watch before the reservation, when it moves the spend
    joined = False  # every record reserved (the alerts' quiet batch may be)
    if not by_line:
        alert_period, watched = _carried_period(account, items)
        requests = [(i.metering.transaction_id, i.fields["amount"]) for i in items]
        burns = account.reserve_and_burn(requests, book.now, alert_period)
        for item, burn in zip(items, burns, strict=True):
            if burn.reserved:
                settled = _join(lines, book.line_for(item.fields["meter"], item.period), item)
                if burn.credit:
                    settled.credits.append(burn.credit)
            else:
                item.refused = refusal(account, item.fields["amount"], burn)
        joined = watched is not None and all(burn.reserved for burn in burns)
    else:
        _settle_by_line(account, book, items, lines)
    if topping:  # a fall below the rule's threshold starts one purchase, in this save
        account.check_top_up(before, book.now)
    # Spend alerts, right after the reservation; the usual batch, whose end reaches no
    # threshold, is decided without making its records into ``Spend`` (``quiet_after``).
    quiet = joined and watched is not None and account.quiet_after(watched, book.now)
    if account.alert_thresholds and not quiet:
        decided = [i for i in items if i.rejected is None]
        # Each record as the alerts see it (``Spend``), made as the tuple it is: one per
        # record of every batch of an account with alerts.
        spends = [
            _new_tuple(Spend, (fields["usage_id"], i.metering.transaction_id,
                               fields["amount"], i.period.key))
            for i in decided
            for fields in (i.fields,)
        ]  # fmt: skip
        account.check_alerts(spends, [i.refused is None for i in decided], book.now, watched)
    for settled in lines.values():
        line, members, price = settled.line, settled.members, settled.price
        entries = [(m.metering.transaction_id, m.fields["amount"]) for m in members]
        if price is None:
            line.settle(entries)
        else:
            tier = price.tier_reached(settled.quantity)
            line.settle(entries, [m.fields["quantity"] for m in members], tier)
    return list(lines.values()), book.apply_credits(lines.values())


_new_tuple = tuple.__new__


def _carried_period(
    account: CustomerAccount, items: Sequence[Pending]
) -> tuple[str | None, tuple[str | None, Decimal, Sequence[str]] | None]:
    """The alerts' period a batch's records all count in, which their reservation then
    carries (``CustomerAccount.alert_period_of``: no ``AlertPeriodSpent`` in the save),
    and the alerts' watch before it; (None, None) for an account without thresholds."""
    if not account.alert_thresholds:
        return None, None
    alert_period = account.alert_period_of({i.period.key for i in items})
    return alert_period, account.alert_watch() if alert_period is not None else None


def _join(lines: dict[UUID, SettledLine], line: InvoiceLine, item: Pending) -> SettledLine:
    settled = lines.get(line.id)
    if settled is None:
        settled = lines[line.id] = SettledLine(line)
    settled.members.append(item)
    return settled


def _settle_by_line(
    account: CustomerAccount,
    book: LineBook,
    items: Sequence[Pending],
    lines: dict[UUID, SettledLine],
) -> None:
    """``settle_account`` for a batch holding records priced by line quantity: the
    same decisions as ``reserve_and_burn``, one record at a time (``Hold``, ``Burner``)."""
    burner = account.burner(book.now) if account.grants else None
    hold = account.hold()
    running: dict[UUID, tuple[Decimal, Decimal]] = {}  # a line's quantity and f so far
    for item in items:
        fields = item.fields
        after: tuple[Decimal, Decimal] | None = None
        price = item.price
        if price is not None:
            version = fields["price_version"]
            line_id, held = book.peek(fields["meter"], item.period, version)
            before = running.get(line_id)
            try:
                if before is None:
                    after = BillingTransaction.priced_on_line(fields, price, held)
                else:
                    after = BillingTransaction.priced_on_line(fields, price, *before)
            except InvalidUsage as exc:
                item.rejected = str(exc)
                continue
        txn_id, amount = item.metering.transaction_id, fields["amount"]
        if burner is not None and burner.blocks(amount):
            item.refused = CREDITS_EXHAUSTED
            continue
        if not hold.take(txn_id, amount):
            item.refused = refusal(account, amount)
            continue
        if price is None or after is None:
            settled = _join(lines, book.line_for(fields["meter"], item.period), item)
        else:
            line = book.line_for(fields["meter"], item.period, version, price.model)
            running[line.id] = after
            settled = _join(lines, line, item)
            settled.price, settled.quantity = price, after[0]
        if burner is not None:
            credit = burner.burn(txn_id, canonical(amount))
            if credit:
                settled.credits.append(credit)
    hold.record()
    if burner is not None:
        burner.record()


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
        self._chosen: dict[tuple[str, Period, int | None], InvoiceLine] = {}
        self._credit_lines: dict[Period, CreditLine] = {}  # by the period of their invoice

    def line_for(
        self,
        meter: str,
        occurred: Period,
        price_version: int | None = None,
        model: str | None = None,
    ) -> InvoiceLine:
        """The line usage of ``meter`` that occurred in ``occurred`` joins (the same line
        for the rest of the batch: nothing in a batch freezes a line or closes an invoice,
        so the answer is kept rather than its id derived again per record);
        ``price_version``: the version pricing it by line quantity (its own line), whose
        ``model`` of the meter a new line records."""
        key = (meter, occurred, price_version)
        found = self._chosen.get(key)
        if found is None:
            priced = None if price_version is None else (price_version, model)
            _, line = self._line_for(meter, occurred, priced, create=True)
            assert line is not None  # created when new
            found = self._chosen[key] = line
        return found

    def peek(self, meter: str, occurred: Period, price_version: int) -> tuple[UUID, Decimal]:
        """The id of the line ``line_for`` would choose, and its quantity (0 when it would
        be a new line), without opening it: a record priced by line quantity is priced
        before the limit decides whether it joins (a refused one opens no line)."""
        found = self._chosen.get((meter, occurred, price_version))
        if found is not None:
            return found.id, found.quantity or _0
        line_id, line = self._line_for(meter, occurred, (price_version, None), create=False)
        return line_id, (line.quantity or _0) if line is not None else _0

    def _line_for(
        self,
        meter: str,
        occurred: Period,
        priced: tuple[int, str | None] | None,
        *,
        create: bool,
    ) -> tuple[UUID, InvoiceLine | None]:
        found = self._usable(meter, occurred, None, priced, create=create)
        if found is not None:
            return found
        period = max(self.periods.period_of(self.now), self.periods.next(occurred))
        for _ in range(MAX_LATE_HOPS):
            found = self._usable(meter, period, occurred, priced, create=create)
            if found is not None:
                return found
            period = self.periods.next(period)
        # Every one of them closed early by hand: not this record's fault, nor a reason to
        # stop billing (the ingest worker sets the record aside with this reason).
        raise IllegalTransition(
            f"no open invoice within {MAX_LATE_HOPS} periods after {occurred.key}"
        )

    def apply_credits(self, settled: Iterable[SettledLine]) -> list[CreditLine]:
        """Record the credit each usage line's records consumed (``SettledLine.credits``)
        on the credit line of that line's invoice (``domain.credit_line``), one event per
        credit line; the credit lines changed."""
        by_credit_line: dict[UUID, tuple[CreditLine, dict[str, list[Decimal]]]] = {}
        for one in settled:
            if one.credits:
                line = one.line
                credit_line = self._credit_line(line.period)
                found = by_credit_line.get(credit_line.id)
                if found is None:
                    found = by_credit_line[credit_line.id] = (credit_line, {})
                found[1][str(line.id)] = one.credits
        for credit_line, per_line in by_credit_line.values():
            credit_line.apply_per_line(per_line)
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

    def _usable(
        self,
        meter: str,
        period: Period,
        late_of: Period | None,
        priced: tuple[int, str | None] | None,
        *,
        create: bool,
    ) -> tuple[UUID, InvoiceLine | None] | None:
        """The line of ``meter`` on ``period``'s invoice if it takes usage, opened (and
        added to its invoice) when new (with ``create``; else its id and None); None when
        that invoice has closed."""
        line_id = InvoiceLine.create_id(
            self.customer_id, self.currency, meter, period.start,
            late_of.start if late_of is not None else None,
            price_version=None if priced is None else priced[0],
        )  # fmt: skip
        if line_id not in self.lines:
            loaded = self.load_line(line_id)
            if loaded is not None:
                self.lines[line_id] = loaded
        line = self.lines.get(line_id)
        if line is not None:
            return None if line.frozen else (line_id, line)
        invoice = self._invoice(period)
        if invoice is not None and invoice.is_closed:
            return None
        if not create:
            return line_id, None
        line = InvoiceLine.open(
            self.customer_id, self.currency, meter, period, late_of,
            price_version=None if priced is None else priced[0],
            model=None if priced is None else priced[1],
        )  # fmt: skip
        if invoice is None:
            self.invoices[line.invoice_id] = Invoice.open(
                self.customer_id, self.currency, period, line.id
            )
        else:
            invoice.add_line(line.id)
        self.lines[line_id] = line
        return line_id, line

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
