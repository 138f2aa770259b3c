"""The ``billing.dead_letters`` table: every quarantined usage record and set-aside
``billing.events`` message, with its reason (the ``domain.ports.DeadLetterSink``).

Keyed by the source position (topic, partition, offset), so recording the same record
again (a batch redelivered after a crash) changes nothing.

Bounded: a hostile producer must not be able to grow the table by what it sends. A
row keeps at most ``PAYLOAD_PREFIX_BYTES`` of the payload, with the whole payload's
size and SHA-256 (the full bytes go to the dead-letter topic, up to its message limit:
``adapters.ingest.worker``). Rows older than the retention are removed by ``purge``,
a few at a time (``adapters.ingest.retention``), while ``billing.dead_letter_counts``
keeps how many letters arrived per source topic, reason code and hour, and is never
purged: counts stay exact. A letter counts once: the count is raised in the same
statement as the insert, by the rows the insert really added.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import sql

from domain.ports import DeadLetter
from store.connections import Database

__all__ = [
    "PAYLOAD_PREFIX_BYTES",
    "BoundedPayload",
    "DeadLetterStore",
    "LetterFilter",
    "StoredLetter",
    "bounded",
    "letter_id",
    "parse_letter_id",
]

PAYLOAD_PREFIX_BYTES = 4096


@dataclass(frozen=True)
class BoundedPayload:
    """What is kept of a payload: at most ``limit`` bytes, and the whole one's size and hash."""

    prefix: bytes | None
    size: int | None
    sha256: str | None  # hex

    @property
    def truncated(self) -> bool:
        return self.prefix is not None and len(self.prefix) != self.size


def bounded(payload: bytes | None, limit: int = PAYLOAD_PREFIX_BYTES) -> BoundedPayload:
    """``payload`` cut to ``limit`` bytes, with the whole payload's size and SHA-256."""
    if payload is None:
        return BoundedPayload(None, None, None)
    return BoundedPayload(payload[:limit], len(payload), hashlib.sha256(payload).hexdigest())


@dataclass(frozen=True)
class StoredLetter:
    """A letter as the table keeps it: where it came from, why, what is kept of its bytes,
    and whether it was re-driven."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    payload: bytes | None  # at most PAYLOAD_PREFIX_BYTES of it
    reason: str
    code: str
    received_at: datetime
    size: int | None
    sha256: str | None
    redriven_at: datetime | None

    @property
    def id(self) -> str:
        return letter_id(self.topic, self.partition, self.offset)

    @property
    def whole(self) -> bool:
        """Whether the kept bytes are the whole payload (a redrive needs them all)."""
        return self.payload is not None and len(self.payload) == self.size


def letter_id(topic: str, partition: int, offset: int) -> str:
    """A letter's id, as logs name its record: ``usage/3@67``."""
    return f"{topic}/{partition}@{offset}"


def parse_letter_id(text: str) -> tuple[str, int, int] | None:
    """``usage/3@67`` -> ``("usage", 3, 67)``; None when it is not a letter id."""
    topic, slash, rest = text.rpartition("/")
    partition, at, offset = rest.partition("@")
    if not (topic and slash and at and partition.isdigit() and offset.isdigit()):
        return None
    return topic, int(partition), int(offset)


@dataclass(frozen=True)
class LetterFilter:
    """Which letters: by reason code, received since, the record's key (its customer),
    re-driven or not."""

    code: str | None = None
    since: datetime | None = None
    customer: str | None = None
    redriven: bool | None = None


_LETTER_COLUMNS = sql.SQL(
    "source_topic, source_partition, source_offset, record_key, payload, reason,"
    " coalesce(reason_code, 'invalid'), received_at, payload_size,"
    " encode(payload_sha256, 'hex'), redriven_at"
)

_INSERT = """
WITH new AS (
    INSERT INTO billing.dead_letters (source_topic, source_partition, source_offset,
        record_key, payload, reason, reason_code, payload_size, payload_sha256)
    SELECT * FROM unnest(%s::text[], %s::int[], %s::bigint[], %s::bytea[], %s::bytea[],
        %s::text[], %s::text[], %s::int[], %s::bytea[])
    ON CONFLICT DO NOTHING
    RETURNING source_topic, reason_code, received_at
),
counted AS (
    INSERT INTO billing.dead_letter_counts AS c (hour, source_topic, reason_code, letters)
    SELECT date_trunc('hour', received_at), source_topic, reason_code, count(*)
    FROM new GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (hour, source_topic, reason_code)
    DO UPDATE SET letters = c.letters + excluded.letters
)
SELECT count(*) FROM new
"""

_PURGE = """
DELETE FROM billing.dead_letters WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM billing.dead_letters
    WHERE received_at < now() - %s * interval '1 day'
    ORDER BY received_at LIMIT %s FOR UPDATE SKIP LOCKED))
"""


