"""``OrjsonTranscoder`` writes the very bytes eventsourcing's ``JSONTranscoder`` writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from enum import StrEnum
from typing import Any
from uuid import UUID

import pytest
from eventsourcing.application import Application
from eventsourcing.persistence import JSONTranscoder, Mapper
from hypothesis import given
from hypothesis import strategies as st

from domain.account import CustomerAccount
from domain.ids import account_id, transaction_id
from domain.price_book import PRICE_BOOK_ID
from domain.transaction import BillingTransaction
from store.recorder import OrjsonTranscoder

AT = datetime(2026, 12, 2, 10, 15, 0, 123456, tzinfo=UTC)


def _transcoders() -> tuple[JSONTranscoder, JSONTranscoder]:
    app = Application[UUID](env={"PERSISTENCE_MODULE": "eventsourcing.popo"})
    stock, ours = JSONTranscoder(), OrjsonTranscoder()
    app.register_transcodings(stock)
    app.register_transcodings(ours)
    return stock, ours


class Colour(StrEnum):
    RED = "red"


STATES: list[Any] = [
    {"s": "plain ascii", "i": 7, "b": True, "n": None, "neg": -(2**63)},
    {"u": UUID(int=12345), "d": Decimal("0.000001"), "t": AT},
    {"tz": datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=-5, minutes=-30)))},
    {"escapes": 'q"uote\\back\nline\ttab\x00\x1f\x7f', "unicode": "é€😀\u2028"},
    {"big": 2**64 + 1},  # beyond orjson's ints: the library's encoder
    {"nested": {"u": UUID(int=1)}, "list": [Decimal("1.5"), AT]},  # nested: the library's
    {"subclass": Colour.RED},  # a str subclass: the library's
    {"empty": ""},
    {},
    ["a", "list", "at", "the", "top"],
    # lists of plain values (orjson's), and of anything else (the library's)
    {"ids": ["a", 'q"uote\\\n\x00\x1f\x7fé€😀\u2028', ""], "counts": [1, -(2**63), 2**63 - 1]},
    {"mixed": ["x", 1, True, None, False], "empty": [], "u": UUID(int=3)},
    {"big_in_list": [1, 2**64 + 1]},  # beyond orjson's ints: the library's encoder
    {"floats": [1.5, 0.1]},  # not a plain value here: the library's
    {"nested_list": [["a"], ["b"]]},
    {"tuple": ("a", "b")},  # not a list: the library's
    {"subclass_in_list": [Colour.RED, "red"]},
]


@pytest.mark.parametrize("state", STATES, ids=range(len(STATES)))
def test_same_bytes_as_the_library_and_read_back_by_it(state: Any) -> None:
    stock, ours = _transcoders()
    assert ours.encode(state) == stock.encode(state)
    assert stock.decode(ours.encode(state)) == stock.decode(stock.encode(state))


@pytest.mark.parametrize("state", [{"s": "\ud800"}, {"ids": ["a", "\ud800"]}])
def test_text_utf_8_cannot_hold_is_refused_as_the_library_refuses_it(state: Any) -> None:
    stock, ours = _transcoders()
    with pytest.raises(UnicodeEncodeError):
        stock.encode(state)
    with pytest.raises(UnicodeEncodeError):
        ours.encode(state)


def test_the_ledgers_events_are_stored_byte_for_byte_as_before() -> None:
    stock, ours = _transcoders()
    txn = BillingTransaction(
        customer_id="acme",
        usage_id="req-1",
        meter="gpt-4o.input_tokens",
        quantity=Decimal("1520"),
        unit_price=Decimal("2.50"),
        per=1_000_000,
        amount=0,
        currency="USD",
        occurred_at=AT,
        source="usage/0@41",
        price_book_id=PRICE_BOOK_ID,
        price_version=2,
    )
    txn.reserve(account_id("acme", "USD"))
    account = CustomerAccount.open("acme", "USD", 250)
    account.reserve_all([(transaction_id("acme", "req-1"), 5)])
    for event in [*txn.collect_events(), *account.collect_events()]:
        assert Mapper(ours).to_stored_event(event) == Mapper(stock).to_stored_event(event)
        assert Mapper(stock).to_domain_event(Mapper(ours).to_stored_event(event)) == event


_PLAIN = (
    st.text()
    | st.integers(min_value=-(2**63), max_value=2**64 + 10)
    | st.booleans()
    | st.none()
    | st.floats(allow_nan=False)
)


@given(st.dictionaries(st.text(), _PLAIN | st.lists(_PLAIN, max_size=8), max_size=6))
def test_any_flat_state_with_lists_is_the_librarys_bytes(state: dict[str, Any]) -> None:
    stock, ours = _transcoders()
    try:
        expected = stock.encode(state)
    except UnicodeEncodeError:  # a lone surrogate: refused by both
        with pytest.raises(UnicodeEncodeError):
            ours.encode(state)
        return
    assert ours.encode(state) == expected
