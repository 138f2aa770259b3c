"""The prepaid credits' read models: ``billing.credit_grants`` and ``billing.credit_balances``.

A grant's ``state`` is ``live``, ``pending`` (purchased: ``CreditAwaitingPayment``, until
``CreditActivated``) or ``unpaid`` (a pending grant voided: its invoice was never paid),
with ``state_reason``.

Both fold the customer accounts' credit events (``domain.account``, ``domain.credits``):
``CreditGranted`` adds a grant, ``CreditsConsumed`` (one per ingest batch),
``CreditExpired`` and ``CreditVoided`` move its amount, ``CreditPolicySet`` sets the
account's policy. Amounts are exact minor units (``numeric``, never rounded), and
``remaining = amount - consumed - expired - voided`` is a generated column, so I11
holds in the rows by construction; the audit's fold (``domain.audit_credits``) checks
the events themselves. The rows are as of the last save the projector applied; the
account itself (``billing-ledger credits show``) is current. Rows are written only by
the projector; the tables are made by the migrations, never here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg
from eventsourcing.utils import get_topic
from psycopg import sql
from psycopg.rows import dict_row

from domain.account import CustomerAccount
from projections.base import SCHEMA, History, check_customer

__all__ = [
    "BALANCE_COLUMNS",
    "CREDIT_BALANCES",
    "CREDIT_GRANTS",
    "CREDIT_TOPICS",
    "GRANT_COLUMNS",
    "CreditProjection",
    "credit_balances",
    "credit_grants",
    "due_expiries",
]

GRANT_COLUMNS = (
    "customer_id", "currency", "grant_id", "amount", "priority", "effective_at", "expires_at",
    "source", "reason", "consumed", "expired", "voided", "remaining", "granted_at", "updated_at",
    "state", "state_reason",
)  # fmt: skip
BALANCE_COLUMNS = (
    "customer_id", "currency", "policy", "grants", "granted", "consumed", "expired", "voided",
    "remaining", "updated_at",
)  # fmt: skip

_CREDIT_EVENTS = (
    CustomerAccount.CreditGranted,
    CustomerAccount.CreditsConsumed,
    CustomerAccount.CreditExpired,
    CustomerAccount.CreditVoided,
    CustomerAccount.CreditPolicySet,
    CustomerAccount.CreditAwaitingPayment,
    CustomerAccount.CreditActivated,
)

CREDIT_TOPICS: tuple[str, ...] = tuple(get_topic(cls) for cls in _CREDIT_EVENTS)
"""The stored topics of the events the credit projections fold: all they need to read
(``projections.projector.CREDIT_LANE``)."""

_INSERT_GRANT = """
INSERT INTO {table} (customer_id, currency, grant_id, amount, priority, effective_at,
                     expires_at, source, reason, granted_at, updated_at)
VALUES (%(customer_id)s, %(currency)s, %(grant_id)s, %(amount)s, %(priority)s,
        %(effective_at)s, %(expires_at)s, %(source)s, %(reason)s, %(at)s, %(at)s)
"""
_MOVE_GRANT = """
UPDATE {table} SET consumed = consumed + %(consumed)s, expired = expired + %(expired)s,
    voided = voided + %(voided)s, updated_at = GREATEST(updated_at, %(at)s),
    state = CASE WHEN %(state)s::text IS NOT NULL THEN %(state)s::text
                 WHEN %(void_reason)s::text IS NOT NULL AND state = 'pending' THEN 'unpaid'
                 ELSE state END,
    state_reason = CASE WHEN %(state)s::text IS NOT NULL THEN %(state_reason)s::text
                        WHEN %(void_reason)s::text IS NOT NULL AND state = 'pending'
                        THEN 'never live: ' || %(void_reason)s::text
                        ELSE state_reason END
WHERE customer_id = %(customer_id)s AND currency = %(currency)s AND grant_id = %(grant_id)s
"""
_UPSERT_BALANCE = """
INSERT INTO {table} AS b (customer_id, currency, policy, grants, granted, consumed, expired,
                          voided, updated_at)
VALUES (%(customer_id)s, %(currency)s, coalesce(%(policy)s, 'overage'), %(grants)s,
        %(granted)s, %(consumed)s, %(expired)s, %(voided)s, %(at)s)
