"""The circuit breaker: states, probes, and no lock held during a call."""

from __future__ import annotations

import threading

import pytest

from adapters.errors import BreakerOpen
from adapters.stripe.breaker import CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _fail() -> None:
    raise ConnectionError("down")


def test_two_calls_run_at_the_same_time_through_a_closed_breaker() -> None:
    breaker = CircuitBreaker(fail_max=3, reset_s=1)
    both_inside = threading.Barrier(2, timeout=5)  # breaks (raises) if calls were serialised
    results: list[str] = []

    def call() -> None:
        results.append(breaker.call(lambda: "ok" if both_inside.wait() >= 0 else "no"))

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == ["ok", "ok"]


def test_consecutive_counted_failures_open_it_and_open_refuses_without_calling() -> None:
    clock = Clock()
    breaker = CircuitBreaker(fail_max=2, reset_s=5, clock=clock)
    for _ in range(2):
        with pytest.raises(ConnectionError):
            breaker.call(_fail)
    assert breaker.state == "open"
    calls: list[int] = []
    with pytest.raises(BreakerOpen):
        breaker.call(lambda: calls.append(1))
    assert calls == []


def test_a_success_resets_the_failure_count() -> None:
    breaker = CircuitBreaker(fail_max=2, reset_s=5)
    with pytest.raises(ConnectionError):
        breaker.call(_fail)
    breaker.call(lambda: None)
    with pytest.raises(ConnectionError):
        breaker.call(_fail)
    assert breaker.state == "closed"


def test_failures_it_does_not_count_never_open_it() -> None:
    breaker = CircuitBreaker(fail_max=1, reset_s=5, counts=lambda e: not isinstance(e, KeyError))

    def permanent() -> None:
        raise KeyError("no such customer")

    for _ in range(3):
        with pytest.raises(KeyError):
            breaker.call(permanent)
    assert breaker.state == "closed"


def test_after_the_reset_time_one_probe_passes_and_its_result_decides() -> None:
    clock = Clock()
    breaker = CircuitBreaker(fail_max=1, reset_s=5, clock=clock)
    with pytest.raises(ConnectionError):
        breaker.call(_fail)
    clock.now = 5.0
    assert breaker.state == "half_open"
    with pytest.raises(ConnectionError):
        breaker.call(_fail)  # the probe fails: open again, for another reset period
    assert breaker.state == "open"
    clock.now = 10.0
    assert breaker.call(lambda: "up") == "up"
    assert breaker.state == "closed"
    assert ("half_open", "closed") in breaker.transitions


def test_half_open_lets_only_one_probe_through_at_a_time() -> None:
    clock = Clock()
    breaker = CircuitBreaker(fail_max=1, reset_s=1, clock=clock)
    with pytest.raises(ConnectionError):
        breaker.call(_fail)
    clock.now = 1.0
    inside = threading.Event()
    release = threading.Event()
    prober = threading.Thread(target=lambda: breaker.call(lambda: (inside.set(), release.wait(5))))
    prober.start()
    assert inside.wait(5)
    with pytest.raises(BreakerOpen, match="half_open"):
        breaker.call(lambda: None)
    release.set()
    prober.join(5)
    assert breaker.state == "closed"
