"""Runs a process's roles, each in a thread of its own, and keeps them running.

One role failing must not take the others down: an ingest worker that lost its broker
connection says nothing about the relay or the reconciler. So each role is
*supervised*: when it fails (raises, or returns while the process is not stopping) it
is rebuilt from its factory (fresh clients) and run again after a jittered exponential
backoff (``RestartPolicy``). Each failure is logged with its traceback and counted
(``billing_role_restarts_total{role}``); while a role waits to restart, ``status()``
names it, and the heartbeat carries that, so ``billing-ledger health`` reports the
process degraded and names the role. Only repeated failure ends the process:
``max_failures`` failures of one role within ``window_s`` stop every role and ``run``
raises ``WorkerFailed`` (the CLI exits non-zero, so systemd or Kubernetes see it).

Stopping is orderly. Every role checks the stop event between units of work and
finishes the unit in flight; ``run`` returns only after every role's thread has ended
(naming, every ``wait_log_s``, the roles still finishing), so the caller never closes
what roles share (the ledger, the ``Database``) under one still using it. Before,
roles were joined with a timeout and then the pools were closed under a reconciler
still driving transactions (``PoolClosed``).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from adapters.errors import WorkerFailed
from adapters.observability.metrics import metrics

__all__ = ["RestartPolicy", "RoleFactory", "RoleRun", "Supervisor"]

log = logging.getLogger(__name__)

RoleRun = Callable[[threading.Event], None]
"""A built role: runs until the event is set, cleans up after itself, raises on failure."""

RoleFactory = Callable[[], RoleRun]
"""Builds a role afresh (its clients too); called at start and at every restart."""


@dataclass(frozen=True)
class RestartPolicy:
    """When a failed role runs again, and when failing ends the process."""

    base_s: float = 1.0
    max_delay_s: float = 30.0
    max_failures: int = 5
    window_s: float = 60.0

    def delay(self, failures: int, jitter: float) -> float:
        """The pause before restart number ``failures`` (1, 2, ...) of a role: doubling
        from ``base_s`` up to ``max_delay_s``, the upper half jittered (``jitter`` in
        [0, 1)) so processes that failed together do not come back together."""
        ceiling = min(self.max_delay_s, self.base_s * 2.0 ** max(failures - 1, 0))
        return ceiling * (0.5 + 0.5 * jitter)


@dataclass
class _Restarting:
    error: str
    failures: int
    until: float


class Supervisor:
    """Runs ``roles`` until ``stop`` is set, restarting the ones that fail (see the
    module docstring)."""

    def __init__(
        self,
        roles: Mapping[str, RoleFactory],
        stop: threading.Event,
        *,
        policy: RestartPolicy = RestartPolicy(),
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
        wait_log_s: float = 10.0,
    ) -> None:
        self.roles = dict(roles)
        self.stop = stop
        self.policy = policy
        self.clock = clock
        self.jitter = jitter
        self.wait_log_s = wait_log_s
        self.restarts: dict[str, int] = dict.fromkeys(self.roles, 0)
        self._restarting: dict[str, _Restarting] = {}
        self._fatal: list[str] = []
        self._guard = threading.Lock()

    def run(self) -> None:
        """Start every role; when ``stop`` is set (by the caller, or by a role failing
        too often), wait for every role to end; raise ``WorkerFailed`` in the latter case."""
        threads = [
            threading.Thread(target=self._supervise, args=(name, factory), name=name, daemon=True)
            for name, factory in self.roles.items()
        ]
        for thread in threads:
            thread.start()
        self.stop.wait()
        self._join(threads)
        if self._fatal:
            raise WorkerFailed("; ".join(self._fatal))

    def status(self) -> dict[str, Any]:
        """What the heartbeat reports: the roles waiting to restart (with the error, the
        failures in the window and the seconds to go) and every role's restart count."""
        now = self.clock()
        with self._guard:
            restarting = {
                name: {
                    "error": r.error,
                    "failures": r.failures,
                    "restart_in_s": round(max(r.until - now, 0.0), 1),
                }
                for name, r in sorted(self._restarting.items())
            }
            restarts = {name: n for name, n in sorted(self.restarts.items()) if n}
        return {"restarting": restarting, "restarts": restarts}

    def _supervise(self, name: str, factory: RoleFactory) -> None:
        failures: deque[float] = deque()
        while not self.stop.is_set():
            error = self._run_once(name, factory)
            if error is None:
                return
            now = self.clock()
            failures.append(now)
            while failures and failures[0] < now - self.policy.window_s:
                failures.popleft()
            if len(failures) >= self.policy.max_failures:
                self._give_up(name, error, len(failures))
                return
            delay = self.policy.delay(len(failures), self.jitter())
            with self._guard:
                self.restarts[name] += 1
                self._restarting[name] = _Restarting(error, len(failures), now + delay)
            metrics().role_restarts.add(1, {"role": name})
            log.error(
                "role failed, restarting",
                extra={"step": "supervise", "status": "restarting", "role": name,
                       "error_code": error.split(":", 1)[0], "reason": error,
                       "failures": len(failures), "restart_in_s": round(delay, 2)},
            )  # fmt: skip
            self.stop.wait(delay)
            with self._guard:
                self._restarting.pop(name, None)

    def _run_once(self, name: str, factory: RoleFactory) -> str | None:
        """Build and run the role once: None when it ended because the process stops,
        else what went wrong (logged with its traceback)."""
        try:
            factory()(self.stop)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            if self.stop.is_set():
                log.warning("role %s ended with an error while stopping: %s", name, error,
                            exc_info=exc)  # fmt: skip
                return None
            log.error("role %s failed: %s", name, error, exc_info=exc,
                      extra={"step": "supervise", "status": "failed", "role": name})  # fmt: skip
            return error
        if self.stop.is_set():
            return None
        log.error("role %s stopped on its own", name,
                  extra={"step": "supervise", "status": "failed", "role": name})  # fmt: skip
        return "stopped on its own"

    def _give_up(self, name: str, error: str, failures: int) -> None:
        message = (
            f"{name} worker failed {failures} times within {self.policy.window_s:g} s;"
            f" last: {error}"
        )
        log.error(
            "role failed too often, stopping the process",
            extra={"step": "supervise", "status": "gave_up", "role": name, "reason": message},
        )
        with self._guard:
            self._fatal.append(message)
        self.stop.set()

    def _join(self, threads: list[threading.Thread]) -> None:
        """Wait for every role to finish its unit of work in flight, however long."""
        for thread in threads:
            while True:
                thread.join(self.wait_log_s)
                if not thread.is_alive():
                    break
                waiting = sorted(t.name for t in threads if t.is_alive())
                log.warning(
                    "stopping: waiting for %s to finish", ", ".join(waiting),
                    extra={"step": "supervise", "status": "stopping", "roles": waiting},
                )  # fmt: skip
