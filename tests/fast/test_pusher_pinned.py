"""The line pusher pinned through its ports: for each answer Stripe gives, the exact
report ``push`` returns, the exact events it records (the attempt and its deadline,
the planned items, ``Pushed``, ``PushFailed``, the charges, the compensation), and
what the fake Stripe is asked for.

The fakes are the shared ones (``tests/fast/fakes.py``), wrapped here: a Stripe that
keeps what each request asked for, can fail one named call, and can let another
writer act while a request is in Stripe; and a ledger in which another writer
records just before a given save (so that save loses the race, as it would in
PostgreSQL). The clock and the jitter are fixed, so every time is asserted exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from eventsourcing.persistence import IntegrityError

from adapters.charging.closer import InvoiceCloser
from adapters.charging.corrections import Corrections
from adapters.charging.pusher import LinePusher, PushReport, invoice_of
from adapters.settings import Settings
from domain.account import CustomerAccount
from domain.customer import CustomerLink
from domain.errors import IllegalTransition
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine, LinePush
from domain.periods import PeriodPolicy
from domain.ports import DraftInvoice, LineItems, LinesUpdate
from domain.pushing import plan_push
from domain.saga import ChargeFailure, RetryPolicy, StepResult, backoff
from domain.transaction import BillingTransaction, TxnState
from domain.verification import DraftView, LandingWindow
from store.ledger import BillingLedger
from tests.fast.fakes import T0, Clock, FakeGateway, reserve

POLICY = RetryPolicy(horizon=timedelta(hours=1))  # base 1 s, max 5 min
LANDING = LandingWindow(per_call=timedelta(seconds=10), margin=timedelta(seconds=3))
GRACE = timedelta(hours=1)
DOWN = ChargeFailure("http_503", "down", retryable=True)
REFUSED = ChargeFailure("http_400", "invalid currency", retryable=False)
REFUSAL = "Stripe refused the line: http_400: invalid currency"


@dataclass
class Stripe(FakeGateway):
    """The strict fake Stripe, keeping each request's parameters; ``fail`` answers the
    next call of a name (customer, invoice, items, lines, read; ``items`` is the request
    that sets a line's items, alone or in its invoice's bulk update) with a failure, before
    anything is executed; ``meanwhile`` runs once when a call of that name arrives,
    before Stripe executes it (another writer acting while the request is out)."""

    customer_requests: list[tuple[str, bool]] = field(default_factory=list)
    draft_requests: list[tuple[DraftInvoice, bool]] = field(default_factory=list)
    item_requests: list[LineItems] = field(default_factory=list)
    update_requests: list[LinesUpdate] = field(default_factory=list)
    fail: dict[str, ChargeFailure] = field(default_factory=dict)
    meanwhile: dict[str, Callable[[], object]] = field(default_factory=dict)

    def _arrives(self, call: str) -> ChargeFailure | None:
        hook = self.meanwhile.pop(call, None)
        if hook is not None:
            hook()
        return self.fail.pop(call, None)

    def customer(self, customer_id: str, *, look_first: bool) -> str | ChargeFailure:
        self.customer_requests.append((customer_id, look_first))
        failed = self._arrives("customer")
        if failed is not None:
            self.calls.append("customer")
            return failed
        return super().customer(customer_id, look_first=look_first)

    def draft_invoice(self, draft: DraftInvoice, *, look_first: bool) -> str | ChargeFailure:
        self.draft_requests.append((draft, look_first))
        failed = self._arrives("invoice")
        if failed is not None:
            self.calls.append("invoice")
            return failed
        return super().draft_invoice(draft, look_first=look_first)

    def set_line_items(self, items: LineItems) -> list[str] | ChargeFailure:
        self.item_requests.append(items)
        failed = self._arrives("items")
        if failed is not None:
            self.calls.append("items")
            return failed
        return super().set_line_items(items)

    def update_lines(self, update: LinesUpdate) -> ChargeFailure | None:
        self.update_requests.append(update)
        failed = self._arrives("items")
        if failed is not None:
            self.calls.append("update_lines")
            return failed
        return super().update_lines(update)

    def line_items(self, stripe_invoice_id: str) -> dict[str, str] | ChargeFailure:
        failed = self._arrives("lines")
        if failed is not None:
            self.calls.append("lines")
            return failed
        return super().line_items(stripe_invoice_id)

    def read_draft(self, stripe_invoice_id: str) -> DraftView | ChargeFailure:
        failed = self._arrives("read")
        if failed is not None:
            self.calls.append("read")
            return failed
        return super().read_draft(stripe_invoice_id)


class Ledger(BillingLedger):
    """The in-memory ledger, where another writer can record first: ``before`` holds
    (which save, what the other writer does) pairs, each run once, just before the
    first save it matches (the other writer's own saves are not matched)."""

    def __init__(self) -> None:
        super().__init__(Settings().load_prices(), env={"PERSISTENCE_MODULE": "eventsourcing.popo"})
        self.before: list[tuple[Callable[[Sequence[Any]], bool], Callable[[], object]]] = []

    def save(self, *objs: Any, **kwargs: Any) -> Any:
        for i, (matches, other_writer) in enumerate(self.before):
            if matches(objs):
                del self.before[i]
                other_writer()
                break
        return super().save(*objs, **kwargs)


def _recording(kind: type) -> Callable[[Sequence[Any]], bool]:
    """A save of an aggregate about to record an event of ``kind``."""

    def matches(objs: Sequence[Any]) -> bool:
        return any(isinstance(e, kind) for o in objs for e in getattr(o, "pending_events", ()))

    return matches


def _lose_the_race() -> None:
    raise IntegrityError("another writer recorded this aggregate first")


class Parts:
    def __init__(self) -> None:
        self.clock = Clock(T0)
        self.gateway = Stripe(clock=self.clock)
        self.ledger = Ledger()
        self.pusher = LinePusher(
            self.ledger, self.gateway, POLICY, clock=self.clock, jitter=lambda: 0.5,
            landing=LANDING,
        )  # fmt: skip

    def reserve(self, n: int = 1, **kwargs: Any) -> list[UUID]:
        return reserve(self.ledger, n, **kwargs)

    def line(self, txn: UUID) -> UUID:
        line = self.ledger.transaction(txn).line_id
        assert line is not None
        return line

    def sequence(self, line: UUID) -> int:
        return self.ledger.line_by_id(line).sequence

    def push_of(self, line: UUID) -> LinePush:
        push = self.ledger.line_push(line)
        assert push is not None
        return push

    def invoice(self, line: UUID) -> Invoice:
        return invoice_of(self.ledger, self.ledger.line_by_id(line))

    def events(self, aggregate: UUID, kind: type) -> list[Any]:
        return [e for e in self.ledger.history(aggregate) if isinstance(e, kind)]

    def push_events(self, line: UUID, kind: type) -> list[Any]:
        return self.events(self.push_of(line).id, kind)

    def states(self, ids: list[UUID]) -> list[TxnState]:
        return [self.ledger.transaction(i).state for i in ids]

    def close(self, line: UUID) -> None:
        """An operator closes the line's invoice now (its lines frozen)."""
        closer = InvoiceCloser(
            self.ledger, self.gateway, lambda *_: None, POLICY, GRACE, clock=self.clock
        )
        closer.step(self.invoice(line).id, close_now="closed by the test")
        assert self.ledger.line_by_id(line).frozen


# -- what one push sends and records -----------------------------------------------------


def test_a_first_push_reports_and_records_exactly_what_stripe_acknowledged() -> None:
    parts = Parts()
    ids = parts.reserve(2, quantity=1000)  # 200
    line = parts.line(ids[0])
    sequence = parts.sequence(line)
    report = parts.pusher.push(line)
    assert report == PushReport(StepResult.CHARGED, sequence, 3, 2)
    [pushed] = parts.push_events(line, LinePush.Pushed)
    assert (pushed.sequence, pushed.billed, pushed.amounts, pushed.item_ids) == (
        sequence, 200, [200], ["ii_0"],
    )  # fmt: skip
    assert (pushed.stripe_invoice_id, pushed.requests) == ("in_1", 3)
    [recorded] = parts.push_events(line, LinePush.ChargesRecorded)
    assert (recorded.through, recorded.transactions) == (sequence, 2)
    for txn in ids:
        [charged] = parts.events(txn, BillingTransaction.Charged)
        assert (charged.stripe_object_id, charged.line_id, charged.sequence) == (
            "ii_0", line, sequence,
        )  # fmt: skip
    invoice = parts.invoice(line)
    assert (invoice.stripe_invoice_id, invoice.stripe_customer_id) == ("in_1", "cus_acme")
    link = parts.ledger.customer_link("acme")
    assert link is not None and link.stripe_customer_id == "cus_acme"
    assert parts.pusher.push(line) == PushReport(StepResult.NOTHING, sequence, 0)


def test_stripe_is_asked_for_the_lines_customer_draft_and_items_without_looking_first() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.ledger.line_by_id(parts.line(txn))
    parts.pusher.push(line.id)
    assert parts.gateway.customer_requests == [("acme", False)]
    [(draft, look_first)] = parts.gateway.draft_requests
    assert draft == DraftInvoice(line.invoice_id, "acme", "cus_acme", "USD", line.period)
    assert look_first is False
    [items] = parts.gateway.item_requests
    assert (items.line_id, items.meter, items.period, items.currency) == (
        line.id, "api.requests", line.period, "USD",
    )  # fmt: skip
    assert (items.stripe_customer_id, items.stripe_invoice_id, items.look_first) == (
        "cus_acme", "in_1", False,
    )  # fmt: skip


def test_an_attempt_is_recorded_before_it_is_sent_with_its_exact_deadline_then_ended() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    sequence = parts.sequence(line)
    parts.pusher.push(line)
    [planned] = parts.push_events(line, LinePush.ItemPlanned)
    assert (planned.chunk, planned.sequence, planned.amount) == (0, sequence, 100)
    [started] = parts.push_events(line, LinePush.AttemptStarted)
    # one creation, one call: its longest wire time, then the landing margin
    assert (started.attempt, started.sequence, started.sent_at, started.lands_by) == (
        1, sequence, T0, T0 + LANDING.per_call + LANDING.margin,
    )  # fmt: skip
    [ended] = parts.push_events(line, LinePush.AttemptEnded)
    assert (ended.attempt, ended.outcome) == (1, "answered")
    assert parts.push_of(line).in_doubt_until(T0) is None


def test_a_push_that_only_records_a_frozen_line_reports_no_charge_and_records_charges_of_none() -> (
    None
):
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    parts.pusher.push(line)
    parts.close(line)  # Frozen: the line's sequence moves, its total does not
    frozen = parts.sequence(line)
    calls = list(parts.gateway.calls)
    assert parts.pusher.push(line) == PushReport(StepResult.CHARGED, frozen, 0, 0)
    assert parts.gateway.calls == calls
    recorded = parts.push_events(line, LinePush.ChargesRecorded)
    assert [(r.through, r.transactions) for r in recorded][-1] == (frozen, 0)
    assert parts.push_events(line, LinePush.Pushed)[-1].requests == 0


def test_usage_below_a_cent_is_charged_with_no_item_and_no_stripe_invoice() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1)  # 0.1 cent: billed 0
    line = parts.line(txn)
    sequence = parts.sequence(line)
    assert parts.pusher.push(line) == PushReport(StepResult.CHARGED, sequence, 0, 1)
    assert parts.gateway.calls == []
    [pushed] = parts.push_events(line, LinePush.Pushed)
    assert (pushed.item_ids, pushed.stripe_invoice_id) == ([], "")
    [charged] = parts.events(txn, BillingTransaction.Charged)
    assert charged.stripe_object_id == ""


