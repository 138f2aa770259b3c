"""The audit: replay the history, check every invariant, compare with the read models
(and Stripe). Nothing here decides what is legal; ``domain.audit`` does.

The replay and the read models are read in ONE repeatable-read snapshot, so a read
model is compared with exactly the history it had applied; one that has not applied
every event is reported as ``projection_lag`` (its differences may be just that).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from adapters.audit.replay import Replay, Scope, history_size, read_history, replay
from adapters.progress import Progress
from adapters.settings import StripeSettings
from adapters.stripe.client import StripeGateway
from domain.anchor import AnchorCheck, Checkpoint
from domain.audit import (
    Balance,
    Finding,
    InvoiceItem,
    TxnAudit,
    check_balances,
    check_stripe,
    check_transactions,
)
from domain.audit_invoices import check_invoices, credited_transactions
from domain.audit_lines import check_line_items, check_lines
from projections.transactions import COLUMNS as TXN_COLUMNS
from store.connections import Database
from store.eventlog import copy_log
from store.schema import EVENTS_TABLE

__all__ = [
    "BALANCE_COLUMNS",
    "Anchors",
    "AuditReport",
    "audit",
    "check_anchors",
    "compare_balances",
    "compare_invoices",
    "compare_lines",
    "compare_transactions",
    "render",
    "stripe_invoice_items",
]


@dataclass(frozen=True)
class Anchors:
    """The signed checkpoints to verify the history against (``adapters.audit.anchor``):
    those that verified, and a problem for each line that did not."""

    source: str  # where they were read (the checkpoint file)
    checkpoints: list[Checkpoint]
    unverified: list[str]


@dataclass
class AuditReport:
    """What an audit replayed and every finding; ``ok`` when there are none."""

    scope: dict[str, Any]
    events: int
    aggregates: int
    transactions: int
    balances: int
    stripe_items: int | None
    seconds: float
    findings: list[Finding]
    anchor: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not self.findings

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def audit(
    database: Database,
    scope: Scope,
    *,
    horizon: timedelta,
    stripe_items: Callable[[], list[InvoiceItem]] | None = None,
    progress: bool = True,
    anchors: Anchors | None = None,
) -> AuditReport:
    """Replay, check every invariant, compare with the read models (and Stripe); with
    ``anchors``, verify the whole log against the signed checkpoints."""
    started = time.perf_counter()
    anchor: dict[str, Any] | None = None
    with database.dedicated() as conn:
        conn.read_only = True
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with conn.transaction():
            result = _replay_with_progress(conn, scope, progress)
            balances = result.balances()
            findings = _history_findings(result, balances, horizon)
            if anchors is not None:
                anchor, found = check_anchors(conn, anchors)
                findings += found
            findings += projection_lag(conn)
            findings += compare_transactions(conn, result.transactions, scope)
            if not scope.partial:
                credited = credited_transactions(result.invoices)
                findings += check_lines(result.lines, result.pushes, result.transactions, credited)
                findings += check_invoices(
                    result.invoices, result.lines, result.transactions, webhook_ids(conn)
                )
                findings += compare_invoices(conn, result, scope.customer)
                findings += compare_balances(conn, balances, scope.customer)
                findings += compare_lines(conn, result, scope.customer)
            findings += dead_letters_without_reason(conn)
    items = stripe_items() if stripe_items is not None else None
    if items is not None:
        foreign = not scope.partial
        findings += check_stripe(items, result.transactions, foreign_items=foreign)
        if not scope.partial:
            findings += check_line_items(items, result.pushes, result.lines)
    return AuditReport(
        scope={
            k: v.isoformat() if isinstance(v, datetime) else v for k, v in asdict(scope).items()
        },
        events=result.events,
        aggregates=result.aggregates,
        transactions=len(result.transactions),
        balances=len(balances),
        stripe_items=None if items is None else len(items),
        seconds=round(time.perf_counter() - started, 3),
        findings=findings,
        anchor=anchor,
    )


def check_anchors(
    conn: psycopg.Connection[Any], anchors: Anchors
) -> tuple[dict[str, Any], list[Finding]]:
    """Fold the whole log in commit order against the checkpoints: a summary, and a
    finding for a checkpoint the history no longer matches, for every line that does
    not verify, and for a file without a checkpoint (deleted, or never anchored)."""
    findings = [Finding("anchor_signature", anchors.source, p) for p in anchors.unverified]
    check = AnchorCheck(anchors.checkpoints).run(copy_log(conn, gap_free=False))
    if check.finding is not None:
        findings.append(Finding("anchor", check.finding.subject, check.finding.detail))
    if not anchors.checkpoints:
        findings.append(
            Finding("anchor_missing", anchors.source, "no signed checkpoint: nothing anchored")
        )
    latest = max(anchors.checkpoints, key=lambda c: c.position) if anchors.checkpoints else None
    summary = {
        "source": anchors.source,
        "checkpoints": len(anchors.checkpoints),
        "latest_at": latest.at if latest else None,
        "anchored_events": latest.events if latest else 0,
        "unanchored_events": check.unanchored,
        "holds": check.finding is None and not anchors.unverified,
    }
    return summary, findings


def _replay_with_progress(conn: psycopg.Connection[Any], scope: Scope, progress: bool) -> Replay:
    if not progress:
        return replay(read_history(conn), scope)
    bar = Progress(history_size(conn), "replayed events")
    result = replay(read_history(conn), scope, tick=bar.update)
    bar.update(result.events)
    bar.done()
    return result


def _history_findings(
    result: Replay, balances: dict[tuple[str, str], Balance], horizon: timedelta
) -> list[Finding]:
    findings = [
        Finding("chain", f"{b.originator_id} v{b.version}", b.problem) for b in result.breaks
    ]
    findings += [
        Finding(
            "limit_exceeded",
            f"{o.account[0]}/{o.account[1]} v{o.version}",
            f"a reservation took what is committed to {o.committed:f} minor units, past the"
            f" spend limit of {o.limit} in force at that event",
        )
        for o in result.overdrawn
    ]
    failing = {p.line_id for p in result.pushes.values() if p.failing}
    findings += check_transactions(
        result.transactions.values(), now=datetime.now(UTC), horizon=horizon, failing_lines=failing
    )
    return findings + check_balances(balances)


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


def stripe_invoice_items(
    settings: StripeSettings, customer: str | None = None
) -> list[InvoiceItem]:
    """Every live invoice item in Stripe (of one customer's Stripe customer, if given),
    listed through the project's one Stripe client (its rate limit and breaker)."""
    client = StripeGateway(settings)
    stripe_customer = None
    if customer is not None:
        stripe_customer = client.find_customer(customer)
        if stripe_customer is None:
            return []
    return [
        InvoiceItem(
            str(item["id"]),
            (item.get("metadata") or {}).get("txn_id"),
            int(item["amount"]),
            str(item["currency"]),
            (item.get("metadata") or {}).get("line_id"),
        )
        for item in client.invoice_items(stripe_customer)
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


def render(report: AuditReport) -> str:
    """The report as a person reads it: what was replayed, then one line per finding."""
    scope = ", ".join(f"{k}={v}" for k, v in report.scope.items() if v is not None) or "everything"
    lines = [
        f"audit of {scope}: {report.events:,} events, {report.aggregates:,} aggregates,"
        f" {report.transactions:,} transactions, {report.balances:,} balances"
        + (f", {report.stripe_items:,} Stripe items" if report.stripe_items is not None else "")
        + f" in {report.seconds:.1f} s",
    ]
    if report.anchor is not None:
        a = report.anchor
        lines.append(
            f"anchor: {a['checkpoints']} signed checkpoint(s) in {a['source']}, the latest"
            f" of {a['latest_at']} over {a['anchored_events']:,} events;"
            f" {a['unanchored_events']:,} event(s) after it not anchored yet"
        )
    if report.ok:
        return "\n".join([*lines, "OK: every check holds"])
    rows = [(f.kind, f.subject, f.detail) for f in report.findings]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(("kind", "subject"))]
    lines.append(f"FAILED: {len(rows)} finding(s)")
    lines.append(f"{'kind'.ljust(widths[0])}  {'subject'.ljust(widths[1])}  detail")
    lines += [f"{k.ljust(widths[0])}  {s.ljust(widths[1])}  {d}" for k, s, d in rows]
    return "\n".join(lines)
