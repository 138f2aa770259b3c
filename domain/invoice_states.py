"""The ``Invoice``'s states as data: ``InvoiceState``, the transition table
``ALLOWED_FROM`` that the aggregate's commands (``domain.invoice``) and the audit's fold
(``domain.audit_invoices``) both check against, and ``StripeInvoiceView``, what Stripe
says of an invoice's state (a finalize answer or a webhook's object), which
``Invoice.observe`` compares with the state it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

__all__ = ["ALLOWED_FROM", "FINAL_STATES", "InvoiceState", "StripeInvoiceView"]


class InvoiceState(StrEnum):
    OPEN = "open"  # its lines take usage
    CLOSED = "closed"  # lines frozen; their final totals are being pushed
    FINALIZING = "finalizing"  # every final total is in Stripe; finalize it there
    FINALIZED = "finalized"  # final in Stripe (number, total): payment due
    PAYMENT_FAILED = "payment_failed"
    PAID = "paid"
    UNCOLLECTIBLE = "uncollectible"
    VOID = "void"
    NOTHING_DUE = "nothing_due"  # closed with nothing billed and no draft in Stripe


S = InvoiceState
FINAL_STATES = (S.FINALIZED, S.PAYMENT_FAILED, S.PAID, S.UNCOLLECTIBLE)
"""Final in Stripe and not void: a credit note is what changes them."""

ALLOWED_FROM: dict[str, tuple[InvoiceState, ...]] = {
    "LineAdded": (S.OPEN,),
    "DraftCreated": (S.OPEN, S.CLOSED),
    "Closed": (S.OPEN,),
    "Adjusted": (S.CLOSED,),
    "NothingDue": (S.CLOSED,),
    "FinalizeStarted": (S.CLOSED,),
    "FinalizeFailed": (S.FINALIZING,),
    "Finalized": (S.FINALIZING,),
    "PaymentFailed": (S.FINALIZED, S.PAYMENT_FAILED),
    "Paid": (S.FINALIZED, S.PAYMENT_FAILED, S.UNCOLLECTIBLE),
    "MarkedUncollectible": (S.FINALIZED, S.PAYMENT_FAILED),
    "Voided": (S.FINALIZED, S.PAYMENT_FAILED, S.UNCOLLECTIBLE),
    "CreditRequested": (S.FINALIZING, *FINAL_STATES),
    "Credited": FINAL_STATES,
    "CreditFailed": FINAL_STATES,
    "Verified": (S.FINALIZING,),
    "DriftFound": (S.FINALIZING,),
    "Repaired": (S.FINALIZING,),
    "RepairNotSent": (S.FINALIZING,),
    "DraftChecked": (S.OPEN, S.CLOSED),
    "MismatchFound": (*FINAL_STATES, S.VOID),
    "DraftReplaced": (S.OPEN, S.CLOSED, S.FINALIZING),
}
"""Which states each event may be recorded in (its method raises IllegalTransition
otherwise)."""


@dataclass(frozen=True)
class StripeInvoiceView:
    """What Stripe says about the invoice (a finalize answer or a webhook's object)."""

    status: str  # draft, open, paid, void, uncollectible
    number: str | None
    total: int
    amount_paid: int
    attempt_count: int
    next_payment_attempt: datetime | None
    at: datetime  # when Stripe says it happened
    source: str  # "finalize" or the webhook's event id
