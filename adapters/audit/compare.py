"""The audit's reads of the read models, each compared with the replayed history.

``compare_*`` report every difference between what the replay says and
``billing.transactions``, ``billing.customer_balances``, ``billing.invoice_lines``,
``billing.invoices``, ``billing.credit_grants``, ``billing.credit_balances``,
``billing.credit_purchases`` and
``billing.contract_versions``;
``projection_lag`` names the read models that have not applied
every event (their differences may be just that). Also here: the dead letters without
a reason and the webhook event ids the listener recorded. All read on the audit's one
repeatable-read connection (``adapters.audit.report.audit``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from adapters.audit.replay import Replay, Scope
from domain.audit import Balance, Finding, TxnAudit, amount_text
from domain.audit_credits import CreditAudit
from domain.audit_purchases import PurchaseAudit
from domain.credits import credit_totals
from domain.ids import contract_id
from projections.transactions import COLUMNS as TXN_COLUMNS
from store.schema import EVENTS_TABLE

__all__ = [
    "BALANCE_COLUMNS",
    "compare_balances",
    "compare_contract_versions",
    "compare_credit_balances",
    "compare_credit_grants",
    "compare_credit_purchases",
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
                        f"transactions.{column}: {_shown(column, got, txn.currency)}, history"
                        f" says {_shown(column, want, txn.currency)}",
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
    query = sql.SQL("SELECT customer_id, currency, {} FROM billing.customer_balances{}").format(
        sql.SQL(", ").join(map(sql.Identifier, BALANCE_COLUMNS)),
        sql.SQL(" WHERE customer_id = %s" if customer else ""),
    )
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query, [customer] if customer else []).fetchall()
    live = {(r["customer_id"], r["currency"]): r for r in rows}
    return _row_differences(live, balances, "customer_balances", BALANCE_COLUMNS, "balance")


_Key = TypeVar("_Key", bound=tuple[str, ...])


def _row_differences(
    live: Mapping[_Key, Mapping[str, Any]],
    replayed: Mapping[_Key, Any],
    table: str,
    columns: tuple[str, ...],
    what: str,
) -> list[Finding]:
    """Each row of ``table`` (keyed by customer, currency, ...) against what the history
    says (an object with those columns as attributes): missing on either side, or a
    column that differs."""
    findings: list[Finding] = []
    for key in sorted(live.keys() | replayed.keys()):
        subject = "/".join(key)
        row, said = live.get(key), replayed.get(key)
        if row is None or said is None:
            where = f"billing.{table}" if row is None else "history"
            findings.append(Finding("projection", subject, f"{what} missing from {where}"))
            continue
        for column in columns:
            if row[column] != getattr(said, column):
                findings.append(
                    Finding(
                        "projection",
                        subject,
                        f"{table}.{column}: {_shown(column, row[column], key[1])},"
                        f" history says {_shown(column, getattr(said, column), key[1])}",
                    )
                )
    return findings


def compare_credit_grants(
    conn: psycopg.Connection[Any],
    credits: Mapping[tuple[str, str], CreditAudit],
    customer: str | None,
) -> list[Finding]:
    """Every difference between the replayed grants and ``billing.credit_grants``."""
    rows = _customer_rows(
        conn,
        "credit_grants",
        ("customer_id", "currency", "grant_id", "amount", "consumed", "expired", "voided"),
        customer,
    )
    live = {(r["customer_id"], r["currency"].strip(), r["grant_id"]): r for r in rows}
    replayed = {
        (*account, grant_id): grant
        for account, audit in credits.items()
        for grant_id, grant in audit.grants.items()
    }
    columns = ("amount", "consumed", "expired", "voided")
    return _row_differences(live, replayed, "credit_grants", columns, "grant")


def compare_credit_balances(
    conn: psycopg.Connection[Any],
    credits: Mapping[tuple[str, str], CreditAudit],
    customer: str | None,
) -> list[Finding]:
    """Every difference between the replayed accounts' credit and
    ``billing.credit_balances`` (written by the saves and by the projector: both must
    give the history's sums)."""
    columns = ("policy", "grants", "granted", "consumed", "expired", "voided")
    rows = _customer_rows(conn, "credit_balances", ("customer_id", "currency", *columns), customer)
    live = {(r["customer_id"], r["currency"].strip()): r for r in rows}
    replayed = {
        account: credit_totals(audit.grants.values(), audit.policy)
        for account, audit in credits.items()
        if customer in (None, account[0])
    }
    return _row_differences(live, replayed, "credit_balances", columns, "balance")


_PURCHASE_COMPARED = (
    "customer_id", "currency", "grant_id", "amount", "price", "top_up", "state",
    "stripe_invoice_id", "attempts",
)  # fmt: skip


def compare_credit_purchases(
    conn: psycopg.Connection[Any], purchases: Mapping[str, PurchaseAudit], customer: str | None
) -> list[Finding]:
    """Every difference between the replayed purchases (of one customer, if given) and
    ``billing.credit_purchases``."""

    def want(_: str, purchase: PurchaseAudit) -> dict[str, Any]:
        return {
            "customer_id": purchase.customer_id, "currency": purchase.currency,
            "grant_id": purchase.grant_id, "amount": purchase.amount, "price": purchase.price,
            "top_up": purchase.top_up, "state": purchase.row_state,
            "stripe_invoice_id": purchase.stripe_invoice_id, "attempts": purchase.attempts,
        }  # fmt: skip

    mine = {k: p for k, p in purchases.items() if customer in (None, p.customer_id)}
    return _compare_projection(
        conn, "credit_purchases", "purchase", _PURCHASE_COMPARED, customer, mine, want
    )


_CONTRACT_COMPARED = ("customer", "effective_from", "minimums", "meter_minimums")


@dataclass(frozen=True)
class _ContractVersion:
    """A contract version as ``billing.contract_versions`` holds it (``customer``: whether
    the row's customer is the one the contract id is derived from)."""

    customer: bool
    effective_from: datetime
    minimums: Mapping[str, int]
    meter_minimums: Mapping[str, Mapping[str, int]]


def compare_contract_versions(
    conn: psycopg.Connection[Any],
    contracts: Mapping[tuple[str, int], Mapping[str, Any]],
    customer: str | None,
) -> list[Finding]:
    """Every difference between the replayed contract versions (``Contract.Set`` as
    stored, by contract id and number) and ``billing.contract_versions``."""
    columns = ("customer_id", "contract_id", "version", *_CONTRACT_COMPARED[1:])
    rows = _customer_rows(conn, "contract_versions", columns, customer)
    live = {
        (str(r["contract_id"]), str(r["version"])): {
            **r, "customer": contract_id(r["customer_id"]) == r["contract_id"]
        }
        for r in rows
    }  # fmt: skip
    wanted = None if customer is None else str(contract_id(customer))
    replayed = {
        (cid, str(number)): _ContractVersion(
            customer=True,
            effective_from=_stored_moment(data["effective_from"]),
            minimums=data["minimums"],
            meter_minimums=data.get("meter_minimums", {}),
        )
        for (cid, number), data in contracts.items()
        if wanted in (None, cid)
    }
    return _row_differences(live, replayed, "contract_versions", _CONTRACT_COMPARED, "version")


def _stored_moment(value: Any) -> datetime:
    """A moment as an event stores it (a registered type: its ISO text under ``_data_``)."""
    return datetime.fromisoformat(value["_data_"] if isinstance(value, Mapping) else value)


def _customer_rows(
    conn: psycopg.Connection[Any], table: str, columns: tuple[str, ...], customer: str | None
) -> list[dict[str, Any]]:
    """``columns`` of every row of ``billing.<table>``, or of one customer's."""
    query = sql.SQL("SELECT {} FROM {}{}").format(
        sql.SQL(", ").join(map(sql.Identifier, columns)),
        sql.Identifier("billing", table),
        sql.SQL(" WHERE customer_id = %s" if customer else ""),
    )
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, [customer] if customer else []).fetchall()


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


