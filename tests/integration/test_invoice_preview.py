"""``billing.invoice_preview`` and ``billing-ledger invoices preview``: what a customer's
open invoice would be now, line by line, from the read models (Stripe is not called)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest

from adapters.bootstrap import build_projector, migrate, open_ledger
from adapters.settings import Settings
from domain.metering import Metering, Source
from domain.money import format_money
from domain.usage import UsageRecord
from tests.conftest import settings_env

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "adapters.cli"]
AT = datetime(2026, 12, 2, 10, tzinfo=UTC)


def _record(usage_id: str, customer: str, meter: str, quantity: int) -> UsageRecord:
    return UsageRecord(
        usage_id=usage_id, customer_id=customer, meter=meter, quantity=Decimal(quantity),
        occurred_at=AT + timedelta(minutes=len(usage_id)),
    )  # fmt: skip


@pytest.fixture
def env(settings: Settings) -> dict[str, str]:
    migrate(settings)
    records = [
        _record("a1", "acme", "gpt-4o.input_tokens", 1520),
        _record("a2", "acme", "gpt-4o.input_tokens", 250_000),
        _record("a3", "acme", "api.requests", 7),
        _record("b1", "beta", "api.requests", 3),
    ]
    with open_ledger(settings) as ledger:
        ledger.record_usage([Metering(r, Source("usage", 0, i)) for i, r in enumerate(records)])
        with build_projector(settings, ledger) as projector:
            projector.pump_all()
    return settings_env(settings)


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_the_preview_is_each_open_line_and_the_invoice_total_so_far(
    env: dict[str, str], settings: Settings
) -> None:
    with psycopg.connect(settings.database_url) as conn:
        lines = conn.execute(
            "SELECT meter, exact_total, billed FROM billing.invoice_lines"
            " WHERE customer_id = 'acme' ORDER BY meter"
        ).fetchall()
    total = sum(billed for _, _, billed in lines)
    assert len(lines) == 2 and total > 0

    rows = json.loads(_cli("invoices", "preview", "--customer", "acme", "--json", env=env).stdout)
    assert [(r["meter"], Decimal(str(r["exact_total"])), r["billed"]) for r in rows] == lines
    assert {(r["invoice_total"], r["invoice_lines"], r["late"]) for r in rows} == {
        (total, 2, False)
    }
    assert {r["transactions"] for r in rows} == {1, 2}

    shown = _cli("invoices", "preview", "--customer", "acme", "--period", "2026-12", env=env)
    assert shown.returncode == 0, shown.stderr
    assert f"total so far: {format_money(total, 'USD')} (2 line(s))" in shown.stdout
    assert "acme USD, period 2026-12-01T00:00:00+00:00 to 2027-01-01T00:00:00+00:00" in (
        shown.stdout
    )
    for meter, exact, billed in lines:
        assert meter in shown.stdout and format_money(billed, "USD") in shown.stdout
        assert format_money(exact, "USD") in shown.stdout
    elsewhere = _cli("invoices", "preview", "--customer", "acme", "--period", "2026-11", env=env)
    assert elsewhere.stdout == "acme has no open invoice with usage in that period\n"


def test_a_closed_invoice_leaves_the_preview_and_a_bad_customer_is_misuse(
    env: dict[str, str], settings: Settings
) -> None:
    with psycopg.connect(settings.database_url) as conn:  # as the closer's projection would
        conn.execute("UPDATE billing.invoices SET state = 'closed' WHERE customer_id = 'beta'")
    assert _cli("invoices", "preview", "--customer", "beta", env=env).stdout == (
        "beta has no open invoice with usage\n"
    )
    assert json.loads(_cli("invoices", "preview", "--customer", "acme", "--json", env=env).stdout)
    bad = _cli("invoices", "preview", "--customer", "no spaces", env=env)
    assert bad.returncode == 2 and "invalid customer 'no spaces'" in bad.stderr
