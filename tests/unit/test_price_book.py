"""``domain.price_book``: versions of the whole price list, and which one prices a moment."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest

from domain import ids
from domain.errors import PriceListError
from domain.price_book import (
    EPOCH,
    INITIAL_VERSION,
    PRICE_BOOK_ID,
    PriceBook,
    PriceSchedule,
    PriceVersion,
    as_schedule,
)
from domain.pricing import Price, PriceList
from tests.fast.fakes import memory_ledger

EXAMPLE = Path(__file__).resolve().parents[2] / "infra" / "prices.example.toml"
JAN = datetime(2027, 1, 1, tzinfo=UTC)
FEB = datetime(2027, 2, 1, tzinfo=UTC)
MAR = datetime(2027, 3, 1, tzinfo=UTC)
TICK = timedelta(microseconds=1)


def _prices(unit_price: str, currency: str = "USD", per: int = 1) -> PriceList:
    return PriceList({"api": Price(Decimal(unit_price), currency, per)})


def _book(*versions: tuple[str, datetime]) -> PriceBook:
    """A book whose versions are the api meter at each unit price, from each moment."""
    (first, since), *rest = versions
    book = PriceBook.start(_prices(first), since)
    for unit_price, moment in rest:
        book.publish(_prices(unit_price), moment)
    return book


def _price_at(book: PriceBook, moment: datetime) -> tuple[int, Decimal]:
    version = book.price_at(moment)
    return version.number, version.prices.price_of("api").unit_price


# ---------------------------------------------------------------------------------------------
# Identity and events


def test_the_book_has_one_fixed_id_for_every_process() -> None:
    expected = uuid.uuid5(uuid.UUID("c4f2a9e8-1d6b-5e37-9a0c-7b5e3d2f8a61"), "prices")
    assert ids.price_book_id() == expected
    assert expected == PRICE_BOOK_ID
    assert PriceBook.start(_prices("1")).id == expected
    assert PriceBook.create_id(anything="ignored") == expected


def test_start_records_the_book_and_its_version_1_from_the_epoch() -> None:
    prices = PriceList.from_toml(EXAMPLE.read_text(encoding="utf-8"))
    book = PriceBook.start(prices)
    opened, published = book.collect_events()
    assert isinstance(opened, PriceBook.Opened)
    assert isinstance(published, PriceBook.Published)
    assert published.number == INITIAL_VERSION == 1
    assert published.effective_from == EPOCH == datetime(1970, 1, 1, tzinfo=UTC)
    assert published.meters == prices.to_meters()
    assert book.versions == [PriceVersion(PRICE_BOOK_ID, 1, EPOCH, prices)]


def test_publish_numbers_versions_in_publication_order_and_returns_the_new_one() -> None:
    book = PriceBook.start(_prices("1"))
    second = book.publish(_prices("2"), FEB)
    third = book.publish(_prices("3"), JAN)
    assert second == PriceVersion(PRICE_BOOK_ID, 2, FEB, _prices("2"))
    assert third == PriceVersion(PRICE_BOOK_ID, 3, JAN, _prices("3"))
    assert [v.number for v in book.versions] == [1, 2, 3]
    assert book.version == 4  # Opened and three Published


def test_a_published_version_holds_every_meter_exactly_as_the_file_gives_it() -> None:
    prices = PriceList(
        {
            "tokens": Price(Decimal("2.50"), "USD", 1_000_000),
            "gpu": Price(Decimal("0.0025"), "EUR"),
        }
    )
    book = PriceBook.start(prices)
    (_, published) = book.collect_events()
    assert published.meters == {
        "tokens": {"unit_price": "2.50", "per": 1_000_000, "currency": "USD"},
        "gpu": {"unit_price": "0.0025", "per": 1, "currency": "EUR"},
    }
    assert book.versions[0].prices == prices
    assert str(book.versions[0].prices.price_of("tokens").unit_price) == "2.50"


def test_effective_from_is_recorded_in_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    version = PriceBook.start(_prices("1")).publish(
        _prices("2"), datetime(2027, 1, 1, 2, tzinfo=plus_two)
    )
    assert version.effective_from == JAN
    assert version.effective_from.tzinfo is UTC
    assert (
        PriceBook.start(_prices("1"), datetime(2027, 1, 1, 2, tzinfo=plus_two))
        .versions[0]
        .effective_from.tzinfo
        is UTC
    )


def test_a_book_of_a_schedule_holds_its_versions_with_their_numbers_and_moments() -> None:
    schedule = _book(("1", JAN), ("2", MAR), ("3", FEB)).schedule
    book = PriceBook.of(schedule)
    assert book.id == PRICE_BOOK_ID
    assert [type(e).__name__ for e in book.collect_events()] == [
        "Opened", "Published", "Published", "Published",
    ]  # fmt: skip
    assert book.versions == [
        PriceVersion(PRICE_BOOK_ID, 1, JAN, _prices("1")),
        PriceVersion(PRICE_BOOK_ID, 2, MAR, _prices("2")),
        PriceVersion(PRICE_BOOK_ID, 3, FEB, _prices("3")),
    ]


@pytest.mark.parametrize(
    ("changed", "shared"),
    [
        pytest.param(Price(Decimal("1.50"), "USD", 1000), True, id="unchanged"),
        pytest.param(Price(Decimal("1.5"), "USD", 1000), False, id="written-otherwise"),
        pytest.param(Price(Decimal("1.51"), "USD", 1000), False, id="unit-price"),
        pytest.param(Price(Decimal("1.50"), "EUR", 1000), False, id="currency"),
        pytest.param(Price(Decimal("1.50"), "USD", 100), False, id="per"),
    ],
)
def test_a_version_shares_the_prices_it_does_not_change_with_the_one_before(
    changed: Price, shared: bool
) -> None:
    first = Price(Decimal("1.50"), "USD", 1000)
    book = PriceBook.start(PriceList({"a": first, "b": first}))
    book.publish(PriceList({"a": changed, "b": first, "c": first}), FEB)
    v1, v2 = (v.prices.prices for v in book.versions)
    assert v2 == {"a": changed, "b": first, "c": first}
    assert str(v2["a"].unit_price) == str(changed.unit_price)  # as written
    assert (v2["a"] is v1["a"]) is shared
    assert v2["b"] is v1["b"]
    assert v2["c"] is not v1["b"]  # a meter new in the version: its own
    ledger = memory_ledger()
    ledger.save(book)
    loaded = ledger.repository.get(PRICE_BOOK_ID, deepcopy_from_cache=False)
    assert isinstance(loaded, PriceBook) and loaded is not book
    assert [v.prices for v in loaded.versions] == [v.prices for v in book.versions]
    assert loaded.versions[1].prices.prices["b"] is loaded.versions[0].prices.prices["b"]


def test_a_book_stored_and_loaded_has_the_same_versions() -> None:
    ledger = memory_ledger()
    book = _book(("0.001", EPOCH), ("0.002", FEB))
    ledger.save(book)
    loaded = ledger.repository.get(PRICE_BOOK_ID)
    assert isinstance(loaded, PriceBook)
    assert loaded.versions == book.versions
    assert loaded.price_at(FEB).prices.price_of("api") == Price(Decimal("0.002"), "USD")


# ---------------------------------------------------------------------------------------------
# Publishing checks the whole version first


@pytest.mark.parametrize(
    ("prices", "reason"),
    [
        pytest.param(PriceList({}), r"^price list has no \[meters\.NAME\] tables$", id="empty"),
        pytest.param(_prices("1", per=3), "^meter 'api': one unit cannot be priced", id="per-3"),
        pytest.param(
            _prices("-1"), "^meter 'api': unit_price must be a number >= 0, got '-1'$", id="neg"
        ),
        pytest.param(_prices("1", currency="XYZ"), "^meter 'api': ", id="currency"),
    ],
)
def test_publishing_an_invalid_version_records_nothing(prices: PriceList, reason: str) -> None:
    book = PriceBook.start(_prices("1"))
    book.collect_events()
    with pytest.raises(PriceListError, match=reason):
        book.publish(prices, FEB)
    assert book.collect_events() == []
    assert [v.number for v in book.versions] == [1]


def test_starting_a_book_from_an_invalid_version_is_refused() -> None:
    with pytest.raises(PriceListError, match="one unit cannot be priced"):
        PriceBook.start(_prices("1", per=3))


@pytest.mark.parametrize(
    ("moment", "reason"),
    [
        pytest.param(
            datetime(2027, 1, 1),
            r"^effective_from 2027-01-01T00:00:00 has no time zone:"
            r" give one \(2027-01-01T00:00:00Z\)$",
            id="naive",
        ),
        pytest.param(
            datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))),
            r"^effective_from 9999-12-31T23:00:00-05:00 is not a moment in years 1 to 9999"
            r" in UTC: give one that is$",
            id="after-9999",
        ),
        pytest.param(
            datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))),
            r"^effective_from 0001-01-01T00:00:00\+01:00 is not a moment in years 1 to 9999"
            r" in UTC: give one that is$",
            id="before-year-1",
        ),
    ],
)
def test_an_effective_from_that_is_no_moment_in_utc_is_refused_recording_nothing(
    moment: datetime, reason: str
) -> None:
    book = PriceBook.start(_prices("1"))
    book.collect_events()
    with pytest.raises(PriceListError, match=reason):
        book.publish(_prices("2"), moment)
    assert book.collect_events() == []
    assert [v.number for v in book.versions] == [1]


def test_the_first_and_last_moments_utc_holds_are_moments_like_any() -> None:
    last = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    first = datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=-1)))
    book = _book(("1", EPOCH), ("2", last), ("3", first))
    assert [v.effective_from for v in book.versions[1:]] == [last, datetime(1, 1, 1, 1, tzinfo=UTC)]
    assert _price_at(book, last) == (2, Decimal(2))
    assert _price_at(book, last - TICK) == (1, Decimal(1))
    assert _price_at(book, datetime(1, 1, 1, 1, tzinfo=UTC) - TICK) == (3, Decimal(3))


# ---------------------------------------------------------------------------------------------
# price_at


def test_a_version_prices_from_exactly_its_effective_from() -> None:
    book = _book(("1", EPOCH), ("2", FEB))
    assert _price_at(book, FEB - TICK) == (1, Decimal(1))
    assert _price_at(book, FEB) == (2, Decimal(2))
    assert _price_at(book, FEB + TICK) == (2, Decimal(2))


def test_the_latest_effective_version_at_or_before_the_moment_prices_it() -> None:
    book = _book(("1", EPOCH), ("2", JAN), ("3", FEB), ("4", MAR))
    assert _price_at(book, EPOCH) == (1, Decimal(1))
    assert _price_at(book, JAN + timedelta(days=3)) == (2, Decimal(2))
    assert _price_at(book, FEB + timedelta(days=3)) == (3, Decimal(3))
    assert _price_at(book, MAR + timedelta(days=300)) == (4, Decimal(4))


def test_usage_before_the_earliest_version_is_priced_by_the_earliest() -> None:
    book = _book(("1", FEB), ("2", MAR))
    assert _price_at(book, JAN) == (1, Decimal(1))
    # Published later for an earlier moment: now it is the earliest.
    book.publish(_prices("3"), JAN)
    assert _price_at(book, JAN - TICK) == (3, Decimal(3))
    assert _price_at(book, JAN) == (3, Decimal(3))


def test_a_version_published_for_an_earlier_moment_takes_its_place_by_effective_from() -> None:
    book = _book(("1", EPOCH), ("2", MAR))
    book.publish(_prices("3"), JAN)  # a correction, published after version 2
    assert _price_at(book, JAN - TICK) == (1, Decimal(1))
    assert _price_at(book, FEB) == (3, Decimal(3))
    assert _price_at(book, MAR) == (2, Decimal(2))


def test_of_versions_with_the_same_effective_from_the_one_published_last_prices() -> None:
    book = _book(("1", EPOCH), ("2", FEB), ("3", FEB), ("4", MAR))
    assert _price_at(book, FEB) == (3, Decimal(3))
    assert _price_at(book, MAR - TICK) == (3, Decimal(3))
    book.publish(_prices("5"), FEB)
    assert _price_at(book, FEB) == (5, Decimal(5))
    assert _price_at(book, MAR) == (4, Decimal(4))


def test_a_tie_at_the_earliest_moment_goes_to_the_one_published_last() -> None:
    book = _book(("1", FEB), ("2", FEB))
    assert _price_at(book, JAN) == (2, Decimal(2))
    assert _price_at(book, FEB) == (2, Decimal(2))


# ---------------------------------------------------------------------------------------------
# PriceSchedule


def test_a_schedule_finds_each_version_by_its_number_only() -> None:
    schedule = _book(("1", EPOCH), ("2", FEB)).schedule
    assert schedule.book_id == PRICE_BOOK_ID
    assert schedule.version(0) is None
    assert schedule.version(-1) is None
    assert schedule.version(1) is schedule.versions[0]
    assert schedule.version(2) is schedule.versions[1]
    assert schedule.version(3) is None
    assert schedule.latest is schedule.versions[1]


def test_the_latest_is_the_one_published_last_not_the_latest_effective() -> None:
    schedule = _book(("1", MAR), ("2", JAN)).schedule
    assert schedule.latest.number == 2


def test_a_schedule_without_a_version_is_refused() -> None:
    with pytest.raises(
        PriceListError, match=f"^price book {PRICE_BOOK_ID} has no version: publish one first$"
    ):
        PriceSchedule(PRICE_BOOK_ID, [])


def test_a_bare_price_list_is_the_initial_version_of_the_book() -> None:
    prices = _prices("0.5")
    schedule = as_schedule(prices)
    assert schedule.book_id == PRICE_BOOK_ID
    assert schedule.versions == (PriceVersion(PRICE_BOOK_ID, 1, EPOCH, prices),)
    assert schedule.price_at(datetime(1900, 1, 1, tzinfo=UTC)).number == 1
    assert as_schedule(schedule) is schedule
    assert PriceSchedule.initial(prices).versions == schedule.versions


# ---------------------------------------------------------------------------------------------
# PriceList as a [meters] table


def test_to_meters_and_from_meters_give_each_other_back() -> None:
    prices = PriceList.from_toml(EXAMPLE.read_text(encoding="utf-8"))
    meters = prices.to_meters()
    assert meters["gpt-4o.input_tokens"] == {
        "unit_price": "2.50",
        "per": 1_000_000,
        "currency": "USD",
    }
    assert meters["api.requests"] == {"unit_price": "0.001", "per": 1, "currency": "USD"}
    assert PriceList.from_meters(meters) == prices


@pytest.mark.parametrize("meters", [None, [], {}, "m"])
def test_from_meters_refuses_what_is_not_a_table_of_meters(meters: object) -> None:
    with pytest.raises(PriceListError, match=r"^price list has no \[meters\.NAME\] tables$"):
        PriceList.from_meters(meters)
