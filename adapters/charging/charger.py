"""Drives transactions through the charging saga: the process manager's and the
reconciler's shared path. The decisions are ``domain.saga``'s; this module only
loads, calls the payment gateway (``domain.ports.PaymentGateway``), and saves.

No locks. Two drivers of one transaction may both call Stripe: the idempotency key
``charge:{txn_id}`` makes the second call return the first call's invoice item, and
the event store's version check lets exactly one of them record the outcome; the
loser reloads, finds the transaction moved on, and does nothing.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from uuid import UUID

from eventsourcing.persistence import IntegrityError

from adapters.errors import PaymentFailed
from adapters.observability import telemetry
from adapters.observability.logs import step_fields
from adapters.observability.metrics import metrics
from domain.account import CustomerAccount
from domain.errors import IllegalTransition
from domain.ports import PaymentGateway
from domain.saga import (
    Charged,
    ChargeFailure,
    ChargeOutcome,
    RetryPolicy,
    Step,
    StepResult,
    Verdict,
    after_attempt,
    compensation_step,
    must_clean_up,
    next_step,
)
from domain.transaction import BillingTransaction, TxnState
from store.ledger import BillingLedger
from store.recorder import ConsumerPosition

__all__ = ["Charger", "utcnow"]

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Charger:
    """Moves one transaction forward as far as it can go now."""

    max_races = 30

    def __init__(
        self,
        ledger: BillingLedger,
        stripe: PaymentGateway,
        policy: RetryPolicy,
        *,
        clock: Callable[[], datetime] = utcnow,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.ledger = ledger
        self.stripe = stripe
        self.policy = policy
        self.clock = clock
        self.jitter = jitter

    def drive(self, txn_id: UUID, position: ConsumerPosition | None = None) -> StepResult:
        """Take the next step of ``txn_id``; returns what happened.

        ``position``: the consumer position of the event that asked for this step; it
        is recorded in the same database transaction as the step's events.

        When the save loses a race, reload and re-decide, re-using the Stripe outcome
        already obtained: the same key would only replay it.
        """
        known: list[ChargeOutcome] = []  # local: one Charger serves many threads
        for race in range(self.max_races):
            if race:
                time.sleep(random.uniform(0, 0.002 * min(race, 10)))  # spread the retries
            txn = self.ledger.transaction(txn_id)
            now = self.clock()
            step = next_step(txn, now, self.policy)
            if step is Step.NOTHING:
                return StepResult.NOTHING
            if step is Step.WAIT:
                return StepResult.WAIT
            account = self._account(txn)
            try:
                result = self._step(txn, account, step, now, known)
                if result is StepResult.DEFERRED:
                    metrics().charge_steps.add(1, {"result": str(result)})
                    return result
                # The account changes only when a hold is released (compensation): a
                # charge saves the transaction alone and never contends with ingest.
                with _record_span(txn):
                    self.ledger.save(
                        txn,
                        account if account.pending_events else None,
                        positions=[position] if position else [],
                    )
            except (IntegrityError, IllegalTransition):
                continue  # another driver recorded first: reload and look again
            failure = known[0] if known and isinstance(known[0], ChargeFailure) else None
            _count(txn, result, now)
            log.info(
                f"charge {result}",
                extra=step_fields(str(step), str(result), transaction_id=txn.id,
                                  error_code=failure.error_class if failure else None,
                                  customer_id=txn.customer_id, attempt=txn.attempts),
            )  # fmt: skip
            return result
        return StepResult.RACED

    def _step(
        self,
        txn: BillingTransaction,
        account: CustomerAccount,
        step: Step,
        now: datetime,
        known: list[ChargeOutcome],
    ) -> StepResult:
        if step is Step.COMPENSATE:
            return self._give_up(txn, account, "retry horizon passed", None)
        if not known:
            log.info(
                "charge attempted",
                extra=step_fields("charge", "attempted", transaction_id=txn.id,
                                  customer_id=txn.customer_id, attempt=txn.attempts + 1),
            )  # fmt: skip
            known.append(self.stripe.charge(txn, now - txn.created_on))
        outcome = known[0]
        decision = after_attempt(txn, outcome, self.clock(), self.policy, self.jitter())
        if decision.verdict is Verdict.CHARGED:
            assert isinstance(outcome, Charged)
            txn.record_charged(outcome.stripe_object_id)
            return StepResult.CHARGED  # the account is untouched: the amount stays held
        assert isinstance(outcome, ChargeFailure)
        if decision.verdict is Verdict.RETRY:
            txn.record_charge_failure(
                outcome.error_class, outcome.message,
                retryable=True, next_attempt_at=decision.next_attempt_at,
            )  # fmt: skip
            return StepResult.RETRY
        txn.record_charge_failure(
            outcome.error_class, outcome.message, retryable=False, next_attempt_at=None
        )
        return self._give_up(txn, account, decision.reason or "gave up", outcome)

    def _give_up(
        self,
        txn: BillingTransaction,
        account: CustomerAccount,
        reason: str,
        outcome: ChargeOutcome | None,
    ) -> StepResult:
        """Compensate: remove any invoice item an unknown outcome may have left, release."""
        cleanup: ChargeFailure | None = None
        if must_clean_up(outcome):
            removal = self.stripe.remove_charge(txn, txn.stripe_object_id)
            cleanup = removal if isinstance(removal, ChargeFailure) else None
        if compensation_step(cleanup) is not Step.COMPENSATE:
            assert cleanup is not None
            log.warning(
                "compensation deferred: %s", cleanup.message,
                extra=step_fields("compensate", "deferred", transaction_id=txn.id,
                                  error_code=cleanup.error_class),
            )  # fmt: skip
            return StepResult.DEFERRED
        txn.compensate(reason)
        account.release(txn.id, txn.amount)
        return StepResult.COMPENSATED

    def _account(self, txn: BillingTransaction) -> CustomerAccount:
        account = self.ledger.account(txn.customer_id, txn.currency)
        if account is None:  # cannot happen after Reserved; a clear error if it does
            raise LookupError(f"no account for {txn.customer_id}/{txn.currency}")
        return account

    def reverse(self, txn_id: UUID, reason: str) -> StepResult:
        """Operator reversal of a Charged transaction: delete its invoice item, compensate."""
        for _ in range(self.max_races):
            txn = self.ledger.transaction(txn_id)
            if txn.state is not TxnState.CHARGED:
                raise IllegalTransition(f"transaction {txn_id} is {txn.state}, not charged")
            account = self._account(txn)
            reversal = self.stripe.remove_charge(txn, txn.stripe_object_id)
            if isinstance(reversal, ChargeFailure):
                raise PaymentFailed(f"reversal not done in Stripe: {reversal.message}")
            txn.compensate(reason, stripe_reversal_id=f"deleted:{reversal}")
            account.release(txn.id, txn.amount)
            try:
                with _record_span(txn):
                    self.ledger.save(txn, account)
            except IntegrityError:
                continue
            log.info(
                "charge reversed",
                extra=step_fields("reverse", "reversed", transaction_id=txn.id, reason=reason),
            )
            return StepResult.REVERSED
        return StepResult.RACED


def _count(txn: BillingTransaction, result: StepResult, now: datetime) -> None:
    m = metrics()
    m.charge_steps.add(1, {"result": str(result)})
    if result is StepResult.RETRY:
        m.retries.add(1)
    elif result is StepResult.CHARGED:
        m.charge_latency.record((now - txn.created_on).total_seconds())


def _record_span(txn: BillingTransaction) -> AbstractContextManager[telemetry.Span]:
    """The ``record`` span: the save of the transaction's new events."""
    return telemetry.span(
        "record",
        billing__transaction_id=str(txn.id),
        billing__customer_id=txn.customer_id,
        billing__events=",".join(type(e).__name__ for e in txn.pending_events),
    )
