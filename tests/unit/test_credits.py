"""Prepaid credits on the customer's account: burn-down order, exact fractions,
expiry, the block and overage policies, voids, and conservation per grant (I11)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from unittest.mock import patch
from uuid import UUID, uuid4

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import domain.account
from domain.account import Burner, CustomerAccount, consumption
from domain.credits import MAX_GRANT_MINOR

T0 = datetime(2026, 12, 1, tzinfo=UTC)
NOW = T0 + timedelta(days=3)


def _account(policy: str = "overage") -> CustomerAccount:
    account = CustomerAccount.open("acme", "USD")
    account.set_credit_policy(policy)
    return account


def _grant(account: CustomerAccount, grant_id: str, amount: int, **terms: object) -> None:
    defaults: dict[str, object] = {
        "effective_at": T0, "source": "manual", "reason": "goodwill",
    }  # fmt: skip
    account.grant_credit(grant_id, amount, **{**defaults, **terms})  # type: ignore[arg-type]


def _usage(*amounts: str) -> list[tuple[UUID, Decimal]]:
    return [(uuid4(), Decimal(a)) for a in amounts]


def _conserved(account: CustomerAccount) -> None:
    for g in account.grants.values():
        assert g.consumed + g.expired + g.voided + g.remaining == g.amount
        assert g.remaining >= 0


def _replayed(account: CustomerAccount) -> CustomerAccount:
    rebuilt = None
    for e in account.collect_events():
        rebuilt = e.mutate(rebuilt)
    assert isinstance(rebuilt, CustomerAccount)
    return rebuilt


def test_usage_burns_priority_first_then_soonest_expiry_then_oldest() -> None:
    account = _account()
    _grant(account, "late-prio", 10, priority=5)
    _grant(account, "never", 10)
    _grant(account, "soon", 10, expires_at=T0 + timedelta(days=10))
    _grant(account, "sooner", 10, expires_at=T0 + timedelta(days=5))
    _grant(account, "sooner-younger", 10, expires_at=T0 + timedelta(days=5))
    burns = account.reserve_and_burn(_usage("15", "10", "12"), NOW)
    assert [b.credit for b in burns] == [Decimal(15), Decimal(10), Decimal(12)]
    remaining = {g: account.grants[g].remaining for g in account.grants}
    assert remaining == {
        "sooner": 0, "sooner-younger": 0, "soon": 0, "never": 3, "late-prio": 10,
    }  # fmt: skip
    _conserved(account)


def test_fractions_are_consumed_exactly_and_never_rounded_per_record(carried: bool) -> None:
    account = _account()
    _grant(account, "g", 1)
    burns = account.reserve_and_burn(_usage(*["0.00125"] * 3), NOW)
    assert [b.credit for b in burns] == [Decimal("0.00125")] * 3
    assert account.grants["g"].remaining == Decimal("0.99625")
    recorded = account.pending_events[-1]  # one event for the batch's credit
    kind = CustomerAccount.AmountsReserved if carried else CustomerAccount.CreditsConsumed
    assert isinstance(recorded, kind)
    assert list(consumption(recorded)) == [
        (str(txn), "g", "0.00125") for txn in recorded.transaction_ids
    ]
    assert _replayed(account).grants["g"].remaining == Decimal("0.99625")


def test_the_usual_batch_records_its_consumption_in_one_event(carried: bool) -> None:
    """A batch one grant covers whole, to its last minor unit, records one event for its
    credit: its reservation, naming the grant and the save's moment (carried), or one
    ``CreditsConsumed``; the grant's consumption replays from it. The next batch, past
    the used-up grant, burns the next one the same way."""
    account = _account()
    _grant(account, "a", 10)
    _grant(account, "b", 100, priority=1)
    saved = len(account.pending_events)
    for batch, grant in ((_usage("4", "6"), "a"), (_usage("7.5"), "b")):
        account.reserve_and_burn(batch, NOW)
        reserved, *consumed = account.pending_events[saved:]
        saved += 1 + len(consumed)
        assert isinstance(reserved, CustomerAccount.AmountsReserved)
        ids = [str(txn) for txn, _ in batch]
        assert reserved.transaction_ids == ids
        burnt = (reserved.burnt_from, reserved.burnt_at)
        assert burnt == ((grant, NOW) if carried else (None, None))
        assert len(consumed) == (0 if carried else 1)
        taken = [t for e in (reserved, *consumed) for t in consumption(e)]
        assert taken == [(i, grant, f"{a}") for i, (_, a) in zip(ids, batch, strict=True)]
    remaining = (account.grants["a"].remaining, account.grants["b"].remaining)
    assert remaining == (0, Decimal("92.5"))
    rebuilt = _replayed(account)
    assert (rebuilt.grants["a"].remaining, rebuilt.grants["b"].remaining) == remaining


def test_a_batch_split_across_grants_reserves_every_record_and_lists_its_consumption() -> None:
    account = _account()
    _grant(account, "a", 10)
    _grant(account, "b", 100, priority=1)
    account.collect_events()
    batch = _usage("6", "6")
    account.reserve_and_burn(batch, NOW)
    reserved, consumed = account.collect_events()
    assert isinstance(reserved, CustomerAccount.AmountsReserved)
    assert isinstance(consumed, CustomerAccount.CreditsConsumed)
    ids = [str(txn) for txn, _ in batch]
    assert (reserved.transaction_ids, reserved.amounts, reserved.burnt_from) == (
        ids, ["6", "6"], None,
    )  # fmt: skip
    assert list(consumption(consumed)) == [
        (ids[0], "a", "6"), (ids[1], "a", "4"), (ids[1], "b", "2"),
    ]  # fmt: skip


def test_a_batch_with_a_blocked_record_carries_the_alerts_period_on_its_reservation() -> None:
    account = _account("block")
    _grant(account, "a", 10)
    account.set_alerts(["spend:1000"])
    account.collect_events()
    burns = account.reserve_and_burn(_usage("6", "20", "3"), NOW, "2026-12")
    assert [b.blocked for b in burns] == [False, True, False]
    reserved = account.collect_events()[0]
    assert isinstance(reserved, CustomerAccount.AmountsReserved)
    assert (reserved.amounts, reserved.alert_period) == (["6", "3"], "2026-12")


def test_a_burner_goes_on_from_what_its_one_step_burn_left() -> None:
    account = _account()
    _grant(account, "a", 10)
    _grant(account, "b", 100, priority=1)
    burner = account.burner(NOW)
    assert burner.burn_all([Decimal(6)]) == "a"
    assert burner.burn(uuid4(), Decimal(5)) == 5  # 4 from a, 1 from b
    assert burner.burn_all([Decimal(1)]) is None  # at a, used up: left to ``burn``
    assert burner.burn_all([Decimal(0)]) is None  # nothing positive to burn


def test_overage_bills_beyond_the_grants_and_block_refuses_what_they_cannot_cover() -> None:
    over, block = _account("overage"), _account("block")
    for account in (over, block):
        _grant(account, "g", 100)
    over_burns = over.reserve_and_burn(_usage("60", "50", "40"), NOW)
    assert [(b.reserved, b.credit) for b in over_burns] == [
        (True, Decimal(60)), (True, Decimal(40)), (True, Decimal(0)),
    ]  # fmt: skip
    assert over.reserved == 150  # billed as always: the usage is reserved in full
    block_burns = block.reserve_and_burn(_usage("60", "50", "40"), NOW)
    assert [(b.reserved, b.blocked, b.credit) for b in block_burns] == [
        (True, False, Decimal(60)), (False, True, Decimal(0)), (True, False, Decimal(40)),
    ]  # fmt: skip
    assert block.reserved == 100 and block.grants["g"].remaining == 0
    _conserved(over), _conserved(block)


def test_block_with_no_live_grant_refuses_everything_above_zero() -> None:
    account = _account("block")
    _grant(account, "g", 5, effective_at=NOW + timedelta(days=1))  # not yet effective
    burns = account.reserve_and_burn(_usage("1", "0"), NOW)
    assert [b.blocked for b in burns] == [True, False]


def test_expiry_is_recorded_in_the_save_that_finds_it_and_nothing_expired_is_consumed() -> None:
    account = _account("block")
    _grant(account, "g", 100, expires_at=NOW)  # expires exactly at the save's moment
    _grant(account, "h", 10)
    burns = account.reserve_and_burn(_usage("20"), NOW)
    assert burns[0].blocked  # only h's 10 is live
    expired = [e for e in account.pending_events if isinstance(e, CustomerAccount.CreditExpired)]
    assert [(e.grant_id, e.amount) for e in expired] == [("g", Decimal(100))]
    assert account.expire_credits(NOW) == []  # recorded once
    _conserved(account)
    assert _replayed(account).grants["g"].expired == 100


def test_a_void_takes_only_the_remainder_and_a_second_void_is_refused() -> None:
    account = _account()
    _grant(account, "g", 100)
    account.reserve_and_burn(_usage("30.5"), NOW)
    assert account.void_credit("g", "sold in error") == Decimal("69.5")
    g = account.grants["g"]
    assert (g.consumed, g.voided, g.remaining) == (Decimal("30.5"), Decimal("69.5"), 0)
    with pytest.raises(ValueError, match="nothing left to void"):
        account.void_credit("g", "again")
    with pytest.raises(ValueError, match="no grant nope"):
        account.void_credit("nope", "x")
    assert account.reserve_and_burn(_usage("1"), NOW)[0].credit == 0
    _conserved(account)


@pytest.mark.parametrize(
    ("terms", "message"),
    [
        ({"amount": 0}, "from 1 to"),
        ({"amount": MAX_GRANT_MINOR + 1}, "from 1 to"),
        ({"effective_at": datetime(2026, 12, 1)}, "time zone"),
        ({"expires_at": T0}, "after its effective"),
        ({"source": "gift"}, "source must be one of"),
        ({"reason": " "}, "reason"),
    ],
)
def test_a_grant_with_bad_terms_is_refused_in_one_line(
    terms: dict[str, object], message: str
) -> None:
    account = _account()
    # A copy: pytest hands every run the same dict (mutmut runs the suite twice in one
    # process, its stats then its clean run), so popping from it would change the case.
    terms = dict(terms)
    amount = terms.pop("amount", 10)
    with pytest.raises(ValueError, match=message):
        _grant(account, "g", amount, **terms)  # type: ignore[arg-type]
    assert account.grants == {}


def test_a_repeated_grant_is_a_no_op_and_other_terms_under_its_id_are_refused() -> None:
    account = _account()
    _grant(account, "g", 10)
    assert (
        account.grant_credit("g", 10, effective_at=T0, source="manual", reason="goodwill") is False
    )
    with pytest.raises(ValueError, match="other terms"):
        _grant(account, "g", 11)
    assert len(account.grants) == 1


def test_an_account_without_grants_decides_as_the_limit_alone() -> None:
    account = CustomerAccount.open("acme", "USD", spend_limit=10)
    burns = account.reserve_and_burn(_usage("6", "6", "4"), NOW)
    assert [(b.reserved, b.blocked) for b in burns] == [
        (True, False),
        (False, False),
        (True, False),
    ]
    assert [type(e).__name__ for e in account.pending_events] == ["Opened", "AmountsReserved"]


def test_a_grant_is_live_from_its_effective_moment_until_its_expiry_while_it_holds_some() -> None:
    account = _account()
    _grant(account, "g", 10, effective_at=NOW, expires_at=NOW + timedelta(hours=1))
    grant = account.grants["g"]
    assert grant.live(NOW)  # from the moment it takes effect
    assert not grant.live(NOW - timedelta(microseconds=1))
    assert not grant.live(NOW + timedelta(hours=1))  # not at its expiry
    assert grant.live(NOW + timedelta(hours=1) - timedelta(microseconds=1))
    account.reserve_and_burn(_usage("10"), NOW)  # used up: nothing left to take
    assert grant.remaining == 0
    assert not grant.live(NOW)


_AMOUNTS = st.lists(
    st.decimals(min_value=Decimal(0), max_value=Decimal(40), places=3, allow_nan=False)
    | st.sampled_from([Decimal("2.50"), Decimal("1.0"), Decimal("0.000100")]),
    min_size=1, max_size=12,
)  # fmt: skip


@given(
    grants=st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=3),
    amounts=_AMOUNTS,
    limit=st.one_of(st.none(), st.integers(min_value=0, max_value=150)),
    policy=st.sampled_from(["overage", "block"]),
)
@example(grants=[10, 5], amounts=[Decimal(6), Decimal("4.5")], limit=None, policy="overage")
@example(grants=[10], amounts=[Decimal("2.50"), Decimal("1.0")], limit=None, policy="overage")
def test_a_batch_burnt_in_one_step_is_decided_and_recorded_as_record_by_record(
    grants: list[int], amounts: list[Decimal], limit: int | None, policy: str
) -> None:
    """``Burner.burn_all`` (a batch the first grant covers, every amount positive: the
    usual one) decides what ``burn`` decides for each record in turn, and records the
    same consumption (on the reservation, where ``burn`` records a ``CreditsConsumed``);
    any other batch is left to ``burn``."""
    requests = [(UUID(int=i + 1), amount) for i, amount in enumerate(amounts)]
    decided = []
    for one_step, carried in ((True, True), (True, False), (False, False)):
        account = _account(policy)
        account.set_limit(limit)
        for i, amount in enumerate(grants):
            _grant(account, f"g{i}", amount, priority=i % 2)
        account.collect_events()
        if not one_step:  # the reference: every record burnt on its own
            account.burner = _record_by_record(account.burner)  # type: ignore[method-assign]
        with patch.object(domain.account, "RESERVATION_CARRIES_CREDIT", carried):
            burns = account.reserve_and_burn(requests, NOW)
        events = account.collect_events()
        decided.append((
            burns,
            [taken for e in events for taken in consumption(e)],
            {g: account.grants[g].consumed for g in account.grants},
        ))  # fmt: skip
    assert decided[0] == decided[1] == decided[2]


class _RecordByRecord(Burner):
    __slots__ = ()

    def burn_all(self, *_: Any) -> str | None:
        return None


def _record_by_record(burner: Any) -> Any:
    def made(now: datetime) -> Burner:
        found = burner(now)
        found.__class__ = _RecordByRecord
        return found  # type: ignore[no-any-return]

    return made
