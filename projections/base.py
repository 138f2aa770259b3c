"""What every SQL read model shares: the projection contract, the facts a projection
looks up in the history, and the validation of query filters.

Exceptions::

    ValueError
     └── InvalidFilter      a query filter (state, customer, limit) is not valid
    LookupError
     └── UnknownProjection  no projection has that name
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol
from uuid import UUID

import psycopg
from eventsourcing.persistence import StoredEvent
from eventsourcing.utils import get_topic

from domain.account import CustomerAccount
from domain.contract import Contract
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine, LinePush
from domain.transaction import BillingTransaction, TxnState
from domain.usage import CUSTOMER_ID_MAX_LENGTH, CUSTOMER_ID_PATTERN
from store.eventlog import read_created, read_topic

__all__ = [
    "MAX_LIMIT",
    "SCHEMA",
    "Decode",
    "Facts",
    "History",
    "InvalidFilter",
    "Projection",
    "UnknownProjection",
    "check_customer",
    "check_limit",
    "check_state",
]

SCHEMA = "billing"
MAX_LIMIT = 10_000
_REPRICED = get_topic(BillingTransaction.Repriced)
_FIRST_AFTER_REPRICED = 4  # the earliest version an event after a Repriced can have

Decode = Callable[[StoredEvent], Any]
"""The application's decoding of a stored event (``ledger.mapper.to_domain_event``)."""


class InvalidFilter(ValueError):
    """Raised when a query filter (state, customer, limit) is not valid."""


class UnknownProjection(LookupError):
    """Raised when no projection has the given name."""


class Projection(Protocol):
    """A read model in the ``billing`` schema, kept by applying events in log order.

    Its table is made by the migrations (``store.migrations``), the one definition of
    its shape; ``rebuild`` copies that shape for its shadow table.
    """

    name: str  # also the name of its table

    def apply(
        self, conn: psycopg.Connection[Any], table: str, events: Sequence[Any], history: History
    ) -> None:
        """Apply ``events`` (in log order) to ``table``, inside the caller's transaction."""
        ...


@dataclass(frozen=True)
class Facts:
    """What the first event of a transaction, an account, a line, an invoice or a contract
    says about it (a contract's ``currency`` is empty: its minimums name theirs)."""

    customer_id: str
    currency: str
    amount: Decimal  # exact minor units; 0 for an account or a line
    created_at: datetime  # when it was metered (a transaction) or opened (an account)


class History:
    """Facts from the first event of aggregates, read from the immutable history.

    A later event (Charged, LimitSet) does not repeat whose money it is; its first
    event does, and history never changes, so a cached fact never goes stale.
    """

    def __init__(self, decode: Decode, *, max_cached: int = 100_000) -> None:
        self.decode = decode
        self.max_cached = max_cached
        self._facts: dict[UUID, Facts] = {}
        self._push_lines: dict[UUID, UUID] = {}

    def remember(self, event: Any) -> None:
        """Keep the facts of a first event seen in the log."""
        if isinstance(event, BillingTransaction.Metered):
            facts = Facts(event.customer_id, event.currency, event.amount, event.timestamp)
        elif isinstance(event, CustomerAccount.Opened | InvoiceLine.Opened | Invoice.Opened):
            facts = Facts(event.customer_id, event.currency, Decimal(0), event.timestamp)
        elif isinstance(event, Contract.Opened):  # a contract has no currency of its own
            facts = Facts(event.customer_id, "", Decimal(0), event.timestamp)
        elif isinstance(event, LinePush.Opened):
            self._push_lines[event.originator_id] = event.line_id
            return
        else:
            return
        if len(self._facts) >= self.max_cached:
            self._facts.clear()  # cheap to read back; a bound on memory matters more
            self._push_lines.clear()
        self._facts[event.originator_id] = facts

    def prefetch(self, conn: psycopg.Connection[Any], originator_ids: Iterable[UUID]) -> None:
        """Read the first events of those not known yet, in one query."""
        missing = {i for i in originator_ids if i not in self._facts and i not in self._push_lines}
        if missing:
            for row in read_created(conn, missing):
                self.remember(self.decode(row.notification()))

    def amounts_before(
        self, conn: psycopg.Connection[Any], events: Iterable[Any]
    ) -> dict[tuple[UUID, int], Decimal]:
        """The exact amount of each of these transactions' events' transactions just before
        it, when a ``Repriced`` came earlier (its new amount); the others are the amount
        their ``Metered`` recorded (``facts``). Read from the history at every call, never
        cached: a transaction's amount changes, its first event does not. Only an event
        after version 3 can follow a ``Repriced`` (Metered, Reserved, Repriced come
        first), so a charge at version 3, the usual one, reads nothing."""
        later = {(e.originator_id, e.originator_version) for e in events}
        later = {(i, v) for i, v in later if v >= _FIRST_AFTER_REPRICED}
        if not later:
            return {}
        repriced: dict[UUID, list[tuple[int, Decimal]]] = {}
        for row in read_topic(conn, {i for i, _ in later}, _REPRICED):
            amount = self.decode(row.notification()).amount
            repriced.setdefault(row.originator_id, []).append((row.originator_version, amount))
        out: dict[tuple[UUID, int], Decimal] = {}
        for txn_id, version in later:
            before = [amount for v, amount in repriced.get(txn_id, ()) if v < version]
            if before:
                out[txn_id, version] = before[-1]
        return out

    def line_of_push(self, push_id: UUID) -> UUID:
        """The line a ``LinePush`` is about (``prefetch`` the push first)."""
        try:
            return self._push_lines[push_id]
        except KeyError:
            raise LookupError(f"no LinePush.Opened for {push_id}") from None

    def facts(self, originator_id: UUID) -> Facts:
        """The facts of an aggregate (``prefetch`` it first)."""
        try:
            return self._facts[originator_id]
        except KeyError:
            raise LookupError(f"no first event for aggregate {originator_id}") from None


_CUSTOMER = re.compile(CUSTOMER_ID_PATTERN)
_STATES = tuple(str(s) for s in TxnState)


def check_state(state: str | None) -> TxnState | None:
    """``state`` as a TxnState (raises InvalidFilter)."""
    if state is None:
        return None
    if state not in _STATES:
        raise InvalidFilter(f"unknown state {state!r} (one of: {', '.join(_STATES)})")
    return TxnState(state)


def check_customer(customer: str | None) -> str | None:
    """``customer`` if it is a valid customer id (raises InvalidFilter)."""
    if customer is None:
        return None
    if len(customer) > CUSTOMER_ID_MAX_LENGTH or not _CUSTOMER.fullmatch(customer):
        raise InvalidFilter(
            f"invalid customer {customer!r}: 1-{CUSTOMER_ID_MAX_LENGTH} characters of"
            " A-Z a-z 0-9 _ . @ / + = -"
        )
    return customer


def check_limit(limit: int) -> int:
    """``limit`` if it is between 1 and MAX_LIMIT (raises InvalidFilter)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidFilter(f"invalid limit {limit!r}: a whole number from 1 to {MAX_LIMIT}")
    return limit
