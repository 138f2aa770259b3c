"""The history as auditors take it away: ``balances --as-of`` (folded from the events'
own timestamps) and ``export`` (a customer's events with positions and hashes)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from typing import Any

import orjson
from psycopg import sql

from adapters.audit.compare import BALANCE_COLUMNS
from adapters.audit.replay import ACCOUNT_TOPICS, TXN_TOPICS, Scope, read_history, replay, unwrap
from store.connections import Database
from store.schema import EVENTS_TABLE

__all__ = ["balances_as_of", "export_events"]


def balances_as_of(
    database: Database, as_of: datetime, customer: str | None = None
) -> dict[str, Any]:
    """Balances and transaction states at ``as_of``, from the history alone."""
    scope = Scope(customer=customer, as_of=as_of)
    with database.dedicated() as conn:
        result = replay(read_history(conn), scope)
    balances = [
        {
            "customer_id": customer_id,
            "currency": currency,
            **{c: _json_number(getattr(bal, c)) for c in BALANCE_COLUMNS},
        }
        for (customer_id, currency), bal in sorted(result.balances().items())
    ]
    txns = [
        {
            "transaction_id": t.transaction_id,
            "customer_id": t.customer_id,
            "usage_id": t.usage_id,
            "amount": _json_number(t.amount),
            "currency": t.currency,
            "state": str(t.state),
            "attempts": t.attempts,
        }
        for t in sorted(result.transactions.values(), key=lambda t: (t.customer_id, t.metered_at))
    ]
    return {"as_of": as_of.isoformat(), "balances": balances, "transactions": txns}


def _json_number(value: Any) -> Any:
    """An exact amount as its decimal text (JSON numbers are floats to many readers)."""
    return f"{value:f}" if isinstance(value, Decimal) else value


_EXPORT = sql.SQL(
    "SELECT notification_id, originator_id, originator_version, topic, state, prev_hash, hash"
    " FROM {0} WHERE originator_id IN (SELECT originator_id FROM {0}"
    " WHERE originator_version = 1 AND topic = ANY(%s)"
    " AND convert_from(state, 'UTF8')::jsonb ->> 'customer_id' = %s)"
    " ORDER BY notification_id"
).format(sql.Identifier(EVENTS_TABLE))


def export_events(
    database: Database,
    customer: str,
    start: datetime | None = None,
    end: datetime | None = None,
) -> Iterator[dict[str, Any]]:
    """The customer's events (transactions and accounts) in log order, each with its
    position (notification id) and hashes; ``start``/``end`` bound the event times."""
    firsts = [TXN_TOPICS + "Metered", ACCOUNT_TOPICS + "Opened"]
    with database.dedicated() as conn, conn.cursor() as cur:
        cur.execute(_EXPORT, (firsts, customer))
        for position, originator_id, version, topic, state, prev_hash, digest in cur:
            data = orjson.loads(state)
            if any(type(v) is float for v in data.values()):  # orjson: an int beyond 64 bits
                data = json.loads(state)  # (the ledger writes no float)
            at = datetime.fromisoformat(unwrap(data["timestamp"]))
            if (start is not None and at < start) or (end is not None and at >= end):
                continue
            yield {
                "position": position,
                "aggregate_id": str(originator_id),
                "version": version,
                "event": topic.rpartition(":")[2],
                "timestamp": at.isoformat(),
                "data": {k: v for k, v in data.items() if k != "timestamp"},
                "prev_hash": prev_hash.hex() if prev_hash is not None else None,
                "hash": digest.hex() if digest is not None else None,
            }
