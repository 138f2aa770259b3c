"""The line pusher: puts an invoice line's newest total in Stripe, then records it.

``push(line_id)`` is the one path the process manager's scheduler and the reconciler
share. It loads the line (written by ingest) and its ``LinePush`` (written by pushers
only), asks ``domain.pushing`` what to send, makes sure the Stripe customer and the
period's draft invoice exist (recorded once, as ``CustomerLink`` and ``Invoice``),
records the items it is about to create (so a retry after a crash sends the same
parameters under the same key), calls Stripe, and records ``Pushed`` together with a
``Charged`` for every transaction the push included, in one save. A save that loses
the race against another pusher reloads and looks again; what Stripe already did is
replayed by its keys, and amounts are absolute, so a second push never adds twice.

Every request that sets amounts is recorded before it is sent (``AttemptStarted``,
with the moment after which it can no longer land, in the save that plans its
items) and ended when Stripe answered it: the closer reads the draft back only when
no attempt can still land (``domain.verification``). A call our own breaker or rate
limiter refused was never sent: it is no attempt and raises no backoff.

**New lines together.** A line's first push creates its items together with the other
new lines of its draft (nothing planned, made or batched yet; not sealed, fenced out or
backing off), in one ``add_lines`` request of at most ``MAX_ITEMS_PER_ADD`` items. The
rule that makes a retry safe: **the batch is what was recorded before the call.** One
save records, on every line of the batch, its planned items (``ItemPlanned``), the
batch itself (``AddBatched``: every line of it and how many items each makes) and its
``AttemptStarted``; only then is the request sent. A retry of *any* of those lines
(after a crash, a lost answer, a retryable failure) rebuilds the request from that
record alone: the same lines, chunks and planned amounts, so the same key
(``domain.pushing.add_key``: the invoice's id and a digest of every line, chunk,
sequence and amount it makes; never a clock), and Stripe replays its first answer. A
line added to the invoice meanwhile is not in it. Past the key window (``key_window``,
counted from the batch's save) the gateway first looks the invoice's items up by their
metadata (line and chunk) and makes only those it does not find, under the key of that
smaller set. The answer names each item and the line item Stripe made of it
(``il_...``): each line records ``Pushed`` at the sequence its items were planned at,
with its ``Charged`` events and the line items learned (``LineItemsLearned``), so its
next change goes into ``update_lines`` with no list of the draft's lines first. A line
alone (no other new line on its draft), a line planned before batches, or one of an
invoice pushed line by line, creates its items on its own, one request each
(``set_line_items``: keyed by the line and chunk alone). A refusal of a batch on a
draft is the request's: every line leaves the batch (``AddBatchLeft``, in the save that
ends their attempts, so no later push sends it again) and creates its items on its own
from then on, deciding its own refusal; a refusal on an invoice that is no longer a
draft needs an operator, as below; a retryable failure backs off every line of it; a
call our own breaker or limiter refused was never sent (no backoff).

**One request per invoice.** Every later change only sets amounts, and then the push is
the invoice's: the changed lines of the line's draft invoice that are free to go (not
sealed, not backing off, charges recorded, items created) are set together by one
``update_lines`` request (``domain.pushing.invoice_part`` and ``batches``: at most
``MAX_LINES_PER_UPDATE`` line items a request). Stripe names a draft's lines by ids of
its own (``il_...``), so the pusher learns them from Stripe's list of the invoice's lines
and records them on each LinePush (``LineItemsLearned``) before it names one; a line
whose line items Stripe does not list is pushed on its own. Every line it sets gets its
``AttemptStarted`` (one save for all, before the call), its ``Pushed`` and its
``Charged`` events, exactly as a line pushed alone; the lines of an invoice share their
customer, so the partition claim the pusher holds is every line's (a line fenced to a
newer owner is left out). An invoice whose bulk update Stripe refuses while it is still
a draft is pushed line by line from then on in this process (each line then decides its
own refusal, so one line's fault never compensates another's usage).

A retryable failure is recorded with its due time (``PushFailed``) and retried for
ever; a permanent one compensates the transactions no push has included yet, unless
the invoice is no longer a draft in Stripe (finalized by hand): then billable usage
is never compensated, and the invoice needs an operator's attention instead.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from eventsourcing.persistence import IntegrityError

from adapters.observability import telemetry
from adapters.observability.logs import step_fields
from adapters.observability.metrics import metrics
from domain.closing import is_true_up
from domain.customer import CustomerLink
from domain.errors import IllegalTransition
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine, LineChange, LinePush
from domain.invoice_states import InvoiceState
from domain.ownership import Claim
from domain.ports import DraftInvoice, LineItems, LinesAdd, LinesUpdate, PaymentGateway
from domain.pushing import (
    MAX_ITEMS_PER_ADD,
    ItemStep,
    LineAdd,
    PushPlan,
    PushVerdict,
    after_failure,
    batches,
    charged_events,
    invoice_part,
    plan_push,
    planned_push,
    repriced_last,
    settled_in,
)
from domain.saga import ChargeFailure, RetryPolicy, StepResult
from domain.transaction import BillingTransaction, TxnState
from domain.verification import DEFAULT_LANDING, LandingWindow
from store.ledger import BillingLedger

__all__ = ["LinePusher", "PushReport", "invoice_of", "utcnow"]

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(UTC)


def invoice_of(ledger: BillingLedger, line: InvoiceLine) -> Invoice:
    """The invoice ``line`` is on (raises IllegalTransition if it has none)."""
    invoice = ledger.invoice_by_id(line.invoice_id)
    if invoice is None:  # every line is opened with its invoice (domain.metering)
        raise IllegalTransition(f"line {line.id} has no invoice {line.invoice_id}")
    return invoice


@dataclass(frozen=True)
class _Sent:
    """What sending a push did: its outcome, the requests, the attempt it recorded, and
    of the requests the failed step's own (``failing``: a customer's or draft's one, the
    items' calls)."""

    outcome: list[str] | ChargeFailure
    requests: int
    attempt: int = 0
    failing: int = 1
    sent_to: str | None = None  # the Stripe draft the items' requests named


