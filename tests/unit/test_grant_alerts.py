"""Alerts on prepaid credit (``domain.alerts``): ``balance`` (the live balance falls to
a level, once per period) and ``percent_of_grant`` (a grant's consumption reaches a
share of its amount, once per grant), each in the ingest save of the record that
crossed it, naming it; what the relay publishes names the grant."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from uuid import uuid4

import orjson
import pytest
from eventsourcing.persistence import StoredEvent

from adapters.alerts.messages import alert_document
from domain.account import CustomerAccount
from domain.alerts import (
    MAX_THRESHOLDS,
    Spend,
    Threshold,
    Watch,
    alert_id,
    crossings,
    parse_thresholds,
)
from domain.credits import MAX_GRANT_MINOR
from domain.ids import transaction_id
from domain.money import MAX_SPEND_LIMIT_MINOR
from tests.fast.fakes import memory_ledger

T0 = datetime(2026, 12, 1, tzinfo=UTC)
NOW = T0 + timedelta(days=3)
DEC = "2026-12-01T00:00:00Z"
JAN = "2027-01-01T00:00:00Z"


def _account(*thresholds: str, policy: str = "overage") -> CustomerAccount:
    account = CustomerAccount.open("acme", "USD")
    account.set_credit_policy(policy)
    account.set_alerts(list(thresholds))
    return account


def _grant(account: CustomerAccount, grant_id: str, amount: int, **terms: object) -> None:
    defaults: dict[str, object] = {"effective_at": T0, "source": "manual", "reason": "r"}
    account.grant_credit(grant_id, amount, **{**defaults, **terms})  # type: ignore[arg-type]
    account.collect_events()


def _spend(usage_id: str, amount: str, period: str = DEC) -> Spend:
    return Spend(usage_id, transaction_id("acme", usage_id), Decimal(amount), period)


def _ingest(
    account: CustomerAccount, *records: Spend, now: datetime = NOW
) -> list[CustomerAccount.AlertCrossed]:
    """What the ingest does: reserve and burn, then check the alerts, in one save."""
    burns = account.reserve_and_burn([(r.transaction_id, r.amount) for r in records], now)
    account.check_alerts(list(records), [b.reserved for b in burns], now)
    return [e for e in account.collect_events() if isinstance(e, CustomerAccount.AlertCrossed)]


def _seen(crossed: list[CustomerAccount.AlertCrossed]) -> list[tuple[str, str, str, str | None]]:
    return [(e.threshold, e.usage_id, e.value, e.grant_id) for e in crossed]


def test_balance_fires_on_the_record_that_takes_the_live_balance_to_its_level() -> None:
    account = _account("balance:300", "balance:0")
    _grant(account, "g1", 1000)
    crossed = _ingest(account, _spend("u1", "500"), _spend("u2", "199.5"), _spend("u3", "0.5"))
    assert _seen(crossed) == [("balance:300", "u3", "300", None)]
    assert crossed[0].alert_id == str(alert_id(account.id, Threshold("balance", 300), DEC))
    assert _seen(_ingest(account, _spend("u4", "299.9"))) == []  # 0.1 left: above 0
    # Overage: the record the credit cannot cover leaves a balance of 0 (the rest is billed).
    assert _seen(_ingest(account, _spend("u5", "5"))) == [("balance:0", "u5", "0", None)]


def test_balance_fires_once_per_period_and_again_in_the_next() -> None:
    account = _account("balance:100")
    _grant(account, "g1", 1000)
    assert _seen(_ingest(account, _spend("u1", "950"))) == [("balance:100", "u1", "50", None)]
    assert _ingest(account, _spend("u2", "10")) == []
    assert _seen(_ingest(account, _spend("u3", "10", JAN))) == [("balance:100", "u3", "30", None)]


def test_a_record_refused_by_block_reaches_the_balance_it_would_have_left() -> None:
    account = _account("balance:0", policy="block")
    _grant(account, "g1", 100)
    assert _ingest(account, _spend("u1", "60")) == []
    crossed = _ingest(account, _spend("u2", "50"))  # 40 left: refused, nothing consumed
    assert _seen(crossed) == [("balance:0", "u2", "-10", None)]
    assert account.grants["g1"].remaining == Decimal(40)


def test_the_balance_counts_only_grants_live_at_the_save() -> None:
    account = _account("balance:500")
    _grant(account, "now", 400)
    _grant(account, "later", 10_000, effective_at=NOW + timedelta(days=1))
    _grant(account, "gone", 10_000, expires_at=NOW - timedelta(hours=1))
    assert _seen(_ingest(account, _spend("u1", "1"))) == [("balance:500", "u1", "399", None)]


def test_an_account_that_never_had_a_grant_never_fires_a_balance() -> None:
    account = _account("balance:0", "percent_of_grant:50")
    assert _ingest(account, _spend("u1", "100")) == []


def test_each_grant_crosses_its_mark_once_on_the_record_that_carries_it() -> None:
    account = _account("percent_of_grant:50", "percent_of_grant:100")
    _grant(account, "first", 100, priority=0)
    _grant(account, "second", 1000, priority=1)
    crossed = _ingest(account, _spend("u1", "49.99"), _spend("u2", "0.01"), _spend("u3", "550"))
    assert _seen(crossed) == [
        ("percent_of_grant:50", "u2", "50", "first"),
        ("percent_of_grant:100", "u3", "100", "first"),  # per record: grants in burn order
        ("percent_of_grant:50", "u3", "500", "second"),
    ]
    assert crossed[0].transaction_id == str(transaction_id("acme", "u2"))
    ids = {e.alert_id for e in crossed}
    assert str(alert_id(account.id, Threshold("percent_of_grant", 50), DEC, "first")) in ids
    assert str(alert_id(account.id, Threshold("percent_of_grant", 50), DEC, "second")) in ids
    # Never again for those grants, in this period or the next; the second's 100% later.
    assert _ingest(account, _spend("u4", "1", JAN)) == []
    assert _seen(_ingest(account, _spend("u5", "499", JAN))) == [
        ("percent_of_grant:100", "u5", "1000", "second")
    ]


def test_a_grant_past_its_mark_when_the_threshold_is_set_does_not_fire() -> None:
    account = _account()
    _grant(account, "g1", 100)
    _ingest(account, _spend("u1", "80"))
    account.set_alerts(["percent_of_grant:50"])
    assert _ingest(account, _spend("u2", "10")) == []


def test_grant_crossings_survive_reloading_the_account_from_its_events() -> None:
    account = CustomerAccount.open("acme", "USD")
    account.set_alerts(["percent_of_grant:50", "balance:10"])
    account.grant_credit("g1", 100, effective_at=T0, source="manual", reason="r")
    record = _spend("u1", "60")
    burns = account.reserve_and_burn([(record.transaction_id, record.amount)], NOW)
    account.check_alerts([record], [b.reserved for b in burns], NOW)
    rebuilt = None
    for e in account.collect_events():
        rebuilt = e.mutate(rebuilt)
    assert isinstance(rebuilt, CustomerAccount)
    # The 50% mark is behind the grant: only the balance, now 5, fires.
    assert _seen(_ingest(rebuilt, _spend("u2", "35"))) == [("balance:10", "u2", "5", None)]


@pytest.mark.parametrize(
    "key",
    ["percent_of_grant:0", "percent_of_grant:101", f"balance:{MAX_GRANT_MINOR + 1}", "balance:-1"],
)
def test_bad_grant_thresholds_are_refused(key: str) -> None:
    with pytest.raises(ValueError, match=r"alert threshold|percentage|balance"):
        parse_thresholds([key])


def test_the_largest_thresholds_and_the_most_of_them_are_accepted() -> None:
    assert parse_thresholds(["balance:0"]) == [Threshold("balance", 0)]
    assert Threshold("balance", MAX_GRANT_MINOR).value == MAX_GRANT_MINOR
    assert Threshold("spend", MAX_SPEND_LIMIT_MINOR).value == MAX_SPEND_LIMIT_MINOR
    keys = [f"spend:{v}" for v in range(1, MAX_THRESHOLDS + 1)]
    assert len(parse_thresholds(keys)) == MAX_THRESHOLDS


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("nope:1", "alert kind 'nope': one of percent_of_limit, spend, balance, percent_of_grant"),
        ("percent_of_limit:0", "a percentage of the limit is 1 to 100, not 0"),
        ("percent_of_grant:101", "a percentage of a grant is 1 to 100, not 101"),
        ("spend:1:2", "alert threshold 'spend:1:2': kind:whole number"),
    ],
)
def test_a_bad_threshold_says_what_is_wrong(key: str, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_thresholds([key])
    assert str(refused.value) == message


def test_records_and_their_decisions_must_pair_up() -> None:
    watch = Watch(None, Decimal(0), set())
    with pytest.raises(ValueError):
        crossings([Threshold("spend", 1)], watch, Decimal(0), None, [_spend("u1", "1")], [])


def test_late_usage_crosses_in_the_period_being_watched() -> None:
    account = _account("spend:100")
    assert _ingest(account, _spend("u1", "50")) == []
    (crossed,) = _ingest(account, _spend("late", "60", "2026-11-01T00:00:00Z"))
    assert (crossed.usage_id, crossed.period, crossed.value) == ("late", DEC, "110")


def test_the_published_document_names_the_grant() -> None:
    account = _account("percent_of_grant:50")
    _grant(account, "g1", 100)
    (crossed,) = _ingest(account, _spend("u1", "50"))
    ledger = memory_ledger()
    stored = ledger.mapper.to_stored_event(crossed)
    document = alert_document(orjson.loads(stored.state), 7)
    assert document is not None
    body = json.loads(document.body)
    assert body["threshold"] == {"kind": "percent_of_grant", "value": 50}
    assert (body["grant_id"], body["value"], body["usage_id"]) == ("g1", "50", "u1")


def test_a_crossing_recorded_before_grant_thresholds_loads_naming_no_grant() -> None:
    ledger = memory_ledger()
    account = _account("spend:10")
    ledger.save(account)
    state = {
        "timestamp": {"_type_": "datetime_iso", "_data_": "2026-12-01T10:00:00+00:00"},
        "alert_id": str(uuid4()), "customer_id": "acme", "currency": "USD",
        "threshold": "spend:10", "period": DEC, "usage_id": "old", "transaction_id": str(uuid4()),
        "value": "10", "spend_limit": None,
    }  # fmt: skip
    v1 = StoredEvent(
        account.id,
        account.version + 1,
        "domain.account:CustomerAccount.AlertCrossed",
        orjson.dumps(state),
    )
    ledger.recorder.insert_events([v1])
    loaded = ledger.repository.get(account.id)
    assert loaded.alerts_crossed == ("spend:10",)
    event = ledger.mapper.to_domain_event(v1)
    assert isinstance(event, CustomerAccount.AlertCrossed)
    assert event.grant_id is None


def test_alerts_set_has_an_option_for_every_kind_of_threshold() -> None:
    from adapters.cli import alerts
    from domain.alerts import KINDS

    assert set(alerts._KINDS) == set(KINDS)


def test_overage_past_the_last_grant_keeps_reaching_a_balance_of_zero() -> None:
    account = _account("balance:0")
    _grant(account, "g1", 100)
    assert _seen(_ingest(account, _spend("u1", "100"))) == [("balance:0", "u1", "0", None)]
    # Nothing left to take: the next period's first record finds the balance at 0 again.
    assert _seen(_ingest(account, _spend("u2", "5", JAN))) == [("balance:0", "u2", "0", None)]


def test_only_the_consumption_of_the_records_checked_is_given_back() -> None:
    """check_alerts is given the records the save decided; consumption of others in the
    save (none, in the ingest: a record set aside consumes nothing) is not theirs."""
    account = _account("balance:50", "percent_of_grant:60")
    _grant(account, "g1", 100)
    other, checked = _spend("other", "30"), _spend("checked", "30")
    burns = account.reserve_and_burn([(r.transaction_id, r.amount) for r in (other, checked)], NOW)
    account.check_alerts([checked], [burns[1].reserved], NOW)
    crossed = [e for e in account.collect_events() if isinstance(e, CustomerAccount.AlertCrossed)]
    # Before ``checked``: 70 left (``other`` took 30 outside the check); after it, 40;
    # the grant's consumption went from 30 to 60 on it.
    assert _seen(crossed) == [
        ("percent_of_grant:60", "checked", "60", "g1"),
        ("balance:50", "checked", "40", None),
    ]
