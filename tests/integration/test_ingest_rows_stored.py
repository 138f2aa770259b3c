"""The ingest's fast path stores what the events path stores, byte for byte (issue 14).

The same batches go to two ledgers on two databases under a pinned clock: one as
shipped (a batch's first attempt saves its new transactions as ready rows,
``store.ingest_rows``), one with the fast path off (every transaction saved as
events). Their whole event tables, hashes included, are then the same row for row:
for every meter and currency of the example price list, customers with and without
a limit, a batch the limit refuses in part (events on both), and a redelivered
batch that loses its first attempt to the store's key and is decided again.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, ClassVar

import eventsourcing.domain
import psycopg
import pytest
from psycopg import sql

from adapters.bootstrap import migrate, open_ledger
from adapters.settings import Settings
from domain.metering import Metering
from domain.price_book import PRICE_BOOK_ID
from domain.transaction import Source
from domain.usage import UsageRecord
from store.ledger import BillingLedger
from store.schema import EVENTS_TABLE

pytestmark = pytest.mark.integration

PINNED = datetime(2026, 12, 3, 9, 30, 1, 123456, tzinfo=UTC)


class EventsOnlyLedger(BillingLedger):
    name = BillingLedger.name  # the same tables
    fast_rows: ClassVar[bool] = False


@pytest.fixture
def two_databases(pg_server_url: str) -> Iterator[tuple[str, str]]:
    names = [f"t_{uuid.uuid4().hex[:12]}" for _ in range(2)]
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    urls = [psycopg.conninfo.make_conninfo(pg_server_url, dbname=n) for n in names]
    for url in urls:
        migrate(Settings(database_url=url))
    yield urls[0], urls[1]
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        for name in names:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _batches(settings: Settings) -> list[list[Metering]]:
    meters = sorted(settings.load_prices().prices.items())
    records = [
        UsageRecord(
            usage_id=f"r-{i}",
            customer_id=("acme", "globex", "initech")[i % 3],
            meter=meter,
            quantity=Decimal(("1520", "0.000001", "7.25", "1E+3")[i % 4]),
            occurred_at=datetime(2026, 11 + i % 2, 2 + i % 5, 10, 15, tzinfo=UTC),
            currency=price.currency if i % 2 else None,
        )
        for i, (meter, price) in enumerate(meters * 6)
    ]
    metering = [Metering(r, Source("usage", i % 4, i)) for i, r in enumerate(records)]
    third = len(metering) // 3
    return [
        metering[:third],  # every customer, every meter: the fast path
        metering[third : 2 * third],  # initech's limit refuses part of it: events
        [*metering[third - 5 : third], *metering[2 * third :]],  # redelivered: retried
    ]


def _stored(url: str) -> list[tuple[Any, ...]]:
    """The rows the ledger stored (not the price book's: migrate started it, at its own
    time, before the ingest)."""
    with psycopg.connect(url) as conn:
        return conn.execute(
            sql.SQL(
                "SELECT originator_id, originator_version, topic, state, prev_hash, hash"
                " FROM {} WHERE originator_id <> %s ORDER BY notification_id"
            ).format(sql.Identifier(EVENTS_TABLE)),
            (PRICE_BOOK_ID,),
        ).fetchall()


def test_the_fast_path_stores_the_very_rows_the_events_path_stores(
    two_databases: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eventsourcing.domain, "datetime_now_with_tzinfo", lambda: PINNED)
    fast_url, events_url = two_databases
    outcomes = []
    for url, kind in ((fast_url, BillingLedger), (events_url, EventsOnlyLedger)):
        settings = Settings(database_url=url)
        with open_ledger(settings) as shipped:
            ledger = kind(shipped.prices, env=dict(shipped.env), periods=shipped.periods)
        with ledger:
            ledger.set_spend_limit("globex", "USD", 10**12)  # a limit that grants it all
            first, *rest = _batches(settings)
            decided = [ledger.record_usage(first)]
            ledger.set_spend_limit("initech", "USD", 2)  # refuses most of what follows
            decided += [ledger.record_usage(b) for b in rest]
            outcomes.append(
                [
                    (len(d.transactions), len(d.refused), len(d.duplicates), len(d.rejected))
                    for d in decided
                ]
            )
            outcomes.append([ledger.last_save.attempts])
    assert outcomes[0] == outcomes[2]
    (first, refusing, redelivered) = outcomes[0]
    assert first[1] == 0 and refusing[1] > 0 and redelivered[2] == 5  # every case happened
    assert outcomes[1] == [2]  # the redelivered batch lost its first attempt on the fast side
    fast, events = _stored(fast_url), _stored(events_url)
    assert len(fast) > 150
    assert fast == events
