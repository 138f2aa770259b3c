"""The ledger application: loads and saves aggregates for the domain's decisions.

``BillingLedger`` is an eventsourcing ``Application``. It owns no rules: it asks
``domain.metering_events.meter_batch_events`` what a batch changes and saves all of it
in one database transaction: on the first attempt, when the limit refused none of it,
the new transactions as ready rows (``store.ingest_rows``: the events' very bytes and
hashes), else as events. When that save loses an optimistic-concurrency race (an
account or a transaction was written by someone else first), it reloads and
re-decides, with events; a redelivered record then finds its transaction already recorded and
is counted as a duplicate, with no second write.

Usage is priced by the price book (``domain.price_book``) as the store has it:
``decide`` asks ``refresh_prices`` first, one indexed read per batch (the book's events
after the version it knows, whatever the aggregate cache's settings), and rebuilds what
it prices by only when a version was published since; so a published version prices the
next batch, in every process, without a restart. Before ``migrate`` started the book,
the configured prices do.

``record_usage`` is ``decide`` then ``save_decided``; the ingest worker calls the two
apart to save one batch on a writer thread while it decides the next on the state the
first leaves (``decide(after=...)``; the rules are in ``adapters.ingest.worker``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, ClassVar, TypeVar, cast
from uuid import UUID

from eventsourcing.application import (
    AggregateNotFoundError,
    Application,
    ProcessingEvent,
    project_aggregate,
)
from eventsourcing.domain import (
    BaseAggregate,
    DomainEvent,
    DomainEventProtocol,
    MutableOrImmutableAggregate,
)
from eventsourcing.persistence import (
    EventStore,
    IntegrityError,
    JSONTranscoder,
    Recording,
    Transcoder,
    Transcoding,
)

from domain.account import CustomerAccount
from domain.contract import Contract, ContractSchedule, ContractTerms, ContractVersion
from domain.credit_line import CreditLine
from domain.credits import Grant
from domain.customer import CustomerLink
from domain.ids import (
    account_id,
    contract_id,
    customer_link_id,
    invoice_id,
    line_id,
    line_push_id,
    partition_claim_id,
)
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine, LineChange, LinePush
from domain.metering import Metering
from domain.metering_events import MeteredBatch, meter_batch_events
from domain.ownership import Claim, PartitionClaim
from domain.periods import Period, PeriodPolicy
from domain.price_book import PRICE_BOOK_ID, PriceBook, PriceSchedule, PriceVersion, as_schedule
from domain.pricing import PriceList
from domain.purchase import CreditPurchase, void_purchased_grant
from domain.transaction import BillingTransaction
from store.batch_reads import BatchReads
from store.credit_rows import balance_row
from store.errors import ConcurrencyExhausted
from store.ingest_rows import transaction_rows
from store.recorder import LedgerRecorder, OrjsonTranscoder
from store.schema import SNAPSHOTS_TABLE
from store.snapshots import SealedSnapshotRecorder

__all__ = ["BillingLedger", "ConcurrencyExhausted", "Decided"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SaveStats:
    attempts: int
    events: int


@dataclass(frozen=True)
class Decided:
    """A batch's decision with everything its save writes, not yet saved."""

    decision: MeteredBatch
    reads: BatchReads
    processing: ProcessingEvent[UUID]
    events: int  # how many events the save records (its transactions' as rows or not)


MONTHLY = PeriodPolicy()
_T = TypeVar("_T")


class GrantAsDict(Transcoding):
    """A credit grant in an account's snapshot: its fields, moments and amounts as text."""

    type = Grant
    name = "credit_grant"

    def encode(self, obj: Grant) -> dict[str, Any]:
        data = {f.name: getattr(obj, f.name) for f in fields(Grant)}
        for key in ("effective_at", "expires_at"):
            data[key] = data[key].isoformat() if data[key] is not None else None
        for key in ("consumed", "expired", "voided"):
            data[key] = f"{data[key]:f}"
        return data

    def decode(self, data: dict[str, Any]) -> Grant:
        values = dict(data)
        for key in ("effective_at", "expires_at"):
            values[key] = datetime.fromisoformat(values[key]) if values[key] else None
        for key in ("consumed", "expired", "voided"):
            values[key] = Decimal(values[key])
        return Grant(**values)


