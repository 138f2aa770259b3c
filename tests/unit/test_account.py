"""``CustomerAccount``: the spend limit, batched reservations, and the money moves."""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime
from decimal import Decimal, localcontext
from uuid import uuid4

import pytest

from domain.account import CustomerAccount
from domain.ids import account_id, transaction_id
from domain.money import MAX_SPEND_LIMIT_MINOR, format_money

A, B, C, D = (transaction_id("acme", f"req-{n}") for n in range(4))


def _account(spend_limit: int | None = None) -> CustomerAccount:
    """An account whose Opened event is already collected (so only new events are pending)."""
    account = CustomerAccount(customer_id="acme", currency="USD", spend_limit=spend_limit)
    account.collect_events()
    return account


def _reserved_account(amount: int, spend_limit: int | None = None) -> CustomerAccount:
    account = _account(spend_limit)
    assert account.reserve_all([(A, amount)]) == [True]
    account.collect_events()
    return account


def _event_names(account: CustomerAccount) -> list[str]:
    return [type(e).__name__ for e in account.pending_events]


# ---------------------------------------------------------------------------------------------
# opening and the limit


def test_a_new_account_is_unlimited_and_empty_with_a_deterministic_id() -> None:
    account = CustomerAccount(customer_id="acme", currency="USD")
    assert account.id == account_id("acme", "USD")
    assert (account.spend_limit, account.available) == (None, None)
    assert (account.reserved, account.charged, account.committed) == (0, 0, 0)
    assert _event_names(account) == ["Opened"]


def test_the_account_id_differs_per_currency_and_per_customer() -> None:
    ids = {account_id("acme", "USD"), account_id("acme", "EUR"), account_id("globex", "USD")}
    assert len(ids) == 3


def test_available_is_the_limit_minus_reserved_and_charged() -> None:
    account = _reserved_account(50, spend_limit=100)
    account.settle(A, 20)  # reserved 30, charged 20
    assert (account.reserved, account.charged, account.committed) == (30, 20, 50)
    assert account.available == 50  # 100 - (30 + 20)


def test_available_never_goes_below_zero_when_the_limit_is_lowered_under_committed() -> None:
    account = _reserved_account(80, spend_limit=100)
    account.set_limit(50)
    assert account.available == 0  # max(50 - 80, 0); the 80 reserved still stands
    assert account.reserved == 80


def test_set_limit_records_a_change() -> None:
    account = _account()
    account.set_limit(500)
    assert (account.spend_limit, account.available) == (500, 500)
    event = account.pending_events[-1]
    assert isinstance(event, CustomerAccount.LimitSet)
    assert event.spend_limit == 500


def test_set_limit_to_none_removes_the_limit() -> None:
    account = _account(spend_limit=100)
    account.set_limit(None)
    assert (account.spend_limit, account.available) == (None, None)
    assert _event_names(account) == ["LimitSet"]


@pytest.mark.parametrize("limit", [None, 0, 100])
def test_set_limit_to_the_current_value_records_no_event(limit: int | None) -> None:
    account = _account(spend_limit=limit)
    account.set_limit(limit)
    assert account.pending_events == []
    assert account.version == 1


@pytest.mark.parametrize(
    ("limit", "got"), [(-1, "-0.01 USD"), (MAX_SPEND_LIMIT_MINOR + 1, "10000000000000.01 USD")]
)
def test_a_limit_outside_its_bounds_is_refused_in_the_accounts_currency(
    limit: int, got: str
) -> None:
    account = _account(spend_limit=100)
    with pytest.raises(ValueError) as refused:
        account.set_limit(limit)
    assert str(refused.value) == (
        f"a spend limit must be from 0 to 10000000000000.00 USD, got {got}"
    )
    assert (account.spend_limit, account.pending_events) == (100, [])


