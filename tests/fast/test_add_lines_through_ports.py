"""A draft's new lines made together, through the ports: the first push of a line whose
invoice has other new lines creates every one's items in one ``add_lines`` request,
each line's items planned, the batch and each one's attempt recorded in one save before
the request; a retry (after a crash, a lost answer, a retryable failure) sends the same
recorded set under the same key, so nothing is made twice; a refusal on a draft makes
each line on its own and compensates none; our breaker refusing it starts no backoff."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from uuid import UUID

import pytest

from adapters.charging.pusher import LinePusher
from domain.ports import AddedItems, LinesAdd
from domain.saga import ChargeFailure, StepResult
from domain.transaction import TxnState
from store.ledger import BillingLedger
from tests.fast.fakes import T0, Clock, FakeGateway, memory_ledger
from tests.fast.test_invoice_push_through_ports import METERS, POLICY, REFUSED, Invoice

DOWN = ChargeFailure("http_500", "down", retryable=True)


class Crash(Exception):
    """The process died: nothing after it ran."""


class Recording(FakeGateway):
    """The fake Stripe, remembering every ``add_lines`` request; ``crash`` makes the next
    one die before it is sent (the process stops between the save and the call);
    ``add_failures`` answer the next ``add_lines`` requests (executing nothing)."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock=clock)
        self.adds: list[LinesAdd] = []
        self.add_failures: list[ChargeFailure] = []
        self.crash = False

    def add_lines(self, add: LinesAdd) -> AddedItems | ChargeFailure:
        if self.crash:
            self.crash = False
            raise Crash
        self.adds.append(add)
        if self.add_failures:
            self.calls.append("add_lines")
            return self.add_failures.pop(0)
        return super().add_lines(add)


class Draft(Invoice):
    """One customer's draft with three new lines (one per meter), none pushed yet (the
    helpers are those of the invoice whose lines are pushed together)."""

    def __init__(self) -> None:  # not the pushed invoice's: nothing is pushed here
        self.clock = Clock(T0)
        self.gateway = Recording(self.clock)
        self.ledger: BillingLedger = memory_ledger()
        self.pusher = LinePusher(
            self.ledger, self.gateway, POLICY, clock=self.clock, jitter=lambda: 0.5
        )
        self.txns: list[UUID] = []
        self.lines = [self.line(self.more(meter, "a")[0]) for meter in METERS]

    def items_of(self, line: UUID) -> list[str]:
        return [k for k, i in self.gateway.items.items() if i["line"] == line]

    def one_item_each(self) -> bool:
        return all(len(self.items_of(line)) == 1 for line in self.lines)


def test_a_drafts_new_lines_are_made_by_one_request_each_recording_its_push() -> None:
    d = Draft()
    first, *others = d.lines
    report = d.pusher.push(first)
    assert report.result is StepResult.CHARGED
    assert d.gateway.calls == ["customer", "invoice", "add_lines"]
    assert report.requests == 3 and set(report.lines) == set(others)
    (add,) = d.gateway.adds
    assert {a.line_id for a in add.adds} == set(d.lines)
    for a in add.adds:  # each line's one item: its total at its sequence, its period's
        line = d.ledger.line_by_id(a.line_id)
        assert (a.meter, a.period) == (line.meter, str(line.period))
        assert a.items == ((0, line.sequence, line.billed),)
    for line in d.lines:
        push = d.push_of(line)
        assert push.pushed_sequence == d.ledger.line_by_id(line).sequence
        assert push.item_ids == d.items_of(line)
        assert push.charged_through == push.pushed_sequence
        assert push.in_doubt_until(T0) is None  # its attempt was answered
        assert push.line_item_ids() == [d.gateway.items[push.item_ids[0]]["il"]]
    assert d.states() == {TxnState.CHARGED} and d.held_equal_billed() and d.one_item_each()
    assert [d.pusher.push(line).requests for line in others] == [0, 0]  # nothing left
    for meter in METERS:
        d.more(meter, "b")
    report = d.pusher.push(others[0])
    # The line items came with the answer: no list of the draft's lines before the update.
    assert report.requests == 1 and d.gateway.calls[3:] == ["update_lines"]
    assert d.states() == {TxnState.CHARGED} and d.held_equal_billed()


