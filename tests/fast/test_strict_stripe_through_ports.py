"""The charging adapters against a fake Stripe as strict as Stripe (``FakeGateway``):
keys that replay, refuse other parameters and expire; objects that must exist; items
frozen once their invoice is final; credit notes bounded by the invoice. Each test
pins a behaviour whose loss would bill wrongly while a forgiving fake stayed green,
with a fixed clock and jitter so that every time is asserted exactly."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from uuid import UUID

from adapters.charging.closer import CloseResult, InvoiceCloser
from adapters.charging.pusher import LinePusher
from domain.invoice_states import InvoiceState
from domain.periods import PeriodPolicy
from domain.saga import ChargeFailure, RetryPolicy, StepResult, backoff
from domain.transaction import TxnState
from store.ledger import BillingLedger
from tests.fast.fakes import T0, Clock, FakeGateway, memory_ledger, reserve

POLICY = RetryPolicy(horizon=timedelta(hours=1))
GRACE = timedelta(hours=1)
AFTER_DEADLINE = PeriodPolicy().period_of(T0).end + GRACE


def _parts(
    now: datetime = AFTER_DEADLINE,
) -> tuple[BillingLedger, FakeGateway, LinePusher, InvoiceCloser, Clock]:
    clock = Clock(now)
    gateway = FakeGateway(clock=clock)
    ledger = memory_ledger()
    pusher = LinePusher(ledger, gateway, POLICY, clock=clock, jitter=lambda: 0.5)
    closer = InvoiceCloser(
        ledger, gateway, lambda line, _: pusher.push(line), POLICY, GRACE,
        clock=clock, jitter=lambda: 0.5,
    )  # fmt: skip
    return ledger, gateway, pusher, closer, clock


def _line(ledger: BillingLedger, txn: UUID) -> UUID:
    line = ledger.transaction(txn).line_id
    assert line is not None
    return line


def test_an_item_whose_creation_answer_was_lost_is_created_again_with_its_planned_parameters() -> (
    None
):
    ledger, gateway, pusher, _, clock = _parts()
    [first] = reserve(ledger, 1, quantity=1000)  # 100
    line = _line(ledger, first)
    gateway.hold("timeout")  # Stripe creates the item; the answer never comes back
    assert pusher.push(line).result is StepResult.RETRY
    gateway.in_flight[0].land()
    assert gateway.held(line) == [100]
    reserve(ledger, 1, quantity=3000, prefix="more")  # 400 now
    push = ledger.line_push(line)
    assert push is not None and push.next_attempt_at is not None
    clock.now = push.next_attempt_at
    # The retry replays the creation under its key with the parameters planned before
    # the first request (a new plan at 400 would be an idempotency error, refused for
    # good, and the line's usage compensated while Stripe holds the item).
    assert pusher.push(line).result is StepResult.CHARGED
    assert gateway.held(line) == [400] and len(gateway.items) == 1
    assert ledger.transaction(first).state is TxnState.CHARGED


def test_past_the_key_window_a_lost_creation_is_looked_up_instead_of_made_twice() -> None:
    ledger, gateway, pusher, _, clock = _parts(datetime.now(UTC))
    [first] = reserve(ledger, 1, quantity=1000)
    line = _line(ledger, first)
    gateway.hold("timeout")
    assert pusher.push(line).result is StepResult.RETRY
    gateway.in_flight[0].land()
    clock.now += timedelta(hours=25)  # Stripe has forgotten the creation's key
    assert pusher.push(line).result is StepResult.CHARGED
    assert len(gateway.items) == 1 and gateway.held(line) == [100]


def test_a_second_line_of_a_customer_goes_on_the_customers_own_draft() -> None:
    ledger, gateway, pusher, _, _ = _parts()
    [requests] = reserve(ledger, 1, quantity=1000)
    [tokens] = reserve(ledger, 1, quantity=1000, meter="gpt-4o.input_tokens", prefix="t")
    for txn in (requests, tokens):
        assert pusher.push(_line(ledger, txn)).result is StepResult.CHARGED
    assert gateway.calls.count("customer") == 1 and gateway.calls.count("invoice") == 1
    assert {i["invoice"] for i in gateway.items.values()} == {"in_1"}


def test_each_invoice_is_finalized_under_its_own_key() -> None:
    ledger, gateway, pusher, closer, _ = _parts()
    txns = [reserve(ledger, 1, customer=c, prefix=c)[0] for c in ("a", "b")]
    invoices = []
    for txn in txns:
        line = _line(ledger, txn)
        pusher.push(line)
        invoices.append(ledger.line_by_id(line).invoice_id)
    for invoice in invoices:
        for _ in range(4):
            if closer.step(invoice).result is CloseResult.DONE:
                break
    finals = [ledger.invoice_by_id(i) for i in invoices]
    assert [f.state for f in finals if f is not None] == [InvoiceState.FINALIZED] * 2
    assert {f"invoice-finalize:{i}" for i in invoices} <= set(gateway.executed)


def test_a_retry_is_due_after_its_exact_backoff_or_stripes_retry_after_if_later() -> None:
    ledger, gateway, pusher, _, clock = _parts()
    [first] = reserve(ledger, 1, quantity=1000)
    line = _line(ledger, first)
    gateway.failures.append(ChargeFailure("http_503", "down", retryable=True))
    report = pusher.push(line)
    assert report.retry_at == clock.now + backoff(1, POLICY, 0.5)
    assert backoff(1, POLICY, 0.5) == timedelta(seconds=0.5)
    clock.now = report.retry_at
    slow = ChargeFailure("rate_limited", "slow", True, retry_after=timedelta(seconds=30))
    gateway.failures.append(slow)
    report = pusher.push(line)
    assert report.retry_at == clock.now + timedelta(seconds=30)  # above backoff(2) = 1 s
    push = ledger.line_push(line)
    assert push is not None and push.attempts == 2


def test_a_finalize_failure_is_due_after_its_exact_backoff_attempt_by_attempt() -> None:
    ledger, gateway, pusher, closer, clock = _parts()
    [first] = reserve(ledger, 1, quantity=1000)
    line = _line(ledger, first)
    pusher.push(line)
    invoice = ledger.line_by_id(line).invoice_id
    assert closer.step(invoice).result is CloseResult.WAITING  # closed, lines handed over
    dues = []
    for attempt in (1, 2):
        gateway.failures.append(ChargeFailure("http_503", "down", retryable=True))
        step = closer.step(invoice)
        assert step.result is CloseResult.FAILED
        assert step.retry_at == clock.now + backoff(attempt, POLICY, 0.5)
        dues.append(step.retry_at - clock.now)
        clock.now = step.retry_at
    assert dues == [timedelta(seconds=0.5), timedelta(seconds=1)]
    assert closer.step(invoice).result is CloseResult.DONE


def test_usage_settled_while_a_push_is_in_flight_is_charged_by_the_next_push_only() -> None:
    ledger, gateway, pusher, _, _ = _parts()
    firsts = reserve(ledger, 2, quantity=1000)
    line = _line(ledger, firsts[0])
    gateway.hold("block")
    reports = []
    worker = threading.Thread(target=lambda: reports.append(pusher.push(line)))
    worker.start()
    while not gateway.in_flight:
        worker.join(0.001)
    later = reserve(ledger, 1, quantity=1000, prefix="later")
    gateway.in_flight[0].land()
    worker.join(5)
    assert reports[0].result is StepResult.CHARGED and reports[0].charged == 2
    assert reports[0].more is True
    assert {ledger.transaction(t).state for t in firsts} == {TxnState.CHARGED}
    assert ledger.transaction(later[0]).state is TxnState.RESERVED  # not in what Stripe got
    assert pusher.push(line).charged == 1
    assert ledger.transaction(later[0]).state is TxnState.CHARGED


def test_a_credit_note_for_an_invoice_that_is_not_final_is_refused_by_stripe() -> None:
    ledger, gateway, pusher, _, _ = _parts()
    [first] = reserve(ledger, 1, quantity=1000)
    line = _line(ledger, first)
    pusher.push(line)
    invoice = ledger.invoice_by_id(ledger.line_by_id(line).invoice_id)
    assert invoice is not None and invoice.stripe_invoice_id is not None
    from domain.ports import CreditNote

    note = CreditNote(invoice.id, invoice.stripe_invoice_id, first, 50, False, "memo")
    refused = gateway.credit_note(note)
    assert isinstance(refused, ChargeFailure) and not refused.retryable
