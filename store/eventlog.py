"""The event store's log in commit order, read gap-free without a lock.

``LedgerRecorder`` stores, with every event, the id of the transaction that wrote
it (``xid``). A follower takes only rows whose transaction is older than every
transaction still open (``pg_snapshot_xmin``), ordered by ``(xid, notification_id)``:
a row that commits late always has an xid at or above that horizon, so it is read
after the rows before it and never skipped. The relay and the projectors follow the
log with ``read_after``; a position is the ``(xid, notification_id)`` of the last row
a follower handled.

A follower of a few topics (``read_topics_after``: the credit projections) reads only
their rows, and moves past the others without reading them: its position goes to the
last visible row of the log, whatever its topic, once nothing of its topics is left
before it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple
from uuid import UUID

import psycopg
from eventsourcing.persistence import Notification
from psycopg import sql

from store.schema import EVENTS_TABLE

__all__ = [
    "START",
    "LogRow",
    "Position",
    "copy_log",
    "follow",
    "read_after",
    "read_created",
    "read_topic",
    "read_topics_after",
    "relay_position",
    "state_json",
    "store_relay_position",
]

log = logging.getLogger(__name__)


class Position(NamedTuple):
    """Where a follower is in the log: the last row it handled."""

    xid: str
    notification_id: int


START = Position("0", 0)


class LogRow(NamedTuple):
    """One stored event, with the transaction that wrote it."""

    xid: str
    notification_id: int
    originator_id: UUID
    originator_version: int
    topic: str
    state: bytes

    @property
    def position(self) -> Position:
        return Position(self.xid, self.notification_id)

    def json(self) -> Any:
        """The stored state read as JSON (``state_json``)."""
        return state_json(self.state)

    def notification(self) -> Notification:
        """The row as eventsourcing's ``Notification`` (what its recorder returns),
        for the application's own mapper to decode."""
        return Notification(
            id=self.notification_id,
            originator_id=self.originator_id,
            originator_version=self.originator_version,
            topic=self.topic,
            state=bytes(self.state),
        )


def state_json(state: bytes | None) -> Any:
    """A stored event's state read as JSON, or None when it is not JSON (a follower never
    stops on a row, whatever a hand or an old build wrote)."""
    try:
        return json.loads(bytes(state)) if state is not None else None
    except ValueError:
        return None


# The text of the xid is named xid_text: an ORDER BY xid would otherwise sort by this
# output column, as text ('1000' < '985'), and skip rows past the stored position.
_COLUMNS = sql.SQL(
    "xid::text AS xid_text, notification_id, originator_id, originator_version, topic, state"
)

_READ_AFTER = sql.SQL(
    "SELECT {} FROM {} WHERE (xid, notification_id) > (%s::xid8, %s)"
    " AND xid < pg_snapshot_xmin(pg_current_snapshot())"
    " ORDER BY xid, notification_id LIMIT %s"
).format(_COLUMNS, sql.Identifier(EVENTS_TABLE))

# One statement, so one snapshot: the rows of the topics (kind 0) and the last visible
# row of the log (kind 1), read under the same horizon. A position moved to that last
# row skips nothing: every row of the topics before it was visible to the same read.
_READ_TOPICS_AFTER = sql.SQL(
    "SELECT xid::text AS xid_text, notification_id, originator_id, originator_version, topic,"
    " state FROM ((SELECT 0 AS kind, xid, notification_id, originator_id, originator_version,"
    " topic, state FROM {events} WHERE (xid, notification_id) > (%(xid)s::xid8, %(id)s)"
    " AND xid < pg_snapshot_xmin(pg_current_snapshot()) AND topic = ANY(%(topics)s)"
    " ORDER BY xid, notification_id LIMIT %(limit)s)"
    " UNION ALL (SELECT 1, xid, notification_id, NULL, NULL, NULL, NULL FROM {events}"
    " WHERE (xid, notification_id) > (%(xid)s::xid8, %(id)s)"
    " AND xid < pg_snapshot_xmin(pg_current_snapshot())"
    " ORDER BY xid DESC, notification_id DESC LIMIT 1)) AS r"
    " ORDER BY kind, xid, notification_id"
).format(events=sql.Identifier(EVENTS_TABLE))

_RELAY_POSITION = "SELECT xid::text, notification_id FROM billing.relay_position WHERE name = %s"
_STORE_RELAY_POSITION = (
    "INSERT INTO billing.relay_position (name, xid, notification_id)"
    " VALUES (%s, %s::xid8, %s) ON CONFLICT (name) DO UPDATE"
    " SET xid = EXCLUDED.xid, notification_id = EXCLUDED.notification_id"
)

_READ_CREATED = sql.SQL(
    "SELECT {} FROM {} WHERE originator_id = ANY(%s) AND originator_version = 1"
).format(_COLUMNS, sql.Identifier(EVENTS_TABLE))


