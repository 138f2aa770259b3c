"""An account's credit balance row as a save writes it (``store.credit_rows``): its
totals, the version of the save's last credit event, none for a save without one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from uuid import uuid4

import pytest

from domain.account import CustomerAccount, consumption
from store.credit_rows import balance_row

T0 = datetime(2026, 12, 1, tzinfo=UTC)
NOW = T0 + timedelta(days=3)


def _granted() -> CustomerAccount:
    account = CustomerAccount.open("acme", "USD")
    account.grant_credit("a", 1000, effective_at=T0, source="manual", reason="goodwill")
    account.grant_credit(
        "b", 500, effective_at=T0, expires_at=T0 + timedelta(days=1), source="manual",
        reason="short",
    )  # fmt: skip
    return account


@pytest.mark.usefixtures("carried")
def test_a_save_with_credit_events_writes_the_accounts_totals_at_its_last_credit_event() -> None:
    account = _granted()
    account.collect_events()  # saved
    account.reserve_and_burn([(uuid4(), Decimal("250.5")), (uuid4(), Decimal("0.25"))], NOW)
    account.set_alerts(["spend:100000"])  # a later event of the save, not a credit one
    events = account.collect_events()
    row = balance_row(account, events)
    assert row is not None
    expired = [e for e in events if isinstance(e, CustomerAccount.CreditExpired)]
    consumed = [e for e in events if list(consumption(e))]  # on the batch's reservation
    assert [e.grant_id for e in expired] == ["b"]  # past its expiry at the save
    assert (row.customer_id, row.currency, row.policy) == ("acme", "USD", "overage")
    assert (row.grants, row.granted) == (2, 1500)
    assert (row.consumed, row.expired, row.voided) == (Decimal("250.75"), 500, 0)
    assert row.account_version == consumed[-1].originator_version < account.version
    assert row.updated_at == max(e.timestamp for e in [*expired, *consumed])


def test_a_save_of_a_grant_alone_writes_the_row() -> None:
    account = CustomerAccount.open("acme", "USD")
    account.collect_events()
    account.grant_credit("a", 1000, effective_at=T0, source="manual", reason="goodwill")
    events = account.collect_events()
    row = balance_row(account, events)
    assert row is not None and (row.grants, row.granted, row.consumed) == (1, 1000, 0)
    assert row.account_version == events[-1].originator_version


def test_a_save_without_credit_events_writes_no_row() -> None:
    account = _granted()
    account.collect_events()
    account.set_alerts(["spend:100000"])
    assert balance_row(account, account.collect_events()) is None
    # A reservation that burnt nothing (the grants live later) moves no credit either.
    account.reserve_and_burn([(uuid4(), Decimal(5))], T0 - timedelta(days=1))
    events = account.collect_events()
    assert [type(e) for e in events] == [CustomerAccount.AmountsReserved]
    assert balance_row(account, events) is None
