"""The alert webhooks role: alerts from ``billing.alerts`` to every endpoint, retried.

**Where it reads.** The ``billing.alerts`` topic, in a consumer group of its own
(``ALERT_WEBHOOK_GROUP``), not the event store's log: the topic holds exactly the
crossings (the relay publishes them from the store's ordered log, so the outbox stays
the one source), in the same documented JSON a receiver gets, so this role is one more
consumer of the public contract; reading the log with a position of its own would scan
every ingest event to find a few alerts. An alert read is fanned out to one pending
delivery per endpoint that wants it (``deliveries.fan_out``: idempotent, the pair is
unique), and the offsets are committed after that commits: a crash re-reads and adds
nothing.

**How it sends.** A dispatcher takes due deliveries (``deliveries.due``) and claims each
with a conditional UPDATE (``deliveries.claim``: no lock, nothing held across the call)
before handing it to its endpoint's lane: a pool of ``ALERT_WEBHOOK_CONCURRENCY``
threads per endpoint. A lane that is full is skipped (its deliveries stay pending in
the table, not queued in memory), so a slow or dead endpoint delays only its own
deliveries. Each attempt resolves and checks the URL again (``endpoints``), posts it
signed within ``ALERT_WEBHOOK_TIMEOUT_S`` (``sender``: each lane thread keeps its
connection to the checked address open while the receiver allows), and records the
outcome under its claim (the dispatcher writes the outcomes of the attempts that ended
since its last round in one statement, before it takes more): delivered; or pending
again after a jittered exponential backoff
(``domain.saga.backoff``: ``ALERT_WEBHOOK_RETRY_BASE_S`` doubling up to
``ALERT_WEBHOOK_RETRY_MAX_DELAY_S``); or failed once ``ALERT_WEBHOOK_RETRY_HORIZON_S``
(3 days) has passed since it was created or replayed. Delivery is at least once:
receivers deduplicate by the event id (an outcome not yet written when the process
ends, like an attempt cut short, leaves the claim to lapse and the delivery to be sent
again).
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from kafka import KafkaConsumer
from kafka.errors import CommitFailedError

from adapters.alerts import deliveries
from adapters.alerts.deliveries import DueDelivery
from adapters.alerts.endpoints import Resolver, UnsafeUrl, resolve_target, system_resolver
from adapters.alerts.messages import Alert
from adapters.alerts.policy import DeliveryPolicy
from adapters.alerts.sender import Kept, Outcome, post
from domain.saga import backoff
from store.connections import Database

__all__ = ["AlertWebhooks", "DeliveryPolicy", "decode_alert"]

log = logging.getLogger(__name__)

Sender = Callable[..., Outcome]


def decode_alert(value: bytes | None) -> Alert | None:
    """An alert from a ``billing.alerts`` record's bytes (None when it is not one)."""
    try:
        document = json.loads(value) if value is not None else None
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    ident, kind, customer = (document.get(k) for k in ("id", "type", "customer_id"))
    if not (isinstance(ident, str) and isinstance(kind, str) and isinstance(customer, str)):
        return None
    try:
        UUID(ident)
    except ValueError:
        return None
    assert value is not None
    return Alert(ident, kind, customer, value)


class _Lane:
    """One endpoint's attempts: at most ``size`` at a time."""

    def __init__(self, endpoint: UUID, size: int) -> None:
        self.size = size
        self.inflight: set[UUID] = set()
        self.pool = ThreadPoolExecutor(size, thread_name_prefix=f"webhook-{str(endpoint)[:8]}")

    @property
    def full(self) -> bool:
        return len(self.inflight) >= self.size


