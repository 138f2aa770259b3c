"""A database as an earlier version of billing-ledger left it: before migrations, every
process ran ``prepare()``, which let eventsourcing create its tables (``CREATE_TABLE=y``,
the stock recorder's DDL) and then ran the DDL of ``legacy_prepare.sql`` (copied from
commit 56a5b80). Tests use it to check that migration 1 adopts such a database."""

from __future__ import annotations

from pathlib import Path

import psycopg

from adapters.settings import Settings
from store.ledger import BillingLedger
from store.recorder import postgres_env

__all__ = ["LEGACY_SQL", "legacy_prepare"]

LEGACY_SQL = (Path(__file__).parent / "legacy_prepare.sql").read_text(encoding="utf-8")


def legacy_prepare(settings: Settings) -> None:
    """Make the schema the way ``prepare()`` did before migrations (no version table)."""
    env = {**postgres_env(settings.database_url, lock_free=False), "CREATE_TABLE": "y"}
    BillingLedger(settings.load_prices(), env=env).close()  # eventsourcing's own tables
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(LEGACY_SQL.encode())