@dataclass(frozen=True)
class PushReport:
    """What one ``push`` did: its result, the sequence it pushed, the Stripe requests
    it sent and the transactions it recorded as charged."""

    result: StepResult
    sequence: int = 0
    requests: int = 0
    charged: int = 0
    retry_at: datetime | None = None  # RETRY or WAIT: when the line is due again
    more: bool = False  # the line changed again meanwhile
    lines: tuple[UUID, ...] = ()  # other lines of its invoice this push set too


@dataclass(frozen=True)
class _Member:
    """A line of the invoice's push: the line, its push and what it sends."""

    line: InvoiceLine
    push: LinePush
    plan: PushPlan


class LinePusher:
    """Pushes invoice lines to Stripe and records what Stripe acknowledged."""

    max_races = 20
    max_charges_per_save = 5000  # Charged events in one save, with the LinePush's progress

    def __init__(
        self,
        ledger: BillingLedger,
        gateway: PaymentGateway,
        policy: RetryPolicy,
        *,
        key_window: timedelta = timedelta(hours=23),
        clock: Callable[[], datetime] = utcnow,
        jitter: Callable[[], float] = random.random,
        landing: LandingWindow = DEFAULT_LANDING,
        claims: Callable[[str], Claim | None] = lambda customer: None,
    ) -> None:
        self.ledger = ledger
        self.gateway = gateway
        self.policy = policy
        self.key_window = key_window
        self.clock = clock
        self.jitter = jitter
        self.landing = landing
        self.claims = claims  # the claim this process pushes a customer's lines under
        # Drafts whose bulk update Stripe refused while a draft: pushed line by line (a
        # later draft of the same invoice, ``invoices redraft``, is batched again).
        self._per_line: set[str] = set()

    def push(self, line_id: UUID) -> PushReport:
        """Bring Stripe and the charges up to the line's newest total, as far as now allows."""
        span = telemetry.span(
            "push line", telemetry.transaction_context(line_id), billing__line_id=str(line_id)
        )
        with span as current:
            report = self._push(line_id)
            current.set_attributes(
                {
                    "billing.result": str(report.result),
                    "billing.sequence": report.sequence,
                    "billing.requests": report.requests,
                    "billing.charged": report.charged,
                }
            )
            return report

    def _push(self, line_id: UUID) -> PushReport:
        requests = 0
        for race in range(self.max_races):
            if race:
                time.sleep(random.uniform(0, 0.002 * min(race, 10)))
            line = self.ledger.line_by_id(line_id)
            push = self.ledger.line_push(line_id) or LinePush(line_id=line_id)
            try:
                if push.charged_through < push.pushed_sequence:
                    charged = self._record_charges(line, push)
                    return PushReport(StepResult.CHARGED, push.pushed_sequence, requests, charged)
                plan = plan_push(line, push)
                claim = self.claims(line.customer_id)
                if plan is None or push.sealed or push.fenced_out(claim):
                    return PushReport(StepResult.NOTHING, push.pushed_sequence, requests)
                if self._finalizing(line):
                    return PushReport(StepResult.NOTHING, push.pushed_sequence, requests)
                now = self.clock()
                if push.next_attempt_at is not None and push.next_attempt_at > now:
                    return PushReport(
                        StepResult.WAIT,
                        push.pushed_sequence,
                        requests,
                        retry_at=push.next_attempt_at,
                    )
                if plan.calls and self.gateway.breaker_state() == "open":
                    # Our own breaker would refuse it unsent: no attempt, no backoff.
                    return self._not_sent(push, now, requests)
                # Each returns its report, or the Stripe requests it sent before
                # leaving the line to go on its own (counted in the line's push).
                added = self._add_new(line, push, plan, claim)
                if isinstance(added, PushReport):
                    return replace(added, requests=requests + added.requests)
                requests += added
                together = self._push_invoice(line, push, plan, claim)
                if isinstance(together, PushReport):
                    return replace(together, requests=requests + together.requests)
                requests += together
                sent = self._send(line, push, plan, claim)
                requests += sent.requests
                outcome = sent.outcome
                if isinstance(outcome, ChargeFailure):
                    return self._failed(
                        line, push, plan, outcome, requests, attempt=sent.attempt,
                        unsent=sent.failing, sent_to=sent.sent_to,
                    )  # fmt: skip
                if sent.attempt:
                    push.end_attempt(sent.attempt, "answered")
                charged = self._record_push(line, push, plan, outcome, requests)
                _log_push(line, plan, requests, charged)
                metrics().charge_steps.add(1, {"result": "pushed"})
                more = self.ledger.line_by_id(line_id).sequence > plan.sequence
                return PushReport(StepResult.CHARGED, plan.sequence, requests, charged, more=more)
            except (IntegrityError, IllegalTransition):
                continue  # another writer recorded first: reload and look again
        return PushReport(StepResult.RACED, 0, requests)

    # -- the new lines' items, together -----------------------------------------------

    def _add_new(
        self, line: InvoiceLine, push: LinePush, plan: PushPlan, claim: Claim | None
    ) -> PushReport | int:
        """Create ``line``'s items together with the draft's other new lines, in one
        ``add_lines`` request (a batch recorded before, when there is one: the same set
        again), or the Stripe requests sent before the line goes on its own (items
        planned before batches, an invoice pushed line by line, a batch Stripe refused
        on a draft). Raises
        IntegrityError or IllegalTransition on a lost race (the caller reloads)."""
        recorded = push.batched()
        invoice = self._the_invoice(line)
        made: list[_Member] = []
        if recorded is None:
            if not _fresh(push, plan) or invoice.stripe_invoice_id in self._per_line:
                return 0
            members = self._new_members(invoice, _Member(line, push, plan), claim)
            if len(members) < 2:  # alone: created on its own (``set_line_items``)
                return 0
        else:
            members, made = self._batch_of(line, push, plan, recorded)
        customer, requests = self._customer(line.customer_id)
        if isinstance(customer, ChargeFailure):
            return self._failed(line, push, plan, customer, requests)
        stripe_invoice, sent, draft = self._invoice(line, customer)
        requests += sent
        if isinstance(stripe_invoice, ChargeFailure):
            return self._failed(line, push, plan, stripe_invoice, requests)
        look_first = False
        if recorded is None:
            _record_batch(members, self.clock())
        else:
            batched_at = push.add_batched_at or push.keys_since()
            look_first = self.clock() - batched_at >= self.key_window
        sent_at = self.clock()
        lands_by = self.landing.deadline(sent_at, 3 if look_first else 1)
        attempts = [
            m.push.start_attempt(m.plan.sequence, sent_at, lands_by, claim) for m in members
        ]
        self.ledger.save(*(m.push for m in members))
        everyone = sorted([*members, *made], key=lambda m: str(m.line.id))
        adds = tuple(_line_add(m) for m in everyone)
        # The draft's number as read with its id (the invoice loaded above may be older).
        add = LinesAdd(invoice.id, stripe_invoice, customer, line.currency, adds, look_first, draft)
        answer = self.gateway.add_lines(add)
        requests += 1
        if isinstance(answer, ChargeFailure):
            return self._batch_failed(
                invoice.id, members, attempts, answer, requests, adding=True,
                sent_to=stripe_invoice,
            )  # fmt: skip
        learned: dict[str, str] = {}
        for i, m in enumerate(members):
            found = [answer[m.line.id, chunk] for chunk in range(len(m.plan.items))]
            learned.update({item: il for item, il in found if il})
            members[i] = replace(m, plan=planned_push(m.push, [item for item, _ in found]))
        return self._batch_pushed(line, members, attempts, requests, learned)

    def _new_members(self, invoice: Invoice, first: _Member, claim: Claim | None) -> list[_Member]:
        """``first`` and the invoice's other new lines that may go now (nothing planned,
        made or batched, not sealed, not fenced out, not backing off), up to
        ``MAX_ITEMS_PER_ADD`` items."""
        now = self.clock()
        members, count = [first], len(first.plan.items)
        for other in invoice.lines:
            if other == first.line.id:
                continue
            push = self.ledger.line_push(other) or LinePush(line_id=other)
            if push.sealed or push.fenced_out(claim):
                continue
            if push.next_attempt_at is not None and push.next_attempt_at > now:
                continue
            line = self.ledger.line_by_id(other)
            plan = plan_push(line, push)
            if plan is None or not _fresh(push, plan):
                continue
            if count + len(plan.items) > MAX_ITEMS_PER_ADD:
                continue
            members.append(_Member(line, push, plan))
            count += len(plan.items)
        return members if count <= MAX_ITEMS_PER_ADD else [first]

    def _batch_of(
        self, line: InvoiceLine, push: LinePush, plan: PushPlan, recorded: list[tuple[UUID, int]]
    ) -> tuple[list[_Member], list[_Member]]:
        """The recorded batch of ``line``: its lines whose items are still to make (the
        line first), and those made already (in the request all the same: the same set
        under the same key). Each at its recorded items."""
        members = [_Member(line, push, _recorded(push, line.id, recorded))]
        made: list[_Member] = []
        for other, _ in recorded:
            if other == line.id:
                continue
            other_push = self.ledger.line_push(other)
            if other_push is None:  # recorded in the save that made the batch
                raise IllegalTransition(f"line {other} of a batch has no push")
            member = _Member(
                self.ledger.line_by_id(other), other_push, _recorded(other_push, other, recorded)
            )
            (made if other_push.item_ids else members).append(member)
        return members, made

    # -- the invoice's push ------------------------------------------------------------

    def _push_invoice(
        self, line: InvoiceLine, push: LinePush, plan: PushPlan, claim: Claim | None
    ) -> PushReport | int:
        """Set ``line`` and the invoice's other changed lines in one ``update_lines``
        request, or the Stripe requests sent before the line goes on its own (an item to
        create, line items Stripe does not list, an invoice pushed line by line). Raises
        IntegrityError or IllegalTransition on a lost race (the caller reloads)."""
        if not plan.calls or any(step.item_id is None for step in plan.items):
            return 0
        invoice = self._the_invoice(line)
        if invoice.stripe_invoice_id is None or invoice.stripe_invoice_id in self._per_line:
            return 0
        members = self._members(invoice, _Member(line, push, plan), claim)
        requests = 0
        if any(m.push.line_item_ids() is None for m in members):
            learned = self.gateway.line_items(invoice.stripe_invoice_id)
            requests += 1
            if isinstance(learned, ChargeFailure):
                if learned.retryable:  # nothing was set: the line waits its retry
                    return self._failed(line, push, plan, learned, requests)
                return requests  # a refusal to list is no refusal of the line: alone
            for m in members:
                m.push.learn_line_items(learned)
            touched = [m.push for m in members if m.push.pending_events]
            if touched:
                self.ledger.save(*touched)
        parts = {
            m.line.id: part
            for m in members
            if (part := invoice_part(m.line.id, m.plan, m.push.line_item_ids())) is not None
        }
        batch = next((b for b in batches(list(parts.values())) if line.id in
                      {p.line_id for p in b}), None)  # fmt: skip
        if batch is None:
            return requests  # Stripe does not list its line items: pushed on its own
        chosen = [m for m in members if m.line.id in {p.line_id for p in batch}]
        attempts = self._start_attempts(chosen, claim)
        update = LinesUpdate(invoice.id, invoice.stripe_invoice_id, batch, invoice.draft)
        failure = self.gateway.update_lines(update)
        requests += 1
        if failure is not None:
            return self._batch_failed(
                invoice.id, chosen, attempts, failure, requests,
                sent_to=invoice.stripe_invoice_id,
            )  # fmt: skip
        return self._batch_pushed(line, chosen, attempts, requests)

    def _members(self, invoice: Invoice, first: _Member, claim: Claim | None) -> list[_Member]:
        """``first`` and the invoice's other lines with a change that only sets amounts
        and may go now (pushed before, charges recorded, not sealed, not fenced out,
        not backing off)."""
        now = self.clock()
        members = [first]
        for other in invoice.lines:
            if other == first.line.id:
                continue
            push = self.ledger.line_push(other)
            if push is None or push.sealed or push.fenced_out(claim):
                continue
            if push.charged_through < push.pushed_sequence:
                continue  # its own push records its charges first
            if push.next_attempt_at is not None and push.next_attempt_at > now:
                continue
            line = self.ledger.line_by_id(other)
            plan = plan_push(line, push)
            if plan is None or not plan.calls or plan.to_plan:
                continue
            if any(step.item_id is None for step in plan.items):
                continue
            members.append(_Member(line, push, plan))
        return members

    def _start_attempts(self, chosen: list[_Member], claim: Claim | None) -> list[int]:
        """Record each line's attempt, in one save, before the request is sent (its
        deadline: one call)."""
        sent_at = self.clock()
        lands_by = self.landing.deadline(sent_at, 1)
        attempts = [m.push.start_attempt(m.plan.sequence, sent_at, lands_by, claim) for m in chosen]
        self.ledger.save(*(m.push for m in chosen))
        return attempts

    def _batch_pushed(
        self,
        line: InvoiceLine,
        chosen: list[_Member],
        attempts: list[int],
        requests: int,
        learned: dict[str, str] | None = None,
    ) -> PushReport:
        """Stripe set every line of the request: each one's ``Pushed`` and charges. The
        other lines first (one that lost a race to another writer is pushed again later),
        then ``line`` (a lost race reloads it, as a push of it alone would)."""
        charged, others = 0, []
        ordered = sorted(zip(chosen, attempts, strict=True), key=lambda c: c[0].line.id == line.id)
        for m, attempt in ordered:
            m.push.end_attempt(attempt, "answered")
            mine = m.line.id == line.id
            sent = requests if mine else 0
            item_ids = [step.item_id or "" for step in m.plan.items]
            try:
                done = self._record_push(m.line, m.push, m.plan, item_ids, sent, learned=learned)
            except IntegrityError:
                if mine:
                    raise
                continue
            charged += done
            _log_push(m.line, m.plan, sent, done)
            more = self.ledger.line_by_id(m.line.id).sequence > m.plan.sequence
            if not mine:  # set by this request: its interval runs from it, changed or not
                others.append(m.line.id)
        metrics().charge_steps.add(1, {"result": "pushed"})
        first = chosen[0]
        return PushReport(
            StepResult.CHARGED, first.plan.sequence, requests, charged, more=more,
            lines=tuple(others),
        )  # fmt: skip

    def _batch_failed(
        self,
        invoice_id: UUID,
        chosen: list[_Member],
        attempts: list[int],
        failure: ChargeFailure,
        requests: int,
        *,
        adding: bool = False,
        sent_to: str | None = None,
    ) -> PushReport | int:
        """Stripe did not set (or make: ``adding``) the lines. A retryable failure is each
        line's (recorded with its due time), and so is a refusal of a request that set
        one line only. A refusal of several lines of an invoice that is still a draft, or
        of any batch of new lines, is the request's, not the lines': the batch is left
        and the invoice is pushed line by line from now on (the requests sent: this line
        goes now), so one line's fault never compensates the others' usage. A refusal of
        a request to a draft the invoice no longer has (``sent_to``: replaced meanwhile,
        ``invoices redraft``) is no one's: every line retries, on the invoice's draft."""
        first = chosen[0]
        if not failure.retryable and self._replaced(first.line, sent_to):
            failure = replace(failure, retryable=True, answered=True)
        if not failure.retryable and (len(chosen) > 1 or adding):
            view = self.gateway.read_draft(self._the_invoice(first.line).stripe_invoice_id or "")
            requests += 1
            if isinstance(view, ChargeFailure) and view.retryable:
                # Whose refusal it is cannot be told now: every line retries (never
                # compensate on a guess; a line's own read could find the draft).
                failure = replace(failure, retryable=True, answered=True)
            elif not isinstance(view, ChargeFailure) and view.status == "draft":
                for m, attempt in zip(chosen, attempts, strict=True):
                    m.push.end_attempt(attempt, "answered")
                    m.push.leave_batch()
                self.ledger.save(*(m.push for m in chosen if m.push.pending_events))
                self._per_line.add(sent_to or "")
                log.warning(
                    "bulk update refused on a draft: its lines go one by one: %s",
                    failure.message,
                    extra=step_fields("push", "per_line", error_code=failure.error_class,
                                      invoice_id=str(invoice_id)),
                )  # fmt: skip
                return requests
        report = self._failed(
            first.line, first.push, first.plan, failure, requests, attempt=attempts[0],
            sent_to=sent_to,
        )  # fmt: skip
        for m, attempt in zip(chosen[1:], attempts[1:], strict=True):
            with contextlib.suppress(IntegrityError, IllegalTransition):
                self._failed(m.line, m.push, m.plan, failure, 0, attempt=attempt, sent_to=sent_to)
        return replace(report, lines=tuple(m.line.id for m in chosen[1:]))

    def _finalizing(self, line: InvoiceLine) -> bool:
        """A frozen line's invoice may be final in Stripe: its items are then frozen
        too (a change after that is a credit note, never a push)."""
        if not line.frozen:
            return False
        state = self._the_invoice(line).state
        return state not in (InvoiceState.OPEN, InvoiceState.CLOSED)

    # -- Stripe ----------------------------------------------------------------------

    def _not_sent(self, push: LinePush, now: datetime, requests: int = 0) -> PushReport:
        """Refused unsent by our own breaker or limiter: no attempt, no backoff (the
        ``requests`` sent before it, a customer or a draft made, are still counted)."""
        return PushReport(
            StepResult.WAIT, push.pushed_sequence, requests, retry_at=now + self.policy.base_delay
        )

    def _send(
        self, line: InvoiceLine, push: LinePush, plan: PushPlan, claim: Claim | None
    ) -> _Sent:
        """The customer, the draft invoice and the items, as far as they go; the outcome,
        how many Stripe requests were sent, and the attempt recorded for the items.
        Nothing is sent when Stripe holds the amounts already (a change below the
        rounding, a removal of nothing billed)."""
        if not plan.calls and not plan.to_plan:
            return _Sent(list(push.item_ids[: len(plan.items)]), 0)
        customer, requests = self._customer(line.customer_id)
        if isinstance(customer, ChargeFailure):
            return _Sent(customer, requests)
        invoice, sent, draft = self._invoice(line, customer)
        requests += sent
        if isinstance(invoice, ChargeFailure):
            return _Sent(invoice, requests)
        look_first = self.clock() - push.keys_since() >= self.key_window
        attempt = self._plan_items(push, plan, claim, look_first=look_first)
        if not plan.calls:
            return _Sent(list(push.item_ids[: len(plan.items)]), requests)
        items = LineItems(
            line_id=line.id,
            meter=line.meter,
            period=line.period,
            stripe_customer_id=customer,
            stripe_invoice_id=invoice,
            currency=line.currency,
            plan=plan,
            look_first=look_first,
            draft=draft,
        )
        answer = self.gateway.set_line_items(items)
        return _Sent(answer, requests + plan.calls, attempt, failing=plan.calls, sent_to=invoice)

    def _plan_items(
        self, push: LinePush, plan: PushPlan, claim: Claim | None, *, look_first: bool
    ) -> int:
        """Record the items about to be created and the attempt about to be sent under
        ``claim`` (and the LinePush itself on a first push) before Stripe sees them; the
        attempt's number (0: nothing to send). A lost race raises IntegrityError (the
        caller reloads); a push sealed meanwhile, or pushed under a newer claim, raises
        IllegalTransition (the reload then finds nothing to do). The attempt's
        deadline counts every call it may make one after another: each creation looked
        up first (a list of the invoice's items, two pages at most counted) when
        ``look_first``; a save slower than the landing margin would shorten it."""
        for chunk, sequence, amount in plan.to_plan:
            push.plan_item(chunk, sequence, amount)
        attempt = 0
        if plan.calls:
            creations = sum(step.item_id is None for step in plan.items)
            calls = plan.calls + (2 * creations if look_first else 0)
            sent_at = self.clock()
            attempt = push.start_attempt(
                plan.sequence, sent_at, self.landing.deadline(sent_at, calls), claim
            )
        if push.pending_events:
            self.ledger.save(push)
        return attempt

    def _customer(self, customer_id: str) -> tuple[str | ChargeFailure, int]:
        link = self.ledger.customer_link(customer_id)
        if link is not None:
            return link.stripe_customer_id, 0
        found = self.gateway.customer(customer_id, look_first=False)
        if isinstance(found, str):
            # Linked by another pusher meanwhile: the same key made the same customer.
            with contextlib.suppress(IntegrityError):
                self.ledger.save(CustomerLink(customer_id=customer_id, stripe_customer_id=found))
        return found, 1

    def _invoice(self, line: InvoiceLine, customer: str) -> tuple[str | ChargeFailure, int, int]:
        """The Stripe draft of the line's invoice, created and recorded on first need; the
        requests sent, and the draft's number (its requests' keys)."""
        invoice = self._the_invoice(line)
        if invoice.stripe_invoice_id is not None:
            return invoice.stripe_invoice_id, 0, invoice.draft
        draft = DraftInvoice(
            invoice_id=invoice.id,
            customer_id=line.customer_id,
            stripe_customer_id=customer,
            currency=line.currency,
            period=line.period,
            draft=invoice.draft,
        )
        created = self.gateway.draft_invoice(draft, look_first=False)
        if isinstance(created, str):
            for _ in range(self.max_races):  # ingest may add a line meanwhile: record again
                invoice = self._the_invoice(line)
                invoice.record_draft(created, customer)
                try:
                    self.ledger.save(invoice)
                    break
                except IntegrityError:
                    continue
        return created, 1, draft.draft

    def _the_invoice(self, line: InvoiceLine) -> Invoice:
        return invoice_of(self.ledger, line)

    # -- recording -------------------------------------------------------------------

    def _record_push(
        self,
        line: InvoiceLine,
        push: LinePush,
        plan: PushPlan,
        item_ids: list[str],
        requests: int,
        *,
        learned: dict[str, str] | None = None,
    ) -> int:
        """``Pushed`` (and the line items Stripe named for its items, ``learned``) and the
        first charges it makes due, in one save; the rest after."""
        stripe_invoice = self._the_invoice(line).stripe_invoice_id or ""
        push.record_pushed(
            plan.sequence, plan.billed, plan.amounts, item_ids, stripe_invoice, requests
        )
        if learned:
            push.learn_line_items(learned)
        charged = self._record_charges(line, push)
        if push.pending_events:  # nothing to charge (a push of removals only)
            self.ledger.save(push)
        return charged

    def _record_charges(self, line: InvoiceLine, push: LinePush) -> int:
        """Record Charged for the transactions the acknowledged pushes include, in saves
        of at most ``max_charges_per_save`` (a change is never split), each with the
        LinePush's progress."""
        charged = 0
        changes = self.ledger.line_changes(line.id, push.charged_through, push.pushed_sequence)
        while changes:
            batch: list[LineChange] = []
            count = 0
            while changes and (
                not batch or count + len(changes[0].transaction_ids) <= self.max_charges_per_save
            ):
                batch.append(changes.pop(0))
                count += len(batch[-1].transaction_ids)
            ids = settled_in(batch)
            latest = self.ledger.latest_versions(ids)
            events = charged_events(
                ids,
                latest,
                stripe_object_id=push.item_ids[0] if push.item_ids else "",
                line_id=line.id,
                sequence=push.pushed_sequence,
                states={i: self.ledger.transaction(i).state for i in repriced_last(latest)},
            )
            push.record_charges(batch[-1].originator_version, len(events))
            self.ledger.save(push, *events)
            charged += len(events)
            _count_charges(batch, {e.originator_id for e in events}, self.clock())
            _trace_charges(events, line)
        if push.charged_through < push.pushed_sequence:  # no change left: removals only
            push.record_charges(push.pushed_sequence, 0)
            self.ledger.save(push)
        return charged

    def _failed(
        self,
        line: InvoiceLine,
        push: LinePush,
        plan: PushPlan,
        failure: ChargeFailure,
        requests: int,
        *,
        attempt: int = 0,
        unsent: int = 1,
        sent_to: str | None = None,
    ) -> PushReport:
        """A failed call, counted in ``requests`` as ``unsent`` requests (the items'
        calls: counted as none sent when one is refused unsent, though the limiter may
        have refused only the third); ``sent_to``: the Stripe draft it named, if any."""
        now = self.clock()
        if not failure.sent:  # our own breaker or limiter: nothing reached Stripe
            if attempt:
                push.end_attempt(attempt, "not_sent")
                self.ledger.save(push)
            return self._not_sent(push, now, max(requests - unsent, 0))
        if attempt and not failure.may_land_later:
            push.end_attempt(attempt, "answered")
        attention, about = None, None
        if not failure.retryable:
            attention, read, failure, about = self._refusal(line, failure, sent_to)
            requests += read
        decision = after_failure(push, failure, now, self.policy, self.jitter())
        due = decision.next_attempt_at
        if attention is not None:  # kept for an operator: looked at now and then
            due = now + self.policy.max_delay
        push.record_failure(
            plan.sequence,
            failure.error_class,
            failure.message,
            retryable=decision.verdict is PushVerdict.RETRY,
            next_attempt_at=due,
            requests=requests,
        )
        self.ledger.save(push)
        m = metrics()
        m.charge_steps.add(1, {"result": "retry" if failure.retryable else "abandoned"})
        m.retries.add(int(failure.retryable))
        log.warning(
            "line push failed: %s", failure.message,
            extra=step_fields("push", str(decision.verdict), error_code=failure.error_class,
                              line_id=str(line.id), customer_id=line.customer_id,
                              sequence=plan.sequence, attempt=push.attempts),
        )  # fmt: skip
        if attention is not None:  # owed usage Stripe will not take: never compensated
            self._needs_attention(line, attention, failure, about)
            return PushReport(StepResult.DEFERRED, plan.sequence, requests, retry_at=due)
        if decision.verdict is PushVerdict.ABANDON:
            removed = self._abandon(line.id, push.pushed_sequence, decision.reason or "refused")
            return PushReport(StepResult.COMPENSATED, plan.sequence, requests, more=removed)
        return PushReport(StepResult.RETRY, plan.sequence, requests, retry_at=due)

    def _refusal(
        self, line: InvoiceLine, failure: ChargeFailure, sent_to: str | None = None
    ) -> tuple[str | None, int, ChargeFailure, str | None]:
        """Stripe refused the line for good: whose refusal is it? Its invoice is read
        (nothing recorded yet). Still a draft (or none yet): the line's, and its unpushed
        usage is compensated; but no replacement of a lost draft yet (``invoices
        redraft``): the invoice's, as below (its charges were recorded). No longer a
        draft (finalized or voided in the dashboard), or unreadable for good (deleted):
        the usage is still owed, so never compensated;
        the invoice needs attention (the reason is returned). Not readable now: a
        retryable failure (never compensate on a guess). A refusal of a request to a draft
        the invoice no longer has (``sent_to``: replaced meanwhile by ``invoices
        redraft``) is no one's: retryable, the line goes again to the invoice's draft.
        Also the requests sent, and the draft the answer is about (None: none yet)."""
        invoice = self._the_invoice(line)
        about = invoice.stripe_invoice_id
        if sent_to is not None and about != sent_to:  # replaced meanwhile (``_replaced``)
            return None, 0, replace(failure, retryable=True, answered=True), sent_to
        refused = f"Stripe refused line {line.id} ({line.meter}): {failure.error_class}:"
        if invoice.stripe_invoice_id is None:
            if invoice.draft > 1:  # the lost draft's replacement: charges recorded, still owed
                why = (
                    f"{refused} {failure.message}; Stripe did not make draft {invoice.draft}"
                    " of the invoice (its earlier draft was lost)"
                )
                return why, 0, failure, about
            return None, 0, failure, about
        view = self.gateway.read_draft(invoice.stripe_invoice_id)
        if isinstance(view, ChargeFailure):
            if view.retryable:
                return None, 1, replace(failure, retryable=True), about
            why = f"{refused} {failure.message}; and its invoice cannot be read: {view.message}"
            return why, 1, failure, about
        if view.status == "draft":
            return None, 1, failure, about
        why = f"{refused} its invoice {invoice.stripe_invoice_id} is {view.status}, not a draft"
        return why, 1, failure, about

    def _replaced(self, line: InvoiceLine, sent_to: str | None) -> bool:
        """Whether the draft a request named (``sent_to``) is no longer the invoice's."""
        return sent_to is not None and self._the_invoice(line).stripe_invoice_id != sent_to

    def _needs_attention(
        self, line: InvoiceLine, reason: str, failure: ChargeFailure, about: str | None
    ) -> None:
        """Record on the line's invoice that it needs an operator (reloaded on a race),
        unless the draft the reason is about (``about``) is no longer the invoice's: an
        operator replaced it meanwhile (``invoices redraft``), and the line goes again."""
        for _ in range(self.max_races):
            invoice = self._the_invoice(line)
            if invoice.stripe_invoice_id != about:
                return
            invoice.need_attention(reason)
            if not invoice.pending_events:
                return
            try:
                self.ledger.save(invoice)
            except IntegrityError:
                continue
            metrics().invoices.add(1, {"step": "needs_attention"})
            log.error(
                "invoice needs attention: %s", reason,
                extra=step_fields("push", "needs_attention", error_code=failure.error_class,
                                  line_id=str(line.id), invoice_id=str(invoice.id),
                                  customer_id=line.customer_id),
            )  # fmt: skip
            return

    def _abandon(self, line_id: UUID, pushed: int, reason: str) -> bool:
        """Compensate the line's transactions that no acknowledged push includes;
        whether there were any."""
        for _ in range(self.max_races):
            line = self.ledger.line_by_id(line_id)
            if is_true_up(line.meter):  # a minimum's shortfall: no transaction to release
                return False
            ids = settled_in(self.ledger.line_changes(line_id, pushed, line.sequence))
            txns = [self.ledger.transaction(i) for i in ids]
            txns = [t for t in txns if t.state is TxnState.RESERVED]
            if not txns:
                return False
            account = self.ledger.account(line.customer_id, line.currency)
            assert account is not None
            for txn in txns:
                txn.compensate(reason)
                account.release(txn.id, txn.amount)
            line.remove([(t.id, t.amount) for t in txns], reason)
            touched: list[Any] = [line, account, *txns]
            if line.frozen:  # its invoice closed: say so on it (finalizing waits for it)
                invoice = self._the_invoice(line)
                invoice.adjust(line.id, [t.id for t in txns], reason)
                touched.append(invoice)
            try:
                self.ledger.save(*touched)
            except IntegrityError:
                continue
            return True
        return False


