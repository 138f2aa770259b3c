"""The credits audit (I11) finds what breaks conservation, consumes beyond what is
left, bills a blocked record, or credits an invoice other than the grants gave."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID, uuid4

import pytest

from domain.account import CustomerAccount, moves_credit
from domain.audit import TxnAudit
from domain.audit_credits import CreditAudit, check_credits
from domain.audit_lines import LineAudit, credit_applied
from domain.credit_line import CreditLine
from domain.periods import PeriodPolicy
from projections.credits import _fold as credit_fold

T0 = datetime(2026, 12, 1, tzinfo=UTC)
NOW = T0 + timedelta(days=1)


def _stored(value: Any) -> Any:
    """A field as the replay hands it over: registered types as their strings."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return f"{value:f}"
    return value


def _fold(account: CustomerAccount) -> CreditAudit:
    audit = CreditAudit(account.customer_id, account.currency)
    for event in account.collect_events():
        data = {k: _stored(v) for k, v in vars(event).items()}
        audit.apply(type(event).__name__, data, event.originator_version)
    return audit


def _account(policy: str = "block") -> CustomerAccount:
    account = CustomerAccount.open("acme", "USD")
    account.set_credit_policy(policy)
    account.grant_credit("g", 100, effective_at=T0, expires_at=NOW + timedelta(days=1),
                         source="manual", reason="r")  # fmt: skip
    return account


LINE = str(uuid4())  # the usage line the transactions joined


def _txn(txn_id: str, amount: str, line: str | None = LINE) -> TxnAudit:
    txn = TxnAudit(txn_id, "acme", "u", "api.requests", "1", Decimal(amount), "USD", "")
    txn.line_id = line
    return txn


@pytest.mark.usefixtures("carried")
def test_a_history_the_account_decided_has_no_finding() -> None:
    account = _account()
    txns = [(uuid4(), Decimal("60.5")), (uuid4(), Decimal("50"))]
    account.reserve_and_burn(txns, NOW)
    account.expire_credits(NOW + timedelta(days=2))
    audit = _fold(account)
    applied = {LINE: (Decimal("60.5"), 1)}  # the second was refused: no credit
    known = {str(t): _txn(str(t), f"{a}") for t, a in txns}
    assert check_credits({("acme", "USD"): audit}, applied, known) == []
    g = audit.grants["g"]
    assert (g.consumed, g.expired, g.remaining) == (Decimal("60.5"), Decimal("39.5"), 0)


def test_consumption_beyond_what_is_left_and_a_grant_below_zero_are_findings() -> None:
    account = _account()
    audit = _fold(account)
    audit.apply("CreditsConsumed", {"transaction_ids": ["t"], "grant_ids": ["g"],
                                    "amounts": ["120"], "at": NOW.isoformat()}, 5)  # fmt: skip
    found = check_credits(
        {("acme", "USD"): audit}, {LINE: (Decimal(120), 1)}, {"t": _txn("t", "120")}
    )
    details = [f.detail for f in found]
    assert any("consumed" in d and "which had" in d for d in details)
    assert any(d.startswith("below zero") for d in details)


def test_an_expiry_that_takes_other_than_what_was_left_is_a_finding() -> None:
    audit = _fold(_account())
    audit.apply("CreditExpired", {"grant_id": "g", "amount": "99", "expires_at": ""}, 4)
    assert [p for p in audit.problems if "was left" in p]


def test_a_record_only_partly_covered_under_block_is_a_finding() -> None:
    audit = _fold(_account())
    audit.apply("CreditsConsumed", {"transaction_ids": ["t"], "grant_ids": ["g"],
                                    "amounts": ["10"], "at": NOW.isoformat()}, 5)  # fmt: skip
    found = check_credits(
        {("acme", "USD"): audit}, {LINE: (Decimal(10), 1)}, {"t": _txn("t", "25")}
    )
    assert [f.subject for f in found] == ["t"]
    assert "under the block policy" in found[0].detail


