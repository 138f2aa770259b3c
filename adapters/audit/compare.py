"""The audit's reads of the read models, each compared with the replayed history.

``compare_*`` report every difference between what the replay says and
``billing.transactions``, ``billing.customer_balances``, ``billing.invoice_lines`` and
``billing.invoices``; ``projection_lag`` names the read models that have not applied
every event (their differences may be just that). Also here: the dead letters without
a reason and the webhook event ids the listener recorded. All read on the audit's one
repeatable-read connection (``adapters.audit.report.audit``).
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from adapters.audit.replay import Replay, Scope
from domain.audit import Balance, Finding, TxnAudit
from projections.transactions import COLUMNS as TXN_COLUMNS
from store.schema import EVENTS_TABLE

__all__ = [
    "BALANCE_COLUMNS",
    "compare_balances",
    "compare_invoices",
    "compare_lines",
    "compare_transactions",
    "dead_letters_without_reason",
    "projection_lag",
    "webhook_ids",
]


# What a TxnAudit knows; the other columns are the times of the later steps.
_TXN_COMPARED = tuple(
    c
    for c in TXN_COLUMNS
    if c not in {"transaction_id", "occurred_at", "reserved_at", "charged_at", "compensated_at",
                 "updated_at"}
)  # fmt: skip


def compare_transactions(
    conn: psycopg.Connection[Any], txns: dict[str, TxnAudit], scope: Scope
) -> list[Finding]:
    """Every difference between the replayed transactions and ``billing.transactions``."""
    findings: list[Finding] = []
    seen: set[str] = set()
    for row in _projected_transactions(conn, scope):
        txn_id = str(row["transaction_id"])
        seen.add(txn_id)
        txn = txns.get(txn_id)
        if txn is None:
            findings.append(
                Finding("projection", txn_id, "in billing.transactions, not in history")
            )
            continue
        for column in _TXN_COMPARED:
            want, got = _expected(txn, column), row[column]
            if want != got:
                findings.append(
                    Finding(
                        "projection",
                        txn_id,
                        f"transactions.{column}: {got!r}, history says {want!r}",
                    )
                )
    for txn_id in txns.keys() - seen:
        findings.append(
            Finding("projection", txn_id, "in history, missing from billing.transactions")
        )
    return findings


def _expected(txn: TxnAudit, column: str) -> Any:
    value = getattr(txn, column)
    if column == "quantity":
        return Decimal(value)
    if column in ("next_attempt_at", "metered_at") and value is not None:
        return datetime.fromisoformat(value)
    if column == "line_id" and value is not None:
        return UUID(value)
    return str(value) if column == "state" else value


def _projected_transactions(conn: psycopg.Connection[Any], scope: Scope) -> list[dict[str, Any]]:
    where: list[sql.Composable] = []
    params: list[Any] = []
    for clause, value in (
        ("customer_id = %s", scope.customer),
        ("metered_at >= %s", scope.start),
        ("metered_at < %s", scope.end),
        ("metered_at <= %s", scope.as_of),
    ):
        if value is not None:
            where.append(sql.SQL(clause))
            params.append(value)
    query = sql.SQL("SELECT transaction_id, {} FROM billing.transactions{}").format(
        sql.SQL(", ").join(map(sql.Identifier, _TXN_COMPARED)),
        sql.SQL(" WHERE ") + sql.SQL(" AND ").join(where) if where else sql.SQL(""),
    )
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, params).fetchall()


BALANCE_COLUMNS = (
    "metered",
    "charged",
    "compensated",
    "in_flight",
    "transactions",
    "refused",
    "spend_limit",
    "available",
)


def compare_balances(
    conn: psycopg.Connection[Any], balances: dict[tuple[str, str], Balance], customer: str | None
) -> list[Finding]:
    """Every difference between the replayed balances and ``billing.customer_balances``."""
    findings: list[Finding] = []
    query = sql.SQL("SELECT customer_id, currency, {} FROM billing.customer_balances{}").format(
        sql.SQL(", ").join(map(sql.Identifier, BALANCE_COLUMNS)),
        sql.SQL(" WHERE customer_id = %s" if customer else ""),
    )
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query, [customer] if customer else []).fetchall()
    live = {(r["customer_id"], r["currency"]): r for r in rows}
    for key in sorted(live.keys() | balances.keys()):
        subject = "/".join(key)
        row, bal = live.get(key), balances.get(key)
        if row is None or bal is None:
            where = "billing.customer_balances" if row is None else "history"
            findings.append(Finding("projection", subject, f"balance missing from {where}"))
            continue
        for column in BALANCE_COLUMNS:
            if row[column] != getattr(bal, column):
                findings.append(
                    Finding(
                        "projection",
                        subject,
                        f"customer_balances.{column}: {row[column]!r},"
                        f" history says {getattr(bal, column)!r}",
                    )
                )
    return findings


def projection_lag(conn: psycopg.Connection[Any]) -> list[Finding]:
    """Read models that have not applied every event yet (their differences may be lag)."""
    rows = conn.execute(
        sql.SQL(
            "SELECT p.name, (SELECT count(*) FROM {} e"
            " WHERE (e.xid, e.notification_id) > (p.xid, p.notification_id))"
            " FROM billing.projection_positions p ORDER BY p.name"
        ).format(sql.Identifier(EVENTS_TABLE))
    ).fetchall()
    return [
        Finding(
            "projection_lag",
            name,
            f"{behind} event(s) not applied yet: run the project role, then audit again",
        )
        for name, behind in rows
        if behind
    ]


def dead_letters_without_reason(conn: psycopg.Connection[Any]) -> list[Finding]:
    """Every dead letter must say why (I6); the table's CHECK forbids only ''."""
    rows = conn.execute(
        "SELECT source_topic, source_partition, source_offset FROM billing.dead_letters"
        " WHERE reason IS NULL OR btrim(reason) = ''"
    ).fetchall()
    return [
        Finding("dead_letter", f"{t}/{p}@{o}", "dead letter without a reason") for t, p, o in rows
    ]


