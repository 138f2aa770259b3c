"""Purchased credit and the automatic top-up, as the domain decides them (pure): a
purchased grant waits for its invoice's payment, a voided or uncollectible invoice never
makes it live, a top-up starts once per crossing with an id derived from the crossing,
and hostile terms are refused with a reason and nothing recorded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from uuid import uuid4

import pytest

from domain.account import CustomerAccount
from domain.audit_credits import CreditAudit
from domain.credits import MAX_GRANT_MINOR, GrantState
from domain.ids import purchase_id
from domain.invoice_states import StripeInvoiceView
from domain.purchase import CreditPurchase, PurchaseState, PurchaseStep

NOW = datetime(2027, 1, 10, 12, tzinfo=UTC)
DAY = timedelta(days=1)


def _account(credit: int = 0) -> CustomerAccount:
    account = CustomerAccount.open("acme", "USD")
    if credit:
        account.grant_credit("promo", credit, effective_at=NOW - DAY, source="promotional",
                             reason="welcome")  # fmt: skip
    return account


def _buy(account: CustomerAccount, grant_id: str = "pack", amount: int = 1000) -> None:
    account.purchase_credit(grant_id, amount, 900, effective_at=NOW - DAY, reason="pack")


def _burn(account: CustomerAccount, *amounts: int) -> list[Decimal]:
    burns = account.reserve_and_burn([(uuid4(), Decimal(a)) for a in amounts], NOW)
    return [b.credit for b in burns]


def _view(status: str, total: int = 900, paid: int = 0) -> StripeInvoiceView:
    return StripeInvoiceView(status, "N-1", total, paid, 1, None, NOW, "evt_1")


# -- a purchased grant waits for its payment --------------------------------------------


def test_a_purchased_grant_is_pending_and_not_consumed_until_its_invoice_is_paid() -> None:
    account = _account()
    bought = account.purchase_credit("pack", 1000, 900, effective_at=NOW - DAY, reason="pack")
    assert bought == purchase_id("acme", "USD", "pack")
    grant = account.grants["pack"]
    assert grant.state is GrantState.PENDING and not grant.live(NOW)
    assert _burn(account, 100) == [Decimal(0)] and grant.consumed == 0
    assert account.settle_purchase("pack", paid=True, reason="", stripe_invoice_id="in_1")
    assert grant.state is GrantState.LIVE and grant.note == "paid: invoice in_1"
    assert _burn(account, 100) == [Decimal(100)] and grant.remaining == 900


def test_an_unpaid_purchase_voids_its_grant_with_the_reason_and_it_never_becomes_live() -> None:
    account = _account()
    _buy(account)
    assert account.settle_purchase("pack", paid=False, reason="its invoice in_1 was voided",
                                   stripe_invoice_id="in_1")  # fmt: skip
    grant = account.grants["pack"]
    assert grant.state is GrantState.UNPAID and grant.note.endswith("in_1 was voided")
    assert (grant.voided, grant.remaining) == (1000, 0)  # granted = voided: conserved
    assert not account.settle_purchase("pack", paid=True, reason="", stripe_invoice_id="in_1")
    assert not grant.live(NOW) and _burn(account, 100) == [Decimal(0)]


def test_the_same_purchase_twice_records_it_once_and_another_grant_id_is_refused() -> None:
    account = _account(500)
    _buy(account)
    before = len(account.pending_events)
    assert account.purchase_credit("pack", 1000, 900, effective_at=NOW - DAY, reason="pack") is None
    assert len(account.pending_events) == before
    with pytest.raises(ValueError, match="exists already with other terms"):
        account.purchase_credit("promo", 500, 0, effective_at=NOW - DAY, reason="welcome")
    # a purchased grant from before purchases were invoiced (live at once) stays as it is
    account.grant_credit("old", 100, effective_at=NOW - DAY, source="purchased", reason="r")
    with pytest.raises(ValueError, match="was not purchased"):
        account.purchase_credit("old", 100, 100, effective_at=NOW - DAY, reason="r")


@pytest.mark.parametrize(
    ("amount", "price", "reason"),
    [
        (1000, -1, "price must be from 0"),
        (1000, MAX_GRANT_MINOR + 1, "price must be from 0"),
        (1000, True, "price must be whole minor units"),
        (0, 10, "amount must be from 1"),
        (-5, 10, "amount must be from 1"),
        (MAX_GRANT_MINOR + 1, 10, "amount must be from 1"),
    ],
)
def test_hostile_purchases_are_refused_with_a_reason_and_record_nothing(
    amount: int, price: int, reason: str
) -> None:
    account = _account()
    recorded = len(account.pending_events)
    with pytest.raises(ValueError, match=reason):
        account.purchase_credit("pack", amount, price, effective_at=NOW, reason="pack")
    assert len(account.pending_events) == recorded and "pack" not in account.grants


# -- the purchase's invoice --------------------------------------------------------------


def test_a_purchase_is_driven_step_by_step_and_paid_by_what_stripe_says() -> None:
    purchase = CreditPurchase.start("acme", "USD", "pack", 1000, 900)
    assert purchase.id == purchase_id("acme", "USD", "pack")
    assert purchase.next_step is PurchaseStep.DRAFT and purchase.due(NOW)
    purchase.record_failure("api_connection_error", "timeout", NOW + DAY)
    assert not purchase.due(NOW) and purchase.due(NOW + DAY) and purchase.attempts == 1
    purchase.record_draft("in_1", "cus_1")
    assert purchase.next_step is PurchaseStep.ITEM and purchase.due(NOW)
    purchase.record_item("ii_1")
    assert purchase.next_step is PurchaseStep.FINALIZE
    assert not purchase.observe(_view("draft"))
    assert purchase.observe(_view("open"))
    assert purchase.state is PurchaseState.FINALIZED and purchase.next_step is PurchaseStep.NONE
    assert not purchase.observe(_view("open"))  # repeated: nothing
    assert purchase.observe(_view("paid", paid=900)) and purchase.state is PurchaseState.PAID
    assert not purchase.observe(_view("void"))  # settled: nothing changes it


@pytest.mark.parametrize(
    ("status", "said"), [("void", "voided"), ("uncollectible", "uncollectible")]
)
def test_a_void_or_uncollectible_invoice_makes_the_purchase_unpaid_saying_why(
    status: str, said: str
) -> None:
    purchase = CreditPurchase.start("acme", "USD", "pack", 1000, 900)
    purchase.record_draft("in_1", "cus_1")
    assert purchase.observe(_view(status))
    assert purchase.state is PurchaseState.UNPAID and said in purchase.reason
    assert "in_1" in purchase.reason


def test_a_finalized_total_other_than_the_price_is_never_paid_for_silently() -> None:
    purchase = CreditPurchase.start("acme", "USD", "pack", 1000, 900)
    assert purchase.observe(_view("paid", total=500, paid=500))
    assert (
        purchase.state is PurchaseState.UNPAID and "where the price is 9.00 USD" in purchase.reason
    )


def test_a_refused_purchase_is_unpaid_and_a_bad_price_never_starts_one() -> None:
    purchase = CreditPurchase.start("acme", "USD", "pack", 1000, 0)  # a price of 0 is allowed
    purchase.refuse("Stripe refused its draft: invalid_request_error: no", "purchaser")
    assert purchase.state is PurchaseState.UNPAID and purchase.next_step is PurchaseStep.NONE
    with pytest.raises(ValueError, match="price"):
        CreditPurchase.start("acme", "USD", "pack", 1000, -1)


# -- the automatic top-up ------------------------------------------------------------------


def test_a_top_up_starts_once_per_crossing_with_an_id_derived_from_the_crossing() -> None:
    account = _account(1000)
    assert account.set_top_up(500, 2000)
    before = account.live_credit(NOW)
    _burn(account, 400)  # 600 left: above
    assert account.check_top_up(before, NOW) is None
    before = account.live_credit(NOW)
    _burn(account, 200)  # 400 left: crossed
    started = account.check_top_up(before, NOW)
    assert started == purchase_id("acme", "USD", "top-up-1-1")
    before = account.live_credit(NOW)
    _burn(account, 100)  # still below: the same crossing, no second purchase
    assert account.check_top_up(before, NOW) is None
    starts = [e for e in account.pending_events if isinstance(e, CustomerAccount.TopUpStarted)]
    assert [(e.grant_id, e.crossing, e.buy, e.price, e.balance) for e in starts] == [
        ("top-up-1-1", 1, 2000, 2000, "400")
    ]


def test_a_second_save_deciding_the_same_crossing_names_the_same_purchase() -> None:
    """Two ingest processes load the account at one version and both cross: both decide
    the same event (one loses the version race); nothing depends on a clock."""
    decided = []
    for _ in range(2):
        account = _account(1000)
        account.set_top_up(500, 2000)
        before = account.live_credit(NOW)
        _burn(account, 600)
        decided.append(account.check_top_up(before, NOW + timedelta(seconds=len(decided))))
    assert decided[0] == decided[1] is not None


def test_no_second_purchase_until_the_balance_rises_above_the_threshold_and_falls_again() -> None:
    account = _account(1000)
    account.set_top_up(500, 2000, 1800)
    before = account.live_credit(NOW)
    _burn(account, 600)
    first = account.check_top_up(before, NOW)
    assert first is not None and account.buy_top_up("top-up-1-1", NOW) == first
    assert account.buy_top_up("top-up-1-1", NOW) is None  # bought once
    pending = account.grants["top-up-1-1"]
    assert (pending.amount, pending.state, pending.source) == (
        2000,
        GrantState.PENDING,
        "purchased",
    )
    before = account.live_credit(NOW)  # 400: the pending purchase is not live
    _burn(account, 50)
    assert account.check_top_up(before, NOW) is None
    account.settle_purchase("top-up-1-1", paid=True, reason="", stripe_invoice_id="in_1")
    before = account.live_credit(NOW)  # 2350: above again
    _burn(account, 1900)  # 450: falls again
    second = account.check_top_up(before, NOW)
    assert second == purchase_id("acme", "USD", "top-up-1-2")
    assert [type(e).__name__ for e in account.pending_events][-2:] == [
        "TopUpRearmed", "TopUpStarted"
    ]  # fmt: skip


def test_a_cleared_rule_buys_nothing_and_a_new_rule_has_a_new_version() -> None:
    account = _account(1000)
    account.set_top_up(500, 2000)
    assert not account.set_top_up(500, 2000)  # the same rule: nothing recorded
    assert account.clear_top_up() and not account.clear_top_up()
    before = account.live_credit(NOW)
    _burn(account, 900)
    assert account.check_top_up(before, NOW) is None
    account.set_top_up(200, 1000)
    assert account.top_up is not None and account.top_up.version == 3
    assert account.check_top_up(account.live_credit(NOW), NOW) == purchase_id(
        "acme", "USD", "top-up-3-1"
    )  # a new rule is armed: a balance already below buys at the next save


@pytest.mark.parametrize(
    ("below", "buy", "price", "reason"),
    [
        (500, 500, None, "must buy more than its threshold"),
        (500, 100, None, "must buy more than its threshold"),
        (0, 100, None, "threshold must be from 1"),
        (-1, 100, None, "threshold must be from 1"),
        (500, MAX_GRANT_MINOR + 1, None, "amount to buy must be from 1"),
        (500, 1000, -1, "price must be from 0"),
        (500, 1000, MAX_GRANT_MINOR + 1, "price must be from 0"),
        (True, 1000, None, "whole minor units"),
    ],
)
def test_hostile_top_up_rules_are_refused_with_a_reason_and_record_nothing(
    below: int, buy: int, price: int | None, reason: str
) -> None:
    account = _account(1000)
    recorded = len(account.pending_events)
    with pytest.raises(ValueError, match=reason):
        account.set_top_up(below, buy, price)
    assert len(account.pending_events) == recorded and account.top_up is None


# -- the audit -------------------------------------------------------------------------------


def test_the_audit_finds_credit_consumed_from_a_grant_awaiting_payment() -> None:
    audit = CreditAudit("acme", "USD")
    at = NOW.isoformat()
    audit.apply("CreditGranted", {"grant_id": "pack", "amount": 1000, "effective_at": at,
                                  "expires_at": None}, 2)  # fmt: skip
    audit.apply("CreditAwaitingPayment", {"grant_id": "pack"}, 3)
    consumed = {"transaction_ids": ["t1"], "grant_ids": ["pack"], "amounts": ["5"], "at": at}
    audit.apply("CreditsConsumed", consumed, 4)
    assert audit.problems == ["v4: t1 consumed grant pack, which was not live"]
    audit.apply("CreditActivated", {"grant_id": "pack"}, 5)
    audit.apply("CreditsConsumed", {**consumed, "transaction_ids": ["t2"]}, 6)
    audit.apply("CreditActivated", {"grant_id": "pack"}, 7)
    assert audit.problems[1:] == ["v7: CreditActivated of grant pack, which awaits no payment"]