class BillingLedger(Application[UUID]):
    """Billing transactions and customer accounts in the event store."""

    name = "BillingLedger"
    env: ClassVar[dict[str, str]] = {
        "AGGREGATE_CACHE_MAXSIZE": "20000",
        "AGGREGATE_CACHE_FASTFORWARD": "y",
    }
    snapshotting_intervals: ClassVar[dict[type[Any], int]] = {
        CustomerAccount: 200,
        InvoiceLine: 500,
        CreditLine: 500,
        LinePush: 200,
    }
    max_attempts = 8
    # A batch's first attempt saves its new transactions as ready rows when none was
    # refused (store.ingest_rows: the events' very bytes and hashes, without the events).
    fast_rows: ClassVar[bool] = True

    def __init__(
        self,
        prices: PriceList | PriceSchedule,
        env: dict[str, str] | None = None,
        *,
        periods: PeriodPolicy = MONTHLY,
    ) -> None:
        super().__init__(env)
        # The configured prices price usage only while the store has no price book
        # (``migrate`` publishes them as its version 1); ``refresh_prices`` switches.
        self.configured = as_schedule(prices)
        self.prices = self.configured
        self._book_version: int | None = None
        self._book: PriceBook | None = None  # the book as refresh_prices last read it
        self._book_lock = threading.Lock()
        self._contracts: dict[UUID, Contract] = {}  # as refresh_contracts last read them
        self._contract_lock = threading.Lock()
        self.periods = periods
        self.last_save = SaveStats(attempts=0, events=0)

    def record_usage(self, batch: Sequence[Metering]) -> MeteredBatch:
        """Record a batch of valid usage in one save; see the module docstring."""
        try:
            return self.save_decided(self.decide(batch))
        except IntegrityError:
            pass
        ids = [m.transaction_id for m in batch]
        for attempt in range(2, self.max_attempts + 1):
            decided = self.decide(batch, recorded=self._recorded_ids(ids), first_attempt=False)
            try:
                return self.save_decided(decided, attempts=attempt)
            except IntegrityError:
                continue
        raise ConcurrencyExhausted(
            f"batch of {len(batch)} records lost {self.max_attempts} concurrency races"
        )

    def decide(
        self,
        batch: Sequence[Metering],
        *,
        after: Decided | None = None,
        recorded: Collection[UUID] = (),
        first_attempt: bool = True,
    ) -> Decided:
        """What saving ``batch`` writes, decided now and not yet saved.

        ``after``: a decision whose save is still in flight (the ingest's write-behind):
        the aggregates it touched are read as it left them, as if it were saved. If it
        is not saved after all, this decision is void (its save would lose the version
        race anyway). Events are collected here, in the caller's thread, so that
        ``save_decided`` only writes."""
        pending = {a.id: a for a in after.decision.touched} if after is not None else {}
        reads = self._batch_reads(pending)
        prices = self.refresh_prices()
        contracts = self.refresh_contracts({m.record.customer_id for m in batch})
        decision = meter_batch_events(
            batch,
            prices.with_contracts(contracts) if contracts else prices,
            load_account=reads.account,
            load_line=reads.line,
            load_invoice=reads.invoice,
            periods=self.periods,
            now=datetime.now(UTC),
            already_recorded=recorded,
            expect=reads.expect,
        )
        touched = decision.touched
        events = 2 * len(decision.transactions) + sum(len(a.pending_events) for a in touched)
        processing = _ProcessingEvent()
        # Nothing reads this save's notification ids, so the recorder may skip them.
        if first_attempt and self._fast_rows(decision):
            rows = transaction_rows(decision.transactions, self.mapper.transcoder)
            processing.collect_events(*touched, notification_ids=False, rows=rows)
        else:
            processing.collect_events(
                *touched, *decision.transaction_events, notification_ids=False
            )
        return Decided(decision, reads, processing, events)

    def save_decided(self, decided: Decided, *, attempts: int = 1) -> MeteredBatch:
        """Write a decision (raises ``IntegrityError`` when it lost a version race: it
        must then be decided again). Safe to run in another thread than ``decide``'s,
        one save at a time."""
        self._save_processing(decided.processing)
        decided.reads.remember(decided.decision.touched)
        self.last_save = SaveStats(attempts=attempts, events=decided.events)
        return decided.decision

    def _batch_reads(self, pending: Mapping[UUID, Any]) -> BatchReads:
        """Reads for one decision, together where the recorder can (``store.batch_reads``)."""
        recorder = self.recorder if isinstance(self.recorder, LedgerRecorder) else None
        return BatchReads(self.repository, recorder, self.mapper, self._get, pending)

    def construct_snapshot_store(self) -> EventStore[UUID]:
        """Snapshots that are used only when sealed to their head event
        (``store.snapshots``); another persistence (the in-memory tests) keeps the
        library's store."""
        if not isinstance(self.recorder, LedgerRecorder):
            return super().construct_snapshot_store()
        recorder = SealedSnapshotRecorder(
            self.recorder.datastore,
            events_table_name=SNAPSHOTS_TABLE,
            history_table_name=self.recorder.events_table_name,
        )
        return EventStore(mapper=self.mapper, recorder=recorder)

    def _fast_rows(self, decision: MeteredBatch) -> bool:
        """Whether the batch's transactions may be saved as ready rows
        (``store.ingest_rows``): the common case, on our recorder, none refused."""
        return (
            self.fast_rows
            and isinstance(self.recorder, LedgerRecorder)
            and self.mapper.compressor is None
            and self.mapper.cipher is None
            and not decision.refused
        )

    def construct_transcoder(self) -> Transcoder:
        """The library's JSON format, written by orjson (see ``OrjsonTranscoder``)."""
        transcoder: JSONTranscoder = OrjsonTranscoder()
        self.register_transcodings(transcoder)
        transcoder.register(GrantAsDict())  # an account's grants, in its snapshots
        return transcoder

    def save(
        self,
        *objs: MutableOrImmutableAggregate[UUID] | DomainEventProtocol[UUID] | None,
        **kwargs: Any,
    ) -> list[Recording[UUID]]:
        """``Application.save``, collecting events with cheap class checks first.

        The body is the library's (eventsourcing 9.5, pinned <9.6), so it calls the
        library's private ``_record``, ``_take_snapshots`` and ``_notify`` as its own
        ``save`` does; only the ProcessingEvent differs.
        """
        processing_event = _ProcessingEvent()
        processing_event.collect_events(*objs, **kwargs)
        return self._save_processing(processing_event)

    def _save_processing(self, processing_event: ProcessingEvent[UUID]) -> list[Recording[UUID]]:
        recordings = self._record(processing_event)
        self._take_snapshots(processing_event)
        self._notify(recordings)
        self.notify(processing_event.events)  # deprecated hook, kept as the library has it
        return recordings

    # -- prices ------------------------------------------------------------------------

    def price_book(self) -> PriceBook | None:
        """The price book, or None before ``migrate`` started it."""
        found = self._get(PRICE_BOOK_ID)
        return found if isinstance(found, PriceBook) else None

    def refresh_prices(self) -> PriceSchedule:
        """The prices to price usage by now: the price book's versions as the store has
        them (the configured prices while it has no book). The check is one indexed read
        of the book's events after the version already known, folded into a book this
        ledger keeps for itself: not the aggregate cache, whose fast-forward a setting
        turns off (``AGGREGATE_CACHE_FASTFORWARD``) and whose entry others evict, so every
        batch sees a newly published version without a restart, whatever the cache does."""
        with self._book_lock:
            known = self._book
            new = self.events.get(PRICE_BOOK_ID, gt=None if known is None else known.version)
            book = project_aggregate(known, new)
            if not isinstance(book, PriceBook):  # no book yet: the configured prices
                return self.prices
            if book.version != self._book_version:
                if self._book_version is None:
                    self._warn_if_unpublished(book)
                self.prices, self._book_version = book.schedule, book.version
            self._book = book
            return self.prices

    def _warn_if_unpublished(self, book: PriceBook) -> None:
        """Say so once when the configured price file is none of the book's versions: once
        the book exists, editing the file changes no price (it must be published)."""
        configured = self.configured.latest.prices
        if all(v.prices != configured for v in book.versions):
            log.warning(
                "the configured price file (BILLING_LEDGER_PRICE_LIST) is not a version of"
                " the price book: usage is priced by the book (`billing-ledger prices list`);"
                " publish the file with `billing-ledger prices publish` to use it"
            )

    def start_price_book(self, prices: PriceList) -> PriceVersion | None:
        """Start the price book with ``prices`` as version 1, effective from the epoch;
        None when it exists already (a concurrent ``migrate`` may have started it)."""
        if self.price_book() is not None:
            return None
        book = PriceBook.start(prices)
        try:
            self.save(book)
        except IntegrityError:
            return None
        return book.versions[0]

    def publish_prices(self, prices: PriceList, effective_from: datetime) -> PriceVersion:
        """Publish ``prices`` as the book's next version (PriceListError, and nothing
        recorded, when it is not valid). A book not started yet is started first with the
        configured prices, as ``migrate`` starts it: usage recorded without a book was
        priced by them and names their version 1."""
        for _ in range(self.max_attempts):
            book = self.price_book() or PriceBook.of(self.configured)
            version = book.publish(prices, effective_from)
            try:
                self.save(book)
            except IntegrityError:
                continue
            return version
        raise ConcurrencyExhausted("could not publish the prices: the price book kept changing")

    # -- contracts -----------------------------------------------------------------------

    def contract(self, customer_id: str) -> Contract | None:
        """The customer's contract, or None when it has none."""
        found = self._get(contract_id(customer_id))
        return found if isinstance(found, Contract) else None

    def refresh_contracts(self, customers: Collection[str]) -> dict[str, ContractSchedule]:
        """The contracts of ``customers`` that have one, as the store has them now: one
        indexed query for their newest versions (``latest_versions``), then only a contract
        set since this ledger last read it is read again (its new events only). So a
        contract set now prices the next batch, in every process, without a restart, and a
        batch whose customers have no contract or unchanged ones costs that one query."""
        ids = {contract_id(c): c for c in customers}
        latest = self.latest_versions(list(ids))
        out: dict[str, ContractSchedule] = {}
        with self._contract_lock:
            for cid, (version, _) in latest.items():
                known = self._contracts.get(cid)
                if known is None or known.version != version:
                    new = self.events.get(cid, gt=None if known is None else known.version)
                    found = project_aggregate(known, new)
                    if not isinstance(found, Contract):
                        continue
                    self._contracts[cid] = known = found
                if known.versions:
                    out[ids[cid]] = known.schedule
        return out

    def set_contract(
        self, customer_id: str, terms: ContractTerms, effective_from: datetime
    ) -> ContractVersion:
        """Record ``terms`` as the customer's next contract version (ContractError, and
        nothing recorded, when it cannot be)."""
        for _ in range(self.max_attempts):
            contract = self.contract(customer_id) or Contract(customer_id)
            version = contract.set(terms, effective_from)
            try:
                self.save(contract)
            except IntegrityError:
                continue
            return version
        raise ConcurrencyExhausted("could not set the contract: it kept changing")

    def set_spend_limit(self, customer_id: str, currency: str, spend_limit: int | None) -> None:
        """Set a customer's spend limit in one currency (None: unlimited)."""
        self.change_account(
            customer_id,
            currency,
            lambda a: a.set_limit(spend_limit),
            what="limit",
            opening_limit=spend_limit,
        )

    def set_alerts(self, customer_id: str, currency: str, thresholds: Sequence[str]) -> None:
        """Set a customer's spend alert thresholds in one currency (``kind:value``,
        ``domain.alerts``; none clears them). ValueError on a bad threshold."""
        self.change_account(
            customer_id, currency, lambda a: a.set_alerts(thresholds), what="alerts"
        )

    def change_account(
        self,
        customer_id: str,
        currency: str,
        change: Callable[[CustomerAccount], _T],
        *,
        what: str = "account",
        opening_limit: int | None = None,
    ) -> _T:
        """Apply ``change`` to the customer's account in one currency (opened with
        ``opening_limit`` when new) and save it, deciding again on a fresh load when
        another writer won the version race; ``change``'s answer. What ``change`` raises
        (a refused command) is raised, with nothing saved. The limit, the alerts and the
        credit commands (``adapters.cli.credits``) use it."""
        for _ in range(self.max_attempts):
            account = self._load_account(customer_id, currency)
            if account is None:
                account = CustomerAccount.open(customer_id, currency, opening_limit)
            answer = change(account)
            if not account.pending_events:
                return answer
            try:
                self.save(account)
            except IntegrityError:
                continue
            return answer
        raise ConcurrencyExhausted(f"could not set the {what} of {customer_id}/{currency}")

    # -- purchased credit (domain.purchase) ----------------------------------------------

    def purchase_by_id(self, purchase: UUID) -> CreditPurchase | None:
        found = self._get(purchase)
        return found if isinstance(found, CreditPurchase) else None

    def start_purchase(
        self,
        customer_id: str,
        currency: str,
        buy: Callable[[CustomerAccount], UUID | None],
    ) -> UUID | None:
        """Record a purchased grant awaiting payment (``buy``: the account's command,
        ``purchase_credit`` or ``buy_top_up``) and its purchase's ``Started``, in one
        save; the purchase's id, None when ``buy`` recorded nothing (done already).
        Only an account that exists buys: ValueError for an unknown customer, nothing
        recorded."""
        for _ in range(self.max_attempts):
            account = self._load_account(customer_id, currency)
            if account is None:
                raise ValueError(
                    f"unknown customer {customer_id} in {currency}: no account to buy credit"
                    " for (record usage, a limit or a grant first)"
                )
            bought = buy(account)
            if bought is None:
                return None
            grant = account.grants[next(
                g for g, v in account.grants.items() if v.purchase_id == str(bought)
            )]  # fmt: skip
            purchase = CreditPurchase.start(
                customer_id, currency, grant.grant_id, grant.amount,
                _price_of(account, grant.grant_id), top_up=grant.grant_id.startswith("top-up-"),
            )  # fmt: skip
            try:
                self.save(account, purchase)
            except IntegrityError:
                continue
            return bought
        raise ConcurrencyExhausted(f"could not start a purchase for {customer_id}/{currency}")

    def void_grant(
        self, customer_id: str, currency: str, grant_id: str, reason: str
    ) -> tuple[Decimal, UUID | None]:
        """Void what is left of a grant and, when it is a purchased grant awaiting
        payment, request its invoice's void on its purchase, in one save
        (``domain.purchase.void_purchased_grant``); the amount voided and the purchase
        to drive (None: none). ValueError (nothing recorded) as ``void_credit`` raises."""
        for _ in range(self.max_attempts):
            account = self._load_account(customer_id, currency)
            if account is None:
                raise ValueError(f"no grant {grant_id} for {customer_id} in {currency}")
            pending = account.pending_purchase(grant_id)
            purchase = self.purchase_by_id(UUID(pending)) if pending else None
            voided = void_purchased_grant(account, purchase, grant_id, reason)
            try:
                self.save(account, purchase)
            except IntegrityError:
                continue
            return voided, purchase.id if purchase is not None else None
        raise ConcurrencyExhausted(f"could not void grant {grant_id} of {customer_id}")

    def reinstate_purchase(
        self, customer_id: str, currency: str, grant_id: str, reason: str, now: datetime
    ) -> tuple[str, bool]:
        """Settle a purchase paid after its grant was voided: the credit it bought granted
        again as a new live grant, and the purchase ``Reinstated``, in one save
        (``CreditPurchase.reinstate``, ``CustomerAccount.reinstate_credit``); the new
        grant's id and whether it was recorded now (False: reinstated before).
        ValueError, nothing recorded, when the grant has no such purchase."""
        for _ in range(self.max_attempts):
            account = self._load_account(customer_id, currency)
            grant = account.grants.get(grant_id) if account is not None else None
            if account is None or grant is None or grant.purchase_id is None:
                raise ValueError(f"no purchased grant {grant_id} for {customer_id} in {currency}")
            purchase = self.purchase_by_id(UUID(grant.purchase_id))
            if purchase is None:
                raise ValueError(f"grant {grant_id} has no purchase recorded")
            if purchase.reinstated_grant_id is not None:
                return purchase.reinstated_grant_id, False
            new_grant = purchase.reinstate(reason)
            account.reinstate_credit(
                grant_id, new_grant, purchase_id=str(purchase.id),
                stripe_invoice_id=purchase.stripe_invoice_id or "", amount=purchase.amount,
                effective_at=now, reason=reason,
            )  # fmt: skip
            try:
                self.save(account, purchase)
            except IntegrityError:
                continue
            return new_grant, True
        raise ConcurrencyExhausted(f"could not reinstate grant {grant_id} of {customer_id}")

    def save_purchase(self, purchase: CreditPurchase, **kwargs: Any) -> None:
        """Save what ``purchase`` recorded and, when it was just paid or refused, its
        grant's settlement on the account (live, or voided with the reason), in one
        save (``kwargs``: the webhooks' receipts). IntegrityError when another writer
        recorded first: the caller reloads and decides again."""
        account = None
        settled = any(
            isinstance(e, CreditPurchase.Paid | CreditPurchase.Unpaid)
            for e in purchase.pending_events
        )
        if settled:
            account = self._load_account(purchase.customer_id, purchase.currency)
            if account is not None and purchase.grant_id in account.grants:
                account.settle_purchase(
                    purchase.grant_id,
                    paid=purchase.state == "paid",
                    reason=purchase.reason,
                    stripe_invoice_id=purchase.stripe_invoice_id or "",
                )
        self.save(purchase, account, **kwargs)

    def claim_partition(self, topic: str, partition: int, owner: str) -> Claim:
        """Record that ``owner`` holds ``partition`` of ``topic`` from now on; its claim,
        newer than every claim before it (two claimants: the version check orders them)."""
        claim_id = partition_claim_id(topic, partition)
        for _ in range(self.max_attempts):
            try:
                holder: PartitionClaim = self.repository.get(claim_id)
            except AggregateNotFoundError:
                holder = PartitionClaim(topic=topic, partition=partition)
            claim = holder.claim(owner)
            try:
                self.save(holder)
            except IntegrityError:
                continue
            return claim
        raise ConcurrencyExhausted(f"could not claim partition {partition} of {topic}")

    def account(self, customer_id: str, currency: str) -> CustomerAccount | None:
        """The account, or None if the customer has no usage or limit in that currency."""
        return self._load_account(customer_id, currency)

    def transaction(self, txn_id: UUID) -> BillingTransaction:
        """The transaction (raises AggregateNotFoundError)."""
        txn: BillingTransaction = self.repository.get(txn_id)
        return txn

    def line(
        self, customer_id: str, currency: str, meter: str, period: Period
    ) -> InvoiceLine | None:
        """The invoice line, or None if no usage joined it yet."""
        return self.line_or_none(line_id(customer_id, currency, meter, period.key))

    def line_or_none(self, line: UUID) -> InvoiceLine | None:
        found = self._get(line)
        return found if isinstance(found, InvoiceLine) else None

    def line_by_id(self, line: UUID) -> InvoiceLine:
        """The invoice line (raises AggregateNotFoundError)."""
        found: InvoiceLine = self.repository.get(line)
        return found

    def line_push(self, line: UUID) -> LinePush | None:
        """What Stripe holds for a line, or None before its first push."""
        found = self._get(line_push_id(line))
        return found if isinstance(found, LinePush) else None

    def invoice(self, customer_id: str, currency: str, period: Period) -> Invoice | None:
        """The invoice, or None before its first line."""
        return self.invoice_by_id(invoice_id(customer_id, currency, period.key))

    def invoice_by_id(self, invoice: UUID) -> Invoice | None:
        found = self._get(invoice)
        return found if isinstance(found, Invoice) else None

    def invoices_by_id(self, ids: Sequence[UUID]) -> dict[UUID, Invoice]:
        """The invoices of these ids that exist, each folded from all its events, read
        in one query (an invoice is never snapshotted: its history is short)."""
        if not isinstance(self.recorder, LedgerRecorder):  # another persistence (tests)
            found = {i: self.invoice_by_id(i) for i in set(ids)}
            return {i: invoice for i, invoice in found.items() if invoice is not None}
        histories: dict[UUID, list[DomainEventProtocol[UUID]]] = {}
        for stored in self.recorder.select_histories(ids):
            event = self.mapper.to_domain_event(stored)
            histories.setdefault(event.originator_id, []).append(event)
        folded: dict[UUID, Any] = {i: project_aggregate(None, e) for i, e in histories.items()}
        return {i: a for i, a in folded.items() if isinstance(a, Invoice)}

    def customer_link(self, customer_id: str) -> CustomerLink | None:
        found = self._get(customer_link_id(customer_id))
        return found if isinstance(found, CustomerLink) else None

    def line_changes(self, line: UUID, after: int, through: int) -> list[LineChange]:
        """The line's changes (settled, removed, repriced) with versions in ``(after,
        through]``, in order."""
        return [
            e
            for e in self.events.get(line, gt=after, lte=through)
            if isinstance(e, InvoiceLine.Settled | InvoiceLine.Removed | InvoiceLine.Repriced)
        ]

    def latest_versions(self, ids: Sequence[UUID]) -> dict[UUID, tuple[int, str]]:
        """Each aggregate's newest version and the topic of its newest event (one query)."""
        if isinstance(self.recorder, LedgerRecorder):
            latest: dict[UUID, tuple[int, str]] = self.recorder.select_latest(ids)
            return latest
        out: dict[UUID, tuple[int, str]] = {}  # another persistence (the in-memory tests)
        for i in set(ids):
            events = self.recorder.select_events(i, desc=True, limit=1)
            if events:
                out[i] = (events[0].originator_version, events[0].topic)
        return out

    def _get(self, aggregate_id: UUID) -> Any:
        try:
            return self.repository.get(aggregate_id)
        except AggregateNotFoundError:
            return None

    def history(self, aggregate_id: UUID) -> list[DomainEventProtocol[UUID]]:
        """Every event of one aggregate, oldest first."""
        return list(self.events.get(aggregate_id))

    def all_events(self, *, section: int = 5000) -> Iterator[DomainEventProtocol[UUID]]:
        """Every event in the store in notification-log order (for folds and audits)."""
        start = 1
        while True:
            notifications = self.recorder.select_notifications(start, section)
            for n in notifications:
                yield self.mapper.to_domain_event(n)
            if len(notifications) < section:
                return
            start = notifications[-1].id + 1

    def first_events(self, ids: Sequence[UUID]) -> dict[UUID, DomainEventProtocol[UUID]]:
        """The first event of each of these aggregates that exists (one query)."""
        if isinstance(self.recorder, LedgerRecorder):
            stored = self.recorder.select_first_events(ids)
            return {cast(UUID, s.originator_id): self.mapper.to_domain_event(s) for s in stored}
        first = {i: next(iter(self.events.get(i, lte=1)), None) for i in set(ids)}
        return {i: e for i, e in first.items() if e is not None}

    def _load_account(self, customer_id: str, currency: str) -> CustomerAccount | None:
        try:
            account: CustomerAccount = self.repository.get(account_id(customer_id, currency))
        except AggregateNotFoundError:
            return None
        return account

    def _recorded_ids(self, ids: Sequence[UUID]) -> set[UUID]:
        if isinstance(self.recorder, LedgerRecorder):
            recorded: set[UUID] = self.recorder.select_recorded_ids(ids)
            return recorded
        # eventsourcing's own recorder (the benchmark's comparison): one query per id.
        return {i for i in set(ids) if self.recorder.select_events(i, limit=1)}


