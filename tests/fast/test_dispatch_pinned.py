"""The push scheduler's dispatch pinned down (``LineScheduler``) on a monotonic clock the
test moves: the oldest unsent change first, one push per line at a time, a customer's
first push alone, and each retry, settle and idle wait to the exact second. A worker
with nothing ready waits on a condition whose wait moves the same clock by the time it
would have slept, so the idle waits are asserted exactly and nothing sleeps. The
workers (``run``) push through the real ``LinePusher`` to the fake Stripe."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from kafka import TopicPartition

from adapters.charging.corrections import Corrections
from adapters.charging.ownership import Ownership, partition_of
from adapters.charging.pusher import LinePusher, PushReport
from adapters.charging.reconciler import Reconciler
from adapters.charging.scheduler import LineScheduler
from domain.ports import LineItems
from domain.saga import ChargeFailure, RetryPolicy, StepResult
from domain.transaction import BillingTransaction, Source
from store.ledger import BillingLedger
from tests.fast.fakes import FakeGateway, memory_ledger, reserve, usage

L1, L2, L3 = UUID(int=1), UUID(int=2), UUID(int=3)
SETTLE = 10.0
START = 1000.0
STOP = threading.Event()  # never set: _take does not look at it


class Clock:
    """Monotonic seconds the test (or a worker's idle wait) moves."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


class ClockCondition(threading.Condition):
    """The workers' condition: a wait returns at once and moves the clock by its timeout
    (what a worker would have slept), recording it. After ``max_waits`` waits it sets
    ``stop``, so a worker that never finds its line cannot hang the test."""

    def __init__(self, clock: Clock, stop: threading.Event | None = None) -> None:
        super().__init__()
        self.clock = clock
        self.waits: list[float | None] = []
        self.stop = stop
        self.max_waits = 50

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        self.clock.now += timeout or 0.0
        if self.stop is not None and len(self.waits) >= self.max_waits:
            self.stop.set()
        return False


def _scheduler(
    pusher: LinePusher | None = None, stop: threading.Event | None = None, workers: int = 1
) -> tuple[LineScheduler, Clock, ClockCondition]:
    clock = Clock()
    condition = ClockCondition(clock, stop)
    pusher = pusher or LinePusher(memory_ledger(), FakeGateway(), RetryPolicy())
    scheduler = LineScheduler(
        pusher, settle_interval_s=SETTLE, workers=workers, clock=clock, condition=condition
    )
    return scheduler, clock, condition


def _ago(seconds: float) -> datetime:
    return datetime.now(UTC) - timedelta(seconds=seconds)


def _in(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


# -- order -------------------------------------------------------------------------------


def test_a_change_stamped_in_the_future_counts_as_changed_now_not_earlier() -> None:
    scheduler, _, _ = _scheduler()
    scheduler.changed(L2, customer="b", changed_at=_in(30))  # the writer's clock is ahead
    scheduler.changed(L1, customer="a")
    # Both changed "now": the tie goes by line id, the future stamp buys no priority.
    assert [scheduler._take(STOP), scheduler._take(STOP)] == [L1, L2]


def test_a_line_changed_again_keeps_its_oldest_unsent_change_for_its_place() -> None:
    scheduler, _, _ = _scheduler()
    scheduler.changed(L1, customer="a", changed_at=_ago(60))
    scheduler.changed(L2, customer="b", changed_at=_ago(30))
    scheduler.changed(L3, customer="c", changed_at=_ago(45))
    scheduler.changed(L1, customer="a")  # a newer change does not move it back
    scheduler.changed(L2, customer="b", changed_at=_ago(90))  # an older one moves it up
    assert [scheduler._take(STOP) for _ in range(3)] == [L2, L1, L3]


# -- due times ---------------------------------------------------------------------------


def test_a_line_changed_with_a_due_time_is_not_taken_before_it() -> None:
    scheduler, clock, _ = _scheduler()
    scheduler.changed(L1, due=_in(3))
    clock.now = START + 2.5
    assert scheduler._take(STOP) is None
    clock.now = START + 3.0
    assert scheduler._take(STOP) == L1


def test_a_due_time_already_passed_is_ready_at_once() -> None:
    scheduler, _, _ = _scheduler()
    scheduler.changed(L1, due=_ago(5))
    assert scheduler._take(STOP) == L1


def test_a_later_due_time_for_a_waiting_line_postpones_it_and_a_change_without_one_does_not() -> (
    None
):
    scheduler, clock, _ = _scheduler()
    scheduler.changed(L1)
    scheduler.changed(L1, due=_in(5))
    scheduler.changed(L1)  # a new change without a due time keeps the due time
    clock.now = START + 4.5
    assert scheduler._take(STOP) is None
    clock.now = START + 5.0
    assert scheduler._take(STOP) == L1


def test_a_failed_push_without_a_due_time_is_retried_one_second_later() -> None:
    scheduler, clock, _ = _scheduler()
    scheduler.changed(L1)
    assert scheduler._take(STOP) == L1
    scheduler._done(L1, PushReport(StepResult.WAIT))
    clock.now = START + 0.5
    assert scheduler._take(STOP) is None
    clock.now = START + 1.0
    assert scheduler._take(STOP) == L1


def test_a_failed_push_of_a_line_changed_meanwhile_waits_for_its_retry_and_keeps_its_place() -> (
    None
):
    scheduler, clock, _ = _scheduler()
    scheduler.changed(L1, customer="a")
    assert scheduler._take(STOP) == L1
    scheduler.changed(L1, customer="a", changed_at=_ago(60))  # while its push is in flight
    scheduler.changed(L2, customer="b", changed_at=_ago(30))
    scheduler._done(L1, PushReport(StepResult.RETRY, retry_at=_in(2)))
    clock.now = START + 1.5
    assert scheduler._take(STOP) == L2  # L1's retry is not due yet
    scheduler.changed(L3, customer="c", changed_at=_ago(45))
    clock.now = START + 2.0
    assert [scheduler._take(STOP) for _ in range(2)] == [L1, L3]  # oldest change first


def test_a_line_is_ready_at_exactly_the_end_of_its_settle_interval() -> None:
    scheduler, clock, _ = _scheduler()
    scheduler.changed(L1)
    assert scheduler._take(STOP) == L1
    scheduler.changed(L1)
    scheduler._done(L1, PushReport(StepResult.CHARGED, 1, requests=1, charged=1))
    clock.now = START + SETTLE
    assert scheduler._take(STOP) == L1


# -- a customer's lines, one at a time -----------------------------------------------------


@pytest.mark.parametrize(
    "report",
    [
        PushReport(StepResult.RETRY),
        PushReport(StepResult.RACED),
        PushReport(StepResult.CHARGED, 1, requests=1, more=True),
        PushReport(StepResult.COMPENSATED, 1, requests=1, more=True),
    ],
    ids=["retry", "raced", "charged-more", "compensated-more"],
)
def test_a_line_scheduled_again_after_its_push_still_waits_for_its_customers_other_line(
    report: PushReport,
) -> None:
    scheduler, clock, _ = _scheduler()
    scheduler.changed(L1, customer="acme")
    scheduler.changed(L2, customer="acme", changed_at=_ago(1))
    assert scheduler._take(STOP) == L2
    scheduler._done(L2, report)
    assert scheduler._take(STOP) == L1  # acme is free: its other line
    clock.now = START + 2 * SETTLE
    assert scheduler._take(STOP) is None  # L2 is due, acme is busy with L1
    assert scheduler.waiting() == 2
    scheduler.changed(L3, customer="zed")
    scheduler._done(L1, PushReport(StepResult.NOTHING))
    assert [scheduler._take(STOP) for _ in range(2)] == [L2, L3]  # L2 waits since START


def test_a_line_with_nothing_more_to_push_is_not_scheduled_again() -> None:
    scheduler, clock, _ = _scheduler()
    for line in (L1, L2):
        scheduler.changed(line)
        assert scheduler._take(STOP) == line
    scheduler._done(L1, PushReport(StepResult.CHARGED, 1, requests=1, charged=1))
    scheduler._done(L2, PushReport(StepResult.NOTHING))
    clock.now = START + 2 * SETTLE
    assert scheduler._take(STOP) is None
    assert scheduler.waiting() == 0


# -- counters ------------------------------------------------------------------------------


def test_the_counters_add_up_requests_charges_and_pushes_that_sent_a_request() -> None:
    scheduler, _, _ = _scheduler()
    assert (scheduler.pushed, scheduler.requests, scheduler.charged) == (0, 0, 0)
    for line in (L1, L2, L3):
        scheduler.changed(line)
        scheduler._take(STOP)
    scheduler._done(L1, PushReport(StepResult.CHARGED, 1, requests=3, charged=2))
    scheduler._done(L2, PushReport(StepResult.NOTHING))
    scheduler._done(L3, PushReport(StepResult.CHARGED, 1, requests=2, charged=5))
    assert (scheduler.pushed, scheduler.requests, scheduler.charged) == (2, 5, 7)


# -- idle waits ----------------------------------------------------------------------------


def test_a_worker_with_nothing_waiting_waits_half_a_second() -> None:
    scheduler, clock, condition = _scheduler()
    assert scheduler._take(STOP) is None
    assert condition.waits == [0.5] and clock.now == START + 0.5


def test_a_worker_waits_at_most_half_a_second_for_a_line_due_later() -> None:
    scheduler, clock, condition = _scheduler()
    scheduler.changed(L1, due=_in(2))
    assert scheduler._take(STOP) is None
    assert condition.waits == [0.5] and clock.now == START + 0.5


def test_a_worker_waits_the_50_ms_until_a_line_that_lost_a_race_is_due() -> None:
    scheduler, _, condition = _scheduler()
    scheduler.changed(L1)
    assert scheduler._take(STOP) == L1
    scheduler._done(L1, PushReport(StepResult.RACED))
    assert scheduler._take(STOP) is None
    assert condition.waits == [pytest.approx(0.05, abs=1e-9)]
    assert scheduler._take(STOP) == L1


def test_a_worker_waits_for_a_line_settling_to_the_end_of_its_interval_at_least_5_ms() -> None:
    scheduler, clock, condition = _scheduler()
    scheduler.changed(L1)
    scheduler._take(STOP)
    scheduler.changed(L1)
    scheduler._done(L1, PushReport(StepResult.CHARGED, 1, requests=1))
    clock.now = START + SETTLE - 0.25
    assert scheduler._take(STOP) is None
    clock.now = START + SETTLE - 0.001
    assert scheduler._take(STOP) is None
    assert condition.waits == [0.25, 0.005]


def test_a_worker_does_not_wait_for_a_line_whose_push_is_in_flight() -> None:
    scheduler, _, condition = _scheduler()
    scheduler.changed(L1)
    assert scheduler._take(STOP) == L1
    scheduler.changed(L1)  # changed during its push: the push's end wakes a worker
    assert scheduler._take(STOP) is None
    assert condition.waits == [0.5]


# -- memory ----------------------------------------------------------------------------


def test_past_the_remembered_pushes_a_line_pushed_within_its_interval_still_waits() -> None:
    scheduler, clock, _ = _scheduler()
    scheduler.remembered_pushes = 2  # 10,000 in production
    pushed = PushReport(StepResult.CHARGED, 1, requests=1)
    for line in (L2, L3):
        scheduler._done(line, pushed)  # pushed long ago
    clock.now = START + 2 * SETTLE
    scheduler.changed(L1)
    assert scheduler._take(STOP) == L1
    scheduler.changed(L1)
    scheduler._done(L1, pushed)  # the third: the old ones are forgotten, not this one
    clock.now = START + 3 * SETTLE - 0.5
    assert scheduler._take(STOP) is None
    clock.now = START + 3 * SETTLE
    assert scheduler._take(STOP) == L1


# -- the workers -------------------------------------------------------------------------


@contextmanager
def _watchdog(stop: threading.Event) -> Iterator[None]:
    """Stops a ``run`` whose workers quit early (a broken loop) instead of hanging."""
    timer = threading.Timer(5.0, stop.set)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()


class StopAfterPush(FakeGateway):
    """The fake Stripe; ``stop`` is set once a line's items are set."""

    stop: threading.Event

    def set_line_items(self, items: LineItems) -> list[str] | ChargeFailure:
        answer = super().set_line_items(items)
        self.stop.set()
        return answer


def test_the_workers_push_a_line_that_becomes_due_while_they_wait() -> None:
    stop = threading.Event()
    gateway = StopAfterPush()
    gateway.stop = stop
    pusher = LinePusher(memory_ledger(), gateway, RetryPolicy())
    txn = reserve(pusher.ledger, 2, quantity=500)[0]
    line = pusher.ledger.transaction(txn).line_id
    assert line is not None
    scheduler, _, condition = _scheduler(pusher, stop)  # one worker: no idle spin during a push
    scheduler.changed(line, customer="acme", due=_in(1))
    pulses: list[str] = []
    with _watchdog(stop):
        scheduler.run(stop, pulse=lambda: pulses.append(threading.current_thread().name))
    assert gateway.held(line) == [100]  # 1.00 USD: 1,000 requests at 0.1 cent
    assert (scheduler.pushed, scheduler.requests, scheduler.charged) == (1, 3, 2)
    assert condition.waits[0] == 0.5 and len(condition.waits) <= 2  # until it was due
    assert pulses and set(pulses) == {"push-0"}  # the worker's turns


def test_a_push_that_raises_is_logged_by_its_worker_and_the_line_taken_again_soon(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = threading.Event()
    scheduler, clock, _ = _scheduler(stop=stop)
    unknown = UUID(int=404)  # not in the ledger: the push raises
    scheduler.changed(unknown)
    turns: list[float] = []

    def pulse() -> None:
        turns.append(clock.now)
        if len(turns) == 2:
            stop.set()

    with caplog.at_level(logging.ERROR, logger="adapters.charging.scheduler"), _watchdog(stop):
        scheduler.run(stop, pulse=pulse)
    assert [r.threadName for r in caplog.records] == ["push-0"]
    assert f"push of line {unknown} failed" in caplog.messages
    assert scheduler.waiting() == 1 and scheduler.pushed == 0
    clock.now = turns[-1] + 0.05
    assert scheduler._take(STOP) == unknown


# -- the reconciler: what the database says is open, scheduled ------------------------------


class OpenWork:
    """The database as the reconciler reads it: the open lines the invoice-lines
    projection returns (line, customer, oldest unsent change, next attempt) and the
    transactions in no line; the accounts with a credit grant due to expire. Any other
    statement is refused."""

    def __init__(self, lines: list[tuple[UUID, str | None, Any, Any]], unlined: list[UUID]):
        self.lines = lines
        self.unlined = unlined
        self.expiring: list[tuple[str, str]] = []

    @contextmanager
    def connection(self) -> Iterator[OpenWork]:
        yield self

    def execute(self, query: Any, params: Any = None) -> OpenWork._Rows:
        text = query if isinstance(query, str) else query.as_string(None)
        if 'FROM "billing"."transactions"' in text:
            return self._Rows([(txn,) for txn in self.unlined])
        if "oldest_unsent_at" in text:
            return self._Rows(list(self.lines))
        if 'FROM "billing"."credit_grants"' in text:
            return self._Rows(list(self.expiring))
        raise AssertionError(f"unexpected statement: {text}")

    class _Rows:
        def __init__(self, rows: list[Any]) -> None:
            self.rows = rows

        def fetchall(self) -> list[Any]:
            return self.rows


NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
PARTITIONS = 4
MINE = next(f"c-{n}" for n in range(100) if partition_of(f"c-{n}", PARTITIONS) == 1)
THEIRS = next(f"c-{n}" for n in range(100) if partition_of(f"c-{n}", PARTITIONS) == 2)


def _reconciler(
    work: OpenWork, ownership: Ownership | None = None
) -> tuple[Reconciler, LineScheduler, Clock, BillingLedger]:
    scheduler, clock, _ = _scheduler()
    ledger = scheduler.pusher.ledger
    corrections = Corrections(ledger, FakeGateway())
    reconciler = Reconciler(
        corrections,
        scheduler,
        work,
        ownership=ownership,
        clock=lambda: NOW,  # type: ignore[arg-type]
    )
    return reconciler, scheduler, clock, ledger


def _legacy(ledger: BillingLedger, n: int) -> list[UUID]:
    """``n`` transactions as a history written before lines has them: in no line; and
    last, one that has joined its line already."""
    [lined] = reserve(ledger, 1, prefix="lined")
    account = ledger.transaction(lined).account_id
    assert account is not None
    ids = []
    for i in range(n):
        txn = BillingTransaction.from_usage(usage(f"old-{i}"), ledger.prices, Source("u", 0, i))
        txn.reserve(account)
        ledger.save(txn)
        ids.append(txn.id)
    return [*ids, lined]


def test_a_reconcile_pass_schedules_each_open_line_with_its_customer_change_and_due_time() -> None:
    work = OpenWork(
        [
            (L1, "acme", NOW - timedelta(seconds=30), None),
            (L2, "acme", NOW - timedelta(seconds=60), None),
            (L3, "zed", None, datetime.now(UTC) + timedelta(seconds=3)),
        ],
        [],
    )
    reconciler, scheduler, clock, _ = _reconciler(work)
    report = reconciler.pass_once()
    assert (report.lines, report.adopted, report.others) == (3, 0, 0)
    assert scheduler._take(STOP) == L2  # the oldest change
    assert scheduler._take(STOP) is None  # L1 is acme's too; L3 is not due yet
    clock.now = START + 3.0
    assert scheduler._take(STOP) == L3


def test_a_reconcile_pass_settles_each_transaction_from_before_lines_into_its_line() -> None:
    work = OpenWork([], [])
    reconciler, _, _, ledger = _reconciler(work)
    work.unlined = _legacy(ledger, 2)
    report = reconciler.pass_once()
    assert (report.lines, report.adopted, report.others) == (0, 2, 0)
    assert all(ledger.transaction(t).line_id is not None for t in work.unlined)


def test_a_reconcile_pass_records_the_expiry_of_each_grant_past_it_once() -> None:
    work = OpenWork([], [])
    reconciler, _, _, ledger = _reconciler(work)
    ledger.change_account("acme", "USD", lambda a: a.grant_credit(
        "promo", 500, effective_at=NOW - timedelta(days=2), expires_at=NOW,
        source="promotional", reason="welcome",
    ))  # fmt: skip
    work.expiring = [("acme", "USD")]
    assert reconciler.pass_once().expired == 1
    assert reconciler.pass_once().expired == 0  # recorded already: nothing more
    account = ledger.account("acme", "USD")
    assert account is not None
    assert (account.grants["promo"].expired, account.grants["promo"].remaining) == (500, 0)


def test_a_stopped_reconcile_pass_adopts_nothing_more_and_still_schedules_the_open_lines() -> None:
    work = OpenWork([(L1, "acme", None, None)], [])
    reconciler, scheduler, _, ledger = _reconciler(work)
    work.unlined = _legacy(ledger, 2)[:2]
    stop = threading.Event()
    stop.set()
    report = reconciler.pass_once(stop)
    assert (report.lines, report.adopted) == (1, 0)
    assert all(ledger.transaction(t).line_id is None for t in work.unlined)
    assert scheduler._take(STOP) == L1


def test_with_a_charge_consumer_a_pass_schedules_its_partitions_lines_and_late_ones_only() -> None:
    ownership = Ownership("billing.events", PARTITIONS, takeover_after=timedelta(seconds=60))
    ownership.on_partitions_assigned([TopicPartition("billing.events", 1)])
    late, recent = NOW - timedelta(seconds=60), NOW - timedelta(seconds=59)
    work = OpenWork(
        [
            (L1, MINE, recent, None),
            (L2, THEIRS, recent, None),  # its owner's
            (L3, THEIRS, late, None),  # its owner is late
            (UUID(int=4), THEIRS, None, None),  # not projected yet: its owner has it
        ],
        [],
    )
    reconciler, scheduler, _, _ = _reconciler(work, ownership)
    report = reconciler.pass_once()
    assert (report.lines, report.others) == (2, 2)
    assert scheduler.waiting() == 2
    assert {scheduler._take(STOP), scheduler._take(STOP)} == {L1, L3}
