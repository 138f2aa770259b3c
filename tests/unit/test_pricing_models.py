"""Pricing models (``domain.pricing``): each a function ``f(Q)`` of a line's total quantity,
a record's amount what it adds to that total, checked against a simple oracle and
through the ingest decision whatever the order and batching of the records."""

from __future__ import annotations

import itertools
import math
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.account import CustomerAccount
from domain.errors import InvalidUsage, PriceListError
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine
from domain.metering import Metering
from domain.metering_events import meter_batch_events
from domain.periods import PeriodPolicy
from domain.price_book import PriceBook
from domain.pricing import MAX_TIERS, Price, PriceList, Tier
from domain.transaction import Source
from domain.usage import UsageRecord

GRADUATED = Price(
    Decimal("2.50"),
    "USD",
    per=1000,
    model="graduated",
    tiers=(Tier(1000, Decimal("2.50")), Tier(5000, Decimal("2.00")), Tier(None, Decimal("1"))),
)
VOLUME = Price(
    Decimal("3"),
    "USD",
    model="volume",
    tiers=(Tier(10, Decimal("3")), Tier(100, Decimal("2")), Tier(None, Decimal("0.5"))),
)
PACKAGE = Price(Decimal("5"), "USD", model="package", package_size=100)
FEE = Price(Decimal("0.01"), "USD", flat_fee=Decimal("20"))
GRADUATED_FEE = Price(
    GRADUATED.unit_price, "USD", GRADUATED.per, "graduated", GRADUATED.tiers,
    flat_fee=Decimal("0.5"),
)  # fmt: skip
MODELS = {
    "graduated": GRADUATED,
    "volume": VOLUME,
    "package": PACKAGE,
    "per_unit_fee": FEE,
    "graduated_fee": GRADUATED_FEE,
}


# ---------------------------------------------------------------------------------------------
# f(Q), by example


@pytest.mark.parametrize(
    ("price", "quantity", "minor"),
    [
        (GRADUATED, 0, "0"),
        (GRADUATED, 1000, "250"),  # 1,000 at 2.50 per 1,000
        (GRADUATED, 1001, "250.2"),  # the 1,001st at 2.00 per 1,000
        (GRADUATED, 6000, "1150"),  # 250 + 800 + 1,000 x 1 per 1,000 = 100
        (VOLUME, 10, "3000"),  # all 10 at 3 (up_to is inclusive)
        (VOLUME, 11, "2200"),  # all 11 at 2: cheaper than 10
        (VOLUME, 200, "10000"),
        (PACKAGE, 1, "500"),  # a started block counts whole
        (PACKAGE, 100, "500"),
        (PACKAGE, Decimal("100.5"), "1000"),
        (FEE, 0, "0"),  # no usage, no fee
        (FEE, 1, "2001"),
        (GRADUATED_FEE, 1000, "300"),
    ],
)
def test_each_model_prices_a_lines_total_quantity(
    price: Price, quantity: int | Decimal, minor: str
) -> None:
    assert price.total(Decimal(quantity)) == Decimal(minor)


def test_a_records_amount_is_what_it_adds_to_its_lines_total() -> None:
    assert (
        GRADUATED.increment(Decimal(900), Decimal(200)) == 25 + 20
    )  # 100 at 2.50, 100 at 2.00 per 1,000
    assert FEE.increment(Decimal(0), Decimal(1)) == Decimal("2001")  # the first carries the fee
    assert FEE.increment(Decimal(1), Decimal(1)) == Decimal("1")


def test_a_volume_tier_can_make_a_records_amount_negative() -> None:
    assert VOLUME.increment(Decimal(10), Decimal(1)) == Decimal(-800)  # 3,000 -> 2,200


def test_the_tier_reached_and_its_rate() -> None:
    assert [GRADUATED.tier_reached(Decimal(q)) for q in (0, 1, 1000, 1001, 10**9)] == [
        None, 1, 1, 2, 3,
    ]  # fmt: skip
    assert VOLUME.rate_at(Decimal(50)) == Decimal(2)
    assert PACKAGE.tier_reached(Decimal(5)) is None
    assert PACKAGE.rate_at(Decimal(5)) == Decimal(5)


def test_only_a_per_unit_price_without_a_fee_is_priced_alone() -> None:
    assert not Price(Decimal(1), "USD").by_line
    assert all(price.by_line for price in MODELS.values())


