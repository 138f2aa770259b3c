"""What the charging saga's steps share: outcomes, the retry policy, backoff, keys and
step results. Pure: nothing here waits, retries or talks to anything.

The decisions of each step are where their state is: a line push's in
``domain.pushing``, a transaction's lifecycle in ``domain.transaction``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

__all__ = [
    "ChargeFailure",
    "RetryPolicy",
    "StepResult",
    "backoff",
    "idempotency_key",
    "on_draft",
    "retry_due",
]


def idempotency_key(step: str, subject: object) -> str:
    """Stripe's Idempotency-Key for one step of one subject: never from a clock."""
    return f"{step}:{subject}"


def on_draft(key: str, draft: int) -> str:
    """``key`` of a request about an invoice's ``draft``-th draft in Stripe. The first
    draft's keys are the plain ones; a later draft (made after Stripe lost the one
    before, ``Invoice.replace_draft``) gets keys of its own, so Stripe executes its
    requests instead of replaying the lost draft's answers."""
    return key if draft <= 1 else f"{key}:d{draft}"


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try: spread-out retries, and how long before a failure is reported.

    Owed usage is never dropped because Stripe is down: past ``horizon`` a failing
    line is reported failing (queue health), and its retries go on at ``max_delay``.
    """

    horizon: timedelta = timedelta(hours=1)
    base_delay: timedelta = timedelta(seconds=1)
    max_delay: timedelta = timedelta(minutes=5)
    # A line change nobody has pushed for this long is the reconciler's to schedule.
    stale_after: timedelta = timedelta(seconds=30)


@dataclass(frozen=True)
class ChargeFailure:
    """One failed call to Stripe. ``retryable`` covers unknown outcomes (timeouts) too.

    ``sent``: the request left this process (False: our own breaker or rate limiter
    refused it, so it is no attempt and raises no backoff). ``answered``: Stripe
    answered it, so it will not take effect later (None: answered exactly when the
    failure is permanent; a timeout, a dropped connection or a 5xx leaves it unknown).
    """

    error_class: str
    message: str
    retryable: bool
    retry_after: timedelta | None = None
    sent: bool = True
    answered: bool | None = None

    @property
    def missing(self) -> bool:
        """Stripe answered that the object does not exist (a 404: deleted, or never made)."""
        return self.error_class == "http_404"

    @property
    def may_land_later(self) -> bool:
        """Whether Stripe may still execute the request after this failure came back."""
        answered = (not self.retryable) if self.answered is None else self.answered
        return self.sent and not answered


def backoff(attempt: int, policy: RetryPolicy, jitter: float) -> timedelta:
    """Full-jitter exponential backoff: a random point in [0, base * 2**(attempt-1)], capped.

    ``jitter`` is a number in [0, 1) the caller draws; with the same draw the delay
    is the same, so this stays a pure function.
    """
    doublings = min(max(attempt - 1, 0), 40)  # past 2**40 every delay is capped anyway
    ceiling = min(policy.base_delay * (1 << doublings), policy.max_delay)
    return max(ceiling * jitter, policy.base_delay / 10)


def retry_due(
    failure: ChargeFailure, attempt: int, now: datetime, policy: RetryPolicy, jitter: float
) -> datetime:
    """When attempt ``attempt`` (counting from 1) is due after ``failure``: the backoff,
    or Stripe's ``Retry-After`` when that is later."""
    delay = backoff(attempt, policy, jitter)
    if failure.retry_after is not None:
        delay = max(delay, failure.retry_after)
    return now + delay


class StepResult(StrEnum):
    """What a driver did with a line or a transaction (or why it did nothing)."""

    CHARGED = "charged"  # Stripe acknowledged a push; its transactions recorded Charged
    RETRY = "retry"  # a failed push recorded, the next attempt due later
    COMPENSATED = "compensated"  # Compensated recorded (and the hold released)
    DEFERRED = "deferred"  # nothing recorded now; the reconciler comes back
    NOTHING = "nothing"  # nothing to do: Stripe already holds the newest total
    WAIT = "wait"  # a retry not due yet
    RACED = "raced"  # lost the race to record every time it tried
    REVERSED = "reversed"  # an operator reversal recorded
    SETTLED = "settled"  # a transaction from before lines joined its line

    @property
    def recorded(self) -> bool:
        """Whether the step recorded events of its own."""
        return self in (StepResult.CHARGED, StepResult.RETRY, StepResult.COMPENSATED)
