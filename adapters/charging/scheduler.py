"""Which line to push next: the oldest unsent change first, each line at most every
``settle_interval_s`` after a push Stripe took, a failed one not before its retry is due.

**Pushed when it settles.** With ``quiet_s`` set, a line that has gone quiet is pushed
without waiting out its interval (but never sooner than ``quiet_min_s`` after its last
push). Quiet means no change for ``QUIET_GAPS`` times the line's usual time between
changes (an average of the last few, as heard), and for at least ``quiet_s``: a line
whose usage stopped (a burst over, the load gone, Stripe back after an outage and the
backlog settled) is pushed within seconds instead of up to an interval later, while a
line that keeps changing at its own pace, fast or slow, is pushed once an interval and
costs nothing more. What it costs is a push of a line whose usage pauses for several of
its usual gaps and then goes on.

The scheduler is told about lines that changed (by the process manager, from the
events on ``billing.events``, and by the reconciler, from the database) and hands
them to ``workers`` threads that push them with the ``LinePusher``, one line of a
customer at a time: a customer's first pushes create its Stripe customer and draft
invoice, and two of its lines at once would send the same idempotency key twice
(Stripe answers the second 409). The Stripe
client's own budget (rate limit, in-flight limit, breaker) bounds how fast they go;
the order decides who waits: a busy customer's many changes are one line each, and
a line that was just pushed waits its interval while others go first. The schedule
lives in memory only: after a restart the reconciler finds every line with an unsent
change in the database again, so nothing depends on it surviving.

A push may set other lines of its invoice too (one ``update_lines`` request: the
report's ``lines``): their interval then runs from that push as well, so an invoice's
lines are pushed together, an interval apart. Their waiting entries stay: a change that
came after the push is never dropped (a push of a line Stripe is up to date with sends
nothing).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID

from adapters.charging.pusher import LinePusher, PushReport
from domain.saga import StepResult

__all__ = ["QUIET_GAPS", "LineScheduler"]

QUIET_GAPS = 4.0
"""A line is quiet after this many of its usual gaps between changes with none."""

_GAP_WEIGHT = 0.25  # the weight of the newest gap in a line's usual gap

log = logging.getLogger(__name__)


@dataclass
class _Entry:
    oldest_change: float  # monotonic time of the oldest change not pushed yet
    not_before: float  # monotonic time before which it is not pushed
    customer: str | None = None
    newest_change: float | None = None  # when the newest change was heard of (None: oldest)

    def newest(self) -> float:
        return self.oldest_change if self.newest_change is None else self.newest_change


class LineScheduler:
    """Lines waiting to be pushed, and the threads that push them."""

    remembered_pushes = 10_000  # past this many lines, pushes older than the interval go

    def __init__(
        self,
        pusher: LinePusher,
        *,
        settle_interval_s: float,
        workers: int,
        clock: Callable[[], float] = time.monotonic,
        condition: threading.Condition | None = None,
        quiet_s: float = 0.0,
        quiet_min_s: float = 0.0,
    ) -> None:
        """``clock`` is monotonic seconds; ``condition`` is what a worker with nothing
        ready waits on (a test gives one whose wait moves its clock instead); ``quiet_s``
        (0: off) and ``quiet_min_s``: a line quiet that long is pushed before its
        interval ends, but not sooner than ``quiet_min_s`` after its last push."""
        self.pusher = pusher
        self.settle_interval_s = settle_interval_s
        self.quiet_s = quiet_s
        self.quiet_min_s = quiet_min_s
        self.workers = workers
        self.clock = clock
        self._waiting: dict[UUID, _Entry] = {}
        self._busy: set[UUID] = set()
        self._busy_customers: set[str] = set()
        self._customer_of: dict[UUID, str | None] = {}
        self._last_push: dict[UUID, float] = {}
        self._heard: dict[UUID, float] = {}  # when its newest change was heard of
        self._gap: dict[UUID, float] = {}  # its usual time between changes, as heard
        self._cond = condition or threading.Condition()
        self.pushed = 0
        self.requests = 0
        self.charged = 0

    def changed(
        self,
        line_id: UUID,
        *,
        customer: str | None = None,
        changed_at: datetime | None = None,
        due: datetime | None = None,
    ) -> None:
        """``line_id`` (of ``customer``) has a change to push (``changed_at``: when,
        when it is one found again rather than heard of now; ``due``: not before)."""
        self._enqueue(line_id, customer, changed_at, due, heard=changed_at is None)

    def hand_over(self, line_id: UUID, customer: str | None = None) -> None:
        """Push ``line_id`` by the usual rules though nothing was heard of it (the closer
        waiting for a line's final total, the draft checker's drifted line): it is no
        change, so it does not set the line's pace (nor delays the quiet of a line
        already waiting; one not waiting is quiet from now)."""
        self._enqueue(line_id, customer, None, None, heard=False)

    def _enqueue(
        self,
        line_id: UUID,
        customer: str | None,
        changed_at: datetime | None,
        due: datetime | None,
        *,
        heard: bool,
    ) -> None:
        now = self.clock()
        oldest = now - _ago(changed_at) if changed_at is not None else now
        not_before = now + _until(due) if due is not None else now
        with self._cond:
            if heard:  # a change heard of now: how far apart they come
                self._heard_of(line_id, now)
            entry = self._waiting.get(line_id)
            if entry is None:
                self._waiting[line_id] = _Entry(oldest, not_before, customer, now)
            else:
                entry.oldest_change = min(entry.oldest_change, oldest)
                if heard:  # a change heard of now, not one found again
                    entry.newest_change = now
                entry.not_before = max(entry.not_before, not_before) if due else entry.not_before
            self._cond.notify()

    def _heard_of(self, line_id: UUID, now: float) -> None:
        before = self._heard.get(line_id)
        self._heard[line_id] = now
        if before is None or now <= before or now - before >= self.settle_interval_s:
            # A pause of an interval or more is no pace: the line's next change is pushed
            # at once after it anyway (and the line is forgotten past it, see
            # ``_forget_old_pushes``); counted, it would keep a burst after a pause from
            # ever being quiet.
            return
        gap, usual = now - before, self._gap.get(line_id)
        self._gap[line_id] = gap if usual is None else usual + _GAP_WEIGHT * (gap - usual)

    def quiet_after(self, line_id: UUID) -> float:
        """How long ``line_id`` must have had no change to count as quiet."""
        return max(self.quiet_s, QUIET_GAPS * self._gap.get(line_id, 0.0))

    def waiting(self) -> int:
        with self._cond:
            return len(self._waiting) + len(self._busy)

    def run(self, stop: threading.Event, pulse: Callable[[], None] = lambda: None) -> None:
        """Push lines with ``workers`` threads until ``stop``; waits for pushes in flight."""
        threads = [
            threading.Thread(target=self._work, args=(stop, pulse), name=f"push-{i}", daemon=True)
            for i in range(self.workers)
        ]
        for t in threads:
            t.start()
        stop.wait()
        with self._cond:
            self._cond.notify_all()
        for t in threads:
            t.join()

    def _work(self, stop: threading.Event, pulse: Callable[[], None]) -> None:
        while not stop.is_set():
            pulse()
            line = self._take(stop)
            if line is None:
                continue
            try:
                report = self.pusher.push(line)
            except Exception:
                log.exception("push of line %s failed", line)
                report = PushReport(StepResult.RACED)
            self._done(line, report)

    def _take(self, stop: threading.Event) -> UUID | None:
        """The ready line with the oldest change, or None after a short wait."""
        with self._cond:
            now = self.clock()
            ready = [
                (entry.oldest_change, line)
                for line, entry in self._waiting.items()
                if line not in self._busy
                and entry.customer not in self._busy_customers
                and self._ready_at(line, entry) <= now
            ]
            if not ready:
                upcoming = [
                    self._ready_at(line, e) for line, e in self._waiting.items()
                    if line not in self._busy
                ]  # fmt: skip
                wait = min(upcoming, default=now + 0.5) - now
                self._cond.wait(timeout=min(max(wait, 0.005), 0.5))
                return None
            _, line = min(ready)
            customer = self._waiting.pop(line).customer
            self._busy.add(line)
            self._customer_of[line] = customer
            if customer is not None:
                self._busy_customers.add(customer)
            return line

    def _ready_at(self, line: UUID, entry: _Entry) -> float:
        last = self._last_push.get(line)
        if last is None:
            return entry.not_before
        settled = last + self.settle_interval_s
        if self.quiet_s:  # quiet since its newest change: it need not wait out the interval
            quiet = max(entry.newest() + self.quiet_after(line), last + self.quiet_min_s)
            settled = min(settled, quiet)
        return max(entry.not_before, settled)

    def _done(self, line: UUID, report: PushReport) -> None:
        now = self.clock()
        with self._cond:
            self._busy.discard(line)
            customer = self._customer_of.pop(line, None)
            if customer is not None:
                self._busy_customers.discard(customer)
            self.requests += report.requests
            self.charged += report.charged
            if report.requests:
                self.pushed += 1
            if report.requests and report.result is StepResult.CHARGED:
                # The interval runs from a push Stripe took; a failed one waits its retry
                # only (after an outage, a line the breaker's probe failed on goes as
                # soon as Stripe is back, not an interval after the probe).
                self._last_push[line] = now
                for other in report.lines:
                    self._last_push[other] = now
            if report.result in (StepResult.RETRY, StepResult.WAIT):
                retry_at = now + _until(report.retry_at) if report.retry_at else now + 1.0
                entry = self._waiting.setdefault(line, _Entry(now, retry_at, customer))
                entry.not_before = max(entry.not_before, retry_at)
            elif report.result is StepResult.RACED:
                self._waiting.setdefault(line, _Entry(now, now + 0.05, customer))
            elif report.result in (StepResult.CHARGED, StepResult.COMPENSATED) and report.more:
                self._waiting.setdefault(line, _Entry(now, now, customer))
            self._forget_old_pushes(now)
            self._cond.notify()

    def _forget_old_pushes(self, now: float) -> None:
        cutoff = now - self.settle_interval_s
        if len(self._last_push) > self.remembered_pushes:
            for line in [k for k, at in self._last_push.items() if at < cutoff]:
                del self._last_push[line]
        if len(self._heard) > self.remembered_pushes:  # lines not heard of for an interval
            for line in [k for k, at in self._heard.items() if at < cutoff]:
                del self._heard[line]
                self._gap.pop(line, None)


def _ago(moment: datetime) -> float:
    return max((datetime.now(UTC) - moment).total_seconds(), 0.0)


def _until(moment: datetime) -> float:
    return max((moment - datetime.now(UTC)).total_seconds(), 0.0)
