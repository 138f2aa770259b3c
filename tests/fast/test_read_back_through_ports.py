"""Stripe never keeps an amount the ledger did not decide: the races that made Stripe
hold a stale amount, each made deterministic through the ports (the in-memory ledger,
the fake Stripe holding one request until the test lands it), and what the closer
does about them: it waits until no request can still land, reads the draft back,
repairs the drift under a key of its own, and only then finalizes.

Before the read-back each of these finalized the stale amount and recorded it as
the ledger's: ``Finalized`` with Stripe's 200 against an expected 300.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from uuid import UUID

import pytest
from eventsourcing.persistence import IntegrityError

from adapters.charging.closer import MAX_REPAIRS, CloseResult, InvoiceCloser
from adapters.charging.corrections import Corrections
from adapters.charging.drafts import CheckResult, DraftChecker
from adapters.charging.pusher import LinePusher, PushReport
from domain.errors import IllegalTransition
from domain.invoice import Invoice
from domain.invoice_line import LinePush
from domain.invoice_states import InvoiceState
from domain.periods import PeriodPolicy
from domain.pushing import push_key
from domain.saga import ChargeFailure, RetryPolicy, StepResult, backoff
from domain.transaction import TxnState
from domain.verification import LandingWindow
from tests.fast.fakes import T0, Clock, FakeGateway, memory_ledger, reserve

POLICY = RetryPolicy(horizon=timedelta(hours=1))
GRACE = timedelta(hours=1)
AFTER_DEADLINE = PeriodPolicy().period_of(T0).end + GRACE
LANDING = LandingWindow(per_call=timedelta(seconds=30), margin=timedelta(seconds=30))


class Parts:
    """Two pushers of one ledger and one Stripe (two processes, or a restart), a closer."""

    def __init__(self) -> None:
        self.ledger = memory_ledger()
        self.gateway = FakeGateway()
        # At the period's close deadline: the pushes of each race happen just before the
        # close, as the final pushes of a period do.
        self.clock = Clock(AFTER_DEADLINE)
        self.a, self.b = (self._pusher(), self._pusher())
        self.closer = InvoiceCloser(
            self.ledger, self.gateway, lambda line, _: self.b.push(line), POLICY, GRACE,
            clock=self.clock,
            jitter=lambda: 0.5, landing=LANDING,
        )  # fmt: skip

    def _pusher(self) -> LinePusher:
        return LinePusher(
            self.ledger, self.gateway, POLICY, clock=self.clock, jitter=lambda: 0.5, landing=LANDING
        )

    def one_pushed(self) -> tuple[UUID, UUID, Invoice]:
        """One record (100) reserved and pushed by A: its transaction, line and invoice."""
        [first] = reserve(self.ledger, 1, prefix="a")
        line = self.line(first)
        self.a.push(line)
        return first, line, self.invoice(line)

    def line(self, txn: UUID) -> UUID:
        line = self.ledger.transaction(txn).line_id
        assert line is not None
        return line

    def invoice(self, line: UUID) -> Invoice:
        found = self.ledger.invoice_by_id(self.ledger.line_by_id(line).invoice_id)
        assert found is not None
        return found

    def in_background(
        self, pusher: LinePusher, line: UUID
    ) -> tuple[threading.Thread, list[PushReport]]:
        """``pusher.push(line)`` on a thread that stays in Stripe until the test lands it."""
        reports: list[PushReport] = []
        thread = threading.Thread(target=lambda: reports.append(pusher.push(line)))
        self.gateway.hold("block")
        thread.start()
        _until(lambda: bool(self.gateway.in_flight))
        return thread, reports

    def close_until_done(self, limit: int = 10) -> list[CloseResult]:
        """Step the closer, moving the clock to each due time, until it is done."""
        results = []
        for _ in range(limit):
            step = self.closer.step(self.invoice_of_line.id)
            results.append(step.result)
            if step.result in (CloseResult.DONE, CloseResult.ATTENTION):
                return results
            if step.retry_at is not None:
                self.clock.now = max(self.clock.now, step.retry_at)
        return results

    invoice_of_line: Invoice


def _until(condition, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    done = threading.Event()
    deadline = threading.Timer(timeout, done.set)
    deadline.start()
    try:
        while not condition():
            assert not done.wait(0.001), "condition not met in time"
    finally:
        deadline.cancel()


def _events(ledger, invoice_id: UUID, kind: type) -> list:  # type: ignore[no-untyped-def]
    return [e for e in ledger.events.get(invoice_id) if isinstance(e, kind)]


def _stale_push_landed_after_a_newer_one(parts: Parts) -> UUID:
    """Line at 100 in Stripe; A sends 200 and is slow; the line reaches 300 and B pushes
    it; then A's request lands: Stripe holds 200 where the ledger says 300."""
    [first] = reserve(parts.ledger, 1, prefix="a")  # 100 (1,000 requests at 0.1 cent)
    line = parts.line(first)
    assert parts.b.push(line).result is StepResult.CHARGED
    reserve(parts.ledger, 1, prefix="b")  # 200
    thread, reports = parts.in_background(parts.a, line)
    reserve(parts.ledger, 1, prefix="c")  # 300
    assert parts.b.push(line).result is StepResult.CHARGED
    parts.gateway.in_flight[0].land()  # A's 200 lands after B's 300
    thread.join(5)
    assert reports and reports[0].result is StepResult.NOTHING  # A lost the race to record
    assert parts.gateway.held(line) == [200]
    assert parts.ledger.line_by_id(line).billed == 300
    return line


