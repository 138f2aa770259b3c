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
