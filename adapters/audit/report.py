"""The audit: replay the history, check every invariant, compare with the read models
(``adapters.audit.compare``) and Stripe. Nothing here decides what is legal;
``domain.audit`` does.

The replay and the read models are read in ONE repeatable-read snapshot, so a read
model is compared with exactly the history it had applied; one that has not applied
every event is reported as ``projection_lag`` (its differences may be just that).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from adapters.audit.compare import (
    compare_balances,
    compare_contract_versions,
    compare_credit_balances,
    compare_credit_grants,
    compare_credit_purchases,
    compare_invoices,
    compare_lines,
    compare_transactions,
    dead_letters_without_reason,
    projection_lag,
    webhook_ids,
)
from adapters.audit.replay import Replay, Scope, history_size, read_history, replay
from adapters.progress import Progress
from adapters.settings import StripeSettings
from adapters.stripe.client import StripeGateway
from domain.anchor import AnchorCheck, Checkpoint
from domain.audit import (
    Balance,
    Finding,
    InvoiceItem,
    check_balances,
    check_stripe,
    check_transactions,
)
from domain.audit_credits import check_credits
from domain.audit_invoices import (
    StripeInvoice,
    check_invoices,
    check_stripe_invoices,
    credited_transactions,
)
from domain.audit_lines import check_line_items, check_lines, credit_applied
from domain.audit_minimums import check_true_ups
from domain.audit_prices import check_line_prices, check_prices
from domain.audit_purchases import check_purchases, check_stripe_purchases
from domain.money import format_money
from store.connections import Database
from store.eventlog import copy_log
from store.snapshots import unsealed_snapshots

__all__ = [
    "Anchors",
    "AuditReport",
    "audit",
    "check_anchors",
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
    stripe_invoices: Callable[[], list[StripeInvoice]] | None = None,
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
                findings += check_true_ups(result.invoices.values(), result.lines, result.contracts)
                findings += check_line_prices(result.lines, result.transactions, result.prices)
                findings += check_credits(
                    result.credits, credit_applied(result.lines), result.transactions
                )
                findings += check_invoices(
                    result.invoices, result.lines, result.transactions, webhook_ids(conn)
                )
                findings += compare_invoices(conn, result, scope.customer)
                findings += compare_balances(conn, balances, scope.customer)
                findings += compare_credit_grants(conn, result.credits, scope.customer)
                findings += compare_credit_balances(conn, result.credits, scope.customer)
                findings += check_purchases(
                    result.purchases,
                    {account: audit.grants.keys() for account, audit in result.credits.items()},
                )
                findings += compare_credit_purchases(conn, result.purchases, scope.customer)
                findings += compare_contract_versions(conn, result.contracts, scope.customer)
                findings += compare_lines(conn, result, scope.customer)
                findings += [
                    Finding("snapshot", f"{i} v{v}", f"{why}: never used on load")
                    for i, v, why in unsealed_snapshots(conn)
                ]
            findings += dead_letters_without_reason(conn)
    items = stripe_items() if stripe_items is not None else None
    if items is not None:
        foreign = not scope.partial
        findings += check_stripe(items, result.transactions, foreign_items=foreign)
        if not scope.partial:
            findings += check_line_items(items, result.pushes, result.lines)
    if stripe_invoices is not None:
        listed = stripe_invoices()
        findings += check_stripe_invoices(listed, result.invoices, whole=not scope.partial)
        if not scope.partial:
            findings += check_stripe_purchases(listed, result.purchases)
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
            Finding(
                "anchor_missing",
                anchors.source,
                "no signed checkpoint: nothing anchored yet (`billing-ledger anchor` signs one)",
            )
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
            f"a reservation took what is committed to {format_money(o.committed, o.account[1])},"
            f" past the spend limit of {format_money(o.limit, o.account[1])} in force at that"
            " event",
        )
        for o in result.overdrawn
    ]
    failing = {p.line_id for p in result.pushes.values() if p.failing}
    findings += check_transactions(
        result.transactions.values(), now=datetime.now(UTC), horizon=horizon, failing_lines=failing
    )
    findings += check_prices(result.transactions.values(), result.prices, result.contracts)
    return findings + check_balances(balances)


def stripe_invoice_items(
    settings: StripeSettings, customer: str | None = None
) -> list[InvoiceItem]:
    """Every live invoice item in Stripe (of one customer's Stripe customer, if given),
    listed through the project's one Stripe client (its rate limit and breaker). A
    purchased grant's item (its metadata names a ``purchase_id``) bills credit, not
    usage: it is left out (its grant's conservation is checked from the history)."""
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
        if not (item.get("metadata") or {}).get("purchase_id")
    ]


def stripe_invoice_totals(
    settings: StripeSettings, customer: str | None = None
) -> list[StripeInvoice]:
    """Every invoice in Stripe (of one customer's Stripe customer, if given), its status,
    total, currency and customer and the ledger's ids in its metadata (an invoice's, a
    purchase's), listed through the project's one Stripe client (paged)."""
    client = StripeGateway(settings)
    stripe_customer = None
    if customer is not None:
        stripe_customer = client.find_customer(customer)
        if stripe_customer is None:
            return []
    return [
        StripeInvoice(
            str(i["id"]),
            str(i["status"]),
            int(i["total"]),
            (i.get("metadata") or {}).get("invoice_id"),
            str(i["currency"]),
            str(i["customer"]),
            (i.get("metadata") or {}).get("purchase_id"),
        )
        for i in client.invoices(stripe_customer)
    ]


def render(report: AuditReport) -> str:
    """The report as a person reads it: what was replayed, then one line per finding."""
    scope = ", ".join(f"{k}={v}" for k, v in report.scope.items() if v is not None) or "everything"
    lines = [
        f"audit of {scope}: {report.events:,} events, {report.aggregates:,} aggregates,"
        f" {report.transactions:,} transactions, {report.balances:,} balances"
        + (f", {report.stripe_items:,} Stripe items" if report.stripe_items is not None else "")
        + f" in {report.seconds:.1f} s",
    ]
    if report.anchor is not None and not report.anchor["checkpoints"]:
        lines.append(f"anchor: no signed checkpoint in {report.anchor['source']} yet")
    elif report.anchor is not None:
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
