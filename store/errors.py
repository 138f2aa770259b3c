"""The errors the event store raises on its own.

::

    StoreError                   raised by the store; never by the domain
     +-- ConcurrencyExhausted    a save kept losing optimistic-concurrency races

A lost race itself is eventsourcing's ``IntegrityError`` (the
``(originator_id, originator_version)`` constraint), which callers catch to reload
and re-decide; ``ConcurrencyExhausted`` is what remains when that keeps happening.
"""

from __future__ import annotations

__all__ = ["ConcurrencyExhausted", "StoreError"]


class StoreError(Exception):
    """Raised by the event store for a failure of its own; the base of store errors."""


class ConcurrencyExhausted(StoreError):
    """Raised when a batch keeps losing optimistic-concurrency races."""
