"""The line pusher, through its ports: an in-memory ledger and a fake Stripe.

No PostgreSQL, broker or emulator: these run in milliseconds and pin what the
``LinePusher`` and ``Corrections`` send and record for each answer (the drills prove
the same against the real components).
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from uuid import UUID

import pytest

from adapters.charging.corrections import Corrections
from adapters.charging.pusher import LinePusher
from domain.invoice_line import InvoiceLine
from domain.money import MAX_ITEM_AMOUNT
from domain.saga import ChargeFailure, RetryPolicy, StepResult
from domain.transaction import BillingTransaction, Source, TxnState
from store.ledger import BillingLedger
from tests.fast.fakes import FakeGateway, memory_ledger, reserve, usage

POLICY = RetryPolicy(horizon=timedelta(hours=1))
DOWN = ChargeFailure("http_503", "down", retryable=True)
REFUSED = ChargeFailure("http_400", "invalid currency", retryable=False)


def _pusher(gateway: FakeGateway, ledger: BillingLedger | None = None) -> LinePusher:
    return LinePusher(ledger or memory_ledger(), gateway, POLICY, jitter=lambda: 0.5)


def _line_of(pusher: LinePusher, txn_id: UUID) -> UUID:
    line = pusher.ledger.transaction(txn_id).line_id
    assert line is not None
    return line


def _states(ledger: BillingLedger, ids: list[UUID]) -> set[TxnState]:
    return {ledger.transaction(i).state for i in ids}


def test_a_push_creates_the_customer_the_draft_and_one_item_of_the_rounded_total() -> None:
    gateway = FakeGateway()
    pusher = _pusher(gateway)
    ids = reserve(pusher.ledger, 3, quantity=250)  # 0.25 USD each at 0.1 cent a request
    line = _line_of(pusher, ids[0])
    report = pusher.push(line)
    assert (report.result, report.requests, report.charged) == (StepResult.CHARGED, 3, 3)
    assert gateway.calls == ["customer", "invoice", "item"]
    assert gateway.held(line) == [75]
    assert _states(pusher.ledger, ids) == {TxnState.CHARGED}
    assert pusher.push(line).result is StepResult.NOTHING  # Stripe holds the newest total
    assert gateway.calls == ["customer", "invoice", "item"]


def test_sub_cent_usage_is_billed_by_its_exact_sum_rounded_once() -> None:
    gateway = FakeGateway()
    pusher = _pusher(gateway)
    # 1,999 tokens at 2.50 USD per million: 0.49975 cents each, 0 when rounded per record.
    ids = reserve(pusher.ledger, 100, quantity=1999, meter="gpt-4o.input_tokens")
    line = pusher.ledger.line_by_id(_line_of(pusher, ids[0]))
    assert line.exact_total == Decimal("49.975") and line.billed == 50
    pusher.push(line.id)
    assert gateway.held(line.id) == [50]


def test_a_change_that_does_not_move_the_rounding_is_charged_without_a_stripe_call() -> None:
    gateway = FakeGateway()
    pusher = _pusher(gateway)
    first = reserve(pusher.ledger, 1, quantity=4000, meter="gpt-4o.input_tokens")  # 1 cent
    line = _line_of(pusher, first[0])
    pusher.push(line)
    calls = len(gateway.calls)
    more = reserve(pusher.ledger, 1, quantity=100, meter="gpt-4o.input_tokens", prefix="m")
    report = pusher.push(line)  # 1.025 cents: still 1
    assert (report.result, report.requests, report.charged) == (StepResult.CHARGED, 0, 1)
    assert len(gateway.calls) == calls
    assert _states(pusher.ledger, first + more) == {TxnState.CHARGED}


def test_a_later_push_sets_the_new_total_on_the_same_item() -> None:
    gateway = FakeGateway()
    pusher = _pusher(gateway)
    ids = reserve(pusher.ledger, 2, quantity=1000)
    line = _line_of(pusher, ids[0])
    pusher.push(line)
    reserve(pusher.ledger, 3, quantity=1000, prefix="later")
    report = pusher.push(line)
    # The draft's line items are learned from Stripe once, then set in one bulk update.
    assert report.requests == 2 and gateway.calls[-2:] == ["lines", "update_lines"]
    assert gateway.held(line) == [500] and len(gateway.items) == 1
    reserve(pusher.ledger, 1, quantity=1000, prefix="again")
    report = pusher.push(line)
    assert report.requests == 1 and gateway.calls[-1] == "update_lines"
    assert gateway.held(line) == [600]


def test_a_total_above_the_largest_item_amount_continues_on_a_second_item() -> None:
    gateway = FakeGateway()
    pusher = _pusher(gateway)
    # 0.1 cent a request: 1,000,000,000 requests are 100,000,000 cents.
    ids = reserve(pusher.ledger, 1, quantity=1_000_000_000)
    line = _line_of(pusher, ids[0])
    pusher.push(line)
    assert gateway.held(line) == [MAX_ITEM_AMOUNT, 100_000_000 - MAX_ITEM_AMOUNT]
    assert pusher.ledger.transaction(ids[0]).state is TxnState.CHARGED


def test_a_retryable_failure_waits_for_its_due_time_then_pushes_with_the_same_keys() -> None:
    gateway = FakeGateway(failures=[DOWN])
    pusher = _pusher(gateway)
    ids = reserve(pusher.ledger, 2)
    line = _line_of(pusher, ids[0])
    report = pusher.push(line)
    assert report.result is StepResult.RETRY and report.retry_at is not None
    assert pusher.push(line).result is StepResult.WAIT  # not due: no call
    assert _states(pusher.ledger, ids) == {TxnState.RESERVED}
    pusher.clock = lambda: report.retry_at + timedelta(seconds=1)  # type: ignore[operator]
    assert pusher.push(line).result is StepResult.CHARGED
    assert gateway.held(line) == [200]
    assert _states(pusher.ledger, ids) == {TxnState.CHARGED}


def test_owed_usage_is_not_dropped_when_stripe_fails_past_the_horizon() -> None:
    gateway = FakeGateway(failures=[DOWN] * 20)
    pusher = _pusher(gateway)
    ids = reserve(pusher.ledger, 1)
    line = _line_of(pusher, ids[0])
    later = pusher.ledger.transaction(ids[0]).created_on
    for _ in range(20):
        later += 2 * POLICY.horizon
        pusher.clock = lambda at=later: at  # type: ignore[misc]
        assert pusher.push(line).result is StepResult.RETRY
    assert _states(pusher.ledger, ids) == {TxnState.RESERVED}  # still owed, still tried


def test_a_permanent_refusal_compensates_what_no_push_included_and_releases_it() -> None:
    gateway = FakeGateway()
    pusher = _pusher(gateway)
    charged = reserve(pusher.ledger, 1, quantity=1000)
    line = _line_of(pusher, charged[0])
    pusher.push(line)
    charged += reserve(pusher.ledger, 1, quantity=1000, prefix="c")
    pusher.push(line)  # the draft's line items learned: the next failure is the update's
    unsent = reserve(pusher.ledger, 2, quantity=1000, prefix="u")
    gateway.failures = [REFUSED]
    assert pusher.push(line).result is StepResult.COMPENSATED
    assert _states(pusher.ledger, unsent) == {TxnState.COMPENSATED}
    assert _states(pusher.ledger, charged) == {TxnState.CHARGED}
    reloaded = pusher.ledger.line_by_id(line)
    assert (reloaded.billed, reloaded.transactions) == (200, 2)
    account = pusher.ledger.account("acme", "USD")
    assert account is not None and account.committed == 200


def test_a_reversal_lowers_the_line_and_the_next_push_sets_the_lower_amount() -> None:
    gateway = FakeGateway()
    pusher = _pusher(gateway)
    ids = reserve(pusher.ledger, 3, quantity=1000)
    line = _line_of(pusher, ids[0])
    pusher.push(line)
    corrections = Corrections(pusher.ledger, gateway)
    assert corrections.reverse(ids[1], "customer asked") is StepResult.REVERSED
    reversed_txn = pusher.ledger.transaction(ids[1])
    assert reversed_txn.state is TxnState.COMPENSATED
    pusher.push(line)
    assert gateway.held(line) == [200]
    account = pusher.ledger.account("acme", "USD")
    assert account is not None and account.committed == 200


def test_a_push_retried_after_a_crash_sends_the_planned_item_under_the_same_key() -> None:
    gateway = FakeGateway()
    ledger = memory_ledger()
    ids = reserve(ledger, 1, quantity=1000)
    crashing = _pusher(gateway, ledger)
    line = _line_of(crashing, ids[0])

    crashing.gateway = _DiesBeforeItems(gateway)  # type: ignore[assignment]
    with pytest.raises(SystemExit):
        crashing.push(line)
    reserve(ledger, 1, quantity=3000, prefix="meanwhile")  # the total moves on
    _pusher(gateway, ledger).push(line)
    # Created with the planned parameters (replayable by its key), then set to 400.
    assert gateway.held(line) == [400] and len(gateway.items) == 1


class _DiesBeforeItems:
    """The fake Stripe, but the process dies as it is about to set a line's items."""

    def __init__(self, inner: FakeGateway) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def set_line_items(self, items: object) -> object:
        raise SystemExit("killed after planning, before Stripe")


