"""The ``billing.dead_letters`` table: every quarantined usage record, with its reason
(the ``domain.ports.DeadLetterSink`` of the ingest).

Keyed by the record's source position, so recording the same record again (a
batch redelivered after a crash) changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from domain.ports import DeadLetter
from store.connections import Database

__all__ = ["DeadLetterStore"]


class DeadLetterStore:
    """Writes and reads ``billing.dead_letters``."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def record(self, letters: Sequence[DeadLetter]) -> int:
        """Store letters not stored before; returns how many were new."""
        if not letters:
            return 0
        rows = [(d.topic, d.partition, d.offset, d.key, d.payload, d.reason) for d in letters]
        with self.database.connection() as conn, conn.cursor() as cur:
            cur.execute(
                "INSERT INTO billing.dead_letters (source_topic, source_partition, source_offset,"
                " record_key, payload, reason)"
                " SELECT * FROM unnest(%s::text[], %s::int[], %s::bigint[], %s::bytea[],"
                " %s::bytea[], %s::text[]) ON CONFLICT DO NOTHING",
                [list(col) for col in zip(*rows, strict=True)],
            )
            return cur.rowcount

    def all(self, limit: int = 1000) -> list[DeadLetter]:
        """The most recent letters, newest first."""
        with self.database.connection() as conn:
            rows: list[Any] = conn.execute(
                "SELECT source_topic, source_partition, source_offset, record_key, payload,"
                " reason, received_at FROM billing.dead_letters"
                " ORDER BY received_at DESC, source_offset DESC LIMIT %s",
                (limit,),
            ).fetchall()
        return [DeadLetter(r[0], r[1], r[2], r[3], r[4], r[5], r[6]) for r in rows]

    def count(self) -> int:
        with self.database.connection() as conn:
            row = conn.execute("SELECT count(*) FROM billing.dead_letters").fetchone()
        return int(row[0]) if row else 0
