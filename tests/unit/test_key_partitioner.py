"""The producers' partitioner: kafka-python's default (murmur2 of the key), each key's
hash remembered; the partition it gives is the one ``partition_of`` (ownership) expects."""

from __future__ import annotations

import pytest
from kafka.partitioner.default import DefaultPartitioner

from adapters import broker
from adapters.broker import KeyHashPartitioner, make_producer
from adapters.charging.ownership import partition_of


class Cluster:
    def __init__(self, partitions: dict[str, set[int]]) -> None:
        self.partitions = partitions

    def topics(self) -> set[str]:
        return set(self.partitions)

    def partitions_for_topic(self, topic: str) -> set[int]:
        return self.partitions[topic]

    def available_partitions_for_topic(self, topic: str) -> set[int]:
        return self.partitions[topic]


KEYS = [f"cust-{i:03d}".encode() for i in range(500)] + [b"", "é".encode(), b"x" * 300]


def test_every_key_goes_where_the_default_partitioner_and_ownership_send_it() -> None:
    cluster = Cluster({"billing.events": {0, 1, 2, 3}, "six": set(range(6))})
    ours, default = KeyHashPartitioner(), DefaultPartitioner()
    for topic, count in (("billing.events", 4), ("six", 6)):
        for _ in range(2):  # the second time from what it remembered
            for key in KEYS:
                mine = ours.partition(topic, key, key, None, None, cluster)
                assert mine == default.partition(topic, key, key, None, None, cluster)
                assert mine == partition_of(key.decode(), count)


def test_past_the_keys_it_remembers_it_forgets_them_and_hashes_again() -> None:
    cluster = Cluster({"t": {0, 1, 2}})
    ours = KeyHashPartitioner()
    ours.remembered = 10
    for key in KEYS[:25]:
        assert ours.partition("t", key, key, None, None, cluster) == partition_of(key.decode(), 3)
    assert len(ours._hashes) == 5  # cleared at 10 and at 20


def test_a_record_without_a_key_goes_to_one_of_the_topics_partitions() -> None:
    cluster = Cluster({"t": {0, 1, 2}})
    assert KeyHashPartitioner().partition("t", None, None, None, None, cluster) in {0, 1, 2}


def test_the_producers_use_it(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, object]] = []
    monkeypatch.setattr(broker, "KafkaProducer", lambda **config: made.append(config))
    make_producer("127.0.0.1:9")
    assert isinstance(made[0]["partitioner"], KeyHashPartitioner)
