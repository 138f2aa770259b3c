"""The ``billing.invoice_lines`` and ``billing.line_pushes`` read models.

``invoice_lines``: one row per invoice line (customer, currency, meter, period): its
exact total, the billed amount (the total rounded once), its transactions, its
sequence, what Stripe holds (the newest acknowledged push: sequence, amount, items,
invoice), how far its transactions are recorded Charged, the state of a failing push
(attempts, last error, next attempt, failing since), the last push and the age of the
oldest change Stripe has not seen yet (``oldest_unsent_at``).

``line_pushes``: one row per push outcome (``Pushed`` or ``PushFailed``), with the
Stripe requests it sent: ``billing.queue_health`` counts Stripe errors by class and
Stripe requests per 1,000 records from it.

Both are written by the projector only (``projections.projector``), exactly once per
event; ``lines()`` and ``open_lines()`` are the queries the CLI and the reconciler run.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.utils import get_topic
from psycopg import sql
from psycopg.rows import dict_row

from domain.credit_line import CreditLine
from domain.invoice_line import InvoiceLine, LinePush
from projections.base import SCHEMA, History, check_customer, check_limit
from store.schema import EVENTS_TABLE, PROJECTION_POSITIONS

__all__ = [
    "LINE_COLUMNS",
    "InvoiceLinesProjection",
    "LinePushesProjection",
    "lines",
    "open_lines",
]

LINE_COLUMNS = (
    "line_id",
    "customer_id",
    "currency",
    "meter",
    "period_start",
    "period_end",
    "exact_total",
    "billed",
    "transactions",
    "sequence",
    "pushed_sequence",
    "stripe_amount",
    "stripe_item_ids",
    "stripe_invoice_id",
    "charged_through",
    "push_attempts",
    "last_error",
    "next_attempt_at",
    "failing_since",
    "last_push_at",
    "oldest_unsent_at",
    "stripe_requests",
    "updated_at",
    "frozen",
    "late_of_start",
    "model",
    "quantity",
    "tier",
)

_LINE_EVENTS = (
    InvoiceLine.Opened,
    InvoiceLine.Settled,
    InvoiceLine.Removed,
    InvoiceLine.Repriced,
    InvoiceLine.Frozen,
    CreditLine.CreditsApplied,  # the credit line\'s Opened and Frozen are a line\'s
)
_PUSH_EVENTS = (
    LinePush.Pushed,
    LinePush.PushFailed,
    LinePush.ChargesRecorded,
    LinePush.Redrafted,
)


class InvoiceLinesProjection:
    """Keeps ``billing.invoice_lines`` from the lines' and the pushes' events."""

    name: str = "invoice_lines"

    def apply(
        self, conn: psycopg.Connection[Any], table: str, events: Sequence[Any], history: History
    ) -> None:
        relevant = [e for e in events if isinstance(e, _LINE_EVENTS + _PUSH_EVENTS)]
        if not relevant:
            return
        for event in events:
            history.remember(event)
        history.prefetch(conn, {e.originator_id for e in relevant if isinstance(e, _PUSH_EVENTS)})
        target = sql.Identifier(SCHEMA, table)
        touched = {_line_of(e, history) for e in relevant}
        rows = _load(conn, target, touched)
        for event in relevant:
            _fold(rows, event, _line_of(event, history))
        _store(conn, target, rows.values())
        _fill_oldest_unsent(conn, target, [r for r in rows.values() if r["_unsent_lookup"]])


def _line_of(event: Any, history: History) -> UUID:
    if isinstance(event, _PUSH_EVENTS):
        return history.line_of_push(event.originator_id)
    line: UUID = event.originator_id
    return line


def _load(
    conn: psycopg.Connection[Any], target: sql.Identifier, ids: set[UUID]
) -> dict[UUID, dict[str, Any]]:
    query = sql.SQL("SELECT {} FROM {} WHERE line_id = ANY(%s)").format(
        sql.SQL(", ").join(map(sql.Identifier, LINE_COLUMNS)), target
    )
    with conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute(query, (list(ids),)).fetchall()
    rows = {r["line_id"]: {**r, "_new": False, "_unsent_lookup": False} for r in found}
    return rows


def _fold(rows: dict[UUID, dict[str, Any]], event: Any, line: UUID) -> None:
    at: datetime = event.timestamp
    if isinstance(event, InvoiceLine.Opened):
        rows[line] = {
            **dict.fromkeys(LINE_COLUMNS),
            "line_id": line,
            "customer_id": event.customer_id,
            "currency": event.currency,
            "meter": event.meter,
            "period_start": event.period_start,
            "period_end": event.period_end,
            "exact_total": Decimal(0),
            "billed": 0,
            "transactions": 0,
            "sequence": event.originator_version,
            "pushed_sequence": 0,
            "stripe_amount": 0,
            "stripe_item_ids": [],
            "charged_through": 0,
            "push_attempts": 0,
            "stripe_requests": 0,
            "updated_at": at,
            "frozen": False,
            "late_of_start": event.late_of_start,
            "model": event.model if event.price_version is not None else "per_unit",
            "quantity": None if event.price_version is None else Decimal(0),
            "tier": None,
            "_new": True,
            "_unsent_lookup": False,
        }
        return
    row = rows[line]
    row["updated_at"] = max(row["updated_at"], at)
    if isinstance(
        event,
        InvoiceLine.Settled
        | InvoiceLine.Removed
        | InvoiceLine.Repriced
        | CreditLine.CreditsApplied,
    ):
        row.update(
            exact_total=event.exact_total,
            billed=event.billed,
            transactions=event.transactions,
            sequence=event.originator_version,
        )
        if isinstance(event, InvoiceLine.Settled) and event.quantity is not None:
            row.update(quantity=event.quantity, tier=event.tier)
        if row["oldest_unsent_at"] is None and not row["_unsent_lookup"]:
            row["oldest_unsent_at"] = at
    elif isinstance(event, LinePush.Pushed):
        row.update(
            pushed_sequence=event.sequence,
            stripe_amount=event.billed,
            stripe_item_ids=list(event.item_ids),
            stripe_invoice_id=event.stripe_invoice_id,
            push_attempts=0,
            last_error=None,
            next_attempt_at=None,
            failing_since=None,
            last_push_at=at,
            stripe_requests=row["stripe_requests"] + event.requests,
        )
        # The oldest change Stripe has not seen is the line's event right after the
        # pushed sequence: looked up once the batch is folded.
        row["oldest_unsent_at"] = None
        row["_unsent_lookup"] = True
    elif isinstance(event, LinePush.PushFailed):
        row.update(
            push_attempts=event.attempt,
            last_error=f"{event.error_class}: {event.message}",
            next_attempt_at=event.next_attempt_at,
            failing_since=row["failing_since"] or at,
            stripe_requests=row["stripe_requests"] + event.requests,
        )
    elif isinstance(event, LinePush.ChargesRecorded):
        row["charged_through"] = event.through
    elif isinstance(event, LinePush.Redrafted):  # nothing of it on its invoice's new draft
        row.update(
            pushed_sequence=0, stripe_amount=0, stripe_item_ids=[], stripe_invoice_id=None,
            push_attempts=0, last_error=None, next_attempt_at=None, failing_since=None,
        )  # fmt: skip
        # Unsent since the redraft: the line's own changes were in Stripe until then.
        row["oldest_unsent_at"] = at
        row["_unsent_lookup"] = False
    elif isinstance(event, InvoiceLine.Frozen):  # a new sequence, the same total
        row.update(frozen=True, sequence=event.originator_version)
        if row["oldest_unsent_at"] is None and not row["_unsent_lookup"]:
            row["oldest_unsent_at"] = at


def _store(conn: psycopg.Connection[Any], target: sql.Identifier, rows: Any) -> None:
    columns = sql.SQL(", ").join(map(sql.Identifier, LINE_COLUMNS))
    upsert = sql.SQL(
        "INSERT INTO {} ({}) VALUES ({}) ON CONFLICT (line_id) DO UPDATE SET {}"
    ).format(
        target,
        columns,
        sql.SQL(", ").join(sql.Placeholder(c) for c in LINE_COLUMNS),
        sql.SQL(", ").join(
            sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c))
            for c in LINE_COLUMNS
            if c != "line_id"
        ),
    )
    with conn.cursor() as cur:
        cur.executemany(upsert, [{c: r[c] for c in LINE_COLUMNS} for r in rows])


_UNSENT = sql.SQL(
    "UPDATE {table} t SET oldest_unsent_at = CASE WHEN t.sequence > t.pushed_sequence THEN"
    " (SELECT (convert_from(e.state, 'UTF8')::jsonb -> 'timestamp' ->> '_data_')::timestamptz"
    "  FROM {events} e WHERE e.originator_id = t.line_id"
    "  AND e.originator_version = t.pushed_sequence + 1) END"
    " WHERE t.line_id = ANY(%s)"
)


def _fill_oldest_unsent(
    conn: psycopg.Connection[Any], target: sql.Identifier, rows: list[dict[str, Any]]
) -> None:
    if rows:
        conn.execute(
            _UNSENT.format(table=target, events=sql.Identifier(EVENTS_TABLE)),
            ([r["line_id"] for r in rows],),
        )


class LinePushesProjection:
    """Appends a row for each push outcome (``Pushed`` or ``PushFailed``)."""

    name: str = "line_pushes"

    def apply(
        self, conn: psycopg.Connection[Any], table: str, events: Sequence[Any], history: History
    ) -> None:
        outcomes = [e for e in events if isinstance(e, LinePush.Pushed | LinePush.PushFailed)]
        for event in events:
            history.remember(event)
        if not outcomes:
            return
        history.prefetch(conn, {e.originator_id for e in outcomes})
        lines = {history.line_of_push(e.originator_id) for e in outcomes}
        history.prefetch(conn, lines)
        rows = []
        for e in outcomes:
            line = history.line_of_push(e.originator_id)
            head = (e.originator_id, e.originator_version, line, history.facts(line).customer_id)
            tail: tuple[Any, ...]
            if isinstance(e, LinePush.PushFailed):
                tail = ("failed", e.sequence, None, e.error_class, e.retryable, e.requests)
            else:
                tail = ("pushed", e.sequence, e.billed, None, None, e.requests)
            rows.append((*head, e.timestamp, *tail))
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL("INSERT INTO {} VALUES ({})").format(
                    sql.Identifier(SCHEMA, table), sql.SQL(", ").join(sql.Placeholder() * 11)
                ),
                rows,
            )


def lines(
    conn: psycopg.Connection[Any], *, customer: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    """Invoice lines, newest period first (raises InvalidFilter)."""
    checked = check_customer(customer)
    query = sql.SQL(
        "SELECT {} FROM {}{} ORDER BY period_start DESC, customer_id, meter LIMIT %s"
    ).format(
        sql.SQL(", ").join(map(sql.Identifier, LINE_COLUMNS)),
        sql.Identifier(SCHEMA, InvoiceLinesProjection.name),
        sql.SQL(" WHERE customer_id = %s") if checked is not None else sql.SQL(""),
    )
    params: list[Any] = [checked] if checked is not None else []
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, [*params, check_limit(limit)]).fetchall()


_OPEN = sql.SQL(
    "SELECT line_id, customer_id, oldest_unsent_at, next_attempt_at FROM {table}"
    " WHERE sequence > pushed_sequence OR charged_through < pushed_sequence"
    " UNION "
    "SELECT DISTINCT e.originator_id,"
    " (SELECT convert_from(f.state, 'UTF8')::jsonb ->> 'customer_id' FROM {events} f"
    "  WHERE f.originator_id = e.originator_id AND f.originator_version = 1),"
    " NULL::timestamptz, NULL::timestamptz"
    " FROM {events} e"
    " WHERE (e.xid, e.notification_id) > coalesce("
    "  (SELECT (p.xid, p.notification_id) FROM {positions} p WHERE p.name = %s),"
    "  ('0'::xid8, 0::bigint))"
    " AND e.topic = ANY(%s)"
)


def open_lines(conn: psycopg.Connection[Any]) -> list[tuple[UUID, str | None, Any, Any]]:
    """Lines with a change Stripe has not acknowledged, or charges not recorded yet:
    (line id, customer, oldest unsent change, next attempt due). Those the projection
    has not reached yet are found in the events past its position (with no times), so
    a projector that is behind never hides a line from the reconciler."""
    topics = [
        get_topic(InvoiceLine.Opened), get_topic(InvoiceLine.Settled),
        get_topic(InvoiceLine.Repriced),
        get_topic(CreditLine.Opened), get_topic(CreditLine.CreditsApplied),
    ]  # fmt: skip
    rows = conn.execute(
        _OPEN.format(
            table=sql.Identifier(SCHEMA, InvoiceLinesProjection.name),
            events=sql.Identifier(EVENTS_TABLE),
            positions=sql.Identifier(SCHEMA, PROJECTION_POSITIONS),
        ),
        (InvoiceLinesProjection.name, topics),
    ).fetchall()
    seen: dict[UUID, tuple[UUID, str | None, Any, Any]] = {}
    for line, customer, oldest, due in rows:
        if line not in seen or oldest is not None:
            seen[line] = (line, customer, oldest, due)
    return list(seen.values())
