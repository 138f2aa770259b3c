"""An invoice whose Stripe draft was deleted by hand, billed on a new draft.

Stripe keeps no deleted draft: every read of it answers 404, so the pushers, the
draft checker and the closer stop the invoice for an operator (``AttentionNeeded``)
and settling alone cannot help (the ledger would read the same lost id again).
``redraft`` is the operator's way on (``billing-ledger invoices redraft``):

1. the draft is read from Stripe once more, and only a 404 counts as lost: a draft
   Stripe still holds, or one it could not be asked about now, is never replaced on
   a guess (the answer says what to do instead);
2. ``Invoice.DraftReplaced`` (who, how, and Stripe's answer) and each line's
   ``LinePush.Redrafted`` are recorded in one save, under the event store's version
   check: a push that raced it loses and finds the new draft when it reloads;
3. nothing is sent to Stripe here: the next push of any of its lines makes the new
   draft and its items (keys of the new draft's own, ``domain.saga.on_draft``), and the
   closer reads it back before finalizing it, as for any invoice. The usage is still
   owed, so nothing is compensated; charges already recorded stay recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from domain.ports import PaymentGateway
from domain.saga import ChargeFailure
from domain.verification import draft_lost
from store.ledger import BillingLedger

__all__ = ["RedraftRefused", "Redrafted", "redraft"]


class RedraftRefused(Exception):
    """The draft is not replaced: why, and what to do instead."""


@dataclass(frozen=True)
class Redrafted:
    """What was recorded: the lost draft, Stripe's answer, the new draft's number and
    how many lines start over on it."""

    lost: str
    why: str
    draft: int
    lines: int


def redraft(
    ledger: BillingLedger, gateway: PaymentGateway, invoice_id: UUID, how: str, by: str
) -> Redrafted:
    """Replace the invoice's lost draft (raises ``RedraftRefused`` when it is not lost,
    or cannot be replaced; ``IntegrityError`` when a push recorded first: run it again)."""
    invoice = ledger.invoice_by_id(invoice_id)
    if invoice is None:
        raise RedraftRefused(f"no invoice {invoice_id} in the ledger")
    kept = invoice.draft_kept()  # final, no draft yet, or never stopped: never asked
    if kept is not None:
        raise RedraftRefused(kept)
    lost = invoice.stripe_invoice_id
    assert lost is not None
    read = gateway.read_draft(lost)
    why = draft_lost(read)
    if why is None:
        raise RedraftRefused(_kept(lost, read))
    draft = invoice.replace_draft(why, how, by)
    pushes = [p for p in (ledger.line_push(line) for line in invoice.lines) if p is not None]
    for push in pushes:
        push.redraft(draft)
    ledger.save(invoice, *pushes)
    return Redrafted(lost, why, draft, len(invoice.lines))


def _kept(lost: str, read: object) -> str:
    """Why a draft Stripe did not say is gone is not replaced."""
    if isinstance(read, ChargeFailure):
        if read.retryable:
            return f"Stripe could not be asked about draft {lost} now ({read.message}): try again"
        return (
            f"Stripe refused to read draft {lost} ({read.error_class}: {read.message}) but did"
            " not say it is gone: put right what it refused, then settle the invoice"
        )
    status = getattr(read, "status", "draft")
    if status == "draft":
        return (
            f"Stripe still holds draft {lost}: nothing to replace; make it right in Stripe"
            " and settle the invoice (billing-ledger invoices settle)"
        )
    return (
        f"Stripe's invoice {lost} is {status}, not deleted: it is final there, so settle the"
        " invoice with what was billed (billing-ledger invoices settle)"
    )
