"""An invoice whose Stripe draft was deleted by hand, billed on a new draft.

Stripe keeps no deleted draft: every read of it answers 404, so the pushers, the
draft checker and the closer stop the invoice for an operator (``AttentionNeeded``;
Stripe's ``invoice.deleted`` webhook stops it at once), and settling alone cannot
help (the ledger would read the same lost id again). ``redraft`` is the operator's way
on (``billing-ledger invoices redraft``):

1. the draft is read from Stripe once more, and only a 404 counts as lost: a draft
   Stripe still holds, or one it could not be asked about now, is never replaced on
   a guess (the answer says what to do instead);
2. the invoice's Stripe customer is read, which proves the 404 came from the account
   and mode the draft was made in (a test key asked about a live draft, or an API base
   that answers 404 to everything, is refused here), and any of the customer's pending
   items that name one of the invoice's lines is deleted: Stripe does not document
   whether a deleted draft's items go with it or back to pending, where another invoice
   of the customer could bill them (key ``line-item-delete:{item}``);
3. ``Invoice.DraftReplaced`` (who, how, and Stripe's answer) and each line's
   ``LinePush.Redrafted`` are recorded in one save, under the event store's version
   check: a push that raced it loses and finds the new draft when it reloads;
4. nothing else is sent to Stripe here: the next push of any of its lines makes the
   new draft and its items (keys of the new draft's own, ``domain.saga.on_draft``), and
   the closer reads it back before finalizing it, as for any invoice. The usage is
   still owed, so nothing is compensated; charges already recorded stay recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID

from domain.ports import PaymentGateway
from domain.saga import ChargeFailure, idempotency_key
from domain.verification import DraftView, draft_lost
from store.ledger import BillingLedger

__all__ = ["RedraftRefused", "Redrafted", "redraft"]


class RedraftRefused(Exception):
    """The draft is not replaced: why, and what to do instead. ``passing``: Stripe could
    not be asked now (running the command again later may succeed)."""

    def __init__(self, message: str, *, passing: bool = False) -> None:
        super().__init__(message)
        self.passing = passing


@dataclass(frozen=True)
class Redrafted:
    """What was recorded: the lost draft, Stripe's answer, the new draft's number, how
    many lines start over on it, and the lost draft's items found pending and deleted."""

    lost: str
    why: str
    draft: int
    lines: int
    pending_deleted: int = 0


def redraft(
    ledger: BillingLedger,
    gateway: PaymentGateway,
    invoice_id: UUID,
    how: str,
    by: str,
    *,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> Redrafted:
    """Replace the invoice's lost draft (raises ``RedraftRefused`` when it is not lost,
    or cannot be replaced; ``IntegrityError`` when another writer recorded first: run
    it again)."""
    if not how.strip() or not by.strip():
        raise RedraftRefused("--how and --by must say what happened and who decided it")
    invoice = ledger.invoice_by_id(invoice_id)
    if invoice is None:
        raise RedraftRefused(f"no invoice {invoice_id} in the ledger")
    kept = invoice.draft_kept()  # final, no draft yet, or never stopped: never asked
    if kept is not None:
        raise RedraftRefused(kept)
    lost, customer = invoice.stripe_invoice_id, invoice.stripe_customer_id
    assert lost is not None and customer is not None
    read = gateway.read_draft(lost)
    why = draft_lost(read)
    if why is None:
        raise RedraftRefused(_kept(lost, read), passing=_passing(read))
    deleted = _delete_pending(gateway, customer, lost, {str(line) for line in invoice.lines})
    draft = invoice.replace_draft(why, how, by)
    pushes = [p for p in (ledger.line_push(line) for line in invoice.lines) if p is not None]
    at = clock()
    for push in pushes:
        push.redraft(draft, at)
    ledger.save(invoice, *pushes)
    return Redrafted(lost, why, draft, len(invoice.lines), deleted)


def _delete_pending(gateway: PaymentGateway, customer: str, lost: str, lines: set[str]) -> int:
    """Delete the customer's pending items of these lines (left by the lost draft, if
    Stripe kept them); how many. Refused when the customer cannot be read."""
    pending = gateway.pending_items(customer)
    if isinstance(pending, ChargeFailure):
        if pending.retryable:
            raise RedraftRefused(
                f"Stripe could not be asked about customer {customer} now ({pending.message}):"
                " try again",
                passing=True,
            )
        raise RedraftRefused(
            f"Stripe answered 404 for draft {lost} but cannot read its customer {customer}"
            f" either ({pending.error_class}: {pending.message}): is this the Stripe account"
            " and mode the workers bill with (BILLING_LEDGER_STRIPE_API_KEY, _API_BASE)?"
        )
    ours = sorted(item for item, line in pending.items() if line in lines)
    for item in ours:
        failed = gateway.delete_item(item, idempotency_key("line-item-delete", item))
        if failed is not None:
            raise RedraftRefused(
                f"Stripe did not delete item {item} the lost draft {lost} left pending"
                f" ({failed.error_class}: {failed.message}): try again",
                passing=failed.retryable,
            )
    return len(ours)


def _passing(read: DraftView | ChargeFailure) -> bool:
    return isinstance(read, ChargeFailure) and read.retryable


def _kept(lost: str, read: DraftView | ChargeFailure) -> str:
    """Why a draft Stripe did not say is gone is not replaced."""
    if isinstance(read, ChargeFailure):
        if read.retryable:
            return f"Stripe could not be asked about draft {lost} now ({read.message}): try again"
        return (
            f"Stripe refused to read draft {lost} ({read.error_class}: {read.message}) but did"
            " not say it is gone: put right what it refused, then settle the invoice"
        )
    if read.status == "draft":
        return (
            f"Stripe still holds draft {lost}: nothing to replace; make it right in Stripe"
            " and settle the invoice (billing-ledger invoices settle)"
        )
    return (
        f"Stripe's invoice {lost} is {read.status}, not deleted: it is final there, so settle"
        " the invoice with what was billed (billing-ledger invoices settle)"
    )
