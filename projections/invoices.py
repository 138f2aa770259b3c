"""The ``billing.invoices`` read model: one row per invoice (customer, currency, period).

Its state (``domain.invoice_states.InvoiceState``), lines, Stripe's ids and number, the
total expected (the lines' final billed totals) and the total Stripe finalized, what
was paid, credited and is still to credit, payment and finalize attempts, and when it
closed, was finalized and paid. The close deadline is the period's end plus
``billing.health_settings.invoice_grace_s`` (queue health and ``due_invoices`` use it).

``invoices()`` is the CLI's query; ``due_invoices()`` the closer's: every invoice that
has a step to take now, including those whose events the projection has not reached.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from eventsourcing.utils import get_topic
from psycopg import sql
from psycopg.rows import dict_row

from domain.closing import TRUE_UP_METER, TRUE_UP_PREFIX
from domain.invoice import Invoice, mismatch_reason
from domain.invoice_states import InvoiceState
from domain.money import format_money
from projections.base import SCHEMA, History, InvalidFilter, check_customer, check_limit
from store.schema import EVENTS_TABLE, PROJECTION_POSITIONS

__all__ = [
    "INVOICE_COLUMNS",
    "InvoiceEventsProjection",
    "InvoicesProjection",
    "check_invoice_state",
    "drafts_to_check",
    "due_invoices",
    "invoice_preview",
    "invoices",
    "unprojected_invoices",
]

INVOICE_COLUMNS = (
    "invoice_id",
    "customer_id",
    "currency",
    "period_start",
    "period_end",
    "state",
    "lines",
    "stripe_invoice_id",
    "stripe_customer_id",
    "number",
    "expected_total",
    "total",
    "amount_paid",
    "credited",
    "credits_pending",
    "payment_attempts",
    "finalize_attempts",
    "last_error",
    "next_attempt_at",
    "close_deadline",
    "closed_at",
    "finalized_at",
    "paid_at",
    "updated_at",
    "attention",
    "repairs",
    "stripe_mismatch_total",
    "checked_at",
)

_STATE_OF = {
    Invoice.Closed: InvoiceState.CLOSED,
    Invoice.NothingDue: InvoiceState.NOTHING_DUE,
    Invoice.FinalizeStarted: InvoiceState.FINALIZING,
    Invoice.Finalized: InvoiceState.FINALIZED,
    Invoice.PaymentFailed: InvoiceState.PAYMENT_FAILED,
    Invoice.Paid: InvoiceState.PAID,
    Invoice.MarkedUncollectible: InvoiceState.UNCOLLECTIBLE,
    Invoice.Voided: InvoiceState.VOID,
}


class InvoicesProjection:
    """Keeps ``billing.invoices`` from the invoices' events."""

    name: str = "invoices"

    def apply(
        self, conn: psycopg.Connection[Any], table: str, events: Sequence[Any], history: History
    ) -> None:
        relevant = [e for e in events if isinstance(e, Invoice.Event)]
        if not relevant:
            return
        target = sql.Identifier(SCHEMA, table)
        rows = _load(conn, target, {e.originator_id for e in relevant})
        for event in relevant:
            _fold(rows, event)
        grace = _grace(conn)
        for row in rows.values():  # the deadline the closers use (INVOICE_GRACE_S)
            row["close_deadline"] = row["period_end"] + grace
        _store(conn, target, rows.values())


def _grace(conn: psycopg.Connection[Any]) -> timedelta:
    found = conn.execute(
        "SELECT invoice_grace_s FROM billing.health_settings WHERE id = 1"
    ).fetchone()
    return timedelta(seconds=found[0] if found else 3600.0)


def _load(
    conn: psycopg.Connection[Any], target: sql.Identifier, ids: set[UUID]
) -> dict[UUID, dict[str, Any]]:
    query = sql.SQL("SELECT {} FROM {} WHERE invoice_id = ANY(%s)").format(
        sql.SQL(", ").join(map(sql.Identifier, INVOICE_COLUMNS)), target
    )
    with conn.cursor(row_factory=dict_row) as cur:
        return {r["invoice_id"]: r for r in cur.execute(query, (list(ids),)).fetchall()}