def _fresh(push: LinePush, plan: PushPlan) -> bool:
    """Whether the push is a line's first: nothing planned, made or batched yet, and
    items to create (each one planned now)."""
    return (
        not push.item_ids
        and not push.planned
        and push.add_batch is None
        and bool(plan.to_plan)
        and len(plan.to_plan) == len(plan.items)
    )


def _record_batch(members: list[_Member], now: datetime) -> None:
    """Each member's items planned and the batch recorded on each (saved by the caller,
    with the attempts, before the request)."""
    lines = [m.line.id for m in members]
    chunks = [len(m.plan.items) for m in members]
    for m in members:
        for chunk, sequence, amount in m.plan.to_plan:
            m.push.plan_item(chunk, sequence, amount)
        m.push.batch_add(lines, chunks, now)


def _recorded(push: LinePush, line_id: UUID, recorded: list[tuple[UUID, int]]) -> PushPlan:
    """The items a recorded batch makes for ``line_id``: its planned ones, as many as
    the batch names (the item ids unknown yet)."""
    chunks = dict(recorded)[line_id]
    if len(push.planned) < chunks:
        raise IllegalTransition(f"line push {push.id}: its batch's items are not planned")
    steps = tuple(
        ItemStep(c, amount, None, sequence, amount)
        for c, (sequence, amount) in enumerate(push.planned[:chunks])
    )
    sequence = max(s for s, _ in push.planned[:chunks])
    return PushPlan(sequence, sum(a for _, a in push.planned[:chunks]), steps, ())


