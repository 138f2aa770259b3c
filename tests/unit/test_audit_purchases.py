"""``domain.audit_purchases``: the fold of a purchase's events, and each purchase's
one-off invoice against Stripe's listing: every finding kind, every text, every boundary
(a total one minor unit off, a draft's total, the currency's case on either side)."""

from __future__ import annotations

import pytest

from domain.audit import Finding
from domain.audit_invoices import StripeInvoice
from domain.audit_purchases import PurchaseAudit, check_stripe_purchases
from domain.purchase import PurchaseState

S = PurchaseState
P1 = "00000000-0000-0000-0000-0000000000f1"
P2 = "00000000-0000-0000-0000-0000000000f2"
STARTED = {
    "customer_id": "acme", "currency": "USD", "grant_id": "pack", "amount": 2000,
    "price": 1800, "top_up": False, "timestamp": {"_type_": "datetime_iso", "_data_": "x"},
}  # fmt: skip


def _purchase(
    state: PurchaseState = S.PAID, unpaid: str = "", *, sid: str | None = "in_1",
    currency: str = "USD",
) -> PurchaseAudit:  # fmt: skip
    purchase = PurchaseAudit(P1, "acme", currency, "pack", 1800, state, sid, "cus_1", unpaid)
    return purchase


def _invoice(  # noqa: PLR0917 (an invoice's fields)
    status: str = "paid", total: int = 1800, currency: str = "usd", customer: str = "cus_1",
    purchase: str | None = P1, sid: str = "in_1",
) -> StripeInvoice:  # fmt: skip
    return StripeInvoice(sid, status, total, purchase, currency, customer, purchase)


def _check(purchase: PurchaseAudit, *stripe: StripeInvoice) -> list[Finding]:
    return check_stripe_purchases(list(stripe), {purchase.purchase_id: purchase})


def _texts(found: list[Finding], kind: str = "purchase") -> list[str]:
    assert {(f.kind, f.subject) for f in found} <= {(kind, P1)}, found
    return [f.detail for f in found]


# -- the fold ------------------------------------------------------------------------


def test_the_fold_follows_a_purchase_from_its_start_to_its_payment() -> None:
    purchase = PurchaseAudit.started(P1, STARTED)
    assert purchase == PurchaseAudit(P1, "acme", "USD", "pack", 1800, amount=2000)
    assert (purchase.state, purchase.stripe_invoice_id, purchase.stripe_customer_id) == (
        S.INVOICING, None, None,
    )  # fmt: skip
    assert purchase.unpaid == ""
    purchase.apply("DraftCreated", {"stripe_invoice_id": "in_1", "stripe_customer_id": "cus_1"})
    assert (purchase.stripe_invoice_id, purchase.stripe_customer_id) == ("in_1", "cus_1")
    purchase.apply("ItemAdded", {"item_id": "ii_1"})  # nothing the audit compares
    assert purchase == PurchaseAudit(P1, "acme", "USD", "pack", 1800, S.INVOICING, "in_1",
                                     "cus_1", amount=2000)  # fmt: skip
    purchase.apply("AttemptFailed", {"step": "item", "attempt": 2})
    assert purchase.attempts == 2
    purchase.apply("Finalized", {"number": "N-1", "total": 1800, "source": "finalize"})
    assert purchase.state is S.FINALIZED
    purchase.apply("Paid", {"amount_paid": 1800, "source": "evt_1"})
    assert (purchase.state, purchase.unpaid) == (S.PAID, "")


@pytest.mark.parametrize("status", ["void", "uncollectible", "refused", "mismatch"])
def test_the_fold_keeps_why_a_purchase_was_never_paid(status: str) -> None:
    purchase = PurchaseAudit.started(P1, STARTED)
    purchase.apply("Unpaid", {"status": status, "reason": "r", "source": "evt_1"})
    assert (purchase.state, purchase.unpaid) == (S.UNPAID, status)


