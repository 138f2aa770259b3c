"""The alerts' shortcut (``domain.alerts.quiet_spend`` and the account's grant check):
a batch whose end reaches no threshold is decided without walking its records, and
decides exactly what the walk decides, whatever the thresholds, grants, limits,
refusals, negative amounts and periods (seeded random accounts and batches)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

import domain.account
from domain.account import CustomerAccount
from domain.alerts import Spend, Threshold, Watch, quiet_spend
from domain.ids import transaction_id
from domain.money import canonical

T0 = datetime(2026, 12, 1, tzinfo=UTC)
PERIODS = ("2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z")
KINDS = ("percent_of_limit", "spend", "balance", "percent_of_grant")


def _thresholds(rng: random.Random) -> list[str]:
    picked = set()
    for _ in range(rng.randint(1, 5)):
        kind = rng.choice(KINDS)
        if kind.startswith("percent"):
            picked.add(f"{kind}:{rng.randint(1, 100)}")
        else:
            picked.add(f"{kind}:{rng.randint(0 if kind == 'balance' else 1, 3000)}")
    return sorted(picked)


def _account(rng: random.Random) -> CustomerAccount:
    account = CustomerAccount.open("acme", "USD")
    account.set_credit_policy(rng.choice(("block", "overage")))
    if rng.random() < 0.5:
        account.set_limit(rng.randint(500, 6000))
    for g in range(rng.randint(0, 3)):
        # Some take effect later, some are bought and await payment: not in the balance.
        terms: dict[str, Any] = {
            "priority": rng.randint(0, 2),
            "effective_at": T0 + timedelta(days=rng.choice((0, 0, 2, 5))),
            "expires_at": T0 + timedelta(days=rng.randint(6, 12)),
        }
        if rng.random() < 0.25:
            account.purchase_credit(f"g{g}", rng.randint(1, 3000), 100, reason="r", **terms)
        else:
            account.grant_credit(
                f"g{g}", rng.randint(1, 3000), source="manual", reason="r", **terms
            )
    account.set_alerts(_thresholds(rng))
    return account


def _batch(rng: random.Random, n: int, start: int) -> list[Spend]:
    out = []
    for i in range(start, start + n):
        amount = Decimal(rng.randint(0, 400)) / rng.choice((1, 4, 1000))
        if rng.random() < 0.05:
            amount = -amount  # a record that moved its line to a cheaper volume tier
        period = PERIODS[1] if rng.random() < 0.9 else rng.choice(PERIODS)
        out.append(Spend(f"u{i}", transaction_id("acme", f"u{i}"), amount, period))
    return out


def _decide(account: CustomerAccount, records: list[Spend], now: datetime) -> list[Any]:
    """What the ingest decides for records priced by line quantity (which may be
    negative): reserve and burn one at a time, then the alerts, in one save."""
    burner = account.burner(now) if account.grants else None
    hold, granted = account.hold(), []
    for r in records:
        ok = not (burner is not None and burner.blocks(r.amount))
        ok = ok and hold.take(r.transaction_id, r.amount)
        granted.append(ok)
        if ok and burner is not None:
            burner.burn(r.transaction_id, canonical(r.amount))
    hold.record()
    if burner is not None:
        burner.record()
    account.check_alerts(records, granted, now)
    return [
        {k: v for k, v in vars(e).items() if k != "timestamp"}
        for e in account.collect_events()
        if isinstance(e, CustomerAccount.AlertCrossed | CustomerAccount.AlertPeriodSpent)
    ]


@pytest.mark.usefixtures("carried")
@pytest.mark.parametrize("seed", range(40))
def test_the_shortcut_decides_what_walking_every_record_decides(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    shortcut, walk = _account(rng), _account(random.Random(seed))
    shortcut.collect_events(), walk.collect_events()
    quiet = 0
    for b in range(12):
        records = _batch(rng, rng.randint(1, 12), b * 100)
        now = T0 + timedelta(hours=rng.randint(1, 24 * 10))
        fast = _decide(shortcut, records, now)
        with monkeypatch.context() as m:  # the shortcut never taken: the walk decides
            m.setattr(domain.account, "quiet_spend", lambda *_: None)
            slow = _decide(walk, records, now)
        assert fast == slow, f"batch {b}"
        quiet += not any("alert_id" in e for e in fast)
    assert quiet  # some batches were decided by the shortcut


def test_a_batch_that_reaches_a_threshold_is_walked() -> None:
    spend = [Spend("u1", transaction_id("acme", "u1"), Decimal(40), PERIODS[1])]
    watch = Watch(PERIODS[1], Decimal(50), set())
    at_100 = [Threshold("spend", 100)]
    # 50 + 40 stays below 100: the period's spend is all there is to record.
    assert quiet_spend(at_100, watch, Decimal(90), None, spend, [True], None) == Decimal(90)
    assert quiet_spend(at_100, Watch(PERIODS[1], Decimal(60), set()), Decimal(0), None,
                       spend, [True], None) is None  # fmt: skip
    # Crossed already this period: nothing left to reach.
    crossed = Watch(PERIODS[1], Decimal(60), {"spend:100"})
    assert quiet_spend(at_100, crossed, Decimal(0), None, spend, [True], None) == Decimal(100)
    # A refused record, a negative one, a later period, no period watched yet: walked.
    assert quiet_spend(at_100, watch, Decimal(0), None, spend, [False], None) is None
    assert quiet_spend(at_100, watch, Decimal(0), None, spend * 2, [True], None) is None
    negative = [spend[0]._replace(amount=Decimal(-1))]
    assert quiet_spend(at_100, watch, Decimal(0), None, negative, [True], None) is None
    later = [spend[0]._replace(period=PERIODS[2])]
    assert quiet_spend(at_100, watch, Decimal(0), None, later, [True], None) is None
    assert quiet_spend(at_100, Watch(None, Decimal(0), set()), Decimal(0), None, spend,
                       [True], None) is None  # fmt: skip
    # The limit's and the balance's measures are the batch's end.
    limit = [Threshold("percent_of_limit", 50)]
    assert quiet_spend(limit, watch, Decimal(49), 100, spend, [True], None) is not None
    assert quiet_spend(limit, watch, Decimal(50), 100, spend, [True], None) is None
    balance = [Threshold("balance", 10)]
    assert quiet_spend(balance, watch, Decimal(0), None, spend, [True], Decimal(11)) is not None
    assert quiet_spend(balance, watch, Decimal(0), None, spend, [True], Decimal(10)) is None
    assert quiet_spend(balance, watch, Decimal(0), None, spend, [True], None) is not None


@pytest.mark.usefixtures("carried")
def test_a_grant_carried_exactly_to_its_mark_is_walked_and_fires() -> None:
    account = CustomerAccount.open("acme", "USD")
    account.grant_credit("g", 1000, effective_at=T0, source="manual", reason="r")
    account.set_alerts(["percent_of_grant:50", "percent_of_grant:90", "spend:100000"])
    account.collect_events()
    now = T0 + timedelta(days=1)
    first = _batch_of(("u1", "200"), ("u2", "100"))
    assert not [e for e in _decide(account, first, now) if "alert_id" in e]  # 300 of 1000
    # 300 + 150 + 50: exactly the mark, by the batch's last record.
    fired = [e for e in _decide(account, _batch_of(("u3", "150"), ("u4", "50")), now)
             if "alert_id" in e]  # fmt: skip
    assert [(e["threshold"], e["usage_id"], e["value"]) for e in fired] == [
        ("percent_of_grant:50", "u4", "500")
    ]
    # Past the mark now: a later batch does not fire it again.
    assert not [e for e in _decide(account, _batch_of(("u5", "1")), now) if "alert_id" in e]


def _batch_of(*records: tuple[str, str]) -> list[Spend]:
    return [Spend(u, transaction_id("acme", u), Decimal(a), PERIODS[1]) for u, a in records]


def _reserve_then_check(
    account: CustomerAccount, records: list[Spend], now: datetime, *, carried: bool
) -> tuple[list[Any], tuple[Any, ...], list[Any]]:
    """The ingest's usual batch (``settle_account``): reserve and burn at once, then the
    alerts; with ``carried``, the reservation carries the alerts' period as the ingest's
    does (``alert_period_of``). The crossings, the alerts' state after, and the events."""
    alert_period = account.alert_period_of({r.period for r in records}) if carried else None
    watched = account.alert_watch() if alert_period is not None else None
    burns = account.reserve_and_burn([(r.transaction_id, r.amount) for r in records], now,
                                     alert_period)  # fmt: skip
    account.check_alerts(records, [b.reserved for b in burns], now, watched)
    events = account.collect_events()
    crossed = [
        {k: v for k, v in vars(e).items() if k not in ("timestamp", "originator_version")}
        for e in events
        if isinstance(e, CustomerAccount.AlertCrossed)
    ]
    return crossed, _alert_state(account), events


