"""An account's credit balance, written in the save that moves it.

``billing.credit_balances`` is a read model (``projections.credits``), but a balance that
trails its save by a projector's poll is a balance a customer can overdraw by looking
at: a save of a ``CustomerAccount`` with an event that moves its credit
(``domain.account.moves_credit``: an ingest batch's consumption, carried on its
``AmountsReserved`` or a ``CreditsConsumed``; a grant, an expiry, a void, a policy) also
writes the account's row, in the same transaction as its events. The row is the
account's state after the save (``CustomerAccount.credit_totals``), not a sum of moves,
with ``account_version``: the version of the save's last credit event.

The projector still folds every credit event, so a rebuild from the history gives the
same rows (I5); it skips an event at or below a row's ``account_version`` (the save
wrote it already), and a save writes its row only over an older one. Both lock rows in
the same order (customer and currency byte by byte: ``COLLATE "C"`` here, Python's
``sorted`` there), so an ingest save and the projector never wait on each other in a
cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any, NamedTuple

import orjson
from psycopg import Cursor
from psycopg.sql import SQL, Identifier

from domain.account import CustomerAccount, moves_credit
from store.schema import CREDIT_BALANCES, SCHEMA

__all__ = ["BalanceRow", "balance_row", "upsert_balances"]


class BalanceRow(NamedTuple):
    """One account's ``billing.credit_balances`` row as of a save."""

    customer_id: str
    currency: str
    policy: str
    grants: int
    granted: int
    consumed: Decimal
    expired: Decimal
    voided: Decimal
    updated_at: datetime  # the latest of the save's credit events, as the projector has it
    account_version: int  # the save's last credit event


def balance_row(account: CustomerAccount, events: Iterable[Any]) -> BalanceRow | None:
    """The account's row after a save of ``events`` (its own), or None when none of them
    moves its credit."""
    version = 0
    at: datetime | None = None
    for event in events:
        if moves_credit(event):
            version = max(version, event.originator_version)
            at = event.timestamp if at is None else max(at, event.timestamp)
    if at is None:
        return None
    totals = account.credit_totals()
    return BalanceRow(
        account.customer_id, account.currency, totals.policy, totals.grants, totals.granted,
        totals.consumed, totals.expired, totals.voided, at, version,
    )  # fmt: skip


# The rows go as one JSON document: ten arrays of a hundred values each cost the client
# ~3 ms to dump (a regex per text element), the document ~0.1 ms; the statement as a whole
# took 4.9 ms against 2.9 ms for 100 rows on the development machine.
_UPSERT = SQL("""
INSERT INTO {table} AS b (customer_id, currency, policy, grants, granted, consumed, expired,
    voided, updated_at, account_version)
SELECT * FROM json_to_recordset(%s::json) AS r(customer_id text, currency text, policy text,
    grants int, granted bigint, consumed numeric, expired numeric, voided numeric,
    updated_at timestamptz, account_version bigint)
ORDER BY customer_id COLLATE "C", currency COLLATE "C"
ON CONFLICT (customer_id, currency) DO UPDATE SET
    policy = EXCLUDED.policy, grants = EXCLUDED.grants, granted = EXCLUDED.granted,
    consumed = EXCLUDED.consumed, expired = EXCLUDED.expired, voided = EXCLUDED.voided,
    updated_at = GREATEST(b.updated_at, EXCLUDED.updated_at),
    account_version = EXCLUDED.account_version
WHERE b.account_version < EXCLUDED.account_version
""").format(table=Identifier(SCHEMA, CREDIT_BALANCES))
_FIELDS = BalanceRow._fields


def upsert_balances(curs: Cursor[Any], rows: Sequence[BalanceRow]) -> None:
    """Write ``rows`` (one per account) in the caller's transaction, in one statement;
    a row already newer (a later save's) is left as it is. Exact: amounts go as their
    decimal text."""
    document = orjson.dumps([dict(zip(_FIELDS, row, strict=True)) for row in rows], default=str)
    curs.execute(_UPSERT, (document.decode(),))
