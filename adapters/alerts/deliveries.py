"""The alert webhooks' tables: endpoints, and one delivery per endpoint and alert.

``billing.webhook_endpoints`` and ``billing.webhook_deliveries`` (migration 9). A
delivery's id is derived from its endpoint and its alert (``delivery_id``), and the pair
is unique, so the fan-out of a redelivered alert adds nothing (``fan_out``).

**Claims without locks.** A worker takes a due delivery with one conditional UPDATE
(``claim``): it bumps the row's ``version`` and moves ``next_try_at`` past the request's
deadline (the lease), only if the version is still the one it read and the row is still
due. It commits at once and holds nothing while the request runs; it then records the
outcome only while the version is still its claim (``record``). A worker that dies
mid-request leaves a row that becomes due again when the lease passes, and another
worker sends it again: delivery is at least once, never lost, and a receiver
deduplicates by the event id. Two live workers do not send the same attempt twice: the
second claim finds the version moved. Claims and outcomes commit without waiting for
the WAL flush (``_relaxed``): one lost in a crash of the database only sends a delivery
again; the fan-out waits for it, since the alerts' offsets are committed after it.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID, uuid4

import psycopg
from psycopg.rows import class_row

from adapters.alerts.messages import Alert
from domain.ids import uuid5

__all__ = [
    "Attempted",
    "Delivery",
    "DueDelivery",
    "Endpoint",
    "add_endpoint",
    "claim",
    "deliveries",
    "delivery_id",
    "due",
    "endpoints",
    "fan_out",
    "record",
    "remove_endpoint",
    "replay",
]

T = TypeVar("T")

DELIVERY_NAMESPACE = UUID("1e9a6c53-8b27-5d04-a3f1-6c0e8b2d7f95")
SECRET_PREFIX = "whsec_"  # noqa: S105 (the prefix of every generated secret)


@dataclass(frozen=True)
class Endpoint:
    endpoint_id: UUID
    url: str
    events: list[str]
    created_at: datetime
    removed_at: datetime | None


@dataclass(frozen=True)
class Delivery:
    """A delivery as ``webhooks deliveries`` shows it."""

    delivery_id: UUID
    endpoint_id: UUID
    event_id: UUID
    event_type: str
    status: str
    attempts: int
    last_status: int | None
    last_error: str | None
    next_try_at: datetime
    created_at: datetime
    delivered_at: datetime | None


@dataclass(frozen=True)
class DueDelivery:
    """A delivery due now, with what sending it needs."""

    delivery_id: UUID
    endpoint_id: UUID
    event_id: UUID
    version: int
    attempts: int
    retry_from: datetime
    payload: bytes
    url: str
    secret: str


def delivery_id(endpoint_id: UUID, event_id: str) -> UUID:
    return uuid5(DELIVERY_NAMESPACE, f"{endpoint_id}:{event_id}")


def add_endpoint(
    conn: psycopg.Connection[Any], url: str, events: Sequence[str]
) -> tuple[UUID, str]:
    """Register an endpoint (its URL checked by the caller); its id and new secret."""
    endpoint, secret = uuid4(), SECRET_PREFIX + secrets.token_urlsafe(32)
    conn.execute(
        "INSERT INTO billing.webhook_endpoints (endpoint_id, url, events, secret)"
        " VALUES (%s, %s, %s, %s)",
        (endpoint, url, list(events), secret),
    )
    return endpoint, secret


def endpoints(conn: psycopg.Connection[Any], *, removed: bool = False) -> list[Endpoint]:
    return _rows(
        conn,
        Endpoint,
        "SELECT endpoint_id, url, events, created_at, removed_at"
        " FROM billing.webhook_endpoints WHERE %s OR removed_at IS NULL ORDER BY created_at",
        (removed,),
    )


def remove_endpoint(conn: psycopg.Connection[Any], endpoint_id: UUID) -> bool:
    """Stop sending to an endpoint (its pending deliveries are dropped as failed)."""
    found = conn.execute(
        "UPDATE billing.webhook_endpoints SET removed_at = now()"
        " WHERE endpoint_id = %s AND removed_at IS NULL",
        (endpoint_id,),
    ).rowcount
    conn.execute(
        "UPDATE billing.webhook_deliveries SET status = 'failed', version = version + 1,"
        " last_error = 'endpoint removed' WHERE endpoint_id = %s AND status = 'pending'",
        (endpoint_id,),
    )
    return found == 1


def fan_out(conn: psycopg.Connection[Any], alerts: Sequence[Alert]) -> int:
    """A pending delivery of each alert to each live endpoint that wants its type (none
    again for a pair that has one); how many were added."""
    live = conn.execute(
        "SELECT endpoint_id, events FROM billing.webhook_endpoints WHERE removed_at IS NULL"
    ).fetchall()
    rows = [
        (delivery_id(endpoint, alert.id), endpoint, alert.id, alert.type, alert.body)
        for alert in alerts
        for endpoint, events in live
        if alert.type in events
    ]
    if not rows:
        return 0
    added = conn.execute(
        "INSERT INTO billing.webhook_deliveries"
        " (delivery_id, endpoint_id, event_id, event_type, payload)"
        " SELECT * FROM unnest(%s::uuid[], %s::uuid[], %s::uuid[], %s::text[], %s::bytea[])"
        " ON CONFLICT (endpoint_id, event_id) DO NOTHING",
        tuple(list(column) for column in zip(*rows, strict=True)),
    ).rowcount
    return max(added, 0)


def due(
    conn: psycopg.Connection[Any], *, limit: int, busy: Sequence[UUID] = ()
) -> list[DueDelivery]:
    """Pending deliveries due now, oldest due first, skipping the ``busy`` endpoints."""
    return _rows(
        conn,
        DueDelivery,
        (
            "SELECT d.delivery_id, d.endpoint_id, d.event_id, d.version, d.attempts,"
            " d.retry_from, d.payload, e.url, e.secret"
            " FROM billing.webhook_deliveries d"
            " JOIN billing.webhook_endpoints e USING (endpoint_id)"
            " WHERE d.status = 'pending' AND d.next_try_at <= now() AND e.removed_at IS NULL"
            " AND NOT d.endpoint_id = ANY(%s::uuid[])"
            " ORDER BY d.next_try_at LIMIT %s"
        ),
        (list(busy), limit),
    )


def _rows(conn: psycopg.Connection[Any], kind: type[T], query: str, params: Any) -> list[T]:
    with conn.cursor(row_factory=class_row(kind)) as cur:
        cur.execute(query, params)
        return cur.fetchall()


def claim(
    conn: psycopg.Connection[Any], found: Sequence[DueDelivery], lease: timedelta
) -> list[DueDelivery]:
    """Take each of ``found`` for one attempt, in one statement (see the module
    docstring); those another worker took first are left out. A claim is then the
    delivery's ``version + 1``."""
    if not found:
        return []
    _relaxed(conn)
    taken = {
        row[0]
        for row in conn.execute(
            "UPDATE billing.webhook_deliveries d"
            " SET version = d.version + 1, next_try_at = now() + %s"
            " FROM unnest(%s::uuid[], %s::int[]) AS c (delivery_id, version)"
            " WHERE d.delivery_id = c.delivery_id AND d.version = c.version"
            " AND d.status = 'pending' AND d.next_try_at <= now()"
            " RETURNING d.delivery_id",
            (lease, [d.delivery_id for d in found], [d.version for d in found]),
        ).fetchall()
    }
    return [d for d in found if d.delivery_id in taken]