def test_two_changes_pushed_together_are_charged_in_one_save() -> None:
    parts = Parts()
    first = parts.reserve(1, quantity=1000)
    line = parts.line(first[0])
    second = parts.reserve(2, quantity=1000, prefix="s")
    sequence = parts.sequence(line)
    assert parts.pusher.push(line) == PushReport(StepResult.CHARGED, sequence, 3, 3)
    [recorded] = parts.push_events(line, LinePush.ChargesRecorded)
    assert (recorded.through, recorded.transactions) == (sequence, 3)
    assert parts.states(first + second) == [TxnState.CHARGED] * 3


def test_charges_are_saved_in_bounded_batches_of_whole_changes() -> None:
    parts = Parts()
    parts.pusher.max_charges_per_save = 4
    sizes = (2, 2, 1, 5)  # the last change alone is over the bound: never split
    ids = [t for i, n in enumerate(sizes) for t in parts.reserve(n, prefix=f"b{i}")]
    line = parts.line(ids[0])
    versions = [e.originator_version for e in parts.events(line, InvoiceLine.Settled)]
    assert parts.pusher.push(line).charged == 10
    recorded = parts.push_events(line, LinePush.ChargesRecorded)
    assert [(r.through, r.transactions) for r in recorded] == [
        (versions[1], 4), (versions[2], 1), (versions[3], 5),
    ]  # fmt: skip
    assert parts.states(ids) == [TxnState.CHARGED] * 10


