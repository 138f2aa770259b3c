"""A circuit breaker that never holds a lock while the guarded call runs.

Closed: calls pass; ``fail_max`` consecutive counted failures open it. Open: calls
are refused without being sent until ``reset_s`` has passed. Half-open: ONE probe
is let through at a time; its success closes the breaker, its failure opens it again.
Failures that ``counts`` rejects (a permanent 4xx, say) are neither failures nor probes
that failed: the service answered.

Hand-written rather than pybreaker: pybreaker 1.4 runs every guarded call inside its
RLock, so all Stripe calls of a process went one at a time (measured: 24.5 charges/s
with 16 allowed in flight at 30 ms per call, 135/s at 0 ms). The seed incident is a
lock that serialised a billing queue; this breaker's lock guards three fields only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from adapters.errors import BreakerOpen

__all__ = ["BreakerOpen", "CircuitBreaker"]

T = TypeVar("T")


class CircuitBreaker:
    CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"

    def __init__(
        self,
        fail_max: int,
        reset_s: float,
        counts: Callable[[BaseException], bool] = lambda _: True,
        clock: Callable[[], float] = time.monotonic,
        on_transition: Callable[[str, str], None] = lambda old, new: None,
    ) -> None:
        self.fail_max = fail_max
        self.reset_s = reset_s
        self.counts = counts
        self.clock = clock
        self.failures = 0
        self.opened_at = 0.0
        self.probing = False
        self.transitions: list[tuple[str, str]] = []
        self.on_transition = on_transition  # (old, new); runs under the guard: keep it cheap
        self._state = self.CLOSED
        self._guard = threading.Lock()  # held for bookkeeping only, never during a call

    @property
    def state(self) -> str:
        with self._guard:
            return self._current()

    def call(self, fn: Callable[[], T]) -> T:
        probe = self._admit()
        try:
            result = fn()
        except BaseException as exc:
            self._after(probe, failed=self.counts(exc))
            raise
        self._after(probe, failed=False)
        return result

    def _admit(self) -> bool:
        with self._guard:
            state = self._current()
            if state == self.CLOSED:
                return False
            if state == self.HALF_OPEN and not self.probing:
                self.probing = True
                return True
            raise BreakerOpen(f"Stripe circuit breaker is {state}")

    def _after(self, probe: bool, *, failed: bool) -> None:
        with self._guard:
            if probe:
                self.probing = False
            if not failed:
                self.failures = 0
                self._move(self.CLOSED)
                return
            self.failures += 1
            if probe or self.failures >= self.fail_max:
                self.opened_at = self.clock()
                self._move(self.OPEN)

    def _current(self) -> str:
        if self._state == self.OPEN and self.clock() - self.opened_at >= self.reset_s:
            self._move(self.HALF_OPEN)
        return self._state

    def _move(self, state: str) -> None:
        if state != self._state:
            self.transitions.append((self._state, state))
            self.on_transition(self._state, state)
            self._state = state
