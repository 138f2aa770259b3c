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
   the effect** (``save(..., webhooks=receipts)``), so a redelivery racing the first
   one rolls back whole (``AlreadyReceived``) and is answered 200 too.
4. **Applied** by the ``Invoice`` aggregate's rules, in whatever order Stripe sends:
   ``invoice.finalized|paid|payment_failed|voided|marked_uncollectible`` through
   ``Invoice.observe`` (a stale or repeated view records nothing: ``stale``);
   ``credit_note.created`` through ``Invoice.record_credit`` (once per credit note);
   ``invoice.deleted`` of the ledger's draft stops its invoice for an operator at once
   (``Invoice.draft_deleted``: bill it on a new draft with ``invoices redraft``).
   An event for an invoice this ledger does not know is recorded ``unknown_invoice``;
   one whose invoice object cannot be read is recorded ``unreadable`` with its reason
   (both answered 200: Stripe's retries could not change them); any other type is
   recorded ``ignored`` (200).
   An invoice event whose metadata names a purchase of credit (``purchase_id``: a
   purchased grant's one-off invoice, ``domain.purchase``) is applied alone
   (``apply_purchase``) by ``CreditPurchase.observe``; paid makes the grant live and
   void or uncollectible voids it, on the account, in the same transaction as the
   receipt (``BillingLedger.save_purchase``). Purchases are rare: they skip the group.
5. **The database unreachable**: 503, so Stripe retries later; 200 is only answered
   after the receipt (and its effect) committed.

Steps 1 and 2 run in the request's own thread; 3 and 4 for every request waiting at
that moment together (``apply_group``, driven by ``adapters.webhooks.group``, at most
``WEBHOOK_GROUP_MAX`` a group): one read of the receipts, one of the invoices, one
transaction for all their effects and receipts. Two deliveries of one event in a group
are one effect (the second answers ``duplicate``); two events of one invoice are
applied in arrival order to the same aggregate. If the group's transaction loses a
race (the closer or another group wrote one of its invoices first, or recorded one of
its event ids), each of its events is applied again alone (``apply_one``), which
reloads and decides again.
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
from adapters.webhooks.group import GroupCommit
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
DELETED = "invoice.deleted"  # a draft deleted in the dashboard: the invoice stops at once
HANDLED_TYPES = INVOICE_TYPES | {"credit_note.created", DELETED}


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


def _purchase_of(event: StripeEvent) -> UUID | None:
    """The purchase of credit an invoice event is of (its metadata's ``purchase_id``)."""
    if event.type not in INVOICE_TYPES:
        return None
    return event.metadata_uuid("purchase_id")


class _Tangled(Exception):
    """An event refused after it had changed its invoice: its group is applied again
    one event at a time, so the refused event's partial effect is never saved."""


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
        max_group: int = 200,
        group_workers: int = 4,
        answer_within_s: float = 20.0,
    ) -> None:
        if not secrets:
            raise ValueError("the webhook handler needs at least one signing secret")
        self.ledger = ledger
        self.store = store
        self._secrets = tuple(secrets)
        self.tolerance_s = tolerance_s
        self.clock = clock
        self.group: GroupCommit[StripeEvent, WebhookAnswer] | None = (
            GroupCommit(
                self.apply_group,
                self.unavailable,
                max_group=max_group,
                workers=group_workers,
                answer_within_s=answer_within_s,
                name="webhook-group",
            )
            if max_group > 1
            else None
        )

    def start(self) -> None:
        """Start applying requests in groups (the listener does, at start)."""
        if self.group is not None:
            self.group.start()

    def stop(self) -> None:
        """Answer the last groups, then close the receipts' pool."""
        if self.group is not None:
            self.group.stop()
        self.store.close()

    def __repr__(self) -> str:  # never the secrets
        return f"WebhookHandler(secrets={len(self._secrets)}, tolerance_s={self.tolerance_s})"

    def handle(self, body: bytes, signature: str | None) -> WebhookAnswer:
        """The answer to one request: verified and read here, then applied with the
        requests waiting beside it (``group``, when the listener runs one), else alone."""
        read = self.read(body, signature)
        if isinstance(read, WebhookAnswer):
            return read
        if self.group is not None and self.group.running:
            return self.group.submit(read)
        return self.apply_group([read])[0]

    def read(self, body: bytes, signature: str | None) -> StripeEvent | WebhookAnswer:
        """The verified event, or the refusal to answer."""
        if not self.verified(body, signature):
            return self.refuse(400, WebhookOutcome.BAD_SIGNATURE)
        try:
            return stripe_event(body)
        except ValueError as exc:
            log.warning("webhook refused: %s", exc)
            return self.refuse(400, WebhookOutcome.MALFORMED)

    def unavailable(self, event: StripeEvent) -> WebhookAnswer:
        """503: Stripe delivers it again later."""
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

    def apply_group(self, events: Sequence[StripeEvent]) -> list[WebhookAnswer]:
        """Each event's answer, the effects of all of them saved in one transaction (see
        the module docstring); on a race, each alone (``apply_one``). A purchase's
        events are applied alone (``apply_purchase``)."""
        if not any(_purchase_of(event) for event in events):
            return self._apply_group(events)
        answers: dict[int, WebhookAnswer] = {}
        rest = [(i, e) for i, e in enumerate(events) if _purchase_of(e) is None]
        for i, event in enumerate(events):
            if _purchase_of(event) is not None:
                answers[i] = self.apply_purchase(event)
        grouped = self._apply_group([e for _, e in rest]) if rest else []
        answers.update((i, answer) for (i, _), answer in zip(rest, grouped, strict=True))
        return [answers[i] for i in range(len(events))]

    def apply_purchase(self, event: StripeEvent) -> WebhookAnswer:
        """One event of a purchase's invoice, in a transaction of its own with the grant's
        settlement, deciding again after a lost race (ingest writes the account too)."""
        purchase_id = _purchase_of(event)

        def attempt() -> WebhookOutcome:
            purchase = self.ledger.purchase_by_id(purchase_id) if purchase_id else None
            outcome = WebhookOutcome.UNKNOWN_INVOICE
            if purchase is not None and purchase.stripe_invoice_id in (None, event.obj.get("id")):
                try:
                    changed = purchase.observe(invoice_view(event.obj, event.id))
                    outcome = WebhookOutcome.APPLIED if changed else WebhookOutcome.STALE
                except ValueError as exc:
                    log.warning("webhook %s (%s) unreadable: %s", event.id, event.type, exc)
                    outcome = WebhookOutcome.UNREADABLE
            receipt = WebhookReceipt(event.id, event.type, purchase_id, outcome, event.created)
            if outcome is WebhookOutcome.APPLIED and purchase is not None:
                self.ledger.save_purchase(purchase, webhooks=[receipt])
            else:
                self.ledger.save(webhooks=[receipt])
            return outcome

        return self._alone(event, attempt)

    def _alone(self, event: StripeEvent, attempt: Callable[[], WebhookOutcome]) -> WebhookAnswer:
        """``attempt`` (load, decide, save with the receipt) until it saves without losing
        a race; the answer: duplicate, its outcome, or unavailable (Stripe retries)."""
        try:
            if self.store.seen_any([event.id]):
                return self._answer(200, WebhookOutcome.DUPLICATE, event)
            for _ in range(self.max_races):
                try:
                    outcome = attempt()
                except IntegrityError:
                    continue  # another writer recorded first: decide again
                return self._answer(200, outcome, event)
        except AlreadyReceived:
            return self._answer(200, WebhookOutcome.DUPLICATE, event)
        except DATABASE_ERRORS as exc:
            log.warning("webhook %s not recorded (database): %s", event.id, type(exc).__name__)
            return self.unavailable(event)
        log.warning("webhook %s kept losing races; Stripe will retry it", event.id)
        return self.unavailable(event)

    def _apply_group(self, events: Sequence[StripeEvent]) -> list[WebhookAnswer]:
        first: dict[str, int] = {}
        for i, event in enumerate(events):
            first.setdefault(event.id, i)
        try:
            seen = self.store.seen_any(list(first))
            todo = [events[i] for i in first.values() if events[i].id not in seen]
            invoices = self._load_invoices(todo)
            outcomes: dict[str, WebhookOutcome] = {}
            receipts = []
            for event in todo:
                invoice_id, _, outcome = self._decide(event, invoices.get)
                outcomes[event.id] = outcome
                receipts.append(
                    WebhookReceipt(event.id, event.type, invoice_id, outcome, event.created)
                )
            # One order for every group's rows: two groups never wait on each other in a cycle.
            changed = sorted(
                (invoice for invoice in invoices.values() if invoice.pending_events),
                key=lambda invoice: invoice.id,
            )
            receipts.sort(key=lambda receipt: receipt.event_id)
            if receipts:
                self.ledger.save(*changed, webhooks=receipts)
        except (IntegrityError, AlreadyReceived, _Tangled):
            return [self.apply_one(event) for event in events]
        except DATABASE_ERRORS as exc:
            log.warning("%d webhooks not recorded (database): %s", len(events), type(exc).__name__)
            return [self.unavailable(event) for event in events]
        return [
            self._answer(200, outcomes[event.id], event)
            if i == first[event.id] and event.id in outcomes
            else self._answer(200, WebhookOutcome.DUPLICATE, event)
            for i, event in enumerate(events)
        ]

    def apply_one(self, event: StripeEvent) -> WebhookAnswer:
        """One event in a transaction of its own, deciding again after a lost race."""
        if _purchase_of(event) is not None:
            return self.apply_purchase(event)

        def attempt() -> WebhookOutcome:
            try:
                invoice_id, invoice, outcome = self._decide(event, self.ledger.invoice_by_id)
            except _Tangled:  # this invoice was loaded for this event alone: drop it
                invoice_id, invoice = event.metadata_uuid("invoice_id"), None
                outcome = WebhookOutcome.UNREADABLE
            receipt = WebhookReceipt(event.id, event.type, invoice_id, outcome, event.created)
            if invoice is not None and invoice.pending_events:
                self.ledger.save(invoice, webhooks=[receipt])
            else:
                self.ledger.save(webhooks=[receipt])
            return outcome

        return self._alone(event, attempt)

    def _load_invoices(self, events: Sequence[StripeEvent]) -> dict[UUID, Invoice]:
        ids = {
            invoice_id
            for event in events
            if event.type in HANDLED_TYPES
            and (invoice_id := event.metadata_uuid("invoice_id")) is not None
        }
        return self.ledger.invoices_by_id(list(ids)) if ids else {}

    def _decide(
        self, event: StripeEvent, load: Callable[[UUID], Invoice | None]
    ) -> tuple[UUID | None, Invoice | None, WebhookOutcome]:
        """(our invoice id, the invoice with the effect pending, the outcome)."""
        if event.type not in HANDLED_TYPES:
            return None, None, WebhookOutcome.IGNORED
        invoice_id = event.metadata_uuid("invoice_id")
        invoice = load(invoice_id) if invoice_id is not None else None
        if invoice is None:
            return invoice_id, None, WebhookOutcome.UNKNOWN_INVOICE
        of_invoice = event.type in INVOICE_TYPES or event.type == DELETED
        stripe_id = event.obj.get("id") if of_invoice else event.obj.get("invoice")
        if invoice.stripe_invoice_id is not None and stripe_id != invoice.stripe_invoice_id:
            return invoice_id, None, WebhookOutcome.UNKNOWN_INVOICE  # not the ledger's draft
        before = len(invoice.pending_events)
        try:
            if event.type == DELETED:
                changed = invoice.draft_deleted(str(stripe_id))
            elif event.type in INVOICE_TYPES:
                changed = self._observe(invoice, event)
            else:
                changed = self._credit(invoice, event)
        except ValueError as exc:
            if len(invoice.pending_events) != before:  # never: reading comes before deciding
                raise _Tangled(event.id) from exc
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
        metrics().webhooks.add(
            1,
            {
                "outcome": outcome.value,
                "type": (
                    event.type if event is not None and event.type in HANDLED_TYPES else "other"
                ),
            },
        )
        return WebhookAnswer(
            status, outcome, event.id if event else None, event.type if event else None
        )