def _price_of(account: CustomerAccount, grant_id: str) -> int:
    """The price the account's ``CreditAwaitingPayment`` for ``grant_id`` recorded (a
    pending event of this decision)."""
    for pending in account.pending_events:
        if isinstance(pending, CustomerAccount.CreditAwaitingPayment) and (
            pending.grant_id == grant_id
        ):
            return pending.price
    raise ValueError(f"grant {grant_id} was not bought in this decision")


class _ProcessingEvent(ProcessingEvent[UUID]):
    """Collects events and aggregates by their classes before typing's Protocols.

    The library checks ``isinstance(obj, DomainEventProtocol)`` and then
    ``CollectEventsProtocol`` for every object; on Python 3.11 a runtime Protocol
    check recomputes the protocol's attributes each time (~10 us), which for a batch
    of thousands of events was an eighth of the ingest's time. Objects of the
    library's own base classes take the cheap path; anything else the library's.
    """

    def collect_events(
        self,
        *objs: MutableOrImmutableAggregate[UUID] | DomainEventProtocol[UUID] | None,
        **kwargs: Any,
    ) -> None:
        others: list[MutableOrImmutableAggregate[UUID] | DomainEventProtocol[UUID] | None] = []
        for obj in objs:
            if isinstance(obj, DomainEvent):
                self.events.append(obj)
            elif isinstance(obj, BaseAggregate):
                collected = obj.collect_events()
                self.events.extend(collected)
                self.aggregates[obj.id] = obj
                if isinstance(obj, CustomerAccount):  # a credit event among a few
                    self._balance(obj, collected)
            else:
                others.append(obj)
        super().collect_events(*others, **kwargs)

    def _balance(self, account: CustomerAccount, events: Sequence[Any]) -> None:
        """The account's credit balance row, when this save moves its credit
        (``store.credit_rows``): written in the save's transaction."""
        row = balance_row(account, events)
        if row is not None:
            # One row per account (a later collect of the same account replaces it); the
            # recorder takes the dict's values.
            self.saved_kwargs.setdefault("balances", {})[account.id] = row
