"""The charging saga's decisions: given a transaction's state and an outcome, what next.

Pure: the adapters call Stripe and the clock, then ask these functions what to
record. Nothing here waits, retries or talks to anything.

* ``next_step(txn, now, policy)``: what a driver (process manager or reconciler)
  should do with a transaction right now: charge it, compensate it, or leave it.
* ``after_attempt(txn, outcome, now, policy, jitter)``: what to record after one
  charge attempt: Charged, ChargeFailed with the next attempt's due time, or
  Compensated (a permanent error, or the retry horizon has passed).
* ``must_clean_up(outcome)`` and ``compensation_step(cleanup)``: before a give-up is
  recorded, whether Stripe may hold a charge that must be removed first, and whether
  the compensation can be recorded now or must wait for the reconciler.
* ``StepResult``: what a driver did, for logs, metrics and callers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from domain.transaction import BillingTransaction, TxnState

__all__ = [
    "ChargeFailure",
    "ChargeOutcome",
    "Charged",
    "Decision",
    "RetryPolicy",
    "Step",
    "StepResult",
    "Verdict",
    "after_attempt",
    "backoff",
    "compensation_step",
    "idempotency_key",
    "is_stale",
    "must_clean_up",
    "next_step",
]


def idempotency_key(step: str, transaction_id: object) -> str:
    """Stripe's Idempotency-Key for one step of one transaction: never from a clock."""
    return f"{step}:{transaction_id}"


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try: bounded attempts, bounded time, spread-out retries."""

    max_attempts: int = 8
    horizon: timedelta = timedelta(hours=1)
    base_delay: timedelta = timedelta(seconds=1)
    max_delay: timedelta = timedelta(minutes=5)
    # A Reserved transaction nobody has touched for this long is driven by the reconciler.
    stale_after: timedelta = timedelta(seconds=30)


@dataclass(frozen=True)
class Charged:
    """Stripe accepted the charge (or had already accepted it under the same key)."""

    stripe_object_id: str


@dataclass(frozen=True)
class ChargeFailure:
    """One failed attempt. ``retryable`` covers unknown outcomes (timeouts) too."""

    error_class: str
    message: str
    retryable: bool
    retry_after: timedelta | None = None


ChargeOutcome = Charged | ChargeFailure


class Step(StrEnum):
    """What a driver should do with a transaction now."""

    CHARGE = "charge"
    COMPENSATE = "compensate"
    WAIT = "wait"
    NOTHING = "nothing"


def backoff(attempt: int, policy: RetryPolicy, jitter: float) -> timedelta:
    """Full-jitter exponential backoff: a random point in [0, base * 2**(attempt-1)], capped.

    ``jitter`` is a number in [0, 1) the caller draws; with the same draw the delay
    is the same, so this stays a pure function.
    """
    doublings = min(max(attempt - 1, 0), 40)  # past 2**40 every delay is capped anyway
    ceiling = min(policy.base_delay * (1 << doublings), policy.max_delay)
    return max(ceiling * jitter, policy.base_delay / 10)


def next_step(txn: BillingTransaction, now: datetime, policy: RetryPolicy) -> Step:
    """What to do with ``txn`` at ``now``."""
    if txn.state in (TxnState.CHARGED, TxnState.COMPENSATED, TxnState.METERED):
        # Metered without Reserved never outlives an ingest save; terminal states rest.
        return Step.NOTHING
    if _past_horizon(txn, now, policy):
        return Step.COMPENSATE
    if txn.state is TxnState.RESERVED:
        return Step.CHARGE
    # CHARGE_FAILED: a retry is due, or not yet.
    if txn.next_attempt_at is None:
        return Step.COMPENSATE  # a permanent failure not yet compensated
    return Step.CHARGE if txn.next_attempt_at <= now else Step.WAIT


def is_stale(txn: BillingTransaction, now: datetime, policy: RetryPolicy) -> bool:
    """A Reserved transaction that no driver has moved within ``stale_after``."""
    return txn.state is TxnState.RESERVED and txn.modified_on + policy.stale_after <= now


class Verdict(StrEnum):
    """What to record after an attempt."""

    CHARGED = "charged"  # record Charged
    RETRY = "retry"  # record ChargeFailed with the next attempt's due time
    GIVE_UP = "give_up"  # record ChargeFailed (not retryable), then compensate


@dataclass(frozen=True)
class Decision:
    """The verdict on one attempt, with what to record."""

    verdict: Verdict
    stripe_object_id: str | None = None
    next_attempt_at: datetime | None = None
    reason: str | None = None


def after_attempt(
    txn: BillingTransaction,
    outcome: ChargeOutcome,
    now: datetime,
    policy: RetryPolicy,
    jitter: float,
) -> Decision:
    """What to record after one attempt at charging ``txn``."""
    if isinstance(outcome, Charged):
        return Decision(Verdict.CHARGED, stripe_object_id=outcome.stripe_object_id)
    attempt = txn.attempts + 1
    if not outcome.retryable:
        return Decision(
            Verdict.GIVE_UP, reason=f"permanent error {outcome.error_class}: {outcome.message}"
        )
    delay = backoff(attempt, policy, jitter)
    if outcome.retry_after is not None:
        delay = max(delay, outcome.retry_after)
    due = now + delay
    if attempt >= policy.max_attempts or due >= _deadline(txn, policy):
        return Decision(Verdict.GIVE_UP, reason=_horizon_reason(attempt, outcome))
    return Decision(Verdict.RETRY, next_attempt_at=due)


def _deadline(txn: BillingTransaction, policy: RetryPolicy) -> datetime:
    return txn.created_on + policy.horizon


def _past_horizon(txn: BillingTransaction, now: datetime, policy: RetryPolicy) -> bool:
    return now >= _deadline(txn, policy) or txn.attempts >= policy.max_attempts


def _horizon_reason(attempt: int, outcome: ChargeFailure) -> str:
    return (
        f"retry horizon passed after {attempt} attempt(s); "
        f"last error {outcome.error_class}: {outcome.message}"
    )


class StepResult(StrEnum):
    """What a driver did with a transaction (or why it did nothing)."""

    CHARGED = "charged"  # Charged recorded
    RETRY = "retry"  # ChargeFailed recorded, the next attempt due later
    COMPENSATED = "compensated"  # Compensated recorded (and the hold released)
    DEFERRED = "deferred"  # a give-up whose cleanup failed: nothing recorded, try again later
    NOTHING = "nothing"  # terminal, or not this driver's to move
    WAIT = "wait"  # a retry not due yet
    RACED = "raced"  # lost the race to record every time it tried
    REVERSED = "reversed"  # an operator reversal recorded

    @property
    def recorded(self) -> bool:
        """Whether the step recorded events (a process manager's position moves with them)."""
        return self in (StepResult.CHARGED, StepResult.RETRY, StepResult.COMPENSATED)


def must_clean_up(outcome: ChargeOutcome | None) -> bool:
    """Whether Stripe may hold a charge that must be removed before compensating.

    ``outcome`` is the failed attempt that made the driver give up, or None when it
    gives up without an attempt (the horizon passed): then an earlier attempt whose
    answer was lost may have charged. A permanent failure (Stripe answered no) left
    nothing; a retryable one is an unknown outcome.
    """
    if outcome is None:
        return True
    return isinstance(outcome, ChargeFailure) and outcome.retryable


def compensation_step(cleanup: ChargeFailure | None) -> Step:
    """After the cleanup call (None: it succeeded or was not needed): compensate now, or
    wait (nothing recorded) because a live charge may remain; the reconciler comes back."""
    return Step.WAIT if cleanup is not None else Step.COMPENSATE
