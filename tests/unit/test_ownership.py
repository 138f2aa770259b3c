"""One pusher per line (``adapters.charging.ownership``): the partition a customer's
events go to, which lines a process pushes, and how a rebalance moves them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kafka import TopicPartition
from kafka.partitioner.default import DefaultPartitioner

from adapters.charging.ownership import Ownership, partition_of

NOW = datetime(2026, 12, 4, 12, tzinfo=UTC)
TOPIC = "billing.events"


class _Cluster:
    """The cluster metadata kafka-python's partitioner reads, for one topic."""

    def __init__(self, partitions: int) -> None:
        self.partitions = set(range(partitions))

    def topics(self) -> set[str]:
        return {TOPIC}

    def partitions_for_topic(self, topic: str) -> set[int]:
        return self.partitions

    def available_partitions_for_topic(self, topic: str) -> set[int]:
        return self.partitions


def test_a_customers_partition_is_the_one_the_relays_producer_sends_it_to() -> None:
    for partitions in (1, 4, 7):
        cluster = _Cluster(partitions)
        for n in range(200):
            customer = f"cust-{n}"
            key = customer.encode()
            chosen = DefaultPartitioner().partition(TOPIC, customer, key, None, None, cluster)
            assert partition_of(customer, partitions) == chosen


def _ownership(held: set[int]) -> Ownership:
    owned = Ownership(TOPIC, 4, takeover_after=timedelta(seconds=60))
    owned.on_partitions_assigned([TopicPartition(TOPIC, p) for p in held])
    return owned


def test_a_process_pushes_the_lines_of_the_partitions_it_holds_and_late_ones_of_others() -> None:
    mine = next(f"c-{n}" for n in range(100) if partition_of(f"c-{n}", 4) == 1)
    theirs = next(f"c-{n}" for n in range(100) if partition_of(f"c-{n}", 4) == 2)
    owned = _ownership({1})
    recent, late = NOW - timedelta(seconds=5), NOW - timedelta(seconds=60)
    assert owned.pushes(mine, recent, NOW) and owned.pushes(mine, None, NOW)
    assert not owned.pushes(theirs, recent, NOW)  # its owner's
    assert not owned.pushes(theirs, None, NOW)  # not projected yet: its owner has it
    assert owned.pushes(theirs, late, NOW)  # the owner is late: anyone takes it
    assert owned.pushes(None, recent, NOW)  # no customer known: pushed here


def test_a_rebalance_moves_ownership_and_another_topics_partitions_are_ignored() -> None:
    owned = _ownership({1, 2})
    owned.on_partitions_revoked([TopicPartition(TOPIC, 2), TopicPartition("other", 1)])
    assert owned.held == frozenset({1})
    owned.on_partitions_assigned([TopicPartition(TOPIC, 3), TopicPartition("other", 0)])
    assert owned.held == frozenset({3})


def test_before_its_first_assignment_a_process_holds_nothing_and_pushes_only_late_lines() -> None:
    owned = Ownership(TOPIC, 4, takeover_after=timedelta(seconds=60))
    assert owned.held == frozenset()
    customer = "c-0"
    assert not owned.pushes(customer, NOW - timedelta(seconds=5), NOW)
    assert owned.pushes(customer, NOW - timedelta(seconds=60), NOW)
    owned.on_partitions_revoked([TopicPartition(TOPIC, 0)])  # a revoke first is harmless
    assert owned.held == frozenset()
