"""The in-memory object store and the types every endpoint handler shares.

This module owns :class:`Store` (customers, invoice items, invoices, in creation order, with
a sequence number per object for cursor pagination), :class:`Call` (what a handler is given)
and :class:`Result` (what it answers).  A handler is a function ``(Store, Call) -> Result``
that is always called with the emulator's lock held; it raises :class:`~.errors.ApiError`
to answer an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import JsonObject, invalid

__all__ = ["Call", "Handler", "ItemRecord", "Record", "Result", "Store"]


@dataclass
class Record:
    """A stored object and its creation sequence number (the pagination cursor)."""

    obj: JsonObject
    seq: int


@dataclass
class ItemRecord(Record):
    """An invoice item; deleted items stay (the control API still shows them)."""

    deleted: bool = False
    deleted_at: float | None = None


@dataclass(frozen=True)
class Call:
    """One API request as a handler sees it."""

    params: JsonObject
    path_id: str | None
    now: int


@dataclass(frozen=True)
class Result:
    payload: JsonObject
    object_id: str | None = None
    mutated: bool = False
    status: int = 200


@dataclass
class Store:
    """Every Stripe object the emulator holds, in creation order."""

    customers: dict[str, JsonObject] = field(default_factory=dict)
    items: dict[str, ItemRecord] = field(default_factory=dict)
    invoices: dict[str, JsonObject] = field(default_factory=dict)
    _seq: int = 0

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def item_cursor(self, item_id: str, param: str) -> int:
        """The seq of an invoice item used as a list cursor (deleted ones included)."""
        record = self.items.get(item_id)
        if record is None:
            raise invalid(f"No such invoiceitem: '{item_id}'", param, code="resource_missing")
        return record.seq


Handler = Callable[[Store, Call], Result]