def test_charges_left_unrecorded_after_stripe_acknowledged_are_recorded_without_a_request() -> None:
    parts = Parts()
    first = parts.reserve(1, quantity=1000)
    line = parts.line(first[0])
    parts.pusher.push(line)
    later = parts.reserve(2, quantity=1000, prefix="later")
    settled = parts.sequence(line)
    parts.close(line)  # the line ends with Frozen, after its last change
    frozen = parts.sequence(line)
    # Stripe acknowledged 300 and Pushed was saved; the pusher stopped before the
    # saves of the push's charges (a push larger than one save is recorded in several).
    stopped = parts.push_of(line)
    stopped.record_pushed(frozen, 300, [300], stopped.item_ids, "in_1", 1)
    parts.ledger.save(stopped)
    parts.gateway.items["ii_0"]["amount"] = 300
    calls = list(parts.gateway.calls)
    assert parts.pusher.push(line) == PushReport(StepResult.CHARGED, frozen, 0, 2)
    assert parts.gateway.calls == calls
    assert parts.states(first + later) == [TxnState.CHARGED] * 3
    recorded = parts.push_events(line, LinePush.ChargesRecorded)
    assert [(r.through, r.transactions) for r in recorded][1:] == [(settled, 2), (frozen, 0)]
    assert parts.push_of(line).charged_through == frozen
    for txn in later:
        [charged] = parts.events(txn, BillingTransaction.Charged)
        assert (charged.stripe_object_id, charged.sequence) == ("ii_0", frozen)