def _line_add(m: _Member) -> LineAdd:
    """A member's share of its ``add_lines`` request: its items as planned."""
    items = tuple(
        (step.chunk, step.create_sequence or 0, step.create_amount or 0) for step in m.plan.items
    )
    return LineAdd(m.line.id, m.line.meter, str(m.line.period), items)


def _count_charges(
    changes: list[LineChange], charged: set[UUID], now: datetime
) -> None:  # pragma: no mutate block
    """Transactions charged, and each one's wait from its settlement (its metering)."""
    m = metrics()
    m.charged.add(len(charged))
    for change in changes:
        if isinstance(change, InvoiceLine.Settled):
            waited = (now - change.timestamp).total_seconds()
            for txn in change.transaction_ids:
                if UUID(txn) in charged:
                    m.charge_latency.record(waited)


def _trace_charges(
    events: list[BillingTransaction.Charged], line: InvoiceLine
) -> None:  # pragma: no mutate block
    """A ``charged`` span in each transaction's own trace, linked to the push that charged
    it. Made only when the push is recorded (no exporter: no thousands of no-op spans)."""
    push = telemetry.current_span()
    if not push.is_recording():
        return
    link = telemetry.link_to(push)
    for event in events:
        telemetry.start_span(
            "charged",
            telemetry.transaction_context(event.originator_id),
            [link],
            billing__transaction_id=str(event.originator_id),
            billing__customer_id=line.customer_id,
            billing__line_id=str(line.id),
            billing__sequence=event.sequence,
        ).end()


def _log_push(
    line: InvoiceLine, plan: PushPlan, requests: int, charged: int
) -> None:  # pragma: no mutate block
    log.info(
        "line pushed",
        extra=step_fields("push", "pushed", line_id=str(line.id), customer_id=line.customer_id,
                          sequence=plan.sequence, billed=plan.billed, requests=requests,
                          charged=charged),
    )  # fmt: skip
