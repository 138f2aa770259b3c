"""A purchased grant voided while its invoice awaits payment, against real PostgreSQL and
the Stripe emulator over HTTP: ``credits void`` voids its open invoice in Stripe (read
back through the SDK) or deletes its draft; a payment that lands anyway (racing the void
by webhook, or paid before it) puts the purchase in ``needs attention``, reported by
queue health and the audit until ``credits reinstate`` grants the credit bought again;
and ``billing.credit_purchases`` is compared with the history row by row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

import psycopg
import pytest
import stripe

from adapters.bootstrap import build_purchaser
from domain.credits import GrantState
from domain.health import assess
from domain.ids import purchase_id
from domain.purchase import PurchaseState
from projections.queue_health import read_health
from tests.integration.support import wait_for
from tests.integration.test_credit_purchases import (
    _buy,
    _cli,
    _grant_of,
    _project_now,
    _stripe_audit,
)
from tests.integration.test_credits import _audit, _grant
from tests.integration.test_invoices import SECRET, Parts, parts

__all__ = ["parts"]

S = PurchaseState


def _purchase_row(parts: Parts, bought: UUID) -> tuple[str, str]:
    _project_now(parts)
    with psycopg.connect(parts.settings.database_url) as conn:
        row = conn.execute(
            "SELECT state, reason FROM billing.credit_purchases WHERE purchase_id = %s", (bought,)
        ).fetchone()
    assert row is not None
    return row[0], row[1]


def _state(parts: Parts, bought: UUID) -> PurchaseState:
    purchase = parts.ledger.purchase_by_id(bought)
    assert purchase is not None
    return purchase.state


def _stripe_client(parts: Parts) -> stripe.StripeClient:
    return parts.pusher.gateway.client  # type: ignore[attr-defined,no-any-return]


def test_voiding_a_pending_purchase_voids_its_open_invoice_in_stripe(parts: Parts) -> None:
    parts.emulator.add_webhook_endpoint(parts.url, SECRET, ["invoice.*"])
    parts.ledger.change_account("voided", "USD", lambda a: _grant(a, 1, "seed"))
    stripe_id = _buy(parts, "voided", "bought", 2000, 1800)
    bought = purchase_id("voided", "USD", "bought")
    done = _cli(parts.settings, "credits", "void", "voided", "USD", "bought", "--reason", "oops")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"voided 20.00 USD of grant bought of voided; its purchase {bought}: unpaid (done)"
    )
    invoice = _stripe_client(parts).v1.invoices.retrieve(stripe_id)
    assert invoice.status == "void"
    voids = [r for r in parts.emulator.requests() if r["path"] == f"/v1/invoices/{stripe_id}/void"]
    assert [r["idempotency_key"] for r in voids] == [f"invoice-void:{bought}"]
    purchase = parts.ledger.purchase_by_id(bought)
    assert purchase is not None and purchase.state is S.UNPAID
    assert purchase.reason == f"its invoice {stripe_id} was voided"
    assert _grant_of(parts, "voided", "bought")[0] is GrantState.UNPAID
    assert parts.emulator.wait_for_webhooks()  # invoice.voided: stale, the ledger knew
    assert _purchase_row(parts, bought)[0] == "unpaid"
    assert _audit(parts.settings, parts.ledger) == []
    assert _stripe_audit(parts) == (0, [])


def test_voiding_a_purchase_whose_invoice_is_a_draft_deletes_it(parts: Parts) -> None:
    parts.ledger.change_account("drafted", "USD", lambda a: _grant(a, 1, "seed"))
    now = datetime.now(UTC) - timedelta(minutes=1)
    bought = parts.ledger.start_purchase(
        "drafted", "USD", lambda a: a.purchase_credit(
            "bought", 500, 500, effective_at=now, reason="bought"),
    )  # fmt: skip
    assert bought is not None
    purchaser = build_purchaser(parts.settings, parts.pusher)
    for _ in range(2):  # the draft and its item, not the finalize
        purchase = parts.ledger.purchase_by_id(bought)
        assert purchase is not None
        purchaser._next(purchase)
    purchase = parts.ledger.purchase_by_id(bought)
    assert purchase is not None and purchase.stripe_invoice_id is not None
    draft_id = purchase.stripe_invoice_id
    assert parts.ledger.void_grant("drafted", "USD", "bought", "oops") == (500, bought)
    assert purchaser.step(bought) == "done"
    with pytest.raises(stripe.InvalidRequestError) as gone:
        _stripe_client(parts).v1.invoices.retrieve(draft_id)
    assert gone.value.http_status == 404
    purchase = parts.ledger.purchase_by_id(bought)
    assert purchase is not None and purchase.state is S.UNPAID
    assert purchase.reason == f"its draft {draft_id} was deleted"
    assert _stripe_audit(parts) == (0, [])


def test_a_payment_racing_the_void_needs_attention_until_an_operator_reinstates_it(
    parts: Parts,
) -> None:
    parts.emulator.add_webhook_endpoint(parts.url, SECRET, ["invoice.*"])
    parts.ledger.change_account("racer", "USD", lambda a: _grant(a, 1, "seed"))
    stripe_id = _buy(parts, "racer", "bought", 2000, 1800)
    bought = purchase_id("racer", "USD", "bought")
    # The void is recorded, and the customer pays before the purchaser voids the invoice.
    assert parts.ledger.void_grant("racer", "USD", "bought", "oops") == (2000, bought)
    assert _state(parts, bought) is S.VOIDING
    assert _purchase_row(parts, bought)[0] == "voiding"
    parts.emulator.pay_invoice(stripe_id)
    wait_for(lambda: _state(parts, bought) is S.NEEDS_ATTENTION, what="invoice.paid recorded")
    assert build_purchaser(parts.settings, parts.pusher).step(bought) == "done"
    assert _stripe_client(parts).v1.invoices.retrieve(stripe_id).status == "paid"
    said = (
        f"its invoice {stripe_id} was paid (18.00 USD) after grant bought was voided:"
        " `billing-ledger credits reinstate racer USD bought --reason ...`"
    )
    assert _purchase_row(parts, bought) == ("needs_attention", said)
    assert _grant_of(parts, "racer", "bought")[0] is GrantState.UNPAID  # not live: voided

    with psycopg.connect(parts.settings.database_url) as conn:
        health = read_health(conn)
    assert health["purchases_needing_attention"] == 1
    assert (
        f"1 credit purchase(s) paid after their grant was voided need attention"
        f" (billing-ledger credits reinstate); first: {bought}: {said}"
    ) in assess(health)[1]
    found = _audit(parts.settings, parts.ledger)
    assert [(f.kind, f.subject) for f in found] == [("purchase", str(bought))]
    assert f"its invoice {stripe_id} was paid (18.00 USD)" in found[0].detail
    assert _stripe_audit(parts)[0] == 1

    args = ["credits", "reinstate", "racer", "USD", "bought", "--reason", "paid after the void"]
    done, again = _cli(parts.settings, *args), _cli(parts.settings, *args)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "reinstated: grant bought of racer as the live grant bought-reinstated"
    )
    assert again.returncode == 0 and "already reinstated (nothing recorded)" in again.stdout
    account = parts.ledger.account("racer", "USD")
    assert account is not None
    grant = account.grants["bought-reinstated"]
    assert (grant.state, grant.amount, grant.source) == (GrantState.LIVE, 2000, "purchased")
    assert _purchase_row(parts, bought) == ("reinstated", "reinstated as grant bought-reinstated")
    assert _audit(parts.settings, parts.ledger) == []
    assert _stripe_audit(parts) == (0, [])
    with psycopg.connect(parts.settings.database_url) as conn:
        assert read_health(conn)["purchases_needing_attention"] == 0


def test_an_invoice_paid_before_the_void_is_read_and_needs_attention(parts: Parts) -> None:
    parts.ledger.change_account("early", "USD", lambda a: _grant(a, 1, "seed"))
    stripe_id = _buy(parts, "early", "bought", 1000, 1000)  # no webhook reaches the ledger
    parts.emulator.pay_invoice(stripe_id)
    done = _cli(parts.settings, "credits", "void", "early", "USD", "bought", "--reason", "oops")
    assert done.returncode == 0, done.stderr
    bought = purchase_id("early", "USD", "bought")
    assert done.stdout.strip().endswith(f"its purchase {bought}: needs_attention (done)")
    purchase = parts.ledger.purchase_by_id(bought)
    assert purchase is not None and purchase.amount_paid == 1000
    assert _stripe_client(parts).v1.invoices.retrieve(stripe_id).status == "paid"


def test_the_audit_finds_a_credit_purchases_row_that_differs_from_the_history(
    parts: Parts,
) -> None:
    parts.ledger.change_account("tamper", "USD", lambda a: _grant(a, 1, "seed"))
    stripe_id = _buy(parts, "tamper", "bought", 700, 700)
    _buy(parts, "tamper", "other", 300, 300)
    bought, other = purchase_id("tamper", "USD", "bought"), purchase_id("tamper", "USD", "other")
    assert _audit(parts.settings, parts.ledger) == []
    with psycopg.connect(parts.settings.database_url) as conn:
        conn.execute(
            "UPDATE billing.credit_purchases SET state = 'paid', price = 1, attempts = 2"
            " WHERE purchase_id = %s",
            (bought,),
        )
        conn.execute("DELETE FROM billing.credit_purchases WHERE purchase_id = %s", (other,))
    found = _audit(parts.settings, parts.ledger)
    assert sorted((f.kind, f.subject, f.detail) for f in found) == sorted([
        ("projection", str(bought), "credit_purchases.price: 0.01 USD, history says 7.00 USD"),
        ("projection", str(bought), "credit_purchases.state: 'paid', history says 'finalized'"),
        ("projection", str(bought), "credit_purchases.attempts: 2, history says 0"),
        ("projection", str(other), "purchase missing from billing.credit_purchases"),
    ])  # fmt: skip
    assert stripe_id
