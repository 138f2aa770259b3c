"""``store.eventlog.read_after``: the log in commit (xid) order, gap-free, in batches."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from adapters.bootstrap import migrate
from adapters.settings import Settings
from store.eventlog import START, Position, read_after, read_topics_after
from store.schema import EVENTS_TABLE as EVENTS

pytestmark = pytest.mark.integration


def test_batches_follow_numeric_xid_order_across_a_power_of_ten(settings: Settings) -> None:
    """xids 98, 99, 100, 101 must come in that order (as text, '100' < '98')."""
    migrate(settings)
    xids = [100, 98, 101, 99]  # inserted out of order, as concurrent writers commit
    with psycopg.connect(settings.database_url) as conn:
        for xid in xids:
            conn.execute(
                f"INSERT INTO {EVENTS} (originator_id, originator_version, topic, state, xid)"  # noqa: S608
                " VALUES (%s, 1, 't', '\\x7b7d', %s::text::xid8)",
                (uuid.uuid4(), xid),
            )
        conn.commit()
        read: list[str] = []
        position = START
        while rows := read_after(conn, position, limit=2):
            read += [r.xid for r in rows if r.topic == "t"]  # not the price book's
            position = rows[-1].position
    assert read == ["98", "99", "100", "101"]


def _insert(conn: psycopg.Connection, topic: str) -> None:
    conn.execute(
        f"INSERT INTO {EVENTS} (originator_id, originator_version, topic, state)"  # noqa: S608
        " VALUES (%s, 1, %s, '\\x7b7d')",
        (uuid.uuid4(), topic),
    )


def _last_visible(conn: psycopg.Connection) -> Position:
    row = conn.execute(
        f"SELECT xid::text, notification_id FROM {EVENTS}"  # noqa: S608
        " ORDER BY xid DESC, notification_id DESC LIMIT 1"
    ).fetchone()
    assert row is not None
    return Position(row[0], row[1])


def test_a_follower_of_some_topics_reads_theirs_alone_and_moves_past_the_others(
    settings: Settings,
) -> None:
    migrate(settings)
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        for topic in ("a", "b", "a", "b", "b"):
            _insert(conn, topic)
        rows, position = read_topics_after(conn, START, 10, ["a"])
        assert [r.topic for r in rows] == ["a", "a"]
        assert position == _last_visible(conn)  # past the last "b", nothing of "a" left
        assert read_topics_after(conn, position, 10, ["a"]) == ([], position)
        first, at = read_topics_after(conn, START, 1, ["a"])  # a full batch: its last row
        assert [r.topic for r in first] == ["a"] and at == first[0].position
        rest, _ = read_topics_after(conn, at, 1, ["a"])
        assert [r.position > at for r in rest] == [True]
        _insert(conn, "a")
        later, moved = read_topics_after(conn, position, 10, ["a", "c"])
        assert [r.topic for r in later] == ["a"] and moved == later[0].position


def test_a_follower_of_some_topics_never_moves_past_a_row_not_yet_committed(
    settings: Settings,
) -> None:
    """A row of its topic written by a transaction still open, then a row of another
    topic committed after it: the follower stops before the open one, and reads it once
    it commits."""
    migrate(settings)
    with (
        psycopg.connect(settings.database_url, autocommit=True) as conn,
        psycopg.connect(settings.database_url) as slow,
    ):
        _, position = read_topics_after(conn, START, 10, ["a"])
        _insert(slow, "a")  # open: its xid holds the horizon back
        _insert(conn, "b")
        rows, held = read_topics_after(conn, position, 10, ["a"])
        assert rows == [] and held == position
        slow.commit()
        rows, moved = read_topics_after(conn, held, 10, ["a"])
        assert [r.topic for r in rows] == ["a"] and moved == _last_visible(conn)