# -- what agrees -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("purchase", "invoice"),
    [
        (_purchase(S.PAID), _invoice("paid")),
        (_purchase(S.UNPAID, "void"), _invoice("void")),
        (_purchase(S.UNPAID, "uncollectible"), _invoice("uncollectible")),
        (_purchase(S.UNPAID, "refused"), _invoice("draft", 0)),
        (_purchase(S.UNPAID, "refused"), _invoice("open")),
        (_purchase(S.UNPAID, "refused"), _invoice("void")),
        (_purchase(S.UNPAID, "mismatch"), _invoice("open", 1799)),  # recorded already
        (_purchase(S.UNPAID, "mismatch"), _invoice("uncollectible", 1801)),
        (_purchase(S.INVOICING), _invoice("draft", 0)),  # its item not added yet
        (_purchase(S.INVOICING), _invoice("open")),  # the finalize answer not recorded yet
        (_purchase(S.FINALIZED), _invoice("open")),
        (_purchase(S.PAID, currency="usd"), _invoice("paid", currency="USD")),
        (_purchase(S.PAID, currency="USD"), _invoice("paid", currency="USD")),
    ],
)
def test_an_invoice_that_agrees_with_its_purchase_is_no_finding(
    purchase: PurchaseAudit, invoice: StripeInvoice
) -> None:
    other = _invoice("paid", 999, purchase=None, sid="in_9", customer="cus_9")  # a period's
    assert _check(purchase, invoice, other) == []


def test_a_purchase_without_a_draft_yet_has_nothing_to_compare() -> None:
    purchase = _purchase(S.INVOICING, sid=None)
    assert _check(purchase) == []
    # its draft made, the answer lost: the invoice that names it is no stranger
    assert _check(purchase, _invoice("draft", 0, sid="in_7")) == []


@pytest.mark.parametrize("status", ["open", "paid", "void", "uncollectible"])
def test_a_final_invoice_of_a_purchase_without_a_recorded_draft_is_named(status: str) -> None:
    found = _check(_purchase(S.INVOICING, sid=None), _invoice(status, sid="in_7"))
    assert _texts(found) == [
        f"Stripe's invoice in_7 ({status}, 18.00 USD) names this purchase, of which the ledger"
        " recorded no invoice"
    ]


# -- what does not ---------------------------------------------------------------------


def test_an_invoice_missing_from_stripe_is_named() -> None:
    found = _check(_purchase(S.FINALIZED), _invoice("open", purchase=None, sid="in_2"))
    assert _texts(found) == ["its invoice in_1 is not in Stripe"]


def test_an_invoice_of_another_stripe_customer_is_named() -> None:
    found = _check(_purchase(S.PAID), _invoice("paid", customer="cus_2"))
    assert _texts(found) == [
        "Stripe's invoice in_1 is of customer cus_2; the ledger made it for cus_1"
    ]


@pytest.mark.parametrize("total", [1799, 1801, 0])
def test_a_final_invoice_for_another_amount_is_named(total: int) -> None:
    shown = f"{total // 100}.{total % 100:02d} USD"
    for status in ("open", "paid"):
        state = S.PAID if status == "paid" else S.FINALIZED
        found = _check(_purchase(state), _invoice(status, total))
        assert _texts(found) == [
            f"Stripe's invoice in_1 asks {shown}; the purchase's price is 18.00 USD"
        ]


@pytest.mark.parametrize(
    ("purchase", "status"),
    [(_purchase(S.INVOICING), "draft"), (_purchase(S.UNPAID, "mismatch"), "open"),
     (_purchase(S.PAID, currency="usd"), "paid")],
)  # fmt: skip
def test_an_invoice_in_another_currency_is_named_even_where_its_total_is_not_checked(
    purchase: PurchaseAudit, status: str
) -> None:
    found = _check(purchase, _invoice(status, 1800, currency="eur"))
    assert _texts(found) == [
        "Stripe's invoice in_1 asks 18.00 EUR; the purchase's price is 18.00 USD"
    ]


@pytest.mark.parametrize("status", ["draft", "open", "void", "uncollectible"])
def test_a_live_grant_whose_invoice_is_not_paid_is_named(status: str) -> None:
    found = _check(_purchase(S.PAID), _invoice(status))
    assert _texts(found) == [
        f"Stripe's invoice in_1 is {status}; the ledger recorded it paid and made grant pack live"
    ]


@pytest.mark.parametrize(
    ("unpaid", "status"),
    [("void", "paid"), ("void", "uncollectible"), ("void", "open"),
     ("uncollectible", "void"), ("uncollectible", "paid")],
)  # fmt: skip
def test_a_grant_voided_for_its_invoice_needs_that_status_in_stripe(
    unpaid: str, status: str
) -> None:
    found = _check(_purchase(S.UNPAID, unpaid), _invoice(status))
    assert _texts(found) == [
        f"Stripe's invoice in_1 is {status}; the ledger voided grant pack as its invoice"
        f" was {unpaid}"
    ]


