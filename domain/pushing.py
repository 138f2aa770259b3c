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
"""

from __future__ import annotations

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
    "REPRICED_TOPIC",
    "ItemStep",
    "PushPlan",
    "PushVerdict",
    "after_failure",
    "charged_events",
    "item_key",
    "plan_push",
    "push_key",
    "repriced_last",
    "settled_in",
]


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