def test_a_stale_push_landing_after_a_newer_one_is_read_back_repaired_then_finalized() -> None:
    parts = Parts()
    line = _stale_push_landed_after_a_newer_one(parts)
    parts.invoice_of_line = parts.invoice(line)
    parts.clock.now = AFTER_DEADLINE
    # A's request was answered, but its answer was never recorded: it counts as able to
    # land until its deadline, and the closer reads the draft only after that.
    assert parts.closer.step(parts.invoice_of_line.id).result is CloseResult.WAITING  # closed
    first = parts.closer.step(parts.invoice_of_line.id)
    assert first.result is CloseResult.WAITING and first.retry_at is not None
    assert first.retry_at == AFTER_DEADLINE + LANDING.per_call + LANDING.margin
    parts.clock.now = first.retry_at - timedelta(microseconds=1)
    assert parts.closer.step(parts.invoice_of_line.id).result is CloseResult.WAITING
    assert "read" not in parts.gateway.calls

    assert parts.close_until_done()[-1] is CloseResult.DONE
    final = parts.ledger.invoice_by_id(parts.invoice_of_line.id)
    assert final is not None and final.state is InvoiceState.FINALIZED
    assert (final.expected_total, final.total, final.mismatch) == (300, 300, None)
    assert parts.gateway.held(line) == [300]
    [drift] = _events(parts.ledger, final.id, Invoice.DriftFound)
    [[line_id, chunk, sequence, _item, expected, found]] = drift.drifts
    assert (UUID(line_id), chunk, int(expected), int(found)) == (line, "0", 300, 200)
    assert int(sequence) == parts.ledger.line_by_id(line).sequence
    assert len(_events(parts.ledger, final.id, Invoice.Repaired)) == 1
    assert len(_events(parts.ledger, final.id, Invoice.Verified)) == 1
    # the repair went under a key of its own, not the sequence's
    assert any(k.startswith(f"line-repair:{line}:0:") for k in parts.gateway.repair_keys)