def _fold(rows: dict[UUID, dict[str, Any]], event: Any) -> None:  # noqa: PLR0912 (an event each)
    at: datetime = event.timestamp
    key: UUID = event.originator_id
    if isinstance(event, Invoice.Opened):
        rows[key] = {
            **dict.fromkeys(INVOICE_COLUMNS),
            "invoice_id": key,
            "customer_id": event.customer_id,
            "currency": event.currency,
            "period_start": event.period_start,
            "period_end": event.period_end,
            "state": str(InvoiceState.OPEN),
            "lines": 1,
            "expected_total": 0,
            "total": 0,
            "amount_paid": 0,
            "credited": 0,
            "credits_pending": 0,
            "payment_attempts": 0,
            "finalize_attempts": 0,
            "updated_at": at,
            "repairs": 0,
        }
        return
    row = rows[key]
    row["updated_at"] = max(row["updated_at"], at)
    state = _STATE_OF.get(type(event))
    if state is not None:
        row["state"] = str(state)
    if isinstance(event, Invoice.LineAdded):
        row["lines"] += 1
    elif isinstance(event, Invoice.DraftCreated):
        row["stripe_invoice_id"] = event.stripe_invoice_id
        row["stripe_customer_id"] = event.stripe_customer_id
    elif isinstance(event, Invoice.Closed):
        row["closed_at"] = at
    elif isinstance(event, Invoice.FinalizeStarted):
        row["expected_total"] = event.expected_total
    elif isinstance(event, Invoice.FinalizeFailed):
        row.update(
            finalize_attempts=event.attempt,
            last_error=f"{event.error_class}: {event.message}",
            next_attempt_at=event.next_attempt_at,
        )
    elif isinstance(event, Invoice.Finalized):
        row.update(
            number=event.number, total=event.total, finalized_at=event.finalized_at,
            next_attempt_at=None,
        )  # fmt: skip
    elif isinstance(event, Invoice.PaymentFailed):
        row.update(
            payment_attempts=event.attempt,
            next_attempt_at=event.next_payment_attempt,
        )
    elif isinstance(event, Invoice.Paid):
        row.update(amount_paid=event.amount_paid, paid_at=event.paid_at, next_attempt_at=None)
    elif isinstance(event, Invoice.CreditRequested):
        row["credits_pending"] += 1
    elif isinstance(event, Invoice.DriftFound):
        row["repairs"] += 1
    elif isinstance(event, Invoice.DraftChecked):
        row["checked_at"] = at
        row["repairs"] += len(event.drifted)
    elif isinstance(event, Invoice.AttentionNeeded):
        row["attention"] = event.reason
    elif isinstance(event, Invoice.AttentionSettled):
        row["attention"] = None
    elif isinstance(event, Invoice.DraftReplaced):  # billed on a new draft, made next
        row.update(
            stripe_invoice_id=None, attention=None, finalize_attempts=0, last_error=None,
            next_attempt_at=None, expected_total=0,  # until it starts finalizing again
        )  # fmt: skip
        if row["state"] == str(InvoiceState.FINALIZING):
            row["state"] = str(InvoiceState.CLOSED)
    elif isinstance(event, Invoice.MismatchFound):
        row["stripe_mismatch_total"] = event.stripe_total
        row["attention"] = mismatch_reason(
            event.expected_total, event.stripe_total, row["currency"]
        )
    elif isinstance(event, Invoice.Credited):
        row["credited"] += event.amount
        if event.transaction_id is not None:
            row["credits_pending"] -= 1


def _store(conn: psycopg.Connection[Any], target: sql.Identifier, rows: Any) -> None:
    upsert = sql.SQL(
        "INSERT INTO {} ({}) VALUES ({}) ON CONFLICT (invoice_id) DO UPDATE SET {}"
    ).format(
        target,
        sql.SQL(", ").join(map(sql.Identifier, INVOICE_COLUMNS)),
        sql.SQL(", ").join(sql.Placeholder(c) for c in INVOICE_COLUMNS),
        sql.SQL(", ").join(
            sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c))
            for c in INVOICE_COLUMNS
            if c != "invoice_id"
        ),
    )
    with conn.cursor() as cur:
        cur.executemany(upsert, list(rows))


def check_invoice_state(state: str | None) -> str | None:
    if state is None:
        return None
    if state not in {str(s) for s in InvoiceState}:
        names = ", ".join(str(s) for s in InvoiceState)
        raise InvalidFilter(f"unknown invoice state {state!r} (one of: {names})")
    return state


