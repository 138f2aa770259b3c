"""The prepaid credits' read models: ``billing.credit_grants`` and ``billing.credit_balances``.

A grant's ``state`` is ``live``, ``pending`` (purchased: ``CreditAwaitingPayment``, until
``CreditActivated``) or ``unpaid`` (a pending grant voided: its invoice was never paid),
with ``state_reason``.

Both fold the customer accounts' credit events (``domain.account``, ``domain.credits``):
``CreditGranted`` adds a grant, an ingest batch's consumption (``AmountsReserved`` burnt
from a grant, or ``CreditsConsumed``: ``domain.account.consumption``),
``CreditExpired`` and ``CreditVoided`` move its amount, ``CreditPolicySet`` sets the
account's policy. Amounts are exact minor units (``numeric``, never rounded), and
``remaining = amount - consumed - expired - voided`` is a generated column, so I11
holds in the rows by construction; the audit's fold (``domain.audit_credits``) checks
the events themselves. ``billing.credit_grants``' rows are as of the last save the
projector applied; the account itself (``billing-ledger credits show``) is current.

``billing.credit_balances`` is also written by the saves themselves (``store.credit_rows``):
a save that moves an account's credit writes its row, the account's state, in the same
transaction, with ``account_version`` (its last credit event), so the balance in SQL is
never behind its save. Here an event at or below a row's ``account_version`` is skipped
(the save counted it), checked again in the statement that adds the rest; a rebuild,
which starts from no rows, folds every event and gives the same rows. The tables are
made by the migrations, never here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, localcontext
from typing import Any

import psycopg
from eventsourcing.utils import get_topic
from psycopg import sql
from psycopg.rows import dict_row

from domain.account import CREDIT_EVENTS, CustomerAccount, consumption, moves_credit
from domain.money import sum_exact
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

_CREDIT_EVENTS = tuple(sorted(CREDIT_EVENTS, key=lambda cls: cls.__qualname__))

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
# A new row holds every step given; an existing one only the steps newer than the last
# event it holds (``account_version``): a save may have written the row already
# (``store.credit_rows``), and then its events count once, there.
_UPSERT_BALANCE = """
INSERT INTO {table} AS b (customer_id, currency, policy, grants, granted, consumed, expired,
                          voided, updated_at, account_version)
VALUES (%(customer_id)s, %(currency)s, coalesce(%(policy)s, 'overage'), %(grants)s,
        %(granted)s, %(consumed)s, %(expired)s, %(voided)s, %(at)s, %(version)s)
ON CONFLICT (customer_id, currency) DO UPDATE SET
    (policy, grants, granted, consumed, expired, voided, updated_at, account_version) = (
        SELECT coalesce((array_agg(u.policy ORDER BY u.v DESC)
                         FILTER (WHERE u.policy IS NOT NULL))[1], b.policy),
               b.grants + sum(u.grants), b.granted + sum(u.granted),
               b.consumed + sum(u.consumed), b.expired + sum(u.expired),
               b.voided + sum(u.voided), GREATEST(b.updated_at, max(u.at)), max(u.v)
        FROM unnest(%(vs)s::bigint[], %(policies)s::text[], %(grants_d)s::int[],
                    %(granted_d)s::bigint[], %(consumed_d)s::numeric[],
                    %(expired_d)s::numeric[], %(voided_d)s::numeric[], %(ats)s::timestamptz[])
             AS u(v, policy, grants, granted, consumed, expired, voided, at)
        WHERE u.v > b.account_version)
WHERE b.account_version < %(version)s
"""
_KNOWN_VERSIONS = """
SELECT customer_id, currency, account_version FROM {table}
WHERE (customer_id, currency) IN (SELECT * FROM unnest(%s::text[], %s::text[]))
"""


@dataclass
class _Step:
    """What one credit event moves on its account's balance."""

    version: int
    at: datetime
    policy: str | None = None
    grants: int = 0
    granted: int = 0
    consumed: Decimal = Decimal(0)
    expired: Decimal = Decimal(0)
    voided: Decimal = Decimal(0)