def test_a_reversal_racing_a_push_never_leaves_the_reversed_amount_in_stripe() -> None:
    parts = Parts()
    ids = reserve(parts.ledger, 2, prefix="a")  # 200
    line = parts.line(ids[0])
    assert parts.b.push(line).result is StepResult.CHARGED
    reserve(parts.ledger, 1, prefix="b")  # 300: A sends it, slowly
    thread, _ = parts.in_background(parts.a, line)
    corrections = Corrections(parts.ledger, parts.gateway, clock=parts.clock)
    assert corrections.reverse(ids[0], "customer disputed") is StepResult.REVERSED
    assert parts.b.push(line).result in (StepResult.CHARGED, StepResult.NOTHING)
    assert parts.ledger.line_by_id(line).billed == 200
    parts.gateway.in_flight[0].land()  # A's 300 lands after the reversal's 200
    thread.join(5)
    assert parts.gateway.held(line) == [300]
    assert parts.ledger.transaction(ids[0]).state is TxnState.COMPENSATED

    parts.invoice_of_line = parts.invoice(line)
    parts.clock.now = AFTER_DEADLINE
    assert parts.close_until_done()[-1] is CloseResult.DONE
    final = parts.ledger.invoice_by_id(parts.invoice_of_line.id)
    assert final is not None
    assert (final.expected_total, final.total) == (200, 200)
    assert parts.gateway.held(line) == [200]


def test_one_pusher_whose_request_lands_after_its_retry_is_repaired_before_finalizing() -> None:
    parts = Parts()
    [first] = reserve(parts.ledger, 1, prefix="a")
    line = parts.line(first)
    assert parts.a.push(line).result is StepResult.CHARGED  # 100
    reserve(parts.ledger, 1, prefix="b")  # 200
    parts.gateway.hold("timeout")  # the client gives up; Stripe executes it later
    report = parts.a.push(line)
    assert report.result is StepResult.RETRY and report.retry_at is not None
    push = parts.ledger.line_push(line)
    assert push is not None and push.in_doubt_until(parts.clock.now) is not None
    reserve(parts.ledger, 1, prefix="c")  # 300
    parts.clock.now = report.retry_at
    assert parts.a.push(line).result is StepResult.CHARGED  # 300, acknowledged
    parts.gateway.in_flight[0].land()  # the first request lands now: 200
    assert parts.gateway.held(line) == [200]

    parts.invoice_of_line = parts.invoice(line)
    parts.clock.now = AFTER_DEADLINE
    results = parts.close_until_done()
    assert CloseResult.WAITING in results and results[-1] is CloseResult.DONE
    final = parts.ledger.invoice_by_id(parts.invoice_of_line.id)
    assert final is not None and (final.expected_total, final.total) == (300, 300)


def test_a_late_push_between_finalize_started_and_the_finalize_call_is_waited_for() -> None:
    parts = Parts()
    [first] = reserve(parts.ledger, 1, prefix="a")
    line = parts.line(first)
    assert parts.b.push(line).result is StepResult.CHARGED  # 100
    reserve(parts.ledger, 1, prefix="b")  # 200, sent by A, slowly
    thread, _ = parts.in_background(parts.a, line)
    reserve(parts.ledger, 1, prefix="c")  # 300
    assert parts.b.push(line).result is StepResult.CHARGED
    invoice = parts.invoice(line)
    parts.clock.now = AFTER_DEADLINE
    parts.closer.step(invoice.id)  # closed (the frozen lines handed over and pushed)
    step = parts.closer.step(invoice.id)  # every line pushed: finalizing, sealed
    finalizing = parts.ledger.invoice_by_id(invoice.id)
    assert finalizing is not None and finalizing.state is InvoiceState.FINALIZING
    assert step.result is CloseResult.WAITING  # A's request may still land
    push = parts.ledger.line_push(line)
    assert push is not None and push.sealed

    parts.gateway.in_flight[0].land()  # ... and it does, after FinalizeStarted
    thread.join(5)
    assert parts.gateway.held(line) == [200]
    assert "finalize" not in parts.gateway.calls
    parts.invoice_of_line = invoice
    assert parts.close_until_done()[-1] is CloseResult.DONE
    final = parts.ledger.invoice_by_id(invoice.id)
    assert final is not None and (final.expected_total, final.total) == (300, 300)


def test_a_sealed_push_starts_no_attempt_and_no_pusher_sends_after_the_seal() -> None:
    parts = Parts()
    [first] = reserve(parts.ledger, 1, prefix="a")
    line = parts.line(first)
    parts.a.push(line)
    push = parts.ledger.line_push(line)
    assert push is not None
    push.seal(parts.invoice(line).id)
    with pytest.raises(IllegalTransition):
        push.start_attempt(push.pushed_sequence + 1, AFTER_DEADLINE, AFTER_DEADLINE)


