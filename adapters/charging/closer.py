"""The invoice closer: takes each invoice from its period's end to final in Stripe,
and issues the credit notes reversals after that requested.

``step(invoice_id)`` does the next thing the invoice is due for, as far as it can:

1. **open**, past its close deadline (period end + ``INVOICE_GRACE_S``, or now when an
   operator closes it early): ``Closed`` and every line ``Frozen``, in one save (a line
   added or usage settled meanwhile loses the version race, and ingest re-decides:
   the usage goes to a late line of an open period); with, in the same save, the true-up
   line of the customer's minimum commitment when the lines sum below it
   (``domain.closing.true_up_lines``);
2. **closed**: waits until every line's final total is in Stripe and its charges are
   recorded (the lines waiting are handed over: to the push scheduler in a worker,
   pushed at once by the CLI); then ``FinalizeStarted``
   with the final totals, or ``NothingDue`` when nothing was billed and Stripe has no
   draft;
3. **finalizing**: first reads Stripe back (``domain.verification``): it waits until no
   request that set an amount can still land (the lines' pushes were sealed in the
   ``FinalizeStarted`` save, so none starts any more), reads the draft (one request;
   the items paged only past the first lines), and records ``Verified`` when every
   item and the total equal the ledger's; a difference is recorded (``DriftFound``),
   repaired under keys of its own and read again; what setting amounts cannot repair
   stops the invoice for an operator (``AttentionNeeded``). Then it
   finalizes the draft in Stripe (key ``invoice-finalize:{invoice}``: a worker killed
   between Stripe's answer and the record gets the finalized invoice again, replayed
   by the key or, past Stripe's 24 hours, read after its refusal, and records it once;
   after a finalize known to be in doubt (recorded so, or its record lost a race) it
   reads the invoice first; a refused call (a 429) or a failed read leaves nothing to
   look for)
   and records ``Finalized`` from Stripe's answer (``observe``: the webhook may have
   recorded it first), with ``MismatchFound`` when Stripe's total is not the expected
   one (an alert, never a silent success); a failure is recorded with its due time
   and retried for ever, and a refusal for good stops the invoice for an operator (a call
   our own breaker or limiter refused is no attempt: nothing recorded, no backoff);
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
from domain.closing import close_deadline, line_status, true_up_lines
from domain.errors import IllegalTransition
from domain.invoice import Invoice
from domain.invoice_states import InvoiceState
from domain.money import format_money
from domain.ports import CreditNote, ItemRepair, PaymentGateway
from domain.saga import ChargeFailure, RetryPolicy, on_draft, retry_due
from domain.verification import (
    DEFAULT_LANDING,
    DraftView,
    LandingWindow,
    Verdict,
    expected_items,
    repair_key,
    verify_draft,
)
from store.ledger import BillingLedger

__all__ = ["CloseResult", "CloseStep", "InvoiceCloser"]

log = logging.getLogger(__name__)

S = InvoiceState

MAX_REPAIRS = 3
"""Drift repaired this many times and found again stops the invoice for an operator."""


class _FinalizeUnrecorded(Exception):
    """A finalize was sent and its record lost a race to another writer (the cause)."""


class CloseResult(StrEnum):
    NOT_DUE = "not_due"  # open, before its deadline
    WAITING = "waiting"  # closed: lines not final in Stripe yet, or a retry not due
    PROGRESSED = "progressed"  # recorded a step
    FAILED = "failed"  # a Stripe call failed: recorded with its due time
    ATTENTION = "attention"  # stopped until an operator settles it
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
        landing: LandingWindow = DEFAULT_LANDING,
        verify: bool = True,
    ) -> None:
        self.ledger = ledger
        self.gateway = gateway
        self.hand_over = hand_over  # (line, customer): push it soon
        self.policy = policy
        self.grace = grace
        self.clock = clock
        self.jitter = jitter
        self.landing = landing
        self.verify = verify  # off only to measure what reading back costs (bench close)

    def step(self, invoice_id: UUID, *, close_now: str | None = None) -> CloseStep:
        """Drive the invoice as far as it can go now. ``close_now``: close it before its
        deadline, with this reason (an operator's ``invoices close``)."""
        requests = 0
        sent_finalize = False  # a finalize of this step whose outcome was not recorded
        for _ in range(self.max_races):
            invoice = self.ledger.invoice_by_id(invoice_id)
            if invoice is None:
                return CloseStep(CloseResult.DONE)
            try:
                result, sent = self._next(invoice, close_now, sent_finalize)
            except _FinalizeUnrecorded:  # its record lost a race: reload, and read first
                requests += 1
                sent_finalize = True
                continue
            except (IntegrityError, IllegalTransition):
                continue  # another writer recorded first: reload and look again
            requests += sent
            if result.result is not CloseResult.PROGRESSED:
                return CloseStep(result.result, result.state, requests, result.retry_at)
        return CloseStep(CloseResult.RACED, requests=requests)

    def _next(
        self, invoice: Invoice, close_now: str | None, sent_finalize: bool
    ) -> tuple[CloseStep, int]:
        state = invoice.state
        if state is S.OPEN:
            deadline = close_deadline(invoice, self.grace)
            if close_now is None and self.clock() < deadline:
                return CloseStep(CloseResult.NOT_DUE, state, retry_at=deadline), 0
            self._close(invoice, close_now or "period ended")
            return CloseStep(CloseResult.PROGRESSED), 0
        if invoice.attention is not None and state in (S.CLOSED, S.FINALIZING):
            return CloseStep(CloseResult.ATTENTION, state), 0
        if state is S.CLOSED:
            return self._finish_lines(invoice), 0
        if state is S.FINALIZING:
            due = invoice.next_attempt_at
            if due is not None and due > self.clock():
                return CloseStep(CloseResult.WAITING, state, retry_at=due), 0
            if self.verify and not invoice.verified:
                return self._read_back(invoice)
            return self._finalize(invoice, look_first=sent_finalize)
        if invoice.credits_pending() and state in (S.FINALIZED, S.PAYMENT_FAILED, S.PAID):
            return self._credit(invoice)
        return CloseStep(CloseResult.DONE, state), 0

    def _close(self, invoice: Invoice, reason: str) -> None:
        lines = [self.ledger.line_by_id(line) for line in invoice.lines]
        contract = self.ledger.contract(invoice.customer_id)
        schedule = None if contract is None else contract.schedule
        for extra in true_up_lines(invoice, lines, schedule):  # a minimum's shortfall
            invoice.add_line(extra.id)
            lines.append(extra)
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
        sealed = []
        if invoice.stripe_invoice_id is None:
            if any(s.billed for s in statuses):  # a push always makes the draft first
                raise IllegalTransition(f"invoice {invoice.id} billed without a draft")
            invoice.nothing_due()
        else:
            invoice.start_finalizing([s.final for s in statuses])
            # No push of these lines starts after this save: one that loaded its
            # LinePush before it loses the version race and finds the invoice finalizing.
            for line in lines:
                push = self.ledger.line_push(line.id)
                if push is not None:
                    push.seal(invoice.id)
                    sealed.append(push)
        self.ledger.save(invoice, *sealed)
        return CloseStep(CloseResult.PROGRESSED)

    # -- reading Stripe back ------------------------------------------------------------

    def _read_back(self, invoice: Invoice) -> tuple[CloseStep, int]:
        """Verify the draft against the ledger, or repair it, or stop for an operator."""
        now = self.clock()
        pushes = [
            (UUID(line), self.ledger.line_push(UUID(line))) for line in invoice.final_sequences
        ]
        doubt = [p.in_doubt_until(now) for _, p in pushes if p is not None]
        doubt.append(invoice.in_doubt_until(now))
        until = max((d for d in doubt if d is not None), default=None)
        if until is not None:  # a request sent earlier may still land: read after it
            return CloseStep(CloseResult.WAITING, invoice.state, retry_at=until), 0
        assert invoice.stripe_invoice_id is not None
        view = self.gateway.read_draft(invoice.stripe_invoice_id)
        if isinstance(view, ChargeFailure):
            return self._failed(invoice, view, now, "read back"), int(view.sent)
        if view.status != "draft":
            # Finalized already (an earlier attempt whose answer was lost, or by hand):
            # the finalize step reads it (looking first: one request, where a finalize
            # Stripe refuses costs two) and compares Stripe's total with the ledger's.
            step, sent = self._finalize(invoice, look_first=True)
            return step, 1 + sent
        verdict = verify_draft(
            expected_items(pushes), invoice.expected_total, view, invoice.currency
        )
        if verdict.equal:
            invoice.record_verified(view.total, len(view.items))
            self.ledger.save(invoice)
            metrics().invoices.add(1, {"step": "verified"})
            return CloseStep(CloseResult.PROGRESSED), 1
        reason = verdict.attention
        if reason is None and invoice.repairs_sent >= MAX_REPAIRS:
            reason = (
                f"Stripe's draft still differs from the ledger after {invoice.repairs_sent}"
                f" repairs (expected {format_money(invoice.expected_total, invoice.currency)},"
                f" Stripe {format_money(view.total, invoice.currency)})"
            )
        if reason is not None:
            return self._attention(invoice, reason), 1
        step, sent = self._repair(invoice, verdict, view, now)
        return step, 1 + sent

    def _repair(
        self, invoice: Invoice, verdict: Verdict, view: DraftView, now: datetime
    ) -> tuple[CloseStep, int]:
        """Record the drift, then set each drifted item back under a repair key."""
        rows = [d.as_row() for d in verdict.drifts]
        repair = invoice.record_drift(
            rows, view.total, self.landing.deadline(now, len(verdict.drifts))
        )
        self.ledger.save(invoice)  # recorded before any repair request is sent
        metrics().invoices.add(1, {"step": "drift_found"})
        log.warning(
            "Stripe's draft differs from the ledger: repairing", extra=step_fields(
                "verify", "drift", invoice_id=str(invoice.id), customer_id=invoice.customer_id,
                repair=repair, expected_total=invoice.expected_total, stripe_total=view.total,
                drifts=[{"line_id": r[0], "item_id": r[3], "expected": int(r[4]),
                         "found": int(r[5])} for r in rows]),
        )  # fmt: skip
        repairs = [
            ItemRepair(
                d.item_id,
                d.expected,
                d.sequence,
                on_draft(repair_key(d.line_id, d.chunk, d.sequence, repair), invoice.draft),
            )
            for d in verdict.drifts
        ]
        failure = self.gateway.repair_items(repairs)
        if failure is None:
            invoice.record_repaired(repair)
            self.ledger.save(invoice)
            # Read again at the next step, not in this one's loop: a repair Stripe keeps
            # undoing must not spin (after MAX_REPAIRS it needs an operator).
            return CloseStep(CloseResult.WAITING, invoice.state, retry_at=now), len(repairs)
        if not failure.retryable and not failure.may_land_later:
            # Answered for good. (A 5xx Stripe says not to retry may still have landed:
            # recorded and retried, read after it can no longer land, as for a timeout.)
            return self._attention(
                invoice, f"Stripe refused repair {repair}: {failure.error_class}: {failure.message}"
            ), len(repairs)
        if not failure.sent:  # our own limits refused it: nothing of it can land
            invoice.record_repair_not_sent(repair)
        elif not failure.may_land_later:
            invoice.record_repaired(repair)
        sent = len(repairs) if failure.sent else 0
        return self._failed(invoice, failure, now, "repair"), sent

    def _attention(self, invoice: Invoice, reason: str) -> CloseStep:
        invoice.need_attention(reason)
        if invoice.pending_events:
            self.ledger.save(invoice)
            metrics().invoices.add(1, {"step": "needs_attention"})
            log.error(
                "invoice needs attention: %s", reason,
                extra=step_fields("verify", "needs_attention", invoice_id=str(invoice.id),
                                  customer_id=invoice.customer_id),
            )  # fmt: skip
        return CloseStep(CloseResult.ATTENTION, invoice.state)

    def _failed(
        self, invoice: Invoice, failure: ChargeFailure, now: datetime, what: str
    ) -> CloseStep:
        """A failed Stripe call while finalizing: recorded with its due time; one Stripe
        refused for good (a draft deleted by hand, a customer Stripe will not invoice)
        stops the invoice for an operator instead of being sent again for ever."""
        if not failure.sent:
            # Our own breaker or limiter refused it: no attempt, so nothing recorded and
            # no backoff (after a breaker opening every invoice would otherwise wait out
            # a longer delay at each refusal); the next pass tries again.
            if invoice.pending_events:  # a repair, refused before it was sent: done
                self.ledger.save(invoice)
            retry_at = now + self.policy.base_delay
            return CloseStep(CloseResult.WAITING, invoice.state, retry_at=retry_at)
        if not failure.retryable and not failure.may_land_later:
            return self._attention(
                invoice, f"Stripe refused the {what}: {failure.error_class}: {failure.message}"
            )
        due = retry_due(failure, invoice.finalize_attempts + 1, now, self.policy, self.jitter())
        invoice.record_finalize_failure(
            failure.error_class, failure.message, due, call=what,
            may_have_landed=failure.may_land_later,
        )  # fmt: skip
        self.ledger.save(invoice)
        metrics().invoices.add(1, {"step": "finalize_failed"})
        log.warning(
            "invoice %s failed: %s", what, failure.message,
            extra=step_fields("finalize", "retry", error_code=failure.error_class,
                              invoice_id=str(invoice.id), attempt=invoice.finalize_attempts),
        )  # fmt: skip
        return CloseStep(CloseResult.FAILED, invoice.state, 1, due)

    def _finalize(self, invoice: Invoice, *, look_first: bool) -> tuple[CloseStep, int]:
        """Finalize the draft, reading the invoice first when an earlier finalize may
        have landed: one recorded in doubt, or one of this step whose record lost a race
        (``look_first``)."""
        now = self.clock()
        assert invoice.stripe_invoice_id is not None
        answer = self.gateway.finalize_invoice(
            invoice.stripe_invoice_id, invoice.id,
            look_first=look_first or invoice.finalize_in_doubt, draft=invoice.draft,
        )  # fmt: skip
        try:
            if isinstance(answer, ChargeFailure):
                return self._failed(invoice, answer, now, "finalize"), int(answer.sent)
            invoice.observe(answer)
            if invoice.pending_events:
                self.ledger.save(invoice)
        except (IntegrityError, IllegalTransition) as lost:
            raise _FinalizeUnrecorded from lost
        if invoice.mismatch is not None:
            self._alert_mismatch(invoice)
        metrics().invoices.add(1, {"step": "finalized"})
        log.info(
            "invoice finalized",
            extra=step_fields("finalize", "finalized", invoice_id=str(invoice.id),
                              customer_id=invoice.customer_id, number=invoice.number,
                              total=invoice.total, expected_total=invoice.expected_total),
        )  # fmt: skip
        return CloseStep(CloseResult.PROGRESSED), 1

    def _alert_mismatch(self, invoice: Invoice) -> None:
        assert invoice.mismatch is not None
        expected, found = invoice.mismatch
        metrics().invoices.add(1, {"step": "mismatch"})
        log.error(
            "finalized invoice differs from the ledger: %s", invoice.attention,
            extra=step_fields("finalize", "mismatch", invoice_id=str(invoice.id),
                              customer_id=invoice.customer_id, expected_total=expected,
                              stripe_total=found),
        )  # fmt: skip

    def _credit(self, invoice: Invoice) -> tuple[CloseStep, int]:
        """Issue the first pending credit note and record it: sized to what Stripe's
        invoice can still be credited, a failure recorded with its due time."""
        assert invoice.stripe_invoice_id is not None
        now = self.clock()
        if invoice.credit_due is not None and invoice.credit_due > now:
            return CloseStep(CloseResult.WAITING, invoice.state, retry_at=invoice.credit_due), 0
        txn, requested = invoice.credits_pending()[0]
        amount = invoice.creditable(requested)
        if amount < requested:
            # Credit notes made in the dashboard left less than the reversal: never credit
            # more than the invoice holds; the rest is an operator's call.
            invoice.need_attention(
                f"reversal of {txn} owes {format_money(requested, invoice.currency)}, but the"
                f" invoice can only be credited {format_money(amount, invoice.currency)} more:"
                " settle the remainder with the customer"
            )
            if amount == 0:
                self.ledger.save(invoice)
                return CloseStep(CloseResult.ATTENTION, invoice.state), 0
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
            due = retry_due(issued, invoice.credit_attempts + 1, now, self.policy, self.jitter())
            invoice.record_credit_failure(txn, issued.error_class, issued.message, due)
            self.ledger.save(invoice)
            log.warning(
                "credit note failed: %s", issued.message,
                extra=step_fields("credit", "retry", error_code=issued.error_class,
                                  invoice_id=str(invoice.id), transaction_id=str(txn),
                                  attempt=invoice.credit_attempts),
            )  # fmt: skip
            return CloseStep(CloseResult.FAILED, invoice.state, 1, due), 1
        invoice.record_credit(txn, issued, amount, "credit")
        self.ledger.save(invoice)
        metrics().invoices.add(1, {"step": "credited"})
        log.info(
            "credit note issued",
            extra=step_fields("credit", "issued", invoice_id=str(invoice.id),
                              transaction_id=str(txn), credit_note_id=issued, amount=amount),
        )  # fmt: skip
        return CloseStep(CloseResult.PROGRESSED), 1
