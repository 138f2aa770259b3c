"""The ``billing.transactions`` read model: one row per billing transaction.

Each row is the transaction's current state, the time of each step, and what a
person needs to know about a stuck one (attempts, last error, when the next
attempt is due). Rows are written only by the projector (``projections.projector``),
exactly once per event; ``transactions()`` is the query the CLI runs.
Its table is made by the migrations (``store/migrations/``), never here.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from domain.transaction import BillingTransaction, TxnState
from projections.base import (
    SCHEMA,
    History,
    InvalidFilter,
    check_customer,
    check_limit,
    check_state,
)
from projections.invoice_lines import InvoiceLinesProjection
from projections.invoices import InvoicesProjection

__all__ = [
    "COLUMNS",
    "TransactionsProjection",
    "open_transactions",
    "page_cursor",
    "repricing_candidates",
    "transactions",
    "unlined_transaction_ids",
]

COLUMNS = (
    "transaction_id",
    "customer_id",
    "usage_id",
    "meter",
    "quantity",
    "amount",
    "currency",
    "state",
    "line_id",
    "line_sequence",
    "attempts",
    "last_error",
    "next_attempt_at",
    "stripe_object_id",
    "compensation_reason",
    "occurred_at",
    "metered_at",
    "reserved_at",
    "charged_at",
    "compensated_at",
    "updated_at",
    "price_version",  # added by a later migration: the table's last column
)


class TransactionsProjection:
    """Keeps ``billing.transactions``: inserts on Metered, updates on every later step."""

    name: str = "transactions"

    def apply(
        self, conn: psycopg.Connection[Any], table: str, events: Sequence[Any], history: History
    ) -> None:
        new: dict[UUID, dict[str, Any]] = {}
        changed: dict[UUID, dict[str, Any]] = {}
        for event in events:
            if isinstance(event, BillingTransaction.Metered):
                new[event.originator_id] = _metered_row(event)
                continue
            change = _change(event)
            if change is None:
                continue
            txn_id = event.originator_id
            (new[txn_id] if txn_id in new else changed.setdefault(txn_id, {})).update(change)
        target = sql.Identifier(SCHEMA, table)
        with conn.cursor() as cur:
            if new:
                cur.executemany(
                    sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                        target,
                        sql.SQL(", ").join(map(sql.Identifier, COLUMNS)),
                        sql.SQL(", ").join(sql.Placeholder(c) for c in COLUMNS),
                    ),
                    list(new.values()),
                )
            by_columns: dict[tuple[str, ...], list[dict[str, Any]]] = {}
            for txn_id, change in changed.items():
                by_columns.setdefault(tuple(sorted(change)), []).append(
                    {**change, "transaction_id": txn_id}
                )
            for columns, params in by_columns.items():
                cur.executemany(_update(target, columns), params)
                if cur.rowcount != len(params):  # an event for a row that is not there
                    raise LookupError(f"{table}: {len(params) - cur.rowcount} rows missing")


def _metered_row(event: BillingTransaction.Metered) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(
        transaction_id=event.originator_id,
        customer_id=event.customer_id,
        usage_id=event.usage_id,
        meter=event.meter,
        quantity=event.quantity,
        amount=event.amount,
        currency=event.currency,
        price_version=event.price_version,
        state=str(TxnState.METERED),
        attempts=0,
        occurred_at=event.occurred_at,
        metered_at=event.timestamp,
        updated_at=event.timestamp,
    )
    return row


def _change(event: Any) -> dict[str, Any] | None:
    """The columns an event after Metered sets (None: not a transaction's event)."""
    at = getattr(event, "timestamp", None)
    if isinstance(event, BillingTransaction.Reserved):
        return {
            "state": str(TxnState.RESERVED),
            "line_id": event.line_id,
            "reserved_at": at,
            "updated_at": at,
        }
    if isinstance(event, BillingTransaction.Settled):
        return {
            "state": str(TxnState.RESERVED),
            "line_id": event.line_id,
            "next_attempt_at": None,
            "updated_at": at,
        }
    if isinstance(event, BillingTransaction.ChargeFailed):
        return {
            "state": str(TxnState.CHARGE_FAILED),
            "attempts": event.attempt,
            "last_error": f"{event.error_class}: {event.message}",
            "next_attempt_at": event.next_attempt_at,
            "updated_at": at,
        }
    if isinstance(event, BillingTransaction.Charged):
        return {
            "state": str(TxnState.CHARGED),
            "stripe_object_id": event.stripe_object_id,
            "line_sequence": event.sequence,
            "next_attempt_at": None,
            "charged_at": at,
            "updated_at": at,
        }
    if isinstance(event, BillingTransaction.Repriced):  # the state stays
        return {"amount": event.amount, "price_version": event.price_version, "updated_at": at}
    if isinstance(event, BillingTransaction.Compensated):
        return {
            "state": str(TxnState.COMPENSATED),
            "compensation_reason": event.reason,
            "next_attempt_at": None,
            "compensated_at": at,
            "updated_at": at,
        }
    return None


def _update(target: sql.Identifier, columns: tuple[str, ...]) -> sql.Composed:
    return sql.SQL("UPDATE {} SET {} WHERE transaction_id = %(transaction_id)s").format(
        target,
        sql.SQL(", ").join(
            sql.SQL("{} = {}").format(sql.Identifier(c), sql.Placeholder(c)) for c in columns
        ),
    )


def transactions(
    conn: psycopg.Connection[Any],
    *,
    state: str | None = None,
    customer: str | None = None,
    limit: int = 50,
    after: str | None = None,
) -> list[dict[str, Any]]:
    """The most recently updated transactions, filtered (raises InvalidFilter); ``after``:
    the cursor of the last row of the previous page (``page_cursor``: keyset paging, so a
    page costs the same wherever it is).

    Every filter is validated first and reaches SQL only as a bound parameter.
    """
    checked_state = check_state(state)
    checked_customer = check_customer(customer)
    checked_limit = check_limit(limit)
    where: list[sql.Composable] = []
    params: list[Any] = []
    if after is not None:
        where.append(sql.SQL("(updated_at, transaction_id) < (%s, %s)"))
        params += _parse_cursor(after)
    if checked_state is not None:
        where.append(sql.SQL("state = %s"))
        params.append(str(checked_state))
    if checked_customer is not None:
        where.append(sql.SQL("customer_id = %s"))
        params.append(checked_customer)
    query = sql.SQL(
        "SELECT {} FROM {}{} ORDER BY updated_at DESC, transaction_id DESC LIMIT %s"
    ).format(
        sql.SQL(", ").join(map(sql.Identifier, COLUMNS)),
        sql.Identifier(SCHEMA, TransactionsProjection.name),
        sql.SQL(" WHERE ") + sql.SQL(" AND ").join(where) if where else sql.SQL(""),
    )
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, [*params, checked_limit]).fetchall()


