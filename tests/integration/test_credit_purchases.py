"""Purchased credit against real PostgreSQL and the Stripe emulator over HTTP: a
purchased grant is invoiced by its own one-off Stripe invoice, is not consumable before
that invoice is paid, goes live on the ``invoice.paid`` webhook, and never goes live when
its invoice is voided or marked uncollectible (saying why)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest

from adapters.bootstrap import build_purchaser
from adapters.settings import Settings
from domain.account import CustomerAccount
from domain.credits import GrantState
from domain.ids import purchase_id
from domain.purchase import PurchaseState
from tests.conftest import settings_env
from tests.integration.support import record, wait_for
from tests.integration.test_credits import _audit, _grant, _project
from tests.integration.test_invoices import SECRET, Parts, parts

__all__ = ["parts"]


def _buy(parts: Parts, customer: str, grant_id: str, amount: int, price: int) -> str:
    """Record the purchase (as ``credits grant --source purchased`` does) and take its
    invoice to final in Stripe; its Stripe invoice id."""
    now = datetime.now(UTC) - timedelta(minutes=1)
    bought = parts.ledger.start_purchase(
        customer, "USD", lambda a: a.purchase_credit(
            grant_id, amount, price, effective_at=now, reason="bought"),
    )  # fmt: skip
    assert bought == purchase_id(customer, "USD", grant_id)
    build_purchaser(parts.settings, parts.pusher).step(bought)
    purchase = parts.ledger.purchase_by_id(bought)
    assert purchase is not None and purchase.state is PurchaseState.FINALIZED
    assert purchase.stripe_invoice_id is not None
    return purchase.stripe_invoice_id


def _grant_of(parts: Parts, customer: str, grant_id: str) -> tuple[GrantState, Decimal, str]:
    account = parts.ledger.account(customer, "USD")
    assert account is not None
    grant = account.grants[grant_id]
    return grant.state, grant.consumed, grant.note


def _row(parts: Parts, customer: str, grant_id: str) -> tuple[str, str, int]:
    with psycopg.connect(parts.settings.database_url) as conn:
        row = conn.execute(
            "SELECT state, state_reason, voided FROM billing.credit_grants"
            " WHERE customer_id = %s AND grant_id = %s",
            (customer, grant_id),
        ).fetchone()
    assert row is not None
    return row[0], row[1], int(row[2])


def test_a_purchased_grant_is_not_consumed_before_payment_and_goes_live_on_the_paid_webhook(
    parts: Parts,
) -> None:
    parts.emulator.add_webhook_endpoint(parts.url, SECRET, ["invoice.*"])
    parts.ledger.change_account("buyer", "USD", lambda a: _grant(a, 1, "seed"))
    stripe_id = _buy(parts, "buyer", "bought", 2000, 1800)  # 20.00 USD of credit for 18.00
    [invoice] = [i for i in parts.emulator.invoices() if i["id"] == stripe_id]
    assert (invoice["status"], invoice["total"]) == ("open", 1800)
    assert invoice["metadata"]["purchase_id"] == str(purchase_id("buyer", "USD", "bought"))

    record(parts.ledger, "buyer", ["b-1"], qty=1000)  # 1.00 USD: the pending grant is not used
    assert _grant_of(parts, "buyer", "bought")[:2] == (GrantState.PENDING, 0)
    _project_now(parts)
    assert _row(parts, "buyer", "bought")[0] == "pending"

    parts.emulator.pay_invoice(stripe_id)
    wait_for(
        lambda: _grant_of(parts, "buyer", "bought")[0] is GrantState.LIVE,
        what="invoice.paid to make the grant live",
    )
    activated = [e for e in parts.ledger.events.get(parts.ledger.account("buyer", "USD").id)  # type: ignore[union-attr]
                 if isinstance(e, CustomerAccount.CreditActivated)]  # fmt: skip
    assert [(e.grant_id, e.stripe_invoice_id) for e in activated] == [("bought", stripe_id)]
    record(parts.ledger, "buyer", ["b-2"], qty=1000)  # now it is consumed
    assert _grant_of(parts, "buyer", "bought")[1] == 100
    _project_now(parts)
    assert _row(parts, "buyer", "bought") == ("live", f"paid: invoice {stripe_id}", 0)
    assert _audit(parts.settings, parts.ledger) == []


@pytest.mark.parametrize(
    ("ends", "said"),
    [("void_invoice", "was voided"), ("mark_uncollectible", "was marked uncollectible")],
)
def test_a_voided_or_uncollectible_purchase_never_goes_live_and_says_why(
    parts: Parts, ends: str, said: str
) -> None:
    parts.emulator.add_webhook_endpoint(parts.url, SECRET, ["invoice.*"])
    parts.ledger.change_account("voider", "USD", lambda a: _grant(a, 1, "seed"))
    stripe_id = _buy(parts, "voider", "bought", 2000, 2000)
    client = parts.pusher.gateway.client  # type: ignore[attr-defined]
    getattr(client.v1.invoices, ends)(stripe_id)
    wait_for(
        lambda: _grant_of(parts, "voider", "bought")[0] is GrantState.UNPAID,
        what=f"{ends} to void the grant",
    )
    _, consumed, note = _grant_of(parts, "voider", "bought")
    assert consumed == 0 and f"its invoice {stripe_id} {said}" in note
    record(parts.ledger, "voider", ["v-1"], qty=1000)
    assert _grant_of(parts, "voider", "bought")[1] == 0  # never consumed
    assert parts.emulator.wait_for_webhooks()
    account = parts.ledger.account("voider", "USD")
    assert account is not None
    assert not any(isinstance(e, CustomerAccount.CreditActivated)
                   for e in parts.ledger.events.get(account.id))  # fmt: skip
    _project_now(parts)
    state_row, reason, voided = _row(parts, "voider", "bought")
    assert (state_row, voided) == ("unpaid", 2000) and said in reason
    assert _audit(parts.settings, parts.ledger) == []


def _project_now(parts: Parts) -> None:
    from store.connections import Database

    with Database(parts.settings.database_url) as db:
        _project(db, parts.ledger)


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adapters.cli", *args],
        env=settings_env(settings), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_cli_purchase_records_a_pending_grant_and_its_invoice(parts: Parts) -> None:
    parts.ledger.change_account("cli", "USD", lambda a: _grant(a, 1, "seed"))
    args = ["credits", "grant", "cli", "50.00", "USD", "--source", "purchased",
            "--reason", "pack", "--id", "pack-1", "--price", "45.00"]  # fmt: skip
    first, again = _cli(parts.settings, *args), _cli(parts.settings, *args)
    assert first.returncode == 0, first.stderr
    assert "grant pack-1 of 50.00 USD to cli for 45.00 USD, pending" in first.stdout
    assert again.returncode == 0 and "already purchased (nothing recorded)" in again.stdout
    bought = purchase_id("cli", "USD", "pack-1")
    invoices = [i for i in parts.emulator.invoices()
                if i["metadata"].get("purchase_id") == str(bought)]  # fmt: skip
    assert [(i["status"], i["total"]) for i in invoices] == [("open", 4500)]
    shown = json.loads(_cli(parts.settings, "credits", "show", "cli", "USD", "--json").stdout)
    [pack] = [g for g in shown["grants"] if g["grant_id"] == "pack-1"]
    assert pack["live"] is False


def test_hostile_purchases_are_refused_with_a_reason_and_record_nothing(parts: Parts) -> None:
    parts.ledger.change_account("known", "USD", lambda a: _grant(a, 1, "seed"))
    before = parts.ledger.account("known", "USD")
    assert before is not None
    base = ["credits", "grant", "known", "5.00", "USD", "--source", "purchased", "--reason", "r"]
    cases = [
        [*base, "--price", "-1.00"],  # negative price
        [*base, "--price", "1e30"],  # unbounded price
        [*base, "--price", "0.001"],  # not whole minor units
        [*base, "--price", "NaN"],
        ["credits", "grant", "nobody", "5.00", "USD", "--source", "purchased", "--reason", "r"],
        ["credits", "grant", "known", "5.00", "USD", "--source", "manual", "--reason", "r",
         "--price", "4.00"],  # a price for credit nobody buys
    ]  # fmt: skip
    for args in cases:
        done = _cli(parts.settings, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    after = parts.ledger.account("known", "USD")
    assert after is not None and after.version == before.version
    assert parts.ledger.account("nobody", "USD") is None
    assert not [i for i in parts.emulator.invoices() if i["metadata"].get("purchase_id")]


def _stripe_audit(parts: Parts) -> tuple[int, list[dict[str, str]]]:
    """``audit --stripe --json`` as an operator runs it, the read models caught up first."""
    _project_now(parts)
    done = _cli(parts.settings, "audit", "--stripe", "--json")
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)["findings"]


def test_audit_stripe_compares_each_purchase_with_its_invoice_in_stripe(parts: Parts) -> None:
    endpoint = parts.emulator.add_webhook_endpoint(parts.url, SECRET, ["invoice.*"])
    parts.ledger.change_account("auditee", "USD", lambda a: _grant(a, 1, "seed"))
    paid_id = _buy(parts, "auditee", "paid", 2000, 1800)
    parts.emulator.pay_invoice(paid_id)
    wait_for(
        lambda: _grant_of(parts, "auditee", "paid")[0] is GrantState.LIVE,
        what="invoice.paid to make the grant live",
    )
    pending_id = _buy(parts, "auditee", "pending", 500, 500)  # open: awaits its payment
    assert parts.emulator.wait_for_webhooks()
    assert _stripe_audit(parts) == (0, [])

    # Behind the ledger's back: the pending purchase's invoice is voided while no webhook
    # reaches the ledger, and an invoice naming a purchase the ledger never made appears.
    assert parts.emulator.remove_webhook_endpoint(endpoint["id"])
    client = parts.pusher.gateway.client  # type: ignore[attr-defined]
    client.v1.invoices.void_invoice(pending_id)
    bought = parts.ledger.purchase_by_id(purchase_id("auditee", "USD", "paid"))
    assert bought is not None and bought.stripe_customer_id is not None
    forged = purchase_id("auditee", "USD", "never-bought")
    stranger = client.v1.invoices.create(params={
        "customer": bought.stripe_customer_id, "currency": "usd",
        "metadata": {"purchase_id": str(forged)},
    })  # fmt: skip
    status, findings = _stripe_audit(parts)
    assert status == 1
    pending = str(purchase_id("auditee", "USD", "pending"))
    assert sorted((f["kind"], f["subject"], f["detail"]) for f in findings) == [
        ("purchase", str(forged),
         f"Stripe's invoice {stranger.id} (draft, 0.00 USD) names a purchase the ledger never"
         " recorded"),
        ("purchase_webhook", pending,
         f"Stripe's invoice {pending_id} is void; the ledger's grant pending still awaits"
         " payment (invoice.voided not processed)"),
    ]  # fmt: skip
    assert _grant_of(parts, "auditee", "pending")[0] is GrantState.PENDING  # nothing changed
