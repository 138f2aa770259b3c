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
from typing import Any

from domain.ports import DeadLetter
from store.connections import Database

__all__ = ["PAYLOAD_PREFIX_BYTES", "BoundedPayload", "DeadLetterStore", "bounded"]

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
