"""Kafka clients (kafka-python), configured in one place.

Group timings are shortened (``session_timeout_ms=6000``, ``heartbeat_interval_ms=1000``)
because with the defaults a consumer group's first join takes ~23 s against Tansu
and rebalances after a crash wait as long; both work against Apache Kafka too.
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
from collections.abc import Iterable, Sequence
from typing import Any

from kafka import (
    ConsumerRebalanceListener,
    KafkaAdminClient,
    KafkaConsumer,
    KafkaProducer,
    TopicPartition,
)
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError
from kafka.partitioner.default import DefaultPartitioner, murmur2

__all__ = [
    "BrokerUnreachable",
    "KeyHashPartitioner",
    "LagProbe",
    "PublishFailed",
    "check_reachable",
    "consumer_lag",
    "end_offsets",
    "ensure_topics",
    "flush_acknowledged",
    "make_consumer",
    "make_producer",
    "use_security",
]

GROUP_TIMINGS: dict[str, Any] = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 1000,
    "max_poll_interval_ms": 300_000,
}


# The client settings of SASL (kafka-python's names), for every client this process
# makes: set once at start by ``use_security`` (``adapters.bootstrap.prepare``).
_SECURITY: dict[str, Any] = {}


def use_security(
    protocol: str, mechanism: str = "SCRAM-SHA-512", username: str = "", password: str = ""
) -> None:
    """Every Kafka client of this process authenticates so (``PLAINTEXT``: no SASL)."""
    _SECURITY.clear()
    if protocol == "PLAINTEXT":
        return
    _SECURITY["security_protocol"] = protocol
    if protocol.startswith("SASL"):
        _SECURITY.update(
            sasl_mechanism=mechanism, sasl_plain_username=username, sasl_plain_password=password
        )


def make_consumer(
    bootstrap: str,
    topic: str,
    group: str,
    *,
    max_poll_records: int = 2000,
    listener: ConsumerRebalanceListener | None = None,
    **extra: Any,
) -> KafkaConsumer:
    """A group consumer of ``topic`` that commits only when told to.

    ``listener`` hears partition assignments (subscribed once, before any poll).
    """
    consumer = KafkaConsumer(
        **_SECURITY,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=max_poll_records,
        fetch_max_bytes=32 * 1024 * 1024,
        max_partition_fetch_bytes=8 * 1024 * 1024,
        **{**GROUP_TIMINGS, **extra},
    )
    consumer.subscribe([topic], listener=listener)
    return consumer


class KeyHashPartitioner(DefaultPartitioner):  # type: ignore[misc]
    """kafka-python's default partitioner (murmur2 of the key, over the topic's sorted
    partitions: what every other Kafka client does), each key's hash computed once: it
    is pure Python, and every event of a customer has the same key."""

    remembered = 100_000  # keys whose hash is kept (then forgotten, and computed again)

    def __init__(self) -> None:
        self._hashes: dict[bytes, int] = {}

    def partition(  # noqa: PLR0917  (kafka-python's signature)
        self,
        topic: str,
        key: Any,
        serialized_key: bytes | None,
        value: Any,
        serialized_value: Any,
        cluster: Any,
    ) -> int:
        if serialized_key is None or topic not in cluster.topics():
            return int(
                super().partition(topic, key, serialized_key, value, serialized_value, cluster)
            )
        hashed = self._hashes.get(serialized_key)
        if hashed is None:
            if len(self._hashes) >= self.remembered:
                self._hashes.clear()
            hashed = self._hashes[serialized_key] = murmur2(serialized_key) & 0x7FFFFFFF
        partitions = sorted(cluster.partitions_for_topic(topic))
        return int(partitions[hashed % len(partitions)])


class PublishFailed(RuntimeError):
    """The broker did not acknowledge every message of a batch."""


def flush_acknowledged(producer: KafkaProducer, sent: Sequence[Any]) -> None:
    """Flush, then raise ``PublishFailed`` unless the broker acknowledged every message
    whose send gave one of ``sent`` (the futures ``KafkaProducer.send`` returns).

    kafka-python's ``flush`` returns once every send has *completed*, failed ones too (a
    message that outlived ``delivery_timeout_ms`` while the broker was away, one the
    broker refused): a follower that stored its position after a plain flush would move
    past messages that were never published. It stores its position after this instead;
    the error ends its role, which restarts from the stored position and publishes them
    again (at least once)."""
    producer.flush()
    failed = [f for f in sent if f.failed()]
    if failed:
        raise PublishFailed(
            f"{len(failed)} of {len(sent)} messages not acknowledged by the broker:"
            f" {_said(failed[0].exception)}"
        )


def _said(exc: BaseException | None) -> str:
    """What the broker (or the client) said: the message, not the class (kafka-python's
    errors start theirs with their class name)."""
    text = re.sub(r"^(?:[A-Z]\w*(?:Error|Exception): )+", "", " ".join(str(exc or "").split()))
    return text or (type(exc).__name__ if exc is not None else "no detail given")


class Refusals:
    """Counts the sends the broker did not acknowledge, for a sender that keeps no list
    of its futures (a long-running producer): ``watch`` each send's future, and ``check``
    after a flush raises ``PublishFailed`` for those counted since the last check."""

    def __init__(self, what: str = "messages") -> None:
        self.what = what
        self.count = 0  # written by the producer's I/O thread only
        self._checked = 0
        self._first: BaseException | None = None

    def watch(self, future: Any) -> None:
        future.add_errback(self._refused)

    def _refused(self, exc: BaseException) -> None:
        self.count += 1
        if self._first is None:
            self._first = exc

    def check(self) -> None:
        new, self._checked = self.count - self._checked, self.count
        if new:
            raise PublishFailed(
                f"the broker did not acknowledge {new} {self.what} ({_said(self._first)}):"
                " they were not delivered"
            )


def make_producer(bootstrap: str, **extra: Any) -> KafkaProducer:
    """A producer that waits for the broker to store each batch."""
    return KafkaProducer(
        **_SECURITY,
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=5,
        batch_size=256 * 1024,
        max_request_size=16 * 1024 * 1024,
        **{"partitioner": KeyHashPartitioner(), **extra},
    )


def ensure_topics(bootstrap: str, topics: Iterable[tuple[str, int]]) -> None:
    """Create the named topics (name, partitions) if they do not exist."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, **_SECURITY)
    try:
        existing = set(admin.list_topics())
        new = [NewTopic(name, parts, 1) for name, parts in topics if name not in existing]
        if new:
            with contextlib.suppress(TopicAlreadyExistsError):  # created meanwhile: fine
                admin.create_topics(new)
    finally:
        admin.close()


