"""The ``billing.charge_attempts`` read model: one row per charge attempt's outcome.

Every ``ChargeFailed`` (with its error class) and every ``Charged`` becomes a row with
the time it was recorded. ``billing.queue_health`` counts Stripe errors by class over
the last 1, 5 and 15 minutes and charges per minute from it, so those figures come
from the history like every other number, and survive a rebuild.
Its table is made by the migrations (``store/migrations/``), never here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from domain.transaction import BillingTransaction
from projections.base import SCHEMA, History

__all__ = ["COLUMNS", "ChargeAttemptsProjection"]

COLUMNS = (
    "transaction_id",
    "version",
    "customer_id",
    "at",
    "outcome",
    "error_class",
    "retryable",
    "seconds_since_metered",
)


class ChargeAttemptsProjection:
    """Appends a row for each Charged or ChargeFailed event."""

    name: str = "charge_attempts"

    def apply(
        self, conn: psycopg.Connection[Any], table: str, events: Sequence[Any], history: History
    ) -> None:
        attempts = [
            e
            for e in events
            if isinstance(e, BillingTransaction.Charged | BillingTransaction.ChargeFailed)
        ]
        if not attempts:
            return
        history.prefetch(conn, {e.originator_id for e in attempts})
        rows = [_row(e, history) for e in attempts]
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                    sql.Identifier(SCHEMA, table),
                    sql.SQL(", ").join(map(sql.Identifier, COLUMNS)),
                    sql.SQL(", ").join(sql.Placeholder() * len(COLUMNS)),
                ),
                rows,
            )


def _row(event: Any, history: History) -> tuple[Any, ...]:
    facts = history.facts(event.originator_id)
    failed = isinstance(event, BillingTransaction.ChargeFailed)
    return (
        event.originator_id,
        event.originator_version,
        facts.customer_id,
        event.timestamp,
        "failed" if failed else "charged",
        event.error_class if failed else None,
        event.retryable if failed else None,
        None if failed else (event.timestamp - facts.created_at).total_seconds(),
    )
