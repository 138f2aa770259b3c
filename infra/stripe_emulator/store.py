"""The in-memory object store and the types every endpoint handler shares.

This module owns :class:`Store` (customers, invoice items, invoices, credit notes and
events, in creation order, each with a sequence number for cursor pagination), :class:`Call`
(what a handler is given) and :class:`Result` (what it answers).  A handler is a function
``(Store, Call) -> Result`` that is always called with the emulator's lock held; it raises
:class:`~.errors.ApiError` to answer an error.  Handlers validate before they change
anything, so a refused request leaves no trace but its log entry.

Two hooks connect the store to the rest of the emulator without it knowing them:
``on_event`` (an event was recorded: queue its webhooks, return how many) and
``take_payment_failure`` (whether a payment attempt is declined by the fault settings).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .errors import JsonObject, invalid

__all__ = ["Call", "Handler", "ItemRecord", "Record", "Result", "Store", "cursor_of"]


@dataclass
class Record:
    """A stored object and its creation sequence number (the pagination cursor)."""

    obj: JsonObject
    seq: int


@dataclass
class ItemRecord(Record):
    """An invoice item; deleted items stay (the control API still shows them).

    ``line_item_id`` is the id of the invoice line (``il_...``) the item makes on its
    invoice: drawn at random when the item is created, as Stripe's are, so a client can
    only learn it from Stripe (an invoice's ``lines``), never derive it from the item's."""

    line_item_id: str = ""
    deleted: bool = False
    deleted_at: float | None = None


@dataclass(frozen=True)
class Call:
    """One API request as a handler sees it (``request_id`` is None for control helpers)."""

    params: JsonObject
    path_id: str | None
    now: int
    request_id: str | None = None
    idempotency_key: str | None = None
    api_version: str | None = None


@dataclass(frozen=True)
class Result:
    payload: JsonObject
    object_id: str | None = None
    mutated: bool = False
    status: int = 200


def _no_events(event: JsonObject) -> int:
    return 0


def _never() -> bool:
    return False


class Store:
    """Every Stripe object the emulator holds, in creation order."""

    def __init__(self) -> None:
        self.customers: dict[str, JsonObject] = {}
        self.items: dict[str, ItemRecord] = {}
        self.invoices: dict[str, Record] = {}
        self.invoice_lines: dict[str, list[str]] = {}
        """Invoice id -> the ids of its live items, oldest first."""
        self.credit_notes: dict[str, Record] = {}
        self.events: dict[str, Record] = {}
        self.declined_customers: set[str] = set()
        """Customers whose card is declined (every payment attempt fails)."""
        self.on_event: Callable[[JsonObject], int] = _no_events
        self.take_payment_failure: Callable[[], bool] = _never
        self._seq = 0

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def item_cursor(self, item_id: str, param: str) -> int:
        """The seq of an invoice item used as a list cursor (deleted ones included)."""
        record = self.items.get(item_id)
        if record is None:
            raise invalid(f"No such invoiceitem: '{item_id}'", param, code="resource_missing")
        return record.seq

    def payment_declined(self, customer_id: str) -> bool:
        """Whether a payment attempt by ``customer_id`` fails (declined card or fault)."""
        return customer_id in self.declined_customers or self.take_payment_failure()


def cursor_of(records: Mapping[str, Record], kind: str) -> Callable[[str, str], int]:
    """A list cursor lookup over ``records`` answering Stripe's error for an unknown id."""

    def cursor(object_id: str, param: str) -> int:
        record = records.get(object_id)
        if record is None:
            raise invalid(f"No such {kind}: '{object_id}'", param, code="resource_missing")
        return record.seq

    return cursor


Handler = Callable[[Store, Call], Result]
