"""An invoice's life through the ports: the in-memory ledger, a fake Stripe, and a
clock the test moves. Close at the deadline, freeze, final totals, finalize once,
late usage to the next period, a reversal after finalizing credited by its billed
share exactly once, webhooks' views in any order."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from uuid import UUID

import pytest

from adapters.charging.closer import CloseResult, InvoiceCloser
from adapters.charging.corrections import Corrections
from adapters.charging.pusher import LinePusher
from domain.closing import billed_shares
from domain.errors import IllegalTransition
from domain.invoice import Invoice
from domain.invoice_states import InvoiceState, StripeInvoiceView
from domain.periods import PeriodPolicy
from domain.saga import ChargeFailure, RetryPolicy, StepResult
from domain.transaction import TxnState
from store.ledger import BillingLedger
from tests.fast.fakes import T0, Clock, FakeGateway, memory_ledger, reserve

POLICY = RetryPolicy(horizon=timedelta(hours=1))
GRACE = timedelta(hours=1)
DECEMBER = PeriodPolicy().period_of(T0)
AFTER_DEADLINE = DECEMBER.end + GRACE


def _parts(
    gateway: FakeGateway | None = None, ledger: BillingLedger | None = None
) -> tuple[LinePusher, InvoiceCloser, Clock, FakeGateway]:
    gateway = gateway or FakeGateway()
    ledger = ledger or memory_ledger()
    clock = Clock(T0 + timedelta(days=2))
    pusher = LinePusher(ledger, gateway, POLICY, clock=clock, jitter=lambda: 0.5)
    closer = InvoiceCloser(ledger, gateway, None, POLICY, GRACE, clock=clock, jitter=lambda: 0.5)
    return pusher, closer, clock, gateway


def _invoice(ledger: BillingLedger, txn: UUID) -> Invoice:
    line = ledger.line_by_id(ledger.transaction(txn).line_id)  # type: ignore[arg-type]
    invoice = ledger.invoice_by_id(line.invoice_id)
    assert invoice is not None
    return invoice


def _push_all(pusher: LinePusher, invoice: Invoice) -> None:
    for line in invoice.lines:
        pusher.push(line)


def _finalize(pusher: LinePusher, closer: InvoiceCloser, clock: Clock, invoice: Invoice) -> None:
    clock.now = AFTER_DEADLINE
    assert closer.step(invoice.id).result is CloseResult.WAITING  # closed: lines to push
    _push_all(pusher, pusher.ledger.invoice_by_id(invoice.id))  # type: ignore[arg-type]
    assert closer.step(invoice.id).result is CloseResult.DONE


def test_usage_opens_its_invoice_with_its_line_and_a_new_meter_adds_a_line() -> None:
    pusher, _, _, _ = _parts()
    [first] = reserve(pusher.ledger, 1)
    invoice = _invoice(pusher.ledger, first)
    assert (invoice.state, invoice.customer_id, invoice.period) == (
        InvoiceState.OPEN, "acme", DECEMBER,
    )  # fmt: skip
    [tokens] = reserve(pusher.ledger, 1, meter="gpt-4o.input_tokens", prefix="t")
    again = _invoice(pusher.ledger, tokens)
    assert again.id == invoice.id and len(again.lines) == 2


def test_an_invoice_closes_at_its_deadline_freezes_its_lines_and_finalizes_once() -> None:
    pusher, closer, clock, gateway = _parts()
    ids = reserve(pusher.ledger, 3, quantity=250)  # 25 cents each
    invoice = _invoice(pusher.ledger, ids[0])
    _push_all(pusher, invoice)
    clock.now = AFTER_DEADLINE - timedelta(seconds=1)
    assert closer.step(invoice.id).result is CloseResult.NOT_DUE

    clock.now = AFTER_DEADLINE
    assert closer.step(invoice.id).result is CloseResult.WAITING
    closed = pusher.ledger.invoice_by_id(invoice.id)
    assert closed is not None and closed.state is InvoiceState.CLOSED
    assert all(pusher.ledger.line_by_id(line).frozen for line in closed.lines)
    calls = len(gateway.calls)
    _push_all(pusher, closed)  # the final totals: Stripe holds them already
    assert len(gateway.calls) == calls

    assert closer.step(invoice.id).result is CloseResult.DONE
    final = pusher.ledger.invoice_by_id(invoice.id)
    assert final is not None and final.state is InvoiceState.FINALIZED
    assert (final.total, final.expected_total, final.number) == (75, 75, "FAKE-0001")
    assert closer.step(invoice.id).result is CloseResult.DONE
    assert gateway.calls.count("finalize") == 1


def test_a_finalize_that_fails_is_recorded_with_its_due_time_and_retried() -> None:
    gateway = FakeGateway()
    pusher, closer, clock, _ = _parts(gateway)
    ids = reserve(pusher.ledger, 1, quantity=250)
    invoice = _invoice(pusher.ledger, ids[0])
    _push_all(pusher, invoice)
    clock.now = AFTER_DEADLINE
    closer.step(invoice.id)
    _push_all(pusher, invoice)
    gateway.failures.append(ChargeFailure("http_503", "down", retryable=True))
    step = closer.step(invoice.id)
    assert step.result is CloseResult.FAILED and step.retry_at is not None
    failing = pusher.ledger.invoice_by_id(invoice.id)
    assert failing is not None and failing.state is InvoiceState.FINALIZING
    assert (failing.finalize_attempts, failing.last_error) == (1, "http_503: down")
    assert closer.step(invoice.id).result is CloseResult.WAITING  # not due yet
    clock.now = step.retry_at
    assert closer.step(invoice.id).result is CloseResult.DONE
    assert pusher.ledger.invoice_by_id(invoice.id).state is InvoiceState.FINALIZED  # type: ignore[union-attr]


def test_an_invoice_with_nothing_billed_and_no_draft_closes_as_nothing_due() -> None:
    pusher, closer, clock, gateway = _parts()
    ids = reserve(pusher.ledger, 1, quantity=1, meter="gpt-4o.input_tokens")  # 0.00025 cents
    invoice = _invoice(pusher.ledger, ids[0])
    _finalize(pusher, closer, clock, invoice)
    assert pusher.ledger.invoice_by_id(invoice.id).state is InvoiceState.NOTHING_DUE  # type: ignore[union-attr]
    assert "finalize" not in gateway.calls and "invoice" not in gateway.calls


def test_usage_arriving_after_its_invoice_closed_goes_to_a_late_line_of_the_next_period() -> None:
    pusher, closer, clock, _ = _parts()
    [early] = reserve(pusher.ledger, 1, quantity=250)
    invoice = _invoice(pusher.ledger, early)
    clock.now = AFTER_DEADLINE
    closer.step(invoice.id)  # closed and frozen
    [late] = reserve(pusher.ledger, 1, quantity=400, prefix="late")  # occurred in December
    line = pusher.ledger.line_by_id(pusher.ledger.transaction(late).line_id)  # type: ignore[arg-type]
    assert line.late_of_start == DECEMBER.start and line.period == PeriodPolicy().next(DECEMBER)
    assert line.id not in pusher.ledger.invoice_by_id(invoice.id).lines  # type: ignore[union-attr]
    january = pusher.ledger.invoice_by_id(line.invoice_id)
    assert january is not None and january.state is InvoiceState.OPEN and january.lines == [line.id]
    # A new meter of the closed period is late too: no line joins a closed invoice.
    [tokens] = reserve(pusher.ledger, 1, meter="gpt-4o.input_tokens", prefix="tok")
    assert (
        pusher.ledger.line_by_id(
            pusher.ledger.transaction(tokens).line_id  # type: ignore[arg-type]
        ).late_of_start
        == DECEMBER.start
    )


def test_a_reversal_after_finalizing_is_a_credit_of_its_billed_share_issued_once() -> None:
    pusher, closer, clock, gateway = _parts()
    # 0.4 cents each: the line bills 1 cent (1.2 rounded); shares 0, 1, 0 in order.
    ids = reserve(pusher.ledger, 3, quantity=1600, meter="gpt-4o.input_tokens")
    invoice = _invoice(pusher.ledger, ids[0])
    _push_all(pusher, invoice)
    _finalize(pusher, closer, clock, invoice)
    line = pusher.ledger.line_by_id(invoice.lines[0])
    shares = billed_shares(pusher.ledger.line_changes(line.id, 0, line.sequence))
    assert [shares[t] for t in ids] == [0, 1, 0] and sum(shares.values()) == line.billed

    corrections = Corrections(pusher.ledger, gateway, clock=clock)
    assert corrections.reverse(ids[0], "goodwill") is StepResult.REVERSED  # share 0: nothing
    assert corrections.reverse(ids[1], "goodwill") is StepResult.REVERSED
    with pytest.raises(IllegalTransition):
        corrections.reverse(ids[1], "again")  # compensated already: one credit per transaction
    requested = pusher.ledger.invoice_by_id(invoice.id)
    assert requested is not None and requested.credits_pending() == [(ids[1], 1)]
    assert pusher.ledger.transaction(ids[1]).state is TxnState.COMPENSATED
    assert line.billed == pusher.ledger.line_by_id(line.id).billed  # the final line is unchanged

    assert closer.step(invoice.id).result is CloseResult.DONE
    assert closer.step(invoice.id).result is CloseResult.DONE
    [note] = gateway.credit_notes.values()
    assert (note.amount, note.transaction_id, note.after_payment) == (1, ids[1], False)
    credited = pusher.ledger.invoice_by_id(invoice.id)
    assert credited is not None and credited.credited_amount == 1
    assert credited.credits_pending() == []


def _view(status: str, **changes: object) -> StripeInvoiceView:
    base = StripeInvoiceView(
        status=status, number="INV-1", total=75, amount_paid=0, attempt_count=0,
        next_payment_attempt=None, at=AFTER_DEADLINE, source="evt_1",
    )  # fmt: skip
    return replace(base, **changes)  # type: ignore[arg-type]


def _finalizing(pusher: LinePusher, closer: InvoiceCloser, clock: Clock) -> Invoice:
    ids = reserve(pusher.ledger, 3, quantity=250)
    invoice = _invoice(pusher.ledger, ids[0])
    _push_all(pusher, invoice)
    clock.now = AFTER_DEADLINE
    closer.step(invoice.id)
    _push_all(pusher, invoice)
    closer.gateway = FakeGateway(failures=[ChargeFailure("http_503", "down", retryable=True)])
    closer.step(invoice.id)  # FinalizeStarted, then the call fails
    found = pusher.ledger.invoice_by_id(invoice.id)
    assert found is not None and found.state is InvoiceState.FINALIZING
    return found


def test_paid_before_finalized_records_both_and_the_late_finalized_changes_nothing() -> None:
    pusher, closer, clock, _ = _parts()
    invoice = _finalizing(pusher, closer, clock)
    assert invoice.observe(_view("paid", amount_paid=75, source="evt_paid"))
    assert invoice.state is InvoiceState.PAID and invoice.number == "INV-1"
    assert [type(e).__name__ for e in invoice.collect_events()] == ["Finalized", "Paid"]
    assert not invoice.observe(_view("open", source="evt_finalized"))  # stale: nothing
    assert not invoice.observe(_view("open", attempt_count=1, source="evt_failed"))
    assert invoice.collect_events() == []


def test_payment_failures_count_attempts_and_a_repeated_one_changes_nothing() -> None:
    pusher, closer, clock, _ = _parts()
    invoice = _finalizing(pusher, closer, clock)
    assert invoice.observe(_view("open", attempt_count=1, source="evt_f1"))
    assert invoice.state is InvoiceState.PAYMENT_FAILED and invoice.payment_attempts == 1
    assert not invoice.observe(_view("open", attempt_count=1, source="evt_f1_again"))
    assert invoice.observe(_view("open", attempt_count=2, source="evt_f2"))
    assert invoice.observe(_view("uncollectible", source="evt_u"))
    assert invoice.observe(_view("paid", amount_paid=75, source="evt_p"))  # paid late
    assert invoice.state is InvoiceState.PAID and invoice.amount_paid == 75
    assert not invoice.observe(_view("void", source="evt_v"))  # a paid invoice stays paid


def test_views_of_an_invoice_the_ledger_is_not_finalizing_record_nothing() -> None:
    pusher, _, _, _ = _parts()
    ids = reserve(pusher.ledger, 1, quantity=250)
    invoice = _invoice(pusher.ledger, ids[0])
    assert not invoice.observe(_view("paid", amount_paid=25))  # open here: left to an operator
    assert invoice.state is InvoiceState.OPEN


def test_a_failed_credit_note_is_recorded_and_retried_after_its_backoff() -> None:
    pusher, closer, clock, gateway = _parts()
    ids = reserve(pusher.ledger, 2, quantity=250)  # 25 cents each
    invoice = _invoice(pusher.ledger, ids[0])
    _finalize(pusher, closer, clock, invoice)
    corrections = Corrections(pusher.ledger, gateway, clock=clock)
    gateway.failures.append(ChargeFailure("http_503", "down", retryable=True))
    assert corrections.reverse(ids[0], "goodwill") is StepResult.REVERSED
    failed = closer.step(invoice.id)
    assert failed.result is CloseResult.FAILED and failed.retry_at is not None
    waiting = pusher.ledger.invoice_by_id(invoice.id)
    assert waiting is not None
    assert (waiting.credit_attempts, waiting.last_error) == (1, "http_503: down")
    assert closer.step(invoice.id).result is CloseResult.WAITING  # not due yet
    assert gateway.calls.count("credit_note") == 1
    clock.now = failed.retry_at
    assert closer.step(invoice.id).result is CloseResult.DONE
    done = pusher.ledger.invoice_by_id(invoice.id)
    assert done is not None and (done.credited_amount, done.credit_attempts) == (25, 0)


def test_a_credit_is_never_more_than_the_invoice_can_still_be_credited() -> None:
    pusher, closer, clock, gateway = _parts()
    ids = reserve(pusher.ledger, 2, quantity=250)
    invoice = _invoice(pusher.ledger, ids[0])
    _finalize(pusher, closer, clock, invoice)
    final = pusher.ledger.invoice_by_id(invoice.id)
    assert final is not None and final.total == 50
    final.record_credit(None, "cn_dashboard", 40, "evt_by_hand")  # credited in the dashboard
    pusher.ledger.save(final)
    corrections = Corrections(pusher.ledger, gateway, clock=clock)
    assert corrections.reverse(ids[0], "goodwill") is StepResult.REVERSED  # owes 25
    assert closer.step(invoice.id).result is CloseResult.DONE
    [note] = gateway.credit_notes.values()
    assert note.amount == 10  # 50 finalized - 40 credited by hand
    stopped = pusher.ledger.invoice_by_id(invoice.id)
    assert stopped is not None and stopped.attention is not None
    assert "owes 0.25 USD, but the invoice can only be credited 0.10 USD more" in stopped.attention
    assert corrections.reverse(ids[1], "goodwill") is StepResult.REVERSED
    assert closer.step(invoice.id).result is CloseResult.ATTENTION  # nothing left to credit
    assert len(gateway.credit_notes) == 1