def page_cursor(row: Mapping[str, Any]) -> str:
    """The cursor that continues after ``row`` (its ``updated_at`` and id, URL-safe)."""
    text = f"{row['updated_at'].isoformat()}_{row['transaction_id']}"
    return base64.urlsafe_b64encode(text.encode()).decode()


def _parse_cursor(cursor: str) -> list[Any]:
    try:
        text = base64.urlsafe_b64decode(cursor.encode()).decode()
        at, _, txn = text.rpartition("_")
        parsed = datetime.fromisoformat(at)
        if parsed.tzinfo is None:
            raise ValueError("no time zone")
        return [parsed, UUID(txn)]
    except (ValueError, binascii.Error):
        raise InvalidFilter(f"invalid after {cursor[:80]!r}: a cursor from X-Next-After") from None


_UNLINED = sql.SQL(
    "SELECT transaction_id FROM {table}"
    " WHERE state IN ('reserved', 'charge_failed') AND line_id IS NULL"
).format(table=sql.Identifier(SCHEMA, TransactionsProjection.name))


def unlined_transaction_ids(conn: psycopg.Connection[Any]) -> list[UUID]:
    """Open transactions in no invoice line: reserved before lines existed (they join
    their line through the reconciler). Ingest puts every new one in a line at once."""
    return [r[0] for r in conn.execute(_UNLINED).fetchall()]


def open_transactions(conn: psycopg.Connection[Any]) -> int:
    """How many transactions the read model shows neither charged nor compensated."""
    row = conn.execute(
        sql.SQL(
            "SELECT count(*) FROM {} WHERE state IN ('metered', 'reserved', 'charge_failed')"
        ).format(sql.Identifier(SCHEMA, TransactionsProjection.name))
    ).fetchone()
    return int(row[0]) if row else 0


_REPRICING = sql.SQL(
    "SELECT t.transaction_id, t.line_id FROM {table} t"
    " JOIN {lines} l ON l.line_id = t.line_id"
    " LEFT JOIN {invoices} i ON i.customer_id = l.customer_id AND i.currency = l.currency"
    "  AND i.period_start = l.period_start"
    " WHERE t.state IN ('reserved', 'charge_failed', 'charged')"
    " AND (NOT %(drafts_only)s OR i.state IS NULL OR i.state IN ('open', 'closed'))"
    " AND t.transaction_id > %(after)s"
    " AND NOT EXISTS (SELECT 1 FROM unnest(%(starts)s::timestamptz[],"
    "  %(untils)s::timestamptz[], %(numbers)s::integer[]) AS v(s, u, n)"
    "  WHERE (v.s IS NULL OR t.occurred_at >= v.s) AND (v.u IS NULL OR t.occurred_at < v.u)"
    "  AND t.price_version = v.n)"
    " ORDER BY t.transaction_id LIMIT %(limit)s"
)


def repricing_candidates(
    conn: psycopg.Connection[Any],
    spans: Sequence[tuple[datetime | None, datetime | None, int]],
    *,
    after: UUID,
    limit: int,
    drafts_only: bool = False,
) -> list[tuple[UUID, UUID]]:
    """Transactions (id, line) in a line, not compensated, whose price book version is not
    the one ``spans`` (``PriceSchedule.spans``) puts in force at their ``occurred_at``:
    those a version published later may price again (``domain.repricing`` decides, from
    the aggregates). ``drafts_only``: only on invoices the read model shows open or
    closed (or not yet); ids after ``after``, in order, at most ``limit``."""
    query = _REPRICING.format(
        table=sql.Identifier(SCHEMA, TransactionsProjection.name),
        lines=sql.Identifier(SCHEMA, InvoiceLinesProjection.name),
        invoices=sql.Identifier(SCHEMA, InvoicesProjection.name),
    )
    params = {
        "drafts_only": drafts_only,
        "after": after,
        "starts": [s for s, _, _ in spans],
        "untils": [u for _, u, _ in spans],
        "numbers": [n for _, _, n in spans],
        "limit": check_limit(limit),
    }
    return [(r[0], r[1]) for r in conn.execute(query, params).fetchall()]
