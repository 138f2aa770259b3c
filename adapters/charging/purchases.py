"""The purchaser: takes a purchased credit grant's one-off invoice to final in Stripe,
and turns automatic top-ups into purchases.

``step(purchase_id)`` sends the purchase's next step (``domain.purchase``): the Stripe
customer and the draft invoice (key ``invoice:{purchase}``), its one item, the price
(``line-item:{purchase}:0``), then the finalize call (``invoice-finalize:{purchase}``),
recording each answer before sending the next, so a purchaser killed at any point sends
the same requests under the same keys when the reconciler drives it again (after a
failed attempt, it looks the object up first). A retryable failure is recorded with its
due time and retried for ever; one Stripe refuses for good makes the purchase unpaid
(the grant voided, with the reason).

When an operator voided the grant while it awaited payment, the next step is the void
of its invoice (``invoice-void:{purchase}``, ``StripeGateway.void_purchase``: a draft
deleted, an open invoice voided, a paid one read as it is); its failures, even those
Stripe calls final, are retried with backoff (the next attempt reads the invoice again:
an invoice paid meanwhile ends the purchase in ``needs attention``, never silent). The
payment itself arrives by webhook (``adapters.webhooks.handler``), or in the finalize
answer when Stripe collects at once: either way ``BillingLedger.save_purchase`` makes
the grant live in the same save.

``start_top_up`` is the worker's half of an automatic top-up: the ingest save that
crossed the threshold recorded ``TopUpStarted``; this records the purchased grant
awaiting payment and its purchase (``BillingLedger.start_purchase``), once: a second
call, or a racing worker, finds the grant recorded and records nothing.

No locks: two purchasers of one purchase are settled by the event store's version
check, and what Stripe did twice is replayed by its keys.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from uuid import UUID

from eventsourcing.persistence import IntegrityError

from adapters.charging.pusher import utcnow
from adapters.observability.logs import step_fields
from domain.ports import PurchaseGateway, PurchaseInvoice
from domain.purchase import CreditPurchase, PurchaseStep
from domain.saga import ChargeFailure, RetryPolicy, retry_due
from store.ledger import BillingLedger

__all__ = ["PurchaseResult", "Purchaser"]

log = logging.getLogger(__name__)


class PurchaseResult(StrEnum):
    PROGRESSED = "progressed"  # recorded a step (the purchase may have more to do)
    WAITING = "waiting"  # final in Stripe, waiting for the payment; or a retry not due
    FAILED = "failed"  # a Stripe call failed: recorded with its due time
    DONE = "done"  # paid or unpaid (or no such purchase)
    RACED = "raced"


class Purchaser:
    """Drives purchases of credit (see the module docstring)."""

    max_races = 20

    def __init__(
        self,
        ledger: BillingLedger,
        gateway: PurchaseGateway,
        policy: RetryPolicy,
        *,
        clock: Callable[[], datetime] = utcnow,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.ledger = ledger
        self.gateway = gateway
        self.policy = policy
        self.clock = clock
        self.jitter = jitter

    def start_top_up(self, customer_id: str, currency: str, grant_id: str) -> UUID | None:
        """Record the purchased grant a started top-up buys, and its purchase; the
        purchase's id, None when it is recorded already."""
        now = self.clock()
        bought = self.ledger.start_purchase(
            customer_id, currency, lambda account: account.buy_top_up(grant_id, now)
        )
        if bought is not None:
            log.info(
                "top-up purchase started",
                extra=step_fields("top_up", "started", customer_id=customer_id,
                                  grant_id=grant_id, purchase_id=str(bought)),
            )  # fmt: skip
        return bought

    def step(self, purchase_id: UUID) -> PurchaseResult:
        """Send the purchase's next steps while they succeed (see the module docstring)."""
        for _ in range(self.max_races):
            purchase = self.ledger.purchase_by_id(purchase_id)
            if purchase is None or purchase.settled:
                return PurchaseResult.DONE
            if purchase.next_step is PurchaseStep.NONE:
                return PurchaseResult.WAITING
            if not purchase.due(self.clock()):
                return PurchaseResult.WAITING
            try:
                result = self._next(purchase)
            except IntegrityError:
                continue  # another writer recorded first: reload and look again
            if result is not PurchaseResult.PROGRESSED:
                return result
        return PurchaseResult.RACED

    def _next(self, purchase: CreditPurchase) -> PurchaseResult:
        look_first = purchase.attempts > 0
        step = purchase.next_step
        invoice = PurchaseInvoice(
            purchase.id, purchase.customer_id, purchase.stripe_customer_id or "",
            purchase.currency, purchase.grant_id, purchase.amount, purchase.price,
        )  # fmt: skip
        if step is PurchaseStep.DRAFT:
            customer = self.gateway.customer(purchase.customer_id, look_first=look_first)
            if isinstance(customer, ChargeFailure):
                return self._failed(purchase, customer)
            invoice = PurchaseInvoice(
                purchase.id, purchase.customer_id, customer, purchase.currency,
                purchase.grant_id, purchase.amount, purchase.price,
            )  # fmt: skip
            draft = self.gateway.purchase_draft(invoice, look_first=look_first)
            if isinstance(draft, ChargeFailure):
                return self._failed(purchase, draft)
            purchase.record_draft(draft, customer)
        elif step is PurchaseStep.ITEM:
            assert purchase.stripe_invoice_id is not None
            item = self.gateway.purchase_item(
                invoice, purchase.stripe_invoice_id, look_first=look_first
            )
            if isinstance(item, ChargeFailure):
                return self._failed(purchase, item)
            purchase.record_item(item)
        elif step is PurchaseStep.VOID:
            assert purchase.stripe_invoice_id is not None
            view = self.gateway.void_purchase_invoice(purchase.stripe_invoice_id, purchase.id)
            if isinstance(view, ChargeFailure):
                return self._failed(purchase, view, retry=True)
            purchase.observe(view)
        else:
            assert purchase.stripe_invoice_id is not None
            view = self.gateway.finalize_invoice(
                purchase.stripe_invoice_id, purchase.id, look_first=look_first
            )
            if isinstance(view, ChargeFailure):
                return self._failed(purchase, view)
            purchase.observe(view)
        self.ledger.save_purchase(purchase)
        log.info(
            "credit purchase %s", step,
            extra=step_fields("purchase", str(purchase.state), purchase_id=str(purchase.id),
                              customer_id=purchase.customer_id, grant_id=purchase.grant_id),
        )  # fmt: skip
        return PurchaseResult.PROGRESSED

    def _failed(
        self, purchase: CreditPurchase, failure: ChargeFailure, *, retry: bool = False
    ) -> PurchaseResult:
        if not (failure.retryable or retry):
            purchase.refuse(
                f"Stripe refused its {purchase.next_step}: {failure.error_class}:"
                f" {failure.message}",
                "purchaser",
            )
            self.ledger.save_purchase(purchase)
            log.error(
                "credit purchase refused: %s", failure.message,
                extra=step_fields("purchase", "refused", error_code=failure.error_class,
                                  purchase_id=str(purchase.id)),
            )  # fmt: skip
            return PurchaseResult.DONE
        now = self.clock()
        due = retry_due(failure, purchase.attempts + 1, now, self.policy, self.jitter())
        purchase.record_failure(failure.error_class, failure.message, due)
        self.ledger.save_purchase(purchase)
        log.warning(
            "credit purchase step failed: %s", failure.message,
            extra=step_fields("purchase", "retry", error_code=failure.error_class,
                              purchase_id=str(purchase.id), attempt=purchase.attempts),
        )  # fmt: skip
        return PurchaseResult.FAILED