def test_a_request_answered_at_once_leaves_nothing_in_doubt() -> None:
    parts = Parts()
    [first] = reserve(parts.ledger, 1, prefix="a")
    line = parts.line(first)
    assert parts.a.push(line).result is StepResult.CHARGED
    push = parts.ledger.line_push(line)
    assert push is not None and push.in_doubt_until(parts.clock.now) is None
    assert push.attempts_started == 1
    parts.invoice_of_line = parts.invoice(line)
    parts.clock.now = AFTER_DEADLINE
    # closed (lines handed over), then finalizing, verified and finalized with no wait
    assert parts.close_until_done() == [CloseResult.WAITING, CloseResult.DONE]
    assert parts.gateway.calls.count("read") == 1


def test_a_draft_holding_an_item_the_ledger_did_not_make_needs_attention_not_finalizing() -> None:
    parts = Parts()
    _first, _line, invoice = parts.one_pushed()
    stripe_invoice = invoice.stripe_invoice_id
    parts.gateway.items["ii_by_hand"] = {"amount": 999, "line": None, "invoice": stripe_invoice}
    parts.invoice_of_line = invoice
    parts.clock.now = AFTER_DEADLINE
    assert parts.close_until_done()[-1] is CloseResult.ATTENTION
    stopped = parts.ledger.invoice_by_id(invoice.id)
    assert stopped is not None and stopped.state is InvoiceState.FINALIZING
    assert stopped.attention is not None and "ii_by_hand (9.99 USD)" in stopped.attention
    assert "finalize" not in parts.gateway.calls
    assert parts.closer.step(invoice.id).result is CloseResult.ATTENTION  # stays stopped

    del parts.gateway.items["ii_by_hand"]  # the operator removed it in the dashboard
    stopped.settle_attention("removed the hand-made item ii_by_hand", "ops@example.com")
    parts.ledger.save(stopped)
    assert parts.close_until_done()[-1] is CloseResult.DONE
    final = parts.ledger.invoice_by_id(invoice.id)
    assert final is not None and (final.state, final.total) == (InvoiceState.FINALIZED, 100)


def test_a_total_changed_by_hand_after_verifying_is_a_recorded_mismatch_not_a_silent_finalize() -> (
    None
):
    parts = Parts()
    _first, _line, invoice = parts.one_pushed()
    parts.clock.now = AFTER_DEADLINE
    parts.closer.verify = True
    # closed, finalizing and verified; then the item is edited before the finalize call
    original = parts.gateway.finalize_invoice
    item = next(iter(parts.gateway.items))

    def edited_then_finalized(*args, **kwargs):  # type: ignore[no-untyped-def]
        parts.gateway.items[item]["amount"] = 150
        return original(*args, **kwargs)

    parts.gateway.finalize_invoice = edited_then_finalized  # type: ignore[method-assign]
    parts.invoice_of_line = invoice
    parts.close_until_done()
    final = parts.ledger.invoice_by_id(invoice.id)
    assert final is not None and final.state is InvoiceState.FINALIZED
    assert final.mismatch == (100, 150)
    assert final.attention == "Stripe finalized 1.50 USD where the ledger expected 1.00 USD"
    assert len(_events(parts.ledger, invoice.id, Invoice.MismatchFound)) == 1


def test_a_refusal_on_an_invoice_finalized_by_hand_keeps_the_usage_and_needs_attention() -> None:
    parts = Parts()
    _first, line, invoice = parts.one_pushed()
    assert invoice.stripe_invoice_id is not None
    parts.gateway.finalize_invoice(invoice.stripe_invoice_id, invoice.id, look_first=False)
    [more] = reserve(parts.ledger, 1, prefix="b")
    parts.gateway.failures.append(
        ChargeFailure("http_400", "This invoice is no longer editable", retryable=False)
    )
    report = parts.a.push(line)
    assert report.result is StepResult.DEFERRED
    assert parts.ledger.transaction(more).state is TxnState.RESERVED  # never compensated
    assert parts.ledger.line_by_id(line).billed == 200
    kept = parts.ledger.invoice_by_id(invoice.id)
    assert kept is not None and kept.attention is not None
    assert "is open, not a draft" in kept.attention
    push = parts.ledger.line_push(line)
    assert push is not None and push.next_attempt_at == parts.clock.now + POLICY.max_delay


