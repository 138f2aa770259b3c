"""The line pushes' decisions (pure): what to send Stripe for a line, and what next.

A push sets Stripe's invoice items for a line to the line's **newest** billed total:
absolute amounts, so a repeated push can never add twice. ``plan_push`` says which
items to create (each planned, with the parameters it is created with, before it is
sent: a crash and a retry send the same parameters under the same idempotency key)
and which to update; an unchanged billed total needs no Stripe call at all (sub-cent
usage that does not move the rounding). ``after_failure`` says when to try again;
a retryable failure is retried for ever with capped backoff (owed usage is never
dropped because Stripe is down: past the horizon the line is reported failing), a
permanent one (Stripe refuses the request) compensates the line's transactions that
no push has included yet.

**Per invoice.** A line's first push creates its items, one request each (there is
nothing to update yet, and an item's creation is keyed by its line and chunk alone).
After that a push only *sets* amounts, and the lines of one draft invoice are set
together: ``invoice_update`` gathers the lines of an invoice whose plans only update
items whose line items (``il_...``, learned from Stripe) are known, and ``batches``
groups them, whole lines in order, into requests of at most ``MAX_LINES_PER_UPDATE``
line items (Stripe's ``POST /v1/invoices/{id}/update_lines``). A request's key is the
invoice's id and a digest of what it sets (``lines_key``: each line, chunk, sequence
and repair), never a clock: a retry of the same set replays Stripe's first answer.

**New lines together.** A line's first push creates its items together with the other
new lines of its draft, in one request (Stripe's ``POST /v1/invoices/{id}/add_lines``):
``LineAdd`` is one line's share, its items at their planned parameters, and ``add_key``
the request's key: the invoice's id and a digest of every (line, chunk, sequence,
amount) it creates, so the same recorded set is always the same request. A request
creates at most ``MAX_ITEMS_PER_ADD`` items.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from uuid import UUID

from eventsourcing.utils import get_topic

from domain.invoice_line import InvoiceLine, LineChange, LinePush
from domain.money import split_for_items
from domain.saga import ChargeFailure, RetryPolicy, retry_due
from domain.transaction import BillingTransaction, TxnState

__all__ = [
    "CHARGEABLE_TOPICS",
    "MAX_ITEMS_PER_ADD",
    "MAX_LINES_PER_UPDATE",
    "REPRICED_TOPIC",
    "ItemStep",
    "LineAdd",
    "LinePart",
    "LineSet",
    "PushPlan",
    "PushVerdict",
    "add_key",
    "after_failure",
    "batches",
    "charged_events",
    "invoice_part",
    "item_key",
    "lines_key",
    "plan_push",
    "planned_push",
    "push_key",
    "repriced_last",
    "settled_in",
]

MAX_LINES_PER_UPDATE = 50
"""Line items one ``update_lines`` request sets at most. Stripe's API reference and its
guide to bulk line items (read 2026-12-05) state no number for it; an invoice holds at
most 250 items. This bound is the ledger's choice, kept well below that, and the
emulator enforces the same."""


MAX_ITEMS_PER_ADD = 10
"""Items one ``add_lines`` request creates at most: the ledger's choice. Stripe's
answer (the invoice) embeds the first page of its lines, ten; beyond that the gateway
pages through the invoice's lines to find the ids of the items it created."""


def item_key(line_id: object, chunk: int) -> str:
    """Idempotency key of creating item ``chunk`` of a line (its planned parameters)."""
    return f"line-item:{line_id}:{chunk}"


def push_key(line_id: object, chunk: int, sequence: int, repair: int = 0) -> str:
    """Idempotency key of setting item ``chunk`` of a line to its total at ``sequence``
    (``repair``: the line's repair of drift found in its draft, a key of its own, so
    Stripe executes it instead of replaying the push that the drift overwrote)."""
    key = f"line-push:{line_id}:{chunk}:{sequence}"
    return f"{key}:r{repair}" if repair else key


@dataclass(frozen=True)
class ItemStep:
    """One invoice item of a push: what it must hold, and how to get it there."""

    chunk: int
    amount: int  # what the item must hold after the push
    item_id: str | None  # the item, when known; None: create it
    create_sequence: int | None = None  # the planned creation's sequence and amount
    create_amount: int | None = None
    update: bool = False  # set the amount (and sequence) after create or on a known item


