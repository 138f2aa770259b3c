"""Invoice lines: a customer's usage of one meter in one period, summed exactly and
rounded once, and what Stripe holds for it.

Two aggregates, because two writers keep them and must not contend:

* ``InvoiceLine`` is written by ingest (and rarely by reversals and compensations):
  each ``Settled`` event lists the transactions a batch settled into the line with
  their exact amounts, and records the running exact total and the billed amount,
  the exact total rounded **once**, half up. ``Removed`` takes transactions out
  (a reversal, a compensation). ``Repriced`` changes the amounts of transactions it
  holds (a price version published for a moment at or before their usage:
  ``domain.repricing``), with the old and new amounts, the new exact total and the
  billed amount rounded once from it; like a removal, while its invoice is a draft
  (open, or closed and not finalizing: ``domain.repricing`` checks it). The line's
  ``sequence`` is its version: every change of the total is a new sequence, so the
  next push sets the new total.
* ``LinePush`` is written by the pushers only: which Stripe invoice items hold the
  line (one, or more when the billed total is above Stripe's largest item amount),
  the newest sequence Stripe acknowledged (``Pushed``), failed pushes with their due
  time, and up to which sequence the line's transactions are recorded Charged.
  Every request that sets an amount is recorded **before** it is sent
  (``AttemptStarted``, with the moment after which it can no longer land) and ended
  when Stripe answered it (``AttemptEnded``); an attempt not ended and not past that
  moment leaves the line *in doubt*: Stripe may still apply it, after a newer one.
  The closer ``Sealed`` the push in the save that starts finalizing its invoice, so no
  attempt can start after that (a pusher that loaded it before loses the version race).

A transaction joins exactly one line: ingest records its ``Reserved`` (naming the
line and the line's version) and the line's ``Settled`` in one atomic save, so the
event store's version check settles any race.

**Lines priced by quantity.** Usage of a meter priced by line quantity (a tiered,
package or flat-fee price: ``domain.pricing``) joins a line whose key names the price
book version that prices it (``price_version``): a line never mixes two versions' tier
functions, even when a version published later takes effect at the period's start
(its records then start a line of their own). Such a line counts its quantity: each
``Settled`` lists the quantities with the amounts, and the line's total ``quantity``
after it; each amount is what its record added to ``f(quantity)``, so it may be
negative (a volume tier) while the line's total never is. A per-unit line (no
``price_version``) counts no quantity (``quantity`` None: nothing per record beyond
today's), nor do lines settled before quantities were recorded (``Settled`` v1, upcast
with ``quantities`` and ``quantity`` None): their amounts are per unit and complete.
``Removed`` takes a record's amount back and leaves the quantity counted (see
``docs/concepts/money.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.errors import IllegalTransition, StaleOwner
from domain.ids import invoice_id, line_id, line_push_id
from domain.money import add_exact, add_quantity, canonical, round_minor, subtract_exact
from domain.ownership import Claim
from domain.periods import Period

__all__ = ["InvoiceLine", "LineChange", "LinePush"]


class InvoiceLine(Aggregate):
    """The exact total of one customer's usage of one meter in one period."""

    class Opened(Aggregate.Created):
        class_version = 2
        customer_id: str
        currency: str
        meter: str
        period_start: datetime
        period_end: datetime
        late_of_start: datetime | None  # a late line: the start of the period it occurred in
        price_version: int | None  # priced by line quantity by this version (v1: none)
        model: str | None  # and that version's model of the meter (for the read models)

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["price_version"] = None
            state["model"] = None

    class Settled(Aggregate.Event):
        class_version = 2
        transaction_ids: list[str]
        amounts: list[str]  # exact minor units, canonical decimal text
        exact_total: Decimal
        billed: int
        transactions: int
        quantities: list[str] | None  # a line priced by quantity: each record's (v1: none)
        quantity: Decimal | None  # and the line's total quantity after them
        tier: int | None  # the tier (1, 2, ...) that quantity reaches, if priced by tiers

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["quantities"] = None
            state["quantity"] = None
            state["tier"] = None

    class Removed(Aggregate.Event):
        transaction_ids: list[str]
        amounts: list[str]
        reason: str
        exact_total: Decimal
        billed: int
        transactions: int

    class Repriced(Aggregate.Event):
        """Transactions it holds were priced again: old and new exact amounts each."""

        transaction_ids: list[str]
        old_amounts: list[str]  # exact minor units, canonical decimal text
        amounts: list[str]  # the new ones
        exact_total: Decimal
        billed: int
        transactions: int

    class Frozen(Aggregate.Event):
        """Its invoice closed: no usage joins it any more (removals still may, until the
        invoice starts finalizing)."""

        invoice_id: UUID

    # State added after the first lines: class defaults, so an older snapshot loads.
    price_version: int | None = None
    model: str | None = None
    quantity: Decimal | None = None
    tier: int | None = None

    @staticmethod
    def create_id(
        customer_id: str,
        currency: str,
        meter: str,
        period_start: datetime,
        late_of_start: datetime | None = None,
        *,
        price_version: int | None = None,
        **_: Any,
    ) -> UUID:
        key = Period(period_start, period_start).key
        if late_of_start is not None:
            key += "~late~" + Period(late_of_start, late_of_start).key
        if price_version is not None:  # priced by quantity: one version per line
            key += f"~v{price_version}"
        return line_id(customer_id, currency, meter, key)

    @classmethod
    def open(
        cls,
        customer_id: str,
        currency: str,
        meter: str,
        period: Period,
        late_of: Period | None = None,
        *,
        price_version: int | None = None,
        model: str | None = None,
    ) -> InvoiceLine:
        """The line of ``meter`` on ``period``'s invoice; ``late_of``: a late line, of usage
        that occurred in that earlier period after its invoice had closed;
        ``price_version``: the version pricing it by line quantity (None: per unit), and
        its ``model`` of the meter."""
        return cls(
            customer_id=customer_id,
            currency=currency,
            meter=meter,
            period_start=period.start,
            period_end=period.end,
            late_of_start=late_of.start if late_of is not None else None,
            price_version=price_version,
            model=model,
        )

    @event(Opened)
    def __init__(  # noqa: PLR0917 (the event's fields, applied on every load)
        self,
        customer_id: str,
        currency: str,
        meter: str,
        period_start: datetime,
        period_end: datetime,
        late_of_start: datetime | None,
        price_version: int | None = None,
        model: str | None = None,
    ) -> None:
        self.customer_id = customer_id
        self.currency = currency
        self.meter = meter
        self.period_start = period_start
        self.period_end = period_end
        self.late_of_start = late_of_start
        self.price_version = price_version
        self.model = model
        self.tier: int | None = None
        self.quantity: Decimal | None = Decimal(0) if price_version is not None else None
        self.exact_total = Decimal(0)
        self.billed = 0
        self.transactions = 0
        self.frozen = False

    @property
    def sequence(self) -> int:
        """The line's version: it grows with every change of its total."""
        return int(self.version)

    @property
    def period(self) -> Period:
        return Period(self.period_start, self.period_end)

    @property
    def invoice_id(self) -> UUID:
        """The invoice this line is on (its customer, currency and period)."""
        return invoice_id(self.customer_id, self.currency, self.period.key)

    def freeze(self) -> None:
        """Its invoice closed (recorded in the same save as ``Invoice.Closed``)."""
        if not self.frozen:
            self._frozen(self.invoice_id)

    @event(Frozen)
    def _frozen(self, invoice_id: UUID) -> None:
        self.frozen = True

    def settle(
        self,
        entries: Sequence[tuple[UUID, Decimal]],
        quantities: Sequence[Decimal] | None = None,
        tier: int | None = None,
    ) -> None:
        """Add transactions (id, exact amount) to the line, in one event; a line priced by
        quantity needs each one's ``quantities`` (its amounts are increments, possibly
        negative, and its total never drops below 0) and the ``tier`` its quantity then
        reaches (if its price has tiers); a per-unit line takes neither."""
        if not entries:
            return
        if self.frozen:
            raise IllegalTransition(f"line {self.id} is frozen: its invoice has closed")
        if (quantities is None) != (self.price_version is None):
            raise ValueError(f"line {self.id}: quantities go with a line priced by quantity")
        total = self.exact_total
        for _, amount in entries:
            if amount < 0 and quantities is None:
                raise ValueError(f"a settled amount cannot be negative: {amount}")
            total = add_exact(total, amount)
        counted, quantity = self._counted(len(entries), quantities)
        if total < 0:
            raise ValueError(f"line {self.id}: a total cannot be negative: {total}")
        self._settled(
            [str(i) for i, _ in entries],
            [f"{canonical(a):f}" for _, a in entries],
            total,
            round_minor(total),
            self.transactions + len(entries),
            counted,
            quantity,
            tier if quantities is not None else None,
        )

    def _counted(
        self, entries: int, quantities: Sequence[Decimal] | None
    ) -> tuple[list[str] | None, Decimal | None]:
        if quantities is None or self.quantity is None:
            return None, None
        if len(quantities) != entries:
            raise ValueError(f"{entries} transactions, {len(quantities)} quantities")
        quantity = self.quantity
        for q in quantities:
            quantity = add_quantity(quantity, q)
        return [f"{canonical(q):f}" for q in quantities], quantity

    @event(Settled)
    def _settled(  # noqa: PLR0917 (the event's fields, applied on every load)
        self,
        transaction_ids: list[str],
        amounts: list[str],
        exact_total: Decimal,
        billed: int,
        transactions: int,
        quantities: list[str] | None = None,
        quantity: Decimal | None = None,
        tier: int | None = None,
    ) -> None:
        self.exact_total = exact_total
        self.billed = billed
        self.transactions = transactions
        if quantity is not None:
            self.quantity = quantity
            self.tier = tier

    def reprice(self, entries: Sequence[tuple[UUID, Decimal, Decimal]]) -> None:
        """Change the amounts of transactions the line holds (id, old exact amount, new
        exact amount), in one event; the total follows, rounded once. A frozen line too,
        as a removal: whether its invoice still takes the change is its invoice's
        (``domain.repricing.apply_repricing``)."""
        if not entries:
            return
        total = self.exact_total
        for _, old, new in entries:
            if new < 0:
                raise ValueError(f"a repriced amount cannot be negative: {new}")
            total = add_exact(subtract_exact(total, old), new)
        if total < 0 or len(entries) > self.transactions:
            raise ValueError(f"cannot reprice more than line {self.id} holds")
        self._repriced(
            [str(i) for i, _, _ in entries],
            [f"{canonical(old):f}" for _, old, _ in entries],
            [f"{canonical(new):f}" for _, _, new in entries],
            total,
            round_minor(total),
            self.transactions,
        )

    @event(Repriced)
    def _repriced(  # noqa: PLR0917 (the event's fields, applied on every load)
        self,
        transaction_ids: list[str],
        old_amounts: list[str],
        amounts: list[str],
        exact_total: Decimal,
        billed: int,
        transactions: int,
    ) -> None:
        self._totals(exact_total, billed, transactions)

    def _totals(self, exact_total: Decimal, billed: int, transactions: int) -> None:
        self.exact_total = exact_total
        self.billed = billed
        self.transactions = transactions

    def remove(self, entries: Sequence[tuple[UUID, Decimal]], reason: str) -> None:
        """Take transactions out of the line (a reversal or a compensation)."""
        if not entries:
            return
        if not reason.strip():
            raise ValueError("removing from a line needs a reason")
        total = self.exact_total
        for _, amount in entries:
            total = subtract_exact(total, amount)
        if total < 0 or len(entries) > self.transactions:
            raise ValueError(f"cannot remove more than line {self.id} holds")
        self._removed(
            [str(i) for i, _ in entries],
            [f"{canonical(a):f}" for _, a in entries],
            reason,
            total,
            round_minor(total),
            self.transactions - len(entries),
        )

    @event(Removed)
    def _removed(  # noqa: PLR0917 (the event's fields, applied on every load)
        self,
        transaction_ids: list[str],
        amounts: list[str],
        reason: str,
        exact_total: Decimal,
        billed: int,
        transactions: int,
    ) -> None:
        self.exact_total = exact_total
        self.billed = billed
        self.transactions = transactions


