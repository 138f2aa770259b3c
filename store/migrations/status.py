"""This build's migrations beside what the database has applied: the SQL files of
``store.migrations`` read and checked (``migrations``), the rows of
``billing.schema_migrations`` (``read_applied``), how the schema stands against them
(``SchemaStatus``: current, behind, changed or ahead, with the one line a person acts
on), and a worker's wait at start until it is current. Reads only; no DDL, no lock.
"""

from __future__ import annotations

import hashlib
import logging
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
from psycopg import sql

from store.errors import MigrationChanged, MigrationsInvalid, SchemaAhead, SchemaNotReady
from store.schema import SCHEMA, SCHEMA_MIGRATIONS

__all__ = [
    "MIGRATIONS_TABLE",
    "AppliedMigration",
    "Migration",
    "SchemaState",
    "SchemaStatus",
    "load_migrations",
    "migrations",
    "read_applied",
    "schema_status",
    "wait_until_current",
]

log = logging.getLogger("store.migrations")  # the package's logger, as operators know it

_FILE = re.compile(r"(?P<number>\d{4})_(?P<name>[a-z0-9_]+)\.sql")

MIGRATIONS_TABLE = sql.Identifier(SCHEMA, SCHEMA_MIGRATIONS)
"""``billing.schema_migrations``, the runner's record of what it applied."""
_SELECT_APPLIED = sql.SQL(
    "SELECT number, name, checksum, applied_at, duration_s FROM {} ORDER BY number"
).format(MIGRATIONS_TABLE)


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
    return load_migrations(files("store.migrations"))  # the SQL files of this package


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
