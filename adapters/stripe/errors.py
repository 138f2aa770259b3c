"""Stripe's answers in the domain's terms: every exception of a call becomes a
``domain.saga.ChargeFailure``, retryable or permanent, with a short error class.

A timeout or a dropped connection is an unknown outcome: retryable, and the retry
with the same idempotency key gets Stripe's saved result. A 4xx is permanent unless
Stripe says otherwise (``Stripe-Should-Retry``), except 409 (a key in use) and 429.
"""

from __future__ import annotations

from datetime import timedelta

import stripe

from adapters.errors import BreakerOpen, CallRefused
from domain.saga import ChargeFailure

__all__ = ["classify", "is_overload"]


def classify(exc: BaseException) -> ChargeFailure:
    """Translate an exception from a Stripe call into a domain ChargeFailure."""
    if isinstance(exc, BreakerOpen):
        return ChargeFailure(
            "circuit_open", "Stripe circuit breaker is open", retryable=True, sent=False
        )
    if isinstance(exc, CallRefused):
        return ChargeFailure("throttled", str(exc), retryable=True, sent=False)
    if isinstance(exc, stripe.APIConnectionError):
        return ChargeFailure("connection", _msg(exc), retryable=True)  # unknown outcome
    if isinstance(exc, stripe.RateLimitError):
        # Stripe refuses a request over its rate before it looks at it: never executed.
        return ChargeFailure("rate_limited", _msg(exc), True, _retry_after(exc), answered=True)
    if isinstance(exc, stripe.AuthenticationError | stripe.PermissionError):
        # A configuration fault, not the customer's: keep retrying until fixed or the horizon.
        return ChargeFailure("auth", _msg(exc), retryable=True, answered=True)
    if isinstance(exc, stripe.StripeError):
        status = exc.http_status or 0
        should = _header(exc, "stripe-should-retry")
        retryable = (
            should == "true"
            if should in ("true", "false")
            else status in (409, 429) or status >= 500 or status == 0
        )
        name = f"http_{status}" if status else type(exc).__name__
        # An answer below 500 is final: the request took effect or never will. A 5xx
        # (or no status) leaves the outcome open: it may still land. So does a 409: its
        # key is in use by a request still running (an earlier attempt of ours whose
        # answer was lost), which may yet land.
        answered = 0 < status < 500 and status != 409
        return ChargeFailure(name, _msg(exc), retryable, _retry_after(exc), answered=answered)
    return ChargeFailure(type(exc).__name__, str(exc) or type(exc).__name__, retryable=True)


def is_overload(exc: BaseException) -> bool:
    """Whether ``exc`` says Stripe is overloaded (the AIMD limit halves on these)."""
    if isinstance(exc, stripe.APIConnectionError | stripe.RateLimitError):
        return True
    return isinstance(exc, stripe.StripeError) and (exc.http_status or 0) >= 500


def _msg(exc: BaseException) -> str:
    if isinstance(exc, stripe.StripeError) and exc.user_message:
        return str(exc.user_message)
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def _retry_after(exc: stripe.StripeError) -> timedelta | None:
    value = _header(exc, "retry-after")
    try:
        return timedelta(seconds=float(value)) if value is not None else None
    except ValueError:
        return None


def _header(exc: stripe.StripeError, name: str) -> str | None:
    """A response header, whatever its case."""
    for key, value in (exc.headers or {}).items():
        if key.lower() == name:
            return str(value)
    return None