def test_two_pushers_of_one_line_record_each_charge_once() -> None:
    gateway = FakeGateway()
    ledger = memory_ledger()
    ids = reserve(ledger, 5)
    first, second = _pusher(gateway, ledger), _pusher(gateway, ledger)
    line = _line_of(first, ids[0])
    assert first.push(line).result is StepResult.CHARGED
    assert second.push(line).result is StepResult.NOTHING
    charged = [
        e for i in ids for e in ledger.history(i) if isinstance(e, BillingTransaction.Charged)
    ]
    assert len(charged) == 5


def test_a_transaction_from_before_lines_joins_its_line_and_is_then_pushed() -> None:
    gateway = FakeGateway()
    pusher = _pusher(gateway)
    ledger = pusher.ledger
    [txn_id] = reserve(ledger, 1)
    txn = ledger.transaction(txn_id)
    # As a history written before lines has it: Reserved names no line.
    legacy = BillingTransaction.from_usage(usage("legacy"), ledger.prices, Source("usage", 0, 99))
    assert txn.account_id is not None
    legacy.reserve(txn.account_id)
    ledger.save(legacy)
    corrections = Corrections(ledger, gateway)
    assert corrections.adopt(legacy.id) is StepResult.SETTLED
    assert corrections.adopt(legacy.id) is StepResult.NOTHING  # joins one line, once
    adopted = ledger.transaction(legacy.id)
    assert adopted.line_id == txn.line_id is not None
    line = ledger.line_by_id(adopted.line_id)
    assert line.transactions == 2 and isinstance(ledger.history(line.id)[-1], InvoiceLine.Settled)
    pusher.push(line.id)
    assert _states(ledger, [txn_id, legacy.id]) == {TxnState.CHARGED}