_READ_TOPIC = sql.SQL(
    "SELECT {} FROM {} WHERE originator_id = ANY(%s) AND topic = %s ORDER BY originator_version"
).format(_COLUMNS, sql.Identifier(EVENTS_TABLE))


def read_after(conn: psycopg.Connection[Any], position: Position, limit: int) -> list[LogRow]:
    """The next ``limit`` visible rows after ``position``, in commit order."""
    rows = conn.execute(_READ_AFTER, (position.xid, position.notification_id, limit)).fetchall()
    return [LogRow(*row) for row in rows]


def read_topics_after(
    conn: psycopg.Connection[Any], position: Position, limit: int, topics: Iterable[str]
) -> tuple[list[LogRow], Position]:
    """The next ``limit`` visible rows of ``topics`` after ``position``, in commit order,
    and the position to go on from: the last of them when there are ``limit``, else the
    last visible row of the log (every row of the topics up to it is among them)."""
    params = {
        "xid": position.xid,
        "id": position.notification_id,
        "topics": sorted(set(topics)),
        "limit": limit,
    }
    found = conn.execute(_READ_TOPICS_AFTER, params).fetchall()
    rows = [LogRow(*row) for row in found if row[4] is not None]
    if len(rows) == limit or len(found) == len(rows):
        return rows, rows[-1].position if rows else position
    return rows, Position(str(found[-1][0]), int(found[-1][1]))


def relay_position(conn: psycopg.Connection[Any], name: str) -> Position:
    """Where the relay (or lane) ``name`` stands in ``billing.relay_position`` (the start
    when it has never stored a position)."""
    row = conn.execute(_RELAY_POSITION, (name,)).fetchone()
    return Position(str(row[0]), int(row[1])) if row else START


def store_relay_position(conn: psycopg.Connection[Any], name: str, position: Position) -> None:
    """Store where the relay (or lane) ``name`` stands."""
    conn.execute(_STORE_RELAY_POSITION, (name, position.xid, position.notification_id))


def read_created(conn: psycopg.Connection[Any], originator_ids: Iterable[UUID]) -> list[LogRow]:
    """The first event (version 1) of each of these aggregates that has one."""
    rows = conn.execute(_READ_CREATED, (list(set(originator_ids)),)).fetchall()
    return [LogRow(*row) for row in rows]


def read_topic(
    conn: psycopg.Connection[Any], originator_ids: Iterable[UUID], topic: str
) -> list[LogRow]:
    """Every event of ``topic`` of these aggregates, each aggregate's in version order."""
    rows = conn.execute(_READ_TOPIC, (list(set(originator_ids)), topic)).fetchall()
    return [LogRow(*row) for row in rows]


def follow(
    pump: Callable[[], int],
    stop: threading.Event,
    *,
    name: str,
    idle_wait_s: float,
    on_round: Callable[[], None] = lambda: None,
) -> None:
    """Call ``pump`` until ``stop``: at once while it finds work, after ``idle_wait_s``
    when it finds none, and after a second when the database cannot be reached.
    ``on_round`` is called at every turn (the heartbeat's proof the loop is not hung)."""
    while not stop.is_set():
        on_round()
        try:
            done = pump()
        except psycopg.OperationalError as exc:  # the database went away: retry
            log.warning("%s cannot reach the database: %s", name, exc)
            stop.wait(1.0)
            continue
        if done == 0:
            stop.wait(idle_wait_s)


_COPY_LOG = sql.SQL(
    "COPY (SELECT uuid_send(originator_id), originator_version, topic, state,"
    " xid::text::bigint AS xid_number, notification_id FROM {}"
    " WHERE (xid, notification_id) > (%s::text::xid8, %s) {}"
    " ORDER BY xid, notification_id) TO STDOUT (FORMAT BINARY)"
)
_COPY_LOG_TYPES = ["bytea", "int8", "text", "bytea", "int8", "int8"]


def copy_log(
    conn: psycopg.Connection[Any], after: tuple[int, int] = (0, 0), *, gap_free: bool = True
) -> Iterator[tuple[bytes, int, str, bytes, int, int]]:
    """The log after ``after`` (an ``(xid, notification_id)``) in commit order, as one
    binary COPY: ``(id bytes, version, topic, state, xid, notification_id)`` rows.

    ``gap_free``: only rows older than every open transaction (what the anchor signs:
    no row can commit before them later); else every row the snapshot sees (the audit).
    """
    horizon = sql.SQL("AND xid < pg_snapshot_xmin(pg_current_snapshot())" if gap_free else "")
    query = _COPY_LOG.format(sql.Identifier(EVENTS_TABLE), horizon)
    with conn.cursor() as cur, cur.copy(query, (str(after[0]), after[1])) as copy:
        copy.set_types(_COPY_LOG_TYPES)
        yield from copy.rows()