def test_a_push_whose_line_changed_meanwhile_says_more() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    sequence = parts.sequence(line)
    parts.gateway.meanwhile["items"] = lambda: parts.reserve(1, prefix="meanwhile")
    report = parts.pusher.push(line)
    assert report == PushReport(StepResult.CHARGED, sequence, 3, 1, more=True)


# -- waiting and our own refusals -------------------------------------------------------


def test_a_line_not_due_waits_until_its_exact_due_time_and_pushes_at_it() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    parts.pusher.push(line)
    pushed = parts.sequence(line)
    parts.reserve(1, prefix="b")
    parts.gateway.fail["items"] = DOWN
    due = T0 + backoff(1, POLICY, 0.5)
    # the draft's line items learned (one request), then the bulk update that failed
    assert parts.pusher.push(line) == PushReport(
        StepResult.RETRY, parts.sequence(line), 2, retry_at=due
    )
    parts.clock.now = due - timedelta(microseconds=1)
    assert parts.pusher.push(line) == PushReport(StepResult.WAIT, pushed, 0, retry_at=due)
    parts.clock.now = due
    assert parts.pusher.push(line).result is StepResult.CHARGED


def test_a_call_our_breaker_refuses_reports_the_pushed_sequence_and_no_request() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    parts.pusher.push(line)
    pushed = parts.sequence(line)
    parts.reserve(1, prefix="b")
    parts.gateway.breaker = "open"
    report = parts.pusher.push(line)
    assert report == PushReport(StepResult.WAIT, pushed, 0, retry_at=T0 + POLICY.base_delay)