class DeadLetterStore:
    """Writes and reads ``billing.dead_letters`` and its counts."""

    def __init__(self, database: Database, *, prefix_bytes: int = PAYLOAD_PREFIX_BYTES) -> None:
        self.database = database
        self.prefix_bytes = prefix_bytes

    def record(self, letters: Sequence[DeadLetter]) -> int:
        """Store letters not stored before, and count them; returns how many were new."""
        if not letters:
            return 0
        rows = []
        for d in letters:
            kept = bounded(d.payload, self.prefix_bytes)
            sha = bytes.fromhex(kept.sha256) if kept.sha256 else None
            rows.append(
                (d.topic, d.partition, d.offset, d.key, kept.prefix, d.reason, d.code,
                 kept.size, sha)
            )  # fmt: skip
        with self.database.connection() as conn:
            row = conn.execute(_INSERT, [list(col) for col in zip(*rows, strict=True)]).fetchone()
        return int(row[0]) if row else 0

    def all(self, limit: int = 1000) -> list[DeadLetter]:
        """The most recent letters, newest first (payloads as stored: maybe a prefix)."""
        with self.database.connection() as conn:
            rows: list[Any] = conn.execute(
                "SELECT source_topic, source_partition, source_offset, record_key, payload,"
                " reason, received_at, coalesce(reason_code, 'invalid'), payload_size,"
                " encode(payload_sha256, 'hex') FROM billing.dead_letters"
                " ORDER BY received_at DESC, source_offset DESC LIMIT %s",
                (limit,),
            ).fetchall()
        return [DeadLetter(*r) for r in rows]

    def find(self, which: LetterFilter, limit: int = 100) -> list[StoredLetter]:
        """The letters ``which`` names, newest first."""
        where: list[str] = ["TRUE"]
        params: list[object] = []
        if which.code is not None:
            where.append("coalesce(reason_code, 'invalid') = %s")
            params.append(which.code)
        if which.since is not None:
            where.append("received_at >= %s")
            params.append(which.since)
        if which.customer is not None:
            where.append("record_key = %s")
            params.append(which.customer.encode())
        if which.redriven is not None:
            where.append("redriven_at IS NOT NULL" if which.redriven else "redriven_at IS NULL")
        query = sql.SQL(
            "SELECT {} FROM billing.dead_letters WHERE {}"
            " ORDER BY received_at DESC, source_offset DESC LIMIT %s"
        ).format(_LETTER_COLUMNS, sql.SQL(" AND ").join(map(sql.SQL, where)))
        with self.database.connection() as conn:
            rows = conn.execute(query, [*params, limit]).fetchall()
        return [_letter(r) for r in rows]

    def get(self, topic: str, partition: int, offset: int) -> StoredLetter | None:
        """One letter, by where its record was read."""
        with self.database.connection() as conn:
            row = conn.execute(
                sql.SQL(
                    "SELECT {} FROM billing.dead_letters WHERE source_topic = %s"
                    " AND source_partition = %s AND source_offset = %s"
                ).format(_LETTER_COLUMNS),
                (topic, partition, offset),
            ).fetchone()
        return _letter(row) if row else None

    def mark_redriven(self, letter: StoredLetter) -> bool:
        """Record that ``letter`` was sent again; False if it had been already."""
        with self.database.connection() as conn:
            return (
                conn.execute(
                    "UPDATE billing.dead_letters SET redriven_at = now() WHERE source_topic = %s"
                    " AND source_partition = %s AND source_offset = %s AND redriven_at IS NULL",
                    (letter.topic, letter.partition, letter.offset),
                ).rowcount
                == 1
            )

    def count(self) -> int:
        """Every letter ever recorded (exact, whatever retention removed)."""
        with self.database.connection() as conn:
            row = conn.execute(
                "SELECT coalesce(sum(letters), 0) FROM billing.dead_letter_counts"
            ).fetchone()
        return int(row[0]) if row else 0

    def counts(self) -> dict[tuple[str, str], int]:
        """Every letter ever recorded, by source topic and reason code."""
        with self.database.connection() as conn:
            rows = conn.execute(
                "SELECT source_topic, reason_code, sum(letters) FROM billing.dead_letter_counts"
                " GROUP BY 1, 2"
            ).fetchall()
        return {(topic, code): int(n) for topic, code, n in rows}

    def purge(self, older_than_days: float, *, limit: int = 1000) -> int:
        """Remove at most ``limit`` letters received more than ``older_than_days`` ago
        (never one another sweeper holds); their counts stay. Returns how many."""
        with self.database.connection() as conn:
            return conn.execute(_PURGE, (older_than_days, limit)).rowcount


def _letter(row: Any) -> StoredLetter:
    topic, partition, offset, key, payload, reason, code, at, size, sha, redriven = row
    return StoredLetter(
        topic, partition, offset, bytes(key) if key is not None else None,
        bytes(payload) if payload is not None else None, reason, code, at, size, sha, redriven,
    )  # fmt: skip
