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
changes no more.

**A grant voided while its purchase awaits payment** (``credits void``): the same save
records ``VoidRequested`` here (``request_void``), and the purchase's next step is its
invoice's void (``invoice-void:{purchase}``): the purchaser looks the invoice up and
voids it when it is open or uncollectible, deletes it when it is still a draft, and
records Stripe's answer (``observe``: ``Unpaid`` void, or deleted). A purchase with no
invoice yet is ``Unpaid`` at once (a draft whose answer was lost stays a draft: only
the ledger finalizes). A payment that lands anyway (it raced the void, or the invoice
was paid already) is never silent: ``PaidAfterVoid`` records what was paid and the
invoice, and the purchase **needs attention** until an operator settles it with
``reinstate`` (``Reinstated``: the credit bought, granted again as a new live grant
linked to this purchase, ``CustomerAccount.reinstate_credit``). Reinstating rather than
refunding: the customer paid for credit, the ledger can give exactly that in one audited
save, and a refund (money out of Stripe, by hand) would leave the ledger with no
record of it; an operator who wants the money back refunds in Stripe and voids the
reinstated grant, both recorded.

    VoidRequested ──> Unpaid (void, deleted)
          └─────────> PaidAfterVoid (needs attention) ──> Reinstated
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import TYPE_CHECKING, Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.credits import check_price
from domain.ids import purchase_id
from domain.invoice_states import StripeInvoiceView
from domain.money import format_money

if TYPE_CHECKING:
    from domain.account import CustomerAccount

__all__ = ["CreditPurchase", "PurchaseState", "PurchaseStep", "void_purchased_grant"]


class PurchaseState(StrEnum):
    INVOICING = "invoicing"  # its invoice is being made and finalized in Stripe
    FINALIZED = "finalized"  # final in Stripe: waiting for the payment
    PAID = "paid"  # the grant is live
    UNPAID = "unpaid"  # never paid: the grant was voided (the reason says why)
    VOIDING = "voiding"  # its grant was voided: its invoice is being voided in Stripe
    NEEDS_ATTENTION = "needs_attention"  # paid after its grant was voided: an operator's
    REINSTATED = "reinstated"  # paid after the void; the credit bought granted again


class PurchaseStep(StrEnum):
    """What the purchaser sends next (``CreditPurchase.next_step``)."""

    DRAFT = "draft"
    ITEM = "item"
    FINALIZE = "finalize"
    VOID = "void"  # its grant was voided: void (or delete) its invoice
    NONE = "none"  # nothing: waiting for the payment, or done


S = PurchaseState


