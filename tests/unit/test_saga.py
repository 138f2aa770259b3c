"""The charging saga's decisions (``domain.saga``): pure functions of state, outcome and time.

Transactions are built in memory as in ``test_transaction.py``. A transaction's
``created_on`` (and ``modified_on``) come from its events' wall-clock timestamps, so every
``now`` here is given relative to them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from domain.ids import account_id
from domain.pricing import Price, PriceList
from domain.saga import (
    Charged,
    ChargeFailure,
    RetryPolicy,
    Step,
    Verdict,
    after_attempt,
    backoff,
    idempotency_key,
    is_stale,
    next_step,
)
from domain.transaction import BillingTransaction, Source, TxnState
from domain.usage import UsageRecord

PRICES = PriceList({"api.requests": Price(Decimal("0.001"), "USD")})
SOURCE = Source(topic="usage", partition=3, offset=42)
AT = datetime(2026, 12, 2, 10, 15, tzinfo=UTC)
ACCOUNT = account_id("acme", "USD")
POLICY = RetryPolicy()
SECOND = timedelta(seconds=1)

TRANSIENT = ChargeFailure("http_503", "service unavailable", retryable=True)
PERMANENT = ChargeFailure("http_400", "no such customer", retryable=False)


def _metered(usage_id: str = "req-1", customer_id: str = "acme") -> BillingTransaction:
    record = UsageRecord(
        usage_id=usage_id,
        customer_id=customer_id,
        meter="api.requests",
        quantity=Decimal(1500),
        occurred_at=AT,
        currency=None,
    )
    return BillingTransaction.from_usage(record, PRICES, SOURCE)


def _reserved(usage_id: str = "req-1") -> BillingTransaction:
    txn = _metered(usage_id)
    txn.reserve(ACCOUNT)
    return txn


def _failed(
    times: int = 1, *, retryable: bool = True, due: timedelta = 30 * SECOND
) -> BillingTransaction:
    """A Reserved transaction after ``times`` failures; a retryable one is due at created_on+due."""
    txn = _reserved()
    for _ in range(times):
        txn.record_charge_failure(
            "http_503",
            "service unavailable",
            retryable=retryable,
            next_attempt_at=txn.created_on + due if retryable else None,
        )
    return txn


def _charged() -> BillingTransaction:
    txn = _reserved()
    txn.record_charged("ii_123")
    return txn


def _compensated() -> BillingTransaction:
    txn = _reserved()
    txn.compensate("spend limit")
    return txn


# ---------------------------------------------------------------------------------------------
# idempotency keys


def test_idempotency_key_is_the_step_and_the_transaction_id() -> None:
    txn = _metered()
    assert idempotency_key("charge", txn.id) == f"charge:{txn.id}"


def test_idempotency_key_is_the_same_for_the_same_step_and_transaction_every_time() -> None:
    # Derived from the (deterministic) transaction id, never from a clock.
    assert idempotency_key("charge", _metered().id) == idempotency_key("charge", _metered().id)


def test_idempotency_key_differs_per_step_and_per_transaction() -> None:
    one, other = _metered("req-1").id, _metered("req-2").id
    keys = {
        idempotency_key("charge", one),
        idempotency_key("reverse", one),
        idempotency_key("charge", other),
        idempotency_key("reverse", other),
    }
    assert len(keys) == 4


# ---------------------------------------------------------------------------------------------
# backoff

JITTERS = [0.0, 0.001, 0.25, 0.5, 0.999, 1.0]


@pytest.mark.parametrize("jitter", JITTERS)
@pytest.mark.parametrize("attempt", [1, 2, 3, 5, 9, 20])
def test_backoff_stays_between_a_tenth_of_the_base_and_the_capped_exponential_ceiling(
    attempt: int, jitter: float
) -> None:
    ceiling = min(POLICY.base_delay * 2 ** (attempt - 1), POLICY.max_delay)
    delay = backoff(attempt, POLICY, jitter)
    assert POLICY.base_delay / 10 <= delay <= ceiling


def test_backoff_is_a_point_of_the_jitter_in_the_exponential_ceiling() -> None:
    assert backoff(1, POLICY, 0.5) == timedelta(milliseconds=500)  # 0.5 x 1 s
    assert backoff(4, POLICY, 0.5) == 4 * SECOND  # 0.5 x 8 s
    assert backoff(3, POLICY, 0.0) == timedelta(milliseconds=100)  # the floor: base / 10


@pytest.mark.parametrize("jitter", JITTERS)
def test_backoff_never_shrinks_as_attempts_grow_for_the_same_jitter(jitter: float) -> None:
    delays = [backoff(attempt, POLICY, jitter) for attempt in range(1, 16)]
    assert delays == sorted(delays)


def test_backoff_doubles_with_each_attempt_below_the_cap() -> None:
    delays = [backoff(attempt, POLICY, 0.5) for attempt in range(1, 9)]  # ceilings 1 s .. 128 s
    assert delays == [timedelta(milliseconds=500) * 2**n for n in range(8)]


@pytest.mark.parametrize("attempt", [10, 12, 20, 40])
def test_backoff_is_capped_by_max_delay(attempt: int) -> None:
    # 1 s x 2**9 = 512 s is already past the 5 min cap.
    assert backoff(attempt, POLICY, 1.0) == POLICY.max_delay
    assert backoff(attempt, POLICY, 0.5) == POLICY.max_delay / 2


def test_backoff_is_capped_by_max_delay_even_for_a_very_large_attempt() -> None:
    assert backoff(64, POLICY, 1.0) == POLICY.max_delay


def test_backoff_with_the_same_inputs_gives_the_same_delay() -> None:
    policy = RetryPolicy(base_delay=2 * SECOND, max_delay=timedelta(minutes=1))
    assert backoff(4, policy, 0.37) == backoff(4, policy, 0.37)
    assert backoff(4, policy, 0.37) != backoff(4, policy, 0.38)


# ---------------------------------------------------------------------------------------------
# next_step


@pytest.mark.parametrize(
    "build",
    [_metered, _charged, _compensated],
    ids=["metered", "charged", "compensated"],
)
@pytest.mark.parametrize("age", [timedelta(0), 2 * POLICY.horizon])
def test_next_step_leaves_metered_charged_and_compensated_transactions_alone(
    build: Callable[[], BillingTransaction], age: timedelta
) -> None:
    txn = build()
    assert next_step(txn, txn.created_on + age, POLICY) is Step.NOTHING


def test_next_step_charges_a_reserved_transaction() -> None:
    txn = _reserved()
    assert next_step(txn, txn.created_on, POLICY) is Step.CHARGE


def test_next_step_waits_for_a_retryable_failure_before_its_due_time() -> None:
    txn = _failed(due=30 * SECOND)
    assert txn.next_attempt_at == txn.created_on + 30 * SECOND
    assert next_step(txn, txn.created_on + 29 * SECOND, POLICY) is Step.WAIT


@pytest.mark.parametrize("late", [timedelta(0), SECOND, 10 * SECOND])
def test_next_step_charges_a_retryable_failure_at_or_after_its_due_time(late: timedelta) -> None:
    txn = _failed(due=30 * SECOND)
    assert next_step(txn, txn.created_on + 30 * SECOND + late, POLICY) is Step.CHARGE


def test_next_step_compensates_a_permanent_failure_not_yet_compensated() -> None:
    txn = _failed(retryable=False)
    assert txn.state is TxnState.CHARGE_FAILED
    assert next_step(txn, txn.created_on + SECOND, POLICY) is Step.COMPENSATE


@pytest.mark.parametrize(
    "build",
    [_reserved, lambda: _failed(due=2 * POLICY.horizon)],
    ids=["reserved", "charge_failed"],
)
def test_next_step_compensates_once_the_retry_horizon_has_passed_whatever_the_state(
    build: Callable[[], BillingTransaction],
) -> None:
    txn = build()
    deadline = txn.created_on + POLICY.horizon
    assert next_step(txn, deadline - timedelta(microseconds=1), POLICY) is not Step.COMPENSATE
    assert next_step(txn, deadline, POLICY) is Step.COMPENSATE
    assert next_step(txn, deadline + SECOND, POLICY) is Step.COMPENSATE


@pytest.mark.parametrize(
    ("failures", "step"), [(2, Step.CHARGE), (3, Step.COMPENSATE), (4, Step.COMPENSATE)]
)
def test_next_step_compensates_a_failure_that_used_up_the_attempts_even_if_a_retry_is_due(
    failures: int, step: Step
) -> None:
    policy = RetryPolicy(max_attempts=3)
    txn = _failed(failures, due=SECOND)
    now = txn.created_on + timedelta(minutes=1)  # past the due time, inside the horizon
    assert next_step(txn, now, policy) is step


def test_next_step_compensates_a_reserved_transaction_when_the_policy_allows_no_attempts() -> None:
    txn = _reserved()
    assert next_step(txn, txn.created_on, RetryPolicy(max_attempts=0)) is Step.COMPENSATE


# ---------------------------------------------------------------------------------------------
# is_stale


def test_a_reserved_transaction_is_stale_once_untouched_for_stale_after() -> None:
    txn = _reserved()
    assert not is_stale(
        txn, txn.modified_on + POLICY.stale_after - timedelta(microseconds=1), POLICY
    )
    assert is_stale(txn, txn.modified_on + POLICY.stale_after, POLICY)
    assert is_stale(txn, txn.modified_on + 10 * POLICY.stale_after, POLICY)


@pytest.mark.parametrize(
    "build",
    [_metered, _failed, lambda: _failed(retryable=False), _charged, _compensated],
    ids=["metered", "charge_failed", "permanent_failure", "charged", "compensated"],
)
def test_only_reserved_transactions_are_ever_stale(build: Callable[[], BillingTransaction]) -> None:
    txn = build()
    assert not is_stale(txn, txn.modified_on + 100 * POLICY.stale_after, POLICY)


# ---------------------------------------------------------------------------------------------
# after_attempt


def test_a_successful_attempt_is_charged_with_the_stripe_object_id() -> None:
    txn = _reserved()
    decision = after_attempt(txn, Charged("ii_42"), txn.created_on + SECOND, POLICY, 0.5)
    assert decision.verdict is Verdict.CHARGED
    assert decision.stripe_object_id == "ii_42"
    assert (decision.next_attempt_at, decision.reason) == (None, None)


def test_a_success_after_failures_is_charged_even_past_the_horizon() -> None:
    txn = _failed(3)
    late = txn.created_on + 2 * POLICY.horizon
    decision = after_attempt(txn, Charged("ii_7"), late, POLICY, 0.5)
    assert (decision.verdict, decision.stripe_object_id) == (Verdict.CHARGED, "ii_7")


def test_a_permanent_failure_gives_up_with_a_reason_naming_the_error_class() -> None:
    txn = _reserved()
    decision = after_attempt(txn, PERMANENT, txn.created_on + SECOND, POLICY, 0.5)
    assert decision.verdict is Verdict.GIVE_UP
    assert decision.reason is not None
    assert "http_400" in decision.reason
    assert "no such customer" in decision.reason
    assert decision.next_attempt_at is None


def test_a_retryable_failure_retries_after_the_backoff_of_the_next_attempt() -> None:
    txn = _reserved()
    now = txn.created_on + SECOND
    decision = after_attempt(txn, TRANSIENT, now, POLICY, 0.5)
    assert decision.verdict is Verdict.RETRY
    assert decision.next_attempt_at == now + backoff(1, POLICY, 0.5)
    assert decision.next_attempt_at == now + timedelta(milliseconds=500)
    assert decision.reason is None


def test_the_retry_delay_grows_with_the_attempts_already_made() -> None:
    txn = _failed(2)  # this is attempt 3: ceiling 4 s
    now = txn.created_on + timedelta(minutes=1)
    decision = after_attempt(txn, TRANSIENT, now, POLICY, 0.5)
    assert decision.verdict is Verdict.RETRY
    assert decision.next_attempt_at == now + 2 * SECOND


def test_the_jitter_given_decides_the_retry_time() -> None:
    txn = _reserved()
    now = txn.created_on + SECOND
    early = after_attempt(txn, TRANSIENT, now, POLICY, 0.2)
    late = after_attempt(txn, TRANSIENT, now, POLICY, 0.8)
    assert early.next_attempt_at == now + timedelta(milliseconds=200)
    assert late.next_attempt_at == now + timedelta(milliseconds=800)


def test_retry_after_raises_the_delay_when_longer_than_the_backoff() -> None:
    txn = _reserved()
    now = txn.created_on + SECOND
    outcome = ChargeFailure("rate_limited", "slow down", True, retry_after=20 * SECOND)
    decision = after_attempt(txn, outcome, now, POLICY, 0.5)
    assert decision.verdict is Verdict.RETRY
    assert decision.next_attempt_at == now + 20 * SECOND


def test_retry_after_shorter_than_the_backoff_does_not_shorten_it() -> None:
    txn = _failed(4)  # attempt 5: ceiling 16 s, jitter 0.5 -> 8 s
    now = txn.created_on + timedelta(minutes=1)
    outcome = ChargeFailure("rate_limited", "slow down", True, retry_after=SECOND)
    decision = after_attempt(txn, outcome, now, POLICY, 0.5)
    assert decision.next_attempt_at == now + 8 * SECOND


def test_the_attempt_that_reaches_max_attempts_gives_up_mentioning_the_retry_horizon() -> None:
    policy = RetryPolicy(max_attempts=4)
    txn = _failed(3)  # this is attempt 4
    decision = after_attempt(txn, TRANSIENT, txn.created_on + SECOND, policy, 0.5)
    assert decision.verdict is Verdict.GIVE_UP
    assert decision.reason is not None
    assert "retry horizon" in decision.reason
    assert "4 attempt(s)" in decision.reason
    assert "http_503" in decision.reason
    assert decision.next_attempt_at is None


def test_the_attempt_before_max_attempts_still_retries() -> None:
    policy = RetryPolicy(max_attempts=4)
    txn = _failed(2)  # this is attempt 3
    decision = after_attempt(txn, TRANSIENT, txn.created_on + SECOND, policy, 0.5)
    assert decision.verdict is Verdict.RETRY


def test_a_retry_due_after_the_horizon_gives_up() -> None:
    txn = _reserved()
    deadline = txn.created_on + POLICY.horizon
    now = deadline - timedelta(milliseconds=499)  # the 500 ms backoff would end past it
    decision = after_attempt(txn, TRANSIENT, now, POLICY, 0.5)
    assert decision.verdict is Verdict.GIVE_UP
    assert decision.reason is not None
    assert "retry horizon" in decision.reason


def test_a_retry_after_header_that_reaches_past_the_horizon_gives_up() -> None:
    txn = _reserved()
    now = txn.created_on + POLICY.horizon - timedelta(minutes=1)
    outcome = ChargeFailure("rate_limited", "slow down", True, retry_after=timedelta(minutes=2))
    assert after_attempt(txn, outcome, now, POLICY, 0.5).verdict is Verdict.GIVE_UP


def test_a_retry_due_well_before_the_horizon_is_scheduled() -> None:
    txn = _reserved()
    now = txn.created_on + POLICY.horizon - timedelta(milliseconds=501)
    decision = after_attempt(txn, TRANSIENT, now, POLICY, 0.5)
    assert decision.verdict is Verdict.RETRY
    assert decision.next_attempt_at is not None
    assert decision.next_attempt_at < txn.created_on + POLICY.horizon


def test_a_retry_that_after_attempt_schedules_is_charged_by_next_step_when_due() -> None:
    txn = _reserved()
    deadline = txn.created_on + POLICY.horizon
    now = deadline - timedelta(milliseconds=500)  # the 500 ms backoff ends exactly at it
    decision = after_attempt(txn, TRANSIENT, now, POLICY, 0.5)
    if decision.verdict is Verdict.RETRY:
        assert decision.next_attempt_at is not None
        txn.record_charge_failure(
            "http_503", "x", retryable=True, next_attempt_at=decision.next_attempt_at
        )
        assert next_step(txn, decision.next_attempt_at, POLICY) is Step.CHARGE
    else:
        assert decision.verdict is Verdict.GIVE_UP


def test_after_attempt_decides_without_recording_anything() -> None:
    txn = _failed(2)
    version, attempts, events = txn.version, txn.attempts, len(txn.pending_events)
    after_attempt(txn, TRANSIENT, txn.created_on + SECOND, POLICY, 0.5)
    after_attempt(txn, PERMANENT, txn.created_on + SECOND, POLICY, 0.5)
    after_attempt(txn, Charged("ii_1"), txn.created_on + SECOND, POLICY, 0.5)
    assert (txn.version, txn.attempts, len(txn.pending_events)) == (version, attempts, events)


def test_transaction_ids_in_keys_are_uuids() -> None:
    # The key embeds the canonical UUID text, so it is stable across processes.
    txn = _metered()
    step, _, ident = idempotency_key("charge", txn.id).partition(":")
    assert step == "charge"
    assert uuid.UUID(ident) == txn.id
