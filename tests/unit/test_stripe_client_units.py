"""``adapters.stripe.client`` without a network: error classification and the AIMD limit.

Exceptions are built directly with the SDK's constructors (``stripe/_error.py``); nothing
here sends a request.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import stripe
from requests.structures import CaseInsensitiveDict

from adapters.errors import BreakerOpen, CallRefused
from adapters.stripe.errors import classify
from adapters.stripe.pressure import AimdLimit

# ---------------------------------------------------------------------------------------------
# classify


def test_a_dropped_connection_is_a_retryable_connection_failure() -> None:
    failure = classify(stripe.APIConnectionError("x"))
    assert (failure.error_class, failure.retryable, failure.message) == ("connection", True, "x")


def test_a_rate_limit_is_retryable_after_the_retry_after_header() -> None:
    exc = stripe.RateLimitError("slow", http_status=429, headers={"retry-after": "2"})
    failure = classify(exc)
    assert failure.error_class == "rate_limited"
    assert failure.retryable is True
    assert failure.retry_after == timedelta(seconds=2)


def test_a_rate_limit_without_retry_after_is_retryable_with_no_delay_hint() -> None:
    failure = classify(stripe.RateLimitError("slow", http_status=429))
    assert (failure.retryable, failure.retry_after) == (True, None)


def test_a_malformed_retry_after_header_is_ignored() -> None:
    exc = stripe.RateLimitError("slow", http_status=429, headers={"retry-after": "soon"})
    failure = classify(exc)
    assert (failure.retryable, failure.retry_after) == (True, None)


def test_a_bad_request_is_a_permanent_failure_named_by_its_status() -> None:
    exc = stripe.InvalidRequestError("no such customer", param="customer", http_status=400)
    failure = classify(exc)
    assert failure.retryable is False
    assert failure.error_class == "http_400"
    assert failure.message == "no such customer"


def test_an_idempotency_conflict_409_is_retryable() -> None:
    # Stripe answers 409 to a concurrent request under the same Idempotency-Key.
    exc = stripe.InvalidRequestError("request in progress", param=None, http_status=409)
    failure = classify(exc)
    assert (failure.error_class, failure.retryable) == ("http_409", True)


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_a_server_error_is_retryable(status: int) -> None:
    failure = classify(stripe.APIError("unavailable", http_status=status))
    assert (failure.error_class, failure.retryable) == (f"http_{status}", True)


def test_a_stripe_error_without_a_status_is_retryable_and_named_by_its_type() -> None:
    failure = classify(stripe.APIError("no response"))
    assert (failure.error_class, failure.retryable) == ("APIError", True)


# The SDK's default HTTP client (requests) hands the response headers over as a
# case-insensitive mapping; a plain lower-case dict is the other form an error may carry.
def _headers(name: str, value: str, *, as_sent: bool) -> dict[str, str]:
    if as_sent:
        return CaseInsensitiveDict({name: value})  # type: ignore[return-value]
    return {name.lower(): value}


@pytest.mark.parametrize("as_sent", [True, False], ids=["sdk_headers", "lowercase_dict"])
def test_stripe_should_retry_false_makes_a_server_error_permanent(as_sent: bool) -> None:
    headers = _headers("Stripe-Should-Retry", "false", as_sent=as_sent)
    failure = classify(stripe.APIError("internal", http_status=500, headers=headers))
    assert failure.retryable is False


@pytest.mark.parametrize("as_sent", [True, False], ids=["sdk_headers", "lowercase_dict"])
def test_stripe_should_retry_true_makes_a_bad_request_retryable(as_sent: bool) -> None:
    headers = _headers("Stripe-Should-Retry", "true", as_sent=as_sent)
    exc = stripe.InvalidRequestError("lock timeout", param=None, http_status=400, headers=headers)
    assert classify(exc).retryable is True


def test_an_unrecognised_stripe_should_retry_value_falls_back_to_the_status() -> None:
    headers = {"stripe-should-retry": "maybe"}
    assert classify(stripe.APIError("x", http_status=503, headers=headers)).retryable is True
    exc = stripe.InvalidRequestError("x", param=None, http_status=400, headers=headers)
    assert classify(exc).retryable is False


@pytest.mark.parametrize(
    "exc",
    [
        stripe.AuthenticationError("invalid api key", http_status=401),
        stripe.PermissionError("key lacks permission", http_status=403),
    ],
    ids=["authentication", "permission"],
)
def test_an_auth_fault_is_retryable_so_customers_are_not_compensated_for_config(
    exc: stripe.StripeError,
) -> None:
    failure = classify(exc)
    assert (failure.error_class, failure.retryable) == ("auth", True)


def test_an_open_circuit_breaker_is_retryable() -> None:
    failure = classify(BreakerOpen("open"))
    assert (failure.error_class, failure.retryable) == ("circuit_open", True)


def test_a_call_refused_by_the_limits_is_retryable() -> None:
    failure = classify(CallRefused("too many Stripe calls in flight"))
    assert (failure.error_class, failure.retryable) == ("throttled", True)
    assert failure.message == "too many Stripe calls in flight"


@pytest.mark.parametrize(
    ("exc", "name"),
    [
        (TimeoutError("read timed out"), "TimeoutError"),
        (RuntimeError(), "RuntimeError"),
        (KeyError("id"), "KeyError"),
    ],
)
def test_an_unknown_exception_is_retryable_as_an_unknown_outcome(
    exc: BaseException, name: str
) -> None:
    failure = classify(exc)
    assert (failure.error_class, failure.retryable) == (name, True)
    assert failure.message  # never empty, even for an exception without a message


# ---------------------------------------------------------------------------------------------
# AimdLimit

SHORT = 0.05  # seconds: how long a refused acquire may wait before giving up


def test_the_limit_starts_at_its_maximum_and_admits_that_many_calls() -> None:
    limit = AimdLimit(maximum=4)
    assert (limit.limit, limit.in_flight) == (4.0, 0)
    assert all(limit.acquire(timeout=0) for _ in range(4))
    assert limit.in_flight == 4


def test_acquire_refuses_after_its_timeout_when_the_limit_is_full() -> None:
    limit = AimdLimit(maximum=2)
    assert limit.acquire(timeout=0)
    assert limit.acquire(timeout=0)
    assert limit.acquire(timeout=SHORT) is False
    assert limit.in_flight == 2  # a refused acquire takes no slot


def test_only_the_whole_part_of_a_fractional_limit_admits_calls() -> None:
    limit = AimdLimit(maximum=8)
    limit.limit = 2.9
    assert limit.acquire(timeout=0)
    assert limit.acquire(timeout=0)
    assert limit.acquire(timeout=SHORT) is False


def test_an_overloaded_release_halves_the_limit() -> None:
    limit = AimdLimit(maximum=8)
    assert limit.acquire(timeout=0)
    limit.release(overloaded=True)
    assert (limit.limit, limit.in_flight) == (4.0, 0)


@pytest.mark.parametrize(("minimum", "floor"), [(1, 1.0), (3, 3.0)])
def test_overloaded_releases_never_take_the_limit_below_the_minimum(
    minimum: int, floor: float
) -> None:
    limit = AimdLimit(maximum=8, minimum=minimum)
    for _ in range(10):
        assert limit.acquire(timeout=0)
        limit.release(overloaded=True)
    assert limit.limit == floor


def test_successful_releases_grow_the_limit_by_one_over_the_limit() -> None:
    limit = AimdLimit(maximum=8)
    limit.acquire(timeout=0)
    limit.release(overloaded=True)  # 8 -> 4
    expected = 4.0
    for _ in range(5):
        assert limit.acquire(timeout=0)
        limit.release(overloaded=False)
        expected += 1 / expected
        assert limit.limit == pytest.approx(expected)
    assert 4.0 < limit.limit < 6.0  # additive: about +1 per limit's worth of successes


def test_successful_releases_never_take_the_limit_above_the_maximum() -> None:
    limit = AimdLimit(maximum=4)
    for _ in range(20):
        assert limit.acquire(timeout=0)
        limit.release(overloaded=False)
        assert limit.limit <= 4.0
    assert limit.limit == 4.0
    limit.limit = 3.9  # one step from the cap: 3.9 + 1/3.9 would pass it
    assert limit.acquire(timeout=0)
    limit.release(overloaded=False)
    assert limit.limit == 4.0


class _WaitSignallingCondition(threading.Condition):
    """A Condition that says when a thread is about to block in ``wait``.

    ``waiting`` is set while the waiter still holds the lock; ``release`` needs that lock,
    so it cannot run until the waiter has blocked and can be notified.
    """

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)


def test_a_release_hands_its_slot_to_an_acquire_waiting_for_it() -> None:
    limit = AimdLimit(maximum=1)
    cond = _WaitSignallingCondition()
    limit._cond = cond  # observe the waiter blocking, instead of sleeping
    assert limit.acquire(timeout=0)

    acquired: list[bool] = []
    done = threading.Event()

    def waiter() -> None:
        acquired.append(limit.acquire(timeout=30))
        done.set()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    assert cond.waiting.wait(timeout=10), "the second acquire never blocked"
    assert not done.is_set()  # it is waiting for the slot, not holding it
    assert limit.in_flight == 1

    limit.release(overloaded=False)
    assert done.wait(timeout=10), "the waiting acquire was not woken by the release"
    thread.join(timeout=10)
    assert acquired == [True]
    assert limit.in_flight == 1  # the slot passed from the releaser to the waiter


# ---------------------------------------------------------------------------------------------
# which failed requests may still land in Stripe later (the read-back waits for those)


@pytest.mark.parametrize(
    ("exc", "may_land", "sent"),
    [
        (stripe.APIConnectionError("reset"), True, True),  # no answer: it may still land
        (stripe.APIError("boom", http_status=500), True, True),  # 5xx: outcome unknown
        (stripe.APIError("bad gateway", http_status=502), True, True),
        (stripe.InvalidRequestError("no", None, http_status=400), False, True),  # final answer
        # 409: another request under its key is still running, and it may yet land
        (stripe.APIError("key in use", http_status=409), True, True),
        (stripe.RateLimitError("slow", http_status=429), False, True),  # refused before it ran
        (stripe.AuthenticationError("key", http_status=401), False, True),
        (BreakerOpen("open"), False, False),  # our breaker: never sent
        (CallRefused("saturated"), False, False),  # our limits: never sent
    ],
)
def test_only_an_unanswered_5xx_or_key_in_use_request_may_land_later_and_our_refusals_are_not_sent(
    exc: BaseException, may_land: bool, sent: bool
) -> None:
    failure = classify(exc)
    assert (failure.may_land_later, failure.sent) == (may_land, sent)
