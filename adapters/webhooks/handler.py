"""What the ledger does with one Stripe webhook request, whatever the HTTP server.

1. **Verified**: the raw body against ``Stripe-Signature`` with the SDK's check
   (``stripe.WebhookSignature.verify_header``), against each configured secret in turn
   (during a rotation Stripe signs with both: several ``v1`` entries), tolerance
   ``WEBHOOK_TOLERANCE_S``. Forged, unsigned, expired: 400, counted
   (``billing.webhook_counts``: ``bad_signature``), nothing recorded. A secret is
   never logged.
2. **Read**: the envelope (``adapters.stripe.views.stripe_event``); unreadable: 400
   ``malformed``, counted.
3. **Deduplicated** by Stripe's event id: a receipt already recorded answers 200 at
   once; otherwise the receipt row is written **in the same database transaction as
   the effect** (``save(..., webhook=receipt)``), so a redelivery racing the first one
   rolls back whole (``AlreadyReceived``) and is answered 200 too.
4. **Applied** by the ``Invoice`` aggregate's rules, in whatever order Stripe sends:
   ``invoice.finalized|paid|payment_failed|voided|marked_uncollectible`` through
   ``Invoice.observe`` (a stale or repeated view records nothing: ``stale``);
   ``credit_note.created`` through ``Invoice.record_credit`` (once per credit note).
   An event for an invoice this ledger does not know is recorded ``unknown_invoice``;
   one whose invoice object cannot be read is recorded ``unreadable`` with its reason
   (both answered 200: Stripe's retries could not change them); any other type is
   recorded ``ignored`` (200).
5. **The database unreachable**: 503, so Stripe retries later; 200 is only answered
   after the receipt (and its effect) committed.

A lost version race with the closer or another delivery reloads and decides again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from uuid import UUID

import stripe
from eventsourcing.persistence import IntegrityError

from adapters.observability.metrics import metrics
from adapters.stripe.views import StripeEvent, invoice_view, stripe_event
from domain.errors import IllegalTransition
from domain.invoice import Invoice
from store.errors import DATABASE_ERRORS
from store.ledger import BillingLedger
from store.webhooks import AlreadyReceived, WebhookReceipt, WebhookStore

__all__ = ["HANDLED_TYPES", "WebhookAnswer", "WebhookHandler", "WebhookOutcome"]

log = logging.getLogger(__name__)

INVOICE_TYPES = frozenset(
    {
        "invoice.finalized",
        "invoice.paid",
        "invoice.payment_failed",
        "invoice.voided",
        "invoice.marked_uncollectible",
    }
)
HANDLED_TYPES = INVOICE_TYPES | {"credit_note.created"}


class WebhookOutcome(StrEnum):
    APPLIED = "applied"  # recorded with its effect on the invoice
    STALE = "stale"  # recorded; the invoice had moved past it (or it repeats what is known)
    UNKNOWN_INVOICE = "unknown_invoice"  # recorded; not an invoice of this ledger
    UNREADABLE = "unreadable"  # recorded; its object could not be read (reason logged)
    IGNORED = "ignored"  # recorded; a type this ledger does not act on
    DUPLICATE = "duplicate"  # its event id was recorded before: nothing done
    BAD_SIGNATURE = "bad_signature"  # 400, counted
    MALFORMED = "malformed"  # 400, counted
    TOO_LARGE = "too_large"  # 413, counted
    SLOW_BODY = "slow_body"  # 408, counted
    UNAVAILABLE = "unavailable"  # 503: the database could not be reached


COUNTED = frozenset(
    {
        WebhookOutcome.BAD_SIGNATURE,
        WebhookOutcome.MALFORMED,
        WebhookOutcome.TOO_LARGE,
        WebhookOutcome.SLOW_BODY,
    }
)


@dataclass(frozen=True)
class WebhookAnswer:
    status: int
    outcome: WebhookOutcome
    event_id: str | None = None
    type: str | None = None

    @property
    def body(self) -> dict[str, str | None]:
        return {"outcome": self.outcome.value, "event": self.event_id}


class WebhookHandler:
    """Verifies, deduplicates and applies webhook requests (see the module docstring)."""

    max_races = 20

    def __init__(
        self,
        ledger: BillingLedger,
        store: WebhookStore,
        secrets: Sequence[str],
        *,
        tolerance_s: int = 300,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not secrets:
            raise ValueError("the webhook handler needs at least one signing secret")
        self.ledger = ledger
        self.store = store
        self._secrets = tuple(secrets)
        self.tolerance_s = tolerance_s
        self.clock = clock

    def __repr__(self) -> str:  # never the secrets
        return f"WebhookHandler(secrets={len(self._secrets)}, tolerance_s={self.tolerance_s})"

    def handle(self, body: bytes, signature: str | None) -> WebhookAnswer:
        if not self.verified(body, signature):
            return self.refuse(400, WebhookOutcome.BAD_SIGNATURE)
        try:
            event = stripe_event(body)
        except ValueError as exc:
            log.warning("webhook refused: %s", exc)
            return self.refuse(400, WebhookOutcome.MALFORMED)
        try:
            if self.store.seen(event.id):
                return self._answer(200, WebhookOutcome.DUPLICATE, event)
            return self._apply(event)
        except AlreadyReceived:
            return self._answer(200, WebhookOutcome.DUPLICATE, event)
        except DATABASE_ERRORS as exc:
            log.warning("webhook %s not recorded (database): %s", event.id, type(exc).__name__)
            return self._answer(503, WebhookOutcome.UNAVAILABLE, event)

    def verified(self, body: bytes, signature: str | None) -> bool:
        """Whether ``signature`` signs ``body`` with one of the secrets, recently enough."""
        if not signature or len(signature) > 4096:
            return False
        try:
            payload = body.decode("utf-8")
        except UnicodeDecodeError:
            return False
        for secret in self._secrets:
            try:
                stripe.WebhookSignature.verify_header(
                    payload, signature, secret, tolerance=self.tolerance_s
                )
            except stripe.SignatureVerificationError:
                continue
            return True
        return False

    def refuse(self, status: int, outcome: WebhookOutcome) -> WebhookAnswer:
        """Answer ``status`` and count the request (a count that cannot be written is
        logged: refusing does not depend on the database)."""
        try:
            self.store.count(outcome.value)
        except DATABASE_ERRORS as exc:
            log.warning("webhook count of %s not written: %s", outcome, type(exc).__name__)
        return self._answer(status, outcome, None)

    # -- effects ------------------------------------------------------------------------

    def _apply(self, event: StripeEvent) -> WebhookAnswer:
        for _ in range(self.max_races):
            invoice_id, invoice, outcome = self._decide(event)
            receipt = WebhookReceipt(event.id, event.type, invoice_id, outcome, event.created)
            try:
                if invoice is not None and invoice.pending_events:
                    self.ledger.save(invoice, webhook=receipt)
                else:
                    self.ledger.save(webhook=receipt)
            except IntegrityError:
                continue  # the closer or another delivery recorded first: decide again
            return self._answer(200, WebhookOutcome(outcome), event)
        log.warning("webhook %s kept losing races; Stripe will retry it", event.id)
        return self._answer(503, WebhookOutcome.UNAVAILABLE, event)

    def _decide(self, event: StripeEvent) -> tuple[UUID | None, Invoice | None, str]:
        """(our invoice id, the invoice with the effect pending, the outcome)."""
        if event.type not in HANDLED_TYPES:
            return None, None, WebhookOutcome.IGNORED
        invoice_id = event.metadata_uuid("invoice_id")
        invoice = self.ledger.invoice_by_id(invoice_id) if invoice_id is not None else None
        if invoice is None:
            return invoice_id, None, WebhookOutcome.UNKNOWN_INVOICE
        stripe_id = event.obj.get("id") if event.type in INVOICE_TYPES else event.obj.get("invoice")
        if invoice.stripe_invoice_id is not None and stripe_id != invoice.stripe_invoice_id:
            return invoice_id, None, WebhookOutcome.UNKNOWN_INVOICE  # not the ledger's draft
        try:
            changed = (
                self._observe(invoice, event)
                if event.type in INVOICE_TYPES
                else self._credit(invoice, event)
            )
        except ValueError as exc:
            log.warning("webhook %s (%s) unreadable: %s", event.id, event.type, exc)
            return invoice_id, None, WebhookOutcome.UNREADABLE
        return invoice_id, invoice, WebhookOutcome.APPLIED if changed else WebhookOutcome.STALE

    @staticmethod
    def _observe(invoice: Invoice, event: StripeEvent) -> bool:
        return invoice.observe(invoice_view(event.obj, event.id))

    @staticmethod
    def _credit(invoice: Invoice, event: StripeEvent) -> bool:
        note_id, amount = event.obj.get("id"), event.obj.get("amount")
        if not isinstance(note_id, str) or not note_id or len(note_id) > 255:
            raise ValueError(f"credit note id {str(note_id)[:80]!r} is not a string")
        if type(amount) is not int or amount < 0:
            raise ValueError(f"credit note amount {amount!r} is not a whole amount")
        try:
            return invoice.record_credit(
                event.metadata_uuid("transaction_id"), note_id, amount, event.id
            )
        except IllegalTransition:
            return False  # a credit note on an invoice the ledger has not finalized

    @staticmethod
    def _answer(status: int, outcome: WebhookOutcome, event: StripeEvent | None) -> WebhookAnswer:
        kind = event.type if event is not None and event.type in HANDLED_TYPES else "other"
        metrics().webhooks.add(1, {"outcome": outcome.value, "type": kind})
        return WebhookAnswer(
            status, outcome, event.id if event else None, event.type if event else None
        )