def test_an_account_opened_past_the_bound_is_refused_in_its_currency() -> None:
    with pytest.raises(ValueError) as refused:
        CustomerAccount.open("acme", "JPY", MAX_SPEND_LIMIT_MINOR + 1)
    assert str(refused.value) == (
        "a spend limit must be from 0 to 1000000000000000 JPY, got 1000000000000001 JPY"
    )
    assert CustomerAccount.open("acme", "JPY", MAX_SPEND_LIMIT_MINOR).spend_limit == (
        MAX_SPEND_LIMIT_MINOR
    )


def test_a_limit_without_a_currency_is_refused_in_minor_units() -> None:
    from domain.money import check_spend_limit

    with pytest.raises(ValueError) as refused:
        check_spend_limit(-5)
    assert str(refused.value) == (
        "a spend limit must be from 0 to 1,000,000,000,000,000 minor units, got -5"
    )
    assert check_spend_limit(0) == 0 and check_spend_limit(None) is None


def test_the_largest_limit_is_accepted() -> None:
    account = _account(spend_limit=100)
    account.set_limit(MAX_SPEND_LIMIT_MINOR)
    assert account.spend_limit == MAX_SPEND_LIMIT_MINOR


def test_exact_amounts_are_reserved_exactly_against_a_limit() -> None:
    account = _account(spend_limit=1)
    a, b = Decimal("0.38"), Decimal("0.62")
    assert account.reserve_all([(A, a), (B, b), (C, Decimal("0.0000001"))]) == [True, True, False]
    assert account.reserved == Decimal(1) and account.available == 0


# ---------------------------------------------------------------------------------------------
# reserve_all


def test_an_unlimited_account_grants_every_reservation_in_one_event() -> None:
    account = _account()
    assert account.reserve_all([(A, 10**12), (B, 1), (C, 0)]) == [True, True, True]
    assert account.reserved == 10**12 + 1
    event = account.pending_events[-1]
    assert isinstance(event, CustomerAccount.AmountsReserved)
    assert (event.transaction_ids, event.amounts) == (
        [str(A), str(B), str(C)],
        [str(10**12), "1", "0"],
    )
    assert len(account.pending_events) == 1


def test_reserve_all_grants_in_order_while_within_the_limit_and_refuses_the_rest() -> None:
    account = _account(spend_limit=100)
    # 40 (headroom 60), 40 (headroom 20), 40 > 20: refused
    assert account.reserve_all([(A, 40), (B, 40), (C, 40)]) == [True, True, False]
    assert account.reserved == 80
    assert account.available == 20


def test_reserve_all_still_grants_a_later_smaller_request_that_fits() -> None:
    account = _account(spend_limit=100)
    # 60 (headroom 40), 50 > 40 refused, 30 (headroom 10), 10 (headroom 0)
    assert account.reserve_all([(A, 60), (B, 50), (C, 30), (D, 10)]) == [True, False, True, True]
    assert (account.reserved, account.available) == (100, 0)
    event = account.pending_events[-1]
    assert isinstance(event, CustomerAccount.AmountsReserved)
    assert (event.transaction_ids, event.amounts) == ([str(A), str(C), str(D)], ["60", "30", "10"])
    assert len(account.pending_events) == 1


def test_reserve_all_grants_an_amount_exactly_equal_to_the_headroom() -> None:
    account = _account(spend_limit=100)
    assert account.reserve_all([(A, 100), (B, 1), (C, 0)]) == [True, False, True]
    assert account.reserved == 100


def test_reserve_all_counts_charged_amounts_against_the_limit() -> None:
    account = _reserved_account(60, spend_limit=100)
    account.settle(A, 60)  # charged 60, reserved 0: 40 left
    assert account.reserve_all([(B, 50)]) == [False]
    assert account.reserve_all([(B, 40)]) == [True]


def test_reserve_all_records_no_event_when_every_request_is_refused() -> None:
    account = _account(spend_limit=10)
    assert account.reserve_all([(A, 11), (B, 50)]) == [False, False]
    assert (account.reserved, account.pending_events, account.version) == (0, [], 1)


