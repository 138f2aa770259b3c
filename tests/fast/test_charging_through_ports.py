"""The charge saga's driver, through its ports: an in-memory ledger and a fake gateway.

No PostgreSQL, broker or emulator: these run in milliseconds and pin what the
``Charger`` records for each answer the gateway gives (the drills prove the same
against the real components).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from eventsourcing.persistence import IntegrityError

from adapters.charging.charger import Charger
from domain.saga import ChargeFailure, RetryPolicy, StepResult
from domain.transaction import BillingTransaction, TxnState
from tests.fast.fakes import FakeGateway, memory_ledger, reserve

POLICY = RetryPolicy(max_attempts=3, horizon=timedelta(hours=1))


def _charger(gateway: FakeGateway) -> Charger:
    return Charger(memory_ledger(), gateway, POLICY, jitter=lambda: 0.5)


def test_a_reserved_transaction_is_charged_once_and_records_the_charge() -> None:
    gateway = FakeGateway()
    charger = _charger(gateway)
    [txn_id] = reserve(charger.ledger, 1)
    assert charger.drive(txn_id) is StepResult.CHARGED
    assert charger.drive(txn_id) is StepResult.NOTHING  # terminal: nothing more is sent
    txn = charger.ledger.transaction(txn_id)
    assert txn.state is TxnState.CHARGED
    assert txn.stripe_object_id == gateway.charges[txn_id]
    assert gateway.calls == [("charge", txn_id)]


def test_a_retryable_failure_records_when_the_next_attempt_is_due() -> None:
    gateway = FakeGateway(script=[ChargeFailure("http_503", "down", retryable=True)])
    charger = _charger(gateway)
    [txn_id] = reserve(charger.ledger, 1)
    assert charger.drive(txn_id) is StepResult.RETRY
    txn = charger.ledger.transaction(txn_id)
    assert txn.state is TxnState.CHARGE_FAILED
    assert txn.attempts == 1 and txn.next_attempt_at is not None
    assert txn.next_attempt_at > txn.modified_on
    assert charger.drive(txn_id) is StepResult.WAIT  # not due yet: no call
    assert len(gateway.calls) == 1


def test_a_permanent_failure_compensates_without_a_cleanup_call_and_releases_the_hold() -> None:
    gateway = FakeGateway(script=[ChargeFailure("http_400", "no such customer", retryable=False)])
    charger = _charger(gateway)
    [txn_id] = reserve(charger.ledger, 1)
    assert charger.drive(txn_id) is StepResult.COMPENSATED
    txn = charger.ledger.transaction(txn_id)
    assert txn.state is TxnState.COMPENSATED
    assert "permanent error http_400" in (txn.compensation_reason or "")
    assert [c for c, _ in gateway.calls] == ["charge"]  # Stripe said no: nothing to remove
    account = charger.ledger.account("acme", "USD")
    assert account is not None and account.committed == 0


def test_past_the_horizon_a_failed_cleanup_defers_and_a_later_pass_compensates() -> None:
    gateway = FakeGateway(removals=[ChargeFailure("connection", "reset", retryable=True)])
    charger = _charger(gateway)
    [txn_id] = reserve(charger.ledger, 1)
    created = charger.ledger.transaction(txn_id).created_on
    charger.clock = lambda: created + POLICY.horizon + timedelta(seconds=1)
    assert charger.drive(txn_id) is StepResult.DEFERRED
    assert charger.ledger.transaction(txn_id).state is TxnState.RESERVED  # nothing recorded
    assert charger.drive(txn_id) is StepResult.COMPENSATED
    assert [c for c, _ in gateway.calls] == ["remove", "remove"]
    assert "retry horizon" in (charger.ledger.transaction(txn_id).compensation_reason or "")


def test_two_drivers_of_one_transaction_record_one_charge() -> None:
    gateway = FakeGateway()
    first = _charger(gateway)
    second = Charger(first.ledger, gateway, POLICY)
    [txn_id] = reserve(first.ledger, 1)
    # The second driver decides on a copy loaded before the first one's charge lands.
    stale = first.ledger.transaction(txn_id)
    assert first.drive(txn_id) is StepResult.CHARGED
    stale.record_charged("ii_other")
    with pytest.raises(IntegrityError):  # the version check refuses the second Charged
        first.ledger.save(stale)
    assert second.drive(txn_id) is StepResult.NOTHING
    charged = [e for e in first.ledger.history(txn_id) if isinstance(e, BillingTransaction.Charged)]
    assert len(charged) == 1


def test_a_reversal_removes_the_charge_and_compensates_the_transaction() -> None:
    gateway = FakeGateway()
    charger = _charger(gateway)
    [txn_id] = reserve(charger.ledger, 1)
    charger.drive(txn_id)
    assert charger.reverse(txn_id, "customer asked") is StepResult.REVERSED
    txn = charger.ledger.transaction(txn_id)
    assert txn.state is TxnState.COMPENSATED and txn_id not in gateway.charges
