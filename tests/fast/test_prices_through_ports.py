"""The ledger's price book on the in-memory store: the configured prices until a book
exists, the book's versions from the next batch after each publication."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from domain.ids import transaction_id
from domain.metering import Metering
from domain.price_book import EPOCH, PRICE_BOOK_ID
from domain.pricing import Price, PriceList
from domain.transaction import Source
from tests.fast.fakes import T0, memory_ledger, usage

CHEAP = PriceList({"api.requests": Price(Decimal("0.001"), "USD")})
DEAR = PriceList({"api.requests": Price(Decimal("0.003"), "USD")})


def _record(usage_id: str, occurred_at: datetime, offset: int) -> Metering:
    record = usage(usage_id).model_copy(update={"occurred_at": occurred_at})
    return Metering(record, Source("usage", 0, offset))


def test_without_a_book_the_configured_prices_are_the_initial_version() -> None:
    ledger = memory_ledger()
    assert ledger.price_book() is None
    schedule = ledger.refresh_prices()
    assert schedule is ledger.configured
    assert [(v.book_id, v.number, v.effective_from) for v in schedule.versions] == [
        (PRICE_BOOK_ID, 1, EPOCH)
    ]


def test_the_book_is_started_once_with_the_configured_file() -> None:
    ledger = memory_ledger()
    started = ledger.start_price_book(CHEAP)
    assert started is not None and (started.number, started.prices) == (1, CHEAP)
    assert ledger.start_price_book(DEAR) is None  # there already: nothing published
    book = ledger.price_book()
    assert book is not None and [v.prices for v in book.versions] == [CHEAP]


def test_publishing_to_a_ledger_without_a_book_starts_it_with_the_configured_prices() -> None:
    """Usage recorded before the book was started names version 1, priced by the
    configured file: the book starts with that file as version 1 from the epoch, and what
    is published becomes version 2, in force from its own moment only."""
    ledger = memory_ledger()  # configured: the shipped file, no book yet
    ledger.record_usage([_record("before-the-book", T0, 1)])
    version = ledger.publish_prices(DEAR, T0 + timedelta(days=30))
    assert (version.number, version.effective_from, version.prices) == (
        2, T0 + timedelta(days=30), DEAR,
    )  # fmt: skip
    book = ledger.price_book()
    assert book is not None
    assert [(v.number, v.effective_from, v.prices) for v in book.versions] == [
        (1, EPOCH, ledger.configured.latest.prices),
        (2, T0 + timedelta(days=30), DEAR),
    ]
    ledger.record_usage([_record("now", T0 + timedelta(days=1), 2)])
    for usage_id in ("before-the-book", "now"):  # the configured price: 1,000 x 0.001 USD
        txn = ledger.transaction(transaction_id("acme", usage_id))
        assert (txn.price_version, txn.amount) == (1, Decimal(100))


def test_each_batch_prices_by_the_book_as_published_before_it() -> None:
    ledger = memory_ledger()
    ledger.start_price_book(CHEAP)
    ledger.record_usage([_record("a", T0, 1)])
    assert ledger.publish_prices(DEAR, T0 + timedelta(hours=1)).number == 2
    ledger.record_usage(
        [_record("b", T0 + timedelta(minutes=59), 2), _record("c", T0 + timedelta(hours=1), 3)]
    )
    priced = {
        u: (t.price_version, t.amount)
        for u in "abc"
        for t in [ledger.transaction(transaction_id("acme", u))]
    }
    assert priced == {"a": (1, Decimal(100)), "b": (1, Decimal(100)), "c": (2, Decimal(300))}
    current = ledger.refresh_prices()
    assert current.latest.prices == DEAR
    assert ledger.refresh_prices() is current  # an unchanged book: not rebuilt per batch


def test_a_newer_version_is_seen_by_a_ledger_that_already_read_the_book() -> None:
    writer = memory_ledger()
    writer.start_price_book(CHEAP)
    first = writer.refresh_prices()
    writer.publish_prices(DEAR, datetime(2027, 1, 1, tzinfo=UTC))
    second = writer.refresh_prices()
    assert second is not first
    assert [v.number for v in second.versions] == [1, 2]


def test_a_configured_file_that_is_no_version_of_the_book_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = memory_ledger()  # configured: the shipped file
    ledger.start_price_book(CHEAP)  # the book started from another file
    with caplog.at_level(logging.WARNING, logger="store.ledger"):
        ledger.refresh_prices()
        ledger.publish_prices(DEAR, T0)
        ledger.refresh_prices()
    [warning] = caplog.messages
    assert warning.startswith(
        "the configured price file (BILLING_LEDGER_PRICE_LIST) is not a version of the price book"
    )
    assert "`billing-ledger prices publish`" in warning


def test_a_configured_file_the_book_holds_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    ledger = memory_ledger()
    ledger.start_price_book(CHEAP)
    ledger.publish_prices(ledger.configured.latest.prices, T0)  # an older version, later
    with caplog.at_level(logging.WARNING, logger="store.ledger"):
        assert ledger.refresh_prices().latest.number == 2
    assert caplog.messages == []


def test_a_batch_prices_by_the_book_as_it_was_when_the_batch_was_decided() -> None:
    """What docs/operate/prices.md promises, exactly: a version prices the batches each
    worker decides after it is published; a batch decided just before keeps the book it
    was decided with, even when its save lands after the publication (the ingest's
    write-behind saves one batch while it decides the next)."""
    ledger = memory_ledger()
    ledger.start_price_book(CHEAP)
    decided = ledger.decide([_record("decided-before", T0, 1)])
    ledger.publish_prices(DEAR, EPOCH)
    ledger.save_decided(decided)
    ledger.record_usage([_record("decided-after", T0, 2)])
    priced = {
        u: ledger.transaction(transaction_id("acme", u)).price_version
        for u in ("decided-before", "decided-after")
    }
    assert priced == {"decided-before": 1, "decided-after": 2}