@pytest.mark.parametrize("unpaid", ["refused", "mismatch"])
def test_a_grant_voided_for_another_reason_whose_invoice_was_paid_is_named(unpaid: str) -> None:
    found = _check(_purchase(S.UNPAID, unpaid), _invoice("paid"))
    assert _texts(found) == [
        f"Stripe's invoice in_1 is paid; the ledger voided grant pack ({unpaid}): settle it by hand"
    ]


def test_a_finalized_purchase_whose_invoice_is_a_draft_is_named() -> None:
    found = _check(_purchase(S.FINALIZED), _invoice("draft", 0))
    assert _texts(found) == ["Stripe's invoice in_1 is still a draft; the ledger recorded it final"]


@pytest.mark.parametrize(
    ("status", "webhook"),
    [("paid", "invoice.paid"), ("void", "invoice.voided"),
     ("uncollectible", "invoice.marked_uncollectible")],
)  # fmt: skip
@pytest.mark.parametrize("state", [S.INVOICING, S.FINALIZED])
def test_a_pending_grant_whose_invoice_stripe_settled_is_a_webhook_finding(
    state: PurchaseState, status: str, webhook: str
) -> None:
    found = _check(_purchase(state), _invoice(status))
    assert _texts(found, "purchase_webhook") == [
        f"Stripe's invoice in_1 is {status}; the ledger's grant pack still awaits payment"
        f" ({webhook} not processed)"
    ]


def test_every_difference_of_one_invoice_is_named() -> None:
    found = _check(_purchase(S.FINALIZED), _invoice("paid", 1000, "eur", "cus_2"))
    assert [f.kind for f in found] == ["purchase", "purchase", "purchase_webhook"]
    assert [f.detail.split(";")[0] for f in found] == [
        "Stripe's invoice in_1 is of customer cus_2",
        "Stripe's invoice in_1 asks 10.00 EUR",
        "Stripe's invoice in_1 is paid",
    ]


# -- invoices in Stripe the ledger did not make ----------------------------------------


def test_an_invoice_naming_a_purchase_the_ledger_never_recorded_is_named() -> None:
    stranger = _invoice("paid", 5000, purchase=P2, sid="in_2")
    found = _check(_purchase(S.PAID), _invoice("paid"), stranger)
    assert found == [
        Finding("purchase", P2, "Stripe's invoice in_2 (paid, 50.00 USD) names a purchase the"
                " ledger never recorded")
    ]  # fmt: skip
    assert check_stripe_purchases([stranger], {}) == found


def test_a_second_invoice_naming_a_purchase_is_named() -> None:
    second = _invoice("open", 1800, sid="in_2")
    found = _check(_purchase(S.PAID), _invoice("paid"), second)
    assert _texts(found) == [
        "Stripe's invoice in_2 (open, 18.00 USD) names this purchase; the ledger's invoice"
        " of it is in_1"
    ]


def test_each_purchase_is_checked_against_its_own_invoice() -> None:
    P0 = "00000000-0000-0000-0000-0000000000f0"
    drafting, first, second = (
        _purchase(S.INVOICING, sid=None), _purchase(S.PAID, sid="in_0"),
        _purchase(S.FINALIZED, sid="in_2"),
    )  # fmt: skip
    drafting.purchase_id, second.purchase_id = P0, P2
    stripe = [
        _invoice("paid", 999, purchase=None, sid="in_9"),  # a period's invoice, listed first
        _invoice("paid"),
        _invoice("open", 1700, purchase=P2, sid="in_2"),
        _invoice("open", purchase="00000000-0000-0000-0000-0000000000f3", sid="in_3"),
    ]
    found = check_stripe_purchases(stripe, {P0: drafting, P1: first, P2: second})
    assert found == [
        Finding("purchase", P1, "its invoice in_0 is not in Stripe"),
        Finding("purchase", P2,
                "Stripe's invoice in_2 asks 17.00 USD; the purchase's price is 18.00 USD"),
        Finding("purchase", P1, "Stripe's invoice in_1 (paid, 18.00 USD) names this purchase;"
                " the ledger's invoice of it is in_0"),
        Finding("purchase", "00000000-0000-0000-0000-0000000000f3",
                "Stripe's invoice in_3 (open, 18.00 USD) names a purchase the ledger never"
                " recorded"),
    ]  # fmt: skip