# The compared columns that hold money, in minor units of the row's currency.
_AMOUNTS = frozenset(
    {"amount", "metered", "charged", "compensated", "in_flight", "spend_limit", "available",
     "exact_total", "billed", "stripe_amount", "expected_total", "total", "amount_paid",
     "credited", "consumed", "expired", "voided", "price", "granted"}
)  # fmt: skip


def _shown(column: str, value: Any, currency: str) -> str:
    """A compared value as the finding shows it: money in the one format (a spend limit
    of None: "none"), anything else as its repr."""
    return amount_text(value, currency) if column in _AMOUNTS else repr(value)


_LINE_COMPARED = ("exact_total", "billed", "transactions", "sequence")
_PUSH_COMPARED = ("pushed_sequence", "stripe_amount", "charged_through")


def compare_lines(
    conn: psycopg.Connection[Any], result: Replay, customer: str | None
) -> list[Finding]:
    """Every difference between the replayed lines and pushes and ``billing.invoice_lines``."""
    push_of = {p.line_id: p for p in result.pushes.values()}

    def want(line_id: str, line: Any) -> dict[str, Any]:
        push = push_of.get(line_id)
        return {
            "exact_total": line.exact_total,
            "billed": line.billed,
            "transactions": line.transactions,
            "sequence": line.sequence,
            "pushed_sequence": push.pushed_sequence if push else 0,
            "stripe_amount": push.pushed_billed if push else 0,
            "charged_through": push.charged_through if push else 0,
        }

    return _compare_projection(
        conn, "invoice_lines", "line", _LINE_COMPARED + _PUSH_COMPARED, customer, result.lines, want
    )


