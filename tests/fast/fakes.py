"""Hand-written fakes behind the domain's ports, and a ledger in memory.

``memory_ledger()`` is the real ``BillingLedger`` on eventsourcing's in-memory (POPO)
persistence: the same aggregates, the same optimistic-concurrency check, no database.
``FakeGateway`` keeps what Stripe would (customers, draft invoices, line items, each
create replayed by its idempotency key) and fails the calls a test scripts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from kafka.errors import KafkaTimeoutError
from kafka.future import Future

from adapters.settings import Settings
from domain.invoice_states import StripeInvoiceView
from domain.metering import Metering
from domain.ports import (
    AddedItems,
    CreditNote,
    DeadLetter,
    DraftInvoice,
    ItemRepair,
    LineItems,
    LinesAdd,
    LinesUpdate,
)
from domain.pricing import Price, PriceList
from domain.pushing import MAX_ITEMS_PER_ADD, MAX_LINES_PER_UPDATE, LineAdd, item_key, push_key
from domain.saga import ChargeFailure, on_draft
from domain.transaction import Source
from domain.usage import UsageRecord
from domain.verification import DraftItem, DraftView
from store.ledger import BillingLedger

__all__ = [
    "Clock",
    "FakeDeadLetters",
    "FakeGateway",
    "FaultyPrices",
    "memory_ledger",
    "reserve",
    "usage",
]

T0 = datetime(2026, 12, 1, tzinfo=UTC)


class Clock:
    """A clock the test moves: ``now`` is what every part given it reads."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def memory_ledger() -> BillingLedger:
    return BillingLedger(Settings().load_prices(), env={"PERSISTENCE_MODULE": "eventsourcing.popo"})


@dataclass(frozen=True)
class FaultyPrices(PriceList):
    """A price list whose lookup of ``faulty_meter`` raises what no rule expects (a bug,
    a broken price source): the last-resort guards must contain it to one record."""

    faulty_meter: str = "faulty.meter"

    def price_of(self, meter: str) -> Price:
        if meter == self.faulty_meter:
            raise RuntimeError(f"price source failed for {meter}")
        return super().price_of(meter)


def usage(
    usage_id: str, customer: str = "acme", quantity: int | str = 1000, meter: str = "api.requests"
) -> UsageRecord:
    return UsageRecord(
        usage_id=usage_id,
        customer_id=customer,
        meter=meter,
        quantity=Decimal(quantity),
        occurred_at=T0,
    )


def reserve(
    ledger: BillingLedger,
    n: int,
    customer: str = "acme",
    *,
    quantity: int | str = 1000,
    meter: str = "api.requests",
    prefix: str = "f",
) -> list[UUID]:
    """Record ``n`` records (Metered, Reserved, and their line's Settled) in one batch."""
    batch = [
        Metering(usage(f"{prefix}-{i}", customer, quantity, meter), Source("usage", 0, i))
        for i in range(n)
    ]
    return [t.id for t in ledger.record_usage(batch).transactions]


@dataclass
class Held:
    """A request Stripe received and has not executed yet (``FakeGateway.hold``)."""

    apply: Callable[[], Any]
    released: threading.Event = field(default_factory=threading.Event)
    landed: threading.Event = field(default_factory=threading.Event)

    def land(self) -> None:
        """Execute it now (its caller, if still waiting, then gets its answer)."""
        if not self.landed.is_set():
            self.apply()
            self.landed.set()
        self.released.set()


