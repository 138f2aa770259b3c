"""``domain.pushing``'s decisions in detail: which item each step sets, the ``Charged``
events built for a push, and the backoff after repeated failures."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from uuid import UUID

from eventsourcing.domain import datetime_now_with_tzinfo
from eventsourcing.utils import get_topic

from domain.invoice_line import InvoiceLine, LinePush
from domain.periods import PeriodPolicy
from domain.pushing import PushVerdict, after_failure, charged_events, plan_push
from domain.saga import ChargeFailure, RetryPolicy, backoff
from domain.transaction import BillingTransaction

DEC = PeriodPolicy().period_of(datetime(2026, 12, 2, tzinfo=UTC))
NOW = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)
LINE = UUID("00000000-0000-4000-8000-00000000001e")
RESERVED = "domain.transaction:BillingTransaction.Reserved"
SETTLED = "domain.transaction:BillingTransaction.Settled"
COMPENSATED = "domain.transaction:BillingTransaction.Compensated"


def test_the_topics_are_those_of_the_transactions_events() -> None:
    assert get_topic(BillingTransaction.Reserved) == RESERVED
    assert get_topic(BillingTransaction.Settled) == SETTLED
    assert get_topic(BillingTransaction.Compensated) == COMPENSATED


def test_each_known_item_is_set_by_its_own_chunk() -> None:
    line = InvoiceLine.open("acme", "USD", "api.requests", DEC)
    line.settle([(UUID(int=1), Decimal("150000000"))])
    push = LinePush(line_id=line.id)
    first = plan_push(line, push)
    assert first is not None and len(first.amounts) == 2
    push.record_pushed(line.sequence, 150_000_000, first.amounts, ["ii_a", "ii_b"], "in")
    line.settle([(UUID(int=2), Decimal("5"))])
    plan = plan_push(line, push)
    assert plan is not None
    assert [(s.chunk, s.item_id) for s in plan.items] == [(0, "ii_a"), (1, "ii_b")]


def test_charged_events_are_built_for_the_chargeable_transactions_only_in_order() -> None:
    compensated, unknown, reserved, settled = (UUID(int=n) for n in (11, 12, 13, 14))
    latest = {compensated: (2, COMPENSATED), reserved: (3, RESERVED), settled: (5, SETTLED)}
    before = datetime_now_with_tzinfo()
    events = charged_events(
        [compensated, unknown, reserved, settled],
        latest,
        stripe_object_id="in_77",
        line_id=LINE,
        sequence=9,
    )
    assert [(e.originator_id, e.originator_version) for e in events] == [
        (reserved, 4),
        (settled, 6),
    ]
    for event in events:
        assert isinstance(event, BillingTransaction.Charged)
        assert (event.stripe_object_id, event.line_id, event.sequence) == ("in_77", LINE, 9)
        assert isinstance(event.timestamp, datetime) and event.timestamp >= before


def test_the_backoff_after_a_failure_grows_with_the_failures_before_it() -> None:
    line = InvoiceLine.open("acme", "USD", "api.requests", DEC)
    push = LinePush(line_id=line.id)
    for n in range(2):
        push.record_failure(1, "Timeout", f"#{n}", retryable=True, next_attempt_at=NOW)
    policy = RetryPolicy(base_delay=timedelta(seconds=1), max_delay=timedelta(minutes=5))
    failure = ChargeFailure("Timeout", "no answer", retryable=True)
    decision = after_failure(push, failure, NOW, policy, 0.5)
    # the third attempt: a point in [0, 1 s * 2**2], halfway
    assert decision.verdict == PushVerdict.RETRY
    assert decision.next_attempt_at == NOW + timedelta(seconds=2)


def test_the_backoff_stops_doubling_after_forty_doublings() -> None:
    policy = RetryPolicy(base_delay=timedelta(microseconds=1), max_delay=timedelta(days=10_000))
    assert backoff(41, policy, 0.5) == timedelta(microseconds=2**39)
    assert backoff(60, policy, 0.5) == timedelta(microseconds=2**39)
    assert backoff(40, policy, 0.5) == timedelta(microseconds=2**38)


def test_a_push_after_a_repaired_drift_is_an_ordinary_one_with_no_repair_key() -> None:
    line = InvoiceLine.open("acme", "USD", "api.requests", DEC)
    line.settle([(UUID(int=1), Decimal(300))])
    push = LinePush(line_id=line.id)
    push.record_pushed(line.sequence, 300, [300], ["ii_1"], "in_1")
    push.record_drift([200])
    drifted = plan_push(line, push)
    assert drifted is not None and drifted.repair == 1 and drifted.items[0].update
    push.record_pushed(line.sequence, 300, [300], ["ii_1"], "in_1")
    line.settle([(UUID(int=2), Decimal(100))])
    after = plan_push(line, push)
    assert after is not None and after.repair == 0
