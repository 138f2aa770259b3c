"""The README's demo command, and the CLI against a real database."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict
from datetime import timedelta
from decimal import Decimal

import pytest

from adapters.alerts import deliveries
from adapters.alerts.messages import ALERT_EVENT_TOPIC
from adapters.bootstrap import migrate, open_ledger
from adapters.settings import DEFAULT_PRICE_LIST, Settings
from billing_ledger_webhooks import SignatureError, verify
from domain.account import CustomerAccount, consumption
from domain.credits import CREDITS_EXHAUSTED, GrantState, top_up_grant_id
from domain.ids import account_id, purchase_id, transaction_id
from domain.money import round_minor
from domain.pricing import PriceList
from domain.purchase import PurchaseState
from infra.stripe_emulator import StripeEmulator
from projections.projector import Projector
from store.connections import Database
from store.ledger import BillingLedger
from tests.conftest import settings_env
from tests.integration.support import stored_states
from tools.demo import charging_settings
from tools.demo_credits import (
    AFTER_RECORDS,
    ALERTS,
    BURN_RECORDS,
    CREDIT_CUSTOMER,
    GRANT,
    GRANT_ID,
    RECORD,
    TOP_UP_BUY,
    TOP_UP_PRICE,
    Receiver,
    run_credit_scene,
)
from tools.synthetic import (
    DEMO_LIMITS,
    DEMO_TIERED_METER,
    base_time,
    demo_prices,
    synthetic_usage,
)

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "adapters.cli"]


def _cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def test_the_demo_command_ingests_everything_and_its_summary_matches_the_records_it_sent() -> None:
    records, seed = 1500, 11
    proc = _cli("demo", "--records", str(records), "--seed", str(seed), "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)

    # Recompute independently from the same deterministic stream and the price list (with
    # the demo's one meter priced by graduated tiers: what a record adds to its line; its
    # one meter whose price goes up 25% from 15 minutes into the usage; its contract
    # customer's 10% off one meter).
    prices = demo_prices(PriceList.from_toml(DEFAULT_PRICE_LIST.read_text()))
    produced = list(synthetic_usage(records, prices, seed=seed))
    changed_at = base_time() + timedelta(minutes=15)
    priced_by: dict[str, int] = defaultdict(int)
    held: dict[tuple[str, str, str], Decimal] = defaultdict(Decimal)  # a line's quantity
    seen: set[str] = set()
    zero = {"transactions": 0, "metered": 0, "in_flight": 0, "charged": 0, "compensated": 0}
    expected: dict[str, dict[str, dict[str, Decimal]]] = defaultdict(dict)
    committed: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    lines: dict[tuple[str, str, str], Decimal] = defaultdict(Decimal)  # the exact line totals
    invalid = duplicates = refused = 0
    for p in produced:
        if p.record is None:
            invalid += 1
            continue
        if p.record.usage_id in seen:
            duplicates += 1
            continue
        seen.add(p.record.usage_id)
        price = prices.price_of(p.record.meter)
        line = (p.record.customer_id, p.record.meter, f"{p.record.occurred_at:%Y%m%d%H}")
        if price.by_line:
            q = held[line]
            amount = price.total(q + p.record.quantity) - price.total(q)
        else:
            amount = price.exact_amount(p.record.quantity)
        if p.record.meter == "api.requests":
            after = p.record.occurred_at >= changed_at
            amount *= Decimal("1.25") if after else 1
            priced_by["v3 after" if after else "v2 before"] += 1
        if (p.record.customer_id, p.record.meter) == ("hooli", "gpt-4o.input_tokens"):
            amount *= Decimal("0.9")
        key = (p.record.customer_id, price.currency)
        bal = expected[key[0]].setdefault(price.currency, {k: Decimal(v) for k, v in zero.items()})
        bal["transactions"] += 1
        bal["metered"] += amount
        limit = DEMO_LIMITS.get(key)
        if limit is not None and committed[key] + amount > limit:
            bal["compensated"] += amount  # refused at ingest, in this customer's order
            refused += 1
        else:
            committed[key] += amount
            held[line] += p.record.quantity  # a refused record adds nothing to its line
            bal["charged"] += amount  # the demo charges everything it reserved
            lines[key[0], key[1], p.record.meter] += amount

    # hooli's minimum, 300.00 USD an hour: its one hour's invoice falls short of it.
    owed = 30_000 - sum(round_minor(t) for (c, cur, _), t in lines.items() if c == "hooli"
                        and cur == "USD")  # fmt: skip
    assert owed > 0
    lines["hooli", "USD", "(minimum commitment)"] = Decimal(owed)

    assert summary["records_sent"] == records
    assert summary["dead_letters"] == invalid > 0
    assert summary["duplicates_ignored"] == duplicates > 0
    assert summary["transactions"] == len(seen)
    assert summary["refused_by_limit"] == refused > 0
    assert summary["conserved"] is True
    fields = ("transactions", "metered", "in_flight", "charged", "compensated")
    got = {
        c: {cur: {k: Decimal(str(b[k])) for k in fields} for cur, b in currencies.items()}
        for c, currencies in summary["customers"].items()
    }  # fmt: skip
    assert got == expected
    assert sum(summary["dead_letter_reasons"].values()) == invalid
    # Stripe (the emulator) holds one item per line (customer, currency, meter; one
    # period), of the line's exact total rounded once.
    assert summary["stripe"]["live_invoice_items"] == len(lines) == len(summary["lines"])
    billed: dict[str, int] = defaultdict(int)
    for (_, currency, _), total in lines.items():
        billed[currency] += round_minor(total)
    assert summary["stripe"]["amount_by_currency"] == dict(billed)
    for line in summary["lines"]:
        exact = lines[line["customer_id"], line["currency"], line["meter"]]
        assert Decimal(line["exact"]) == exact and line["billed"] == line["stripe"]
        assert abs(line["billed"] - exact) <= Decimal("0.5")
    tiered = {ln["model"] for ln in summary["lines"] if ln["meter"] == DEMO_TIERED_METER}
    assert tiered and all(m.startswith("graduated t") for m in tiered)
    assert "graduated t2" in tiered  # some customer's hour went past its first tier
    # The price change, the contract and its true-up, as the summary tells them.
    pricing = summary["pricing"]
    assert pricing["priced"] == dict(priced_by) and set(priced_by) == {"v2 before", "v3 after"}
    assert [(t["customer_id"], t["meter"], t["billed"]) for t in pricing["true_ups"]] == [
        ("hooli", "(minimum commitment)", owed)
    ]
    assert pricing["tiered_lines"] == sorted(tiered)
    # Stripe calls grow with lines and customers, not records.
    assert summary["stripe"]["requests"] < len(seen) / 10
    assert "ingested" in proc.stderr  # progress was shown
    # The audit replays the demo's history clean, against the read models and Stripe.
    audit = summary["audit"]
    assert (audit["ok"], audit["findings"]) == (True, [])
    assert audit["transactions"] == len(seen)
    assert audit["stripe_items"] == len(lines)
    # Everything settled: queue health has nothing against it; the poison records are
    # dead letters, below the rate that degrades health (60 an hour by default).
    health = summary["health"]
    assert invalid <= 60
    assert (health["status"], health["reasons"]) == ("ok", [])
    # The credits scene, as its summary tells it (its ledger is gone with the demo's
    # database; test_the_demo_credit_scene_... checks the ledger itself).
    credits = summary["credits"]
    burned = GRANT // RECORD
    assert credits["refused"] == {CREDITS_EXHAUSTED: BURN_RECORDS - burned}
    assert credits["accepted"] == burned + AFTER_RECORDS
    grant = credits["grants"][GRANT_ID]
    assert (grant["amount"], grant["consumed"], grant["remaining"]) == (GRANT, str(GRANT), "0")
    assert sorted(a["threshold"] for a in credits["alerts"]) == sorted(ALERTS)
    assert credits["alerts_refused"] == 0
    assert (credits["top_up"]["started"], credits["top_up"]["purchase"]) == (1, "paid")
    assert credits["grants"][credits["top_up"]["grant_id"]]["state"] == "live"


def test_the_demo_credit_scene_burns_a_grant_to_zero_alerts_signed_and_tops_up_once(
    ingest_ledger: BillingLedger, settings: Settings, emulator: StripeEmulator
) -> None:
    """The scene on the test's own database, broker and emulator; each of its claims
    checked against the ledger's events, the read models, the deliveries and Stripe."""
    receiver = Receiver()
    scene = run_credit_scene(
        charging_settings(settings, emulator), ingest_ledger, emulator,
        deadline=time.monotonic() + 120, receiver=receiver,
    )  # fmt: skip
    account = ingest_ledger.account(CREDIT_CUSTOMER, "USD")
    assert account is not None and account.credit_policy == "block"
    events = list(ingest_ledger.events.get(account_id(CREDIT_CUSTOMER, "USD")))
    top_up = top_up_grant_id(1, 1)

    # Conservation per grant, folded from the events: granted = consumed + expired +
    # voided + remaining; and no grant's balance below zero after any event.
    granted: dict[str, Decimal] = {}
    moved: dict[str, dict[str, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
    consumed_by: dict[str, str] = {}  # transaction -> the grant it consumed
    for e in events:
        if isinstance(e, CustomerAccount.CreditGranted):
            granted[e.grant_id] = Decimal(e.amount)
        elif isinstance(e, CustomerAccount.CreditsConsumed | CustomerAccount.AmountsReserved):
            for txn, grant_id, amount in consumption(e):  # on its own event or the reservation
                moved[grant_id]["consumed"] += Decimal(amount)
                consumed_by[txn] = grant_id
        elif isinstance(e, CustomerAccount.CreditExpired | CustomerAccount.CreditVoided):
            kind = "expired" if isinstance(e, CustomerAccount.CreditExpired) else "voided"
            moved[e.grant_id][kind] += e.amount
        for grant_id, amount in granted.items():
            assert amount - sum(moved[grant_id].values()) >= 0, (e, grant_id)
    assert set(granted) == {GRANT_ID, top_up}
    for grant_id, amount in granted.items():
        grant = account.grants[grant_id]
        assert grant.consumed == moved[grant_id]["consumed"]
        assert amount == (moved[grant_id]["consumed"] + moved[grant_id]["expired"]
                          + moved[grant_id]["voided"] + grant.remaining)  # fmt: skip
    assert (granted[GRANT_ID], account.grants[GRANT_ID].remaining) == (GRANT, 0)
    assert moved[GRANT_ID]["consumed"] == GRANT  # burned to zero, by usage alone

    # The records: the first ones consumed the grant, the rest of the burn refused
    # (credits exhausted, consuming nothing), the ones after the top-up consumed it.
    burned = GRANT // RECORD
    ids = [f"credit-{i:02d}" for i in range(1, BURN_RECORDS + AFTER_RECORDS + 1)]
    refused_ids = ids[burned:BURN_RECORDS]
    with Database(settings.database_url) as db:
        with Projector(db, ingest_ledger.mapper.to_domain_event) as projector:
            projector.pump_all()
        with db.connection() as conn:
            rows = conn.execute(
                "SELECT usage_id, state, compensation_reason FROM billing.transactions"
                " WHERE customer_id = %s ORDER BY usage_id", (CREDIT_CUSTOMER,),
            ).fetchall()  # fmt: skip
            grant_rows = conn.execute(
                "SELECT grant_id, amount, consumed, expired, voided, remaining, state"
                " FROM billing.credit_grants WHERE customer_id = %s", (CREDIT_CUSTOMER,),
            ).fetchall()  # fmt: skip
            endpoint, secret = conn.execute(
                "SELECT endpoint_id, secret FROM billing.webhook_endpoints WHERE url = %s",
                (receiver.url,),
            ).fetchone() or (None, "")  # fmt: skip
            sent = deliveries.deliveries(conn, endpoint=endpoint)
    assert [r[0] for r in rows] == ids
    refused = [r[0] for r in rows if (r[1], r[2]) == ("compensated", CREDITS_EXHAUSTED)]
    assert refused == refused_ids and len(refused) == BURN_RECORDS - burned > 0
    assert not any(r[1] == "compensated" for r in rows if r[0] not in refused_ids)
    by_txn = {str(transaction_id(CREDIT_CUSTOMER, u)): u for u in ids}
    assert sorted(by_txn[t] for t, g in consumed_by.items() if g == GRANT_ID) == ids[:burned]
    assert sorted(by_txn[t] for t, g in consumed_by.items() if g == top_up) == ids[BURN_RECORDS:]
    assert {r[0]: (r[2], r[3], r[4], r[5]) for r in grant_rows}[GRANT_ID] == (GRANT, 0, 0, 0)
    assert scene["refused"] == {CREDITS_EXHAUSTED: len(refused_ids)}

    # Each alert crossed once and was delivered once, its signature valid with the
    # endpoint's secret (checked here again, apart from the receiver's own check).
    crossed = [c for c in stored_states(settings.database_url, ALERT_EVENT_TOPIC)
               if c["customer_id"] == CREDIT_CUSTOMER]  # fmt: skip
    assert sorted(c["threshold"] for c in crossed) == sorted(ALERTS)
    assert sorted((str(d.event_id), d.status, d.attempts) for d in sent) == sorted(
        (c["alert_id"], "delivered", 1) for c in crossed
    )
    assert len(receiver.requests) == len(crossed) and receiver.refused == 0
    checked = [verify(body, header, secret) for body, header in receiver.requests]
    assert sorted(e["id"] for e in checked) == sorted(c["alert_id"] for c in crossed)
    body, header = receiver.requests[0]
    with pytest.raises(SignatureError):
        verify(body.replace(b"pied-piper", b"pied-pipes"), header, secret)

    # The top-up: started once, one purchase, one one-off invoice in Stripe, paid, and
    # its grant live once activated.
    started = [e for e in events if isinstance(e, CustomerAccount.TopUpStarted)]
    assert [e.grant_id for e in started] == [top_up]
    activated = [e for e in events if isinstance(e, CustomerAccount.CreditActivated)]
    assert [e.grant_id for e in activated] == [top_up]
    bought = purchase_id(CREDIT_CUSTOMER, "USD", top_up)
    purchase = ingest_ledger.purchase_by_id(bought)
    assert purchase is not None and purchase.state is PurchaseState.PAID
    one_off = [i for i in emulator.invoices() if i["metadata"].get("purchase_id")]
    assert [(i["metadata"]["purchase_id"], i["total"], i["status"]) for i in one_off] == [
        (str(bought), TOP_UP_PRICE, "paid")
    ]
    assert account.grants[top_up].state is GrantState.LIVE
    assert granted[top_up] == TOP_UP_BUY
    assert moved[top_up]["consumed"] == AFTER_RECORDS * RECORD > 0


def test_history_shows_a_transactions_events_by_id_and_by_customer_and_usage_id(
    settings: Settings,
) -> None:
    migrate(settings)
    with open_ledger(settings) as ledger:
        from domain.metering import Metering
        from domain.transaction import Source
        from tests.integration.support import usage

        ledger.record_usage([Metering(usage("req-9", quantity=5000), Source("usage", 2, 41))])
    env = settings_env(settings)
    txn = transaction_id("acme", "req-9")

    by_id = _cli("history", str(txn), "--json", env=env)
    assert by_id.returncode == 0, by_id.stderr
    body = json.loads(by_id.stdout)
    assert [e["event"] for e in body["events"]] == ["Metered", "Reserved"]
    assert body["events"][0]["data"]["amount"] == "500"  # 5,000 x 0.001 USD = 5.00 USD
    assert body["events"][0]["data"]["source"] == "usage/2@41"

    by_usage = _cli("history", "--customer", "acme", "--usage-id", "req-9", "--json", env=env)
    assert json.loads(by_usage.stdout) == body

    table = _cli("history", str(txn), env=env)
    assert "Metered" in table.stdout and "Reserved" in table.stdout


def test_accounts_set_limit_is_exact_and_shown(settings: Settings) -> None:
    migrate(settings)
    env = settings_env(settings)
    assert _cli("accounts", "set-limit", "acme", "250.50", "usd", env=env).returncode == 0
    shown = json.loads(_cli("accounts", "show", "acme", "USD", "--json", env=env).stdout)
    assert (shown["spend_limit"], shown["available"]) == (25050, "25050")  # exact: text
    assert _cli("accounts", "set-limit", "acme", "none", "USD", env=env).returncode == 0
    shown = json.loads(_cli("accounts", "show", "acme", "USD", "--json", env=env).stdout)
    assert shown["spend_limit"] is None


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["frobnicate"], 2, "invalid choice"),
        (["history"], 2, "give a transaction id"),
        (["history", "not-a-uuid"], 2, "is not a transaction id"),
        (["demo", "--records", "0"], 2, "must be greater than 0"),
        (["accounts", "set-limit", "acme", "1.234", "USD"], 2, "more decimals than USD allows"),
        (["accounts", "set-limit", "acme", "10", "XYZ"], 2, "unknown currency"),
        (["accounts", "set-limit", "acme", "-5", "USD"], 2, "not a non-negative amount"),
        (
            ["accounts", "set-limit", "acme", "99999999999999999999999999.00", "USD"],
            2,
            "a spend limit must be from 0 to 10000000000000.00 USD,"
            " got 99999999999999999999999999.00 USD",
        ),
        (["history", "--customer", "acme", "--usage-id", "nope"], 2, "no transaction"),
    ],
)
def test_cli_misuse_gets_one_line_and_a_non_zero_exit(
    settings: Settings, args: list[str], status: int, message: str
) -> None:
    migrate(settings)
    proc = _cli(*args, env=settings_env(settings))
    assert proc.returncode == status
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_unreachable_database_is_one_line_not_a_traceback(settings: Settings) -> None:
    env = settings_env(settings)
    env["BILLING_LEDGER_DATABASE_URL"] = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"
    proc = _cli("accounts", "show", "acme", "USD", env=env)
    assert proc.returncode == 3
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
