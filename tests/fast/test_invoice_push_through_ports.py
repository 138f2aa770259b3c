"""A draft invoice's lines pushed together, through the ports: after each line's first
push (its item created on its own), the invoice's changed lines are set by one bulk
update (``update_lines``), each line with its attempt recorded before the request, its
own ``Pushed`` and its transactions' ``Charged``; a refusal never compensates one line's
usage for another's fault; a line fenced to a newer owner is left out."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

from adapters.charging.pusher import LinePusher
from domain.invoice_line import LinePush
from domain.ownership import Claim
from domain.saga import ChargeFailure, RetryPolicy, StepResult
from domain.transaction import TxnState
from store.ledger import BillingLedger
from tests.fast.fakes import T0, Clock, FakeGateway, memory_ledger, reserve

POLICY = RetryPolicy(horizon=timedelta(hours=1))
METERS = ("api.requests", "gpt-4o.input_tokens", "gpt-4o.output_tokens")
REFUSED = ChargeFailure("http_400", "refused", retryable=False)


class Invoice:
    """Three lines of one customer (one invoice), each pushed once: its item created on
    its own (``set_line_items``), so Stripe's line items are not known yet."""

    def __init__(self, claim: Claim | None = None) -> None:
        self.clock = Clock(T0)
        self.gateway = FakeGateway(clock=self.clock)
        self.ledger: BillingLedger = memory_ledger()
        self.pusher = LinePusher(
            self.ledger, self.gateway, POLICY, clock=self.clock, jitter=lambda: 0.5,
            claims=lambda customer: claim,
        )  # fmt: skip
        self.txns: list[UUID] = []
        self.lines: list[UUID] = []
        for meter in METERS:  # each pushed before the next exists: each made on its own
            self.lines.append(self.line(self.more(meter, "a")[0]))
            assert self.pusher.push(self.lines[-1]).result is StepResult.CHARGED

    def more(self, meter: str, prefix: str) -> list[UUID]:
        made = reserve(self.ledger, 1, quantity=100_000, meter=meter, prefix=f"{prefix}-{meter}")
        self.txns += made
        return made

    def change_all(self, prefix: str) -> None:
        for meter in METERS:
            self.more(meter, prefix)

    def line(self, txn: UUID) -> UUID:
        line = self.ledger.transaction(txn).line_id
        assert line is not None
        return line

    def push_of(self, line: UUID) -> LinePush:
        push = self.ledger.line_push(line)
        assert push is not None
        return push

    def states(self) -> set[TxnState]:
        return {self.ledger.transaction(t).state for t in self.txns}

    def held_equal_billed(self) -> bool:
        return all(
            sum(self.gateway.held(line)) == self.ledger.line_by_id(line).billed
            for line in self.lines
        )


def test_an_invoices_changed_lines_are_set_by_one_request_each_line_recording_its_push() -> None:
    inv = Invoice()
    assert inv.gateway.calls.count("item") == 3  # first pushes: one creation a line
    inv.change_all("b")
    first, *others = inv.lines
    report = inv.pusher.push(first)
    assert report.result is StepResult.CHARGED
    assert report.requests == 2 and inv.gateway.calls[-2:] == ["lines", "update_lines"]
    assert set(report.lines) == set(others)
    for line in inv.lines:
        push = inv.push_of(line)
        assert push.pushed_sequence == inv.ledger.line_by_id(line).sequence
        assert push.charged_through == push.pushed_sequence
        assert push.in_doubt_until(T0) is None  # its attempt was answered
    assert inv.states() == {TxnState.CHARGED} and inv.held_equal_billed()
    calls = len(inv.gateway.calls)
    assert [inv.pusher.push(line).requests for line in others] == [0, 0]  # nothing left
    assert len(inv.gateway.calls) == calls
    inv.change_all("c")
    report = inv.pusher.push(others[0])
    assert report.requests == 1 and inv.gateway.calls[-1] == "update_lines"  # learned once
    assert inv.states() == {TxnState.CHARGED} and inv.held_equal_billed()


def test_every_line_of_the_request_has_its_attempt_recorded_before_it_is_sent() -> None:
    inv = Invoice()
    inv.change_all("b")
    inv.pusher.push(inv.lines[0])  # the line items learned
    inv.change_all("c")
    inv.gateway.hold("timeout")  # Stripe has it; the client gives up; it lands later
    report = inv.pusher.push(inv.lines[0])
    assert report.result is StepResult.RETRY
    for line in inv.lines:
        push = inv.push_of(line)
        assert push.in_doubt_until(T0) is not None  # may still land: the closer waits
        assert push.last_error is not None  # each line recorded the failure
    inv.gateway.in_flight[0].land()
    assert inv.held_equal_billed()  # it set every line it named
    inv.clock.now = report.retry_at or T0
    again = inv.pusher.push(inv.lines[0])  # the same set: the same key, replayed
    assert again.result is StepResult.CHARGED and inv.states() == {TxnState.CHARGED}
    assert inv.gateway.executed.count(inv.gateway.executed[-1]) == 1


def test_a_refusal_of_several_lines_on_a_draft_pushes_them_one_by_one_compensating_none() -> None:
    inv = Invoice()
    inv.change_all("b")
    inv.pusher.push(inv.lines[0])  # the line items learned
    inv.change_all("c")
    inv.gateway.failures = [REFUSED]  # the bulk update's
    report = inv.pusher.push(inv.lines[0])
    assert report.result is StepResult.CHARGED  # then set on its own
    assert inv.gateway.calls[-3:] == ["update_lines", "read", "update"]
    for line in inv.lines[1:]:
        assert inv.pusher.push(line).result is StepResult.CHARGED
        assert inv.gateway.calls[-1] == "update"  # this invoice goes line by line now
    assert inv.states() == {TxnState.CHARGED} and inv.held_equal_billed()


def test_a_bulk_update_of_an_invoice_finalized_by_hand_compensates_nothing() -> None:
    inv = Invoice()
    inv.change_all("b")
    inv.pusher.push(inv.lines[0])
    stripe_invoice = inv.push_of(inv.lines[0]).stripe_invoice_id
    assert stripe_invoice is not None
    invoice = inv.ledger.invoice_by_id(inv.ledger.line_by_id(inv.lines[0]).invoice_id)
    assert invoice is not None
    inv.gateway.finalize_invoice(stripe_invoice, invoice.id, look_first=False)
    inv.change_all("c")
    report = inv.pusher.push(inv.lines[0])
    assert report.result is StepResult.DEFERRED
    assert TxnState.COMPENSATED not in inv.states()
    reloaded = inv.ledger.invoice_by_id(invoice.id)
    assert reloaded is not None and reloaded.attention is not None
    for line in inv.lines:
        assert inv.push_of(line).next_attempt_at is not None  # each waits, none abandoned


def test_a_line_fenced_to_a_newer_owner_is_left_out_of_its_invoices_request() -> None:
    inv = Invoice(claim=Claim(partition=0, epoch=1))
    inv.change_all("b")
    fenced = inv.push_of(inv.lines[2])
    fenced.start_attempt(fenced.pushed_sequence, T0, T0, Claim(partition=0, epoch=2))
    fenced.end_attempt(fenced.attempts_started, "answered")
    inv.ledger.save(fenced)
    report = inv.pusher.push(inv.lines[0])
    assert set(report.lines) == {inv.lines[1]}
    assert inv.push_of(inv.lines[2]).pushed_sequence < inv.ledger.line_by_id(inv.lines[2]).sequence
    assert inv.pusher.push(inv.lines[2]).result is StepResult.NOTHING  # not this pusher's