def _alert_state(account: CustomerAccount) -> tuple[Any, ...]:
    return account.alert_period, account.alert_period_spend, tuple(account.alerts_crossed)


@pytest.mark.parametrize("seed", range(40))
def test_a_reservation_that_carries_the_alerts_period_decides_as_the_spend_event(
    seed: int,
) -> None:
    """Carrying the alerts' period on ``AmountsReserved`` (the period's spend moved with
    the reservation, no ``AlertPeriodSpent``) crosses the same thresholds, with the same
    records, and leaves the same period, spend and crossed as recording the spend on its
    own; and the account rebuilt from its events has them too."""
    rng = random.Random(seed)
    carried, alone = _account(rng), _account(random.Random(seed))
    history = carried.collect_events()
    alone.collect_events()
    for b in range(12):
        records = [
            r._replace(amount=abs(r.amount)) for r in _batch(rng, rng.randint(1, 12), b * 100)
        ]
        now = T0 + timedelta(hours=rng.randint(1, 24 * 10))
        fast = _reserve_then_check(carried, records, now, carried=True)
        slow = _reserve_then_check(alone, records, now, carried=False)
        assert fast[:2] == slow[:2], f"batch {b}"
        history += fast[2]
    rebuilt = None
    for e in history:
        rebuilt = e.mutate(rebuilt)
    assert isinstance(rebuilt, CustomerAccount)
    assert _alert_state(rebuilt) == _alert_state(carried)


