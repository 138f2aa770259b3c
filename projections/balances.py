"""The ``billing.customer_balances`` read model: where each customer's money is.

One row per customer and currency, in minor units, exact (``numeric``: the sums of
the transactions' exact amounts, never rounded), with the meaning of
``domain.audit.Balance`` (the audit's fold compares it row by row)::

    in_flight = metered - charged - compensated      (a generated column)
    available = max(spend_limit - (in_flight + charged), 0), or NULL when unlimited

A reversal of a Charged transaction moves its amount from charged to compensated. A
``Repriced`` transaction (``domain.repricing``) moves metered by the difference, and
charged too when it was charged; a later charge or compensation counts its new amount.
``refused`` counts transactions compensated straight from Metered (the spend limit
said no). Rows are written only by the projector (``projections.projector``).
Its table is made by the migrations (``store/migrations/``), never here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from domain.account import CustomerAccount
from domain.money import subtract_exact
from domain.transaction import BillingTransaction
from projections.base import SCHEMA, History, check_customer

__all__ = ["COLUMNS", "BalancesProjection", "balances"]

COLUMNS = (
    "customer_id",
    "currency",
    "metered",
    "in_flight",
    "charged",
    "compensated",
    "transactions",
    "refused",
    "spend_limit",
    "available",
    "updated_at",
)

# One statement per (customer, currency) of a batch: add the batch's sums, and set the
# limit when the batch set one.
_UPSERT = """
INSERT INTO {table} AS b (customer_id, currency, metered, charged, compensated,
                          transactions, refused, spend_limit, updated_at)
VALUES (%(customer_id)s, %(currency)s, %(metered)s, %(charged)s, %(compensated)s,
        %(transactions)s, %(refused)s, %(spend_limit)s, %(updated_at)s)
ON CONFLICT (customer_id, currency) DO UPDATE SET
    metered      = b.metered + EXCLUDED.metered,
    charged      = b.charged + EXCLUDED.charged,
    compensated  = b.compensated + EXCLUDED.compensated,
    transactions = b.transactions + EXCLUDED.transactions,
    refused      = b.refused + EXCLUDED.refused,
    spend_limit  = CASE WHEN %(limit_set)s THEN EXCLUDED.spend_limit ELSE b.spend_limit END,
    updated_at   = GREATEST(b.updated_at, EXCLUDED.updated_at)
"""


@dataclass
class _Delta:
    metered: Decimal = Decimal(0)
    charged: Decimal = Decimal(0)
    compensated: Decimal = Decimal(0)
    transactions: int = 0
    refused: int = 0
    limit_set: bool = False
    spend_limit: int | None = None
    updated_at: Any = None


class BalancesProjection:
    """Keeps ``billing.customer_balances`` from transaction and account events."""

    name: str = "customer_balances"

    def apply(
        self, conn: psycopg.Connection[Any], table: str, events: Sequence[Any], history: History
    ) -> None:
        for event in events:
            history.remember(event)
        history.prefetch(
            conn,
            (
                e.originator_id
                for e in events
                if isinstance(
                    e,
                    BillingTransaction.Charged
                    | BillingTransaction.Compensated
                    | BillingTransaction.Repriced
                    | CustomerAccount.LimitSet,
                )
            ),
        )
        amounts = history.amounts_before(
            conn,
            (
                e
                for e in events
                if isinstance(e, BillingTransaction.Charged | BillingTransaction.Compensated)
            ),
        )
        deltas: dict[tuple[str, str], _Delta] = {}
        for event in events:
            _fold(event, history, amounts, deltas)
        if deltas:
            params = [
                {"customer_id": customer, "currency": currency, **vars(delta)}
                for (customer, currency), delta in deltas.items()
            ]
            with conn.cursor() as cur:
                cur.executemany(
                    sql.SQL(_UPSERT).format(table=sql.Identifier(SCHEMA, table)), params
                )


def _fold(
    event: Any,
    history: History,
    amounts: dict[tuple[UUID, int], Decimal],
    deltas: dict[tuple[str, str], _Delta],
) -> None:
    """Add one event's effect to the batch's deltas (as ``summary.Balances.apply``);
    ``amounts``: a re-priced transaction's amount before its later events."""
    if isinstance(event, BillingTransaction.Metered):
        delta = _delta(deltas, event.customer_id, event.currency, event)
        delta.transactions += 1
        delta.metered += event.amount
    elif isinstance(event, BillingTransaction.Charged):
        facts = history.facts(event.originator_id)
        amount = amounts.get((event.originator_id, event.originator_version), facts.amount)
        _delta(deltas, facts.customer_id, facts.currency, event).charged += amount
    elif isinstance(event, BillingTransaction.Repriced):
        facts = history.facts(event.originator_id)
        delta = _delta(deltas, facts.customer_id, facts.currency, event)
        moved = subtract_exact(event.amount, event.old_amount)
        delta.metered += moved
        if event.state == "charged":
            delta.charged += moved
    elif isinstance(event, BillingTransaction.Compensated):
        facts = history.facts(event.originator_id)
        amount = amounts.get((event.originator_id, event.originator_version), facts.amount)
        delta = _delta(deltas, facts.customer_id, facts.currency, event)
        if event.from_state == "charged":  # a reversal: the charge is taken back
            delta.charged -= amount
        elif event.from_state == "metered":
            delta.refused += 1
        delta.compensated += amount
    elif isinstance(event, CustomerAccount.Opened | CustomerAccount.LimitSet):
        facts = history.facts(event.originator_id)
        delta = _delta(deltas, facts.customer_id, facts.currency, event)
        delta.limit_set = True
        delta.spend_limit = event.spend_limit


def _delta(
    deltas: dict[tuple[str, str], _Delta], customer: str, currency: str, event: Any
) -> _Delta:
    delta = deltas.setdefault((customer, currency), _Delta())
    # The latest, not the last: events of one save are not in timestamp order.
    if delta.updated_at is None or event.timestamp > delta.updated_at:
        delta.updated_at = event.timestamp
    return delta


def balances(conn: psycopg.Connection[Any], *, customer: str | None = None) -> list[dict[str, Any]]:
    """Every customer's balances, or one customer's (raises InvalidFilter)."""
    checked = check_customer(customer)
    query = sql.SQL("SELECT {} FROM {}{} ORDER BY customer_id, currency").format(
        sql.SQL(", ").join(map(sql.Identifier, COLUMNS)),
        sql.Identifier(SCHEMA, BalancesProjection.name),
        sql.SQL(" WHERE customer_id = %s") if checked is not None else sql.SQL(""),
    )
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, [checked] if checked is not None else []).fetchall()