def test_reserve_all_of_nothing_records_no_event() -> None:
    account = _account()
    assert account.reserve_all([]) == []
    assert account.pending_events == []


def test_reserve_all_refuses_a_negative_amount_and_reserves_nothing_of_the_batch() -> None:
    account = _account()
    with pytest.raises(ValueError, match="cannot be negative"):
        account.reserve_all([(A, 10), (B, -1)])
    assert (account.reserved, account.pending_events) == (0, [])


# ---------------------------------------------------------------------------------------------
# release, settle, reverse_charge


def test_release_gives_back_a_reservation() -> None:
    account = _reserved_account(100, spend_limit=100)
    account.release(A, 30)
    assert (account.reserved, account.charged, account.available) == (70, 0, 30)
    event = account.pending_events[-1]
    assert isinstance(event, CustomerAccount.ReservationReleased)
    assert (event.transaction_id, event.amount) == (str(A), 30)


def test_settle_moves_a_reservation_to_charged_without_changing_committed() -> None:
    account = _reserved_account(100, spend_limit=100)
    account.settle(A, 100)
    assert (account.reserved, account.charged, account.committed) == (0, 100, 100)
    event = account.pending_events[-1]
    assert isinstance(event, CustomerAccount.ReservationSettled)
    assert (event.transaction_id, event.amount) == (str(A), 100)


def test_reverse_charge_takes_back_a_charge_and_frees_the_limit() -> None:
    account = _reserved_account(100, spend_limit=100)
    account.settle(A, 100)
    account.reverse_charge(A, 40)
    assert (account.reserved, account.charged, account.available) == (0, 60, 40)
    event = account.pending_events[-1]
    assert isinstance(event, CustomerAccount.ChargeReversed)
    assert (event.transaction_id, event.amount) == (str(A), 40)


@pytest.mark.parametrize(
    ("method", "reason"),
    [
        ("release", "cannot release 0.11 USD: only 0.10 USD reserved"),
        ("settle", "cannot settle 0.11 USD: only 0.10 USD reserved"),
        ("reverse_charge", "cannot reverse 0.11 USD: only 0.00 USD charged"),
    ],
)
def test_cannot_move_more_than_there_is(method: str, reason: str) -> None:
    account = _reserved_account(10)
    with pytest.raises(ValueError, match=f"^{re.escape(reason)}$"):
        getattr(account, method)(A, 11)
    assert (account.reserved, account.charged, account.pending_events) == (10, 0, [])


def test_cannot_reverse_more_than_was_charged() -> None:
    account = _reserved_account(10)
    account.settle(A, 6)  # charged 6, reserved 4
    with pytest.raises(ValueError, match=r"^cannot reverse 0\.07 USD: only 0\.06 USD charged$"):
        account.reverse_charge(A, 7)
    assert (account.reserved, account.charged) == (4, 6)


@pytest.mark.parametrize("method", ["settle", "reverse_charge"])
def test_settle_and_reverse_charge_refuse_a_negative_amount(method: str) -> None:
    account = _reserved_account(10)
    account.settle(A, 5)  # reserved 5, charged 5
    with pytest.raises(ValueError, match="negative"):
        getattr(account, method)(A, -5)


def test_releasing_a_negative_amount_takes_its_release_back() -> None:
    # A volume tier's record added -5 to its line (the line's total dropped): compensating
    # it gives the line's earlier records their hold back.
    account = _reserved_account(10, spend_limit=20)
    account.release(A, Decimal(-5))
    assert (account.reserved, account.available) == (15, 5)


def test_a_hold_grants_a_negative_amount_and_gives_its_headroom_back() -> None:
    account = _account(spend_limit=10)
    hold = account.hold()
    assert [hold.take(A, Decimal(8)), hold.take(B, Decimal(3))] == [True, False]
    assert [hold.take(C, Decimal(-4)), hold.take(D, Decimal(6))] == [True, True]
    hold.record()
    assert account.reserved == 10
    [event] = account.collect_events()
    assert isinstance(event, CustomerAccount.AmountsReserved)
    assert (event.transaction_ids, event.amounts) == ([str(A), str(C), str(D)], ["8", "-4", "6"])


