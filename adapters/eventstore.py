"""The PostgreSQL event store: eventsourcing's recorder, without the table lock.

eventsourcing's stock ``PostgresApplicationRecorder`` runs ``LOCK TABLE ... IN
EXCLUSIVE MODE`` and ``NOTIFY`` inside every insert so that a follower reading by
``notification_id`` never skips a row that commits late. That serialises every
writer. ``LedgerRecorder`` keeps the recorder's contract (same table, same
``(originator_id, originator_version)`` primary key that settles concurrent
writers, same ``IntegrityError``) but takes no lock: each row also stores the id of
the transaction that wrote it (``pg_current_xact_id()``), so a follower can read a
gap-free log by taking only rows whose transaction is older than every open one.
A trigger refuses UPDATE and DELETE on the events table: history is append-only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eventsourcing.persistence import InterfaceError, OperationalError, StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from eventsourcing.utils import retry
from psycopg import Cursor
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow
from psycopg.sql import SQL, Identifier

__all__ = ["LedgerRecorder", "postgres_env"]


class LedgerRecorder(PostgresApplicationRecorder):
    """Application recorder with lock-free appends (see the module docstring)."""

    def __init__(self, datastore: PostgresDatastore, *, events_table_name: str = "stored_events"):
        super().__init__(datastore, events_table_name=events_table_name)
        table = SQL("{0}.{1}").format(
            Identifier(self.datastore.schema), Identifier(self.events_table_name)
        )
        # Four arrays of plain types dump ~10x faster than one array of a composite type.
        self._insert_arrays = SQL(
            "INSERT INTO {0} (originator_id, originator_version, topic, state) "
            "SELECT * FROM unnest(%s::{1}[], %s::bigint[], %s::text[], %s::bytea[]) "
            "RETURNING notification_id"
        ).format(table, SQL(self.datastore.originator_id_type))
        self.sql_create_statements.extend(
            [
                SQL(
                    "ALTER TABLE {0} ADD COLUMN IF NOT EXISTS "
                    "xid xid8 NOT NULL DEFAULT pg_current_xact_id()"
                ).format(table),
                SQL(
                    "CREATE OR REPLACE FUNCTION {0}() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$BEGIN RAISE EXCEPTION 'billing-ledger events are append-only "
                    "(% refused on %)', TG_OP, TG_TABLE_NAME; END$$"
                ).format(Identifier(self.datastore.schema, "billing_events_append_only")),
                SQL(
                    "CREATE OR REPLACE TRIGGER events_append_only "
                    "BEFORE UPDATE OR DELETE OR TRUNCATE "
                    "ON {0} FOR EACH STATEMENT EXECUTE FUNCTION {1}()"
                ).format(table, Identifier(self.datastore.schema, "billing_events_append_only")),
            ]
        )

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """Insert in one plain transaction (no pipeline: nothing else to send first).

        The stock recorder pipelines the lock, the NOTIFY and the insert; with a
        multi-megabyte batch that pipeline stalled here with both ends waiting to read.
        """
        with self.datastore.get_connection() as conn, conn.transaction(), conn.cursor() as curs:
            self._insert_events(curs, stored_events, **kwargs)  # e.g. a process's tracking row
            if not stored_events:
                return []
            curs.execute(
                self._insert_arrays,
                (
                    [e.originator_id for e in stored_events],
                    [e.originator_version for e in stored_events],
                    [e.topic for e in stored_events],
                    [e.state for e in stored_events],
                ),
                binary=True,
            )
            return [row["notification_id"] for row in curs.fetchall()]

    def _lock_table(self, curs: Cursor[DictRow]) -> None:
        """No table lock: the primary key settles concurrent writers."""

    def _notify_channel(self, curs: Cursor[DictRow]) -> None:
        """No NOTIFY (it serialises commits too); followers poll by transaction id."""


def postgres_env(url: str, *, pool_size: int = 4, lock_free: bool = True) -> dict[str, str]:
    """eventsourcing's environment for the PostgreSQL at ``url`` (a libpq URI)."""
    params: dict[str, Any] = conninfo_to_dict(url)
    env = {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": str(params.get("dbname") or params.get("user") or "postgres"),
        "POSTGRES_HOST": str(params.get("host") or "127.0.0.1"),
        "POSTGRES_PORT": str(params.get("port") or "5432"),
        "POSTGRES_USER": str(params.get("user") or "postgres"),
        "POSTGRES_PASSWORD": str(params.get("password") or ""),
        "POSTGRES_POOL_SIZE": str(pool_size),
        "POSTGRES_CONNECT_TIMEOUT": "10",
    }
    if lock_free:
        env["APPLICATION_RECORDER_TOPIC"] = f"{__name__}:{LedgerRecorder.__name__}"
    return env