def invoices(
    conn: psycopg.Connection[Any],
    *,
    customer: str | None = None,
    period: datetime | None = None,
    state: str | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Invoices, newest period first (raises InvalidFilter); ``period``: a moment in
    the period (its invoices are those whose period contains it)."""
    where: list[sql.Composable] = []
    params: list[Any] = []
    checked = check_customer(customer)
    if checked is not None:
        where.append(sql.SQL("customer_id = %s"))
        params.append(checked)
    if period is not None:
        where.append(sql.SQL("period_start <= %s AND %s < period_end"))
        params += [period, period]
    if check_invoice_state(state) is not None:
        where.append(sql.SQL("state = %s"))
        params.append(state)
    query = sql.SQL("SELECT {} FROM {}{} ORDER BY period_start DESC, customer_id LIMIT %s").format(
        sql.SQL(", ").join(map(sql.Identifier, INVOICE_COLUMNS)),
        sql.Identifier(SCHEMA, InvoicesProjection.name),
        sql.SQL(" WHERE ") + sql.SQL(" AND ").join(where) if where else sql.SQL(""),
    )
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, [*params, check_limit(limit)]).fetchall()


PREVIEW_VIEW = "invoice_preview"
PREVIEW_COLUMNS = (
    "invoice_id", "customer_id", "currency", "period_start", "period_end", "close_deadline",
    "meter", "late", "transactions", "exact_total", "billed", "invoice_total", "invoice_lines",
    "model", "quantity", "tier",
)  # fmt: skip


def invoice_preview(
    conn: psycopg.Connection[Any], *, customer: str, period: datetime | None = None
) -> list[dict[str, Any]]:
    """The lines of ``customer``'s open invoices as they stand (``billing.invoice_preview``),
    with the true-up lines closing each now would add, in the period holding ``period``
    when given; raises InvalidFilter."""
    where = [sql.SQL("customer_id = %s")]
    params: list[Any] = [check_customer(customer)]
    if period is not None:
        where.append(sql.SQL("period_start <= %s AND %s < period_end"))
        params += [period, period]
    # The true-up lines last, the meters' before the invoice's (the order the close
    # computes them in).
    query = sql.SQL(
        "SELECT {} FROM {} WHERE {} ORDER BY period_start, currency,"
        " meter = {whole} OR starts_with(meter, {prefix}), meter = {whole}, late, meter"
    ).format(
        sql.SQL(", ").join(map(sql.Identifier, PREVIEW_COLUMNS)),
        sql.Identifier(SCHEMA, PREVIEW_VIEW),
        sql.SQL(" AND ").join(where),
        whole=sql.Literal(TRUE_UP_METER),
        prefix=sql.Literal(TRUE_UP_PREFIX),
    )
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, params).fetchall()


_TAIL = sql.SQL(
    "SELECT DISTINCT e.originator_id FROM {events} e"
    " WHERE (e.xid, e.notification_id) > coalesce("
    "  (SELECT (p.xid, p.notification_id) FROM {positions} p WHERE p.name = %s),"
    "  ('0'::xid8, 0::bigint))"
    " AND e.topic LIKE %s"
)


def _tail() -> sql.Composed:
    """Invoices with events past the invoices projection's position."""
    return _TAIL.format(
        events=sql.Identifier(EVENTS_TABLE),
        positions=sql.Identifier(SCHEMA, PROJECTION_POSITIONS),
    )


def unprojected_invoices(conn: psycopg.Connection[Any]) -> list[UUID]:
    """Invoices with events the projection has not applied yet (it may not show them)."""
    prefix = get_topic(Invoice.Opened).removesuffix("Opened")
    rows = conn.execute(_tail(), (InvoicesProjection.name, prefix + "%")).fetchall()
    return [r[0] for r in rows]


_DUE_PROJECTED = sql.SQL(
    "SELECT invoice_id FROM {table}, {settings} s"
    " WHERE (state = 'open' AND period_end + make_interval(secs => s.invoice_grace_s) <= now())"
    "    OR state IN ('closed', 'finalizing')"
    "    OR (credits_pending > 0 AND state IN ('finalized', 'payment_failed', 'paid'))"
)


_DRAFTS_TO_CHECK = sql.SQL(
    "SELECT i.invoice_id FROM {invoices} i"
    " WHERE i.state = 'open' AND i.stripe_invoice_id IS NOT NULL AND i.attention IS NULL"
    " AND EXISTS (SELECT 1 FROM {lines} l WHERE l.customer_id = i.customer_id"
    "   AND l.currency = i.currency AND l.period_start = i.period_start"
    "   AND l.last_push_at > coalesce(i.checked_at, '-infinity'::timestamptz)"
    "   AND l.last_push_at < now() - make_interval(secs => %s))"
    " ORDER BY i.checked_at NULLS FIRST, i.invoice_id LIMIT %s"
)


def drafts_to_check(conn: psycopg.Connection[Any], quiet_s: float, limit: int) -> list[UUID]:
    """Open invoices with a draft in Stripe whose lines were pushed since their draft was
    last read back (and not within the last ``quiet_s``: a push that may still land is
    waited for), the longest unchecked first; at most ``limit``."""
    query = _DRAFTS_TO_CHECK.format(
        invoices=sql.Identifier(SCHEMA, InvoicesProjection.name),
        lines=sql.Identifier(SCHEMA, "invoice_lines"),
    )
    return [r[0] for r in conn.execute(query, (quiet_s, limit)).fetchall()]


def due_invoices(conn: psycopg.Connection[Any]) -> list[UUID]:
    """Invoices with a step to take (see the query); those the projection has not
    reached yet are included from the events past its position, so a projector that is
    behind never hides an invoice from the closer (``step`` decides from the aggregate)."""
    prefix = get_topic(Invoice.Opened).removesuffix("Opened")
    query = sql.SQL(" UNION ").join(
        [
            _DUE_PROJECTED.format(
                table=sql.Identifier(SCHEMA, InvoicesProjection.name),
                settings=sql.Identifier(SCHEMA, "health_settings"),
            ),
            _tail(),
        ]
    )
    rows = conn.execute(query, (InvoicesProjection.name, prefix + "%")).fetchall()
    return [r[0] for r in rows]


_KINDS: dict[type, str] = {
    Invoice.Finalized: "finalized",
    Invoice.PaymentFailed: "payment_failed",
    Invoice.Paid: "paid",
    Invoice.MarkedUncollectible: "uncollectible",
    Invoice.Voided: "voided",
    Invoice.CreditRequested: "credit_requested",
    Invoice.Credited: "credited",
    Invoice.DriftFound: "drift_found",
    Invoice.AttentionNeeded: "needs_attention",
    Invoice.AttentionSettled: "attention_settled",
    Invoice.DraftReplaced: "draft_replaced",
    Invoice.MismatchFound: "mismatch",
}


class InvoiceEventsProjection:
    """Appends a row per finalization, payment failure, payment, void, credit request
    and credit of an invoice (``billing.queue_health`` counts payment failures in the
    last 24 hours from it)."""

    name: str = "invoice_events"

    def apply(
        self, conn: psycopg.Connection[Any], table: str, events: Sequence[Any], history: History
    ) -> None:
        relevant = [e for e in events if type(e) in _KINDS]
        if not relevant:
            return
        for event in events:
            history.remember(event)
        history.prefetch(conn, {e.originator_id for e in relevant})
        rows = [_event_row(e, history) for e in relevant]
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL(
                    "INSERT INTO {} (invoice_id, version, customer_id, kind, at, amount, detail)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
                ).format(sql.Identifier(SCHEMA, table)),
                rows,
            )


