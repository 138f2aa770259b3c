"""The aggregates one ingest decision reads, in one or two queries instead of one each.

A batch of 2,000 records touches a few hundred accounts and invoice lines. Read one
by one through eventsourcing's ``Repository.get``, each is a round trip to
PostgreSQL (the cached aggregate fast-forwarded by ``select_events``), and those reads
were a quarter of an ingest process's time. ``meter_batch_events`` names the
aggregates it will load before it loads any (its ``expect``); ``BatchReads`` then reads
them together:

* cached aggregates: each copied (under the repository's lock of its id, which other
  threads' reads take to fast-forward the cached object in place), then every event
  after each copy's version read in one query (``LedgerRecorder.select_after``) and
  folded onto the copy: the cached object is never changed here;
* the rest: which of them exist at all, in one query. One that does not is answered
  None with no further read. Those that do (not cached: after a restart, or evicted)
  and have no snapshot at all (one query asks which have any row in the snapshots
  table) are read whole, their events in one query, and folded as the repository
  would fold them, the repository's cache given each as it gives one it read; one
  with a snapshot is read as the repository reads it, snapshot first, when asked for.
  (A process that starts with thousands of accounts in the store read each with two
  round trips of its own in its first batches.)

Anything not expected (a late line, an invoice) is read through the repository. Each
expected aggregate is handed out once, as the repository would hand out a copy.

What this reads is what the repository would have read at the same moment; a write by
someone else after it is caught by the save's version constraint, as before, and the
batch is decided again from fresh reads. After a save, ``remember`` puts the saved
aggregates in the repository's cache at their new versions, so the next batch
fast-forwards from there instead of reading this batch's own events back.

``pending``: the aggregates as a decision whose save is still in flight left them (the
ingest's write-behind decides batch k+1 while batch k is saved). They are read as if
cached at those versions: copied, and anything newer in the store folded on. If that
save fails, the decision made from them is dropped and made again (``BillingLedger.decide``).

Each copy is ``copy.deepcopy``'s, made faster (``clone``): a value of an immutable type
(text, numbers, ``Decimal``, ``UUID``, moments) is shared, not rebuilt, and a plain
object (an aggregate, a credit grant) is rebuilt from a copy of its ``__dict__`` as
``deepcopy`` would, without its generic reduce protocol. Copying every aggregate a batch
reads was a fifth of an ingest process's time, more with prepaid credit (an account's
grants, each period's credit line).
"""

from __future__ import annotations

import copyreg
from collections.abc import Callable, Iterable, Mapping, Sequence
from copy import deepcopy
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.application import Repository, project_aggregate
from eventsourcing.domain import DomainEventProtocol
from eventsourcing.persistence import Mapper

from domain.account import CustomerAccount
from domain.ids import account_id
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine
from store.recorder import LedgerRecorder
from store.snapshots import SealedSnapshotRecorder

__all__ = ["BatchReads", "clone"]

_A = TypeVar("_A")


