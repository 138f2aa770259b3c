"""Each worker process says it is alive, what its circuit breakers are doing and how far
behind its consumer groups are, every ``heartbeat_interval_s``, in
``billing.workers`` and ``billing.consumer_lag`` (read by ``billing.queue_health``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

import psycopg
from psycopg.types.json import Jsonb

from adapters.broker import LagProbe, check_reachable
from adapters.settings import Settings
from store.connections import Database

__all__ = [
    "Heartbeat",
    "Pulses",
    "WorkerBeat",
    "forget_worker",
    "record_heartbeat",
    "record_lag",
    "worst_state",
]

FORGET_SILENT_AFTER_S = 3600.0  # a worker silent this long is dropped from billing.workers

log = logging.getLogger(__name__)

_SEVERITY = {"closed": 0, "half_open": 1, "open": 2}


class Breaker(Protocol):
    """What a heartbeat reads of a circuit breaker: its state."""

    @property
    def state(self) -> str: ...


def worst_state(breakers: Sequence[Breaker]) -> str | None:
    """The most open state among ``breakers`` (None when the process has none)."""
    states = [b.state for b in breakers]
    return max(states, key=lambda s: _SEVERITY.get(s, 2)) if states else None


class Pulses:
    """When each role's loop last went round, so a heartbeat can tell a live process
    from one whose role hangs (a loop turns at least every poll or reconcile interval)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._at: dict[str, float] = {}

    def of(self, role: str) -> Callable[[], None]:
        """The callback a role's loop calls at each turn."""

        def pulse() -> None:
            self._at[role] = self.clock()

        return pulse

    def ages(self) -> dict[str, float]:
        """Seconds since each role's loop last went round."""
        now = self.clock()
        return {role: round(now - at, 1) for role, at in sorted(self._at.items())}


@dataclass(frozen=True)
class WorkerBeat:
    """What a worker process says about itself at each heartbeat."""

    worker_id: str
    roles: list[str]
    host: str
    pid: int
    started_at: datetime
    breaker_state: str | None = None
    stats: Mapping[str, Any] = field(default_factory=dict)


def record_heartbeat(conn: psycopg.Connection[Any], beat: WorkerBeat) -> None:
    conn.execute(
        "INSERT INTO billing.workers AS w VALUES (%s, %s, %s, %s, %s, now(), %s, %s)"
        " ON CONFLICT (worker_id) DO UPDATE SET heartbeat_at = now(),"
        " breaker_state = excluded.breaker_state, stats = excluded.stats,"
        " roles = excluded.roles, host = excluded.host, pid = excluded.pid,"
        " started_at = excluded.started_at",
        (
            beat.worker_id,
            beat.roles,
            beat.host,
            beat.pid,
            beat.started_at,
            beat.breaker_state,
            Jsonb(dict(beat.stats)),
        ),
    )
    conn.execute(
        "DELETE FROM billing.workers WHERE heartbeat_at < now() - make_interval(secs => %s)",
        (FORGET_SILENT_AFTER_S,),
    )


def forget_worker(conn: psycopg.Connection[Any], worker_id: str) -> None:
    """Remove a worker that stopped cleanly (a crashed one stays, silent, for an hour)."""
    conn.execute("DELETE FROM billing.workers WHERE worker_id = %s", (worker_id,))


def record_lag(
    conn: psycopg.Connection[Any], group: str, topic: str, offsets: Mapping[int, tuple[int, int]]
) -> None:
    """Store ``{partition: (committed, end)}`` for ``group`` on ``topic``."""
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO billing.consumer_lag VALUES (%s, %s, %s, %s, %s, %s, now())"
            " ON CONFLICT (group_name, topic, partition) DO UPDATE SET"
            " committed_offset = excluded.committed_offset, end_offset = excluded.end_offset,"
            " lag = excluded.lag, recorded_at = excluded.recorded_at",
            [
                (group, topic, p, committed, end, max(end - committed, 0))
                for p, (committed, end) in sorted(offsets.items())
            ],
        )
        cur.execute(
            "DELETE FROM billing.consumer_lag"
            " WHERE recorded_at < now() - make_interval(secs => %s)",
            (FORGET_SILENT_AFTER_S,),
        )


