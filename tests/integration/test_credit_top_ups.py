"""Automatic top-ups against real PostgreSQL and the Stripe emulator over HTTP: the
ingest save whose usage takes the live balance below the rule's threshold records the
top-up's start once per crossing, with two ingest processes racing on one customer and
across kill -9 of the process that crossed; the reconciler turns it into one purchased
grant, live when its invoice is paid, and the audit's conservation holds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta

from adapters.bootstrap import build_reconciler, build_scheduler
from adapters.settings import Settings
from domain.account import CustomerAccount
from domain.credits import GrantState
from domain.ids import account_id, purchase_id
from domain.purchase import PurchaseState
from store.connections import Database
from store.ledger import BillingLedger
from tests.conftest import settings_env
from tests.integration.support import record, run_cli, wait_for
from tests.integration.test_credits import _audit, _project
from tests.integration.test_invoices import SECRET, Parts, parts

__all__ = ["parts"]

RACER = [sys.executable, "-m", "tests.integration.credit_racer"]
QUANTITY = "1001"  # 100.1 cents a record


def _with_rule(parts: Parts, customer: str) -> None:
    """10.00 USD of credit; below 5.00 USD, buy 20.00 USD for 18.00."""
    parts.ledger.change_account(customer, "USD", lambda a: a.grant_credit(
        "promo", 1000, effective_at=datetime.now(UTC) - timedelta(days=1),
        source="promotional", reason="welcome",
    ))  # fmt: skip
    parts.ledger.change_account(customer, "USD", lambda a: a.set_top_up(500, 2000, 1800))


def _racer(parts: Parts, customer: str, prefix: str, batches: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, **settings_env(parts.settings)}
    return subprocess.Popen([*RACER, customer, prefix, str(batches), "4", QUANTITY], env=env)


def _events(parts: Parts, customer: str, kind: type) -> list[object]:
    return [e for e in parts.ledger.events.get(account_id(customer, "USD")) if isinstance(e, kind)]


def _drive_purchases(parts: Parts) -> int:
    """A reconciler pass, after projecting: the worker's half of the top-up."""
    with Database(parts.settings.database_url) as db:
        _project(db, parts.ledger)
        reconciler = build_reconciler(
            parts.settings, parts.pusher, build_scheduler(parts.settings, parts.pusher), db
        )
        return reconciler.pass_once().purchases


def _bought_once_and_paid(parts: Parts, customer: str) -> None:
    """The worker turns the one started top-up into one purchase, live when paid."""
    parts.emulator.add_webhook_endpoint(parts.url, SECRET, ["invoice.*"])
    assert _drive_purchases(parts) == 1
    assert _drive_purchases(parts) == 0  # started and finalized: nothing more to drive
    bought = purchase_id(customer, "USD", "top-up-1-1")
    purchase = parts.ledger.purchase_by_id(bought)
    assert purchase is not None and purchase.state is PurchaseState.FINALIZED
    assert (purchase.amount, purchase.price, purchase.top_up) == (2000, 1800, True)
    mine = [i for i in parts.emulator.invoices() if i["metadata"].get("purchase_id")]
    assert [(i["total"], i["metadata"]["purchase_id"]) for i in mine] == [(1800, str(bought))]
    assert purchase.stripe_invoice_id is not None
    parts.emulator.pay_invoice(purchase.stripe_invoice_id)

    def live() -> bool:
        account = parts.ledger.account(customer, "USD")
        return account is not None and account.grants["top-up-1-1"].state is GrantState.LIVE

    wait_for(live, what="invoice.paid to make the top-up live")
    record(parts.ledger, customer, [f"{customer}-after"], qty=1001)  # 20.00 live: re-armed
    assert len(_events(parts, customer, CustomerAccount.TopUpRearmed)) == 1
    assert len(_events(parts, customer, CustomerAccount.TopUpStarted)) == 1
    assert _audit(parts.settings, parts.ledger) == []


def test_two_ingest_processes_racing_on_one_customer_start_one_top_up_per_crossing(
    parts: Parts,
) -> None:
    _with_rule(parts, "racer")
    racers = [_racer(parts, "racer", name, 15) for name in ("p1", "p2")]
    assert [p.wait(timeout=120) for p in racers] == [0, 0]
    started = _events(parts, "racer", CustomerAccount.TopUpStarted)
    assert [(e.grant_id, e.crossing, e.version) for e in started] == [("top-up-1-1", 1, 1)]  # type: ignore[attr-defined]
    account = parts.ledger.account("racer", "USD")
    assert account is not None and account.grants["promo"].remaining == 0
    _bought_once_and_paid(parts, "racer")


def test_a_top_up_is_started_once_across_kill_9_of_the_process_that_crossed(
    parts: Parts,
) -> None:
    _with_rule(parts, "killed")
    crosser = _racer(parts, "killed", "k", 3000)  # runs long after it crosses
    wait_for(
        lambda: _events(parts, "killed", CustomerAccount.TopUpStarted),
        what="the crossing to be recorded",
    )
    assert crosser.poll() is None, "the crossing process ended before it could be killed"
    crosser.send_signal(signal.SIGKILL)
    assert crosser.wait(timeout=30) == -signal.SIGKILL
    restarted = _racer(parts, "killed", "k", 20)  # its records delivered again, and more
    assert restarted.wait(timeout=120) == 0
    started = _events(parts, "killed", CustomerAccount.TopUpStarted)
    assert [e.grant_id for e in started] == ["top-up-1-1"]  # type: ignore[attr-defined]
    _bought_once_and_paid(parts, "killed")


def test_the_cli_sets_shows_and_clears_a_rule_and_refuses_nonsense_recording_nothing(
    ingest_ledger: BillingLedger, settings: Settings
) -> None:
    ingest_ledger.change_account("acme", "USD", lambda a: a.set_credit_policy("overage"))
    base = ["credits", "top-up", "set", "--customer", "acme"]
    done = run_cli(settings, *base, "--below", "5.00", "--buy", "50.00", "--price", "45.00")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("top-up set: when acme's live credit in USD falls below 5.00")
    shown = json.loads(run_cli(settings, "credits", "show", "acme", "USD", "--json").stdout)
    assert shown["top_up"] == {"below": 500, "buy": 5000, "price": 4500, "version": 1,
                               "purchases_started": 0, "armed": True}  # fmt: skip
    account = ingest_ledger.account("acme", "USD")
    assert account is not None
    version = account.version
    cases = [
        [*base, "--below", "50.00", "--buy", "50.00"],  # buys no more than its threshold
        [*base, "--below", "50.00", "--buy", "10.00"],
        [*base, "--below", "-1", "--buy", "10.00"],
        [*base, "--below", "1", "--buy", "1e30"],  # unbounded
        [*base, "--below", "1", "--buy", "10", "--price", "-2"],
        [*base, "--below", "1", "--buy", "10", "--price", "0.001"],
        ["credits", "top-up", "set", "--customer", "nobody", "--below", "1", "--buy", "10"],
        ["credits", "top-up", "clear", "--customer", "nobody"],
    ]
    for args in cases:
        refused = run_cli(settings, *args)
        assert refused.returncode == 2, (args, refused.stdout, refused.stderr)
        assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    after = ingest_ledger.account("acme", "USD")
    assert after is not None and after.version == version
    assert ingest_ledger.account("nobody", "USD") is None
    cleared = run_cli(settings, "credits", "top-up", "clear", "--customer", "acme")
    assert cleared.stdout.strip() == "top-up of acme in USD: cleared"
    again = ingest_ledger.account("acme", "USD")
    assert again is not None and again.top_up is None