# ---------------------------------------------------------------------------------------------
# the price file


TIERED_TOML = """
[meters.tokens]
model = "graduated"
per = 1_000_000
currency = "USD"
tiers = [{up_to = 1000000, unit_price = "2.50"}, {unit_price = "2.00"}]
flat_fee = "10"

[meters.seats]
model = "package"
package_size = 5
unit_price = "40"
currency = "EUR"

[meters.calls]
unit_price = "0.001"
currency = "USD"
"""


def test_a_price_file_holds_each_model_and_the_book_stores_it_as_written() -> None:
    prices = PriceList.from_toml(TIERED_TOML)
    tokens = prices.price_of("tokens")
    assert (tokens.model, tokens.per, tokens.flat_fee) == ("graduated", 1_000_000, Decimal(10))
    assert tokens.tiers == (Tier(1_000_000, Decimal("2.50")), Tier(None, Decimal("2.00")))
    assert prices.price_of("seats").package_size == 5
    assert prices.to_meters()["calls"] == {"unit_price": "0.001", "per": 1, "currency": "USD"}
    assert PriceList.from_meters(prices.to_meters()) == prices
    book = PriceBook.start(prices)
    [_, published] = book.collect_events()
    assert published.meters["tokens"]["tiers"] == [
        {"up_to": 1_000_000, "unit_price": "2.50"},
        {"unit_price": "2.00"},
    ]
    reloaded = PriceBook.start(PriceList.from_meters(published.meters))
    assert reloaded.schedule.latest.prices == prices


def test_a_version_shares_an_unchanged_tiered_price_with_the_version_before() -> None:
    book = PriceBook.start(PriceList.from_toml(TIERED_TOML))
    book.publish(PriceList.from_toml(TIERED_TOML), datetime(2027, 1, 1, tzinfo=UTC))
    first, second = (v.prices.price_of("tokens") for v in book.versions)
    assert first is second
    assert book.schedule.by_line_meters == {"tokens", "seats"}


def test_a_published_version_from_before_models_loads_per_unit() -> None:
    price = Price.from_spec({"unit_price": "2.50", "per": 1000, "currency": "USD"})
    assert (price.model, price.by_line) == ("per_unit", False)


def test_every_problem_of_a_price_file_is_listed() -> None:
    bad = {
        "a": {"model": "graduated", "currency": "USD", "tiers": [
            {"up_to": 10, "unit_price": "1"}, {"up_to": 10, "unit_price": "-1"},
            {"up_to": 5, "unit_price": "1"}, {"up_to": 20, "unit_price": "1"},
        ]},
        "b": {"model": "volume", "currency": "USD", "tiers": [{"unit_price": "1"}, {"up_to": 3, "unit_price": "1"}]},  # noqa: E501
        "c": {"model": "package", "currency": "USD", "unit_price": "1", "package_size": 0},
        "d": {"model": "staircase", "currency": "USD", "unit_price": "1"},
        "e": {"currency": "USD", "unit_price": "1", "flat_fee": "-2"},
        "f": {"model": "graduated", "currency": "USD", "per": 3, "tiers": [{"unit_price": "1"}]},
        "g": {"model": "volume", "currency": "USD", "tiers": [
            {"up_to": n, "unit_price": "1"} for n in range(1, MAX_TIERS + 1)
        ] + [{"unit_price": "1"}]},
    }  # fmt: skip
    with pytest.raises(PriceListError) as raised:
        PriceList.from_meters(bad)
    problems = str(raised.value).split("; ")
    assert problems == [
        "meter 'a': tier 2: unit_price must be a number >= 0, got '-1'",
        "meter 'a': tier 2: up_to 10 is not above the tier before's 10 (bounds must increase:"
        " overlapping, out of order or duplicate)",
        "meter 'a': tier 3: up_to 5 is not above the tier before's 10 (bounds must increase:"
        " overlapping, out of order or duplicate)",
        "meter 'a': tier 4: the last tier must be unbounded (no up_to), got 20",
        "meter 'b': tier 1: only the last tier is unbounded (give up_to)",
        "meter 'b': tier 2: the last tier must be unbounded (no up_to), got 3",
        "meter 'c': package_size must be a whole number above 0, got 0",
        "meter 'd': unknown model 'staircase' (one of per_unit, graduated, volume, package)",
        "meter 'e': flat_fee must be a number >= 0, got '-2'",
        "meter 'f': tier 1: one unit cannot be priced: amount_not_exact: 1 x 1 / 3 USD needs"
        " more than 38 significant digits",
        f"meter 'g': {MAX_TIERS + 1} tiers: at most {MAX_TIERS}",
    ]


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"model": "graduated", "tiers": []}, "a graduated price needs tiers"),
        ({"model": "volume", "unit_price": "1", "tiers": [{"unit_price": "1"}]}, "per tier"),
        ({"unit_price": "1", "tiers": [{"unit_price": "1"}]}, "tiers apply to models"),
        ({"unit_price": "1", "package_size": 2}, "package_size applies to model 'package'"),
        ({"model": "package", "unit_price": "1", "per": 10}, "per does not apply"),
        ({"model": "volume", "tiers": [{"up_to": 0, "unit_price": "1"}, {"unit_price": "1"}]},
         r"up_to must be a whole number from 1 to 10\^30"),
        ({"model": "volume", "tiers": ["x"]}, "tier 1: expected"),
        ({"model": "package"}, "missing 'unit_price'"),
    ],
)  # fmt: skip
def test_a_price_that_does_not_make_sense_is_refused(spec: dict[str, Any], problem: str) -> None:
    with pytest.raises(PriceListError, match=problem):
        PriceList.from_meters({"m": {"currency": "USD", **spec}})