class BatchReads:
    """Reads for one decision (see the module docstring)."""

    def __init__(
        self,
        repository: Repository[UUID],
        recorder: LedgerRecorder | None,
        mapper: Mapper[UUID],
        read_one: Callable[[UUID], Any],
        pending: Mapping[UUID, Any] | None = None,
    ) -> None:
        self.repository = repository
        self.recorder = recorder
        self.mapper = mapper
        self.read_one = read_one  # the repository's read, None when absent
        # aggregates as a decision whose save is in flight left them: read as if cached
        self.pending = pending or {}
        self._read: dict[UUID, Any] = {}
        self.queries = 0  # how many queries ``expect`` made
        self.events_read = 0  # events it folded onto cached aggregates
        self.read_whole = 0  # aggregates it read from their events alone (not cached)

    def expect(self, ids: Sequence[UUID]) -> None:
        """Read these aggregates now (``meter_batch_events``' ``expect``)."""
        cache = self.repository.cache
        if self.recorder is None:  # another persistence (the in-memory tests): one by one
            return
        wanted = [i for i in dict.fromkeys(ids) if i not in self._read]
        cached: dict[UUID, Any] = {}
        for i in wanted:
            if i in self.pending:
                cached[i] = self._copy(i, self.pending[i])
            elif cache is not None:
                try:
                    cached[i] = self._copy(i, cache.get(i))
                except KeyError:
                    continue
        if cached:
            self.queries += 1
            after = self.recorder.select_after({i: a.version for i, a in cached.items()})
            self.events_read += len(after)
            newer = _by_aggregate(self.mapper.to_domain_event(s) for s in after)
            for i, copy in cached.items():
                events = [e for e in newer.get(i, ()) if e.originator_version > copy.version]
                self._read[i] = project_aggregate(copy, events) if events else copy
        uncached = [i for i in wanted if i not in cached]
        if uncached:
            self.queries += 1
            recorded = self.recorder.select_recorded_ids(uncached)
            self._read.update({i: None for i in uncached if i not in recorded})
            if recorded:
                self._read_whole([i for i in uncached if i in recorded])

    def _read_whole(self, ids: Sequence[UUID]) -> None:
        """Read the aggregates of ``ids`` (each has events, none is cached) that have no
        snapshot from their events, together (see the module docstring). The repository
        reads such an aggregate from all its events, keeps it in its cache and hands out
        a copy: so does this. One with a snapshot row is left to ``get`` (the
        repository's read, snapshot first, its seal checked)."""
        snapshots = self.repository.snapshot_store
        if snapshots is None:
            whole = list(ids)
        elif isinstance(snapshots.recorder, SealedSnapshotRecorder):
            self.queries += 1
            snapshotted = snapshots.recorder.select_snapshotted_ids(ids)
            whole = [i for i in ids if i not in snapshotted]
        else:  # another snapshot store: the repository reads each
            return
        if not whole or self.recorder is None:
            return
        self.queries += 1
        stored = self.recorder.select_after(dict.fromkeys(whole, 0))
        histories = _by_aggregate(self.mapper.to_domain_event(s) for s in stored)
        cache = self.repository.cache
        for i in whole:
            events = histories.get(i)
            aggregate = project_aggregate(None, events) if events else None
            if aggregate is None:  # left to the repository's read
                continue
            self.read_whole += 1
            if cache is not None:  # as ``Repository.get``: the read cached, a copy handed out
                cache.put(i, aggregate)
                aggregate = clone(aggregate)
            self._read[i] = aggregate

    def _copy(self, aggregate_id: UUID, cached: Any) -> Any:
        """A copy of the cached aggregate, taken under the repository's fast-forward lock
        of its id: another thread's ``Repository.get`` fast-forwards the cached object in
        place, under that lock, and a copy taken meanwhile could be torn (an event's
        state applied, its version not yet). It is the library's in-process lock of its
        cache (private, as the ledger's ``save`` calls ``_record``), never a lock on
        billing data: writers still settle by the event store's version constraint."""
        repository = self.repository
        lock = repository._use_fastforward_lock(aggregate_id)
        try:
            with lock:
                return clone(cached)
        finally:
            repository._disuse_fastforward_lock(aggregate_id)

    def account(self, customer_id: str, currency: str) -> CustomerAccount | None:
        return _typed(self.get(account_id(customer_id, currency)), CustomerAccount)

    def line(self, line_id: UUID) -> InvoiceLine | None:
        return _typed(self.get(line_id), InvoiceLine)

    def invoice(self, invoice_id: UUID) -> Invoice | None:
        return _typed(self.get(invoice_id), Invoice)

    def get(self, aggregate_id: UUID) -> Any:
        """The aggregate (a copy of its own), or None when it has no events."""
        if aggregate_id in self._read:
            return self._read.pop(aggregate_id)
        if aggregate_id in self.pending:
            return self._copy(aggregate_id, self.pending[aggregate_id])
        return self.read_one(aggregate_id)

    def remember(self, saved: Iterable[Any]) -> None:
        """Cache aggregates just saved, at the versions saved (see the module docstring).
        The objects themselves, not copies: whoever holds them (the batch's decision)
        only reads them from then on; the next batch reads copies."""
        cache = self.repository.cache
        if cache is None:
            return
        for aggregate in saved:
            cache.put(aggregate.id, aggregate)


