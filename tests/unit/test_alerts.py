"""Spend alerts on the account: each threshold crosses once per period, in the save of
the record that reached it, naming that record (``domain.alerts``)."""

from __future__ import annotations

from decimal import Decimal
from uuid import UUID

import pytest

from domain.account import CustomerAccount
from domain.alerts import Spend, Threshold, alert_id, parse_thresholds
from domain.ids import transaction_id

DEC = "2026-12-01T00:00:00Z"
JAN = "2027-01-01T00:00:00Z"


def _account(limit: int | None = 1000, *thresholds: str) -> CustomerAccount:
    account = CustomerAccount.open("acme", "USD", limit)
    account.set_alerts(list(thresholds))
    account.collect_events()
    return account


def _spend(usage_id: str, amount: str, period: str = DEC) -> Spend:
    return Spend(usage_id, transaction_id("acme", usage_id), Decimal(amount), period)


def _ingest(account: CustomerAccount, *records: Spend) -> list[CustomerAccount.AlertCrossed]:
    """What the ingest does: reserve, then check the alerts, once."""
    granted = account.reserve_all([(r.transaction_id, r.amount) for r in records])
    account.check_alerts(list(records), granted)
    events = account.collect_events()
    return [e for e in events if isinstance(e, CustomerAccount.AlertCrossed)]


def test_each_percentage_of_the_limit_crosses_on_the_record_that_reaches_it() -> None:
    account = _account(1000, "percent_of_limit:50", "percent_of_limit:80")
    crossed = _ingest(account, _spend("u1", "499.99"), _spend("u2", "0.01"), _spend("u3", "300"))
    assert [(e.threshold, e.usage_id, e.value) for e in crossed] == [
        ("percent_of_limit:50", "u2", "500"),
        ("percent_of_limit:80", "u3", "800"),
    ]
    assert crossed[0].transaction_id == str(transaction_id("acme", "u2"))
    assert (crossed[0].customer_id, crossed[0].currency, crossed[0].spend_limit) == (
        "acme",
        "USD",
        1000,
    )


def test_a_threshold_crosses_once_per_period_whatever_follows() -> None:
    account = _account(1000, "percent_of_limit:50", "spend:100")
    first = _ingest(account, _spend("u1", "600"))
    assert sorted(e.threshold for e in first) == ["percent_of_limit:50", "spend:100"]
    assert _ingest(account, _spend("u2", "10"), _spend("u3", "10")) == []
    assert _ingest(account, _spend("late", "10", "2026-11-01T00:00:00Z")) == []  # late usage


def test_the_next_period_watches_afresh_its_own_spend() -> None:
    account = _account(None, "spend:100")
    assert [e.usage_id for e in _ingest(account, _spend("u1", "150"))] == ["u1"]
    assert _ingest(account, _spend("j1", "60", JAN)) == []  # January's spend is 60
    crossed = _ingest(account, _spend("j2", "40", JAN))
    assert [(e.usage_id, e.period, e.value) for e in crossed] == [("j2", JAN, "100")]
    assert crossed[0].alert_id != str(alert_id(account.id, Threshold("spend", 100), DEC))


def test_a_refused_record_reaches_the_full_limit() -> None:
    account = _account(100, "percent_of_limit:100")
    assert _ingest(account, _spend("u1", "90")) == []
    crossed = _ingest(account, _spend("u2", "20"))  # refused: 110 > 100
    assert [(e.usage_id, e.value) for e in crossed] == [("u2", "110")]
    assert account.committed == Decimal(90)


def test_percentages_never_fire_without_a_limit() -> None:
    account = _account(None, "percent_of_limit:1")
    assert _ingest(account, _spend("u1", "1000000")) == []


def test_the_alert_id_is_derived_from_account_threshold_and_period() -> None:
    account = _account(1000, "percent_of_limit:50")
    (crossed,) = _ingest(account, _spend("u1", "500"))
    assert UUID(crossed.alert_id) == alert_id(account.id, Threshold("percent_of_limit", 50), DEC)


