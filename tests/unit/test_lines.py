"""Invoice lines (``domain.invoice_line``) and their pushes' decisions (``domain.pushing``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from uuid import UUID, uuid4

import pytest

from domain.invoice_line import InvoiceLine, LinePush
from domain.money import MAX_ITEM_AMOUNT, split_for_items
from domain.periods import Period, PeriodPolicy
from domain.pushing import PushVerdict, after_failure, charged_events, plan_push, settled_in
from domain.saga import ChargeFailure, RetryPolicy
from domain.transaction import BillingTransaction

DEC = PeriodPolicy().period_of(datetime(2026, 12, 2, tzinfo=UTC))
NOW = datetime(2026, 12, 3, tzinfo=UTC)


def _line(*amounts: str) -> InvoiceLine:
    line = InvoiceLine.open("acme", "USD", "api.requests", DEC)
    if amounts:
        line.settle([(uuid4(), Decimal(a)) for a in amounts])
    return line


def _push(line: InvoiceLine) -> LinePush:
    return LinePush(line_id=line.id)


# -- the line -----------------------------------------------------------------------


def test_a_line_id_is_derived_from_customer_currency_meter_and_period() -> None:
    again = InvoiceLine.open("acme", "USD", "api.requests", DEC)
    other = InvoiceLine.open("acme", "USD", "api.requests", PeriodPolicy().next(DEC))
    assert _line().id == again.id != other.id


def test_settling_keeps_the_exact_total_and_bills_it_rounded_once_half_up() -> None:
    line = _line("0.25", "0.25")
    assert (line.exact_total, line.billed, line.transactions) == (Decimal("0.5"), 1, 2)
    line.settle([(uuid4(), Decimal("0.49"))])
    assert (line.exact_total, line.billed) == (Decimal("0.99"), 1)
    event = line.pending_events[-1]
    assert isinstance(event, InvoiceLine.Settled)
    assert (event.exact_total, event.billed, event.transactions) == (Decimal("0.99"), 1, 3)


def test_every_change_of_the_total_is_a_new_sequence() -> None:
    line = _line("1")
    before = line.sequence
    line.settle([(uuid4(), Decimal("2"))])
    assert line.sequence == before + 1 == line.version


def test_removing_lowers_the_total_and_needs_a_reason() -> None:
    line = InvoiceLine.open("acme", "USD", "api.requests", DEC)
    kept, gone = uuid4(), uuid4()
    line.settle([(kept, Decimal("100")), (gone, Decimal("49.5"))])
    with pytest.raises(ValueError, match="reason"):
        line.remove([(gone, Decimal("49.5"))], " ")
    line.remove([(gone, Decimal("49.5"))], "reversed")
    assert (line.exact_total, line.billed, line.transactions) == (Decimal(100), 100, 1)


def test_a_line_cannot_go_below_zero_nor_take_a_negative_amount() -> None:
    line = _line("1")
    with pytest.raises(ValueError, match="cannot remove more"):
        line.remove([(uuid4(), Decimal(2))], "too much")
    with pytest.raises(ValueError, match="negative"):
        line.settle([(uuid4(), Decimal(-1))])


# -- planning a push ----------------------------------------------------------------


def test_the_first_push_plans_one_item_created_with_the_total() -> None:
    line = _line("150.4")
    plan = plan_push(line, _push(line))
    assert plan is not None
    [step] = plan.items
    assert (step.item_id, step.create_amount, step.update) == (None, 150, False)
    assert plan.to_plan == ((0, line.sequence, 150),)
    assert (plan.sequence, plan.billed, plan.calls) == (line.sequence, 150, 1)


def test_nothing_is_planned_when_stripe_holds_the_newest_sequence() -> None:
    line = _line("5")
    push = _push(line)
    push.record_pushed(line.sequence, 5, [5], ["ii_1"], "in_1")
    assert plan_push(line, push) is None


def test_a_changed_total_updates_the_known_item_and_an_unchanged_one_needs_no_call() -> None:
    line = _line("5")
    push = _push(line)
    push.record_pushed(line.sequence, 5, [5], ["ii_1"], "in_1")
    line.settle([(uuid4(), Decimal("0.2"))])  # 5.2: still 5
    same = plan_push(line, push)
    assert same is not None and same.calls == 0 and same.amounts == [5]
    line.settle([(uuid4(), Decimal("1"))])  # 6.2: 6
    changed = plan_push(line, push)
    assert changed is not None and changed.calls == 1 and changed.items[0].update


def test_after_an_unknown_outcome_every_item_is_set_again() -> None:
    line = _line("5")
    push = _push(line)
    push.record_pushed(line.sequence, 5, [5], ["ii_1"], "in_1")
    line.settle([(uuid4(), Decimal("0.1"))])
    push.record_failure(line.sequence, "connection", "reset", retryable=True, next_attempt_at=NOW)
    plan = plan_push(line, push)
    assert plan is not None and plan.calls == 1  # 5 again: Stripe may hold anything


def test_a_total_above_the_largest_item_amount_is_split_and_a_smaller_one_zeroes_the_rest() -> None:
    assert split_for_items(250_000_000) == [MAX_ITEM_AMOUNT, MAX_ITEM_AMOUNT, 50_000_002]
    line = _line("150000000")
    push = _push(line)
    plan = plan_push(line, push)
    assert plan is not None and plan.amounts == [MAX_ITEM_AMOUNT, 150_000_000 - MAX_ITEM_AMOUNT]
    push.record_pushed(line.sequence, 150_000_000, plan.amounts, ["ii_1", "ii_2"], "in_1")
    line.remove([(UUID(line.pending_events[1].transaction_ids[0]), Decimal(150_000_000))], "rev")
    smaller = plan_push(line, push)
    assert smaller is not None and smaller.amounts == [0, 0]


def test_an_item_planned_before_a_crash_is_created_with_its_planned_parameters() -> None:
    line = _line("100")
    push = _push(line)
    push.plan_item(0, line.sequence, 100)
    planned_at = line.sequence
    line.settle([(uuid4(), Decimal("20"))])
    plan = plan_push(line, push)
    assert plan is not None and plan.to_plan == ()
    [step] = plan.items
    assert (step.create_sequence, step.create_amount) == (planned_at, 100)
    assert (step.amount, step.update) == (120, True)


def test_items_are_planned_in_order_and_once() -> None:
    push = _push(_line())
    push.plan_item(0, 2, 10)
    push.plan_item(0, 3, 99)  # already planned: kept as it was
    assert push.planned == [[2, 10]]
    with pytest.raises(ValueError, match="in order"):
        push.plan_item(2, 3, 1)


def test_an_older_push_cannot_be_recorded_after_a_newer_one() -> None:
    push = _push(_line())
    push.record_pushed(5, 10, [10], ["ii_1"], "in_1")
    with pytest.raises(ValueError, match="after 5"):
        push.record_pushed(4, 9, [9], ["ii_1"], "in_1")
    with pytest.raises(ValueError, match="do not add up"):
        push.record_pushed(6, 10, [9], ["ii_1"], "in_1")


def test_charges_are_recorded_only_up_to_what_stripe_acknowledged() -> None:
    push = _push(_line())
    push.record_pushed(5, 10, [10], ["ii_1"], "in_1")
    with pytest.raises(ValueError):
        push.record_charges(6, 1)
    push.record_charges(5, 3)
    with pytest.raises(ValueError):
        push.record_charges(5, 3)


# -- after a failure ------------------------------------------------------------------


def test_a_retryable_failure_is_retried_after_the_backoff_and_retry_after() -> None:
    push = _push(_line())
    policy = RetryPolicy(base_delay=timedelta(seconds=2))
    down = ChargeFailure("http_503", "down", retryable=True)
    decision = after_failure(push, down, NOW, policy, 0.5)
    assert (decision.verdict, decision.next_attempt_at) == (
        PushVerdict.RETRY,
        NOW + timedelta(seconds=1),
    )
    slow = ChargeFailure("rate_limited", "slow", retryable=True, retry_after=timedelta(seconds=30))
    assert after_failure(push, slow, NOW, policy, 0.5).next_attempt_at == NOW + timedelta(
        seconds=30
    )


def test_a_refusal_abandons_with_the_error_as_the_reason() -> None:
    refused = ChargeFailure("http_400", "invalid currency", retryable=False)
    decision = after_failure(_push(_line()), refused, NOW, RetryPolicy(), 0.5)
    assert decision.verdict is PushVerdict.ABANDON
    assert decision.reason == "Stripe refused the line: http_400: invalid currency"


# -- charges ----------------------------------------------------------------------------


def test_charges_go_to_settled_transactions_still_chargeable_at_their_next_version() -> None:
    line = InvoiceLine.open("acme", "USD", "api.requests", DEC)
    a, b, c = uuid4(), uuid4(), uuid4()
    line.settle([(a, Decimal(1)), (b, Decimal(2))])
    line.settle([(c, Decimal(3))])
    line.remove([(b, Decimal(2))], "reversed")
    changes = [e for e in line.pending_events if not isinstance(e, InvoiceLine.Opened)]
    assert settled_in(changes) == [a, c]
    reserved, compensated = "domain.transaction:BillingTransaction.Reserved", "x.Compensated"
    events = charged_events(
        [a, c],
        {a: (2, reserved), c: (3, compensated)},
        stripe_object_id="ii_1",
        line_id=line.id,
        sequence=line.sequence,
    )
    [only] = events
    assert isinstance(only, BillingTransaction.Charged)
    assert (only.originator_id, only.originator_version, only.sequence) == (a, 3, line.sequence)


def test_periods_cut_usage_by_month_day_hour_or_seconds() -> None:
    at = datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC)
    assert PeriodPolicy.parse("month").period_of(at) == Period(
        datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)
    )
    assert PeriodPolicy.parse("day").period_of(at).start == datetime(2026, 12, 31, tzinfo=UTC)
    assert PeriodPolicy.parse("hour").period_of(at).end == datetime(2027, 1, 1, tzinfo=UTC)
    seconds = PeriodPolicy.parse("30").period_of(at)
    assert (seconds.start.second, seconds.end - seconds.start) == (30, timedelta(seconds=30))
    for bad in ("week", "0", "-5"):
        with pytest.raises(ValueError):
            PeriodPolicy.parse(bad)