def test_a_change_below_the_rounding_is_charged_while_our_breaker_is_open() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    parts.pusher.push(line)
    parts.gateway.breaker = "open"
    [tiny] = parts.reserve(1, quantity=1, prefix="tiny")  # 100.1: still 100
    report = parts.pusher.push(line)
    assert report == PushReport(StepResult.CHARGED, parts.sequence(line), 0, 1)
    assert parts.states([tiny]) == [TxnState.CHARGED]


def test_a_call_refused_unsent_inside_the_gateway_ends_its_attempt_as_not_sent() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    parts.gateway.fail["items"] = ChargeFailure("circuit_open", "open", True, sent=False)
    # The customer and the draft were sent (and counted); the refused item was not.
    assert parts.pusher.push(line) == PushReport(
        StepResult.WAIT, 0, 2, retry_at=T0 + POLICY.base_delay
    )
    [ended] = parts.push_events(line, LinePush.AttemptEnded)
    assert (ended.attempt, ended.outcome) == (1, "not_sent")
    assert parts.push_events(line, LinePush.PushFailed) == []


# -- failures -----------------------------------------------------------------------------


def test_a_failed_customer_request_records_the_failure_with_its_exact_fields() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    sequence = parts.sequence(line)
    parts.gateway.fail["customer"] = DOWN
    due = T0 + backoff(1, POLICY, 0.5)
    assert parts.pusher.push(line) == PushReport(StepResult.RETRY, sequence, 1, retry_at=due)
    [failed] = parts.push_events(line, LinePush.PushFailed)
    assert (failed.sequence, failed.attempt, failed.error_class, failed.message) == (
        sequence, 1, "http_503", "down",
    )  # fmt: skip
    assert (failed.retryable, failed.next_attempt_at, failed.requests) == (True, due, 1)
    assert parts.push_events(line, LinePush.AttemptStarted) == []  # no amount was sent


def test_a_failed_draft_request_counts_both_requests_and_links_the_customer_once() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    sequence = parts.sequence(line)
    parts.gateway.fail["invoice"] = DOWN
    due = T0 + backoff(1, POLICY, 0.5)
    assert parts.pusher.push(line) == PushReport(StepResult.RETRY, sequence, 2, retry_at=due)
    assert parts.invoice(line).stripe_invoice_id is None
    parts.clock.now = due
    assert parts.pusher.push(line) == PushReport(StepResult.CHARGED, sequence, 2, 1)
    assert parts.gateway.customer_requests == [("acme", False)]


def test_a_retryable_answer_ends_its_attempt_and_a_timeout_leaves_it_in_doubt() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    slow = ChargeFailure("rate_limited", "slow", True, answered=True)
    parts.gateway.fail["items"] = slow
    parts.pusher.push(line)
    [ended] = parts.push_events(line, LinePush.AttemptEnded)
    assert (ended.attempt, ended.outcome) == (1, "answered")
    parts.clock.now = parts.push_of(line).next_attempt_at  # type: ignore[assignment]
    parts.gateway.fail["items"] = ChargeFailure("connection", "timed out", True)
    parts.pusher.push(line)
    assert len(parts.push_events(line, LinePush.AttemptEnded)) == 1
    [_, second] = parts.push_events(line, LinePush.AttemptStarted)
    assert parts.push_of(line).in_doubt_until(parts.clock.now) == second.lands_by


def test_a_permanent_refusal_compensates_the_unpushed_usage_with_stripes_reason() -> None:
    parts = Parts()
    charged = parts.reserve(1, quantity=1000)
    line = parts.line(charged[0])
    parts.pusher.push(line)
    unsent = parts.reserve(2, quantity=1000, prefix="u")
    sequence = parts.sequence(line)
    parts.gateway.fail["items"] = REFUSED
    report = parts.pusher.push(line)
    # the line items learned, the update refused and the draft read: three requests
    assert report == PushReport(StepResult.COMPENSATED, sequence, 3, more=True)
    [ended] = parts.push_events(line, LinePush.AttemptEnded)[1:]
    assert ended.outcome == "answered"
    assert parts.push_of(line).in_doubt_until(T0) is None
    [failed] = parts.push_events(line, LinePush.PushFailed)
    assert (failed.retryable, failed.next_attempt_at, failed.requests) == (False, None, 3)
    assert (failed.error_class, failed.message) == ("http_400", "invalid currency")
    for txn in unsent:
        [compensated] = parts.events(txn, BillingTransaction.Compensated)
        assert compensated.reason == REFUSAL
    account = parts.ledger.account("acme", "USD")
    assert account is not None
    released = parts.events(account.id, CustomerAccount.ReservationReleased)
    assert [r.transaction_id for r in released] == [str(t) for t in unsent]
    assert parts.states(charged + unsent) == [TxnState.CHARGED] + [TxnState.COMPENSATED] * 2