@dataclass(frozen=True)
class PushPlan:
    """What one push sends: the line's total at ``sequence`` as ``items``."""

    sequence: int
    billed: int
    items: tuple[ItemStep, ...]
    to_plan: tuple[tuple[int, int, int], ...]  # (chunk, sequence, amount) to record first
    repair: int = 0  # a repair of drift: every item set again under repair keys

    @property
    def calls(self) -> int:
        """Stripe requests the items need (creations and updates)."""
        return sum((s.item_id is None) + s.update for s in self.items)

    @property
    def amounts(self) -> list[int]:
        return [s.amount for s in self.items]


def plan_push(line: InvoiceLine, push: LinePush) -> PushPlan | None:
    """The push of ``line``'s newest total, or None when Stripe has it already (or
    drift was found in the draft: then every item is set again, under repair keys)."""
    if line.sequence <= push.pushed_sequence and not push.drifted:
        return None
    # Nothing billed and no item yet: nothing to create (an item of 0 would be noise).
    amounts = split_for_items(line.billed) if line.billed or push.item_ids else []
    amounts += [0] * (len(push.item_ids) - len(amounts))  # items no longer needed hold 0
    steps: list[ItemStep] = []
    to_plan: list[tuple[int, int, int]] = []
    for chunk, amount in enumerate(amounts):
        if chunk < len(push.item_ids):
            # After a push whose outcome is unknown Stripe may hold anything: set every item.
            changed = push.unknown_outcome or push.drifted or push.amounts[chunk] != amount
            steps.append(ItemStep(chunk, amount, push.item_ids[chunk], update=changed))
            continue
        if chunk < len(push.planned):
            sequence, created = push.planned[chunk]
        else:
            sequence, created = line.sequence, amount
            to_plan.append((chunk, sequence, created))
        steps.append(ItemStep(chunk, amount, None, sequence, created, update=created != amount))
    repair = push.repairs if push.drifted else 0
    return PushPlan(line.sequence, line.billed, tuple(steps), tuple(to_plan), repair)


@dataclass(frozen=True)
class LineSet:
    """One line item an ``update_lines`` request sets: the ledger's line and chunk, the
    line item Stripe named for the chunk's item, and the amount at ``sequence``."""

    line_id: UUID
    chunk: int
    line_item_id: str
    amount: int
    sequence: int
    repair: int = 0


@dataclass(frozen=True)
class LinePart:
    """A line's share of an invoice's push: its plan and the line items it sets."""

    line_id: UUID
    plan: PushPlan
    sets: tuple[LineSet, ...]


def invoice_part(
    line_id: UUID, plan: PushPlan, line_items: Sequence[str] | None
) -> LinePart | None:
    """The line's part in a push of its invoice, or None when the line must be pushed on
    its own: an item still to create (its first push), or a line item not learned yet."""
    if not plan.calls or line_items is None or len(line_items) < len(plan.items):
        return None
    if any(step.item_id is None for step in plan.items):
        return None
    sets = tuple(
        LineSet(line_id, step.chunk, line_items[step.chunk], step.amount, plan.sequence,
                plan.repair)
        for step in plan.items
        if step.update
    )  # fmt: skip
    return LinePart(line_id, plan, sets)


def batches(
    parts: Sequence[LinePart], maximum: int = MAX_LINES_PER_UPDATE
) -> list[tuple[LinePart, ...]]:
    """``parts`` grouped, in order and each line whole, into requests of at most
    ``maximum`` line items. A line with more items than that is in none: it is pushed
    on its own, item by item."""
    out: list[list[LinePart]] = []
    count = maximum
    for part in parts:
        if len(part.sets) > maximum:
            continue
        if count + len(part.sets) > maximum:
            out.append([])
            count = 0
        out[-1].append(part)
        count += len(part.sets)
    return [tuple(batch) for batch in out]


def lines_key(invoice_id: object, parts: Sequence[LinePart]) -> str:
    """Idempotency key of one ``update_lines`` request of the invoice: its id and a digest
    of every (line, chunk, sequence, repair) it sets, in a fixed order. The same set is
    always the same request (the amounts follow from the sequences); any other set is
    another key."""
    sets = sorted(f"{s.line_id}:{s.chunk}:{s.sequence}:{s.repair}" for p in parts for s in p.sets)
    digest = hashlib.sha256("|".join(sets).encode()).hexdigest()[:32]
    return f"invoice-lines:{invoice_id}:{digest}"


@dataclass(frozen=True)
class LineAdd:
    """One line's share of an ``add_lines`` request: its items to create, each
    (chunk, sequence, amount) as planned (``LinePush.planned``), and what describes them."""

    line_id: UUID
    meter: str
    period: str  # the line's period, as its items' descriptions name it
    items: tuple[tuple[int, int, int], ...]