class AlertWebhooks:
    """Consumes ``billing.alerts`` and delivers; ``run(stop)`` until stopped."""

    def __init__(
        self,
        db: Database,
        consumer: KafkaConsumer | None,
        policy: DeliveryPolicy,
        *,
        resolve: Resolver = system_resolver,
        send: Sender = post,
    ) -> None:
        self.db = db
        self.consumer = consumer
        self.policy = policy
        self.resolve = resolve
        self.send = send
        self.pulse: Callable[[], None] = lambda: None
        self.read = self.unreadable = self.fanned_out = 0
        self.delivered = self.failed_attempts = self.gave_up = 0
        self._lanes: dict[UUID, _Lane] = {}
        self._ended: list[deliveries.Attempted] = []  # outcomes not yet written
        self._kept = Kept()  # each lane thread's open connection
        self._guard = threading.Lock()
        self._wake = threading.Event()
        self._random = random.Random()

    def run(self, stop: threading.Event) -> None:
        dispatcher = threading.Thread(
            target=self._dispatch_loop, args=(stop,), name="webhook-dispatch", daemon=True
        )
        dispatcher.start()
        try:
            while not stop.is_set():
                self.pulse()
                if self.consumer is None:  # sending only (what is in the table)
                    stop.wait(0.1)
                self.poll_once()
                if not dispatcher.is_alive() and not stop.is_set():
                    raise RuntimeError("the webhook dispatcher stopped")
        finally:
            self._wake.set()
            dispatcher.join(timeout=5)
            self.close()

    def close(self) -> None:
        for lane in self._lanes.values():
            lane.pool.shutdown(wait=True, cancel_futures=True)
        self._kept.close()
        try:
            self.write_outcomes()
        except psycopg.Error as exc:  # their claims lapse: those deliveries are sent again
            log.warning("webhook outcomes not recorded at close: %s", exc)
        if self.consumer is not None:
            self.consumer.close()

    # -- reading: billing.alerts to pending deliveries ----------------------------------

    def poll_once(self, timeout_ms: int = 100) -> int:
        """Fan out the alerts of one poll, then commit the offsets; how many were read."""
        if self.consumer is None:
            return 0
        polled = self.consumer.poll(timeout_ms=timeout_ms)
        records = [r for batch in polled.values() for r in batch]
        if not records:
            return 0
        alerts = []
        for record in records:
            alert = decode_alert(record.value)
            if alert is None:
                self.unreadable += 1
                log.warning(
                    "alert record unreadable, skipped",
                    extra={"partition": record.partition, "offset": record.offset},
                )
            else:
                alerts.append(alert)
        with self.db.connection() as conn:
            self.fanned_out += deliveries.fan_out(conn, alerts)
        self.read += len(alerts)
        self._wake.set()
        try:
            self.consumer.commit()
        except CommitFailedError as exc:  # rebalanced: read again, and fanned out to nothing
            log.warning("alert offsets not committed after a rebalance: %s", exc)
        return len(records)

    # -- sending: due deliveries to their endpoints' lanes ------------------------------

    def _dispatch_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                taken = self.dispatch_once()
            except psycopg.Error as exc:
                log.warning("webhook dispatch failed, trying again: %s", exc)
                taken = 0
            if not taken:
                self._wake.wait(0.1)
                self._wake.clear()

    def dispatch_once(self) -> int:
        """Write the outcomes of the attempts that ended, then claim the due deliveries
        whose lanes have room and start them; how many were started."""
        self.write_outcomes()
        with self._guard:
            busy = [e for e, lane in self._lanes.items() if lane.full]
            free = sum(lane.size - len(lane.inflight) for lane in self._lanes.values())
        # As many as the lanes have room for, and a lane's worth for an endpoint without
        # one yet: an attempt ends with a round, and a round that read a whole batch of
        # rows (with their payloads) to start one attempt cost more than the attempt.
        limit = min(self.policy.batch, max(free, 0) + self.policy.concurrency)
        with self.db.connection() as conn:
            found = deliveries.due(conn, limit=limit, busy=busy)
        room: dict[UUID, int] = {}
        chosen = []
        for delivery in found:
            lane = self._lane(delivery.endpoint_id)
            with self._guard:
                left = room.setdefault(delivery.endpoint_id, lane.size - len(lane.inflight))
                if left <= 0 or delivery.delivery_id in lane.inflight:
                    continue
                room[delivery.endpoint_id] = left - 1
            chosen.append(delivery)
        with self.db.connection() as conn:
            claimed = deliveries.claim(conn, chosen, self.policy.lease)  # others took the rest
        for delivery in claimed:
            lane = self._lane(delivery.endpoint_id)
            with self._guard:
                lane.inflight.add(delivery.delivery_id)
            lane.pool.submit(self._attempt, lane, delivery)
        return len(claimed)

    def _lane(self, endpoint: UUID) -> _Lane:
        with self._guard:
            lane = self._lanes.get(endpoint)
            if lane is None:
                lane = self._lanes[endpoint] = _Lane(endpoint, self.policy.concurrency)
            return lane

    def _attempt(self, lane: _Lane, delivery: DueDelivery) -> None:
        try:
            self._ended_with(delivery, self._send(delivery))
        except Exception:  # a lane thread never dies: the claim lapses, it is sent again
            log.exception(
                "webhook attempt not recorded", extra={"delivery": str(delivery.delivery_id)}
            )
        finally:
            with self._guard:
                lane.inflight.discard(delivery.delivery_id)
            self._wake.set()

    def _send(self, delivery: DueDelivery) -> Outcome:
        try:
            target = resolve_target(
                delivery.url, allow_private=self.policy.allow_private, resolve=self.resolve
            )
        except UnsafeUrl as exc:  # DNS changed since registration, or a name gone
            return Outcome(False, None, f"refused: {exc}"[:500])
        return self.send(
            target,
            delivery.payload,
            delivery.secret,
            str(delivery.event_id),
            self.policy.timeout_s,
            self._kept,
        )

    def _ended_with(self, delivery: DueDelivery, outcome: Outcome) -> None:
        """The attempt's outcome, to be written by the dispatcher's next round (its
        claim still holds the delivery: no one else takes it meanwhile)."""
        if outcome.delivered:
            status, wait = "delivered", timedelta(0)
        else:
            wait = backoff(delivery.attempts + 1, self.policy.retry, self._random.random())
            over = datetime.now(UTC) + wait > delivery.retry_from + self.policy.retry.horizon
            status = "failed" if over else "pending"
            log.info(
                "webhook attempt failed",
                extra={
                    "delivery": str(delivery.delivery_id),
                    "endpoint": str(delivery.endpoint_id),
                    "error": outcome.error,
                    "gave_up": over,
                },
            )
        ended = deliveries.Attempted(delivery, status, outcome.status, outcome.error, wait)
        with self._guard:
            self._ended.append(ended)

    def write_outcomes(self) -> int:
        """Write the outcomes of the attempts that ended, in one statement; how many were
        written (one whose claim lapsed is not: another attempt stands in its place). If
        the database refuses, they are kept for the next round; one it cannot take (a
        value it refuses) is left out, not kept: it must not hold the others back."""
        with self._guard:
            ended, self._ended = self._ended, []
        if not ended:
            return 0
        try:
            with self.db.connection() as conn:
                recorded = deliveries.record(conn, ended)
        except psycopg.DataError:
            return self._write_each(ended)
        except BaseException:
            with self._guard:
                self._ended[:0] = ended
            raise
        written = self._written(ended, recorded)
        self._count(written)
        return len(written)

    def _count(self, written: Sequence[deliveries.Attempted]) -> None:
        """Count outcomes written (``close()`` may write beside a dispatcher still
        running)."""
        with self._guard:
            self.delivered += sum(e.status == "delivered" for e in written)
            self.failed_attempts += sum(e.status != "delivered" for e in written)
            self.gave_up += sum(e.status == "failed" for e in written)

    @staticmethod
    def _written(
        ended: list[deliveries.Attempted], recorded: set[UUID]
    ) -> list[deliveries.Attempted]:
        """The outcomes written; those whose claim was gone are said (the lease passed
        before they were written, and another attempt stands in their place)."""
        written = []
        for outcome in ended:
            if outcome.delivery.delivery_id in recorded:
                written.append(outcome)
            else:
                log.warning(
                    "webhook outcome not recorded: its claim had lapsed",
                    extra={"delivery": str(outcome.delivery.delivery_id)},
                )
        return written

    def _write_each(self, ended: list[deliveries.Attempted]) -> int:
        """One statement per outcome, after one of them made the database refuse them
        all: that one is dropped (its claim lapses and it is sent again); the others are
        written, or kept for the next round if the database goes away meanwhile. Those
        written are counted, even when a later one stops the round; how many."""
        written: list[deliveries.Attempted] = []
        try:
            for i, outcome in enumerate(ended):
                try:
                    with self.db.connection() as conn:
                        recorded = deliveries.record(conn, [outcome])
                    written += self._written([outcome], recorded)
                except psycopg.DataError as exc:
                    log.error(
                        "webhook outcome refused by the database, dropped: %s",
                        exc,
                        extra={"delivery": str(outcome.delivery.delivery_id)},
                    )
                except BaseException:
                    with self._guard:
                        self._ended[:0] = ended[i:]
                    raise
        finally:
            self._count(written)
        return len(written)

    def stats(self) -> dict[str, Any]:
        """The counters, the outcomes' three read together (``_count`` moves them under
        the same guard, so one reading never mixes two writes)."""
        with self._guard:
            outcomes = {
                "delivered": self.delivered,
                "failed_attempts": self.failed_attempts,
                "gave_up": self.gave_up,
                "outcomes_unwritten": len(self._ended),
            }
        return {k: getattr(self, k) for k in ("read", "unreadable", "fanned_out")} | outcomes
