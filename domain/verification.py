"""Reading Stripe back before money is committed (pure): what the draft must hold, how
it differs, and the keys of the repairs.

Stripe has no conditional update. A request that set a line's item to its total at
sequence N can land after the request that set it to N+1 (a slow request, a client
that gave up while Stripe went on, two pushers of one line): each has its own key,
so Stripe applies both, in the order they arrive. Recording pushes in order cannot
prevent that; reading back can. So an invoice is finalized only after

1. every line's push is sealed (no request starts any more) and no request that was
   sent can still land (``LinePush.in_doubt_until``), and
2. one read of the draft shows every item at exactly the ledger's amount, no item
   the ledger does not know, and Stripe's total equal to the sum of the lines.

A difference is recorded with both amounts (``Invoice.DriftFound``), repaired by
setting each item again under a key of its own (``repair_key``: line, chunk,
sequence and repair number, so a repair is never replayed as an earlier request's
answer), and read again. What cannot be repaired by setting an amount (an item the
ledger does not know, an item deleted in the dashboard, a total that differs though
every item matches) stops the invoice with a reason for an operator
(``Invoice.AttentionNeeded``): the ledger never finalizes an amount it did not decide.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from domain.invoice_line import LinePush
from domain.money import format_money
from domain.saga import ChargeFailure

__all__ = [
    "DEFAULT_LANDING",
    "DraftItem",
    "DraftView",
    "Drift",
    "ExpectedItem",
    "LandingWindow",
    "Verdict",
    "draft_lost",
    "expected_items",
    "repair_key",
    "verify_draft",
]


@dataclass(frozen=True)
class LandingWindow:
    """How long after it was recorded a request may still take effect in Stripe.

    ``per_call``: the longest one call can take in this process (waiting for the
    in-flight limit, the rate limit, then the client timeout on the wire: three times
    ``STRIPE_TIMEOUT_S``); ``margin``: how long after its client gave up Stripe may
    still execute a request it received (``STRIPE_LANDING_MARGIN_S``). Stripe states
    no bound for that; a request later still is caught by the comparison after
    finalizing, as an alert.
    """

    per_call: timedelta = timedelta(seconds=30)
    margin: timedelta = timedelta(seconds=30)

    def deadline(self, sent_at: datetime, calls: int) -> datetime:
        """The moment after which ``calls`` requests sent one after another from
        ``sent_at`` can no longer take effect."""
        return sent_at + self.per_call * max(calls, 1) + self.margin


DEFAULT_LANDING = LandingWindow()
"""A 10 s client timeout's window (STRIPE_TIMEOUT_S 10, STRIPE_LANDING_MARGIN_S 30)."""


def repair_key(line_id: object, chunk: int, sequence: int, repair: int) -> str:
    """Idempotency key of repairing item ``chunk`` of a line to its total at
    ``sequence``, the ``repair``-th repair of its invoice."""
    return f"line-repair:{line_id}:{chunk}:{sequence}:{repair}"


@dataclass(frozen=True)
class DraftItem:
    """One invoice item as Stripe holds it."""

    item_id: str
    amount: int


@dataclass(frozen=True)
class DraftView:
    """An invoice as Stripe holds it, read back: its status, total and every item."""

    status: str
    total: int
    items: tuple[DraftItem, ...]


def draft_lost(read: DraftView | ChargeFailure) -> str | None:
    """What Stripe said when the draft read back is gone for good (deleted in the
    dashboard: a 404), or None when it still holds it or could not be asked (a failure
    that may pass: never taken as lost on a guess)."""
    if isinstance(read, ChargeFailure) and read.missing and not read.retryable:
        return f"{read.error_class}: {read.message}"
    return None


@dataclass(frozen=True)
class ExpectedItem:
    """An item the ledger decided: line, chunk, the sequence it was set at, the amount."""

    line_id: UUID
    chunk: int
    sequence: int
    item_id: str
    amount: int


@dataclass(frozen=True)
class Drift:
    """An item Stripe holds at another amount than the ledger decided."""

    line_id: UUID
    chunk: int
    sequence: int
    item_id: str
    expected: int
    found: int

    def as_row(self) -> list[str]:
        return [
            str(self.line_id),
            str(self.chunk),
            str(self.sequence),
            self.item_id,
            str(self.expected),
            str(self.found),
        ]


@dataclass(frozen=True)
class Verdict:
    """How the draft compares with the ledger."""

    drifts: tuple[Drift, ...]
    unknown: tuple[DraftItem, ...]  # on the draft, not any line's
    missing: tuple[ExpectedItem, ...]  # a line's item that is not on the draft
    expected_total: int
    stripe_total: int
    currency: str

    @property
    def equal(self) -> bool:
        return not (self.drifts or self.unknown or self.missing) and (
            self.stripe_total == self.expected_total
        )

    @property
    def attention(self) -> str | None:
        """Why setting amounts cannot repair the draft (None: it can, or need not)."""
        if self.unknown:
            listed = ", ".join(
                f"{i.item_id} ({format_money(i.amount, self.currency)})" for i in self.unknown[:5]
            )
            return f"the draft holds {len(self.unknown)} item(s) the ledger did not make: {listed}"
        if self.missing:
            listed = ", ".join(i.item_id for i in self.missing[:5])
            return f"{len(self.missing)} item(s) of the ledger are not on the draft: {listed}"
        if not self.drifts and self.stripe_total != self.expected_total:
            return (
                f"Stripe's draft total is {format_money(self.stripe_total, self.currency)} where"
                f" its items and the ledger say {format_money(self.expected_total, self.currency)}"
            )
        return None


def expected_items(pushes: Iterable[tuple[UUID, LinePush | None]]) -> list[ExpectedItem]:
    """The items the ledger decided for each line (its newest acknowledged push)."""
    out: list[ExpectedItem] = []
    for line_id, push in pushes:
        if push is None:
            continue
        for chunk, (item_id, amount) in enumerate(zip(push.item_ids, push.amounts, strict=True)):
            out.append(ExpectedItem(line_id, chunk, push.pushed_sequence, item_id, amount))
    return out


def verify_draft(
    expected: Sequence[ExpectedItem], expected_total: int, view: DraftView, currency: str
) -> Verdict:
    """Compare the draft Stripe holds with the items and total the ledger decided (of
    the invoice's ``currency``)."""
    held = {i.item_id: i for i in view.items}
    known = {e.item_id for e in expected}
    drifts = tuple(
        Drift(e.line_id, e.chunk, e.sequence, e.item_id, e.amount, held[e.item_id].amount)
        for e in expected
        if e.item_id in held and held[e.item_id].amount != e.amount
    )
    # A line's item of 0 that is gone holds what the ledger decided: nothing.
    missing = tuple(e for e in expected if e.item_id not in held and e.amount != 0)
    unknown = tuple(i for i in view.items if i.item_id not in known)
    return Verdict(drifts, unknown, missing, expected_total, view.total, currency)
