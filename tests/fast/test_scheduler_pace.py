"""A line's usual gap between changes counts only its pace: not a pause longer than the
settle interval (after which the line is pushed at its first change anyway), nor the
closer's hand-over of a line it waits for (no change at all, handed over every
reconciler pass)."""

from __future__ import annotations

from adapters.charging.pusher import PushReport
from domain.saga import StepResult
from tests.fast.test_scheduler_recovery import (
    L1,
    SETTLE,
    STOP,
    _burst,
    _pushed_once,
    _quiet_scheduler,
)


def test_a_burst_after_an_idle_hour_is_pushed_once_it_is_over_not_an_interval_later() -> None:
    scheduler, clock = _quiet_scheduler()
    _pushed_once(scheduler)
    clock.now += 3600.0  # idle for an hour: its first change goes at once
    scheduler.changed(L1)
    assert scheduler._take(STOP) == L1
    scheduler._done(L1, PushReport(StepResult.CHARGED, 5, requests=1, charged=1))
    pushed_at = clock.now
    _burst(scheduler, clock, 10, 0.5)  # a burst: ten changes, half a second apart
    clock.now += 0.5  # ... then nothing; it has been 5 s since its push (the least time)
    # The hour's pause is not its pace: a burst that is over goes within seconds
    # (the module docstring: "a burst over ... is pushed within seconds").
    assert scheduler.quiet_after(L1) < 10.0, scheduler.quiet_after(L1)
    clock.now = pushed_at + 12.0
    assert scheduler._take(STOP) == L1  # not at pushed_at + SETTLE (30 s)


def test_the_closers_hand_over_is_no_change_and_does_not_set_the_lines_pace() -> None:
    scheduler, clock = _quiet_scheduler()
    _pushed_once(scheduler)
    clock.now += 1.0
    _burst(scheduler, clock, 25, 0.2)  # busy: its usual gap is about 0.2 s
    before = scheduler.quiet_after(L1)
    for _ in range(8):  # the closer hands the waiting line over every reconciler pass
        clock.now += 5.0
        scheduler.hand_over(L1, customer="acme")  # bootstrap.build_closer's hand_over
    assert scheduler.quiet_after(L1) == before, scheduler.quiet_after(L1)
    assert SETTLE == 30.0