def webhook_ids(conn: psycopg.Connection[Any]) -> set[str]:
    """The Stripe event ids the webhook listener recorded."""
    return {r[0] for r in conn.execute("SELECT event_id FROM billing.webhook_events")}


_INVOICE_COMPARED = ("state", "expected_total", "total", "amount_paid", "credited")


def compare_invoices(
    conn: psycopg.Connection[Any], result: Replay, customer: str | None = None
) -> list[Finding]:
    """Every difference between the replayed invoices and ``billing.invoices`` (of one
    customer, if given)."""

    def want(_: str, inv: Any) -> dict[str, Any]:
        return {
            "state": str(inv.state),
            "expected_total": inv.expected_total or 0,
            "total": inv.total or 0,
            "amount_paid": inv.amount_paid,
            "credited": sum(amount for _, amount in inv.credited.values()),
        }

    return _compare_projection(
        conn, "invoices", "invoice", _INVOICE_COMPARED, customer, result.invoices, want
    )


def _compare_projection(  # noqa: PLR0917
    conn: psycopg.Connection[Any],
    table: str,
    kind: str,
    columns: tuple[str, ...],
    customer: str | None,
    replayed: dict[str, Any],
    want: Callable[[str, Any], dict[str, Any]],
) -> list[Finding]:
    """Every difference between ``billing.<table>`` (keyed by ``<kind>_id``; of one
    customer, if given) and what the replay says each row's ``columns`` hold (``want``)."""
    query = sql.SQL("SELECT {}, {} FROM billing.{}{}").format(
        sql.Identifier(f"{kind}_id"),
        sql.SQL(", ").join(map(sql.Identifier, columns)),
        sql.Identifier(table),
        sql.SQL(" WHERE customer_id = %s" if customer else ""),
    )
    with conn.cursor(row_factory=dict_row) as cur:
        rows = {str(r[f"{kind}_id"]): r for r in cur.execute(query, [customer] if customer else [])}
    findings: list[Finding] = []
    for key in sorted(rows.keys() | replayed.keys()):
        row, item = rows.get(key), replayed.get(key)
        if row is None or item is None:
            where = f"billing.{table}" if row is None else "history"
            findings.append(Finding("projection", key, f"{kind} missing from {where}"))
            continue
        findings += [
            Finding(
                "projection",
                key,
                f"{table}.{c}: {_shown(c, row[c], item.currency)}, history says"
                f" {_shown(c, v, item.currency)}",
            )
            for c, v in want(key, item).items()
            if row[c] != v
        ]
    return findings
