"""The invoice closer: takes each invoice from its period's end to final in Stripe,
and issues the credit notes reversals after that requested.

``step(invoice_id)`` does the next thing the invoice is due for, as far as it can:

1. **open**, past its close deadline (period end + ``INVOICE_GRACE_S``, or now when an
   operator closes it early): ``Closed`` and every line ``Frozen``, in one save (a line
   added or usage settled meanwhile loses the version race, and ingest re-decides:
   the usage goes to a late line of an open period);
2. **closed**: waits until every line's final total is in Stripe and its charges are
   recorded (the lines waiting are handed over: to the push scheduler in a worker,
   pushed at once by the CLI); then ``FinalizeStarted``
   with the final totals, or ``NothingDue`` when nothing was billed and Stripe has no
   draft;
3. **finalizing**: finalizes the draft in Stripe (key ``invoice-finalize:{invoice}``;
   after a failed or unknown attempt it reads the invoice first, so a worker killed
   between Stripe's answer and the record finds it finalized and records it once)
   and records ``Finalized`` from Stripe's answer (``observe``: the webhook may have
   recorded it first); a failure is recorded with its due time and retried for ever;
4. **final**, with credits requested: issues each credit note (key
   ``credit:{transaction}``) and records ``Credited``.

No locks: two closers of one invoice are settled by the event store's version check,
and what Stripe did twice is replayed by its keys. The reconciler's loop drives every
invoice that is due (``projections.invoices.due_invoices``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from uuid import UUID

from eventsourcing.persistence import IntegrityError

from adapters.charging.pusher import utcnow
from adapters.observability.logs import step_fields
from adapters.observability.metrics import metrics
from domain.closing import close_deadline, line_status
from domain.errors import IllegalTransition
from domain.invoice import Invoice
from domain.invoice_states import InvoiceState
from domain.ports import CreditNote, PaymentGateway
from domain.saga import ChargeFailure, RetryPolicy, backoff
from store.ledger import BillingLedger

__all__ = ["CloseResult", "CloseStep", "InvoiceCloser"]

log = logging.getLogger(__name__)

S = InvoiceState


class CloseResult(StrEnum):
    NOT_DUE = "not_due"  # open, before its deadline
    WAITING = "waiting"  # closed: lines not final in Stripe yet, or a retry not due
    PROGRESSED = "progressed"  # recorded a step
    FAILED = "failed"  # a Stripe call failed: recorded with its due time
    DONE = "done"  # nothing left to do (final, no credit pending)
    RACED = "raced"


@dataclass(frozen=True)
class CloseStep:
    result: CloseResult
    state: InvoiceState | None = None
    requests: int = 0
    retry_at: datetime | None = None


class InvoiceCloser:
    """Closes, finalizes and credits invoices (see the module docstring)."""

    max_races = 20

    def __init__(
        self,
        ledger: BillingLedger,
        gateway: PaymentGateway,
        hand_over: Callable[[UUID, str], object] | None,
        policy: RetryPolicy,
        grace: timedelta,
        *,
        clock: Callable[[], datetime] = utcnow,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.ledger = ledger
        self.gateway = gateway
        self.hand_over = hand_over  # (line, customer): push it soon
        self.policy = policy
        self.grace = grace
        self.clock = clock
        self.jitter = jitter

    def step(self, invoice_id: UUID, *, close_now: str | None = None) -> CloseStep:
        """Drive the invoice as far as it can go now. ``close_now``: close it before its
        deadline, with this reason (an operator's ``invoices close``)."""
        requests = 0
        for _ in range(self.max_races):
            invoice = self.ledger.invoice_by_id(invoice_id)
            if invoice is None:
                return CloseStep(CloseResult.DONE)
            try:
                result, sent = self._next(invoice, close_now)
            except (IntegrityError, IllegalTransition):
                continue  # another writer recorded first: reload and look again
            requests += sent
            if result.result is not CloseResult.PROGRESSED:
                return CloseStep(result.result, result.state, requests, result.retry_at)
        return CloseStep(CloseResult.RACED, requests=requests)

    def _next(self, invoice: Invoice, close_now: str | None) -> tuple[CloseStep, int]:
        state = invoice.state
        if state is S.OPEN:
            deadline = close_deadline(invoice, self.grace)
            if close_now is None and self.clock() < deadline:
                return CloseStep(CloseResult.NOT_DUE, state, retry_at=deadline), 0
            self._close(invoice, close_now or "period ended")
            return CloseStep(CloseResult.PROGRESSED), 0
        if state is S.CLOSED:
            return self._finish_lines(invoice), 0
        if state is S.FINALIZING:
            return self._finalize(invoice)
        if invoice.credits_pending() and state in (S.FINALIZED, S.PAYMENT_FAILED, S.PAID):
            return self._credit(invoice)
        return CloseStep(CloseResult.DONE, state), 0

    def _close(self, invoice: Invoice, reason: str) -> None:
        lines = [self.ledger.line_by_id(line) for line in invoice.lines]
        invoice.close(reason)
        for line in lines:
            line.freeze()
        self.ledger.save(invoice, *lines)
        metrics().invoices.add(1, {"step": "closed"})
        log.info(
            "invoice closed",
            extra=step_fields("close", "closed", invoice_id=str(invoice.id),
                              customer_id=invoice.customer_id, lines=len(lines), reason=reason),
        )  # fmt: skip

    def _finish_lines(self, invoice: Invoice) -> CloseStep:
        lines = [self.ledger.line_by_id(line) for line in invoice.lines]
        statuses = [line_status(line, self.ledger.line_push(line.id)) for line in lines]
        waiting = [s for s in statuses if not s.pushed]
        if waiting:
            if self.hand_over is not None:
                for s in waiting:
                    self.hand_over(s.line_id, invoice.customer_id)
            return CloseStep(CloseResult.WAITING, invoice.state)
        if invoice.stripe_invoice_id is None:
            if any(s.billed for s in statuses):  # a push always makes the draft first
                raise IllegalTransition(f"invoice {invoice.id} billed without a draft")
            invoice.nothing_due()
        else:
            invoice.start_finalizing([s.final for s in statuses])
        self.ledger.save(invoice)
        return CloseStep(CloseResult.PROGRESSED)

    def _finalize(self, invoice: Invoice) -> tuple[CloseStep, int]:
        now = self.clock()
        if invoice.next_attempt_at is not None and invoice.next_attempt_at > now:
            return CloseStep(
                CloseResult.WAITING, invoice.state, retry_at=invoice.next_attempt_at
            ), 0
        assert invoice.stripe_invoice_id is not None
        answer = self.gateway.finalize_invoice(
            invoice.stripe_invoice_id, invoice.id, look_first=invoice.finalize_attempts > 0
        )
        if isinstance(answer, ChargeFailure):
            due = now + backoff(invoice.finalize_attempts + 1, self.policy, self.jitter())
            if answer.retry_after is not None:
                due = max(due, now + answer.retry_after)
            invoice.record_finalize_failure(answer.error_class, answer.message, due)
            self.ledger.save(invoice)
            metrics().invoices.add(1, {"step": "finalize_failed"})
            log.warning(
                "invoice finalize failed: %s", answer.message,
                extra=step_fields("finalize", "retry", error_code=answer.error_class,
                                  invoice_id=str(invoice.id), attempt=invoice.finalize_attempts),
            )  # fmt: skip
            return CloseStep(CloseResult.FAILED, invoice.state, 1, due), 1
        invoice.observe(answer)
        if invoice.pending_events:
            self.ledger.save(invoice)
        metrics().invoices.add(1, {"step": "finalized"})
        log.info(
            "invoice finalized",
            extra=step_fields("finalize", "finalized", invoice_id=str(invoice.id),
                              customer_id=invoice.customer_id, number=invoice.number,
                              total=invoice.total, expected_total=invoice.expected_total),
        )  # fmt: skip
        return CloseStep(CloseResult.PROGRESSED), 1

    def _credit(self, invoice: Invoice) -> tuple[CloseStep, int]:
        """Issue the first pending credit note and record it."""
        assert invoice.stripe_invoice_id is not None
        txn, amount = invoice.credits_pending()[0]
        note = CreditNote(
            invoice_id=invoice.id,
            stripe_invoice_id=invoice.stripe_invoice_id,
            transaction_id=txn,
            amount=amount,
            after_payment=invoice.state is S.PAID,
            memo=f"reversal of {txn}: {invoice.credit_reasons.get(str(txn), '')}",
        )
        issued = self.gateway.credit_note(note)
        if isinstance(issued, ChargeFailure):
            log.warning(
                "credit note failed: %s", issued.message,
                extra=step_fields("credit", "retry", error_code=issued.error_class,
                                  invoice_id=str(invoice.id), transaction_id=str(txn)),
            )  # fmt: skip
            return CloseStep(CloseResult.FAILED, invoice.state, 1), 1
        invoice.record_credit(txn, issued, amount, "credit")
        self.ledger.save(invoice)
        metrics().invoices.add(1, {"step": "credited"})
        log.info(
            "credit note issued",
            extra=step_fields("credit", "issued", invoice_id=str(invoice.id),
                              transaction_id=str(txn), credit_note_id=issued, amount=amount),
        )  # fmt: skip
        return CloseStep(CloseResult.PROGRESSED), 1