def test_a_refusal_before_any_draft_compensates_without_reading_stripe() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    parts.gateway.fail["customer"] = REFUSED
    report = parts.pusher.push(line)
    assert report == PushReport(StepResult.COMPENSATED, parts.sequence(line) - 1, 1, more=True)
    assert "read" not in parts.gateway.calls
    assert parts.states([txn]) == [TxnState.COMPENSATED]


def test_a_refusal_with_nothing_left_to_compensate_says_no_more() -> None:
    parts = Parts()
    ids = parts.reserve(2, quantity=1000)
    line = parts.line(ids[0])
    parts.pusher.push(line)
    Corrections(parts.ledger, parts.gateway).reverse(ids[0], "customer asked")
    sequence = parts.sequence(line)
    parts.gateway.fail["items"] = REFUSED
    report = parts.pusher.push(line)
    assert report == PushReport(StepResult.COMPENSATED, sequence, 3, more=False)
    assert parts.states(ids) == [TxnState.COMPENSATED, TxnState.CHARGED]


def test_a_refusal_on_a_closed_invoice_records_the_adjustment_on_it() -> None:
    parts = Parts()
    charged = parts.reserve(1, quantity=1000)
    line = parts.line(charged[0])
    parts.pusher.push(line)
    unsent = parts.reserve(2, quantity=1000, prefix="u")
    parts.close(line)
    parts.gateway.fail["items"] = REFUSED
    assert parts.pusher.push(line).result is StepResult.COMPENSATED
    [adjusted] = parts.events(parts.invoice(line).id, Invoice.Adjusted)
    assert (adjusted.line_id, adjusted.transaction_ids, adjusted.reason) == (
        line, [str(t) for t in unsent], REFUSAL,
    )  # fmt: skip
    assert parts.states(unsent) == [TxnState.COMPENSATED] * 2


def test_a_refusal_on_an_invoice_finalized_by_hand_reports_both_requests_and_the_reason() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    parts.pusher.push(line)
    invoice = parts.invoice(line)
    parts.gateway.finalize_invoice("in_1", invoice.id, look_first=False)
    [more] = parts.reserve(1, prefix="b")
    sequence = parts.sequence(line)
    report = parts.pusher.push(line)
    due = T0 + POLICY.max_delay
    # the line items learned, the bulk update refused, the invoice read
    assert report == PushReport(StepResult.DEFERRED, sequence, 3, retry_at=due)
    attention = parts.ledger.invoice_by_id(invoice.id).attention  # type: ignore[union-attr]
    assert attention == (
        f"Stripe refused line {line} (api.requests): http_400: its invoice in_1 is open,"
        " not a draft"
    )
    [failed] = parts.push_events(line, LinePush.PushFailed)
    assert (failed.retryable, failed.next_attempt_at, failed.requests) == (False, due, 3)
    assert parts.states([more]) == [TxnState.RESERVED]


def test_a_refusal_whose_invoice_is_gone_needs_attention_naming_both_answers() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    parts.pusher.push(line)
    parts.reserve(1, prefix="b")
    sequence = parts.sequence(line)
    parts.gateway.fail["items"] = ChargeFailure("http_404", "No such invoiceitem", False)
    parts.gateway.fail["read"] = ChargeFailure("http_404", "No such invoice", False)
    report = parts.pusher.push(line)
    assert report == PushReport(StepResult.DEFERRED, sequence, 3, retry_at=T0 + POLICY.max_delay)
    assert parts.invoice(line).attention == (
        f"Stripe refused line {line} (api.requests): http_404: No such invoiceitem;"
        " and its invoice cannot be read: No such invoice"
    )