_LINE_COMPARED = ("exact_total", "billed", "transactions", "sequence")
_PUSH_COMPARED = ("pushed_sequence", "stripe_amount", "charged_through")


def compare_lines(
    conn: psycopg.Connection[Any], result: Replay, customer: str | None
) -> list[Finding]:
    """Every difference between the replayed lines and pushes and ``billing.invoice_lines``."""
    query = sql.SQL("SELECT line_id, {} FROM billing.invoice_lines{}").format(
        sql.SQL(", ").join(map(sql.Identifier, _LINE_COMPARED + _PUSH_COMPARED)),
        sql.SQL(" WHERE customer_id = %s" if customer else ""),
    )
    with conn.cursor(row_factory=dict_row) as cur:
        rows = {str(r["line_id"]): r for r in cur.execute(query, [customer] if customer else [])}
    push_of = {p.line_id: p for p in result.pushes.values()}
    findings: list[Finding] = []
    for line_id in sorted(rows.keys() | result.lines.keys()):
        row, line = rows.get(line_id), result.lines.get(line_id)
        if row is None or line is None:
            where = "billing.invoice_lines" if row is None else "history"
            findings.append(Finding("projection", line_id, f"line missing from {where}"))
            continue
        push = push_of.get(line_id)
        want = {
            "exact_total": line.exact_total,
            "billed": line.billed,
            "transactions": line.transactions,
            "sequence": line.sequence,
            "pushed_sequence": push.pushed_sequence if push else 0,
            "stripe_amount": push.pushed_billed if push else 0,
            "charged_through": push.charged_through if push else 0,
        }
        findings += [
            Finding("projection", line_id, f"invoice_lines.{c}: {row[c]!r}, history says {v!r}")
            for c, v in want.items()
            if row[c] != v
        ]
    return findings


def webhook_ids(conn: psycopg.Connection[Any]) -> set[str]:
    """The Stripe event ids the webhook listener recorded."""
    return {r[0] for r in conn.execute("SELECT event_id FROM billing.webhook_events")}


_INVOICE_COMPARED = ("state", "expected_total", "total", "amount_paid", "credited")


def compare_invoices(
    conn: psycopg.Connection[Any], result: Replay, customer: str | None = None
) -> list[Finding]:
    """Every difference between the replayed invoices and ``billing.invoices`` (of one
    customer, if given)."""
    query = sql.SQL("SELECT invoice_id, {} FROM billing.invoices{}").format(
        sql.SQL(", ").join(map(sql.Identifier, _INVOICE_COMPARED)),
        sql.SQL(" WHERE customer_id = %s" if customer else ""),
    )
    with conn.cursor(row_factory=dict_row) as cur:
        rows = {str(r["invoice_id"]): r for r in cur.execute(query, [customer] if customer else [])}
    findings: list[Finding] = []
    for invoice_id in sorted(rows.keys() | result.invoices.keys()):
        row, inv = rows.get(invoice_id), result.invoices.get(invoice_id)
        if row is None or inv is None:
            where = "billing.invoices" if row is None else "history"
            findings.append(Finding("projection", invoice_id, f"invoice missing from {where}"))
            continue
        want = {
            "state": str(inv.state),
            "expected_total": inv.expected_total or 0,
            "total": inv.total or 0,
            "amount_paid": inv.amount_paid,
            "credited": sum(amount for _, amount in inv.credited.values()),
        }
        findings += [
            Finding("projection", invoice_id, f"invoices.{c}: {row[c]!r}, history says {v!r}")
            for c, v in want.items()
            if row[c] != v
        ]
    return findings
