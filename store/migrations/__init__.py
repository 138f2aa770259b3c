"""Schema migrations: the only way the database's schema changes, run once by ``migrate``.

Until migrations, every process ran the schema's DDL at start, and ``ALTER TABLE ...
ADD COLUMN IF NOT EXISTS`` takes an ACCESS EXCLUSIVE lock on the events table even
when the column exists: a starting worker stopped every event write of the fleet, and
deadlocked with the writers' inserts (issue 11). Now the schema is a numbered list of
SQL files in this package (``0001_initial.sql``, ...), applied in order by
``billing-ledger migrate`` and recorded in ``billing.schema_migrations`` (number, name,
SHA-256 of the file, when, how long). Workers run no DDL: they read that table and
wait until it is current (``schema_status`` / ``wait_until_current``).

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

A migration is a file ``NNNN_name.sql`` (4 digits, numbered 1..N without gaps; a name
of ``a-z 0-9 _``), executed as one simple-protocol query. Never edit a released file:
add the next one.
"""

from __future__ import annotations

import hashlib
import logging
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from functools import cache
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql

from store.errors import (
    MigrationChanged,
    MigrationLocked,
    MigrationsInvalid,
    SchemaAhead,
    SchemaNotReady,
)
from store.schema import SCHEMA, SCHEMA_MIGRATIONS

__all__ = [
    "MIGRATE_LOCK",
    "AppliedMigration",
    "Migration",
    "SchemaState",
    "SchemaStatus",
    "load_migrations",
    "migrate",
    "migrations",
    "read_applied",
    "retry_delays",
    "schema_status",
    "wait_until_current",
]

log = logging.getLogger(__name__)

# The advisory lock key of ``migrate`` (any constant bigint; "billing-ledger migrate").
MIGRATE_LOCK = 0x62696C6C_6D696772

_FILE = re.compile(r"(?P<number>\d{4})_(?P<name>[a-z0-9_]+)\.sql")

_TABLE = sql.Identifier(SCHEMA, SCHEMA_MIGRATIONS)
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
).format(schema=sql.Identifier(SCHEMA), table=_TABLE)
_SELECT_APPLIED = sql.SQL(
    "SELECT number, name, checksum, applied_at, duration_s FROM {} ORDER BY number"
).format(_TABLE)
_INSERT_APPLIED = sql.SQL(
    "INSERT INTO {} (number, name, checksum, duration_s) VALUES (%s, %s, %s, %s)"
    " RETURNING applied_at"
).format(_TABLE)


@dataclass(frozen=True)
class Migration:
    """One numbered change of the schema, as this build has it."""

    number: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        """SHA-256 of the SQL (line endings normalised), hex."""
        return hashlib.sha256(self.sql.replace("\r\n", "\n").encode()).hexdigest()

    @property
    def label(self) -> str:
        return f"{self.number} {self.name}"


@dataclass(frozen=True)
class AppliedMigration:
    """A row of ``billing.schema_migrations``: a migration the database has applied."""

    number: int
    name: str
    checksum: str
    applied_at: datetime | None
    duration_s: float

    @property
    def label(self) -> str:
        return f"{self.number} {self.name}"


class SchemaState(StrEnum):
    """How the database's schema stands against this build's migrations."""

    CURRENT = "current"  # every migration applied, as this build has it
    BEHIND = "behind"  # some not applied yet: run migrate
    CHANGED = "changed"  # an applied migration differs from this build's file
    AHEAD = "ahead"  # the database applied migrations this build does not know


