"""The ``billing.credit_purchases`` read model: one row per purchase of prepaid credit.

A row starts with the automatic top-up that requested it (``CustomerAccount.TopUpStarted``:
state ``requested``) or with the purchase itself (``CreditPurchase.Started``:
``invoicing``), and follows the purchase's events: its draft (the Stripe invoice id),
failed attempts (how many, the next due time, why), ``finalized``, then ``paid`` or
``unpaid`` (with the reason); a grant voided while awaiting payment: ``voiding``, then
``unpaid``, or ``needs_attention`` (paid after the void) and ``reinstated``. The
reconciler reads it (``open_purchases``) to start the top-ups requested and to drive
the invoices that are due (made or voided); the aggregates decide, so a
row behind the history only delays. Its table is made by the migrations, never here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from domain.account import CustomerAccount
from domain.purchase import CreditPurchase
from projections.base import SCHEMA, History, check_customer

__all__ = [
    "PURCHASE_COLUMNS",
    "OpenPurchase",
    "PurchasesProjection",
    "credit_purchases",
    "open_purchases",
]

NAME = "credit_purchases"
PURCHASE_COLUMNS = (
    "purchase_id", "customer_id", "currency", "grant_id", "amount", "price", "top_up",
    "state", "stripe_invoice_id", "attempts", "next_attempt_at", "reason", "requested_at",
    "updated_at",
)  # fmt: skip

_INSERT = """
INSERT INTO {table} AS p (purchase_id, customer_id, currency, grant_id, amount, price,
                          top_up, state, requested_at, updated_at)
VALUES (%(purchase_id)s, %(customer_id)s, %(currency)s, %(grant_id)s, %(amount)s,
        %(price)s, %(top_up)s, %(state)s, %(at)s, %(at)s)
ON CONFLICT (purchase_id) DO UPDATE SET
    state = CASE WHEN p.state = 'requested' THEN EXCLUDED.state ELSE p.state END,
    updated_at = GREATEST(p.updated_at, EXCLUDED.updated_at)
"""
_UPDATE = """
UPDATE {table} SET
    state = CASE WHEN state = 'voiding' AND %(state)s = 'finalized' THEN state
                 ELSE coalesce(%(state)s, state) END,
    stripe_invoice_id = coalesce(%(stripe_invoice_id)s, stripe_invoice_id),
    attempts = coalesce(%(attempts)s, attempts),
    next_attempt_at = CASE WHEN %(clear_due)s THEN NULL
                           ELSE coalesce(%(next_attempt_at)s, next_attempt_at) END,
    reason = coalesce(%(reason)s, reason),
    updated_at = GREATEST(updated_at, %(at)s)
WHERE purchase_id = %(purchase_id)s
"""
_EVENTS = (
    CustomerAccount.TopUpStarted,
    CreditPurchase.Started,
    CreditPurchase.DraftCreated,
    CreditPurchase.ItemAdded,
    CreditPurchase.AttemptFailed,
    CreditPurchase.Finalized,
    CreditPurchase.Paid,
    CreditPurchase.Unpaid,
    CreditPurchase.VoidRequested,
    CreditPurchase.PaidAfterVoid,
    CreditPurchase.Reinstated,
)


class PurchasesProjection:
    """Keeps ``billing.credit_purchases`` (see the module docstring)."""

    name: str = NAME

    def apply(
        self, conn: psycopg.Connection[Any], table: str, events: Sequence[Any], history: History
    ) -> None:
        relevant = [e for e in events if isinstance(e, _EVENTS)]
        if not relevant:
            return
        target = sql.Identifier(SCHEMA, table)
        with conn.cursor() as cur:
            for event in relevant:  # few: one purchase is a handful of events
                if isinstance(event, CustomerAccount.TopUpStarted | CreditPurchase.Started):
                    cur.execute(sql.SQL(_INSERT).format(table=target), _started(event))
                else:
                    cur.execute(sql.SQL(_UPDATE).format(table=target), _moved(event))


def _started(event: Any) -> dict[str, Any]:
    if isinstance(event, CustomerAccount.TopUpStarted):
        return {
            "purchase_id": UUID(event.purchase_id), "customer_id": event.customer_id,
            "currency": event.currency, "grant_id": event.grant_id, "amount": event.buy,
            "price": event.price, "top_up": True, "state": "requested", "at": event.timestamp,
        }  # fmt: skip
    return {
        "purchase_id": event.originator_id, "customer_id": event.customer_id,
        "currency": event.currency, "grant_id": event.grant_id, "amount": event.amount,
        "price": event.price, "top_up": event.top_up, "state": "invoicing",
        "at": event.timestamp,
    }  # fmt: skip


def _moved(event: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "purchase_id": event.originator_id, "state": None, "stripe_invoice_id": None,
        "attempts": None, "next_attempt_at": None, "clear_due": True, "reason": None,
        "at": event.timestamp,
    }  # fmt: skip
    if isinstance(event, CreditPurchase.DraftCreated):
        row["stripe_invoice_id"] = event.stripe_invoice_id
    elif isinstance(event, CreditPurchase.AttemptFailed):
        reason = f"{event.step}: {event.error_class}: {event.message}"
        row.update(
            attempts=event.attempt, next_attempt_at=event.next_attempt_at, clear_due=False,
            reason=reason,
        )  # fmt: skip
    elif isinstance(event, CreditPurchase.Finalized):
        row["state"] = "finalized"
    elif isinstance(event, CreditPurchase.VoidRequested):
        row.update(state="voiding", reason=f"its grant was voided: {event.reason}")
    elif isinstance(event, CreditPurchase.PaidAfterVoid):
        row.update(state="needs_attention", reason=event.reason)
    elif isinstance(event, CreditPurchase.Reinstated):
        row.update(state="reinstated", reason=f"reinstated as grant {event.grant_id}")
    elif isinstance(event, CreditPurchase.Paid):
        row.update(state="paid", reason="")
    elif isinstance(event, CreditPurchase.Unpaid):
        row.update(state="unpaid", reason=event.reason)
    return row


class OpenPurchase(NamedTuple):
    """A purchase to drive: a top-up requested, or an invoice being made."""

    purchase_id: UUID
    customer_id: str
    currency: str
    grant_id: str
    state: str


def open_purchases(conn: psycopg.Connection[Any], now: datetime) -> list[OpenPurchase]:
    """The top-ups requested, and the invoices being made or voided, whose next step is
    due."""
    query = sql.SQL(
        "SELECT purchase_id, customer_id, currency, grant_id, state FROM {}"
        " WHERE state IN ('requested', 'invoicing', 'voiding')"
        " AND (next_attempt_at IS NULL OR next_attempt_at <= %s)"
        " ORDER BY requested_at, purchase_id"
    ).format(sql.Identifier(SCHEMA, NAME))
    return [
        OpenPurchase(p, c, str(cur).strip(), g, s)
        for p, c, cur, g, s in conn.execute(query, (now,)).fetchall()
    ]


def credit_purchases(
    conn: psycopg.Connection[Any], *, customer: str | None = None
) -> list[dict[str, Any]]:
    """Every purchase, or one customer's (raises InvalidFilter), oldest first."""
    checked = check_customer(customer)
    query = sql.SQL("SELECT {} FROM {}{} ORDER BY requested_at, purchase_id").format(
        sql.SQL(", ").join(map(sql.Identifier, PURCHASE_COLUMNS)),
        sql.Identifier(SCHEMA, NAME),
        sql.SQL(" WHERE customer_id = %s") if checked is not None else sql.SQL(""),
    )
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, [checked] if checked is not None else []).fetchall()
