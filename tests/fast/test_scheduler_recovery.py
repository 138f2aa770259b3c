"""After Stripe fails a push, the line waits for its retry only, not for a settle
interval: a line whose push failed during an outage goes as soon as Stripe is back."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from uuid import UUID

from adapters.charging.pusher import LinePusher, PushReport
from adapters.charging.scheduler import LineScheduler
from domain.saga import RetryPolicy, StepResult
from tests.fast.fakes import FakeGateway, memory_ledger

L1 = UUID(int=1)
SETTLE = 30.0
STOP = threading.Event()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _scheduler() -> tuple[LineScheduler, Clock]:
    clock = Clock()
    pusher = LinePusher(memory_ledger(), FakeGateway(), RetryPolicy())
    return LineScheduler(pusher, settle_interval_s=SETTLE, workers=1, clock=clock), clock


def test_a_push_stripe_failed_is_retried_when_due_not_a_settle_interval_later() -> None:
    scheduler, clock = _scheduler()
    scheduler.changed(L1)
    assert scheduler._take(STOP) == L1
    due = datetime.now(UTC) + timedelta(seconds=2)
    scheduler._done(L1, PushReport(StepResult.RETRY, 4, requests=1, retry_at=due))
    assert (scheduler.pushed, scheduler.requests) == (1, 1)  # a request, counted
    clock.now += 1.5
    assert scheduler._take(STOP) is None
    clock.now += 1.0
    assert scheduler._take(STOP) == L1  # 2.5 s later, not 30


def test_after_a_failure_the_next_push_stripe_takes_starts_the_interval() -> None:
    scheduler, clock = _scheduler()
    scheduler.changed(L1)
    assert scheduler._take(STOP) == L1
    scheduler._done(L1, PushReport(StepResult.RETRY, 4, requests=1, retry_at=datetime.now(UTC)))
    assert scheduler._take(STOP) == L1
    scheduler._done(L1, PushReport(StepResult.CHARGED, 4, requests=1, charged=3))
    scheduler.changed(L1)
    clock.now += SETTLE - 0.1
    assert scheduler._take(STOP) is None
    clock.now += 0.1
    assert scheduler._take(STOP) == L1


def _quiet_scheduler(quiet: float = 2.0, minimum: float = 5.0) -> tuple[LineScheduler, Clock]:
    clock = Clock()
    pusher = LinePusher(memory_ledger(), FakeGateway(), RetryPolicy())
    scheduler = LineScheduler(
        pusher, settle_interval_s=SETTLE, workers=1, clock=clock, quiet_s=quiet,
        quiet_min_s=minimum,
    )  # fmt: skip
    return scheduler, clock


def _pushed_once(scheduler: LineScheduler) -> None:
    scheduler.changed(L1)
    assert scheduler._take(STOP) == L1
    scheduler._done(L1, PushReport(StepResult.CHARGED, 4, requests=1, charged=3))


def _burst(scheduler: LineScheduler, clock: Clock, changes: int, every: float) -> None:
    """``changes`` changes of L1, ``every`` seconds apart, the last one now."""
    for i in range(changes):
        if i:
            clock.now += every
        scheduler.changed(L1)


def test_a_line_that_went_quiet_is_pushed_before_its_interval_ends() -> None:
    scheduler, clock = _quiet_scheduler()
    _pushed_once(scheduler)
    clock.now += 1.0
    _burst(scheduler, clock, 25, 0.2)  # busy: its usual gap is about 0.2 s
    assert scheduler.quiet_after(L1) == 2.0  # four of its gaps are less than the floor
    clock.now += 1.9
    assert scheduler._take(STOP) is None  # changed 1.9 s ago: not quiet yet
    clock.now += 0.1
    assert scheduler._take(STOP) == L1  # quiet for 2 s: pushed, 21 s before its interval


def test_a_line_that_changes_at_its_own_slow_pace_is_not_quiet_between_its_changes() -> None:
    scheduler, clock = _quiet_scheduler()
    _pushed_once(scheduler)
    for _ in range(9):  # a change every 3 s: each gap longer than the 2 s floor
        clock.now += 2.9
        assert scheduler._take(STOP) is None  # no change for 2.9 s, but that is its pace
        clock.now += 0.1
        scheduler.changed(L1)
    assert scheduler.quiet_after(L1) == 12.0  # four of its gaps
    clock.now += 3.0  # the interval is over: pushed once, as without a quiet time
    assert scheduler._take(STOP) == L1


def test_a_slow_line_whose_usage_stopped_is_pushed_after_four_of_its_gaps() -> None:
    scheduler, clock = _quiet_scheduler()
    _pushed_once(scheduler)
    clock.now += 1.0
    _burst(scheduler, clock, 5, 2.5)  # every 2.5 s: quiet after 10 s
    assert scheduler.quiet_after(L1) < 11.0
    clock.now += scheduler.quiet_after(L1) - 0.1
    assert scheduler._take(STOP) is None
    clock.now += 0.1
    assert scheduler._take(STOP) == L1  # about 19 s after its last push, not 30


def test_a_line_that_keeps_changing_waits_out_its_interval() -> None:
    scheduler, clock = _quiet_scheduler()
    _pushed_once(scheduler)
    for _ in range(int(SETTLE) - 1):  # a change every second: never quiet for 2 s
        clock.now += 1.0
        scheduler.changed(L1)
        assert scheduler._take(STOP) is None
    clock.now += 1.0
    assert scheduler._take(STOP) == L1  # its interval is over


def test_a_quiet_line_is_not_pushed_sooner_than_the_least_time_after_its_last_push() -> None:
    scheduler, clock = _quiet_scheduler(quiet=2.0, minimum=5.0)
    _pushed_once(scheduler)
    scheduler.changed(L1)
    clock.now += 4.9  # quiet for 4.9 s, but pushed 4.9 s ago
    assert scheduler._take(STOP) is None
    clock.now += 0.1
    assert scheduler._take(STOP) == L1


def test_without_a_quiet_time_a_quiet_line_waits_out_its_interval() -> None:
    scheduler, clock = _quiet_scheduler(quiet=0.0)
    _pushed_once(scheduler)
    scheduler.changed(L1)
    clock.now += SETTLE - 0.1
    assert scheduler._take(STOP) is None
    clock.now += 0.1
    assert scheduler._take(STOP) == L1


def test_a_quiet_line_still_waits_for_its_retry() -> None:
    scheduler, clock = _quiet_scheduler()
    _pushed_once(scheduler)
    scheduler.changed(L1)
    assert scheduler._take(STOP) is None
    clock.now += 5.0
    assert scheduler._take(STOP) == L1
    due = datetime.now(UTC) + timedelta(seconds=20)
    scheduler._done(L1, PushReport(StepResult.RETRY, 5, requests=1, retry_at=due))
    clock.now += 10.0  # quiet, past the least time, but its retry is not due
    assert scheduler._take(STOP) is None


def test_a_change_found_again_by_the_reconciler_does_not_make_a_line_look_busy() -> None:
    scheduler, clock = _quiet_scheduler()
    _pushed_once(scheduler)
    clock.now += 1.0
    _burst(scheduler, clock, 25, 0.2)
    clock.now += 1.0
    # The reconciler finds the same unsent change in the database (its oldest moment).
    scheduler.changed(L1, changed_at=datetime.now(UTC) - timedelta(seconds=1))
    clock.now += 1.0
    assert scheduler._take(STOP) == L1  # quiet since the change itself, 2 s ago