# ---------------------------------------------------------------------------------------------
# each model against an oracle written differently: unit by unit, in fractions


def _oracle(price: Price, quantity: int) -> Fraction:
    """f(quantity) in minor units, counted one unit at a time."""
    cents = Fraction(100)
    fee = Fraction(price.flat_fee) * cents if quantity else Fraction(0)
    if price.model == "package":
        return (
            math.ceil(Fraction(quantity, price.package_size)) * Fraction(price.unit_price) * cents
            + fee
        )
    bounds = [t.up_to if t.up_to is not None else math.inf for t in price.tiers]
    rates = [Fraction(t.unit_price) / price.per * cents for t in price.tiers]
    if price.model == "volume":
        reached = next(n for n, bound in enumerate(bounds) if quantity <= bound)
        return quantity * rates[reached] + fee
    if price.model == "graduated":
        return sum((rates[next(n for n, b in enumerate(bounds) if unit <= b)]
                    for unit in range(1, quantity + 1)), Fraction(0)) + fee  # fmt: skip
    return quantity * Fraction(price.unit_price) / price.per * cents + fee


def _tiered(model: str) -> st.SearchStrategy[Price]:
    bounds = st.lists(st.integers(1, 60), min_size=0, max_size=4, unique=True).map(sorted)
    rate = st.decimals(min_value=0, max_value=50, places=2)
    return st.builds(
        lambda ups, rates, per, fee: Price(
            rates[0], "USD", per, model,
            tuple(Tier(u, r) for u, r in zip([*ups, None], rates, strict=False)), flat_fee=fee,
        ),
        bounds, st.lists(rate, min_size=5, max_size=5), st.sampled_from([1, 4, 10]),
        st.sampled_from([Decimal(0), Decimal("1.5")]),
    )  # fmt: skip


PRICES = st.one_of(
    _tiered("graduated"),
    _tiered("volume"),
    st.builds(
        lambda rate, per: Price(rate, "USD", per, flat_fee=Decimal("0.25")),
        st.decimals(min_value=0, max_value=50, places=2),
        st.sampled_from([1, 4, 10]),
    ),
    st.builds(
        lambda size, rate: Price(rate, "USD", model="package", package_size=size),
        st.integers(1, 30),
        st.decimals(min_value=0, max_value=50, places=2),
    ),
)


@settings(max_examples=200, deadline=None)
@given(price=PRICES, quantity=st.integers(0, 200))
def test_each_model_agrees_with_a_unit_by_unit_oracle(price: Price, quantity: int) -> None:
    assert Fraction(price.total(Decimal(quantity))) == _oracle(price, quantity)


# ---------------------------------------------------------------------------------------------
# through ingest: the line's total is f(its quantity), whatever the order and batching

