"""The ledger application: loads and saves aggregates for the domain's decisions.

``BillingLedger`` is an eventsourcing ``Application``. It owns no rules: it asks
``domain.metering.meter_batch`` what a batch changes and saves all of it in one
database transaction. When that save loses an optimistic-concurrency race (an
account or a transaction was written by someone else first), it reloads and
re-decides; a redelivered record then finds its transaction already recorded and
is counted as a duplicate, with no second write.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.domain import DomainEventProtocol
from eventsourcing.persistence import IntegrityError

from domain.account import CustomerAccount
from domain.ids import account_id
from domain.metering import Metering, MeteringDecision, meter_batch
from domain.pricing import PriceList
from domain.transaction import BillingTransaction

__all__ = ["BillingLedger", "ConcurrencyExhausted"]


class ConcurrencyExhausted(RuntimeError):
    """Raised when a batch keeps losing optimistic-concurrency races."""


@dataclass(frozen=True)
class SaveStats:
    attempts: int
    events: int


class BillingLedger(Application[UUID]):
    """Billing transactions and customer accounts in the event store."""

    name = "BillingLedger"
    env: ClassVar[dict[str, str]] = {
        "AGGREGATE_CACHE_MAXSIZE": "20000",
        "AGGREGATE_CACHE_FASTFORWARD": "y",
    }
    snapshotting_intervals: ClassVar[dict[type[Any], int]] = {CustomerAccount: 200}
    max_attempts = 8

    def __init__(self, prices: PriceList, env: dict[str, str] | None = None) -> None:
        super().__init__(env)
        self.prices = prices
        self.last_save = SaveStats(attempts=0, events=0)

    def record_usage(self, batch: Sequence[Metering]) -> MeteringDecision:
        """Record a batch of valid usage in one save; see the module docstring."""
        check_existing = False
        for attempt in range(1, self.max_attempts + 1):
            recorded = (
                self._recorded_ids([m.transaction_id for m in batch]) if check_existing else ()
            )
            decision = meter_batch(
                batch, self.prices, load_account=self._load_account, already_recorded=recorded
            )
            try:
                recordings = self.save(*decision.aggregates)
            except IntegrityError:
                check_existing = True
                continue
            self.last_save = SaveStats(attempts=attempt, events=len(recordings))
            return decision
        raise ConcurrencyExhausted(
            f"batch of {len(batch)} records lost {self.max_attempts} concurrency races"
        )

    def set_spend_limit(self, customer_id: str, currency: str, spend_limit: int | None) -> None:
        """Set a customer's spend limit in one currency (None: unlimited)."""
        for _ in range(self.max_attempts):
            account = self._load_account(customer_id, currency)
            if account is None:
                account = CustomerAccount.open(customer_id, currency, spend_limit)
            else:
                account.set_limit(spend_limit)
            try:
                self.save(account)
            except IntegrityError:
                continue
            return
        raise ConcurrencyExhausted(f"could not set the limit of {customer_id}/{currency}")

    def account(self, customer_id: str, currency: str) -> CustomerAccount | None:
        """The account, or None if the customer has no usage or limit in that currency."""
        return self._load_account(customer_id, currency)

    def transaction(self, txn_id: UUID) -> BillingTransaction:
        """The transaction (raises AggregateNotFoundError)."""
        txn: BillingTransaction = self.repository.get(txn_id)
        return txn

    def history(self, aggregate_id: UUID) -> list[DomainEventProtocol[UUID]]:
        """Every event of one aggregate, oldest first."""
        return list(self.events.get(aggregate_id))

    def all_events(self, *, section: int = 5000) -> Iterator[DomainEventProtocol[UUID]]:
        """Every event in the store in notification-log order (for folds and audits)."""
        start = 1
        while True:
            notifications = self.recorder.select_notifications(start, section)
            for n in notifications:
                yield self.mapper.to_domain_event(n)
            if len(notifications) < section:
                return
            start = notifications[-1].id + 1

    def _load_account(self, customer_id: str, currency: str) -> CustomerAccount | None:
        try:
            account: CustomerAccount = self.repository.get(account_id(customer_id, currency))
        except AggregateNotFoundError:
            return None
        return account

    def _recorded_ids(self, ids: Sequence[UUID]) -> set[UUID]:
        return {i for i in set(ids) if self.recorder.select_events(i, limit=1)}