def test_a_hold_that_took_nothing_records_nothing() -> None:
    account = _account(spend_limit=1)
    hold = account.hold()
    assert not hold.take(A, Decimal(2))
    hold.record()
    assert account.collect_events() == []


# ---------------------------------------------------------------------------------------------
# reconstruction from events


def test_the_account_rebuilt_from_its_events_equals_the_original() -> None:
    account = CustomerAccount(customer_id="acme", currency="USD", spend_limit=100)
    account.reserve_all([(A, 60), (B, 50), (C, 30)])
    account.settle(A, 60)
    account.release(C, 30)
    account.set_limit(200)
    account.reverse_charge(A, 10)
    events = account.collect_events()
    rebuilt = functools.reduce(lambda agg, e: e.mutate(agg), events, None)
    assert isinstance(rebuilt, CustomerAccount)
    assert rebuilt == account
    # reserved 60 + 30 - 60 - 30 = 0; charged 60 - 10 = 50; limit 200
    assert (rebuilt.reserved, rebuilt.charged, rebuilt.spend_limit) == (0, 50, 200)


@pytest.mark.parametrize("limit", [-1, MAX_SPEND_LIMIT_MINOR + 1])
def test_an_account_cannot_be_opened_with_a_limit_out_of_range(limit: int) -> None:
    with pytest.raises(ValueError, match=re.escape(f"got {format_money(limit, 'USD')}") + "$"):
        CustomerAccount.open("acme", "USD", limit)
    assert CustomerAccount.open("acme", "USD", MAX_SPEND_LIMIT_MINOR).spend_limit == (
        MAX_SPEND_LIMIT_MINOR
    )


@pytest.mark.parametrize(
    "amounts",
    [
        # A tier's drop, then a tiny record: each running total is exact in 60 digits,
        # their sum alone is not (from 10^10 down to 10^-50).
        ["-99999999998.99999999999999999999999999", "1E-50"],
        ["12.5", "0.000001", "7"],  # the usual batch: summed once
        [],
    ],
)
def test_a_stored_reservation_replays_to_each_amount_added_in_turn(amounts: list[str]) -> None:
    """``AmountsReserved``'s mutator, which every load of a stored event runs: what it
    reserves is ``reserved`` plus each amount in turn, and an event that was stored
    replays, whatever the sizes and signs of its amounts."""
    account = CustomerAccount.open("acme", "USD")
    account.reserve_all([(uuid4(), Decimal(10) ** 11 - 1)])
    account.collect_events()
    with localcontext(prec=100):  # exact here (the default context keeps 28 digits)
        expected = account.reserved + sum((Decimal(a) for a in amounts), Decimal(0))
    stored = CustomerAccount.AmountsReserved(
        originator_id=account.id, originator_version=account.version + 1,
        timestamp=datetime.now(UTC), transaction_ids=[str(uuid4()) for _ in amounts],
        amounts=amounts, alert_period=None, burnt_from=None, burnt_at=None,
    )  # fmt: skip
    stored.mutate(account)
    assert account.reserved == expected


def test_an_amount_of_many_digits_is_held_and_released_exactly() -> None:
    """Every take-off on the account (the limit's headroom, a release, a reversal) is
    exact for an amount of more digits than Python's default context keeps (28)."""
    account = CustomerAccount.open("acme", "USD", spend_limit=1000)
    amount = Decimal("99.50000000000000000000000000123")
    txn = uuid4()
    assert account.reserve_all([(txn, amount)]) == [True]
    assert account.available == Decimal("900.49999999999999999999999999877")
    account.release(txn, amount)
    assert (account.reserved, account.available) == (0, 1000)
