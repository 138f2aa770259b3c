"""``store.batch_reads.clone`` is ``copy.deepcopy`` for what a batch reads: the same
structure and values, aliases kept, nothing shared but immutable values."""

from __future__ import annotations

from copy import deepcopy
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from typing import Any
from uuid import UUID

from domain.account import CustomerAccount
from domain.credit_line import CreditLine
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine
from domain.metering import Metering
from domain.metering_events import meter_batch_events
from domain.periods import PeriodPolicy
from domain.pricing import Price, PriceList
from domain.transaction import Source
from domain.usage import UsageRecord
from store.batch_reads import _plain, clone

PRICES = PriceList({"api.requests": Price(Decimal("0.01"), "USD")})
NOW = datetime(2026, 12, 15, tzinfo=UTC)


def _aggregates() -> list[Any]:
    """An account with a grant, alerts and a top-up rule, its usage line, credit line and
    invoice, as a batch leaves them (saved: no pending events)."""
    account = CustomerAccount.open("acme", "USD", 10**9)
    account.grant_credit(
        "g", 10**6, effective_at=NOW - timedelta(days=1), source="promotional", reason="r"
    )
    account.set_alerts(["balance:100", "percent_of_grant:50", "spend:1000"])
    account.set_top_up(100, 1000)
    account.collect_events()
    stored: dict[UUID, Any] = {account.id: account}
    usage = [
        Metering(
            UsageRecord(
                usage_id=f"u-{n}", customer_id="acme", meter="api.requests",
                quantity=Decimal(n + 1), occurred_at=NOW - timedelta(hours=1),
            ),
            Source("usage", 0, n),
        )
        for n in range(5)
    ]  # fmt: skip
    decision = meter_batch_events(
        usage, PRICES, load_account=lambda c, cur: stored.get(account.id),
        load_line=lambda i: None, load_invoice=lambda i: None, periods=PeriodPolicy(),
        now=NOW,
    )  # fmt: skip
    for aggregate in decision.touched:
        aggregate.collect_events()
    return decision.touched


def _same(a: Any, b: Any) -> None:
    """Equal, value for value, down to the plain objects' fields."""
    assert type(a) is type(b)
    if _plain(type(a)):
        _same(vars(a), vars(b))
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _same(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a == b


def _mutable_ids(value: Any, found: set[int]) -> set[int]:
    """The ids of every mutable object reachable from ``value``."""
    if _plain(type(value)):
        found.add(id(value))
        _mutable_ids(vars(value), found)
    elif isinstance(value, dict):
        found.add(id(value))
        for key, item in value.items():
            _mutable_ids(key, found)
            _mutable_ids(item, found)
    elif isinstance(value, list | set):
        found.add(id(value))
        for item in value:
            _mutable_ids(item, found)
    elif isinstance(value, tuple):
        for item in value:
            _mutable_ids(item, found)
    return found


def test_a_batchs_aggregates_are_cloned_as_deepcopy_copies_them() -> None:
    touched = _aggregates()
    kinds = {type(a) for a in touched}
    assert {CustomerAccount, InvoiceLine, CreditLine, Invoice} <= kinds
    for aggregate in touched:
        copied = clone(aggregate)
        _same(copied, deepcopy(aggregate))
        _same(copied, aggregate)
        assert repr(copied) == repr(aggregate)
        # Nothing mutable is shared with the original.
        assert not _mutable_ids(copied, set()) & _mutable_ids(aggregate, set())


def test_a_clone_changes_apart_from_its_original() -> None:
    account = next(a for a in _aggregates() if isinstance(a, CustomerAccount))
    copied = clone(account)
    copied.reserve_all([(UUID(int=1), Decimal(5))])
    copied.grants["g"].consumed = Decimal(7)
    copied.void_credit("g", "test")
    assert account.grants["g"].consumed != Decimal(7)
    assert account.grants["g"].voided == 0
    assert account.reserved != copied.reserved
    assert not account.pending_events


class _Colour(StrEnum):
    RED = "red"


@dataclass
class _Box:
    items: list[int]
    more: list[int]
    pair: tuple[Any, ...]
    colours: set[str]
    colour: _Colour
    at: datetime


def test_aliases_stay_aliases_and_immutables_are_shared() -> None:
    shared = [1, 2]
    at = datetime(2026, 1, 1, tzinfo=UTC)
    box = _Box(shared, shared, (1, "a", at), {"x"}, _Colour.RED, at)
    outer = {"a": box, "b": box, "t": (box, 1), "u": (1, 2)}
    copied = clone(outer)
    assert copied["a"] is copied["b"]  # one object twice stays one
    assert copied["a"] is not box
    assert copied["a"].items is copied["a"].more
    assert copied["a"].items is not shared and copied["a"].items == shared
    assert copied["a"].pair is box.pair  # a tuple of immutables is shared, as deepcopy does
    assert copied["t"] is not outer["t"] and copied["t"][0] is copied["a"]
    assert copied["u"] is outer["u"]
    assert copied["a"].colours == {"x"} and copied["a"].colours is not box.colours
    assert copied["a"].colour is _Colour.RED
    assert copied["a"].at is at
    copied["a"].items.append(3)
    assert shared == [1, 2]


class _Hooked:
    def __init__(self) -> None:
        self.seen: list[int] = []

    def __deepcopy__(self, memo: dict[int, Any]) -> _Hooked:
        copied = _Hooked()
        copied.seen = [*self.seen, -1]
        return copied


class _Slotted:
    __slots__ = ("value",)

    def __init__(self, value: list[int]) -> None:
        self.value = value


def test_objects_with_their_own_copying_are_left_to_deepcopy() -> None:
    assert not _plain(_Hooked)
    assert not _plain(_Slotted)
    assert not _plain(list) and not _plain(type)
    assert _plain(_Box)
    assert clone({"h": _Hooked()})["h"].seen == [-1]
    slotted = _Slotted([1])
    copied = clone([slotted, slotted])
    assert copied[0] is copied[1] and copied[0].value == [1]
    assert copied[0].value is not slotted.value
