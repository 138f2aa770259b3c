"""Drives transactions through the charging saga: the process manager's and the
reconciler's shared path. The decisions are ``domain.saga``'s; this module only
loads, calls Stripe, and saves.

No locks. Two drivers of one transaction may both call Stripe: the idempotency key
``charge:{txn_id}`` makes the second call return the first call's invoice item, and
the event store's version check lets exactly one of them record the outcome; the
loser reloads, finds the transaction moved on, and does nothing.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID

import psycopg
from eventsourcing.persistence import IntegrityError

from adapters import telemetry
from adapters.eventstore import ConsumerPosition
from adapters.ledger import BillingLedger
from adapters.logs import step_fields
from adapters.metrics import metrics
from adapters.stripe_client import StripeCharges, classify
from domain.account import CustomerAccount
from domain.errors import IllegalTransition
from domain.saga import (
    Charged,
    ChargeFailure,
    ChargeOutcome,
    RetryPolicy,
    Step,
    Verdict,
    after_attempt,
    is_stale,
    next_step,
)
from domain.transaction import BillingTransaction, TxnState

__all__ = ["Charger", "Reconciler"]

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Charger:
    """Moves one transaction forward as far as it can go now."""

    max_races = 30

    def __init__(
        self,
        ledger: BillingLedger,
        stripe: StripeCharges,
        policy: RetryPolicy,
        *,
        clock: Callable[[], datetime] = utcnow,
        jitter: Callable[[], float] = random.random,
        drill: str = "",
    ) -> None:
        self.ledger = ledger
        self.stripe = stripe
        self.policy = policy
        self.clock = clock
        self.jitter = jitter
        self.drill = drill  # "kill_after_stripe" | "kill_before_stripe": fault drills only

    def drive(self, txn_id: UUID, position: ConsumerPosition | None = None) -> str:
        """Take the next step of ``txn_id``; returns what happened (for logs and tests).

        ``position``: the consumer position of the event that asked for this step; it
        is recorded in the same database transaction as the step's events.

        When the save loses a race (usually on the customer's account, which every
        charge of that customer settles), reload and re-decide, re-using the Stripe
        outcome already obtained: the same key would only replay it.
        """
        known: list[ChargeOutcome] = []  # local: one Charger serves many threads
        for race in range(self.max_races):
            if race:
                time.sleep(random.uniform(0, 0.002 * min(race, 10)))  # spread the retries
            txn = self.ledger.transaction(txn_id)
            now = self.clock()
            step = next_step(txn, now, self.policy)
            if step in (Step.NOTHING, Step.WAIT):
                return str(step)
            account = self._account(txn)
            try:
                result = self._step(txn, account, step, now, known)
                if result is None:
                    metrics().charge_steps.add(1, {"result": "deferred"})
                    return "deferred"
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
                extra=step_fields(str(step), result, transaction_id=txn.id,
                                  error_code=failure.error_class if failure else None,
                                  customer_id=txn.customer_id, attempt=txn.attempts),
            )  # fmt: skip
            return result
        return "raced"

    def _step(
        self,
        txn: BillingTransaction,
        account: CustomerAccount,
        step: Step,
        now: datetime,
        known: list[ChargeOutcome],
    ) -> str | None:
        if step is Step.COMPENSATE:
            return self._give_up(txn, account, "retry horizon passed", cleanup=True)
        if self.drill == "kill_before_stripe":
            os.kill(os.getpid(), signal.SIGKILL)
        if not known:
            log.info(
                "charge attempted",
                extra=step_fields("charge", "attempted", transaction_id=txn.id,
                                  customer_id=txn.customer_id, attempt=txn.attempts + 1),
            )  # fmt: skip
            known.append(self._attempt(txn, now))
        outcome = known[0]
        if self.drill == "kill_after_stripe":
            os.kill(os.getpid(), signal.SIGKILL)
        decision = after_attempt(txn, outcome, self.clock(), self.policy, self.jitter())
        if decision.verdict is Verdict.CHARGED:
            assert decision.stripe_object_id is not None
            txn.record_charged(decision.stripe_object_id)
            return "charged"  # the account is untouched: the amount stays held, as charged
        assert isinstance(outcome, ChargeFailure)
        if decision.verdict is Verdict.RETRY:
            txn.record_charge_failure(
                outcome.error_class, outcome.message,
                retryable=True, next_attempt_at=decision.next_attempt_at,
            )  # fmt: skip
            return "retry"
        txn.record_charge_failure(
            outcome.error_class, outcome.message, retryable=False, next_attempt_at=None
        )
        return self._give_up(txn, account, decision.reason or "gave up", cleanup=outcome.retryable)

    def _attempt(self, txn: BillingTransaction, now: datetime) -> ChargeOutcome:
        try:
            return Charged(self.stripe.charge(txn, now - txn.created_on))
        except Exception as exc:  # every failure is classified and recorded, never dropped
            return classify(exc)

    def _give_up(
        self, txn: BillingTransaction, account: CustomerAccount, reason: str, *, cleanup: bool
    ) -> str | None:
        """Compensate: remove any invoice item an unknown outcome may have left, release."""
        if cleanup:
            try:
                self.stripe.remove_charge(txn, txn.stripe_object_id)
            except Exception as exc:
                # Cannot know Stripe holds nothing: compensating now could leave a live
                # charge behind. Record nothing; the reconciler comes back.
                failure = classify(exc)
                log.warning(
                    "compensation deferred: %s", failure.message,
                    extra=step_fields("compensate", "deferred", transaction_id=txn.id,
                                      error_code=failure.error_class),
                )  # fmt: skip
                return None
        txn.compensate(reason)
        account.release(txn.id, txn.amount)
        return "compensated"

    def _account(self, txn: BillingTransaction) -> CustomerAccount:
        account = self.ledger.account(txn.customer_id, txn.currency)
        if account is None:  # cannot happen after Reserved; a clear error if it does
            raise LookupError(f"no account for {txn.customer_id}/{txn.currency}")
        return account

    def reverse(self, txn_id: UUID, reason: str) -> str:
        """Operator reversal of a Charged transaction: delete its invoice item, compensate."""
        for _ in range(self.max_races):
            txn = self.ledger.transaction(txn_id)
            if txn.state is not TxnState.CHARGED:
                raise IllegalTransition(f"transaction {txn_id} is {txn.state}, not charged")
            account = self._account(txn)
            reversal = self.stripe.remove_charge(txn, txn.stripe_object_id)
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
            return "reversed"
        return "raced"


def _count(txn: BillingTransaction, result: str, now: datetime) -> None:
    m = metrics()
    m.charge_steps.add(1, {"result": result})
    if result == "retry":
        m.retries.add(1)
    elif result == "charged":
        m.charge_latency.record((now - txn.created_on).total_seconds())


def _record_span(txn: BillingTransaction) -> AbstractContextManager[telemetry.Span]:
    """The ``record`` span: the save of the transaction's new events."""
    return telemetry.span(
        "record",
        billing__transaction_id=str(txn.id),
        billing__customer_id=txn.customer_id,
        billing__events=",".join(type(e).__name__ for e in txn.pending_events),
    )


