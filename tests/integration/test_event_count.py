"""``tools.bench_charge.EventCount``: the benches' poll of how many transactions are
Charged, counted as the log grows. It must agree with a count of the whole table at
every poll, a transaction that commits after newer ones included, and never count a
row twice."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from eventsourcing.utils import get_topic

from adapters.bootstrap import migrate
from adapters.settings import Settings
from domain.transaction import BillingTransaction
from tools.bench_charge import EventCount, charged_count

pytestmark = pytest.mark.integration

CHARGED = get_topic(BillingTransaction.Charged)
METERED = get_topic(BillingTransaction.Metered)


def _append(conn: psycopg.Connection[object], topic: str, n: int = 1) -> None:
    for _ in range(n):
        conn.execute(
            "INSERT INTO billingledger_events (originator_id, originator_version, topic, state)"
            " VALUES (%s, 1, %s, '\\x7b7d')",
            (uuid.uuid4(), topic),
        )


def test_the_count_follows_the_log_a_late_commit_included_and_counts_each_row_once(
    settings: Settings,
) -> None:
    migrate(settings)
    url = settings.database_url
    with (
        psycopg.connect(url, autocommit=True) as writer,
        psycopg.connect(url) as slow,
        EventCount(settings) as count,
    ):
        assert count() == 0
        _append(writer, CHARGED, 3)
        _append(writer, METERED, 2)
        assert count() == 3

        _append(slow, CHARGED)  # open: its xid is older than the rows written after it
        slow.execute("SELECT pg_current_xact_id()")
        _append(writer, CHARGED, 2)
        assert count() == 5  # the open one is not visible yet
        assert count() == 5
        slow.commit()  # commits after newer rows: below none of the horizons passed
        assert count() == 6
        assert count() == 6  # counted once
        _append(writer, CHARGED, 2)
        assert count() == 8 == charged_count(settings)
    with EventCount(settings, METERED) as metered:  # any topic
        assert metered() == 2