def _typed(found: Any, kind: type[_A]) -> _A | None:
    return found if isinstance(found, kind) else None


def _by_aggregate(
    events: Iterable[DomainEventProtocol[UUID]],
) -> dict[UUID, list[DomainEventProtocol[UUID]]]:
    found: dict[UUID, list[DomainEventProtocol[UUID]]] = {}
    for event in events:
        found.setdefault(event.originator_id, []).append(event)
    return found


# Immutable: a copy may share them (``deepcopy`` rebuilds a UUID or a moment through
# its reduce protocol, to an equal object no one can change either).
_IMMUTABLE: frozenset[type] = frozenset(
    {str, int, bool, float, bytes, type(None), Decimal, UUID, datetime, date, time,
     timedelta, timezone}
)  # fmt: skip


def clone(value: Any) -> Any:
    """``copy.deepcopy(value)``, sharing what is immutable (see the module docstring):
    the same structure, aliases within it kept, nothing of it shared but immutables."""
    return _clone(value, {})


def _clone(value: Any, memo: dict[int, Any]) -> Any:
    kind = type(value)
    if kind in _IMMUTABLE:
        return value
    found = memo.get(id(value), memo)
    if found is not memo:
        return found
    if kind is dict:
        copied: dict[Any, Any] = {}
        memo[id(value)] = copied
        immutable = _IMMUTABLE  # shared as they are, without a call each (most are)
        for key, item in value.items():
            copied[key if type(key) in immutable else _clone(key, memo)] = (
                item if type(item) in immutable else _clone(item, memo)
            )
        return copied
    if kind is list:
        items: list[Any] = []
        memo[id(value)] = items
        items.extend(_clone(item, memo) for item in value)
        return items
    if kind is tuple:
        parts = [_clone(item, memo) for item in value]
        if all(a is b for a, b in zip(parts, value, strict=True)):
            return value  # as deepcopy: a tuple of shared values is itself shared
        return memo.setdefault(id(value), tuple(parts))
    plain = _PLAIN.get(kind)
    if plain is None:
        plain = _PLAIN[kind] = _plain(kind)
    if plain:
        new: Any = kind.__new__  # as ``copyreg.__newobj__`` makes it
        obj = new(kind)
        memo[id(value)] = obj
        state = value.__dict__
        if state:
            obj.__dict__.update(_clone(state, memo))
        return obj
    # Anything else (an event, a set, an enum): deepcopy itself, with the same memo so
    # that aliases across both stay aliases; deepcopy keeps what it copies alive in it.
    return deepcopy(value, memo)


_PLAIN: dict[type, bool] = {}  # per type: ``_plain``, decided once


def _plain(kind: type) -> bool:
    """Whether ``deepcopy`` copies instances of ``kind`` as ``__newobj__`` plus a copy of
    their ``__dict__`` set back (object's own reduce protocol, no slots, no hooks)."""
    return (
        not issubclass(kind, (type, list, dict, set, frozenset, tuple))
        and kind.__reduce_ex__ is object.__reduce_ex__
        and kind.__reduce__ is object.__reduce__
        and kind.__getstate__ is object.__getstate__
        and getattr(kind, "__deepcopy__", None) is None
        and getattr(kind, "__setstate__", None) is None
        and kind not in copyreg.dispatch_table
        and not any(vars(c).get("__slots__") for c in kind.__mro__)
        and "__dict__" in dir(kind)
    )
