"""The errors the event store raises on its own.

::

    StoreError                   raised by the store; never by the domain
     +-- ConcurrencyExhausted    a save kept losing optimistic-concurrency races

A lost race itself is eventsourcing's ``IntegrityError`` (the
``(originator_id, originator_version)`` constraint), which callers catch to reload
and re-decide; ``ConcurrencyExhausted`` is what remains when that keeps happening.

``DATABASE_ERRORS`` are what the database or its drivers raise (psycopg's, and
eventsourcing's translations of them): a worker's last-resort guard never blames one
record or message for them, because the same input will work once the database does.
"""

from __future__ import annotations

import psycopg
from eventsourcing.persistence import PersistenceError

__all__ = ["DATABASE_ERRORS", "ConcurrencyExhausted", "StoreError"]

DATABASE_ERRORS: tuple[type[Exception], ...] = (psycopg.Error, PersistenceError)


class StoreError(Exception):
    """Raised by the event store for a failure of its own; the base of store errors."""


class ConcurrencyExhausted(StoreError):
    """Raised when a batch keeps losing optimistic-concurrency races."""
