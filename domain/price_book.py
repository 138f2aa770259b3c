"""The ``PriceBook`` aggregate: every price list the ledger prices usage by, as versions.

**One book for all currencies.** A price file holds every meter, whatever its currency,
and each meter has exactly one currency; publishing a file is one decision, so it is
one event of one aggregate: a version is the whole file, "the prices in force" has one
answer for every record, and a meter cannot be in force in two currencies at once (as
it could with a book per currency whose versions took effect at different moments).
Its id is fixed (``domain.ids.price_book_id``): every process names the same book
without a lookup, and two first publications race on the store's version check.

**Versions.** ``publish`` records a whole price list (the same content and the same
checks as a price file: ``domain.pricing``) and the moment it takes effect, as the
book's next version number (1, 2, ...). A version is never changed or removed.

**Which version prices a moment** (``price_at``): the one with the latest
``effective_from`` at or before the moment; of versions with the same ``effective_from``,
the one published last (``spans`` gives the same answer as intervals, for SQL). So a
version may take effect before one published earlier (a correction): it prices the
usage at or after its moment that is *recorded after it is published*; usage already
recorded keeps the version its ``Metered`` names until it is **re-priced**: on a line
whose invoice has not closed, ``domain.repricing`` prices it again by the version in
force at its moment (the reconciler finds it; ``billing-ledger prices publish`` runs
it at once); on a closed or finalized invoice it is left alone and reported.

**Prices by line quantity** (tiers, packages, a flat fee: ``domain.pricing``): a record
of such a meter is priced by the version in force at the start of the period its usage
occurred in, for the whole period (``domain.transaction.price_of_record``), and its line
is keyed by that version (``domain.invoice_line``).

**Usage from before the earliest version** is priced by the version in force at the
earliest ``effective_from`` (as if it had occurred then), not set aside: the ledger
starts its book with the configured price file effective from the epoch (``billing-ledger
migrate``), so only a book whose every version was published for a later moment has
such usage, and it is owed usage with no other price. A dead letter would hold it out
of billing until someone re-priced it, which nothing can do yet.

**The initial version** (number 1): the price file configured when the ledger started
its book. ``Metered`` events recorded before price books existed name no version; they
load naming version 1 (``domain.transaction``'s upcaster): they were priced by the
configured file, which is what version 1 holds unless the file was changed before
the upgrade.

Public methods decide (check, compute); the private ``@event`` methods only apply.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from domain.errors import PriceListError
from domain.ids import price_book_id
from domain.pricing import Price, PriceList

if TYPE_CHECKING:
    from domain.contract import ContractSchedule

__all__ = [
    "EPOCH",
    "INITIAL_VERSION",
    "PRICE_BOOK_ID",
    "PriceBook",
    "PriceSchedule",
    "PriceVersion",
    "as_schedule",
]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
"""When the first version the ledger publishes from its configured file takes effect."""
INITIAL_VERSION = 1
PRICE_BOOK_ID = price_book_id()


@dataclass(frozen=True)
class PriceVersion:
    """One published version: its book, its number, its moment, every meter's price."""

    book_id: UUID
    number: int
    effective_from: datetime
    prices: PriceList


class PriceSchedule:
    """A book's versions as a worker holds them (immutable): which version prices a
    moment, and each version by its number; with the contracts (``domain.contract``) of
    the customers the worker prices now, by customer id (``with_contracts``)."""

    __slots__ = ("_by_line", "_order", "_starts", "book_id", "contracts", "versions")

    def __init__(self, book_id: UUID, versions: Sequence[PriceVersion]) -> None:
        if not versions:
            raise PriceListError(f"price book {book_id} has no version: publish one first")
        self.book_id = book_id
        self.versions = tuple(versions)  # in publication order: number 1, 2, ...
        self._order = sorted(self.versions, key=lambda v: (v.effective_from, v.number))
        self._starts = [v.effective_from for v in self._order]
        self.contracts: Mapping[str, ContractSchedule] = {}
        self._by_line: frozenset[str] | None = None

    def with_contracts(self, contracts: Mapping[str, ContractSchedule]) -> PriceSchedule:
        """The same versions, with these customers' contracts (shared, not copied)."""
        out = object.__new__(PriceSchedule)
        out.book_id, out.versions, out._order, out._starts, out._by_line = (
            self.book_id, self.versions, self._order, self._starts, self._by_line,
        )  # fmt: skip
        out.contracts = contracts
        return out

    @classmethod
    def initial(cls, prices: PriceList) -> PriceSchedule:
        """The book the ledger starts with: ``prices`` as version 1, effective from the
        epoch (what ``billing-ledger migrate`` publishes from the configured file)."""
        return cls(PRICE_BOOK_ID, [PriceVersion(PRICE_BOOK_ID, INITIAL_VERSION, EPOCH, prices)])

    @property
    def latest(self) -> PriceVersion:
        """The version published last."""
        return self.versions[-1]

    def version(self, number: int) -> PriceVersion | None:
        """Version ``number``, or None when the book has no such version."""
        if 1 <= number <= len(self.versions):
            return self.versions[number - 1]
        return None

    @property
    def by_line_meters(self) -> frozenset[str]:
        """The meters some version prices by line quantity (``Price.by_line``): a record
        of any other meter is priced alone, by the version of its moment, as always."""
        if self._by_line is None:
            self._by_line = frozenset(
                m for v in self.versions for m, p in v.prices.prices.items() if p.by_line
            )
        return self._by_line

    def price_at(self, moment: datetime) -> PriceVersion:
        """The version in force at ``moment`` (see the module docstring): the latest
        effective at or before it, ties to the one published last; before every
        version, the one in force at the earliest moment."""
        return self._order[bisect_right(self._starts, max(moment, self._starts[0])) - 1]

    def spans(self) -> list[tuple[datetime | None, datetime | None, int]]:
        """``price_at`` as intervals: (from, until, version number), from inclusive, until
        exclusive, None unbounded; the first from the beginning of time, the last for
        ever. A version tied with a later one on its moment prices no moment: no span."""
        out: list[tuple[datetime | None, datetime | None, int]] = []
        for i, version in enumerate(self._order):
            until = self._starts[i + 1] if i + 1 < len(self._order) else None
            if until == version.effective_from:
                continue
            out.append((version.effective_from if out else None, until, version.number))
        return out