def test_the_batch_is_recorded_before_the_call_and_a_retry_after_a_crash_sends_the_same_set() -> (
    None
):
    d = Draft()
    first, second, third = d.lines
    d.gateway.crash = True
    with pytest.raises(Crash):
        d.pusher.push(first)
    assert d.gateway.adds == [] and d.gateway.items == {}  # never reached Stripe
    for line in d.lines:  # recorded in one save, before the call
        push = d.push_of(line)
        assert len(push.planned) == 1 and push.in_doubt_until(T0) is not None
        assert sorted(u for u, _ in push.batched() or []) == sorted(d.lines)
    # Meanwhile: a fourth new line, and more usage on the first.
    late = d.line(d.more("gpu.a100.seconds", "late")[0])
    d.more(METERS[0], "b")
    d.clock.now = T0 + timedelta(minutes=5)
    report = d.pusher.push(second)  # another line of the batch retries it
    assert report.result is StepResult.CHARGED
    # Both others were set by the request: their intervals run from it, `first` too
    # though it changed meanwhile (its newer total waits its interval, like any line's).
    assert set(report.lines) == {first, third}
    (add,) = d.gateway.adds
    assert {a.line_id for a in add.adds} == set(d.lines)  # the recorded set, not `late`
    assert add.key == LinesAdd(add.invoice_id, "", "", "", add.adds, look_first=False).key
    assert d.one_item_each() and d.items_of(late) == []
    planned = d.push_of(first)
    assert planned.pushed_sequence < d.ledger.line_by_id(first).sequence  # its planned total
    assert d.pusher.push(first).result is StepResult.CHARGED  # then the new one, set
    assert d.pusher.push(late).result is StepResult.CHARGED  # alone: made on its own
    assert d.gateway.calls[-1] == "item"
    assert d.states() == {TxnState.CHARGED} and d.held_equal_billed() and d.one_item_each()


def test_a_lost_answer_is_retried_under_the_same_key_and_replayed() -> None:
    d = Draft()
    d.gateway.hold("timeout")  # Stripe has it; the client gives up; it lands later
    report = d.pusher.push(d.lines[0])
    assert report.result is StepResult.RETRY
    d.gateway.in_flight[0].land()
    d.clock.now = report.retry_at or T0
    again = d.pusher.push(d.lines[2])
    assert again.result is StepResult.CHARGED
    first, retry = d.gateway.adds
    assert retry.key == first.key and retry.adds == first.adds
    assert d.gateway.executed.count(first.key) == 1  # replayed, not made again
    assert d.one_item_each() and d.states() == {TxnState.CHARGED} and d.held_equal_billed()


def test_a_retry_past_the_key_window_looks_first_and_makes_nothing_twice() -> None:
    d = Draft()
    d.gateway.hold("timeout")
    d.pusher.push(d.lines[0])
    d.gateway.in_flight[0].land()  # made; its answer lost
    d.clock.now = T0 + timedelta(hours=25)  # Stripe forgot the key
    report = d.pusher.push(d.lines[1])
    assert report.result is StepResult.CHARGED
    assert d.gateway.adds[-1].look_first
    assert d.one_item_each() and d.states() == {TxnState.CHARGED} and d.held_equal_billed()


def test_a_refusal_of_the_new_lines_on_a_draft_makes_each_on_its_own_compensating_none() -> None:
    d = Draft()
    d.gateway.add_failures = [REFUSED]
    report = d.pusher.push(d.lines[0])
    assert report.result is StepResult.CHARGED  # then made on its own
    assert d.gateway.calls[2:] == ["add_lines", "read", "item"]
    for line in d.lines:
        assert d.push_of(line).batched() is None  # the batch is left by every line
    for line in d.lines[1:]:
        assert d.pusher.push(line).result is StepResult.CHARGED
        assert d.gateway.calls[-1] == "item"
    assert TxnState.COMPENSATED not in d.states()
    assert d.states() == {TxnState.CHARGED} and d.held_equal_billed() and d.one_item_each()