def test_a_call_our_own_open_breaker_refuses_is_no_attempt_and_raises_no_backoff() -> None:
    parts = Parts()
    [first] = reserve(parts.ledger, 1, prefix="a")
    line = parts.line(first)
    parts.a.push(line)
    reserve(parts.ledger, 1, prefix="l")
    parts.a.push(line)  # the draft's line items learned: later calls are the update's
    reserve(parts.ledger, 1, prefix="b")
    parts.gateway.breaker = "open"
    calls = len(parts.gateway.calls)
    for _ in range(5):
        report = parts.a.push(line)
        assert report.result is StepResult.WAIT
        assert report.retry_at == parts.clock.now + POLICY.base_delay
    push = parts.ledger.line_push(line)
    assert push is not None and (push.attempts, push.attempts_started) == (0, 2)
    assert len(parts.gateway.calls) == calls
    # refused inside the gateway (the breaker opened meanwhile): ended, not counted
    parts.gateway.breaker = "closed"
    parts.gateway.failures.append(ChargeFailure("circuit_open", "open", retryable=True, sent=False))
    assert parts.a.push(line).result is StepResult.WAIT
    push = parts.ledger.line_push(line)
    assert push is not None and (push.attempts, push.attempts_started) == (0, 3)
    assert push.in_doubt_until(parts.clock.now) is None
    assert parts.a.push(line).result is StepResult.CHARGED


def test_an_open_drafts_drift_is_found_between_closes_and_set_again_by_the_lines_own_push() -> None:
    parts = Parts()
    line = _stale_push_landed_after_a_newer_one(parts)  # Stripe 200, the ledger 300
    handed: list[UUID] = []
    checker = DraftChecker(
        parts.ledger, parts.gateway, lambda line, _: handed.append(line), clock=parts.clock
    )
    invoice = parts.invoice(line)
    assert checker.check(invoice.id) is CheckResult.SKIPPED  # A's request may still land
    assert "read" not in parts.gateway.calls
    parts.clock.now += LANDING.per_call + LANDING.margin
    assert checker.check(invoice.id) is CheckResult.DRIFT
    assert handed == [line]
    push = parts.ledger.line_push(line)
    assert push is not None and push.drifted and push.repairs == 1
    [drift] = [e for e in parts.ledger.events.get(push.id) if isinstance(e, LinePush.DriftFound)]
    assert drift.found == [200]
    assert checker.check(invoice.id) is CheckResult.SKIPPED  # its repair is not pushed yet

    report = parts.b.push(line)  # the owner's push: every item set again, a repair key
    assert report.result is StepResult.CHARGED and report.requests == 1
    assert parts.gateway.held(line) == [300]
    repaired = parts.ledger.line_push(line)
    assert repaired is not None and not repaired.drifted
    assert checker.check(invoice.id) is CheckResult.EQUAL
    checked = _events(parts.ledger, invoice.id, Invoice.DraftChecked)
    assert [c.drifted for c in checked] == [[str(line)], []]
    assert parts.ledger.invoice_by_id(invoice.id).state is InvoiceState.OPEN  # type: ignore[union-attr]


def test_an_open_draft_finalized_by_hand_needs_attention_when_checked() -> None:
    parts = Parts()
    _first, _line, invoice = parts.one_pushed()
    assert invoice.stripe_invoice_id is not None
    parts.gateway.finalize_invoice(invoice.stripe_invoice_id, invoice.id, look_first=False)
    checker = DraftChecker(parts.ledger, parts.gateway, lambda *_: None, clock=parts.clock)
    assert checker.check(invoice.id) is CheckResult.ATTENTION
    stopped = parts.ledger.invoice_by_id(invoice.id)
    assert stopped is not None and stopped.attention is not None
    assert "is open, not a draft" in stopped.attention
    assert checker.check(invoice.id) is CheckResult.SKIPPED  # stopped: an operator's now