AT = datetime(2026, 12, 2, 10, tzinfo=UTC)
PERIODS = PeriodPolicy()


class _Store:
    """Accounts, lines and invoices as if saved between batches."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.lines: dict[UUID, InvoiceLine] = {}
        self.invoices: dict[UUID, Invoice] = {}
        self.accounts: dict[tuple[str, str], CustomerAccount] = {}

    def run(self, prices: PriceList, batch: list[Metering]) -> Any:
        result = meter_batch_events(
            batch, prices,
            load_account=lambda c, cur: self.accounts.get((c, cur)) or CustomerAccount.open(c, cur, self.limit),  # noqa: E501
            load_line=self.lines.get, load_invoice=self.invoices.get,
            periods=PERIODS, now=AT,
        )  # fmt: skip
        for aggregate in result.touched:
            aggregate.collect_events()
        self.lines.update((line.id, line) for line in result.lines)
        self.invoices.update((invoice.id, invoice) for invoice in result.invoices)
        self.accounts.update(((a.customer_id, a.currency), a) for a in result.accounts)
        return result


def _records(quantities: list[int]) -> list[Metering]:
    return [
        Metering(
            UsageRecord(
                usage_id=f"r{n}", customer_id="acme", meter="m", quantity=Decimal(q),
                occurred_at=AT + timedelta(seconds=n),
            ),
            Source("usage", 0, n),
        )
        for n, q in enumerate(quantities)
    ]  # fmt: skip


def _batches(records: list[Metering], cuts: list[int]) -> list[list[Metering]]:
    edges = sorted({0, len(records), *(c % (len(records) + 1) for c in cuts)})
    return [records[a:b] for a, b in itertools.pairwise(edges)]


@settings(max_examples=60, deadline=None)
@given(
    price=PRICES,
    quantities=st.lists(st.integers(0, 40), min_size=1, max_size=12),
    order=st.randoms(use_true_random=False),
    cuts=st.lists(st.integers(0, 20), max_size=4),
)
def test_a_lines_total_is_f_of_its_quantity_whatever_the_order_and_batching(
    price: Price, quantities: list[int], order: Any, cuts: list[int]
) -> None:
    prices = PriceList({"m": price})
    records = _records(quantities)
    order.shuffle(records)
    store = _Store()
    amounts: list[Decimal] = []
    for batch in _batches(records, cuts):
        result = store.run(prices, batch)
        amounts += [t.amount for t in result.transactions]
    [line] = store.lines.values()
    total = Decimal(sum(quantities))
    assert line.quantity == total
    assert line.exact_total == price.total(total) == sum(amounts)
    assert line.billed == math.floor(Fraction(price.total(total)) + Fraction(1, 2))  # half up
    assert (line.price_version, line.model) == (1, price.model)
    assert line.tier == (price.tier_reached(total) if any(quantities) else None)


def test_a_record_refused_by_the_limit_adds_nothing_to_its_line() -> None:
    prices = PriceList({"m": VOLUME})  # 10 at 3.00 = 30.00; 11 at 2.00 = 22.00
    store = _Store(limit=3000)
    # 30.00 (no headroom left); -8.00 (16 would be 32.00: +10.00, past the 8.00 given back)
    result = store.run(prices, _records([10, 1, 5]))
    assert [t.metering.record.usage_id for t in result.refused] == ["r2"]
    [line] = store.lines.values()
    assert line.quantity == 11
    assert line.exact_total == VOLUME.total(Decimal(11))


def test_a_negative_amount_gives_headroom_back_within_the_batch() -> None:
    prices = PriceList({"m": VOLUME})
    store = _Store(limit=3000)
    result = store.run(prices, _records([10, 1, 4]))  # 3,000; -800; +800 = 15 at 2.00
    assert [t.amount for t in result.transactions] == [3000, -800, 800]
    assert result.refused == []
    [account] = store.accounts.values()
    assert account.reserved == 3000


def test_a_record_whose_increment_is_beyond_the_ceiling_is_rejected_not_stopped() -> None:
    prices = PriceList({"m": Price(Decimal("1e9"), "USD", model="package", package_size=1)})
    result = _Store().run(prices, _records([1, 10**6]))
    assert [t.metering.record.usage_id for t in result.transactions] == ["r0"]
    [(metering, reason)] = result.rejected
    assert metering.record.usage_id == "r1"
    assert reason.startswith("amount_too_large")


def test_the_line_of_a_price_by_quantity_is_keyed_by_its_version() -> None:
    plain = InvoiceLine.create_id("acme", "USD", "m", AT)
    assert InvoiceLine.create_id("acme", "USD", "m", AT, price_version=1) != plain
    assert InvoiceLine.create_id("acme", "USD", "m", AT, price_version=1) != (
        InvoiceLine.create_id("acme", "USD", "m", AT, price_version=2)
    )


def test_a_per_unit_line_counts_no_quantity_and_refuses_negative_amounts() -> None:
    line = InvoiceLine.open("acme", "USD", "m", PERIODS.period_of(AT))
    with pytest.raises(ValueError, match="quantities go with"):
        line.settle([(UUID(int=1), Decimal(1))], [Decimal(1)])
    with pytest.raises(ValueError, match="cannot be negative"):
        line.settle([(UUID(int=1), Decimal(-1))])
    line.settle([(UUID(int=1), Decimal(1))])
    assert line.quantity is None


def test_a_line_priced_by_quantity_never_totals_below_zero() -> None:
    line = InvoiceLine.open("acme", "USD", "m", PERIODS.period_of(AT), price_version=1)
    with pytest.raises(ValueError, match="a total cannot be negative"):
        line.settle([(UUID(int=1), Decimal(-1))], [Decimal(1)])


def test_an_increment_with_too_many_digits_is_refused() -> None:
    price = Price(Decimal("0.1"), "USD", model="graduated", tiers=(Tier(None, Decimal("0.1")),))
    with pytest.raises(InvalidUsage, match="amount_not_exact"):
        price.increment(Decimal(0), Decimal("0." + "1" * 40))


def test_tiers_in_force_at_the_start_of_a_period_apply_to_the_whole_period() -> None:
    period = PERIODS.period_of(AT)
    cheaper = Price(Decimal(1), "USD", model="volume", tiers=(Tier(None, Decimal(1)),))
    book = PriceBook.start(PriceList({"m": VOLUME}))
    book.publish(PriceList({"m": cheaper}), AT)  # mid-period: from the next period
    store = _Store()
    first = store.run(book.schedule, _records([5, 5]))  # occurred at AT and just after
    assert [t.fields["price_version"] for t in first.transactions] == [1, 1]
    [line] = store.lines.values()
    assert (line.price_version, line.exact_total) == (1, VOLUME.total(Decimal(10)))
    # A version published later for the period's very start is the period's from then
    # on: its records start a line of their own, never mixing two tier functions.
    book.publish(PriceList({"m": cheaper}), period.start)
    later = [Metering(m.record.model_copy(update={"usage_id": "late"}), m.source)
             for m in _records([3])]  # fmt: skip
    store.run(book.schedule, later)
    assert sorted((ln.price_version, ln.quantity) for ln in store.lines.values()) == [
        (1, 10), (3, 3),
    ]  # fmt: skip


def test_a_change_of_model_mid_period_takes_effect_at_the_next_period() -> None:
    book = PriceBook.start(PriceList({"m": Price(Decimal(2), "USD")}))
    book.publish(PriceList({"m": VOLUME}), AT)
    result = _Store().run(book.schedule, _records([5]))
    [txn] = result.transactions
    assert (txn.fields["price_version"], txn.amount) == (1, Decimal(1000))  # 5 at 2.00, per unit
    [line] = result.lines
    assert line.price_version is None  # a per-unit line, as the period started


def test_a_refused_record_priced_by_quantity_opens_no_line_and_no_invoice() -> None:
    prices = PriceList({"m": VOLUME})
    store = _Store(limit=0)
    result = store.run(prices, _records([1, 2]))
    assert len(result.refused) == 2
    assert (result.lines, result.invoices) == ([], [])  # nothing names a line never saved
    # A later record the limit lets through (it costs nothing) opens the line, and its
    # invoice names exactly the lines saved.
    free = PriceList({"m": Price(Decimal(0), "USD", model="volume", tiers=(Tier(None, _0),))})
    later = store.run(free, _records([3]))
    [line] = later.lines
    [invoice] = later.invoices
    assert invoice.lines == [line.id]


_0 = Decimal(0)