def test_consuming_an_expired_grant_is_a_finding_even_without_its_expiry_event() -> None:
    audit = _fold(_account())
    late = (NOW + timedelta(days=1)).isoformat()  # the grant's expiry moment
    audit.apply("CreditsConsumed", {"transaction_ids": ["t"], "grant_ids": ["g"],
                                    "amounts": ["1"], "at": late}, 5)  # fmt: skip
    assert [p for p in audit.problems if "not live" in p]


def test_a_reservation_burnt_from_a_grant_is_checked_as_its_consumption() -> None:
    """The usual batch's consumption rides on its ``AmountsReserved`` (``burnt_from``): the
    audit checks it as it checks a ``CreditsConsumed``, and one without it consumed nothing."""
    audit = _fold(_account())
    late = (NOW + timedelta(days=1)).isoformat()  # the grant's expiry moment
    reserved = {"transaction_ids": ["t", "u"], "amounts": ["60", "50"], "alert_period": None}
    audit.apply("AmountsReserved", {**reserved, "burnt_from": None, "burnt_at": None}, 5)
    assert (audit.consumed_by, audit.grants["g"].consumed) == ({}, 0)
    audit.apply("AmountsReserved", {**reserved, "burnt_from": "g", "burnt_at": late}, 6)
    assert audit.consumed_by == {"t": Decimal(60), "u": Decimal(50)}
    assert audit.grants["g"].consumed == Decimal(110)
    assert audit.problems == [
        "v6: t consumed grant g, which was not live",
        "v6: u consumed grant g, which was not live",
        "v6: u consumed 0.50 USD of grant g, which had 0.40 USD left",
    ]


@pytest.mark.usefixtures("carried")
def test_a_credit_line_that_differs_from_the_consumption_is_a_finding() -> None:
    account = _account("overage")
    t, u = uuid4(), uuid4()
    account.reserve_and_burn([(t, Decimal(30)), (u, Decimal(20))], NOW)
    audit = _fold(account)
    known = {str(t): _txn(str(t), "30"), str(u): _txn(str(u), "20")}
    assert check_credits({("acme", "USD"): audit}, {LINE: (Decimal(50), 2)}, known) == []
    found = check_credits({("acme", "USD"): audit}, {LINE: (Decimal(49), 2)}, known)
    assert [f.subject for f in found] == [LINE]
    assert "gave 50 to 2 of them" in found[0].detail and "took off 49 for 2" in found[0].detail
    missing = check_credits({("acme", "USD"): audit}, {}, known)
    assert "took off 0 for 0" in missing[0].detail
    # The same credit, said to be for one record fewer: a record credited twice or not at all.
    assert check_credits({("acme", "USD"): audit}, {LINE: (Decimal(50), 1)}, known)


def test_credit_given_to_a_transaction_on_another_line_is_a_finding() -> None:
    account = _account("overage")
    t, u = uuid4(), uuid4()
    account.reserve_and_burn([(t, Decimal(30)), (u, Decimal(20))], NOW)
    audit = _fold(account)
    other = str(uuid4())
    known = {str(t): _txn(str(t), "30"), str(u): _txn(str(u), "20", other)}
    found = check_credits({("acme", "USD"): audit}, {LINE: (Decimal(50), 2)}, known)
    assert sorted(f.subject for f in found) == sorted([LINE, other])


def test_credit_consumed_by_a_transaction_on_no_line_is_a_finding() -> None:
    account = _account("overage")
    t = uuid4()
    account.reserve_and_burn([(t, Decimal(30))], NOW)
    audit = _fold(account)
    for known in ({}, {str(t): _txn(str(t), "30", None)}):
        found = check_credits({("acme", "USD"): audit}, {}, known)
        assert [(f.subject, f.detail) for f in found] == [
            (str(t), "consumed 0.30 USD and is on no line")
        ]


