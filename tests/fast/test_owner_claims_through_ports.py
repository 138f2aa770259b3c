"""A process that lost a customer's partition stops pushing its lines: the claim each
push carries (``domain.ownership``) is checked against the newest one recorded on the
line's push, in the same save as the attempt."""

from __future__ import annotations

from uuid import UUID

from adapters.charging.pusher import LinePusher
from domain.invoice_line import LinePush
from domain.ownership import Claim
from domain.saga import RetryPolicy, StepResult
from store.ledger import BillingLedger
from tests.fast.fakes import Clock, FakeGateway, memory_ledger, reserve

POLICY = RetryPolicy()


def _line(ledger: BillingLedger, txn: UUID) -> UUID:
    line = ledger.transaction(txn).line_id
    assert line is not None
    return line


def _pusher(ledger: BillingLedger, gateway: FakeGateway, claim: Claim | None) -> LinePusher:
    """A pusher holding ``claim`` of acme's partition (and none of any other's)."""
    return LinePusher(
        ledger, gateway, POLICY, clock=gateway.clock, jitter=lambda: 0.5,
        claims=lambda customer: claim if customer == "acme" else None,
    )  # fmt: skip


def _claims(ledger: BillingLedger, line: UUID) -> list[tuple[int, int]]:
    push = ledger.line_push(line)
    assert push is not None
    history = ledger.history(push.id)
    return [(e.partition, e.epoch) for e in history if isinstance(e, LinePush.OwnerClaimed)]


def test_the_old_holder_of_a_partition_sends_nothing_once_the_new_one_pushed() -> None:
    ledger, gateway = memory_ledger(), FakeGateway(clock=Clock())
    old, new = _pusher(ledger, gateway, Claim(0, 1)), _pusher(ledger, gateway, Claim(0, 2))
    [txn] = reserve(ledger, 1, quantity=1000)
    line = _line(ledger, txn)
    assert old.push(line).result is StepResult.CHARGED
    reserve(ledger, 1, quantity=1000, prefix="more")
    assert new.push(line).result is StepResult.CHARGED
    reserve(ledger, 1, quantity=1000, prefix="late")
    sent = len(gateway.calls)
    report = old.push(line)
    assert (report.result, report.requests) == (StepResult.NOTHING, 0)
    assert len(gateway.calls) == sent  # not a request to Stripe
    assert gateway.held(line) == [200]
    assert new.push(line).result is StepResult.CHARGED
    assert gateway.held(line) == [300]
    assert _claims(ledger, line) == [(0, 1), (0, 2)]


def test_an_old_holder_that_loaded_the_line_before_the_new_one_pushed_loses_at_save() -> None:
    ledger, gateway = memory_ledger(), FakeGateway(clock=Clock())
    new = _pusher(ledger, gateway, Claim(0, 2))
    [txn] = reserve(ledger, 1, quantity=1000)
    line = _line(ledger, txn)

    def old_claim(customer: str) -> Claim:
        # Asked after the old holder loaded the line: the new holder pushes it meanwhile.
        if not _claims_or_none(ledger, line):
            assert new.push(line).result is StepResult.CHARGED
            reserve(ledger, 1, quantity=1000, prefix="more")  # more for somebody to push
        return Claim(0, 1)

    old = LinePusher(ledger, gateway, POLICY, clock=gateway.clock, claims=old_claim)
    report = old.push(line)
    assert (report.result, report.requests) == (StepResult.NOTHING, 0)
    assert gateway.held(line) == [100]
    push = ledger.line_push(line)
    assert push is not None and (push.attempts_started, push.owner_epoch) == (1, 2)
    assert _claims(ledger, line) == [(0, 2)]
    assert new.push(line).result is StepResult.CHARGED
    assert gateway.held(line) == [200]


def _claims_or_none(ledger: BillingLedger, line: UUID) -> list[tuple[int, int]]:
    return _claims(ledger, line) if ledger.line_push(line) is not None else []


def test_a_process_holding_no_claim_still_pushes_a_claimed_line() -> None:
    ledger, gateway = memory_ledger(), FakeGateway(clock=Clock())
    owner, unclaimed = _pusher(ledger, gateway, Claim(0, 2)), _pusher(ledger, gateway, None)
    [txn] = reserve(ledger, 1, quantity=1000)
    line = _line(ledger, txn)
    assert owner.push(line).result is StepResult.CHARGED
    reserve(ledger, 1, quantity=1000, prefix="more")
    # A takeover of a late owner's line, or the CLI: not fenced, and no claim taken.
    assert unclaimed.push(line).result is StepResult.CHARGED
    assert gateway.held(line) == [200]
    assert _claims(ledger, line) == [(0, 2)]
