"""Stripe's webhook events as this ledger received them: ``billing.webhook_events``
(one row per Stripe event id, written by the recorder in the same database
transaction as the event's effect) and ``billing.webhook_counts`` (requests answered
without an effect, per hour and outcome: bad signatures, bodies too large or too
slow, unreadable envelopes).

A redelivery finds its event id and is a no-op: ``seen`` answers that before any work
is done, and the row's primary key settles a redelivery racing the first delivery
(the second insert finds the row and its whole transaction, effect included, is
rolled back with ``AlreadyReceived``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import Cursor
from psycopg.rows import DictRow, dict_row

from store.connections import Database

__all__ = ["AlreadyReceived", "WebhookReceipt", "WebhookStore", "insert_receipts"]


class AlreadyReceived(Exception):
    """This Stripe event id was recorded already (its effect with it)."""


@dataclass(frozen=True)
class WebhookReceipt:
    """One Stripe event, recorded with its effect."""

    event_id: str
    type: str
    invoice_id: UUID | None
    outcome: str  # applied, stale, unknown_invoice, ignored, unreadable
    created_at: datetime | None


_INSERT = (
    "INSERT INTO billing.webhook_events (event_id, type, invoice_id, outcome, created_at)"
    " SELECT * FROM unnest(%s::text[], %s::text[], %s::uuid[], %s::text[], %s::timestamptz[])"
    " ON CONFLICT (event_id) DO NOTHING RETURNING event_id"
)


def insert_receipts(curs: Cursor[DictRow], receipts: Sequence[WebhookReceipt]) -> None:
    """Record ``receipts`` (distinct event ids) in the caller's transaction, in one
    statement; ``AlreadyReceived`` if any of them was recorded before."""
    curs.execute(
        _INSERT,
        (
            [r.event_id for r in receipts],
            [r.type for r in receipts],
            [r.invoice_id for r in receipts],
            [r.outcome for r in receipts],
            [r.created_at for r in receipts],
        ),
    )
    written = {row["event_id"] for row in curs.fetchall()}
    missing = [r.event_id for r in receipts if r.event_id not in written]
    if missing:
        raise AlreadyReceived(", ".join(missing[:5]))


class WebhookStore:
    """Reads of the receipts and the counts of requests without an effect."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def close(self) -> None:
        self.db.close()

    def seen_any(self, event_ids: Sequence[str]) -> set[str]:
        """Which of these Stripe event ids were recorded (one query)."""
        with self.db.connection() as conn:
            rows = conn.execute(
                "SELECT event_id FROM billing.webhook_events WHERE event_id = ANY(%s)",
                (list(event_ids),),
            ).fetchall()
        return {str(row[0]) for row in rows}

    def count(self, outcome: str) -> None:
        """One more request answered ``outcome`` in this hour."""
        with self.db.connection() as conn:
            conn.execute(
                "INSERT INTO billing.webhook_counts (hour, outcome, requests)"
                " VALUES (date_trunc('hour', now()), %s, 1)"
                " ON CONFLICT (hour, outcome) DO UPDATE"
                " SET requests = billing.webhook_counts.requests + 1",
                (outcome,),
            )

    def receipts(self, *, invoice_id: UUID | None = None) -> list[dict[str, Any]]:
        """Every receipt (of one invoice), oldest first."""
        sql = "SELECT * FROM billing.webhook_events"
        args: tuple[Any, ...] = ()
        if invoice_id is not None:
            sql += " WHERE invoice_id = %s"
            args = (invoice_id,)
        with self.db.connection() as conn, conn.cursor(row_factory=dict_row) as curs:
            return curs.execute(sql + " ORDER BY received_at, event_id", args).fetchall()

    def counts(self) -> dict[str, int]:
        """Requests without an effect, by outcome, over all hours."""
        with self.db.connection() as conn:
            rows = conn.execute(
                "SELECT outcome, sum(requests)::bigint FROM billing.webhook_counts GROUP BY 1"
            ).fetchall()
        return {outcome: int(n) for outcome, n in rows}
