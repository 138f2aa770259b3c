"""A purchased grant voided while its invoice awaits payment (pure): the void reaches the
purchase in the same decision, the purchase voids (or deletes) its invoice next, a
payment that lands anyway is recorded and needs attention, never silent, and an
operator's reinstatement grants the credit bought again, once; the audit's fold and
findings of all of it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from domain.account import CustomerAccount
from domain.audit import Finding
from domain.audit_invoices import StripeInvoice
from domain.audit_purchases import PurchaseAudit, check_purchases, check_stripe_purchases
from domain.credits import GrantState
from domain.ids import purchase_id
from domain.invoice_states import StripeInvoiceView
from domain.purchase import CreditPurchase, PurchaseState, PurchaseStep, void_purchased_grant

S = PurchaseState
NOW = datetime(2027, 1, 10, 12, tzinfo=UTC)
DAY = timedelta(days=1)
PID = str(purchase_id("acme", "USD", "pack"))
ATTENTION = (
    "its invoice in_1 was paid (9.00 USD) after grant pack was voided: `billing-ledger"
    " credits reinstate acme USD pack --reason ...`"
)


def _view(status: str, total: int = 900, paid: int = 0) -> StripeInvoiceView:
    return StripeInvoiceView(status, "N-1", total, paid, 1, None, NOW, "evt_1")


def _purchase(*, draft: bool = True, finalized: bool = False) -> CreditPurchase:
    purchase = CreditPurchase.start("acme", "USD", "pack", 1000, 900)
    if draft:
        purchase.record_draft("in_1", "cus_1")
        purchase.record_item("ii_1")
    if finalized:
        assert purchase.observe(_view("open"))
    return purchase


def _account(*, expires_at: datetime | None = None) -> CustomerAccount:
    account = CustomerAccount.open("acme", "USD")
    account.purchase_credit("pack", 1000, 900, effective_at=NOW - DAY, reason="pack",
                            priority=2, expires_at=expires_at)  # fmt: skip
    return account


def _names(aggregate: CustomerAccount | CreditPurchase) -> list[str]:
    return [type(e).__name__ for e in aggregate.collect_events()]


# -- the void reaches the purchase -------------------------------------------------------


def test_voiding_a_pending_purchased_grant_requests_its_invoices_void_in_the_same_decision() -> (
    None
):
    account, purchase = _account(), _purchase(finalized=True)
    assert account.pending_purchase("pack") == PID
    _names(account), _names(purchase)
    assert void_purchased_grant(account, purchase, "pack", "sold in error") == 1000
    assert _names(account) == ["CreditVoided"] and _names(purchase) == ["VoidRequested"]
    assert account.grants["pack"].state is GrantState.UNPAID
    assert account.pending_purchase("pack") is None  # voided: no longer pending
    assert (purchase.state, purchase.void_reason) == (S.VOIDING, "sold in error")
    assert purchase.next_step is PurchaseStep.VOID and purchase.due(NOW)
    assert not purchase.settled
    assert not purchase.request_void("again")  # voiding already: nothing
    assert purchase.collect_events() == []


def test_a_grant_without_a_pending_purchase_is_voided_alone() -> None:
    account, purchase = _account(), _purchase()
    assert account.settle_purchase("pack", paid=True, reason="", stripe_invoice_id="in_1")
    assert account.pending_purchase("pack") is None and account.pending_purchase("nope") is None
    _names(account), _names(purchase)
    void_purchased_grant(account, purchase, "pack", "refund by hand")  # live: not its invoice
    assert _names(account) == ["CreditVoided"] and _names(purchase) == []
    other = _account()
    void_purchased_grant(other, None, "pack", "no purchase loaded")
    assert other.grants["pack"].voided == 1000
    third, stranger = _account(), CreditPurchase.start("acme", "USD", "other", 10, 9)
    _names(stranger)
    void_purchased_grant(third, stranger, "pack", "another purchase")  # not its purchase
    assert _names(stranger) == []


def test_a_purchase_without_an_invoice_yet_is_unpaid_at_once() -> None:
    purchase = _purchase(draft=False)
    purchase.record_failure("api_connection_error", "timeout", NOW + DAY)
    assert purchase.request_void("sold in error")
    assert purchase.state is S.UNPAID and purchase.next_step is PurchaseStep.NONE
    assert purchase.reason == "its grant was voided before its invoice was made: sold in error"
    assert purchase.next_attempt_at is None
    assert not purchase.request_void("again")  # settled: nothing
    purchase.record_draft("in_late", "cus_1")  # an answer that comes after: not recorded
    assert purchase.stripe_invoice_id is None


def test_the_void_step_resets_the_backoff_and_its_failures_are_named_void() -> None:
    purchase = _purchase()
    purchase.record_failure("api_connection_error", "timeout", NOW + DAY)
    assert not purchase.due(NOW)
    purchase.request_void("sold in error")
    assert purchase.due(NOW) and purchase.next_step is PurchaseStep.VOID
    purchase.record_failure("invalid_request_error", "no", NOW + DAY)
    assert purchase.reason == "void: invalid_request_error: no" and purchase.attempts == 2


# -- Stripe's answer ---------------------------------------------------------------------


def test_a_deleted_draft_or_a_voided_invoice_makes_the_purchase_unpaid() -> None:
    draft = _purchase()
    draft.request_void("r")
    assert not draft.observe(_view("draft"))
    assert draft.observe(_view("deleted", total=0))
    assert (draft.state, draft.reason) == (S.UNPAID, "its draft in_1 was deleted")
    assert [type(e).__name__ for e in draft.pending_events][-1] == "Unpaid"
    assert draft.pending_events[-1].status == "deleted"  # type: ignore[attr-defined]
    final = _purchase(finalized=True)
    final.request_void("r")
    assert final.observe(_view("void"))
    assert (final.state, final.reason) == (S.UNPAID, "its invoice in_1 was voided")
    assert not final.observe(_view("paid", paid=900))  # settled: nothing


def test_an_invoice_finalized_while_voiding_keeps_the_void_as_the_next_step() -> None:
    purchase = _purchase()
    purchase.request_void("r")
    assert purchase.observe(_view("open"))  # a finalize answer lost, then read
    assert purchase.finalized and purchase.state is S.VOIDING
    assert purchase.next_step is PurchaseStep.VOID


@pytest.mark.parametrize("finalized", [True, False])
def test_a_payment_after_the_void_is_recorded_and_needs_attention(finalized: bool) -> None:
    purchase = _purchase(finalized=finalized)
    purchase.request_void("r")
    _names(purchase)
    assert purchase.observe(_view("paid", paid=900))
    assert _names(purchase) == ([] if finalized else ["Finalized"]) + ["PaidAfterVoid"]
    assert purchase.state is S.NEEDS_ATTENTION and purchase.amount_paid == 900
    assert purchase.reason == ATTENTION
    assert purchase.settled and purchase.next_step is PurchaseStep.NONE
    assert not purchase.due(NOW)
    assert not purchase.observe(_view("void"))  # nothing changes it but the operator
    assert not purchase.request_void("again")


def test_a_payment_before_any_void_is_a_plain_payment() -> None:
    purchase = _purchase(finalized=True)
    assert purchase.observe(_view("paid", paid=900)) and purchase.state is S.PAID
    assert purchase.amount_paid == 0 and not purchase.request_void("too late")
    assert (purchase.void_reason, purchase.reinstated_grant_id) == ("", None)


# -- the operator's reinstatement ------------------------------------------------------


def _paid_after_void() -> tuple[CustomerAccount, CreditPurchase]:
    account, purchase = _account(expires_at=NOW + 30 * DAY), _purchase(finalized=True)
    void_purchased_grant(account, purchase, "pack", "sold in error")
    purchase.observe(_view("paid", paid=900))
    _names(account), _names(purchase)
    return account, purchase


def test_reinstating_grants_the_credit_bought_again_live_once() -> None:
    account, purchase = _paid_after_void()
    new = purchase.reinstate("paid after the void")
    assert new == "pack-reinstated" and purchase.reinstated_grant_id == new
    assert (purchase.state, purchase.reason) == (S.REINSTATED, "")
    assert purchase.settled and purchase.next_step is PurchaseStep.NONE
    assert account.reinstate_credit(
        "pack", new, purchase_id=PID, stripe_invoice_id="in_1", amount=1000,
        effective_at=NOW, reason="paid after the void",
    )  # fmt: skip
    assert _names(account) == ["CreditGranted", "CreditReinstated"]
    assert _names(purchase) == ["Reinstated"]
    grant = account.grants[new]
    assert grant.live(NOW) and grant.state is GrantState.LIVE
    assert (grant.amount, grant.priority, grant.source, grant.expires_at) == (
        1000, 2, "purchased", NOW + 30 * DAY,
    )  # fmt: skip
    assert grant.note == (
        f"reinstates grant pack: its invoice in_1 was paid after the void (purchase {PID})"
    )
    assert account.live_credit(NOW) == Decimal(1000)
    assert not account.reinstate_credit(
        "pack", new, purchase_id=PID, stripe_invoice_id="in_1", amount=1000,
        effective_at=NOW, reason="paid after the void",
    )  # fmt: skip
    assert _names(account) == []
    with pytest.raises(ValueError, match="is reinstated: only a purchase paid after"):
        purchase.reinstate("again")


def test_a_reinstated_grant_whose_expiry_has_passed_does_not_expire_at_once() -> None:
    account = _account(expires_at=NOW + DAY)
    account.void_credit("pack", "r")
    account.reinstate_credit(
        "pack", "pack-reinstated", purchase_id=PID, stripe_invoice_id="in_1", amount=1000,
        effective_at=NOW + DAY, reason="late",
    )  # fmt: skip
    assert account.grants["pack-reinstated"].expires_at is None
    never = CustomerAccount.open("acme", "USD")
    never.purchase_credit("pack", 1000, 900, effective_at=NOW, reason="pack")
    never.void_credit("pack", "r")
    never.reinstate_credit(
        "pack", "again", purchase_id=PID, stripe_invoice_id="in_1", amount=1000,
        effective_at=NOW, reason="late",
    )  # fmt: skip
    assert never.grants["again"].expires_at is None
    assert never.grants["again"].reason == "late"


def test_reinstating_is_refused_unless_paid_after_the_void() -> None:
    with pytest.raises(ValueError, match="is finalized: only a purchase paid after its grant"):
        _purchase(finalized=True).reinstate("r")
    _, purchase = _paid_after_void()
    with pytest.raises(ValueError, match="needs a reason"):
        purchase.reinstate("  ")
    assert purchase.state is S.NEEDS_ATTENTION
    account = _account()
    with pytest.raises(ValueError, match="not the voided grant of purchase"):
        account.reinstate_credit(  # not voided
            "pack", "n", purchase_id=PID, stripe_invoice_id="", amount=1, effective_at=NOW,
            reason="r",
        )  # fmt: skip
    account.void_credit("pack", "r")
    with pytest.raises(ValueError, match="not the voided grant of purchase"):
        account.reinstate_credit(  # another purchase
            "pack", "n", purchase_id="x", stripe_invoice_id="", amount=1, effective_at=NOW,
            reason="r",
        )  # fmt: skip
    assert "n" not in account.grants


# -- the audit ---------------------------------------------------------------------------

STARTED = {
    "customer_id": "acme", "currency": "USD", "grant_id": "pack", "amount": 1000,
    "price": 900, "top_up": False,
}  # fmt: skip


def _folded(*events: tuple[str, dict[str, object]]) -> PurchaseAudit:
    audit = PurchaseAudit.started(PID, STARTED)
    audit.apply("DraftCreated", {"stripe_invoice_id": "in_1", "stripe_customer_id": "cus_1"})
    for name, data in events:
        audit.apply(name, data)
    return audit


def test_the_fold_follows_a_void_a_late_payment_and_its_reinstatement() -> None:
    audit = _folded(("VoidRequested", {"reason": "r"}))
    assert (audit.state, audit.row_state) == (S.VOIDING, "voiding")
    audit.apply("Finalized", {"number": "N", "total": 900, "source": "x"})
    assert audit.state is S.VOIDING
    audit.apply("PaidAfterVoid", {"amount_paid": 900, "stripe_invoice_id": "in_1"})
    assert (audit.state, audit.amount_paid, audit.row_state) == (
        S.NEEDS_ATTENTION, 900, "needs_attention",
    )  # fmt: skip
    audit.apply("Reinstated", {"grant_id": "pack-reinstated", "amount": 1000})
    assert (audit.state, audit.reinstated_grant_id) == (S.REINSTATED, "pack-reinstated")
    deleted = _folded(("VoidRequested", {}), ("Unpaid", {"status": "deleted"}))
    assert (deleted.state, deleted.unpaid, deleted.row_state) == (S.UNPAID, "deleted", "unpaid")


def test_a_top_up_requested_is_a_row_before_its_purchase_starts() -> None:
    requested = PurchaseAudit.top_up_requested(
        {"purchase_id": PID, "customer_id": "acme", "currency": "USD", "grant_id": "top-up-1-1",
         "buy": 5000, "price": 4500}
    )  # fmt: skip
    assert requested == PurchaseAudit(
        PID, "acme", "USD", "top-up-1-1", 4500, amount=5000, top_up=True, requested=True
    )
    assert requested.row_state == "requested"
    assert PurchaseAudit.started(PID, STARTED).row_state == "invoicing"


def test_a_payment_after_the_void_not_settled_is_a_finding_and_settled_is_clean() -> None:
    attention = _folded(
        ("VoidRequested", {}), ("PaidAfterVoid", {"amount_paid": 900, "stripe_invoice_id": "x"})
    )
    assert check_purchases({PID: attention}, {}) == [
        Finding(
            "purchase", PID,
            "its invoice in_1 was paid (9.00 USD) after grant pack was voided, and no operator"
            " settled it: `billing-ledger credits reinstate acme USD pack --reason ...`",
        )
    ]  # fmt: skip
    attention.apply("Reinstated", {"grant_id": "pack-reinstated"})
    held = {("acme", "USD"): {"pack", "pack-reinstated"}}
    assert check_purchases({PID: attention}, held) == []
    assert check_purchases({PID: attention}, {}) == check_purchases(
        {PID: attention}, {("acme", "EUR"): {"pack-reinstated"}}
    )
    assert check_purchases({PID: attention}, {("acme", "USD"): {"pack"}}) == [
        Finding("purchase", PID, "reinstated as grant pack-reinstated, which the account does"
                " not hold")
    ]  # fmt: skip
    for state in (S.PAID, S.UNPAID, S.VOIDING, S.FINALIZED, S.INVOICING):
        other = _folded()
        other.state = state
        assert check_purchases({PID: other}, {}) == []


def _stripe(status: str, sid: str = "in_1") -> StripeInvoice:
    return StripeInvoice(sid, status, 900, PID, "usd", "cus_1", PID)


def test_stripe_agrees_with_a_void_a_deleted_draft_and_a_payment_after_the_void() -> None:
    voided = _folded(("VoidRequested", {}), ("Unpaid", {"status": "void"}))
    deleted = _folded(("VoidRequested", {}), ("Unpaid", {"status": "deleted"}))
    late = _folded(("VoidRequested", {}), ("PaidAfterVoid", {"amount_paid": 900}))
    assert check_stripe_purchases([_stripe("void")], {PID: voided}) == []
    assert check_stripe_purchases([], {PID: deleted}) == []
    assert check_stripe_purchases([_stripe("paid")], {PID: late}) == []
    late.apply("Reinstated", {"grant_id": "g"})
    assert check_stripe_purchases([_stripe("paid")], {PID: late}) == []


def test_stripe_disagreeing_with_a_void_or_a_payment_after_it_is_a_finding() -> None:
    deleted = _folded(("VoidRequested", {}), ("Unpaid", {"status": "deleted"}))
    assert check_stripe_purchases([_stripe("open")], {PID: deleted}) == [
        Finding("purchase", PID, "Stripe's invoice in_1 is open; the ledger recorded it deleted"
                " when grant pack was voided")
    ]  # fmt: skip
    for state in ("PaidAfterVoid", "Reinstated"):
        late = _folded(("VoidRequested", {}), ("PaidAfterVoid", {"amount_paid": 900}))
        late.apply(state, {"grant_id": "g", "amount_paid": 900})
        assert check_stripe_purchases([_stripe("void")], {PID: late}) == [
            Finding("purchase", PID, "Stripe's invoice in_1 is void; the ledger recorded it"
                    " paid after grant pack was voided")
        ]  # fmt: skip
    voiding = _folded(("VoidRequested", {}))
    assert check_stripe_purchases([_stripe("void")], {PID: voiding}) == [
        Finding("purchase_webhook", PID, "Stripe's invoice in_1 is void; the ledger's grant"
                " pack still awaits payment (invoice.voided not processed)")
    ]  # fmt: skip
    assert check_stripe_purchases([_stripe("open")], {PID: voiding}) == []


# -- what each event records (every field: the history is the record) ---------------------


def _fields(purchase: CreditPurchase) -> list[tuple[str, dict[str, object]]]:
    skip = {"originator_id", "originator_version", "timestamp"}
    return [
        (type(e).__name__, {k: v for k, v in e.__dict__.items() if k not in skip})
        for e in purchase.collect_events()
    ]


def _recorded(
    purchase: CreditPurchase, act: Callable[[CreditPurchase], object]
) -> list[tuple[str, dict[str, object]]]:
    """What ``act`` records on ``purchase`` (what it recorded before is dropped)."""
    _fields(purchase)
    act(purchase)
    return _fields(purchase)


def _voiding() -> CreditPurchase:
    purchase = _purchase()
    purchase.request_void("r")
    return purchase


def test_the_events_of_a_void_record_every_field() -> None:
    assert _recorded(_purchase(draft=False), lambda p: p.request_void("sold in error")) == [
        ("VoidRequested", {"reason": "sold in error"}),
        ("Unpaid", {"status": "void", "source": "operator",
                    "reason": "its grant was voided before its invoice was made: sold in error"}),
    ]  # fmt: skip
    assert _recorded(_voiding(), lambda p: p.observe(_view("deleted", total=0))) == [
        ("Unpaid", {"status": "deleted", "reason": "its draft in_1 was deleted",
                    "source": "evt_1"}),
    ]  # fmt: skip
    late = _voiding()
    paid = StripeInvoiceView("paid", None, 900, 900, 1, None, NOW, "evt_2")
    assert _recorded(late, lambda p: p.observe(paid)) == [
        ("Finalized", {"number": "", "total": 900, "source": "evt_2"}),
        ("PaidAfterVoid", {"amount_paid": 900, "stripe_invoice_id": "in_1", "reason": ATTENTION,
                           "source": "evt_2"}),
    ]  # fmt: skip
    assert _recorded(late, lambda p: p.reinstate("paid after the void")) == [
        ("Reinstated", {"grant_id": "pack-reinstated", "amount": 1000,
                        "reason": "paid after the void"}),
    ]  # fmt: skip


def test_the_events_of_a_plain_purchase_record_every_field() -> None:
    assert _recorded(_purchase(), lambda p: p.observe(_view("paid", paid=900))) == [
        ("Finalized", {"number": "N-1", "total": 900, "source": "evt_1"}),
        ("Paid", {"amount_paid": 900, "source": "evt_1"}),
    ]
    for status, word in (("void", "voided"), ("uncollectible", "marked uncollectible")):
        assert _recorded(_purchase(finalized=True), lambda p, s=status: p.observe(_view(s))) == [
            ("Unpaid", {"status": status, "reason": f"its invoice in_1 was {word}",
                        "source": "evt_1"}),
        ]  # fmt: skip
    assert _recorded(_purchase(), lambda p: p.observe(_view("open", total=800)))[-1] == (
        "Unpaid", {"status": "mismatch", "source": "evt_1",
                   "reason": "Stripe finalized 8.00 USD where the price is 9.00 USD: settle it"
                             " by hand"},
    )  # fmt: skip


def test_reinstating_refusals_say_exactly_why() -> None:
    with pytest.raises(ValueError) as final:
        _purchase(finalized=True).reinstate("r")
    assert str(final.value) == (
        f"purchase {PID} is finalized: only a purchase paid after its grant was voided is"
        " reinstated"
    )
    _, purchase = _paid_after_void()
    with pytest.raises(ValueError) as blank:
        purchase.reinstate(" ")
    assert str(blank.value) == "reinstating a purchase needs a reason"


def test_a_deleted_draft_does_not_stop_the_check_of_the_next_purchase() -> None:
    deleted = _folded(("VoidRequested", {}), ("Unpaid", {"status": "deleted"}))
    other = PurchaseAudit.started("p2", {**STARTED, "top_up": True})
    assert other.top_up
    other.apply("DraftCreated", {"stripe_invoice_id": "in_2", "stripe_customer_id": "cus_1"})
    assert check_stripe_purchases([], {PID: deleted, "p2": other}) == [
        Finding("purchase", "p2", "its invoice in_2 is not in Stripe")
    ]


def test_a_purchase_records_what_it_was_started_with_refused_and_unnamed_invoices() -> None:
    one = CreditPurchase.start("acme", "USD", "pack", 1, 0)
    assert (one.amount, one.top_up) == (1, False)
    assert CreditPurchase.start("acme", "USD", "t", 2, 0, top_up=True).top_up is True
    with pytest.raises(ValueError) as nothing:
        CreditPurchase.start("acme", "USD", "pack", 0, 0)
    assert str(nothing.value) == "a purchase buys at least one minor unit"
    assert _recorded(_purchase(draft=False), lambda p: p.refuse("no", "purchaser")) == [
        ("Unpaid", {"status": "refused", "reason": "no", "source": "purchaser"}),
    ]
    assert _recorded(_purchase(draft=False), lambda p: p.observe(_view("void")))[-1] == (
        "Unpaid", {"status": "void", "reason": "its invoice was voided", "source": "evt_1"},
    )  # fmt: skip
    drafted = _purchase(draft=False)
    assert _recorded(drafted, lambda p: p.record_draft("in_9", "cus_9")) == [
        ("DraftCreated", {"stripe_invoice_id": "in_9", "stripe_customer_id": "cus_9"}),
    ]
    drafted.refuse("no", "purchaser")
    drafted.record_item("ii_late")  # settled: an item's answer after it is not recorded
    assert drafted.item_id is None and drafted.collect_events()[-1].__class__.__name__ == "Unpaid"
    failed = _purchase(draft=False)
    failed.record_failure("api_error", "x" * 600, NOW)
    assert len(failed.reason) == len("draft: api_error: ") + 500