@dataclass
class ReconcileReport:
    examined: int = 0
    driven: int = 0
    results: dict[str, int] | None = None


class Reconciler:
    """Finds transactions whose next step is due or overdue and drives them."""

    def __init__(self, charger: Charger, database_url: str, *, parallel: int = 8) -> None:
        self.charger = charger
        self.database_url = database_url
        self.parallel = parallel

    def pass_once(self) -> ReconcileReport:
        """Drive every transaction whose step is due, ``parallel`` at a time (the Stripe
        client's own limits still bound the pressure on Stripe)."""
        report = ReconcileReport(results={})
        now = self.charger.clock()
        due: list[UUID] = []
        for txn_id in self.open_transactions():
            report.examined += 1
            txn = self.charger.ledger.transaction(txn_id)
            step = next_step(txn, now, self.charger.policy)
            if step is Step.COMPENSATE or (
                step is Step.CHARGE
                and (txn.state is TxnState.CHARGE_FAILED or is_stale(txn, now, self.charger.policy))
            ):
                due.append(txn_id)
        report.driven = len(due)
        if due:
            with ThreadPoolExecutor(self.parallel, thread_name_prefix="reconcile") as pool:
                results = Counter(pool.map(self._drive, due))
            report.results = dict(results)
        return report

    def _drive(self, txn_id: UUID) -> str:
        """One reconciler action: a ``reconcile`` span in the transaction's trace."""
        with telemetry.span(
            "reconcile",
            telemetry.transaction_context(txn_id),
            billing__transaction_id=str(txn_id),
        ) as current:
            result = self.charger.drive(txn_id)
            current.set_attribute("billing.result", result)
            log.info(
                "transaction reconciled",
                extra=step_fields("reconcile", result, transaction_id=txn_id),
            )
        return result

    def open_transactions(self) -> list[UUID]:
        """Transactions that are neither Charged nor Compensated.

        Those the ``transactions`` projection has seen come from its (state,
        next_attempt_at) index; those recorded after the projection's position (in
        commit order, as the projector reads) are found in the events past it, so a
        projector that is behind or stopped never hides a transaction from the
        reconciler. A row that is out of date only costs a load: ``next_step``
        decides from the aggregate itself.
        """
        prefix = f"{BillingTransaction.__module__}:{BillingTransaction.__qualname__}."
        with psycopg.connect(self.database_url) as conn:
            rows = conn.execute(
                "SELECT transaction_id FROM billing.transactions"
                " WHERE state IN ('metered', 'reserved', 'charge_failed')"
                " UNION "
                "SELECT originator_id FROM ("
                " SELECT DISTINCT ON (originator_id) originator_id, topic"
                " FROM billingledger_events"
                " WHERE (xid, notification_id) > coalesce("
                "  (SELECT (p.xid, p.notification_id) FROM billing.projection_positions p"
                "   WHERE p.name = 'transactions'), ('0'::xid8, 0::bigint))"
                " AND topic LIKE %s"
                " ORDER BY originator_id, originator_version DESC) latest"
                " WHERE topic <> ALL(%s)",
                (prefix + "%", [prefix + "Charged", prefix + "Compensated"]),
            ).fetchall()
        return [r[0] for r in rows]
