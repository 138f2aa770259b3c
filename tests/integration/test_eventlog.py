"""``store.eventlog.read_after``: the log in commit (xid) order, gap-free, in batches."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from adapters.bootstrap import migrate
from adapters.settings import Settings
from store.eventlog import START, read_after
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
