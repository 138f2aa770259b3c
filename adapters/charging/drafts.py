"""Open drafts read back before their close, on a share of the Stripe budget.

A stale request can land on a line's item while its invoice is still open (a slow
request, a client that gave up): Stripe then shows an older amount than the ledger
until the line changes again or the invoice closes, where the closer reads every
draft back anyway. The checker finds the drift earlier, for drafts a person may be
looking at in Stripe: each pass it reads back the open drafts whose lines were pushed
since their last check (``projections.invoices.drafts_to_check``, the longest
unchecked first), at most ``budget`` of them, and

* records ``DraftChecked`` when the draft equals what the ledger last pushed;
* records ``LinePush.DriftFound`` on each line whose items differ and hands the line
  to its pusher (the scheduler): the repair is a push, under keys of its own, so it
  never races the line's own pushes; the save that records the drift is version
  checked against them (a push started meanwhile wins and the check is skipped);
* stops the invoice for an operator (``AttentionNeeded``) when the draft holds what
  no push can repair, or is no longer a draft.

A line with a request that may still land is not compared (``LinePush.in_doubt_until``):
the invoice is checked at a later pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from uuid import UUID

from eventsourcing.persistence import IntegrityError

from adapters.charging.pusher import utcnow
from adapters.observability.logs import step_fields
from adapters.observability.metrics import metrics
from domain.invoice import Invoice
from domain.invoice_line import LinePush
from domain.invoice_states import InvoiceState
from domain.ports import PaymentGateway
from domain.saga import ChargeFailure
from domain.verification import expected_items, verify_draft
from store.ledger import BillingLedger

__all__ = ["CheckResult", "DraftChecker"]

log = logging.getLogger(__name__)


class CheckResult(StrEnum):
    EQUAL = "equal"  # DraftChecked
    DRIFT = "drift"  # drifted lines handed to their pushers
    ATTENTION = "attention"
    SKIPPED = "skipped"  # not open, no draft, a push in doubt, or raced: a later pass
    FAILED = "failed"  # Stripe could not be read: a later pass


class DraftChecker:
    """Reads open drafts back and hands drifted lines to their pushers."""

    def __init__(
        self,
        ledger: BillingLedger,
        gateway: PaymentGateway,
        hand_over: Callable[[UUID, str], object],
        *,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.ledger = ledger
        self.gateway = gateway
        self.hand_over = hand_over
        self.clock = clock

    def check(self, invoice_id: UUID) -> CheckResult:
        invoice = self.ledger.invoice_by_id(invoice_id)
        if (
            invoice is None
            or invoice.state is not InvoiceState.OPEN
            or invoice.stripe_invoice_id is None
            or invoice.attention is not None
        ):
            return CheckResult.SKIPPED
        now = self.clock()
        pushes = {line: self.ledger.line_push(line) for line in invoice.lines}
        if any(p is not None and (p.in_doubt_until(now) or p.drifted) for p in pushes.values()):
            return CheckResult.SKIPPED
        view = self.gateway.read_draft(invoice.stripe_invoice_id)
        if isinstance(view, ChargeFailure):
            return CheckResult.FAILED
        expected = expected_items(pushes.items())
        verdict = verify_draft(expected, sum(e.amount for e in expected), view, invoice.currency)
        reason = verdict.attention
        if view.status != "draft":
            reason = f"Stripe's invoice {invoice.stripe_invoice_id} is {view.status}, not a draft"
        if reason is not None:
            invoice.need_attention(reason)
            return self._save(invoice, [], CheckResult.ATTENTION, reason)
        held = {i.item_id: i.amount for i in view.items}
        drifted: list[LinePush] = []
        for line in sorted({d.line_id for d in verdict.drifts}):
            push = pushes[line]
            assert push is not None  # a drift is of a line's known item
            push.record_drift([held.get(item, 0) for item in push.item_ids])
            drifted.append(push)
        invoice.record_checked(view.total, len(view.items), [p.line_id for p in drifted])
        result = CheckResult.DRIFT if drifted else CheckResult.EQUAL
        return self._save(invoice, drifted, result, None)

    def _save(
        self, invoice: Invoice, drifted: list[LinePush], result: CheckResult, reason: str | None
    ) -> CheckResult:
        try:
            self.ledger.save(invoice, *drifted)
        except IntegrityError:  # a push or ingest recorded first: check again later
            return CheckResult.SKIPPED
        metrics().invoices.add(1, {"step": f"draft_{result}"})
        customer = invoice.customer_id
        for push in drifted:
            self.hand_over(push.line_id, customer)
            log.warning(
                "open draft differs from the ledger: line handed to its pusher",
                extra=step_fields("check", "drift", line_id=str(push.line_id),
                                  customer_id=customer, repair=push.repairs,
                                  expected=push.amounts),
            )  # fmt: skip
        if reason is not None:
            log.error(
                "invoice needs attention: %s", reason,
                extra=step_fields("check", "needs_attention", customer_id=customer),
            )  # fmt: skip
        return result
