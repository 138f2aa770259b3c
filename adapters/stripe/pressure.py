"""Bounded pressure on Stripe: every call of a process goes through one ``Pressure``.

In order:

1. a circuit breaker (``adapters.stripe.breaker``): after ``breaker_fail_max``
   consecutive retryable failures it opens and refuses calls without sending them;
   after ``breaker_reset_s`` it lets one probe through;
2. an adaptive concurrency limit (``AimdLimit``: +1/limit on success, halved on
   429/5xx/timeout);
3. a sliding-window rate limit (pyrate-limiter; default 25 requests/s, Stripe's
   test-mode limit).

A call refused by any of them is never sent and raises a ``StripeRefused``. Each call
is counted by operation and outcome, and its time on the wire is recorded without
the local queueing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from pyrate_limiter import Duration, Limiter, Rate

from adapters.errors import CallRefused
from adapters.observability.metrics import metrics
from adapters.settings import StripeSettings
from adapters.stripe.breaker import CircuitBreaker
from adapters.stripe.errors import classify, is_overload

__all__ = ["AimdLimit", "Pressure"]

T = TypeVar("T")

log = logging.getLogger(__name__)


class AimdLimit:
    """Adaptive concurrency: additive increase on success, multiplicative decrease on overload.

    Hand-written: a counter and a condition variable. The limiters on PyPI bound
    rates, not in-flight calls that adapt to the error rate.
    """

    def __init__(self, maximum: int, minimum: int = 1) -> None:
        self.maximum = maximum
        self.minimum = minimum
        self.limit = float(maximum)
        self.in_flight = 0
        self._cond = threading.Condition()

    def acquire(self, timeout: float) -> bool:
        with self._cond:
            ok = self._cond.wait_for(lambda: self.in_flight < int(self.limit), timeout)
            if ok:
                self.in_flight += 1
            return ok

    def release(self, overloaded: bool) -> None:
        with self._cond:
            self.in_flight -= 1
            if overloaded:
                self.limit = max(self.minimum, self.limit / 2)
            else:
                self.limit = min(self.maximum, self.limit + 1 / self.limit)
            self._cond.notify_all()


class Pressure:
    """The breaker and the limits of one process's Stripe calls (see the module docstring)."""

    def __init__(self, settings: StripeSettings) -> None:
        self.timeout_s = settings.timeout_s
        self.breaker = CircuitBreaker(
            fail_max=settings.breaker_fail_max,
            reset_s=settings.breaker_reset_s,
            counts=lambda e: classify(e).retryable,  # a 4xx answer is not an outage
            on_transition=_breaker_moved,
        )
        self.breaker_name = metrics().watch_breaker(self.breaker)
        self.concurrency = AimdLimit(settings.max_concurrency)
        self.limiter = Limiter(Rate(settings.rate_per_s, Duration.SECOND))

    def call(self, operation: str, fn: Callable[[], T]) -> T:
        """``fn()`` through the breaker and the limits, counted by outcome (a call the
        breaker or a limit refused is counted as such, and never sent)."""
        outcome = "ok"
        try:
            return self.breaker.call(lambda: self._limited(lambda: _timed(operation, fn)))
        except Exception as exc:
            outcome = classify(exc).error_class
            raise
        finally:
            metrics().stripe_requests.add(1, {"operation": operation, "outcome": outcome})

    def _limited(self, fn: Callable[[], T]) -> T:
        if not self.concurrency.acquire(timeout=self.timeout_s):
            raise CallRefused("too many Stripe calls in flight")
        overloaded = False
        try:
            if not self.limiter.try_acquire("stripe", blocking=True, timeout=self.timeout_s):
                raise CallRefused("Stripe rate limit saturated")
            return fn()
        except Exception as exc:
            overloaded = is_overload(exc)
            raise
        finally:
            self.concurrency.release(overloaded)


def _timed(operation: str, fn: Callable[[], T]) -> T:
    """``fn()``, its latency recorded: the time on the wire and at Stripe, no queueing."""
    started = time.perf_counter()
    outcome = "ok"
    try:
        return fn()
    except Exception as exc:
        outcome = classify(exc).error_class
        raise
    finally:
        metrics().stripe_latency.record(
            time.perf_counter() - started, {"operation": operation, "outcome": outcome}
        )


def _breaker_moved(old: str, new: str) -> None:
    metrics().breaker_transitions.add(1, {"from_state": old, "to_state": new})
    log.warning(
        "Stripe circuit breaker %s", new,
        extra={"step": "breaker", "status": new, "from_state": old},
    )  # fmt: skip