class LinePush(Aggregate):
    """What Stripe holds for one invoice line, and what of it is recorded as charged."""

    class Opened(Aggregate.Created):
        line_id: UUID

    class ItemPlanned(Aggregate.Event):
        chunk: int
        sequence: int
        amount: int

    class Pushed(Aggregate.Event):
        sequence: int
        billed: int
        amounts: list[int]
        item_ids: list[str]
        stripe_invoice_id: str
        requests: int  # Stripe requests this push sent (0: Stripe already held it)

    class PushFailed(Aggregate.Event):
        sequence: int
        attempt: int
        error_class: str
        message: str
        retryable: bool
        next_attempt_at: datetime | None
        requests: int

    class ChargesRecorded(Aggregate.Event):
        through: int
        transactions: int

    class AttemptStarted(Aggregate.Event):
        """A request setting the line's amounts is about to be sent."""

        attempt: int
        sequence: int
        sent_at: datetime
        lands_by: datetime  # after this it can no longer take effect in Stripe

    class AttemptEnded(Aggregate.Event):
        """Stripe answered the attempt (or it was never sent): it cannot land later."""

        attempt: int
        outcome: str  # answered (whatever Stripe said) or not_sent (our breaker or limiter)

    class DriftFound(Aggregate.Event):
        """Stripe's draft holds other amounts than the newest acknowledged push: the
        next push sets every item again, under keys of this repair."""

        repair: int
        found: list[int]  # what Stripe held, item by item

    class Sealed(Aggregate.Event):
        """Its invoice started finalizing: no attempt starts any more."""

        invoice_id: UUID

    class LineItemsLearned(Aggregate.Event):
        """Stripe's invoice showed the line items (``il_...``) its items make on the
        draft: ``update_lines`` names a line by them, and they are Stripe's to choose."""

        item_ids: list[str]
        line_item_ids: list[str]

    class AddBatched(Aggregate.Event):
        """Its planned items are created together with these lines' (its own among
        them), in one ``add_lines`` request of its draft: recorded in the save that plans
        every one's items, so a retry of any of them sends the same set."""

        lines: list[str]
        chunks: list[int]  # each line's items in the request
        at: datetime

    class AddBatchLeft(Aggregate.Event):
        """Stripe refused the batch on a draft (nothing made): its items are created on
        their own from now on."""

    class OwnerClaimed(Aggregate.Event):
        """Its pushes run under this claim of the customer's partition from now on: an
        attempt under an older claim of the same partition is refused
        (``domain.ownership``)."""

        partition: int
        epoch: int

    class Redrafted(Aggregate.Event):
        """Stripe lost its invoice's draft (``Invoice.DraftReplaced``, the same save):
        nothing is pushed to the ``draft``-th draft yet, so the next push creates the
        line's items there at its total, under that draft's keys. Charges stay recorded
        (the usage is still owed); the invoice is verified before it is finalized."""

        draft: int
        at: datetime  # when: the new draft's keys are first used after it

    # State added after the first LinePush histories: class defaults, so an older
    # snapshot (which lacks them) loads with them.
    sealed = False
    attempts_started = 0
    repairs = 0
    drifted = False
    owner_partition: int | None = None
    owner_epoch = 0
    # item id -> the id of the line item it makes on its invoice (``LineItemsLearned``)
    learned_line_items: dict[str, str] | None = None
    # the lines (and each one's items) its items are created with, and since when
    add_batch: list[list[Any]] | None = None
    add_batched_at: datetime | None = None
    draft = 1  # the number of its invoice's draft its items are on
    redrafted_at: datetime | None = None  # since when its keys are the new draft's

    @staticmethod
    def create_id(line_id: UUID, **_: Any) -> UUID:
        return line_push_id(line_id)

    @event(Opened)
    def __init__(self, line_id: UUID) -> None:
        self.line_id = line_id
        self.pushed_sequence = 0
        self.pushed_billed = 0
        self.amounts: list[int] = []
        self.item_ids: list[str] = []
        # per chunk, in order: the [sequence, amount] it is (to be) created with (a list of
        # lists, not a dict of tuples: snapshots keep it as JSON does)
        self.planned: list[list[int]] = []
        self.stripe_invoice_id: str | None = None
        self.attempts = 0  # failed pushes since the last acknowledged one
        self.last_error: str | None = None
        self.next_attempt_at: datetime | None = None
        self.unknown_outcome = False  # a failed push may have reached Stripe
        self.charged_through = 0
        self.sealed = False
        self.attempts_started = 0
        self.open_attempts: dict[str, datetime] = {}  # attempt -> when it can no longer land
        self.repairs = 0
        self.drifted = False  # the next push sets every item again (a repair key)

    def _open(self) -> dict[str, datetime]:
        opened: dict[str, datetime] = self.__dict__.get("open_attempts", {})
        return opened

    def plan_item(self, chunk: int, sequence: int, amount: int) -> None:
        """Record, before creating item ``chunk`` in Stripe, the parameters it is created
        with: a retry after a crash sends the same parameters under the same key."""
        if chunk < len(self.planned):
            return
        if chunk != len(self.planned):
            raise ValueError(f"items are planned in order: {chunk} after {len(self.planned)}")
        self._item_planned(chunk, sequence, amount)

    @event(ItemPlanned)
    def _item_planned(self, chunk: int, sequence: int, amount: int) -> None:
        self.planned.append([sequence, amount])

    def record_pushed(  # noqa: PLR0917
        self,
        sequence: int,
        billed: int,
        amounts: list[int],
        item_ids: list[str],
        invoice: str,
        requests: int = 0,
    ) -> None:
        """Stripe acknowledged the line's total at ``sequence`` (ignored when older)."""
        if sequence < self.pushed_sequence:
            raise ValueError(f"push of sequence {sequence} after {self.pushed_sequence}")
        if len(amounts) != len(item_ids) or sum(amounts) != billed:
            raise ValueError(f"items {amounts} do not add up to {billed}")
        self._pushed(sequence, billed, amounts, item_ids, invoice, requests)

    @event(Pushed)
    def _pushed(  # noqa: PLR0917 (the event's fields, applied on every load)
        self,
        sequence: int,
        billed: int,
        amounts: list[int],
        item_ids: list[str],
        stripe_invoice_id: str,
        requests: int,
    ) -> None:
        self.pushed_sequence = sequence
        self.pushed_billed = billed
        self.amounts = list(amounts)
        self.item_ids = list(item_ids)
        self.stripe_invoice_id = stripe_invoice_id
        self.attempts = 0
        self.last_error = None
        self.next_attempt_at = None
        self.unknown_outcome = False
        self.drifted = False

    def record_failure(
        self,
        sequence: int,
        error_class: str,
        message: str,
        *,
        retryable: bool,
        next_attempt_at: datetime | None,
        requests: int = 0,
    ) -> None:
        """One failed push, and when the next is due (None: permanent)."""
        if retryable and next_attempt_at is None:
            raise ValueError("a retryable failure needs next_attempt_at")
        self._push_failed(
            sequence, self.attempts + 1, error_class, message, retryable, next_attempt_at, requests
        )

    @event(PushFailed)
    def _push_failed(  # noqa: PLR0917 (the event's fields, applied on every load)
        self,
        sequence: int,
        attempt: int,
        error_class: str,
        message: str,
        retryable: bool,
        next_attempt_at: datetime | None,
        requests: int,
    ) -> None:
        self.attempts = attempt
        self.last_error = f"{error_class}: {message}"
        self.next_attempt_at = next_attempt_at
        self.unknown_outcome = self.unknown_outcome or retryable

    # -- attempts ---------------------------------------------------------------------

    def start_attempt(
        self, sequence: int, sent_at: datetime, lands_by: datetime, claim: Claim | None = None
    ) -> int:
        """Record, before it is sent at ``sent_at``, a request setting the line's amounts
        to its total at ``sequence``, by the holder of ``claim`` (None: a pusher that
        holds no claim, never refused); its number. A sealed push starts none, nor does
        a claim older than the newest recorded (``StaleOwner``); a newer one is recorded."""
        if self.sealed:
            raise IllegalTransition(f"line push {self.id} is sealed: its invoice is finalizing")
        if self.fenced_out(claim):
            raise StaleOwner(
                f"line push {self.id} is pushed under claim {self.owner_epoch} of partition"
                f" {self.owner_partition}, newer than this pusher's {claim}"
            )
        if lands_by < sent_at:
            raise ValueError(f"an attempt cannot land ({lands_by}) before it is sent ({sent_at})")
        if claim is not None and (claim.partition, claim.epoch) != (
            self.owner_partition,
            self.owner_epoch,
        ):
            self._owner_claimed(claim.partition, claim.epoch)
        attempt = self.attempts_started + 1
        self._attempt_started(attempt, sequence, sent_at, lands_by)
        return attempt

    def fenced_out(self, claim: Claim | None) -> bool:
        """Whether a pusher holding ``claim`` lost the line to a newer holder of its
        partition. A claim of another partition (the topic was repartitioned) is newer."""
        return (
            claim is not None
            and claim.partition == self.owner_partition
            and claim.epoch < self.owner_epoch
        )

    @event(OwnerClaimed)
    def _owner_claimed(self, partition: int, epoch: int) -> None:
        self.owner_partition = partition
        self.owner_epoch = epoch

    @event(AttemptStarted)
    def _attempt_started(
        self, attempt: int, sequence: int, sent_at: datetime, lands_by: datetime
    ) -> None:
        self.attempts_started = attempt
        # Attempts that could no longer land when this one was sent are forgotten (kept,
        # they would only grow the state: every timed-out retry leaves one).
        still = {k: at for k, at in self._open().items() if at > sent_at}
        self.open_attempts = {**still, str(attempt): lands_by}

    def end_attempt(self, attempt: int, outcome: str) -> None:
        """Stripe answered ``attempt`` (or it was never sent): it cannot land later."""
        if str(attempt) in self._open():
            self._attempt_ended(attempt, outcome)

    @event(AttemptEnded)
    def _attempt_ended(self, attempt: int, outcome: str) -> None:
        self.open_attempts = {k: v for k, v in self._open().items() if k != str(attempt)}

    def in_doubt_until(self, now: datetime) -> datetime | None:
        """The latest moment an attempt not answered may still land, if after ``now``."""
        pending = [at for at in self._open().values() if at > now]
        return max(pending, default=None)

    # -- line items -------------------------------------------------------------------

    def line_item_ids(self) -> list[str] | None:
        """The line item of each of the line's items, in chunk order, when every one is
        known (else None: they must be learned from Stripe first)."""
        known = self.learned_line_items or {}
        found = [known.get(item) for item in self.item_ids]
        return [f for f in found if f is not None] if all(found) and found else None

    def learn_line_items(self, found: dict[str, str]) -> None:
        """Stripe's invoice lists these line items (item id -> line item id); those of the
        line's items not known yet are recorded."""
        known = self.learned_line_items or {}
        new = {i: found[i] for i in self.item_ids if i in found and known.get(i) != found[i]}
        if new:
            self._line_items_learned(list(new), [new[i] for i in new])

    @event(LineItemsLearned)
    def _line_items_learned(self, item_ids: list[str], line_item_ids: list[str]) -> None:
        known = dict(self.learned_line_items or {})
        known.update(zip(item_ids, line_item_ids, strict=True))
        self.learned_line_items = known

    # -- a batch of new lines ------------------------------------------------------------

    def batch_add(self, lines: Sequence[UUID], chunks: Sequence[int], at: datetime) -> None:
        """Record, with its planned items and before the request, that they are created
        together with ``lines``' (each with its count of ``chunks``), one request."""
        if self.item_ids or self.add_batch is not None:
            raise IllegalTransition(f"line push {self.id}: its items are made or batched")
        if self.line_id not in lines or len(lines) != len(chunks):
            raise ValueError(f"a batch of {self.line_id} names it, with each line's items")
        self._add_batched([str(line) for line in lines], list(chunks), at)

    @event(AddBatched)
    def _add_batched(self, lines: list[str], chunks: list[int], at: datetime) -> None:
        self.add_batch = [[line, n] for line, n in zip(lines, chunks, strict=True)]
        self.add_batched_at = at

    def batched(self) -> list[tuple[UUID, int]] | None:
        """The batch its items are created in, while they are not made: (line, items)."""
        if self.add_batch is None or self.item_ids:
            return None
        return [(UUID(str(line)), int(n)) for line, n in self.add_batch]

    def leave_batch(self) -> None:
        """Stripe refused the batch: its items are created on their own."""
        if self.add_batch is not None:
            self._add_batch_left()

    @event(AddBatchLeft)
    def _add_batch_left(self) -> None:
        self.add_batch = None
        self.add_batched_at = None

    def record_drift(self, found: list[int]) -> int:
        """Stripe's draft was read holding ``found`` for this line's items, not its newest
        acknowledged amounts; the repair this starts (the next push sets every item)."""
        if self.sealed:
            raise IllegalTransition(f"line push {self.id} is sealed: the closer repairs it")
        if found == self.amounts:
            raise ValueError(f"line push {self.id}: {found} is what it holds, not drift")
        repair = self.repairs + 1
        self._drift_found(repair, list(found))
        return repair

    @event(DriftFound)
    def _drift_found(self, repair: int, found: list[int]) -> None:
        self.repairs = repair
        self.drifted = True

    def seal(self, invoice_id: UUID) -> None:
        """Its invoice starts finalizing (recorded in the same save as FinalizeStarted)."""
        if not self.sealed:
            self._sealed(invoice_id)

    @event(Sealed)
    def _sealed(self, invoice_id: UUID) -> None:
        self.sealed = True

    def redraft(self, draft: int, at: datetime) -> None:
        """Its invoice is billed on its ``draft``-th draft from ``at`` (recorded in the
        save of ``Invoice.DraftReplaced``): nothing of the line is there yet."""
        if draft <= self.draft:
            raise ValueError(f"line push {self.id} is on draft {self.draft}, not before {draft}")
        self._redrafted(draft, at)

    def keys_since(self) -> datetime:
        """Since when the keys of its items' creation may have been used: its first
        push, or its move to a new draft (whose keys are new)."""
        return self.redrafted_at or self.created_on

    @event(Redrafted)
    def _redrafted(self, draft: int, at: datetime) -> None:
        self.draft = draft
        self.redrafted_at = at
        self.pushed_sequence = 0
        self.pushed_billed = 0
        self.amounts = []
        self.item_ids = []
        self.planned = []
        self.stripe_invoice_id = None
        self.attempts = 0
        self.last_error = None
        self.next_attempt_at = None
        self.unknown_outcome = False
        self.sealed = False
        self.open_attempts = {}
        self.repairs = 0
        self.drifted = False
        self.learned_line_items = None
        self.add_batch = None
        self.add_batched_at = None

    # -- charges ------------------------------------------------------------------------

    def record_charges(self, through: int, transactions: int) -> None:
        """The line's transactions settled up to version ``through`` are recorded Charged."""
        if through > self.pushed_sequence or through <= self.charged_through:
            raise ValueError(
                f"charges through {through}: pushed {self.pushed_sequence},"
                f" charged through {self.charged_through}"
            )
        self._charges_recorded(through, transactions)

    @event(ChargesRecorded)
    def _charges_recorded(self, through: int, transactions: int) -> None:
        self.charged_through = through


LineChange = InvoiceLine.Settled | InvoiceLine.Removed | InvoiceLine.Repriced
"""An event that changes a line's transactions or their amounts (and so its total)."""
