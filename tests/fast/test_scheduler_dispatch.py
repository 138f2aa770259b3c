"""The push scheduler's dispatch, on a clock the test moves (``LineScheduler``, its
workers not running): the oldest unsent change first, one push of a line at a time,
one line of a customer at a time, each line at most every settle interval, and a
failed or waiting line not before its due time."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from uuid import UUID

from adapters.charging.pusher import LinePusher, PushReport
from adapters.charging.scheduler import LineScheduler
from domain.saga import RetryPolicy, StepResult
from tests.fast.fakes import FakeGateway, memory_ledger

L1, L2, L3 = UUID(int=1), UUID(int=2), UUID(int=3)
SETTLE = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _NoWait(threading.Condition):
    """A worker with nothing ready returns at once instead of waiting."""

    def wait(self, timeout: float | None = None) -> bool:
        return False


def _scheduler() -> tuple[LineScheduler, Clock]:
    clock = Clock()
    pusher = LinePusher(memory_ledger(), FakeGateway(), RetryPolicy())
    scheduler = LineScheduler(
        pusher, settle_interval_s=SETTLE, workers=1, clock=clock, condition=_NoWait()
    )
    return scheduler, clock


STOP = threading.Event()


def test_the_line_with_the_oldest_unsent_change_goes_first() -> None:
    scheduler, _ = _scheduler()
    scheduler.changed(L1, customer="a")
    scheduler.changed(L2, customer="b", changed_at=datetime.now(UTC) - timedelta(seconds=30))
    scheduler.changed(L3, customer="c", changed_at=datetime.now(UTC) - timedelta(seconds=5))
    assert [scheduler._take(STOP) for _ in range(3)] == [L2, L3, L1]
    assert scheduler.waiting() == 3  # three busy


def test_a_line_is_pushed_by_one_worker_at_a_time_then_not_before_its_settle_interval() -> None:
    scheduler, clock = _scheduler()
    scheduler.changed(L1)
    assert scheduler._take(STOP) == L1
    scheduler.changed(L1)  # changed again while its push is in flight
    assert scheduler._take(STOP) is None
    scheduler._done(L1, PushReport(StepResult.CHARGED, 3, requests=1, charged=2))
    assert (scheduler.pushed, scheduler.requests, scheduler.charged) == (1, 1, 2)
    clock.now += SETTLE - 0.1
    assert scheduler._take(STOP) is None
    clock.now += 0.1
    assert scheduler._take(STOP) == L1


def test_a_customers_lines_go_one_at_a_time_so_its_first_push_is_alone() -> None:
    scheduler, _ = _scheduler()
    scheduler.changed(L1, customer="acme")
    scheduler.changed(L2, customer="acme")
    scheduler.changed(L3, customer="other")
    first = scheduler._take(STOP)
    assert first in (L1, L2)
    assert scheduler._take(STOP) == L3  # the other customer's, not acme's second line
    assert scheduler._take(STOP) is None
    scheduler._done(first, PushReport(StepResult.CHARGED, 1, requests=3))  # type: ignore[arg-type]
    assert scheduler._take(STOP) == ({L1, L2} - {first}).pop()


def test_a_failed_or_waiting_line_is_not_taken_before_its_due_time() -> None:
    scheduler, clock = _scheduler()
    scheduler.changed(L1)
    assert scheduler._take(STOP) == L1
    due = datetime.now(UTC) + timedelta(seconds=3)
    scheduler._done(L1, PushReport(StepResult.RETRY, 1, requests=0, retry_at=due))
    clock.now += 2.5
    assert scheduler._take(STOP) is None
    clock.now += 1.0
    assert scheduler._take(STOP) == L1


def test_a_lost_race_is_taken_again_soon_and_a_line_changed_meanwhile_at_once() -> None:
    scheduler, clock = _scheduler()
    scheduler.changed(L1)
    scheduler.changed(L2, customer="b")
    assert scheduler._take(STOP) == L1
    assert scheduler._take(STOP) == L2
    scheduler._done(L1, PushReport(StepResult.RACED))
    scheduler._done(L2, PushReport(StepResult.CHARGED, 2, requests=0, more=True))
    assert scheduler._take(STOP) == L2  # no request sent: no settle interval to wait
    assert scheduler._take(STOP) is None  # the raced one waits 50 ms
    clock.now += 0.05
    assert scheduler._take(STOP) == L1


def test_lines_set_by_another_lines_push_wait_their_interval_from_it_and_stay_scheduled() -> None:
    scheduler, clock = _scheduler()
    scheduler.changed(L1, customer="acme")
    assert scheduler._take(STOP) == L1
    scheduler.changed(L2, customer="acme")  # e.g. a change after the push loaded it
    # L1's push set L2 and L3 too (one request for the invoice)
    scheduler._done(L1, PushReport(StepResult.CHARGED, 3, requests=1, lines=(L2, L3)))
    scheduler.changed(L3, customer="other")
    assert scheduler._take(STOP) is None  # both wait the interval of that push...
    clock.now += SETTLE
    # ...and neither is dropped: a change may have come after the push
    assert {scheduler._take(STOP), scheduler._take(STOP)} == {L2, L3}
