"""The ``CreditPurchase`` aggregate: the one-off invoice of one purchased credit grant.

A grant bought with ``credits grant --source purchased`` (or by an automatic top-up,
``CustomerAccount.check_top_up``) is recorded on the account *awaiting payment*
(``CreditAwaitingPayment``), in the same save as this aggregate's ``Started``. From
there the purchase is driven like an invoice, one Stripe step at a time, each step
recorded before the next is sent, each request under a key derived from the purchase's
id and the step (never a clock), the same keys the period invoices use:

    Started ──> DraftCreated ──> ItemAdded ──> Finalized ──> Paid
       │  AttemptFailed*  (a due time; retried for ever)     └──> Unpaid (void, uncollectible)
       └──> Unpaid (Stripe refused a step for good)

* ``invoice:{purchase}``: the draft (``auto_advance`` false, only this purchase's item);
* ``line-item:{purchase}:0``: its one item, the price, created once and never updated
  (nothing can drift, so there is nothing to read back before finalizing: the finalize
  answer's total is compared with the price instead);
* ``invoice-finalize:{purchase}``: finalizing it (Stripe then collects it).

``observe`` takes what Stripe says of the invoice (the finalize answer or a webhook), in
any order: ``paid`` records ``Paid``; ``void`` and ``uncollectible`` record ``Unpaid``
with the reason. ``Paid`` makes the grant live and ``Unpaid`` voids what is left of it,
in the same save (``CustomerAccount.settle_purchase``). Once paid or unpaid a purchase
changes no more: a payment after the grant was voided is left to an operator.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.credits import check_price
from domain.ids import purchase_id
from domain.invoice_states import StripeInvoiceView
from domain.money import format_money

__all__ = ["CreditPurchase", "PurchaseState", "PurchaseStep"]


class PurchaseState(StrEnum):
    INVOICING = "invoicing"  # its invoice is being made and finalized in Stripe
    FINALIZED = "finalized"  # final in Stripe: waiting for the payment
    PAID = "paid"  # the grant is live
    UNPAID = "unpaid"  # never paid: the grant was voided (the reason says why)


class PurchaseStep(StrEnum):
    """What the purchaser sends next (``CreditPurchase.next_step``)."""

    DRAFT = "draft"
    ITEM = "item"
    FINALIZE = "finalize"
    NONE = "none"  # nothing: waiting for the payment, or done


S = PurchaseState


class CreditPurchase(Aggregate):
    """The invoice of one purchased grant, from its start to its payment."""

    class Started(Aggregate.Created):
        customer_id: str
        currency: str
        grant_id: str
        amount: int  # the credit bought, minor units
        price: int  # what the invoice asks, minor units
        top_up: bool

    class DraftCreated(Aggregate.Event):
        stripe_invoice_id: str
        stripe_customer_id: str

    class ItemAdded(Aggregate.Event):
        item_id: str

    class AttemptFailed(Aggregate.Event):
        step: str
        attempt: int
        error_class: str
        message: str
        next_attempt_at: datetime

    class Finalized(Aggregate.Event):
        number: str
        total: int
        source: str

    class Paid(Aggregate.Event):
        amount_paid: int
        source: str

    class Unpaid(Aggregate.Event):
        status: str  # void, uncollectible, refused or mismatch
        reason: str
        source: str

    @staticmethod
    def create_id(customer_id: str, currency: str, grant_id: str, **_: Any) -> UUID:
        return purchase_id(customer_id, currency, grant_id)

    @classmethod
    def start(
        cls, customer_id: str, currency: str, grant_id: str, amount: int, price: int, *,
        top_up: bool = False,
    ) -> CreditPurchase:  # fmt: skip
        """The purchase of ``grant_id`` (ValueError for a price out of bounds)."""
        check_price(price)
        if amount < 1:
            raise ValueError("a purchase buys at least one minor unit")
        return cls(
            customer_id=customer_id, currency=currency, grant_id=grant_id, amount=amount,
            price=price, top_up=top_up,
        )  # fmt: skip

    @event(Started)
    def __init__(  # noqa: PLR0917 (the event's fields)
        self, customer_id: str, currency: str, grant_id: str, amount: int, price: int,
        top_up: bool,
    ) -> None:  # fmt: skip
        self.customer_id = customer_id
        self.currency = currency
        self.grant_id = grant_id
        self.amount = amount
        self.price = price
        self.top_up = top_up
        self.state = S.INVOICING
        self.stripe_invoice_id: str | None = None
        self.stripe_customer_id: str | None = None
        self.item_id: str | None = None
        self.finalized = False
        self.attempts = 0
        self.next_attempt_at: datetime | None = None
        self.reason = ""

    @property
    def settled(self) -> bool:
        """Paid or never to be: nothing more happens to it."""
        return self.state in (S.PAID, S.UNPAID)

    @property
    def next_step(self) -> PurchaseStep:
        if self.settled or self.finalized:
            return PurchaseStep.NONE
        if self.stripe_invoice_id is None:
            return PurchaseStep.DRAFT
        if self.item_id is None:
            return PurchaseStep.ITEM
        return PurchaseStep.FINALIZE

    def due(self, now: datetime) -> bool:
        """Whether its next step may be sent at ``now`` (a failed one waits its backoff)."""
        return self.next_step is not PurchaseStep.NONE and (
            self.next_attempt_at is None or self.next_attempt_at <= now
        )

    def record_draft(self, stripe_invoice_id: str, stripe_customer_id: str) -> None:
        if self.stripe_invoice_id is None and not self.settled:
            self._draft_created(stripe_invoice_id, stripe_customer_id)

    @event(DraftCreated)
    def _draft_created(self, stripe_invoice_id: str, stripe_customer_id: str) -> None:
        self.stripe_invoice_id = stripe_invoice_id
        self.stripe_customer_id = stripe_customer_id
        self.next_attempt_at = None

    def record_item(self, item_id: str) -> None:
        if self.item_id is None and not self.settled:
            self._item_added(item_id)

    @event(ItemAdded)
    def _item_added(self, item_id: str) -> None:
        self.item_id = item_id
        self.next_attempt_at = None

    def record_failure(self, error_class: str, message: str, next_attempt_at: datetime) -> None:
        """A step failed in a way worth trying again, from ``next_attempt_at``."""
        self._attempt_failed(
            str(self.next_step), self.attempts + 1, error_class, message[:500], next_attempt_at
        )

    @event(AttemptFailed)
    def _attempt_failed(
        self, step: str, attempt: int, error_class: str, message: str, next_attempt_at: datetime
    ) -> None:
        self.attempts = attempt
        self.next_attempt_at = next_attempt_at
        self.reason = f"{step}: {error_class}: {message}"

    def refuse(self, reason: str, source: str) -> None:
        """Stripe refused a step for good: the grant will never be paid for."""
        if not self.settled:
            self._unpaid("refused", reason, source)

    def observe(self, view: StripeInvoiceView) -> bool:
        """Record what Stripe says of the invoice that this purchase has not recorded;
        whether anything was. A draft, a repeated or a stale view records nothing."""
        if self.settled or view.status == "draft":
            return False
        before = len(self.pending_events)
        if not self.finalized:
            self._finalized(view.number or "", view.total, view.source)
            if view.total != self.price:
                self._unpaid(
                    "mismatch",
                    f"Stripe finalized {self._money(view.total)} where the price is"
                    f" {self._money(self.price)}: settle it by hand",
                    view.source,
                )
                return True
        if view.status == "paid":
            self._paid(view.amount_paid, view.source)
        elif view.status in ("void", "uncollectible"):
            word = "voided" if view.status == "void" else "marked uncollectible"
            self._unpaid(
                view.status, f"its invoice {self.stripe_invoice_id or ''} was {word}".strip(),
                view.source,
            )  # fmt: skip
        return len(self.pending_events) > before

    @event(Finalized)
    def _finalized(self, number: str, total: int, source: str) -> None:
        self.finalized = True
        self.state = S.FINALIZED
        self.next_attempt_at = None

    @event(Paid)
    def _paid(self, amount_paid: int, source: str) -> None:
        self.state = S.PAID
        self.reason = ""

    @event(Unpaid)
    def _unpaid(self, status: str, reason: str, source: str) -> None:
        self.state = S.UNPAID
        self.reason = reason

    def _money(self, amount: int) -> str:
        return format_money(amount, self.currency)