def consumer_lag(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """Per partition: messages on the topic not yet committed by the group."""
    with LagProbe(bootstrap) as probe:
        return {p: end - committed for p, (committed, end) in probe.offsets(group, topic).items()}


def check_reachable(bootstrap: str, timeout_s: float = 3.0) -> None:
    """Return when any bootstrap server accepts a TCP connection; else ConnectionError.

    Cheap, and leaves no socket behind: kafka-python clients that fail to bootstrap
    leave theirs to the garbage collector."""
    errors = []
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
            return
        except (OSError, ValueError) as exc:
            errors.append(f"{server.strip()}: {exc}")
    raise BrokerUnreachable("; ".join(errors) or "no bootstrap server")


class BrokerUnreachable(ConnectionError):
    """Raised when no bootstrap server accepts a connection (``check_reachable``)."""


class LagProbe:
    """Reads a group's committed offsets and the partitions' ends, with its own clients
    (so any thread may use it while the workers' consumers poll)."""

    def __init__(self, bootstrap: str, timeout_ms: int = 5000) -> None:
        self.admin = KafkaAdminClient(
            bootstrap_servers=bootstrap, request_timeout_ms=timeout_ms, **_SECURITY
        )
        try:
            self.consumer = KafkaConsumer(
        **_SECURITY,
                bootstrap_servers=bootstrap, enable_auto_commit=False,
                max_poll_records=100_000, request_timeout_ms=timeout_ms,
            )  # fmt: skip
        except Exception:
            self.admin.close()
            raise

    def __enter__(self) -> LagProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.consumer.close()
        self.admin.close()

    def offsets(self, group: str, topic: str) -> dict[int, tuple[int, int]]:
        """Per partition of ``topic``: (offset committed by ``group``, end offset)."""
        known = self.consumer.partitions_for_topic(topic) or ()
        partitions = [TopicPartition(topic, p) for p in known]
        if not partitions:
            return {}
        ends = end_offsets(self.consumer, partitions)
        committed = self.admin.list_group_offsets({group: partitions}).get(group, {})
        return {
            tp.partition: (max(committed[tp].offset if tp in committed else 0, 0), ends[tp])
            for tp in partitions
        }


def end_offsets(
    consumer: KafkaConsumer, partitions: list[TopicPartition], timeout_s: float = 10.0
) -> dict[TopicPartition, int]:
    """The offset after the last record of each partition, read from the records.

    Tansu 0.6 answers ListOffsets(latest) with the base offset of the last record
    batch plus one, which undercounts when that batch holds several records. So
    fetch from that offset minus one and take the last record's offset plus one;
    against Apache Kafka the fetch finds just the last record and agrees with it.
    """
    reported: dict[TopicPartition, int] = consumer.end_offsets(partitions)
    pending = {tp: n for tp, n in reported.items() if n > 0}
    exact = dict(reported)
    if not pending:
        return exact
    consumer.assign(list(pending))
    for tp, n in pending.items():
        consumer.seek(tp, n - 1)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for tp, records in consumer.poll(timeout_ms=200).items():
            exact[tp] = max(exact[tp], records[-1].offset + 1)
            pending.pop(tp, None)
    return exact