def test_the_watch_survives_reloading_the_account_from_its_events() -> None:
    account = CustomerAccount.open("acme", "USD", 1000)
    account.set_alerts(["percent_of_limit:50", "spend:300"])
    account.reserve_all([(transaction_id("acme", "u1"), Decimal(200))])
    account.check_alerts([_spend("u1", "200")], [True])
    history = account.collect_events()
    reloaded: CustomerAccount | None = None
    for event in history:
        reloaded = event.mutate(reloaded)
    assert isinstance(reloaded, CustomerAccount)
    assert (reloaded.alert_period, reloaded.alert_period_spend) == (DEC, Decimal(200))
    assert list(reloaded.alerts_crossed) == []
    assert [e.threshold for e in _ingest(reloaded, _spend("u2", "300"))] == [
        "percent_of_limit:50",
        "spend:300",
    ]
    assert _ingest(reloaded, _spend("u3", "1")) == []


def test_no_threshold_no_alert_event() -> None:
    account = _account(1000)
    granted = account.reserve_all([(transaction_id("acme", "u1"), Decimal(999))])
    account.check_alerts([_spend("u1", "999")], granted)
    assert [type(e).__name__ for e in account.collect_events()] == ["AmountsReserved"]


def test_setting_the_same_thresholds_again_records_nothing() -> None:
    account = _account(1000, "spend:5", "percent_of_limit:80")
    account.set_alerts(["percent_of_limit:80", "spend:5", "spend:5"])
    assert account.collect_events() == []
    assert list(account.alert_thresholds) == ["percent_of_limit:80", "spend:5"]


@pytest.mark.parametrize(
    "key",
    ["percent_of_limit:0", "percent_of_limit:101", "spend:0", "spend:x", "grant:5", "spend"],
)
def test_bad_thresholds_are_refused(key: str) -> None:
    with pytest.raises(ValueError, match=r"alert|percentage|spend threshold"):
        parse_thresholds([key])


def test_more_than_the_maximum_thresholds_is_refused() -> None:
    with pytest.raises(ValueError, match="at most 20"):
        parse_thresholds([f"spend:{n}" for n in range(1, 22)])


def test_a_refused_record_adds_nothing_to_the_period_spend() -> None:
    account = _account(100, "spend:50")
    assert _ingest(account, _spend("big", "500")) == []  # refused: spend stays 0
    assert account.alert_period_spend == Decimal(0)
    assert [e.usage_id for e in _ingest(account, _spend("ok", "50"))] == ["ok"]


def test_the_period_spend_is_recorded_only_when_it_changes() -> None:
    account = _account(None, "spend:500")
    account.reserve_all([(transaction_id("acme", "u1"), Decimal(20))])
    account.check_alerts([_spend("u1", "20")], [True])
    assert [type(e).__name__ for e in account.collect_events()] == [
        "AmountsReserved",
        "AlertPeriodSpent",
    ]
    account.reserve_all([(transaction_id("acme", "z"), Decimal(0))])
    account.check_alerts([_spend("z", "0")], [True])
    assert [type(e).__name__ for e in account.collect_events()] == ["AmountsReserved"]
    assert account.alert_period_spend == Decimal(20)


def test_clearing_the_thresholds_stops_the_alerts() -> None:
    account = _account(1000, "percent_of_limit:10")
    account.set_alerts([])
    assert list(account.alert_thresholds) == []
    granted = account.reserve_all([(transaction_id("acme", "u1"), Decimal(900))])
    account.check_alerts([_spend("u1", "900")], granted)
    assert [type(e).__name__ for e in account.collect_events()] == [
        "AlertsSet",
        "AmountsReserved",
    ]


def test_several_records_of_one_save_each_name_their_own_crossing() -> None:
    account = _account(None, "spend:10", "spend:20", "spend:30")
    crossed = _ingest(account, _spend("a", "15"), _spend("b", "4"), _spend("c", "11"))
    assert [(e.threshold, e.usage_id, e.value) for e in crossed] == [
        ("spend:10", "a", "15"),
        ("spend:20", "c", "30"),
        ("spend:30", "c", "30"),
    ]


def test_a_batch_spanning_two_periods_crosses_in_each() -> None:
    account = _account(None, "spend:10")
    crossed = _ingest(account, _spend("d", "10", DEC), _spend("j", "10", JAN))
    assert [(e.usage_id, e.period) for e in crossed] == [("d", DEC), ("j", JAN)]
    assert (account.alert_period, account.alert_period_spend) == (JAN, Decimal(10))
    assert list(account.alerts_crossed) == ["spend:10"]
