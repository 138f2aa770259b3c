"""What ``InvoiceLine`` and ``LinePush`` record: each event's fields as stored, the
defaults of the pushers' calls, and the refusals' messages (they reach the logs)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from uuid import UUID

import pytest

from domain.errors import IllegalTransition
from domain.invoice_line import InvoiceLine, LinePush
from domain.periods import Period

MARCH = Period(datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC))
NEXT = datetime(2026, 4, 2, 9, 30, tzinfo=UTC)
T1 = UUID("00000000-0000-4000-8000-0000000000a1")
T2 = UUID("00000000-0000-4000-8000-0000000000b2")


def _line() -> InvoiceLine:
    line = InvoiceLine.open("acme-42", "EUR", "api.calls", MARCH)
    line.settle([(T1, Decimal("3.25")), (T2, Decimal("7.5"))])
    return line


def _last(aggregate: InvoiceLine | LinePush) -> object:
    return aggregate.pending_events[-1]


# -- InvoiceLine ----------------------------------------------------------------------


def test_freezing_records_the_invoice_the_line_is_on() -> None:
    line = _line()
    line.freeze()
    event = _last(line)
    assert isinstance(event, InvoiceLine.Frozen)
    assert event.invoice_id == line.invoice_id


def test_settling_a_frozen_line_is_refused_naming_it() -> None:
    line = _line()
    line.freeze()
    message = f"line {line.id} is frozen: its invoice has closed"
    with pytest.raises(IllegalTransition, match=f"^{re.escape(message)}$"):
        line.settle([(UUID(int=3), Decimal(1))])


def test_a_removal_records_its_reason() -> None:
    line = _line()
    line.remove([(T2, Decimal("7.5"))], "reversal INC-12")
    event = _last(line)
    assert isinstance(event, InvoiceLine.Removed)
    assert (event.transaction_ids, event.amounts, event.reason) == (
        [str(T2)],
        ["7.5"],
        "reversal INC-12",
    )
    assert (event.exact_total, event.billed, event.transactions) == (Decimal("3.25"), 3, 1)


def test_a_removal_without_a_reason_is_refused_saying_so() -> None:
    with pytest.raises(ValueError, match=r"^removing from a line needs a reason$"):
        _line().remove([(T2, Decimal("7.5"))], "  ")


# -- LinePush -------------------------------------------------------------------------


def test_planning_an_item_records_its_chunk_sequence_and_amount() -> None:
    push = LinePush(line_id=_line().id)
    push.plan_item(0, 2, 11)
    push.plan_item(1, 3, 4)
    event = _last(push)
    assert isinstance(event, LinePush.ItemPlanned)
    assert (event.chunk, event.sequence, event.amount) == (1, 3, 4)
    assert push.planned == [[2, 11], [3, 4]]


def test_a_push_records_every_field_and_no_requests_by_default() -> None:
    push = LinePush(line_id=_line().id)
    push.record_pushed(2, 11, [7, 4], ["ii_a", "ii_b"], "in_9")
    event = _last(push)
    assert isinstance(event, LinePush.Pushed)
    assert (event.sequence, event.billed, event.amounts, event.item_ids) == (
        2,
        11,
        [7, 4],
        ["ii_a", "ii_b"],
    )
    assert (event.stripe_invoice_id, event.requests) == ("in_9", 0)
    push.record_pushed(3, 12, [12], ["ii_a"], "in_9", requests=2)
    assert _last(push).requests == 2  # type: ignore[attr-defined]


def test_the_same_sequence_may_be_acknowledged_again_but_not_an_older_one() -> None:
    push = LinePush(line_id=_line().id)
    push.record_pushed(4, 11, [11], ["ii_a"], "in_9")
    push.record_pushed(4, 11, [11], ["ii_a"], "in_9")  # a retry Stripe already held
    assert (push.pushed_sequence, len(push.pending_events)) == (4, 3)
    with pytest.raises(ValueError, match=r"^push of sequence 3 after 4$"):
        push.record_pushed(3, 11, [11], ["ii_a"], "in_9")


def test_a_failure_records_every_field_counts_attempts_and_no_requests_by_default() -> None:
    push = LinePush(line_id=_line().id)
    push.record_failure(5, "APIConnectionError", "reset", retryable=True, next_attempt_at=NEXT)
    first = _last(push)
    assert isinstance(first, LinePush.PushFailed)
    assert (first.sequence, first.attempt, first.error_class, first.message) == (
        5,
        1,
        "APIConnectionError",
        "reset",
    )
    assert (first.retryable, first.next_attempt_at, first.requests) == (True, NEXT, 0)
    later = NEXT + timedelta(minutes=3)
    push.record_failure(6, "RateLimitError", "slow down", retryable=True, next_attempt_at=later)
    push.record_failure(
        6, "CardError", "declined", retryable=False, next_attempt_at=None, requests=3
    )
    last = _last(push)
    assert isinstance(last, LinePush.PushFailed)
    assert (last.attempt, last.retryable, last.next_attempt_at, last.requests) == (
        3,
        False,
        None,
        3,
    )
    assert (push.attempts, push.last_error) == (3, "CardError: declined")


def test_a_retryable_failure_without_a_due_time_is_refused_saying_so() -> None:
    push = LinePush(line_id=_line().id)
    with pytest.raises(ValueError, match=r"^a retryable failure needs next_attempt_at$"):
        push.record_failure(1, "Timeout", "no answer", retryable=True, next_attempt_at=None)


def test_recording_charges_records_how_many_and_refuses_with_the_figures() -> None:
    push = LinePush(line_id=_line().id)
    push.record_pushed(3, 11, [11], ["ii_a"], "in_9")
    push.record_charges(2, 5)
    event = _last(push)
    assert isinstance(event, LinePush.ChargesRecorded)
    assert (event.through, event.transactions) == (2, 5)
    with pytest.raises(ValueError, match=r"^charges through 4: pushed 3, charged through 2$"):
        push.record_charges(4, 1)
