"""The ``billing.dead_letters`` table: every quarantined usage record, with its reason.

Keyed by the record's source position, so recording the same record again (a
batch redelivered after a crash) changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

__all__ = ["SCHEMA_SQL", "DeadLetter", "DeadLetterStore"]

SCHEMA_SQL = """
CREATE SCHEMA IF NOT EXISTS billing;
CREATE TABLE IF NOT EXISTS billing.dead_letters (
    source_topic     text        NOT NULL,
    source_partition integer     NOT NULL,
    source_offset    bigint      NOT NULL,
    record_key       bytea,
    payload          bytea,
    reason           text        NOT NULL CHECK (reason <> ''),
    received_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source_topic, source_partition, source_offset)
);
CREATE INDEX IF NOT EXISTS dead_letters_received_at_idx ON billing.dead_letters (received_at);
"""


@dataclass(frozen=True)
class DeadLetter:
    """A record that could not be billed."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    payload: bytes | None
    reason: str
    received_at: datetime | None = None


class DeadLetterStore:
    """Writes and reads ``billing.dead_letters``."""

    def __init__(self, url: str) -> None:
        self.url = url

    def record(self, letters: Sequence[DeadLetter]) -> int:
        """Store letters not stored before; returns how many were new."""
        if not letters:
            return 0
        rows = [(d.topic, d.partition, d.offset, d.key, d.payload, d.reason) for d in letters]
        with psycopg.connect(self.url) as conn:
            cur = conn.cursor()
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
        with psycopg.connect(self.url) as conn:
            rows: list[Any] = conn.execute(
                "SELECT source_topic, source_partition, source_offset, record_key, payload,"
                " reason, received_at FROM billing.dead_letters"
                " ORDER BY received_at DESC, source_offset DESC LIMIT %s",
                (limit,),
            ).fetchall()
        return [DeadLetter(r[0], r[1], r[2], r[3], r[4], r[5], r[6]) for r in rows]

    def count(self) -> int:
        with psycopg.connect(self.url) as conn:
            row = conn.execute("SELECT count(*) FROM billing.dead_letters").fetchone()
        return int(row[0]) if row else 0