def test_a_repair_push_goes_under_a_key_of_its_own() -> None:
    assert push_key("L", 0, 7) == "line-push:L:0:7"
    assert push_key("L", 0, 7, repair=2) == "line-push:L:0:7:r2"


def _refused_on_a_hand_finalized_invoice(parts: Parts) -> tuple[UUID, UUID, Invoice]:
    [first] = reserve(parts.ledger, 1, prefix="a")
    line = parts.line(first)
    parts.a.push(line)
    invoice = parts.invoice(line)
    assert invoice.stripe_invoice_id is not None
    parts.gateway.finalize_invoice(invoice.stripe_invoice_id, invoice.id, look_first=False)
    [more] = reserve(parts.ledger, 1, prefix="b")
    return line, more, invoice


def test_attention_the_pusher_recorded_stops_the_closer_after_closing() -> None:
    parts = Parts()
    line, more, invoice = _refused_on_a_hand_finalized_invoice(parts)
    report = parts.a.push(line)  # the strict Stripe refuses: its invoice is not a draft
    assert report.result is StepResult.DEFERRED
    assert report.retry_at == parts.clock.now + POLICY.max_delay
    step = parts.closer.step(invoice.id)
    assert step.result is CloseResult.ATTENTION
    stopped = parts.ledger.invoice_by_id(invoice.id)
    assert stopped is not None and stopped.state is InvoiceState.CLOSED
    assert parts.ledger.transaction(more).state is TxnState.RESERVED
    assert parts.gateway.calls.count("finalize") == 1  # the test's own, by hand


@pytest.mark.parametrize(("retryable", "kept"), [(True, False), (False, True)])
def test_a_refusal_whose_invoice_cannot_be_read_is_never_compensated(
    retryable: bool, kept: bool
) -> None:
    parts = Parts()
    [first] = reserve(parts.ledger, 1, prefix="a")
    line = parts.line(first)
    parts.a.push(line)
    reserve(parts.ledger, 1, prefix="l")
    parts.a.push(line)  # the draft's line items learned: the next failure is the update's
    [more] = reserve(parts.ledger, 1, prefix="b")
    parts.gateway.failures += [
        ChargeFailure("http_404", "No such invoiceitem", retryable=False),
        ChargeFailure("http_503" if retryable else "http_404", "no invoice", retryable),
    ]
    report = parts.a.push(line)
    assert parts.ledger.transaction(more).state is TxnState.RESERVED
    invoice = parts.ledger.invoice_by_id(parts.invoice(line).id)
    assert invoice is not None
    if kept:  # deleted in the dashboard, say: an operator's
        assert report.result is StepResult.DEFERRED
        assert invoice.attention is not None and "cannot be read" in invoice.attention
    else:  # Stripe could not answer now: retried after the ordinary backoff
        assert report.result is StepResult.RETRY
        assert report.retry_at == parts.clock.now + backoff(1, POLICY, 0.5)
        assert invoice.attention is None


def test_a_repair_whose_answer_is_lost_is_waited_for_before_reading_again() -> None:
    parts = Parts()
    line = _stale_push_landed_after_a_newer_one(parts)
    invoice = parts.invoice(line)
    parts.clock.now += LANDING.per_call + LANDING.margin  # A's request can no longer land
    parts.closer.step(invoice.id)  # closed, lines pushed
    repair = parts.gateway.repair_items
    lost: list[object] = []

    def answer_lost(repairs):  # type: ignore[no-untyped-def]
        if lost:
            return repair(repairs)
        lost.append(repairs)  # Stripe may apply it later; the answer never comes back
        return ChargeFailure("connection", "reset", retryable=True)

    parts.gateway.repair_items = answer_lost  # type: ignore[method-assign]
    results = []
    for _ in range(3):
        results.append(parts.closer.step(invoice.id))
        if results[-1].result is CloseResult.FAILED:
            break
    failing = parts.ledger.invoice_by_id(invoice.id)
    assert failing is not None and failing.repair_lands_by is not None
    assert failing.repairs == 1
    assert failing.state is InvoiceState.FINALIZING
    # The repair may still land: no read before its deadline, even once the retry is due.
    parts.clock.now = results[-1].retry_at  # type: ignore[assignment]
    step = parts.closer.step(invoice.id)
    assert step.result is CloseResult.WAITING and step.retry_at == failing.repair_lands_by
    parts.invoice_of_line = invoice
    assert parts.close_until_done()[-1] is CloseResult.DONE
    final = parts.ledger.invoice_by_id(invoice.id)
    assert final is not None and final.total == final.expected_total == 300