def test_a_refusal_whose_invoice_cannot_be_read_now_is_retried_counting_the_read() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    parts.pusher.push(line)
    parts.reserve(1, prefix="b")
    sequence = parts.sequence(line)
    parts.gateway.fail["items"] = REFUSED
    parts.gateway.fail["read"] = DOWN
    report = parts.pusher.push(line)
    due = T0 + backoff(1, POLICY, 0.5)
    assert report == PushReport(StepResult.RETRY, sequence, 3, retry_at=due)
    [failed] = parts.push_events(line, LinePush.PushFailed)
    assert (failed.retryable, failed.requests) == (True, 3)


# -- races --------------------------------------------------------------------------------


def test_a_customer_linked_by_another_pusher_meanwhile_is_used_as_linked() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    parts.gateway.meanwhile["customer"] = lambda: parts.ledger.save(
        CustomerLink(customer_id="acme", stripe_customer_id="cus_acme")
    )
    assert parts.pusher.push(line).result is StepResult.CHARGED
    assert parts.gateway.held(line) == [100]


def test_a_draft_is_recorded_even_when_a_line_joins_its_invoice_meanwhile() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    parts.ledger.before.append(
        (_recording(Invoice.DraftCreated),
         lambda: parts.reserve(1, meter="gpt-4o.input_tokens", prefix="t"))
    )  # fmt: skip
    assert parts.pusher.push(line).result is StepResult.CHARGED
    assert parts.ledger.before == []
    invoice = parts.invoice(line)
    assert (invoice.stripe_invoice_id, invoice.stripe_customer_id) == ("in_1", "cus_acme")
    assert len(invoice.lines) == 2


def test_attention_is_recorded_even_when_a_line_joins_the_invoice_meanwhile() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    parts.pusher.push(line)
    parts.gateway.finalize_invoice("in_1", parts.invoice(line).id, look_first=False)
    parts.reserve(1, prefix="b")
    parts.ledger.before.append(
        (_recording(Invoice.AttentionNeeded),
         lambda: parts.reserve(1, meter="gpt-4o.input_tokens", prefix="t"))
    )  # fmt: skip
    assert parts.pusher.push(line).result is StepResult.DEFERRED
    assert parts.ledger.before == []
    invoice = parts.invoice(line)
    assert invoice.attention is not None and len(invoice.lines) == 2


def test_a_compensation_that_loses_a_race_reloads_and_compensates_what_is_unpushed_then() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    parts.pusher.push(line)
    unsent = parts.reserve(2, quantity=1000, prefix="u")
    meanwhile: list[UUID] = []
    parts.ledger.before.append(
        (_recording(BillingTransaction.Compensated),
         lambda: meanwhile.extend(parts.reserve(1, quantity=1000, prefix="m")))
    )  # fmt: skip
    parts.gateway.fail["items"] = REFUSED
    assert parts.pusher.push(line).more is True
    assert parts.ledger.before == [] and len(meanwhile) == 1
    assert parts.states(unsent + meanwhile) == [TxnState.COMPENSATED] * 3


def test_a_push_that_loses_its_save_to_a_reversal_pushes_again_counting_every_request() -> None:
    parts = Parts()
    ids = parts.reserve(2, quantity=1000)
    line = parts.line(ids[0])
    parts.ledger.before.append(
        (_recording(LinePush.Pushed),
         lambda: Corrections(parts.ledger, parts.gateway).reverse(ids[0], "customer asked"))
    )  # fmt: skip
    report = parts.pusher.push(line)
    # customer, draft and creation; then, reloaded, the creation replayed and the update
    assert report == PushReport(StepResult.CHARGED, parts.sequence(line), 5, 1)
    assert parts.ledger.before == []
    assert parts.gateway.held(line) == [100]
    assert parts.states(ids) == [TxnState.COMPENSATED, TxnState.CHARGED]


def test_a_push_that_loses_every_race_reports_raced_with_the_requests_it_sent() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    parts.pusher.max_races = 2
    parts.ledger.before += [(_recording(LinePush.Pushed), _lose_the_race)] * 2
    # customer, draft and creation; then the creation replayed under its key
    assert parts.pusher.push(line) == PushReport(StepResult.RACED, 0, 4)
    assert parts.states([txn]) == [TxnState.RESERVED]


