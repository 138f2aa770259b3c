"""``domain.periods`` and ``domain.money`` at their edges: every period unit with times
that are not on a boundary, the text forms, and money's formatting and limits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from domain.errors import InvalidUsage
from domain.money import (
    MAX_LINE_MINOR,
    add_exact,
    canonical,
    exact_minor,
    format_money,
    round_minor,
    split_for_items,
)
from domain.periods import PeriodPolicy

AT = datetime(2026, 12, 31, 22, 47, 13, 654321, tzinfo=timezone(timedelta(hours=-3)))
# AT is 2027-01-01 01:47:13.654321 in UTC


@pytest.mark.parametrize(
    ("unit", "start", "end"),
    [
        ("month", datetime(2027, 1, 1, tzinfo=UTC), datetime(2027, 2, 1, tzinfo=UTC)),
        ("day", datetime(2027, 1, 1, tzinfo=UTC), datetime(2027, 1, 2, tzinfo=UTC)),
        ("hour", datetime(2027, 1, 1, 1, tzinfo=UTC), datetime(2027, 1, 1, 2, tzinfo=UTC)),
    ],
)
def test_a_period_is_cut_in_utc_from_any_time_zone(
    unit: str, start: datetime, end: datetime
) -> None:
    period = PeriodPolicy.parse(unit).period_of(AT)
    assert (period.start, period.end) == (start, end)
    assert period.start.tzinfo is UTC
    assert period.contains(AT)


def test_periods_of_seconds_count_from_the_epoch() -> None:
    policy = PeriodPolicy.parse(" 7200 ")
    assert (policy.unit, policy.seconds, str(policy)) == ("seconds", 7200, "7200")
    period = policy.period_of(AT)
    assert (period.start, period.end) == (
        datetime(2027, 1, 1, 0, tzinfo=UTC),
        datetime(2027, 1, 1, 2, tzinfo=UTC),
    )
    assert policy.next(period).start == period.end


@pytest.mark.parametrize("unit", ["month", "day", "hour"])
def test_a_named_unit_is_its_own_text(unit: str) -> None:
    assert str(PeriodPolicy.parse(unit.upper())) == unit


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("week", "billing period 'week': month, day, hour or a number of seconds"),
        ("0", "billing period '0': seconds must be above 0"),
        ("-5", "billing period '-5': seconds must be above 0"),
    ],
)
def test_a_billing_period_that_is_no_unit_is_refused(text: str, reason: str) -> None:
    with pytest.raises(ValueError) as raised:
        PeriodPolicy.parse(text)
    assert str(raised.value) == reason


def test_one_second_periods_are_allowed() -> None:
    assert PeriodPolicy.parse("1").period_of(AT).end - PeriodPolicy.parse("1").period_of(
        AT
    ).start == timedelta(seconds=1)


def test_a_period_contains_its_start_and_not_its_end() -> None:
    period = PeriodPolicy().period_of(AT)
    assert period.contains(period.start) is True
    assert period.contains(period.end - timedelta(microseconds=1)) is True
    assert period.contains(period.end) is False
    assert str(period) == f"{period.key}/2027-02-01T00:00:00Z"


# -- money ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("amount", "code", "shown"),
    [
        (Decimal("0.38"), "USD", "0.0038 USD"),
        (Decimal(1250), "usd", "12.50 USD"),
        (Decimal(1200), "usd", "12.00 USD"),  # a whole major amount shows its decimals
        (Decimal(7), "JPY", "7 JPY"),
        (Decimal("1234.5"), "KWD", "1.2345 KWD"),
        (Decimal(2000), "KWD", "2.000 KWD"),
        (Decimal("300"), "XYZ", "3.00 XYZ"),  # unknown: two decimals
    ],
)
def test_format_money_keeps_every_digit_in_major_units(
    amount: Decimal, code: str, shown: str
) -> None:
    assert format_money(amount, code) == shown


@pytest.mark.parametrize(
    ("amount", "code", "shown"),
    [(Decimal("1249.5"), "USD", "12.495 USD"), (Decimal("1249.49"), "usd", "12.4949 USD"),
     (Decimal("12345"), "XYZ", "123.45 XYZ"), (Decimal("-0.5"), "JPY", "-0.5 JPY"),
     (Decimal("-1250"), "USD", "-12.50 USD"), (Decimal("1E+3"), "USD", "10.00 USD")],
)  # fmt: skip
def test_format_money_never_rounds_an_exact_amount_for_show(
    amount: Decimal, code: str, shown: str
) -> None:
    assert format_money(amount, code) == shown


@pytest.mark.parametrize(("exact", "billed"), [("2.5", 3), ("-2.5", -3), ("2.4999", 2), ("7", 7)])
def test_round_minor_rounds_half_away_from_zero(exact: str, billed: int) -> None:
    assert round_minor(Decimal(exact)) == billed


def test_canonical_writes_whole_amounts_without_exponent() -> None:
    assert str(canonical(Decimal("1E+2"))) == "100"
    assert str(canonical(Decimal("380.00"))) == "380"
    assert str(canonical(Decimal("0.3800"))) == "0.38"


def test_a_line_total_just_below_the_ceiling_is_kept_and_at_it_refused() -> None:
    below = MAX_LINE_MINOR - 1
    assert add_exact(below - 5, Decimal(5)) == below
    with pytest.raises(ValueError) as raised:
        add_exact(below, Decimal(1))
    assert str(raised.value) == (
        f"a line total of {MAX_LINE_MINOR} minor units is beyond {MAX_LINE_MINOR:f}"
    )


@pytest.mark.parametrize(
    ("billed", "parts"),
    [(0, [0]), (7, [7]), (10, [10]), (20, [10, 10]), (23, [10, 10, 3])],
)
def test_split_for_items_fills_items_in_order(billed: int, parts: list[int]) -> None:
    assert split_for_items(billed, 10) == parts


def test_split_for_items_splits_a_negative_total_the_same_way() -> None:
    """The credit line's total is negative: its items are the positive split, negated."""
    assert split_for_items(-1) == [-1]
    assert split_for_items(-25, 10) == [-10, -10, -5]


def test_an_amount_the_exact_context_cannot_compute_is_refused_as_too_large() -> None:
    with pytest.raises(InvalidUsage, match=r"^amount_too_large: Infinity x 0 / 1$"):
        exact_minor(Decimal("Infinity"), Decimal(0), 1, "USD")