def test_the_credit_lines_as_folded_tie_to_the_consumption_per_usage_line() -> None:
    """The credit lines' events, folded as the audit folds them, against the account's:
    two usage lines on one period's credit line, a third on the next period's."""
    account = _account("overage")
    txns = [(uuid4(), Decimal("10.5")), (uuid4(), Decimal(20)), (uuid4(), Decimal(7))]
    account.reserve_and_burn(txns, NOW)
    a, b, c = (str(uuid4()) for _ in range(3))
    on = dict(zip((str(t) for t, _ in txns), (a, a, b), strict=True))
    policy = PeriodPolicy()
    dec, jan = policy.period_of(T0), policy.next(policy.period_of(T0))
    lines = {}
    for period, entries in ((dec, txns[:2]), (jan, txns[2:]), (dec, [(uuid4(), Decimal(2))])):
        line = CreditLine.open_for("acme", "USD", period)
        line.apply([(t, UUID(on.get(str(t), c)), credit) for t, credit in entries])
        audit = LineAudit(str(line.id), "acme", "USD", "credits", str(period))
        for event in line.collect_events()[1:]:
            data = {k: _stored(v) for k, v in vars(event).items()}
            audit.apply(type(event).__name__, data, event.originator_version)
        lines[f"{period}-{len(lines)}"] = audit
        assert audit.problems == []
    applied = credit_applied(lines)
    assert applied == {a: (Decimal("30.5"), 2), b: (Decimal(7), 1), c: (Decimal(2), 1)}
    known = {str(t): _txn(str(t), f"{amount}", on[str(t)]) for t, amount in txns}
    # The third line's credit was given by no grant of the account: the one finding.
    found = check_credits({("acme", "USD"): _fold(account)}, applied, known)
    assert [(f.subject, f.detail) for f in found] == [
        (
            c,
            "its transactions' grants gave 0 to 0 of them; its invoice's credit line took"
            " off 2 for 1",
        )
    ]


@pytest.mark.parametrize(
    "lists",
    [
        {"transaction_ids": ["t"], "line_ids": ["a", "b"], "amounts": ["1", "2"]},
        {"transaction_ids": ["t", "u"], "line_ids": ["a", "b"], "amounts": ["1"]},
        {"line_ids": ["a"], "amounts": ["1", "2"], "counts": [1]},
        {"line_ids": ["a", "b"], "amounts": ["1", "2"], "counts": [1]},
    ],
)
def test_a_credit_line_event_whose_lists_do_not_pair_up_is_a_finding(
    lists: dict[str, Any],
) -> None:
    audit = LineAudit("l", "acme", "USD", "credits", "p")
    audit.apply("CreditsApplied", {**lists, "exact_total": "0", "billed": 0, "transactions": 0}, 2)
    assert "v2: CreditsApplied lists of unequal lengths" in audit.problems


@pytest.mark.usefixtures("carried")
def test_the_audit_and_the_credit_read_models_add_as_exactly_as_the_account() -> None:
    """Amounts of many digits (a large record beside one of 10^-27 minor units) add up
    in the audit's fold and in the read models' fold exactly as on the account, not at
    the default context's 28 digits."""
    account = _account("overage")
    tiny = Decimal("0.00000000000000000000000000123")
    account.reserve_and_burn([(uuid4(), Decimal("99.5")), (uuid4(), tiny)], NOW)
    account.expire_credits(NOW + timedelta(days=2))
    events = list(account.pending_events)
    grant = account.grants["g"]
    assert grant.consumed == Decimal("99.50000000000000000000000000123")  # exact here
    assert grant.expired == Decimal("0.49999999999999999999999999877")  # what was left
    audit = _fold(account)
    audited = audit.grants["g"]
    assert (audited.consumed, audited.expired) == (grant.consumed, grant.expired)
    assert (audit.problems, audited.remaining) == ([], 0)

    class _Facts:
        customer_id, currency = "acme", "USD"

    class _History:
        def facts(self, _: object) -> type[_Facts]:
            return _Facts

    moved = [e for e in events if moves_credit(e)]
    accounts, grants = credit_fold(moved, _History())  # type: ignore[arg-type]
    row = grants["acme", "USD", "g"]
    assert (row.consumed, row.expired) == (grant.consumed, grant.expired)
    assert accounts["acme", "USD"].steps[-1].expired == grant.expired