@dataclass(frozen=True)
class Attempted:
    """An attempt's outcome, to record under its claim: ``status`` delivered, pending
    (retry in ``next_try``) or failed."""

    delivery: DueDelivery
    status: str
    http_status: int | None
    error: str
    next_try: timedelta


def record(conn: psycopg.Connection[Any], outcomes: Sequence[Attempted]) -> set[UUID]:
    """Record attempts' outcomes, each only while the delivery's version is still its
    claim, in one statement; the deliveries recorded (one left out lost its claim:
    another worker's attempt stands)."""
    if not outcomes:
        return set()
    _relaxed(conn)
    rows = conn.execute(
        "UPDATE billing.webhook_deliveries d SET status = o.status,"
        " attempts = d.attempts + 1, version = d.version + 1, last_status = o.http_status,"
        " last_error = o.error, next_try_at = now() + o.next_try,"
        " delivered_at = CASE WHEN o.status = 'delivered' THEN now() END"
        " FROM unnest(%s::uuid[], %s::int[], %s::text[], %s::int[], %s::text[],"
        " %s::interval[]) AS o (delivery_id, version, status, http_status, error, next_try)"
        " WHERE d.delivery_id = o.delivery_id AND d.version = o.version"
        " RETURNING d.delivery_id",
        (
            [o.delivery.delivery_id for o in outcomes],
            [o.delivery.version + 1 for o in outcomes],
            [o.status for o in outcomes],
            [o.http_status for o in outcomes],
            [_storable(o.error) or None for o in outcomes],
            [o.next_try for o in outcomes],
        ),
    ).fetchall()
    return {row[0] for row in rows}


def _storable(text: str) -> str:
    """``text`` as PostgreSQL can store it: a NUL (which a receiver's answer may hold)
    becomes U+FFFD."""
    return text.replace("\x00", "\ufffd")


def _relaxed(conn: psycopg.Connection[Any]) -> None:
    """This transaction commits without waiting for its WAL flush: a claim or an
    outcome lost in a crash of the database only makes a delivery due again, and it is
    sent again (at least once, deduplicated by the receiver). The fan-out, which the
    alerts' offsets wait for, is never relaxed."""
    conn.execute("SET LOCAL synchronous_commit TO off")


def deliveries(
    conn: psycopg.Connection[Any], *, endpoint: UUID | None = None, limit: int = 50
) -> list[Delivery]:
    return _rows(
        conn,
        Delivery,
        "SELECT delivery_id, endpoint_id, event_id, event_type, status, attempts,"
        " last_status, last_error, next_try_at, created_at, delivered_at"
        " FROM billing.webhook_deliveries WHERE %s::uuid IS NULL OR endpoint_id = %s"
        " ORDER BY created_at DESC, delivery_id LIMIT %s",
        (endpoint, endpoint, limit),
    )


def replay(conn: psycopg.Connection[Any], some_id: UUID) -> int:
    """Send again (now, with a fresh retry horizon) the delivery with this id, or every
    delivery of the alert with this id, to the endpoints still live; how many."""
    return max(
        conn.execute(
            "UPDATE billing.webhook_deliveries d SET status = 'pending', next_try_at = now(),"
            " retry_from = now(), version = version + 1"
            " FROM billing.webhook_endpoints e WHERE e.endpoint_id = d.endpoint_id"
            " AND e.removed_at IS NULL AND (d.delivery_id = %s OR d.event_id = %s)",
            (some_id, some_id),
        ).rowcount,
        0,
    )