def test_a_quiet_batch_moves_the_period_spend_with_its_reservation_alone() -> None:
    account = CustomerAccount.open("acme", "USD")
    account.set_alerts(["spend:1000"])
    account.collect_events()
    for n, amount in enumerate((Decimal(30), Decimal("12.5"))):
        records = [Spend(f"u{n}", transaction_id("acme", f"u{n}"), amount, PERIODS[1])]
        _, state, events = _reserve_then_check(account, records, T0, carried=True)
        names = [type(e).__name__ for e in events]
        assert names == ["AmountsReserved"] and events[0].alert_period == PERIODS[1]
    assert state == (PERIODS[1], Decimal("42.5"), ())
    # A batch over two periods, one later than the watched: walked, its spend recorded.
    later = [Spend(f"v{p}", transaction_id("acme", f"v{p}"), Decimal(5), p) for p in PERIODS]
    _, state, events = _reserve_then_check(account, later, T0, carried=True)
    assert [type(e).__name__ for e in events] == ["AmountsReserved", "AlertPeriodSpent"]
    assert events[0].alert_period is None and state == (PERIODS[2], Decimal(5), ())


def test_a_batch_of_a_later_period_starts_its_watch_afresh_in_its_reservation() -> None:
    account = CustomerAccount.open("acme", "USD")
    account.set_alerts(["spend:40"])
    account.collect_events()
    dec = [Spend("u1", transaction_id("acme", "u1"), Decimal(50), PERIODS[1])]
    crossed, state, _ = _reserve_then_check(account, dec, T0, carried=True)
    assert len(crossed) == 1 and state == (PERIODS[1], Decimal(50), ("spend:40",))
    jan = [Spend("u2", transaction_id("acme", "u2"), Decimal(5), PERIODS[2])]
    crossed, state, events = _reserve_then_check(account, jan, T0, carried=True)
    assert events[0].alert_period == PERIODS[2] and len(events) == 1
    assert crossed == [] and state == (PERIODS[2], Decimal(5), ())  # nothing crossed in it


@pytest.mark.usefixtures("carried")
def test_a_batch_the_account_finds_quiet_records_nothing_when_walked() -> None:
    """``quiet_after`` (the ingest's way past ``check_alerts`` for a batch every record of
    was reserved): when it finds the batch's end quiet, ``check_alerts`` records nothing
    for it either; over 40 seeded accounts it finds batches quiet, and it leaves others
    (which then cross a threshold or move the period) to ``check_alerts``."""
    quiet_ones = walked = 0
    for seed in range(40):
        rng = random.Random(seed)
        account = _account(rng)
        account.collect_events()
        for b in range(16):
            records = [
                r._replace(amount=abs(r.amount)) for r in _batch(rng, rng.randint(1, 12), b * 100)
            ]
            now = T0 + timedelta(hours=rng.randint(1, 24 * 10))
            alert_period = account.alert_period_of({r.period for r in records})
            watched = account.alert_watch() if alert_period is not None else None
            burns = account.reserve_and_burn(
                [(r.transaction_id, r.amount) for r in records], now, alert_period
            )
            granted = [b.reserved for b in burns]
            quiet = watched is not None and all(granted) and account.quiet_after(watched, now)
            before = len(account.pending_events)
            account.check_alerts(records, granted, now, watched)
            recorded = len(account.pending_events) > before
            assert not (quiet and recorded), f"seed {seed}, batch {b}"
            quiet_ones += quiet
            walked += recorded
            account.collect_events()
    assert quiet_ones and walked


def test_a_batch_of_a_later_period_is_not_quiet_for_what_the_period_before_crossed() -> None:
    """A threshold crossed in December is crossed again by January's first batch: the
    account does not find that batch quiet from December's watch."""
    account = CustomerAccount.open("acme", "USD")
    account.set_alerts(["spend:40"])
    account.collect_events()
    dec = [Spend("u1", transaction_id("acme", "u1"), Decimal(50), PERIODS[1])]
    crossed, _, _ = _reserve_then_check(account, dec, T0, carried=True)
    assert len(crossed) == 1
    jan = [Spend("u2", transaction_id("acme", "u2"), Decimal(45), PERIODS[2])]
    watched = account.alert_watch()
    account.reserve_and_burn([(jan[0].transaction_id, jan[0].amount)], T0, PERIODS[2])
    assert not account.quiet_after(watched, T0)
    account.check_alerts(jan, [True], T0, watched)
    assert [
        e.period for e in account.collect_events() if e.__class__.__name__ == "AlertCrossed"
    ] == [PERIODS[2]]