ON CONFLICT (customer_id, currency) DO UPDATE SET
    policy     = coalesce(%(policy)s, b.policy),
    grants     = b.grants + EXCLUDED.grants,
    granted    = b.granted + EXCLUDED.granted,
    consumed   = b.consumed + EXCLUDED.consumed,
    expired    = b.expired + EXCLUDED.expired,
    voided     = b.voided + EXCLUDED.voided,
    updated_at = GREATEST(b.updated_at, EXCLUDED.updated_at)
"""


@dataclass
class _Moves:
    """What a batch of events moves on one grant, or on one account (in sum)."""

    consumed: Decimal = Decimal(0)
    expired: Decimal = Decimal(0)
    voided: Decimal = Decimal(0)
    at: datetime | None = None
    # the account's only
    grants: int = 0
    granted: int = 0
    policy: str | None = None
    new: list[dict[str, Any]] = field(default_factory=list)
    # a grant's only: its state, if the batch set it, and the reason of a void in it
    state: str | None = None
    state_reason: str = ""
    void_reason: str | None = None

    def seen(self, at: datetime) -> None:
        # The latest, not the last: events of one save are not in timestamp order.
        if self.at is None or at > self.at:
            self.at = at


def _fold(
    events: Sequence[Any], history: History
) -> tuple[dict[tuple[str, str], _Moves], dict[tuple[str, str, str], _Moves]]:
    """Each account's and each grant's moves in the batch."""
    accounts: dict[tuple[str, str], _Moves] = {}
    grants: dict[tuple[str, str, str], _Moves] = {}
    for event in events:
        facts = history.facts(event.originator_id)
        key = (facts.customer_id, facts.currency)
        account = accounts.setdefault(key, _Moves())
        account.seen(event.timestamp)
        if isinstance(event, CustomerAccount.CreditPolicySet):
            account.policy = event.policy
        elif isinstance(event, CustomerAccount.CreditGranted):
            account.grants += 1
            account.granted += event.amount
            account.new.append(_grant_row(key, event))
        elif isinstance(event, CustomerAccount.CreditAwaitingPayment):
            moves = _grant(grants, key, event.grant_id, event.timestamp)
            moves.state, moves.state_reason = "pending", "awaiting payment of its invoice"
        elif isinstance(event, CustomerAccount.CreditActivated):
            moves = _grant(grants, key, event.grant_id, event.timestamp)
            moves.state, moves.state_reason = "live", f"paid: invoice {event.stripe_invoice_id}"
        elif isinstance(event, CustomerAccount.CreditsConsumed):
            for grant_id, text in zip(event.grant_ids, event.amounts, strict=True):
                amount = Decimal(text)
                _grant(grants, key, grant_id, event.timestamp).consumed += amount
                account.consumed += amount
        else:
            kind = "expired" if isinstance(event, CustomerAccount.CreditExpired) else "voided"
            moves = _grant(grants, key, event.grant_id, event.timestamp)
            setattr(moves, kind, getattr(moves, kind) + event.amount)
            setattr(account, kind, getattr(account, kind) + event.amount)
            if kind == "voided":
                _voided(moves, event.reason)
    return accounts, grants


def _grant(
    grants: dict[tuple[str, str, str], _Moves], key: tuple[str, str], grant_id: str, at: datetime
) -> _Moves:
    moves = grants.setdefault((*key, grant_id), _Moves())
    moves.seen(at)
    return moves


def _voided(moves: _Moves, reason: str) -> None:
    """A void in the batch: a grant pending payment never becomes live."""
    if moves.state == "pending":
        moves.state, moves.state_reason = "unpaid", f"never live: {reason}"
    elif moves.state is None:
        moves.void_reason = reason


def _grant_row(key: tuple[str, str], event: CustomerAccount.CreditGranted) -> dict[str, Any]:
    return {
        "customer_id": key[0], "currency": key[1], "grant_id": event.grant_id,
        "amount": event.amount, "priority": event.priority,
        "effective_at": event.effective_at, "expires_at": event.expires_at,
        "source": event.source, "reason": event.reason, "at": event.timestamp,
    }  # fmt: skip


@dataclass
class _Folded:
    """A batch's moves, per account and per grant."""

    accounts: dict[tuple[str, str], _Moves]
    grants: dict[tuple[str, str, str], _Moves]


