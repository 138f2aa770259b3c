"""What the charging saga shares (``domain.saga``): idempotency keys, backoff, step results."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from domain.ids import account_id
from domain.pricing import Price, PriceList
from domain.saga import ChargeFailure, RetryPolicy, StepResult, backoff, idempotency_key
from domain.transaction import BillingTransaction, Source
from domain.usage import UsageRecord

PRICES = PriceList({"api.requests": Price(Decimal("0.001"), "USD")})
SOURCE = Source(topic="usage", partition=3, offset=42)
AT = datetime(2026, 12, 2, 10, 15, tzinfo=UTC)
ACCOUNT = account_id("acme", "USD")
POLICY = RetryPolicy()
SECOND = timedelta(seconds=1)


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
# StepResult


def test_only_charged_retry_and_compensated_results_recorded_events() -> None:
    recorded = {r for r in StepResult if r.recorded}
    assert recorded == {StepResult.CHARGED, StepResult.RETRY, StepResult.COMPENSATED}


def test_transaction_ids_in_keys_are_uuids() -> None:
    # The key embeds the canonical UUID text, so it is stable across processes.
    txn = _metered()
    step, _, ident = idempotency_key("charge", txn.id).partition(":")
    assert step == "charge"
    assert uuid.UUID(ident) == txn.id


def test_the_first_drafts_keys_are_the_plain_ones_and_a_later_drafts_its_own() -> None:
    from domain.saga import on_draft

    assert on_draft("invoice:abc", 1) == "invoice:abc"
    assert on_draft("invoice:abc", 2) == "invoice:abc:d2"
    assert on_draft("line-item:l:0", 3) == "line-item:l:0:d3"
    assert len({on_draft("k", n) for n in range(1, 5)}) == 4


def test_only_stripes_404_says_an_object_is_missing() -> None:
    assert ChargeFailure("http_404", "No such invoice", retryable=False).missing
    assert not ChargeFailure("http_400", "No such invoice", retryable=False).missing
    assert not ChargeFailure("connection", "reset", retryable=True).missing
