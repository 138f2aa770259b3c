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
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import psycopg

from adapters.breaker import CircuitBreaker
from adapters.kafka_io import LagProbe, check_reachable
from adapters.settings import Settings
from projections.queue_health import WorkerBeat, forget_worker, record_heartbeat, record_lag

__all__ = ["Heartbeat", "Pulses", "worst_state"]

log = logging.getLogger(__name__)

_SEVERITY = {CircuitBreaker.CLOSED: 0, CircuitBreaker.HALF_OPEN: 1, CircuitBreaker.OPEN: 2}


def worst_state(breakers: Sequence[CircuitBreaker]) -> str | None:
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


class Heartbeat:
    """Records this process's heartbeat and its groups' lag; ``run(stop)`` repeats it."""

    def __init__(
        self,
        settings: Settings,
        roles: Sequence[str],
        *,
        breakers: Sequence[CircuitBreaker] = (),
        stats: Callable[[], Mapping[str, Any]] = dict,
        pulses: Pulses | None = None,
    ) -> None:
        self.settings = settings
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
        with psycopg.connect(self.settings.database_url, connect_timeout=5) as conn:
            record_heartbeat(conn, beat)

    def lag_once(self) -> None:
        """Record the lag of this worker's consumer groups (raises when Kafka fails)."""
        if self._lag is None:
            check_reachable(self.settings.kafka_bootstrap)  # fails fast, leaks no socket
            self._lag = LagProbe(self.settings.kafka_bootstrap)
        offsets = {(g, t): self._lag.offsets(g, t) for g, t in self.groups}
        with psycopg.connect(self.settings.database_url, connect_timeout=5) as conn:
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
            with psycopg.connect(self.settings.database_url, connect_timeout=5) as conn:
                forget_worker(conn, self.beat.worker_id)
        except psycopg.Error as exc:
            log.warning("worker not signed off: %s", exc, extra={"step": "heartbeat"})

    def _close_lag(self) -> None:
        if self._lag is not None:
            self._lag.close()
            self._lag = None