Writer = Callable[[psycopg.Cursor[Any], sql.Identifier, _Folded], None]


class CreditProjection:
    """Folds a batch's credit events, then writes them to its table with ``write``."""

    def __init__(self, name: str, write: Writer) -> None:
        self.name = name
        self.write = write

    def apply(
        self, conn: psycopg.Connection[Any], table: str, events: Sequence[Any], history: History
    ) -> None:
        relevant = [e for e in events if isinstance(e, _CREDIT_EVENTS)]
        for event in events:
            history.remember(event)
        if not relevant:
            return
        history.prefetch(conn, {e.originator_id for e in relevant})
        with conn.cursor() as cur:
            self.write(cur, sql.Identifier(SCHEMA, table), _Folded(*_fold(relevant, history)))


def _write_grants(cur: psycopg.Cursor[Any], target: sql.Identifier, folded: _Folded) -> None:
    new = [row for moves in folded.accounts.values() for row in moves.new]
    if new:  # before their moves: a grant's events come after its CreditGranted
        cur.executemany(sql.SQL(_INSERT_GRANT).format(table=target), new)
    params = [
        {"customer_id": c, "currency": currency, "grant_id": g, "consumed": m.consumed,
         "expired": m.expired, "voided": m.voided, "at": m.at, "state": m.state,
         "state_reason": m.state_reason, "void_reason": m.void_reason}
        for (c, currency, g), m in folded.grants.items()
    ]  # fmt: skip
    if params:
        cur.executemany(sql.SQL(_MOVE_GRANT).format(table=target), params)


def _write_balances(cur: psycopg.Cursor[Any], target: sql.Identifier, folded: _Folded) -> None:
    params = [
        {"customer_id": c, "currency": currency, "policy": m.policy, "grants": m.grants,
         "granted": m.granted, "consumed": m.consumed, "expired": m.expired,
         "voided": m.voided, "at": m.at}
        for (c, currency), m in folded.accounts.items()
    ]  # fmt: skip
    cur.executemany(sql.SQL(_UPSERT_BALANCE).format(table=target), params)


CREDIT_GRANTS = CreditProjection("credit_grants", _write_grants)
CREDIT_BALANCES = CreditProjection("credit_balances", _write_balances)


def due_expiries(conn: psycopg.Connection[Any], now: datetime) -> list[tuple[str, str]]:
    """The accounts with a grant past its expiry that is not recorded expired (nor
    voided) and had something left as of the last save projected."""
    query = sql.SQL(
        "SELECT DISTINCT customer_id, currency FROM {} WHERE expires_at <= %s"
        " AND remaining > 0 AND expired = 0 AND voided = 0 ORDER BY customer_id, currency"
    ).format(sql.Identifier(SCHEMA, CREDIT_GRANTS.name))
    return [(c, str(cur).strip()) for c, cur in conn.execute(query, (now,)).fetchall()]


def credit_grants(
    conn: psycopg.Connection[Any], *, customer: str | None = None
) -> list[dict[str, Any]]:
    """Every grant, or one customer's (raises InvalidFilter), oldest first."""
    return _select(conn, CREDIT_GRANTS.name, GRANT_COLUMNS, customer, "granted_at")


def credit_balances(
    conn: psycopg.Connection[Any], *, customer: str | None = None
) -> list[dict[str, Any]]:
    """Every account's credit, or one customer's (raises InvalidFilter)."""
    return _select(conn, CREDIT_BALANCES.name, BALANCE_COLUMNS, customer, "currency")


def _select(
    conn: psycopg.Connection[Any],
    table: str,
    columns: Sequence[str],
    customer: str | None,
    order: str,
) -> list[dict[str, Any]]:
    checked = check_customer(customer)
    query = sql.SQL("SELECT {} FROM {}{} ORDER BY customer_id, {}").format(
        sql.SQL(", ").join(map(sql.Identifier, columns)),
        sql.Identifier(SCHEMA, table),
        sql.SQL(" WHERE customer_id = %s") if checked is not None else sql.SQL(""),
        sql.Identifier(order),
    )
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, [checked] if checked is not None else []).fetchall()