def test_drift_that_repairs_do_not_remove_stops_the_invoice_after_max_repairs() -> None:
    parts = Parts()
    line = _stale_push_landed_after_a_newer_one(parts)
    invoice = parts.invoice(line)
    parts.clock.now += LANDING.per_call + LANDING.margin
    parts.gateway.repair_items = lambda repairs: None  # type: ignore[method-assign,assignment]
    parts.invoice_of_line = invoice
    results = parts.close_until_done(limit=20)
    assert results[-1] is CloseResult.ATTENTION
    stopped = parts.ledger.invoice_by_id(invoice.id)
    assert stopped is not None and stopped.repairs == MAX_REPAIRS
    assert stopped.attention is not None and "after 3 repairs" in stopped.attention
    assert "finalize" not in parts.gateway.calls


def test_settling_without_fixing_the_draft_stops_the_invoice_again_after_reading_it() -> None:
    parts = Parts()
    _first, _line, invoice = parts.one_pushed()
    parts.gateway.items["ii_by_hand"] = {
        "amount": 5, "line": None, "invoice": invoice.stripe_invoice_id,
    }  # fmt: skip
    parts.invoice_of_line = invoice
    assert parts.close_until_done()[-1] is CloseResult.ATTENTION
    stopped = parts.ledger.invoice_by_id(invoice.id)
    assert stopped is not None
    stopped.settle_attention("looked at it", "ops")
    parts.ledger.save(stopped)
    reads = parts.gateway.calls.count("read")
    assert parts.closer.step(invoice.id).result is CloseResult.ATTENTION
    assert parts.gateway.calls.count("read") == reads + 1  # read again, found again
    assert "finalize" not in parts.gateway.calls


def test_an_invoice_finalized_by_hand_while_finalizing_is_recorded_with_its_mismatch() -> None:
    parts = Parts()
    _first, _line, invoice = parts.one_pushed()
    assert invoice.stripe_invoice_id is not None
    parts.closer.step(invoice.id)  # closed
    item = next(iter(parts.gateway.items))
    parts.gateway.items[item]["amount"] = 90  # edited, then finalized in the dashboard
    parts.gateway.finalize_invoice(invoice.stripe_invoice_id, invoice.id, look_first=False)
    parts.invoice_of_line = invoice
    parts.close_until_done()
    final = parts.ledger.invoice_by_id(invoice.id)
    assert final is not None and final.state is InvoiceState.FINALIZED
    assert (final.total, final.mismatch) == (90, (100, 90))
    assert final.attention == "Stripe finalized 0.90 USD where the ledger expected 1.00 USD"


def test_a_push_loaded_before_the_seal_cannot_record_an_attempt_after_it() -> None:
    parts = Parts()
    [first] = reserve(parts.ledger, 1, prefix="a")
    line = parts.line(first)
    parts.a.push(line)
    stale = parts.ledger.line_push(line)  # a pusher's copy, loaded before the close
    invoice = parts.invoice(line)
    parts.closer.step(invoice.id)  # closed (the frozen line pushed again)
    stale = parts.ledger.line_push(line)
    parts.closer.step(invoice.id)  # finalizing: every push sealed in the same save
    assert stale is not None and not stale.sealed
    stale.start_attempt(stale.pushed_sequence, parts.clock.now, parts.clock.now)
    with pytest.raises(IntegrityError):
        parts.ledger.save(stale)  # the version check: the seal came first
