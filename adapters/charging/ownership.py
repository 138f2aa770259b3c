"""Which process pushes a line: the one whose charge consumer owns its customer's
partition of ``billing.events``.

The relay publishes every event keyed by its customer, so Kafka's group protocol
already gives each customer's line changes to one charge consumer at a time. The
reconciler of every process finds every open line in the database; without this,
two processes would push the same line at once, and one of their requests could
land after the other's (the closer's read-back repairs that, but each race is a
request spent and a repair to make). So a reconciler schedules a line only when
its process owns the customer's partition (kafka-python's default partitioner:
murmur2 of the key, as the relay's producer uses) or, so that nothing depends on an
owner being alive, when the line's oldest unsent change is older than
``takeover_after`` (a process whose charge consumer died, a partition nobody holds).

A process without a charge consumer (``--role reconcile`` alone, the CLI) owns
every line: it pushes what it finds, as before.

Each partition given to this process is claimed in the ledger (``domain.ownership``):
its pushes carry the claim, and a line already pushed under a newer claim refuses them,
so a process that lost a partition in a rebalance stops pushing its lines even before it
hears of the loss. A claim that cannot be recorded (the database away during the
rebalance) leaves the partition held without one: its pushes are not fenced, and the
closer's read-back keeps Stripe right all the same.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from kafka import ConsumerRebalanceListener, TopicPartition
from kafka.partitioner.default import murmur2

from domain.ownership import Claim
from store.errors import DATABASE_ERRORS, StoreError

__all__ = ["Ownership", "partition_of"]

log = logging.getLogger(__name__)

# What recording a claim can fail with: the database away, or claimants racing too long.
CLAIM_ERRORS: tuple[type[Exception], ...] = (*DATABASE_ERRORS, StoreError)


def partition_of(customer: str, partitions: int) -> int:
    """The partition of ``billing.events`` the relay sends ``customer``'s events to."""
    hashed: int = murmur2(customer.encode())
    return (hashed & 0x7FFFFFFF) % partitions


class Ownership(ConsumerRebalanceListener):  # type: ignore[misc]
    """The partitions of ``topic`` this process's charge consumer holds now."""

    def __init__(
        self,
        topic: str,
        partitions: int,
        takeover_after: timedelta,
        claim: Callable[[int], Claim] | None = None,
    ) -> None:
        self.topic = topic
        self.partitions = partitions
        self.takeover_after = takeover_after
        self.claim = claim  # records a claim of a partition given to this process
        self._held: frozenset[int] = frozenset()
        self._claims: dict[int, Claim] = {}
        self._lock = threading.Lock()

    def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        held = frozenset(tp.partition for tp in assigned if tp.topic == self.topic)
        claims = {p: c for p in sorted(held) if (c := self._claimed(p)) is not None}
        with self._lock:
            self._held = held
            self._claims = claims

    def _claimed(self, partition: int) -> Claim | None:
        if self.claim is None:
            return None
        try:
            return self.claim(partition)
        except CLAIM_ERRORS as exc:
            log.warning("partition %d held without a claim: %s", partition, exc)
            return None

    def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        gone = {tp.partition for tp in revoked if tp.topic == self.topic}
        with self._lock:
            self._held = self._held - gone
            self._claims = {p: c for p, c in self._claims.items() if p not in gone}

    def claim_for(self, customer: str) -> Claim | None:
        """The claim under which this process pushes ``customer``'s lines (None: it
        holds no claim of the customer's partition; its pushes are not fenced)."""
        with self._lock:
            return self._claims.get(partition_of(customer, self.partitions))

    @property
    def held(self) -> frozenset[int]:
        with self._lock:
            return self._held

    def pushes(self, customer: str | None, oldest_change: datetime | None, now: datetime) -> bool:
        """Whether this process should push a line of ``customer`` whose oldest unsent
        change is ``oldest_change``: it owns the customer, or the owner is late."""
        if customer is None or partition_of(customer, self.partitions) in self.held:
            return True
        # Not projected yet (no time known): its owner has it from the topic.
        return oldest_change is not None and now - oldest_change >= self.takeover_after