# -- past the key window ------------------------------------------------------------------


def test_a_creation_retried_at_the_key_window_looks_first_and_its_deadline_counts_the_look() -> (
    None
):
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    parts.gateway.hold("timeout")
    assert parts.pusher.push(line).result is StepResult.RETRY
    parts.gateway.in_flight[0].land()
    window = parts.pusher.key_window
    parts.clock.now = parts.push_of(line).created_on + window
    assert parts.pusher.push(line).result is StepResult.CHARGED
    assert [i.look_first for i in parts.gateway.item_requests] == [False, True]
    [_, started] = parts.push_events(line, LinePush.AttemptStarted)
    # the creation, and the list of the invoice's items before it (two pages counted)
    assert started.lands_by == parts.clock.now + 3 * LANDING.per_call + LANDING.margin
    assert parts.gateway.held(line) == [100] and len(parts.gateway.items) == 1


# -- the invoice of a line ----------------------------------------------------------------


def test_the_invoice_of_a_line_without_one_is_an_illegal_transition_naming_both() -> None:
    parts = Parts()
    period = PeriodPolicy().period_of(T0)
    orphan = InvoiceLine.open("acme", "USD", "api.requests", period)
    parts.ledger.save(orphan)
    with pytest.raises(IllegalTransition) as raised:
        invoice_of(parts.ledger, orphan)
    assert str(raised.value) == f"line {orphan.id} has no invoice {orphan.invoice_id}"


def test_a_compensation_that_loses_every_race_leaves_the_usage_reserved_and_says_no_more() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    parts.pusher.push(line)
    [unsent] = parts.reserve(1, quantity=1000, prefix="u")
    parts.pusher.max_races = 1
    parts.ledger.before.append((_recording(BillingTransaction.Compensated), _lose_the_race))
    parts.gateway.fail["items"] = REFUSED
    report = parts.pusher.push(line)
    assert (report.result, report.more) == (StepResult.COMPENSATED, False)
    assert parts.states([unsent]) == [TxnState.RESERVED]  # the next push tries again


def test_a_push_that_loses_its_save_to_another_pushers_push_reports_nothing_and_its_requests() -> (
    None
):
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    other = LinePusher(parts.ledger, parts.gateway, POLICY, clock=parts.clock, jitter=lambda: 0.5)
    parts.ledger.before.append((_recording(LinePush.Pushed), lambda: other.push(line)))
    sequence = parts.sequence(line)
    assert parts.pusher.push(line) == PushReport(StepResult.NOTHING, sequence, 3)
    assert parts.ledger.before == []
    assert len(parts.events(txn, BillingTransaction.Charged)) == 1


def test_a_push_that_loses_its_save_to_another_pushers_failure_waits_counting_its_requests() -> (
    None
):
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1000)
    line = parts.line(txn)
    other = LinePusher(parts.ledger, parts.gateway, POLICY, clock=parts.clock, jitter=lambda: 0.5)

    def other_fails() -> None:
        parts.gateway.fail["items"] = DOWN
        other.push(line)

    parts.ledger.before.append((_recording(LinePush.Pushed), other_fails))
    due = T0 + backoff(1, POLICY, 0.5)
    assert parts.pusher.push(line) == PushReport(StepResult.WAIT, 0, 3, retry_at=due)
    assert parts.ledger.before == []


def test_a_draft_refused_unsent_still_counts_the_customer_request_sent_before_it() -> None:
    parts = Parts()
    [txn] = parts.reserve(1, quantity=1_000_000_000)  # 1,000,000.00: two Stripe items
    line = parts.line(txn)
    plan = plan_push(parts.ledger.line_by_id(line), LinePush(line_id=line))
    assert plan is not None and plan.calls == 2
    parts.gateway.fail["invoice"] = ChargeFailure("throttled", "saturated", True, sent=False)
    report = parts.pusher.push(line)
    assert report.result is StepResult.WAIT
    assert parts.gateway.customer_requests == [("acme", False)]  # the customer was sent
    assert report.requests == 1  # ... and counted