def test_new_lines_refused_by_an_invoice_finalized_by_hand_compensate_nothing() -> None:
    d = Draft()
    alone = d.line(d.more("gpu.a100.seconds", "x")[0])
    d.gateway.crash = True  # the first push's batch: record it, then stop
    with pytest.raises(Crash):
        d.pusher.push(alone)
    invoice = d.ledger.invoice_by_id(d.ledger.line_by_id(alone).invoice_id)
    assert invoice is not None and invoice.stripe_invoice_id is not None
    d.gateway.finalize_invoice(invoice.stripe_invoice_id, invoice.id, look_first=False)
    report = d.pusher.push(alone)
    assert report.result is StepResult.DEFERRED
    assert TxnState.COMPENSATED not in d.states()
    reloaded = d.ledger.invoice_by_id(invoice.id)
    assert reloaded is not None and reloaded.attention is not None
    for line in [*d.lines, alone]:
        assert d.push_of(line).next_attempt_at is not None  # each waits, none abandoned


def test_a_retryable_failure_backs_off_every_line_of_the_request() -> None:
    d = Draft()
    d.gateway.add_failures = [DOWN]
    report = d.pusher.push(d.lines[0])
    assert report.result is StepResult.RETRY and set(report.lines) == set(d.lines[1:])
    for line in d.lines:
        push = d.push_of(line)
        assert push.attempts == 1 and push.last_error is not None
        assert push.next_attempt_at is not None and push.next_attempt_at > T0
    assert d.pusher.push(d.lines[1]).result is StepResult.WAIT  # backing off
    d.clock.now = report.retry_at or T0
    assert d.pusher.push(d.lines[1]).result is StepResult.CHARGED
    failed, retry = d.gateway.adds
    assert retry.key == failed.key and retry.adds == failed.adds
    assert d.one_item_each() and d.states() == {TxnState.CHARGED} and d.held_equal_billed()


def test_our_breaker_refusing_the_request_is_no_attempt_and_no_backoff() -> None:
    d = Draft()
    d.gateway.add_failures = [ChargeFailure("circuit_open", "open", retryable=True, sent=False)]
    report = d.pusher.push(d.lines[0])
    assert report.result is StepResult.WAIT
    for line in d.lines:
        push = d.push_of(line)
        assert push.next_attempt_at is None and push.attempts == 0
        assert push.in_doubt_until(T0) is None  # ended: not sent
    assert d.pusher.push(d.lines[0]).result is StepResult.CHARGED
    assert d.one_item_each() and d.held_equal_billed()


def test_the_fake_is_no_kinder_than_stripe_to_a_reused_key_or_a_final_invoice() -> None:
    d = Draft()
    d.pusher.push(d.lines[0])
    (add,) = d.gateway.adds
    other = replace(add, currency="EUR")  # the same key, other parameters
    assert other.key == add.key
    refused = d.gateway.add_lines(other)
    assert isinstance(refused, ChargeFailure) and not refused.retryable
    assert "idempotency" in refused.message
    assert d.gateway.add_lines(add) == d.gateway.add_lines(add)  # replayed
    invoice = d.ledger.invoice_by_id(d.ledger.line_by_id(d.lines[0]).invoice_id)
    assert invoice is not None
    d.gateway.finalize_invoice(add.stripe_invoice_id, invoice.id, look_first=False)
    late = replace(add, adds=(replace(add.adds[0], items=((1, 9, 100),)),))
    final = d.gateway.add_lines(late)
    assert isinstance(final, ChargeFailure) and "not a draft" in final.message
    assert d.one_item_each()
