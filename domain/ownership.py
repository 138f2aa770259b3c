"""Claims of a partition: which consumer owns a customer's line pushes, and since when.

Each line's pushes run in the process whose charge consumer holds its customer's
partition of ``billing.events`` (Kafka's group protocol gives each partition to one
consumer at a time). A rebalance moves a partition while its old holder may still be
pushing: so each holder records a ``PartitionClaim`` when it is given the partition (an
event, no lock: the store's version check orders two claims), and pushes each line
under that claim (``LinePush.start_attempt``). A line push remembers the newest claim
it was pushed under and refuses an older one: once the new holder has pushed a line,
the old holder cannot start another attempt on it, whatever it still has in memory.
The claim is checked at save: an old holder that loaded the line before the new holder
pushed it loses the version race, reloads, and is refused.

A claim is a fence that makes races rare, not what keeps Stripe right (the closer's
read-back does that); a push without a claim (a process without a charge consumer, or
one taking a line over from a late owner) is never refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.ids import partition_claim_id

__all__ = ["Claim", "PartitionClaim"]


@dataclass(frozen=True)
class Claim:
    """A holder's claim of one partition: the ``epoch``-th claim of ``partition``."""

    partition: int
    epoch: int


class PartitionClaim(Aggregate):
    """The claims of one partition of a topic, in order (the epoch is their count)."""

    class Opened(Aggregate.Created):
        topic: str
        partition: int

    class Claimed(Aggregate.Event):
        owner: str  # who (host and process), for people reading the history
        epoch: int

    @staticmethod
    def create_id(topic: str, partition: int, **_: Any) -> UUID:
        return partition_claim_id(topic, partition)

    @event(Opened)
    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.epoch = 0
        self.owner: str | None = None

    def claim(self, owner: str) -> Claim:
        """``owner`` holds the partition from now on: its claim, newer than any before."""
        epoch = self.epoch + 1
        self._claimed(owner, epoch)
        return Claim(self.partition, epoch)

    @event(Claimed)
    def _claimed(self, owner: str, epoch: int) -> None:
        self.owner = owner
        self.epoch = epoch