@dataclass
class FakeGateway:
    """The payment gateway port, as strict as Stripe about what the ledger relies on.

    * **Idempotency keys** (the ones the real client derives, ``adapters.stripe.client``):
      a repeated key with the same parameters replays the first answer and executes
      nothing; with other parameters it is refused (``idempotency_error``, permanent);
      a key older than ``key_ttl`` is forgotten (Stripe keeps them at least 24 hours),
      so a create repeated after that creates a second object.
    * **Objects**: an invoice names a known customer; items go on a known invoice of
      their customer; an invoice's items change only while it is a draft; a finalize
      is keyed by the ledger's invoice; a credit note is at most what the invoice can
      still be credited (its total less the notes already issued) and names a final
      invoice.
    * ``failures`` answer the next calls in order (before anything is executed).
    * **Bulk updates** (``update_lines``) as Stripe takes them: each line named by the
      line item id Stripe gave the item (``line_items`` lists them; an item's own id is
      refused), only on a draft, at most ``MAX_LINES_PER_UPDATE`` line items, no line
      twice, all checked before any is set.
    * **Bulk creations** (``add_lines``) as Stripe takes them: only on a draft of the
      customer, at most ``MAX_ITEMS_PER_ADD`` items, all made or none; each item made
      with its line and chunk (what ``look_first`` finds), answered with its line item.
    * ``delete_draft`` deletes a draft and its items, as the dashboard does.
    * ``hold(mode)`` holds the next ``set_line_items``, ``add_lines`` or ``update_lines``:
      Stripe has it and executes it only when the test calls ``Held.land()``.
      ``"block"``: its caller waits for that (a slow request); ``"timeout"``: its caller
      gives up at once with a connection failure (an unknown outcome) while the request
      still lands later.
    """

    failures: list[ChargeFailure] = field(default_factory=list)
    items: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> item
    keys: dict[str, tuple[Any, Any, datetime]] = field(
        default_factory=dict
    )  # key -> (params, answer, at)
    calls: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    finalized: dict[str, StripeInvoiceView] = field(default_factory=dict)  # invoice -> view
    credit_notes: dict[str, CreditNote] = field(default_factory=dict)  # id -> note
    holding: list[str] = field(default_factory=list)  # modes of the next pushes to hold
    in_flight: list[Held] = field(default_factory=list)
    breaker: str = "closed"
    repair_keys: list[str] = field(default_factory=list)
    key_ttl: timedelta = timedelta(hours=24)
    clock: Callable[[], datetime] = field(default=lambda: T0)
    stripe_customers: set[str] = field(default_factory=set)
    drafts: dict[str, str] = field(default_factory=dict)  # Stripe invoice -> its customer
    drafts_made = 0
    items_made = 0  # item ids are never reused, a deleted draft's items' neither
    executed: list[str] = field(default_factory=list)  # keys executed (not replayed)

    def delete_draft(self, stripe_invoice_id: str, *, items_to_pending: bool = False) -> None:
        """Deleted in the dashboard: the draft is gone (a 404 from now), and its items with
        it, or (``items_to_pending``: Stripe does not document which) left pending, on no
        invoice, where another invoice of the customer could take them."""
        customer = self.drafts.pop(stripe_invoice_id)
        gone = [i for i, item in self.items.items() if item["invoice"] == stripe_invoice_id]
        for item_id in gone:
            if items_to_pending:
                self.items[item_id].update(invoice=None, customer=customer)
            else:
                del self.items[item_id]

    def _item_ids(self) -> tuple[str, str]:
        """A new item's id and its line item's, never given before."""
        self.items_made += 1
        return f"ii_{self.items_made - 1}", f"il_{7919 * self.items_made}"

    def hold(self, mode: str = "block") -> None:
        self.holding.append(mode)

    def _fail(self) -> ChargeFailure | None:
        return self.failures.pop(0) if self.failures else None

    def _keyed(self, key: str, params: Any, run: Callable[[], Any]) -> Any:
        """Stripe's idempotency: replay the first answer of ``key``, refuse other
        parameters under it, forget it after ``key_ttl``; else run and save."""
        now = self.clock()
        saved = self.keys.get(key)
        if saved is not None and now - saved[2] < self.key_ttl:
            if saved[0] != params:
                return _refused(f"idempotency_error: key {key} was used with other parameters")
            return saved[1]
        answer = run()
        self.executed.append(key)
        self.keys[key] = (params, answer, now)
        return answer

    def customer(self, customer_id: str, *, look_first: bool) -> str | ChargeFailure:
        self.calls.append("customer")
        failed = self._fail()
        if failed:
            return failed
        if look_first:
            found = [c for c in self.stripe_customers if c == f"cus_{customer_id}"]
            if found:
                return found[0]

        def make() -> str:
            made = f"cus_{customer_id}"
            if made in self.stripe_customers:  # a key past its window: a second customer
                made = f"cus_{customer_id}_{len(self.stripe_customers)}"
            self.stripe_customers.add(made)
            return made

        return self._keyed(f"customer:{customer_id}", customer_id, make)  # type: ignore[no-any-return]

    def draft_invoice(self, draft: DraftInvoice, *, look_first: bool) -> str | ChargeFailure:
        self.calls.append("invoice")
        failed = self._fail()
        if failed:
            return failed
        if draft.stripe_customer_id not in self.stripe_customers:
            return _refused(f"No such customer: '{draft.stripe_customer_id}'")

        def make() -> str:
            self.drafts_made += 1
            made = f"in_{self.drafts_made}"
            self.drafts[made] = draft.stripe_customer_id
            return made

        params = (draft.stripe_customer_id, draft.currency, draft.invoice_id)
        key = on_draft(f"invoice:{draft.invoice_id}", draft.draft)
        return self._keyed(key, params, make)  # type: ignore[no-any-return]

    def set_line_items(self, items: LineItems) -> list[str] | ChargeFailure:
        return self._maybe_held(lambda: self._set_line_items(items))  # type: ignore[no-any-return]

    def update_lines(self, update: LinesUpdate) -> ChargeFailure | None:
        return self._maybe_held(lambda: self._update_lines(update))  # type: ignore[no-any-return]

    def add_lines(self, add: LinesAdd) -> AddedItems | ChargeFailure:
        return self._maybe_held(lambda: self._add_lines(add))  # type: ignore[no-any-return]

    def _add_lines(self, add: LinesAdd) -> AddedItems | ChargeFailure:
        self.calls.append("add_lines")
        failed = self._fail()
        if failed:
            return failed
        invoice = add.stripe_invoice_id
        made: AddedItems = {}
        adds = [(a.line_id, c, s, m, a.meter) for a in add.adds for c, s, m in a.items]
        if add.look_first:  # by each item's line and chunk (its metadata)
            wanted = {(a[0], a[1]) for a in adds}
            for item_id, item in self.items.items():
                key = (item["line"], item["chunk"])
                if item["invoice"] == invoice and key in wanted and key not in made:
                    made[key] = (item_id, None)
            adds = [a for a in adds if (a[0], a[1]) not in made]
            if not adds:
                return made
        params = (invoice, add.stripe_customer_id, add.currency, tuple(sorted(map(str, adds))))

        def run() -> AddedItems | ChargeFailure:
            if self.drafts.get(invoice) != add.stripe_customer_id:
                return _refused(f"No such invoice of {add.stripe_customer_id}: '{invoice}'")
            if invoice in self.finalized:
                return _refused(f"invoice {invoice} is not a draft: no lines are added")
            if len(adds) > MAX_ITEMS_PER_ADD:
                return _refused(f"{len(adds)} lines: at most {MAX_ITEMS_PER_ADD} a request")
            answer: AddedItems = {}
            for line, chunk, sequence, amount, _ in adds:
                made_id, il = self._item_ids()
                self.items[made_id] = {
                    "amount": amount, "line": line, "invoice": invoice, "chunk": chunk,
                    "sequence": sequence, "il": il,
                }  # fmt: skip
                answer[line, chunk] = (made_id, self.items[made_id]["il"])
            return answer

        # Looked first: the part not found is a request of its own (its own key).
        rest = tuple(
            LineAdd(a.line_id, a.meter, a.period, items)
            for a in add.adds
            if (items := tuple(i for i in a.items if (a.line_id, i[0]) not in made))
        )
        key = replace(add, adds=rest).key
        done = self._keyed(key, params, run)
        if isinstance(done, ChargeFailure):
            return done
        return {**made, **done}

    def _maybe_held(self, run: Callable[[], Any]) -> Any:
        if not self.holding:
            return run()
        mode = self.holding.pop(0)
        answer: list[Any] = []
        held = Held(lambda: answer.append(run()))
        self.in_flight.append(held)
        if mode == "timeout":
            return ChargeFailure("connection", "timed out (held)", retryable=True)
        held.released.wait(timeout=10)
        return answer[0] if answer else ChargeFailure("connection", "never landed", True)

    def line_items(self, stripe_invoice_id: str) -> dict[str, str] | ChargeFailure:
        self.calls.append("lines")
        failed = self._fail()
        if failed:
            return failed
        if stripe_invoice_id not in self.drafts:
            return _missing(f"No such invoice: '{stripe_invoice_id}'")
        return {k: i["il"] for k, i in self.items.items() if i["invoice"] == stripe_invoice_id}

    def _update_lines(self, update: LinesUpdate) -> ChargeFailure | None:
        self.calls.append("update_lines")
        failed = self._fail()
        if failed:
            return failed
        invoice = update.stripe_invoice_id
        sets = [s for part in update.parts for s in part.sets]
        params = (invoice, tuple((s.line_item_id, s.amount, s.sequence) for s in sets))

        def run() -> ChargeFailure | None:
            if invoice not in self.drafts:
                return _refused(f"No such invoice: '{invoice}'")
            if invoice in self.finalized:
                return _refused(f"invoice {invoice} is not a draft: its lines are final")
            if len(sets) > MAX_LINES_PER_UPDATE:
                return _refused(f"{len(sets)} lines: at most {MAX_LINES_PER_UPDATE} a request")
            by_line = {i["il"]: k for k, i in self.items.items() if i["invoice"] == invoice}
            named = [s.line_item_id for s in sets]
            if len(set(named)) != len(named):
                return _refused("a line item is given more than once")
            unknown = [n for n in named if n not in by_line]
            if unknown:
                return _refused(f"No such line item: '{unknown[0]}'")
            for s in sets:
                self._set(by_line[s.line_item_id], s.amount, s.sequence)
            return None

        return self._keyed(update.key, params, run)  # type: ignore[no-any-return]

    def _set_line_items(self, items: LineItems) -> list[str] | ChargeFailure:
        invoice = items.stripe_invoice_id
        if self.drafts.get(invoice) != items.stripe_customer_id:
            return _refused(f"No such invoice of {items.stripe_customer_id}: '{invoice}'")
        ids: list[str] = []
        for step in items.plan.items:
            item_id = step.item_id
            if item_id is None:
                self.calls.append("item")
                failed = self._fail()
                if failed:
                    return failed
                made = self._create_item(
                    items, step.chunk, step.create_amount, step.create_sequence
                )
                if isinstance(made, ChargeFailure):
                    return made
                item_id = made
            if step.update:
                self.calls.append("update")
                failed = self._fail()
                if failed:
                    return failed
                key = on_draft(
                    push_key(items.line_id, step.chunk, items.plan.sequence, items.plan.repair),
                    items.draft,
                )
                done = self._keyed(
                    key,
                    (item_id, step.amount),
                    lambda i=item_id, a=step.amount, s=items.plan.sequence: self._set(i, a, s),
                )
                if isinstance(done, ChargeFailure):
                    return done
            ids.append(item_id)
        return ids

    def _create_item(
        self, items: LineItems, chunk: int, amount: int | None, sequence: int | None
    ) -> str | ChargeFailure:
        if items.look_first:
            for item_id, item in self.items.items():
                if (
                    item["line"] == items.line_id
                    and item.get("chunk") == chunk
                    and item["invoice"] == items.stripe_invoice_id
                ):
                    return item_id
        invoice = items.stripe_invoice_id

        def make() -> str | ChargeFailure:
            if invoice in self.finalized:
                return _refused(f"invoice {invoice} is not a draft")
            made, il = self._item_ids()
            self.items[made] = {
                "amount": amount, "line": items.line_id, "invoice": invoice,
                "chunk": chunk, "sequence": sequence, "il": il,
            }  # fmt: skip
            return made

        params = (items.line_id, chunk, amount, sequence, invoice)
        return self._keyed(on_draft(item_key(items.line_id, chunk), items.draft), params, make)  # type: ignore[no-any-return]

    def _set(self, item_id: str, amount: int, sequence: int) -> ChargeFailure | None:
        item = self.items.get(item_id)
        if item is None:
            return _missing(f"No such invoiceitem: '{item_id}'")
        if item["invoice"] in self.finalized:
            return _refused(f"invoice {item['invoice']} is not a draft: its items are final")
        item["amount"] = amount
        item["sequence"] = sequence
        return None

    def finalize_invoice(
        self, stripe_invoice_id: str, invoice_id: UUID, *, look_first: bool, draft: int = 1
    ) -> StripeInvoiceView | ChargeFailure:
        """Finalize (number and total from the items on it); a second call answers the
        finalized invoice, as the real gateway does (it reads one that is not a draft)."""
        self.calls.append("finalize")
        failed = self._fail()
        if failed:
            return failed
        if stripe_invoice_id not in self.drafts:
            return _missing(f"No such invoice: '{stripe_invoice_id}'")
        if stripe_invoice_id in self.finalized:
            return self.finalized[stripe_invoice_id]

        def make() -> StripeInvoiceView:
            total = sum(
                i["amount"] for i in self.items.values() if i.get("invoice") == stripe_invoice_id
            )
            view = StripeInvoiceView(
                status="open", number=f"FAKE-{len(self.finalized) + 1:04d}", total=total,
                amount_paid=0, attempt_count=0, next_payment_attempt=None, at=T0,
                source="finalize",
            )  # fmt: skip
            self.finalized[stripe_invoice_id] = view
            return view

        key = on_draft(f"invoice-finalize:{invoice_id}", draft)
        return self._keyed(key, stripe_invoice_id, make)  # type: ignore[no-any-return]

    def read_draft(self, stripe_invoice_id: str) -> DraftView | ChargeFailure:
        self.calls.append("read")
        failed = self._fail()
        if failed:
            return failed
        if stripe_invoice_id not in self.drafts:
            return _missing(f"No such invoice: '{stripe_invoice_id}'")
        items = tuple(
            DraftItem(item_id, int(i["amount"]))
            for item_id, i in self.items.items()
            if i.get("invoice") == stripe_invoice_id
        )
        final = self.finalized.get(stripe_invoice_id)
        status = final.status if final is not None else "draft"
        total = final.total if final is not None else sum(i.amount for i in items)
        return DraftView(status, total, items)

    def repair_items(self, repairs: Sequence[ItemRepair]) -> ChargeFailure | None:
        for repair in repairs:
            self.calls.append("repair")
            self.repair_keys.append(repair.key)
            failed = self._fail()
            if failed:
                return failed
            done = self._keyed(
                repair.key, (repair.item_id, repair.amount),
                lambda r=repair: self._set(r.item_id, r.amount, r.sequence),
            )  # fmt: skip
            if isinstance(done, ChargeFailure):
                return done
        return None

    def finalized_items(self) -> set[str]:
        return {k for k, i in self.items.items() if i.get("invoice") in self.finalized}

    def credit_note(self, note: CreditNote) -> str | ChargeFailure:
        self.calls.append("credit_note")
        failed = self._fail()
        if failed:
            return failed
        final = self.finalized.get(note.stripe_invoice_id)
        if final is None:
            return _refused(f"invoice {note.stripe_invoice_id} is not final: no credit note")

        def make() -> str | ChargeFailure:
            credited = sum(
                n.amount for n in self.credit_notes.values()
                if n.stripe_invoice_id == note.stripe_invoice_id
            )  # fmt: skip
            if note.amount <= 0 or credited + note.amount > final.total:
                return _refused(
                    f"credit note of {note.amount}: the invoice can be credited"
                    f" {final.total - credited} more"
                )
            made = f"cn_{len(self.credit_notes) + 1}"
            self.credit_notes[made] = note
            return made

        params = (note.stripe_invoice_id, note.amount)
        return self._keyed(f"credit:{note.transaction_id}", params, make)  # type: ignore[no-any-return]

    def pending_items(self, stripe_customer_id: str) -> dict[str, str] | ChargeFailure:
        self.calls.append("pending")
        failed = self._fail()
        if failed:
            return failed
        if stripe_customer_id not in self.stripe_customers:
            return _missing(f"No such customer: '{stripe_customer_id}'")
        return {
            item_id: str(item["line"])
            for item_id, item in self.items.items()
            if item["invoice"] is None
            and item.get("customer", stripe_customer_id) == stripe_customer_id
        }

    def delete_item(self, item_id: str, key: str) -> ChargeFailure | None:
        self.calls.append("delete")
        self.deleted.append(item_id)
        failed = self._fail()
        if failed is None:
            self.items.pop(item_id, None)
        return failed

    def breaker_state(self) -> str:
        return self.breaker

    def held(self, line_id: UUID) -> list[int]:
        """What the fake Stripe holds for a line, item by item."""
        return [i["amount"] for i in self.items.values() if i["line"] == line_id]


