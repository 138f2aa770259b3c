"""The ``billing.contract_versions`` read model: one row per version of a customer's contract.

It folds the contracts' ``Contract.Set`` events (``domain.contract``): when each version
takes effect and its minimums in minor units, the whole invoice's by currency and each
meter's by currency, as the event stores them. A version that sets no minimum has its row
too: a version sets the whole contract, so it ends the minimums of the one before.
``billing.invoice_preview`` reads it to show the true-up closing an open invoice now
would add (migration 13 holds the SQL; ``domain.closing.true_ups`` is the rule it
follows). The overrides (prices) are not here: workers price from the aggregates. Rows
are written only by the projector; the table is made by the migrations, never here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from domain.contract import Contract
from projections.base import SCHEMA, History

__all__ = ["CONTRACT_COLUMNS", "ContractVersionsProjection"]

CONTRACT_COLUMNS = (
    "customer_id", "contract_id", "version", "effective_from", "minimums", "meter_minimums",
    "set_at",
)  # fmt: skip


class ContractVersionsProjection:
    """Keeps ``billing.contract_versions`` from the contracts' ``Set`` events."""

    name: str = "contract_versions"

    def apply(
        self, conn: psycopg.Connection[Any], table: str, events: Sequence[Any], history: History
    ) -> None:
        relevant = [e for e in events if isinstance(e, Contract.Set)]
        for event in events:
            history.remember(event)
        if not relevant:
            return
        history.prefetch(conn, {e.originator_id for e in relevant})
        rows = [_row(e, history.facts(e.originator_id).customer_id) for e in relevant]
        insert = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            sql.Identifier(SCHEMA, table),
            sql.SQL(", ").join(map(sql.Identifier, CONTRACT_COLUMNS)),
            sql.SQL(", ").join(sql.Placeholder() * len(CONTRACT_COLUMNS)),
        )
        with conn.cursor() as cur:
            cur.executemany(insert, rows)


def _row(event: Contract.Set, customer_id: str) -> tuple[Any, ...]:
    """A ``Set`` event's row, in ``CONTRACT_COLUMNS`` order."""
    return (
        customer_id, event.originator_id, event.number, event.effective_from,
        Jsonb(event.minimums), Jsonb(event.meter_minimums), event.timestamp,
    )  # fmt: skip