def as_schedule(prices: PriceList | PriceSchedule) -> PriceSchedule:
    """``prices`` as a schedule: a bare price list is the initial version of the book."""
    return prices if isinstance(prices, PriceSchedule) else PriceSchedule.initial(prices)


class PriceBook(Aggregate):
    """The ledger's price lists, each a numbered version with the moment it takes effect."""

    class Opened(Aggregate.Created):
        pass

    class Published(Aggregate.Event):
        number: int
        effective_from: datetime
        meters: dict[str, dict[str, Any]]  # a price file's [meters] table, prices as text

    @staticmethod
    def create_id(**_: Any) -> UUID:
        return PRICE_BOOK_ID

    @classmethod
    def start(cls, prices: PriceList, effective_from: datetime = EPOCH) -> PriceBook:
        """A new book whose version 1 is ``prices`` (PriceListError when they or the
        moment are not valid: no book to save)."""
        book = cls()
        book.publish(prices, effective_from)
        return book

    @classmethod
    def of(cls, schedule: PriceSchedule) -> PriceBook:
        """A new book holding ``schedule``'s versions with their numbers and moments: the
        book a ledger that priced by ``schedule`` without a book starts (its usage names
        them)."""
        book = cls()
        for version in schedule.versions:
            book.publish(version.prices, version.effective_from)
        return book

    @event(Opened)
    def __init__(self) -> None:
        self.versions: list[PriceVersion] = []

    def publish(self, prices: PriceList, effective_from: datetime) -> PriceVersion:
        """Record ``prices`` as the next version, in force from ``effective_from``.
        The whole version is checked first, by a price file's rules: PriceListError,
        and nothing recorded, when any of it is not valid."""
        moment, checked = _checked(prices, effective_from)
        self._published(len(self.versions) + 1, moment, checked)
        return self.versions[-1]

    @event(Published)
    def _published(
        self, number: int, effective_from: datetime, meters: dict[str, dict[str, Any]]
    ) -> None:
        before = self.versions[-1].prices.prices if self.versions else {}
        prices = PriceList(
            {name: _price(spec, before.get(name)) for name, spec in meters.items()}
        )  # checked when published: a version loads as it was, whatever the rules are now
        self.versions.append(PriceVersion(self.id, number, effective_from, prices))

    @property
    def schedule(self) -> PriceSchedule:
        """The versions, as the workers price by them."""
        return PriceSchedule(self.id, self.versions)

    def price_at(self, moment: datetime) -> PriceVersion:
        """The version in force at ``moment`` (``PriceSchedule.price_at``)."""
        return self.schedule.price_at(moment)


def _price(spec: dict[str, Any], before: Price | None) -> Price:
    """The price a version's ``spec`` holds; ``before`` itself, the version before's price
    of the meter, when it is written the same: a book's versions share the prices they do
    not change (a book of 10,000 meters holds each unchanged price once, not per version).
    A per-unit spec (no ``model``, the common case) is compared field by field."""
    if before is None:
        return Price.from_spec(spec)
    if "model" not in spec and "flat_fee" not in spec and not before.by_line:
        if (str(before.unit_price), before.currency, before.per) == (
            spec["unit_price"], spec["currency"], spec["per"],
        ):  # fmt: skip
            return before
        return Price(Decimal(spec["unit_price"]), spec["currency"], spec["per"])
    return before if before.to_spec() == spec else Price.from_spec(spec)


def _checked(
    prices: PriceList, effective_from: datetime
) -> tuple[datetime, dict[str, dict[str, Any]]]:
    """The version's moment in UTC and its ``[meters]`` table, checked as a price file is."""
    if effective_from.utcoffset() is None:
        raise PriceListError(
            f"effective_from {effective_from.isoformat()} has no time zone:"
            " give one (2027-01-01T00:00:00Z)"
        )
    try:
        moment = effective_from.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:00-05:00 is in the year 10000 in UTC
        raise PriceListError(
            f"effective_from {effective_from.isoformat()} is not a moment in years 1 to 9999"
            " in UTC: give one that is"
        ) from None
    return moment, PriceList.from_meters(prices.to_meters()).to_meters()