class Heartbeat:
    """Records this process's heartbeat and its groups' lag; ``run(stop)`` repeats it."""

    def __init__(
        self,
        settings: Settings,
        database: Database,
        roles: Sequence[str],
        *,
        breakers: Sequence[Breaker] = (),
        stats: Callable[[], Mapping[str, Any]] = dict,
        pulses: Pulses | None = None,
    ) -> None:
        self.settings = settings
        self.database = database  # its own: a heartbeat must not wait behind the workers
        self.roles = list(roles)
        self.breakers = list(breakers)
        self.stats = stats
        self.pulses = pulses
        host = socket.gethostname()
        self.beat = WorkerBeat(
            worker_id=f"{host}:{os.getpid()}:{'+'.join(self.roles)}",
            roles=self.roles,
            host=host,
            pid=os.getpid(),
            started_at=datetime.now(UTC),
        )
        self.groups: list[tuple[str, str]] = []
        if "ingest" in self.roles:
            self.groups.append((settings.ingest_group, settings.usage_topic))
        if "charge" in self.roles:
            self.groups.append((settings.charge_group, settings.events_topic))
        self._lag: LagProbe | None = None
        self.lag_error: str | None = None  # the last failed lag probe, shown in stats

    def run(self, stop: threading.Event) -> None:
        """Beat now, then every interval, until ``stop``; a failed beat is logged, not fatal.

        Heartbeats need only the database; consumer lag is probed in a thread of its
        own, so a broker that does not answer never makes a live worker look silent.
        """
        lag = threading.Thread(target=self._probe_lag, args=(stop,), name="lag", daemon=True)
        if self.groups:
            lag.start()
        try:
            while True:
                try:
                    self.beat_once()
                except Exception as exc:
                    log.warning(
                        "heartbeat not recorded: %s", exc,
                        extra={"step": "heartbeat", "status": "failed"},
                    )  # fmt: skip
                if stop.wait(self.settings.heartbeat_interval_s):
                    return
        finally:
            self._sign_off()
            if lag.is_alive():
                lag.join(timeout=10)

    def beat_once(self) -> None:
        """Record this worker's heartbeat, breaker state and counters."""
        stats = {**self.stats(), **({"lag_error": self.lag_error} if self.lag_error else {})}
        if self.pulses is not None:
            stats["loop_age_s"] = self.pulses.ages()
        beat = replace(self.beat, breaker_state=worst_state(self.breakers), stats=stats)
        with self.database.connection() as conn:
            record_heartbeat(conn, beat)

    def lag_once(self) -> None:
        """Record the lag of this worker's consumer groups (raises when Kafka fails)."""
        if self._lag is None:
            check_reachable(self.settings.kafka_bootstrap)  # fails fast, leaks no socket
            self._lag = LagProbe(self.settings.kafka_bootstrap)
        offsets = {(g, t): self._lag.offsets(g, t) for g, t in self.groups}
        with self.database.connection() as conn:
            for (group, topic), by_partition in offsets.items():
                record_lag(conn, group, topic, by_partition)

    def _probe_lag(self, stop: threading.Event) -> None:
        try:
            while True:
                try:
                    self.lag_once()
                    self.lag_error = None
                except Exception as exc:
                    self.lag_error = f"{type(exc).__name__}: {exc}"
                    log.warning(
                        "consumer lag not recorded: %s", self.lag_error,
                        extra={"step": "heartbeat", "status": "lag_failed"},
                    )  # fmt: skip
                    self._close_lag()  # reconnect next time
                if stop.wait(self.settings.heartbeat_interval_s):
                    return
        finally:
            self._close_lag()

    def _sign_off(self) -> None:
        """A clean stop: this worker is gone, not silent."""
        try:
            with self.database.connection() as conn:
                forget_worker(conn, self.beat.worker_id)
        except psycopg.Error as exc:
            log.warning("worker not signed off: %s", exc, extra={"step": "heartbeat"})

    def _close_lag(self) -> None:
        if self._lag is not None:
            self._lag.close()
            self._lag = None
