"""Money is printed one way wherever a person reads it: every command's table output is
walked for an amount without its currency, and the amounts it shows are the exact
ones in major units (``domain.money.format_money``); ``--json`` keeps minor units. The
audit's findings are walked too, with a history and read models tampered with."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest

from adapters.bootstrap import build_projector, migrate, open_ledger
from adapters.settings import Settings
from domain.ids import transaction_id
from domain.metering import Metering
from domain.money import format_money
from domain.transaction import Source
from domain.usage import UsageRecord
from tests.conftest import settings_env

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "adapters.cli"]
# A number with a decimal point, not part of a timestamp, an id or a version.
DECIMAL = re.compile(r"(?<![\w:.+-])-?\d+\.\d+(?![\w:.-])")
LABELLED = re.compile(r"-?\d+(?:\.\d+)? [A-Z]{3}\b")
UUID_TEXT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
AT = datetime(2026, 12, 2, 10, tzinfo=UTC)


def _cli(*args: str, env: dict[str, str]) -> str:
    proc = subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _unlabelled(text: str) -> list[str]:
    """Each decimal number in ``text`` that is not an amount followed by its currency."""
    labelled = {m.start() for m in LABELLED.finditer(text)}
    return [m.group() for m in DECIMAL.finditer(text) if m.start() not in labelled]


def _bare_numbers(detail: str) -> list[str]:
    """Each number in a finding's text that is neither part of an amount with its currency
    nor of an id (the tampered findings below, but the price one, name no version, count
    or sequence)."""
    return re.findall(r"\d+", UUID_TEXT.sub("", LABELLED.sub("", detail)))


def _record(usage_id: str, customer: str, tokens: int) -> UsageRecord:
    return UsageRecord(
        usage_id=usage_id,
        customer_id=customer,
        meter="gpt-4o.input_tokens",
        quantity=Decimal(tokens),
        occurred_at=AT + timedelta(seconds=tokens - 137),
    )


@pytest.fixture
def env(settings: Settings) -> dict[str, str]:
    migrate(settings)
    with open_ledger(settings) as ledger:
        ledger.set_spend_limit("acme", "USD", 2500)
        ledger.record_usage(
            [
                Metering(_record(f"u{i}", c, 137 + i), Source("usage", 0, i))
                for i, c in enumerate(["acme", "acme", "beta"])
            ]
        )
        with build_projector(settings, ledger) as projector:
            projector.pump_all()
    return settings_env(settings)


def test_no_command_prints_an_amount_without_its_currency(env: dict[str, str]) -> None:
    txn = str(transaction_id("acme", "u1"))
    outputs = {
        "balances": _cli("balances", env=env),
        "balances --as-of": _cli("balances", "--as-of", "2030-01-01T00:00:00Z", env=env),
        "transactions": _cli("transactions", env=env),
        "lines": _cli("lines", env=env),
        "invoices": _cli("invoices", env=env),
        "invoices preview": _cli("invoices", "preview", "--customer", "acme", env=env),
        "history": _cli("history", txn, env=env),
        "accounts show": _cli("accounts", "show", "acme", "USD", env=env),
        "accounts set-limit": _cli("accounts", "set-limit", "acme", "30", "USD", env=env),
    }
    for command, text in outputs.items():
        assert LABELLED.search(text), (command, text)
        assert _unlabelled(text) == [], (command, text)


def test_exact_amounts_show_every_digit_in_major_units_and_json_keeps_minor_units(
    env: dict[str, str],
) -> None:
    # 137 input tokens at the default price of gpt-4o input: the exact amount, unrounded.
    rows = json.loads(_cli("transactions", "--customer", "beta", "--json", env=env))
    [row] = rows
    exact_minor = Decimal(str(row["amount"]))
    assert exact_minor != exact_minor.to_integral_value()  # a fraction of a cent
    major = exact_minor.scaleb(-2).normalize()
    table = _cli("transactions", "--customer", "beta", env=env)
    assert f"{major:f} USD" in table
    shown = _cli("accounts", "show", "acme", "USD", env=env)
    assert "spend_limit  25.00 USD" in shown
    assert "Exact amounts keep fractions of a minor unit" in _cli("balances", env=env)


def test_the_audits_findings_show_every_amount_they_compare_with_its_currency(
    env: dict[str, str], settings: Settings
) -> None:
    txn = str(transaction_id("acme", "u1"))
    [row] = [
        r
        for r in json.loads(_cli("transactions", "--customer", "acme", "--json", env=env))
        if r["transaction_id"] == txn
    ]
    metered = format_money(Decimal(str(row["amount"])), "USD")
    with psycopg.connect(settings.database_url) as conn:  # history edited, trigger off
        conn.execute("ALTER TABLE billingledger_events DISABLE TRIGGER events_append_only")
        conn.execute(
            "UPDATE billingledger_events SET state = convert_to(jsonb_set("
            "convert_from(state, 'UTF8')::jsonb, '{amount}', '\"100\"')::text, 'UTF8')"
            " WHERE originator_id = %s AND originator_version = 1",
            (txn,),
        )
        conn.execute("ALTER TABLE billingledger_events ENABLE TRIGGER events_append_only")
        conn.execute("UPDATE billing.invoice_lines SET billed = billed + 7")  # by hand
    proc = subprocess.run(
        [*CLI, "audit"], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert proc.returncode == 1, proc.stderr
    table = proc.stdout.partition("  detail\n")[2]  # the findings, not the time taken
    assert LABELLED.search(table) and _unlabelled(table) == [], proc.stdout
    report = json.loads(subprocess.run(
        [*CLI, "audit", "--json"], capture_output=True, text=True, env=env, timeout=120,
        check=False,
    ).stdout)  # fmt: skip
    details = [f["detail"] for f in report["findings"] if f["kind"] != "price"]
    assert [d for d in details if _bare_numbers(d)] == [], details
    # The price finding names a version and a quantity (numbers, not money); its amounts
    # are labelled: what was recorded, and what the version it names prices it at.
    [price] = [f["detail"] for f in report["findings"] if f["kind"] == "price"]
    assert price.startswith("amount 1.00 USD, but price book ") and price.endswith(
        f" at {metered}"
    ), price
    assert f"transactions.amount: {metered}, history says 1.00 USD" in details
    assert f"in its line as {metered}, metered 1.00 USD" in details
    assert "invoice_lines.billed: 0.07 USD, history says 0.00 USD" in details
    assert any(d.startswith("customer_balances.metered: ") for d in details), details