@dataclass(frozen=True)
class SchemaStatus:
    """This build's migrations beside what the database applied (``schema_status``)."""

    known: tuple[Migration, ...]
    applied: tuple[AppliedMigration, ...]

    @property
    def version(self) -> int:
        """The database's schema version: its highest applied migration (0: none)."""
        return max((a.number for a in self.applied), default=0)

    @property
    def latest(self) -> int:
        """The newest migration this build has."""
        return max((m.number for m in self.known), default=0)

    @property
    def pending(self) -> tuple[Migration, ...]:
        done = {a.number for a in self.applied}
        return tuple(m for m in self.known if m.number not in done)

    @property
    def changed(self) -> tuple[tuple[AppliedMigration, Migration], ...]:
        """Applied migrations whose checksum differs from this build's file."""
        by_number = {m.number: m for m in self.known}
        return tuple(
            (a, by_number[a.number])
            for a in self.applied
            if a.number in by_number and a.checksum != by_number[a.number].checksum
        )

    @property
    def unknown(self) -> tuple[AppliedMigration, ...]:
        """Applied migrations this build does not have (a newer build applied them)."""
        numbers = {m.number for m in self.known}
        return tuple(a for a in self.applied if a.number not in numbers)

    @property
    def state(self) -> SchemaState:
        if self.unknown:
            return SchemaState.AHEAD
        if self.changed:
            return SchemaState.CHANGED
        return SchemaState.BEHIND if self.pending else SchemaState.CURRENT

    def problem(self) -> str:
        """What is wrong and what to do, in one line ('' when current)."""
        state = self.state
        if state is SchemaState.AHEAD:
            names = ", ".join(a.label for a in self.unknown)
            return (
                f"the database's schema is at {self.version}, newer than this build"
                f" (its newest migration is {self.latest}; unknown: {names}):"
                " run a build that has these migrations"
            )
        if state is SchemaState.CHANGED:
            applied, ours = self.changed[0]
            return (
                f"migration {ours.label} was applied with checksum {applied.checksum[:12]},"
                f" but this build's file has {ours.checksum[:12]}: an applied migration must"
                " not be edited; restore the file and put the change in a new migration"
            )
        if state is SchemaState.BEHIND:
            return (
                f"schema at {self.version}, this build needs {self.latest}:"
                " run billing-ledger migrate"
            )
        return ""


def load_migrations(directory: Traversable) -> tuple[Migration, ...]:
    """The migration files in ``directory``, in order (raises MigrationsInvalid)."""
    found: list[Migration] = []
    for entry in directory.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _FILE.fullmatch(entry.name)
        if match is None:
            raise MigrationsInvalid(
                f"migration file {entry.name!r} is not named NNNN_name.sql (name: a-z 0-9 _)"
            )
        found.append(
            Migration(int(match["number"]), match["name"], entry.read_text(encoding="utf-8"))
        )
    found.sort(key=lambda m: m.number)
    numbers = [m.number for m in found]
    if numbers != list(range(1, len(found) + 1)):
        raise MigrationsInvalid(f"migrations must be numbered 1..N without gaps, found {numbers}")
    return tuple(found)


@cache
def migrations() -> tuple[Migration, ...]:
    """This build's migrations: the SQL files of this package (read once)."""
    return load_migrations(files(__name__))


def read_applied(conn: psycopg.Connection[Any]) -> tuple[AppliedMigration, ...]:
    """The rows of ``billing.schema_migrations`` in order (none when there is no table)."""
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f"{SCHEMA}.{SCHEMA_MIGRATIONS}",)
    ).fetchone()
    if not row or not row[0]:
        return ()
    rows = conn.execute(_SELECT_APPLIED).fetchall()
    return tuple(AppliedMigration(int(r[0]), r[1], r[2], r[3], float(r[4])) for r in rows)


def schema_status(
    conn: psycopg.Connection[Any], known: Sequence[Migration] | None = None
) -> SchemaStatus:
    """How the database stands against ``known`` (this build's migrations). Reads only."""
    return SchemaStatus(tuple(migrations() if known is None else known), read_applied(conn))


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


def wait_until_current(
    status: Callable[[], SchemaStatus],
    *,
    timeout_s: float,
    interval_s: float,
    wait: Callable[[float], object] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> SchemaStatus:
    """Return once ``status()`` is current; a worker's check at start. Runs no DDL.

    While the schema is behind, logs "schema at N, this build needs M: run
    billing-ledger migrate" and checks again every ``interval_s``; raises SchemaNotReady
    after ``timeout_s``. A database ahead of this build, or with a changed migration,
    raises at once (SchemaAhead, MigrationChanged): waiting cannot fix either.
    """
    deadline = clock() + timeout_s
    while True:
        current = status()
        state = current.state
        if state is SchemaState.CURRENT:
            return current
        if state is SchemaState.AHEAD:
            raise SchemaAhead(current.problem())
        if state is SchemaState.CHANGED:
            raise MigrationChanged(current.problem())
        if clock() >= deadline:
            raise SchemaNotReady(f"{current.problem()} (gave up after {timeout_s:g} s)")
        log.warning(
            current.problem(),
            extra={"step": "schema", "status": "waiting", "schema_version": current.version,
                   "schema_needed": current.latest},
        )  # fmt: skip
        wait(interval_s)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