@dataclass
class _Moves:
    """What a batch of events moves on one grant, or on one account (in sum)."""

    consumed: Decimal = Decimal(0)
    expired: Decimal = Decimal(0)
    voided: Decimal = Decimal(0)
    at: datetime | None = None
    # the account's only: each event's step, and the grants it made
    steps: list[_Step] = field(default_factory=list)
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
    """Each account's and each grant's moves in the batch, added exactly (an amount's 60
    digits and a sum of them fit in 80; the default context keeps 28)."""
    with localcontext(prec=80):
        return _fold_exactly(events, history)


def _fold_exactly(
    events: Sequence[Any], history: History
) -> tuple[dict[tuple[str, str], _Moves], dict[tuple[str, str, str], _Moves]]:
    accounts: dict[tuple[str, str], _Moves] = {}
    grants: dict[tuple[str, str, str], _Moves] = {}
    for event in events:
        facts = history.facts(event.originator_id)
        key = (facts.customer_id, facts.currency)
        account = accounts.setdefault(key, _Moves())
        step = _Step(event.originator_version, event.timestamp)
        account.steps.append(step)
        if isinstance(event, CustomerAccount.CreditPolicySet):
            step.policy = event.policy
        elif isinstance(event, CustomerAccount.CreditGranted):
            step.grants, step.granted = 1, event.amount
            account.new.append(_grant_row(key, event))
        elif isinstance(event, CustomerAccount.CreditAwaitingPayment):
            moves = _grant(grants, key, event.grant_id, event.timestamp)
            moves.state, moves.state_reason = "pending", "awaiting payment of its invoice"
        elif isinstance(event, CustomerAccount.CreditActivated):
            moves = _grant(grants, key, event.grant_id, event.timestamp)
            moves.state, moves.state_reason = "live", f"paid: invoice {event.stripe_invoice_id}"
        elif isinstance(event, CustomerAccount.CreditsConsumed | CustomerAccount.AmountsReserved):
            _consumed(grants, key, event, step)
        else:
            kind = "expired" if isinstance(event, CustomerAccount.CreditExpired) else "voided"
            moves = _grant(grants, key, event.grant_id, event.timestamp)
            setattr(moves, kind, getattr(moves, kind) + event.amount)
            setattr(step, kind, event.amount)
            if kind == "voided":
                _voided(moves, event.reason)
    return accounts, grants


def _consumed(
    grants: dict[tuple[str, str, str], _Moves], key: tuple[str, str], event: Any, step: _Step
) -> None:
    """A batch's consumption (``consumption``: its own event, or on its reservation)."""
    for _, grant_id, text in consumption(event):
        amount = Decimal(text)
        _grant(grants, key, grant_id, event.timestamp).consumed += amount
        step.consumed += amount


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
        relevant = [e for e in events if moves_credit(e)]
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
    """Each account's steps newer than its row (``store.credit_rows``), in account order:
    Python's ``sorted``, code point by code point, the order of a save's ``COLLATE "C"``
    (the two never wait on each other in a cycle)."""
    keys = sorted(folded.accounts)
    query = sql.SQL(_KNOWN_VERSIONS).format(table=target)
    known = {
        (c, str(currency).strip()): version
        for c, currency, version in cur.execute(
            query, ([c for c, _ in keys], [currency for _, currency in keys])
        ).fetchall()
    }
    params = []
    for key in keys:
        steps = [s for s in folded.accounts[key].steps if s.version > known.get(key, 0)]
        if steps:
            params.append(_balance_params(key, steps))
    if params:
        cur.executemany(sql.SQL(_UPSERT_BALANCE).format(table=target), params)


def _balance_params(key: tuple[str, str], steps: Sequence[_Step]) -> dict[str, Any]:
    policies = [s.policy for s in steps if s.policy is not None]
    return {
        "customer_id": key[0], "currency": key[1],
        "policy": policies[-1] if policies else None,
        "grants": sum(s.grants for s in steps), "granted": sum(s.granted for s in steps),
        "consumed": sum_exact(s.consumed for s in steps),
        "expired": sum_exact(s.expired for s in steps),
        "voided": sum_exact(s.voided for s in steps),
        "at": max(s.at for s in steps), "version": max(s.version for s in steps),
        "vs": [s.version for s in steps], "policies": [s.policy for s in steps],
        "grants_d": [s.grants for s in steps], "granted_d": [s.granted for s in steps],
        "consumed_d": [s.consumed for s in steps], "expired_d": [s.expired for s in steps],
        "voided_d": [s.voided for s in steps], "ats": [s.at for s in steps],
    }  # fmt: skip


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