class CreditPurchase(Aggregate):
    """The invoice of one purchased grant, from its start to its payment."""

    # Added after the first purchases: class defaults, so older snapshots load.
    void_reason = ""
    amount_paid = 0  # what Stripe says was paid after the void
    reinstated_grant_id: str | None = None

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
        status: str  # void, uncollectible, refused, mismatch or deleted
        reason: str
        source: str

    class VoidRequested(Aggregate.Event):
        """Its grant was voided by an operator while awaiting payment (same save)."""

        reason: str

    class PaidAfterVoid(Aggregate.Event):
        """Stripe says the invoice was paid after its grant was voided."""

        amount_paid: int
        stripe_invoice_id: str
        reason: str  # what happened, and the command that settles it
        source: str

    class Reinstated(Aggregate.Event):
        """An operator granted the credit bought again (``grant_id``, a new live grant)."""

        grant_id: str
        amount: int
        reason: str

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
        """Paid or never to be (or paid after its void): Stripe changes it no more."""
        return self.state in (S.PAID, S.UNPAID, S.NEEDS_ATTENTION, S.REINSTATED)

    @property
    def next_step(self) -> PurchaseStep:
        if self.state is S.VOIDING:
            return PurchaseStep.VOID
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

    def request_void(self, reason: str) -> bool:
        """Its grant was voided while awaiting payment: void its invoice next (none made
        yet: unpaid at once); whether anything was recorded (a purchase already settled
        or voiding records nothing)."""
        if self.settled or self.state is S.VOIDING:
            return False
        self._void_requested(reason)
        if self.stripe_invoice_id is None:
            self._unpaid("void", f"its grant was voided before its invoice was made: {reason}",
                         "operator")  # fmt: skip
        return True

    @event(VoidRequested)
    def _void_requested(self, reason: str) -> None:
        self.state = S.VOIDING
        self.void_reason = reason
        self.next_attempt_at = None

    def observe(self, view: StripeInvoiceView) -> bool:
        """Record what Stripe says of the invoice that this purchase has not recorded;
        whether anything was. A draft, a repeated or a stale view records nothing."""
        if self.settled or view.status == "draft":
            return False
        before = len(self.pending_events)
        if view.status == "deleted":  # only a voiding purchase's draft is deleted
            self._unpaid("deleted", f"its draft {self.stripe_invoice_id} was deleted",
                         view.source)  # fmt: skip
            return True
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
        if view.status == "paid" and self.state is S.VOIDING:
            invoice = str(self.stripe_invoice_id)  # voiding: it has one
            self._paid_after_void(
                view.amount_paid, invoice,
                f"its invoice {invoice} was paid ({self._money(view.amount_paid)}) after"
                f" grant {self.grant_id} was voided: `billing-ledger credits reinstate"
                f" {self.customer_id} {self.currency} {self.grant_id} --reason ...`",
                view.source,
            )  # fmt: skip
        elif view.status == "paid":
            self._paid(view.amount_paid, view.source)
        elif view.status in ("void", "uncollectible"):
            word = "voided" if view.status == "void" else "marked uncollectible"
            named = f" {self.stripe_invoice_id}" if self.stripe_invoice_id else ""
            self._unpaid(view.status, f"its invoice{named} was {word}", view.source)
        return len(self.pending_events) > before

    @event(Finalized)
    def _finalized(self, number: str, total: int, source: str) -> None:
        self.finalized = True
        if self.state is not S.VOIDING:
            self.state = S.FINALIZED
        self.next_attempt_at = None

    @event(PaidAfterVoid)
    def _paid_after_void(
        self, amount_paid: int, stripe_invoice_id: str, reason: str, source: str
    ) -> None:
        self.state = S.NEEDS_ATTENTION
        self.amount_paid = amount_paid
        self.reason = reason

    def reinstate(self, reason: str) -> str:
        """Settle a payment after the void: the id of the new grant that gives the
        customer the credit bought (the account's ``reinstate_credit`` records it, in
        the same save). ValueError unless it needs attention, or without a reason."""
        if self.state is not S.NEEDS_ATTENTION:
            raise ValueError(
                f"purchase {self.id} is {self.state}: only a purchase paid after its grant"
                " was voided is reinstated"
            )
        if not reason.strip():
            raise ValueError("reinstating a purchase needs a reason")
        grant_id = f"{self.grant_id}-reinstated"
        self._reinstated(grant_id, self.amount, reason)
        return grant_id

    @event(Reinstated)
    def _reinstated(self, grant_id: str, amount: int, reason: str) -> None:
        self.state = S.REINSTATED
        self.reinstated_grant_id = grant_id
        self.reason = ""

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


def void_purchased_grant(
    account: CustomerAccount, purchase: CreditPurchase | None, grant_id: str, reason: str
) -> Decimal:
    """Void what is left of a grant (``CustomerAccount.void_credit``) and, when it is a
    purchased grant awaiting payment, its purchase's invoice too (``request_void``), for
    one save of both; the amount voided. ``purchase``: the grant's purchase
    (``CustomerAccount.pending_purchase`` names it), None when it has none."""
    pending = account.pending_purchase(grant_id)
    voided = account.void_credit(grant_id, reason)
    if pending is not None and purchase is not None and str(purchase.id) == pending:
        purchase.request_void(reason)
    return voided