def _event_row(event: Any, history: History) -> tuple[Any, ...]:
    amount: int | None = None
    detail: str | None = event.source if hasattr(event, "source") else None
    if isinstance(event, Invoice.Finalized):
        amount, detail = event.total, event.number
    elif isinstance(event, Invoice.Paid):
        amount = event.amount_paid
    elif isinstance(event, Invoice.PaymentFailed):
        detail = f"attempt {event.attempt}"
    elif isinstance(event, Invoice.CreditRequested):
        amount, detail = event.amount, str(event.transaction_id)
    elif isinstance(event, Invoice.Credited):
        amount, detail = event.amount, event.credit_note_id
    elif isinstance(event, Invoice.DriftFound):
        amount = event.stripe_total
        expected = format_money(event.expected_total, history.facts(event.originator_id).currency)
        detail = f"repair {event.repair}: {len(event.drifts)} item(s), expected {expected}"
    elif isinstance(event, Invoice.AttentionNeeded):
        detail = event.reason
    elif isinstance(event, Invoice.AttentionSettled):
        detail = f"{event.by}: {event.how}"
    elif isinstance(event, Invoice.DraftReplaced):
        detail = f"{event.by}: {event.how} (draft {event.lost} lost: {event.why})"
    elif isinstance(event, Invoice.MismatchFound):
        amount = event.stripe_total
        expected = format_money(event.expected_total, history.facts(event.originator_id).currency)
        detail = f"expected {expected} ({event.source})"
    return (
        event.originator_id,
        event.originator_version,
        history.facts(event.originator_id).customer_id,
        _KINDS[type(event)],
        event.timestamp,
        amount,
        detail,
    )
