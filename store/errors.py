"""The errors the event store raises on its own.

::

    StoreError                   raised by the store; never by the domain
     +-- ConcurrencyExhausted    a save kept losing optimistic-concurrency races
     +-- SchemaError             the database's schema does not fit this build
          +-- MigrationsInvalid  this build's migration files are misnumbered or misnamed
          +-- MigrationChanged   an applied migration differs from this build's file
          +-- SchemaAhead        the database has migrations this build does not know
          +-- SchemaNotReady     a worker waited longer than allowed for ``migrate``
          +-- MigrationLocked    a migration could not take its locks in its attempts
          +-- RolesUnsafe        a billing role is missing or holds more than its grants

A lost race itself is eventsourcing's ``IntegrityError`` (the
``(originator_id, originator_version)`` constraint), which callers catch to reload
and re-decide; ``ConcurrencyExhausted`` is what remains when that keeps happening.

``DATABASE_ERRORS`` are what the database or its drivers raise (psycopg's, and
eventsourcing's translations of them): a worker's last-resort guard never blames one
record or message for them, because the same input will work once the database does.

The schema errors come from ``store.migrations``; their messages say what to run.
"""

from __future__ import annotations

import psycopg
from eventsourcing.persistence import PersistenceError

__all__ = [
    "DATABASE_ERRORS",
    "ConcurrencyExhausted",
    "MigrationChanged",
    "MigrationLocked",
    "MigrationsInvalid",
    "RolesUnsafe",
    "SchemaAhead",
    "SchemaError",
    "SchemaNotReady",
    "StoreError",
]

DATABASE_ERRORS: tuple[type[Exception], ...] = (psycopg.Error, PersistenceError)


class StoreError(Exception):
    """Raised by the event store for a failure of its own; the base of store errors."""


class ConcurrencyExhausted(StoreError):
    """Raised when a batch keeps losing optimistic-concurrency races."""


class SchemaError(StoreError):
    """Raised when the database's schema does not fit this build; the base of schema errors."""


class MigrationsInvalid(SchemaError):
    """Raised when this build's migration files are not numbered 1..N with valid names."""


class MigrationChanged(SchemaError):
    """Raised when an applied migration's checksum differs from this build's file."""


class SchemaAhead(SchemaError):
    """Raised when the database has applied a migration this build does not know."""


class SchemaNotReady(SchemaError):
    """Raised when a worker waited longer than ``schema_wait_s`` for the schema to be current."""


class MigrationLocked(SchemaError):
    """Raised when a migration could not take the locks it needs within its attempts."""


class RolesUnsafe(SchemaError):
    """Raised when a billing role is missing or holds more power than least privilege
    allows (a superuser, CREATEROLE, ...): its logins could skip every grant."""