def _refused(message: str) -> ChargeFailure:
    """Stripe's 400: a final answer, never retried."""
    return ChargeFailure("http_400", message, retryable=False)


def _missing(message: str) -> ChargeFailure:
    """Stripe's 404 for an object named in the path that does not exist (deleted)."""
    return ChargeFailure("http_404", message, retryable=False)


@dataclass
class FakeDeadLetters:
    """The dead-letter sink port, idempotent by source position as the real one is."""

    letters: dict[tuple[str, int, int], DeadLetter] = field(default_factory=dict)

    def record(self, letters: Sequence[DeadLetter]) -> int:
        new = [d for d in letters if (d.topic, d.partition, d.offset) not in self.letters]
        for d in new:
            self.letters[d.topic, d.partition, d.offset] = d
        return len(new)


@dataclass
class FakeRecord:
    """A consumed Kafka record, as kafka-python's ConsumerRecord shows it to ingest."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)


@dataclass
class FakeConsumer:
    """Hands out ``batches`` one poll at a time and remembers every commit."""

    batches: list[list[FakeRecord]]
    commits: list[dict[Any, Any]] = field(default_factory=list)

    def poll(self, timeout_ms: int = 0) -> dict[Any, list[FakeRecord]]:
        if not self.batches:
            return {}
        return {"tp": self.batches.pop(0)}

    def commit(self, offsets: dict[Any, Any] | None = None) -> None:
        self.commits.append(dict(offsets or {}))


@dataclass
class FakeProducer:
    sent: list[tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]]]] = field(
        default_factory=list
    )
    flushes: int = 0
    refusing: str | None = None  # the broker's answer to every send from now on, if any

    def send(
        self,
        topic: str,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> Future:
        """Like ``KafkaProducer.send``: its future (failed when ``refusing``, and then
        not sent)."""
        future = Future()
        if self.refusing is not None:
            return future.failure(KafkaTimeoutError(self.refusing))
        self.sent.append((topic, key, value, list(headers or [])))
        return future.success(None)

    def flush(self) -> None:
        self.flushes += 1
