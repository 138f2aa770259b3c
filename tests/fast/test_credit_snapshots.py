"""An account's grants and a credit line survive a snapshot: the ledger loads them from
it as they were (the grants through their own transcoding, ``store.ledger.GrantAsDict``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import uuid4

from domain.account import CustomerAccount
from domain.credit_line import CreditLine
from domain.periods import PeriodPolicy
from tests.fast.fakes import memory_ledger

AT = datetime(2026, 12, 1, tzinfo=UTC)


def _forget(ledger: Any) -> None:
    """Drop the aggregates the ledger keeps in memory: the next load reads the store."""
    if ledger.repository.cache is not None:
        ledger.repository.cache.clear()


def test_an_account_with_grants_loads_from_its_snapshot_as_it_was() -> None:
    ledger = memory_ledger()

    def change(account: CustomerAccount) -> None:
        account.grant_credit("a", 100, effective_at=AT, expires_at=AT + timedelta(days=9),
                             source="manual", reason="r")  # fmt: skip
        account.grant_credit("b", 50, priority=-1, effective_at=AT, source="purchased",
                             reason="bought")  # fmt: skip
        account.set_credit_policy("block")
        account.reserve_and_burn([(uuid4(), Decimal("60.125"))], AT + timedelta(days=1))

    ledger.change_account("acme", "USD", change)
    before = ledger.account("acme", "USD")
    assert before is not None
    ledger.take_snapshot(before.id)
    assert ledger.snapshots is not None and list(ledger.snapshots.get(before.id))
    _forget(ledger)
    after = ledger.repository.get(before.id)
    assert after.grants == before.grants and after.credit_policy == "block"
    assert after.grants["b"].consumed == 50 and after.grants["a"].remaining == Decimal("89.875")


def test_a_credit_line_loads_from_its_snapshot_as_it_was() -> None:
    ledger = memory_ledger()
    line = CreditLine.open_for("acme", "USD", PeriodPolicy().period_of(AT))
    line.apply([(uuid4(), uuid4(), Decimal("0.6")), (uuid4(), uuid4(), Decimal("1.5"))])
    ledger.save(line)
    ledger.take_snapshot(line.id)
    assert ledger.snapshots is not None and list(ledger.snapshots.get(line.id))
    _forget(ledger)
    loaded = ledger.repository.get(line.id)
    assert isinstance(loaded, CreditLine)
    assert (loaded.billed, loaded.per_line) == (-3, line.per_line)


def test_an_account_with_a_pending_purchase_and_a_top_up_rule_loads_from_its_snapshot() -> None:
    ledger = memory_ledger()
    now = AT + timedelta(days=1)

    def change(account: CustomerAccount) -> None:
        account.grant_credit("a", 1000, effective_at=AT, source="manual", reason="r")
        account.set_top_up(500, 2000, 1800)
        account.reserve_and_burn([(uuid4(), Decimal(600))], now)
        account.check_top_up(Decimal(1000), now)  # crossed: top-up-1-1 requested
        account.purchase_credit("p", 300, 250, effective_at=AT, reason="pack")

    ledger.change_account("acme", "USD", change)
    before = ledger.account("acme", "USD")
    assert before is not None
    ledger.take_snapshot(before.id)
    _forget(ledger)
    after = ledger.repository.get(before.id)
    assert after.grants == before.grants and after.grants["p"].state == "pending"
    assert (after.top_up, after.top_up_armed, after.top_up_crossings) == (
        before.top_up, False, 1
    )  # fmt: skip
    assert after.buy_top_up("top-up-1-1", now) is not None  # its terms survived
    assert after.grants["top-up-1-1"].amount == 2000
