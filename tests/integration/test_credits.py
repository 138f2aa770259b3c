"""Prepaid credits against real PostgreSQL and the Stripe emulator over HTTP: the
credit usage consumed comes off its invoice as a "Prepaid credits applied" item, read
back with the other items and finalized at usage minus credits, equal to the ledger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest

import store.ledger
from adapters.audit.replay import Scope
from adapters.audit.report import audit
from adapters.bootstrap import build_projector
from adapters.settings import Settings
from domain.account import CustomerAccount
from domain.audit import Finding
from domain.credit_line import CREDIT_METER, CreditLine
from domain.credits import CREDITS_EXHAUSTED
from projections.projector import Projector
from store.connections import Database
from store.ledger import BillingLedger
from store.schema import EVENTS_TABLE
from tests.conftest import settings_env
from tests.integration.support import record, wait_for
from tests.integration.test_invoices import Parts, _audit_clean, _invoice_of, parts

__all__ = ["parts"]  # the fixture, shared with the invoices' tests

GRANT = 500  # 5.00 USD, of 7.503 USD of usage


def _grant(account: CustomerAccount, amount: int = GRANT, grant_id: str = "promo") -> bool:
    return account.grant_credit(
        grant_id, amount, effective_at=datetime.now(UTC) - timedelta(days=1),
        source="promotional", reason="welcome",
    )  # fmt: skip


def test_a_finalized_invoice_is_usage_minus_the_credit_consumed_equal_to_the_ledger(
    parts: Parts,
) -> None:
    parts.ledger.change_account("acme", "USD", _grant)
    txns = record(parts.ledger, "acme", ["a-1", "a-2", "a-3"], qty=2500)
    invoice_id = _invoice_of(parts.ledger, txns[0])
    final = parts.finalize(invoice_id)
    lines = [parts.ledger.line_by_id(line) for line in final.lines]
    credit = [ln for ln in lines if isinstance(ln, CreditLine)]
    usage = sum(ln.billed for ln in lines if not isinstance(ln, CreditLine))
    assert [ln.billed for ln in credit] == [-GRANT] and usage > GRANT
    [stripe_invoice] = parts.emulator.invoices()
    assert final.total == final.expected_total == stripe_invoice["total"] == usage - GRANT
    items = {
        i["description"].split(" 20")[0]: i["amount"] for i in parts.emulator.live_invoice_items()
    }
    assert items[CREDIT_METER] == -GRANT
    account = parts.ledger.account("acme", "USD")
    assert account is not None and account.credit_remaining == 0
    _audit_clean(parts)


def _project(db: Database, ledger: BillingLedger) -> None:
    with Projector(db, ledger.mapper.to_domain_event) as projector:
        projector.pump_all()


def _audit(settings: Settings, ledger: BillingLedger) -> list[Finding]:
    with Database(settings.database_url) as db:
        _project(db, ledger)
        report = audit(db, Scope(), horizon=settings.retry_policy().horizon, progress=False)
    return report.findings


def test_two_ingest_processes_racing_on_one_customer_never_take_credit_below_zero(
    ingest_ledger: BillingLedger, settings: Settings
) -> None:
    """Block policy: 10.00 USD of credit, 100.1 cents a record, 2 x 60 records at once."""
    ingest_ledger.change_account("racer", "USD", lambda a: a.set_credit_policy("block"))
    ingest_ledger.change_account("racer", "USD", lambda a: _grant(a, 1000))
    env = {**os.environ, **settings_env(settings)}
    command = [sys.executable, "-m", "tests.integration.credit_racer", "racer"]
    size = ["15", "4", "1001"]  # batches, records a batch, quantity (100.1 cents)
    racers = [subprocess.Popen([*command, name, *size], env=env) for name in ("p1", "p2")]
    assert [p.wait(timeout=120) for p in racers] == [0, 0]
    account = ingest_ledger.account("racer", "USD")
    assert account is not None
    grant = account.grants["promo"]
    assert grant.consumed == Decimal("900.9") and grant.remaining == Decimal("99.1")
    with Database(settings.database_url) as db:
        _project(db, ingest_ledger)
    with psycopg.connect(settings.database_url) as conn:
        states = dict(conn.execute(
            "SELECT state, count(*) FROM billing.transactions WHERE customer_id = 'racer'"
            " GROUP BY state"
        ).fetchall())  # fmt: skip
        reasons = {r for (r,) in conn.execute(
            "SELECT DISTINCT compensation_reason FROM billing.transactions"
            " WHERE customer_id = 'racer' AND state = 'compensated'"
        ).fetchall()}  # fmt: skip
    assert states == {"reserved": 9, "compensated": 111}
    assert reasons == {CREDITS_EXHAUSTED}
    assert _audit(settings, ingest_ledger) == []


def test_a_grant_that_expires_mid_stream_is_not_consumed_after_its_expiry(
    ingest_ledger: BillingLedger, settings: Settings
) -> None:
    expires = datetime.now(UTC) + timedelta(seconds=2)
    ingest_ledger.change_account("exp", "USD", lambda a: a.grant_credit(
        "short", 1000, effective_at=expires - timedelta(days=1), expires_at=expires,
        source="promotional", reason="flash sale",
    ))  # fmt: skip
    before = record(ingest_ledger, "exp", ["e-1"], qty=1000)  # 100 cents, covered
    wait_for(lambda: datetime.now(UTC) >= expires, what="the grant's expiry")
    after = record(ingest_ledger, "exp", ["e-2"], qty=1000)  # overage: billed in full
    account = ingest_ledger.account("exp", "USD")
    assert account is not None
    grant = account.grants["short"]
    assert (grant.consumed, grant.expired, grant.remaining) == (100, 900, 0)
    expired = [e for e in ingest_ledger.events.get(account.id)
               if isinstance(e, CustomerAccount.CreditExpired)]  # fmt: skip
    assert [(e.grant_id, e.amount) for e in expired] == [("short", Decimal(900))]
    line = ingest_ledger.line_by_id(ingest_ledger.transaction(after[0]).line_id)  # type: ignore[arg-type]
    credit_id = CreditLine.id_for("exp", "USD", line.period)
    credit = ingest_ledger.line_by_id(credit_id)
    assert isinstance(credit, CreditLine) and credit.billed == -100
    assert list(credit.per_line) == [str(ingest_ledger.transaction(before[0]).line_id)]
    assert _audit(settings, ingest_ledger) == []


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adapters.cli", *args],
        env=settings_env(settings), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_cli_grants_shows_voids_lists_and_sets_the_policy(
    ingest_ledger: BillingLedger, settings: Settings
) -> None:
    grant = [
        "credits", "grant", "acme", "12.50", "USD", "--source", "manual", "--reason", "outage",
        "--id", "sorry", "--expires-at", "2099-01-01T00:00:00Z",
    ]  # fmt: skip
    first, again = _cli(settings, *grant), _cli(settings, *grant)
    assert first.returncode == 0 and first.stdout.startswith("granted: grant sorry of 12.50 USD")
    assert again.returncode == 0 and "already granted (nothing recorded)" in again.stdout
    record(ingest_ledger, "acme", ["c-1"], qty=1000)  # 1.00 USD of it
    shown = _cli(settings, "credits", "show", "acme", "USD", "--json")
    body = json.loads(shown.stdout)
    assert (body["policy"], body["remaining"]) == ("overage", "1150")
    assert body["grants"][0]["consumed"] == "100" and body["grants"][0]["live"] is True
    voided = _cli(settings, "credits", "void", "acme", "USD", "sorry", "--reason", "typo")
    assert voided.returncode == 0 and "voided 11.50 USD of grant sorry" in voided.stdout
    policy = _cli(settings, "credits", "policy", "--customer", "acme", "block")
    assert policy.stdout.strip() == "credit policy of acme in USD: block"
    with Database(settings.database_url) as db:
        _project(db, ingest_ledger)
    listed = json.loads(_cli(settings, "credits", "list", "--customer", "acme", "--json").stdout)
    assert [(r["grant_id"], r["consumed"], r["voided"], r["remaining"]) for r in listed] == [
        ("sorry", "100", "1150", "0")
    ]
    account = ingest_ledger.account("acme", "USD")
    assert account is not None and account.credit_policy == "block"


def test_cli_misuse_is_one_line_and_exit_2_recording_nothing(
    ingest_ledger: BillingLedger, settings: Settings
) -> None:
    base = ["credits", "grant", "acme", "5.00", "USD", "--source", "manual", "--reason", "r"]
    cases = [
        [*base, "--effective-from", "2027-01-01T00:00:00"],  # no time zone
        [*base, "--effective-from", "2027-01-02T00:00:00Z", "--expires-at", "2027-01-01T00:00:00Z"],
        ["credits", "grant", "acme", "0", "USD", "--source", "manual", "--reason", "r"],
        ["credits", "grant", "acme", "5.001", "USD", "--source", "manual", "--reason", "r"],
        ["credits", "void", "acme", "USD", "nope", "--reason", "r"],
        ["credits", "show", "nobody", "USD"],
    ]
    for args in cases:
        done = _cli(settings, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert ingest_ledger.account("acme", "USD") is None


def test_the_audit_finds_a_credit_grants_row_that_differs_from_the_history(
    ingest_ledger: BillingLedger, settings: Settings
) -> None:
    ingest_ledger.change_account("acme", "USD", _grant)
    record(ingest_ledger, "acme", ["t-1"], qty=1000)
    assert _audit(settings, ingest_ledger) == []
    with psycopg.connect(settings.database_url) as conn:
        conn.execute("UPDATE billing.credit_grants SET consumed = 0 WHERE grant_id = 'promo'")
    found = _audit(settings, ingest_ledger)
    assert [(f.kind, f.subject) for f in found] == [("projection", "acme/USD/promo")]
    assert "credit_grants.consumed: 0.00 USD, history says 1.00 USD" in found[0].detail


def test_the_audit_finds_a_credit_balances_row_that_differs_from_the_history(
    ingest_ledger: BillingLedger, settings: Settings
) -> None:
    ingest_ledger.change_account("acme", "USD", _grant)
    record(ingest_ledger, "acme", ["t-1"], qty=1000)
    assert _audit(settings, ingest_ledger) == []
    with psycopg.connect(settings.database_url) as conn:
        conn.execute(
            "UPDATE billing.credit_balances SET consumed = 0, policy = 'block'"
            " WHERE customer_id = 'acme'"
        )
    found = _audit(settings, ingest_ledger)
    assert [(f.kind, f.subject) for f in found] == [("projection", "acme/USD")] * 2
    details = [f.detail for f in found]
    assert "credit_balances.policy: 'block', history says 'overage'" in details
    assert "credit_balances.consumed: 0.00 USD, history says 1.00 USD" in details


def test_the_credit_lane_keeps_balances_in_sql_reading_credit_events_alone(
    ingest_ledger: BillingLedger, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The project role's credit lane projects the balances without the other read
    models (the main lane has not run), moves past the events it does not read, and the
    main lane's tables fill later from their own position. (The saves write no balance
    row here, as a build before ``store.credit_rows`` did: the lane's rows are the
    lane's.)"""
    monkeypatch.setattr(store.ledger, "balance_row", lambda account, events: None)
    ingest_ledger.change_account("lane", "USD", lambda a: _grant(a, 1000))
    record(ingest_ledger, "lane", ["l-1", "l-2"], qty=1000)  # 100 and 100.1 cents
    with build_projector(settings, ingest_ledger, lane="credits") as credits:
        assert {p.name for p in credits.projections} == {"credit_grants", "credit_balances"}
        credits.pump_all()
    with psycopg.connect(settings.database_url) as conn:
        balance = conn.execute(
            "SELECT consumed, remaining FROM billing.credit_balances WHERE customer_id = 'lane'"
        ).fetchone()
        transactions = conn.execute("SELECT count(*) FROM billing.transactions").fetchone()
        positions = dict(conn.execute(
            "SELECT name, notification_id FROM billing.projection_positions"
        ).fetchall())  # fmt: skip
        last = conn.execute(
            f"SELECT max(notification_id) FROM {EVENTS_TABLE}"  # noqa: S608
        ).fetchone()
    assert balance == (Decimal("200.1"), Decimal("799.9"))
    assert transactions == (0,)  # the main lane's, untouched
    assert last is not None and positions["credit_balances"] == last[0]  # past the rest
    assert positions["transactions"] == 0
    with build_projector(settings, ingest_ledger, lane="main") as main:
        assert not {p.name for p in main.projections} & {"credit_grants", "credit_balances"}
        main.pump_all()
    assert _audit(settings, ingest_ledger) == []
