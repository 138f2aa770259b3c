"""The migration runner: ``migrate`` applies every pending migration in order, each
once, and records it in ``billing.schema_migrations`` (made here, before the first).

Rules the runner keeps:

* Each migration runs in its own transaction, together with its row in
  ``billing.schema_migrations``: applied entirely and recorded, or not at all.
* Exactly once, even with several ``migrate`` running at once: each transaction first
  takes ``pg_advisory_xact_lock(MIGRATE_LOCK)`` (only ``migrate`` ever takes it; workers
  take no lock), then reads what is applied and applies the next pending migration.
* An applied migration whose file changed since (another checksum) is refused, and so
  is a database that has applied a migration this build does not know: both mean the
  code and the database disagree about the schema, which no retry can fix.
* Statements wait at most ``lock_timeout`` for a lock (a migration that needs a strong
  lock on a busy table must not queue every writer behind it for long); when it runs
  out, or a deadlock is detected, the transaction rolls back and is retried after a
  jittered, growing pause, with a log line saying so.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql

from store.errors import MigrationChanged, MigrationLocked, SchemaAhead
from store.migrations.status import (
    MIGRATIONS_TABLE,
    AppliedMigration,
    Migration,
    SchemaState,
    SchemaStatus,
    migrations,
    read_applied,
)
from store.schema import SCHEMA

__all__ = ["MIGRATE_LOCK", "migrate", "retry_delays"]

log = logging.getLogger("store.migrations")  # the package's logger, as operators know it

# The advisory lock key of ``migrate`` (any constant bigint; "billing-ledger migrate").
MIGRATE_LOCK = 0x62696C6C_6D696772

# The runner's own bookkeeping, made before the first migration (as every migration
# tool makes its history table); its shape never changes.
_CREATE_TABLE = sql.SQL(
    """
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {table} (
    number     integer          PRIMARY KEY CHECK (number > 0),
    name       text             NOT NULL,
    checksum   text             NOT NULL,
    applied_at timestamptz      NOT NULL DEFAULT clock_timestamp(),
    duration_s double precision NOT NULL
);
"""
).format(schema=sql.Identifier(SCHEMA), table=MIGRATIONS_TABLE)
_INSERT_APPLIED = sql.SQL(
    "INSERT INTO {} (number, name, checksum, duration_s) VALUES (%s, %s, %s, %s)"
    " RETURNING applied_at"
).format(MIGRATIONS_TABLE)


def retry_delays(
    attempts: int,
    *,
    base_s: float = 0.5,
    max_s: float = 30.0,
    rand: Callable[[], float] = random.random,
) -> list[float]:
    """Pauses between ``attempts`` tries: full jitter over a doubling ceiling."""
    return [rand() * min(max_s, base_s * 2**i) for i in range(max(attempts - 1, 0))]


def migrate(
    conn: psycopg.Connection[Any],
    known: Sequence[Migration] | None = None,
    *,
    lock_timeout_s: float = 5.0,
    attempts: int = 10,
    on_applied: Callable[[AppliedMigration], None] = lambda applied: None,
    sleep: Callable[[float], None] = time.sleep,
) -> list[AppliedMigration]:
    """Apply every pending migration in order, each once, in its own transaction.

    ``conn`` must be in autocommit mode (each migration opens its own transaction).
    Returns what this call applied (another ``migrate`` may have applied the rest).
    Raises MigrationChanged or SchemaAhead before applying anything when the database
    disagrees with ``known``, and MigrationLocked when a migration's locks could not
    be taken in ``attempts`` tries.
    """
    if not conn.autocommit:
        raise ValueError("migrate needs a connection in autocommit mode")
    todo = tuple(migrations() if known is None else known)
    with conn.transaction():
        _lock(conn)
        conn.execute(_CREATE_TABLE)
    applied: list[AppliedMigration] = []
    while True:
        done = _apply_next(conn, todo, lock_timeout_s, attempts, sleep)
        if done is None:
            return applied
        log.info(
            "applied migration %s in %.2f s", done.label, done.duration_s,
            extra={"step": "migrate", "status": "applied", "migration": done.number},
        )  # fmt: skip
        applied.append(done)
        on_applied(done)


def _apply_next(
    conn: psycopg.Connection[Any],
    known: tuple[Migration, ...],
    lock_timeout_s: float,
    attempts: int,
    sleep: Callable[[float], None],
) -> AppliedMigration | None:
    """Apply the next pending migration (None: nothing is pending), retrying lock waits."""
    delays = retry_delays(attempts)
    for attempt in range(1, attempts + 1):
        try:
            return _apply_next_once(conn, known, lock_timeout_s)
        except (pgerrors.LockNotAvailable, pgerrors.DeadlockDetected) as exc:
            label = _next_label(conn, known)
            if attempt == attempts:
                raise MigrationLocked(
                    f"migration {label}: could not take its locks in {attempts} attempts"
                    f" (lock_timeout {lock_timeout_s:g} s): {_first_line(exc)}; a long"
                    " transaction holds a lock on a table it changes"
                ) from exc
            pause = delays[attempt - 1]
            log.warning(
                "migration %s: %s (lock_timeout %g s, attempt %d of %d); rolled back,"
                " retrying in %.1f s",
                label, _first_line(exc), lock_timeout_s, attempt, attempts, pause,
                extra={"step": "migrate", "status": "retry", "error_code": type(exc).__name__},
            )  # fmt: skip
            sleep(pause)
    return None  # attempts < 1: nothing tried


def _apply_next_once(
    conn: psycopg.Connection[Any], known: tuple[Migration, ...], lock_timeout_s: float
) -> AppliedMigration | None:
    with conn.transaction():
        _lock(conn)
        status = SchemaStatus(known, read_applied(conn))
        if status.state in (SchemaState.AHEAD, SchemaState.CHANGED):
            error = SchemaAhead if status.state is SchemaState.AHEAD else MigrationChanged
            raise error(status.problem())
        if not status.pending:
            return None
        migration = status.pending[0]
        # SET LOCAL: only this transaction's statements give up on a lock after this long.
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (_ms(lock_timeout_s),))
        started = time.monotonic()
        conn.execute(migration.sql.encode())  # bytes: run as written, several statements
        duration = time.monotonic() - started
        row = conn.execute(
            _INSERT_APPLIED,
            (migration.number, migration.name, migration.checksum, duration),
        ).fetchone()
    return AppliedMigration(
        migration.number, migration.name, migration.checksum, row[0] if row else None, duration
    )


def _ms(seconds: float) -> str:
    return f"{max(round(seconds * 1000), 1)}ms"


def _lock(conn: psycopg.Connection[Any]) -> None:
    """Wait for any other ``migrate``: only migrate takes this lock, never a worker."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))


def _next_label(conn: psycopg.Connection[Any], known: tuple[Migration, ...]) -> str:
    try:
        pending = SchemaStatus(known, read_applied(conn)).pending
    except psycopg.Error:
        return "?"
    return pending[0].label if pending else "?"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
