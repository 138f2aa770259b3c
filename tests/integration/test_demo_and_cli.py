"""The README's demo command, and the CLI against a real database."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from datetime import timedelta
from decimal import Decimal

import pytest

from adapters.bootstrap import migrate, open_ledger
from adapters.settings import DEFAULT_PRICE_LIST, Settings
from domain.ids import transaction_id
from domain.money import round_minor
from domain.pricing import PriceList
from tests.conftest import settings_env
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
