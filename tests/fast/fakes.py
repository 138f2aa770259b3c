"""Hand-written fakes behind the domain's ports, and a ledger in memory.

``memory_ledger()`` is the real ``BillingLedger`` on eventsourcing's in-memory (POPO)
persistence: the same aggregates, the same optimistic-concurrency check, no database.
``FakeGateway`` keeps charges the way Stripe's idempotency keys do (one per
transaction, whatever the number of calls) and answers from a script.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from adapters.settings import Settings
from domain.metering import Metering
from domain.ports import DeadLetter, Removal
from domain.pricing import Price, PriceList
from domain.saga import Charged, ChargeFailure, ChargeOutcome
from domain.transaction import BillingTransaction, Source
from domain.usage import UsageRecord
from store.ledger import BillingLedger

__all__ = [
    "FakeDeadLetters",
    "FakeGateway",
    "FaultyPrices",
    "memory_ledger",
    "reserve",
    "usage",
]

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def memory_ledger() -> BillingLedger:
    return BillingLedger(Settings().load_prices(), env={"PERSISTENCE_MODULE": "eventsourcing.popo"})


@dataclass(frozen=True)
class FaultyPrices(PriceList):
    """A price list whose lookup of ``faulty_meter`` raises what no rule expects (a bug,
    a broken price source): the last-resort guards must contain it to one record."""

    faulty_meter: str = "faulty.meter"

    def price_of(self, meter: str) -> Price:
        if meter == self.faulty_meter:
            raise RuntimeError(f"price source failed for {meter}")
        return super().price_of(meter)


def usage(usage_id: str, customer: str = "acme", quantity: int = 1000) -> UsageRecord:
    return UsageRecord(
        usage_id=usage_id,
        customer_id=customer,
        meter="api.requests",
        quantity=Decimal(quantity),
        occurred_at=T0,
    )


def reserve(ledger: BillingLedger, n: int, customer: str = "acme") -> list[UUID]:
    batch = [Metering(usage(f"f-{i}", customer), Source("usage", 0, i)) for i in range(n)]
    return [t.id for t in ledger.record_usage(batch).transactions]


@dataclass
class FakeGateway:
    """The payment gateway port: ``script`` answers the next charge calls in order
    (then success); ``removals`` the next removal calls (then success)."""

    script: list[ChargeFailure] = field(default_factory=list)
    removals: list[ChargeFailure] = field(default_factory=list)
    charges: dict[UUID, str] = field(default_factory=dict)  # live, by transaction
    calls: list[tuple[str, UUID]] = field(default_factory=list)

    def charge(self, txn: BillingTransaction, age: timedelta) -> ChargeOutcome:
        self.calls.append(("charge", txn.id))
        if self.script:
            return self.script.pop(0)
        item = self.charges.setdefault(txn.id, f"ii_{txn.id.hex[:12]}")
        return Charged(item)

    def remove_charge(self, txn: BillingTransaction, stripe_object_id: str | None) -> Removal:
        self.calls.append(("remove", txn.id))
        if self.removals:
            return self.removals.pop(0)
        return self.charges.pop(txn.id, None)

    def breaker_state(self) -> str:
        return "closed"


@dataclass
class FakeDeadLetters:
    """The dead-letter sink port, idempotent by source position as the real one is."""

    letters: dict[tuple[str, int, int], DeadLetter] = field(default_factory=dict)

    def record(self, letters: Sequence[DeadLetter]) -> int:
        new = [d for d in letters if (d.topic, d.partition, d.offset) not in self.letters]
        for d in new:
            self.letters[d.topic, d.partition, d.offset] = d
        return len(new)


@dataclass
class FakeRecord:
    """A consumed Kafka record, as kafka-python's ConsumerRecord shows it to ingest."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)


@dataclass
class FakeConsumer:
    """Hands out ``batches`` one poll at a time and remembers every commit."""

    batches: list[list[FakeRecord]]
    commits: list[dict[Any, Any]] = field(default_factory=list)

    def poll(self, timeout_ms: int = 0) -> dict[Any, list[FakeRecord]]:
        if not self.batches:
            return {}
        return {"tp": self.batches.pop(0)}

    def commit(self, offsets: dict[Any, Any] | None = None) -> None:
        self.commits.append(dict(offsets or {}))


@dataclass
class FakeProducer:
    sent: list[tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]]]] = field(
        default_factory=list
    )
    flushes: int = 0

    def send(
        self,
        topic: str,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        self.sent.append((topic, key, value, list(headers or [])))

    def flush(self) -> None:
        self.flushes += 1