def add_key(invoice_id: object, adds: Sequence[LineAdd]) -> str:
    """Idempotency key of one ``add_lines`` request of the invoice: its id and a digest of
    every (line, chunk, sequence, amount) it creates, in a fixed order. A retry of the
    recorded set is the same request; any other set (a part found already made) is
    another key."""
    made = sorted(f"{a.line_id}:{c}:{s}:{m}" for a in adds for c, s, m in a.items)
    digest = hashlib.sha256("|".join(made).encode()).hexdigest()[:32]
    return f"invoice-add:{invoice_id}:{digest}"


def planned_push(push: LinePush, item_ids: Sequence[str]) -> PushPlan:
    """What Stripe holds for a line once its planned items are made (``item_ids``, in
    chunk order): the total at the sequence they were planned at."""
    amounts = [amount for _, amount in push.planned[: len(item_ids)]]
    sequence = max((s for s, _ in push.planned[: len(item_ids)]), default=0)
    steps = tuple(ItemStep(c, a, i) for c, (a, i) in enumerate(zip(amounts, item_ids, strict=True)))
    return PushPlan(sequence, sum(amounts), steps, ())


class PushVerdict(StrEnum):
    RETRY = "retry"  # record PushFailed with the next attempt's due time
    ABANDON = "abandon"  # a permanent refusal: compensate what no push has included


@dataclass(frozen=True)
class FailureDecision:
    verdict: PushVerdict
    next_attempt_at: datetime | None = None
    reason: str | None = None


def after_failure(
    push: LinePush, failure: ChargeFailure, now: datetime, policy: RetryPolicy, jitter: float
) -> FailureDecision:
    """What to record after a failed push of a line."""
    if not failure.retryable:
        return FailureDecision(
            PushVerdict.ABANDON,
            reason=f"Stripe refused the line: {failure.error_class}: {failure.message}",
        )
    due = retry_due(failure, push.attempts + 1, now, policy, jitter)
    return FailureDecision(PushVerdict.RETRY, next_attempt_at=due)


CHARGEABLE_TOPICS = frozenset(
    {get_topic(BillingTransaction.Reserved), get_topic(BillingTransaction.Settled)}
)
"""A transaction whose newest event is one of these is in a line and not yet charged."""

REPRICED_TOPIC = get_topic(BillingTransaction.Repriced)
"""A transaction whose newest event is this keeps the state it had (``domain.repricing``):
its state is not known from its newest event, and is read from the transaction."""


def repriced_last(latest: Mapping[UUID, tuple[int, str]]) -> list[UUID]:
    """The transactions whose newest event is a ``Repriced`` (their state is read)."""
    return [txn_id for txn_id, (_, topic) in latest.items() if topic == REPRICED_TOPIC]


def settled_in(changes: Sequence[LineChange]) -> list[UUID]:
    """The transactions these line changes settled and did not remove again, in order."""
    removed = {t for c in changes if isinstance(c, InvoiceLine.Removed) for t in c.transaction_ids}
    return [
        UUID(t)
        for c in changes
        if isinstance(c, InvoiceLine.Settled)
        for t in c.transaction_ids
        if t not in removed
    ]


def charged_events(
    transaction_ids: Iterable[UUID],
    latest: Mapping[UUID, tuple[int, str]],
    *,
    stripe_object_id: str,
    line_id: UUID,
    sequence: int,
    states: Mapping[UUID, TxnState] | None = None,
) -> list[BillingTransaction.Charged]:
    """The ``Charged`` each still chargeable transaction records for the push of its line
    at ``sequence`` (what ``BillingTransaction.record_charged`` records, built without
    loading thousands of aggregates: a chargeable transaction's state is known from
    its newest event; ``states``: the state of each whose newest event is a ``Repriced``,
    read from it). Compensated or already charged ones are left out."""
    event_class = BillingTransaction.Charged
    out: list[BillingTransaction.Charged] = []
    known = states or {}
    for txn_id in transaction_ids:
        version, topic = latest.get(txn_id, (0, ""))
        if topic not in CHARGEABLE_TOPICS and not (
            topic == REPRICED_TOPIC
            and known.get(txn_id) in (TxnState.RESERVED, TxnState.CHARGE_FAILED)
        ):
            continue
        out.append(
            event_class(  # type: ignore[call-arg]
                originator_id=txn_id,
                originator_version=version + 1,
                timestamp=event_class.create_timestamp(),
                stripe_object_id=stripe_object_id,
                line_id=line_id,
                sequence=sequence,
            )
        )
    return out
