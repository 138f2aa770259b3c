"""Pricing models against real PostgreSQL, the broker and the Stripe emulator: a tiered
meter's usage through the ingest worker and the charge path ends as a Stripe invoice of
``f(Q)`` rounded once; a version published mid-period does not change that period's
tiers; the preview shows the model, the quantity and the tier reached; the audit is
clean."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from adapters.bootstrap import (
    build_closer,
    build_ingest_worker,
    build_pusher,
    migrate,
    open_ledger,
    prepare,
)
from adapters.charging.closer import CloseResult
from adapters.settings import Settings
from domain.ids import transaction_id
from domain.invoice_states import InvoiceState
from domain.pricing import PriceList
from domain.usage import UsageRecord
from infra.stripe_emulator import StripeEmulator
from store.ledger import BillingLedger
from tests.conftest import settings_env
from tests.integration.support import audit_findings, produce_records, run_worker_until

pytestmark = pytest.mark.integration

DAY = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=2)
TIERED = """
[meters."gpu.seconds"]
model = "graduated"
currency = "USD"
tiers = [{{up_to = 1000, unit_price = "0.01"}}, {{unit_price = "{second}"}}]
flat_fee = "1.00"
"""


@pytest.fixture
def settings_day(stripe_settings: Settings) -> Settings:
    return stripe_settings.model_copy(update={"billing_period": "day", "invoice_grace_s": 0.0})


@pytest.fixture
def day_ledger(settings_day: Settings) -> Iterator[BillingLedger]:
    migrate(settings_day)
    prepare(settings_day)
    with open_ledger(settings_day) as app:
        yield app


def _usage(n: int, at: datetime) -> UsageRecord:
    return UsageRecord(
        usage_id=f"g{n}", customer_id="acme", meter="gpu.seconds", quantity=Decimal(400),
        occurred_at=at,
    )  # fmt: skip


def test_a_tiered_meter_is_invoiced_f_of_its_quantity_with_the_tiers_of_the_periods_start(
    settings_day: Settings, day_ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    ledger = day_ledger
    ledger.publish_prices(PriceList.from_toml(TIERED.format(second="0.00333")), DAY)
    # Published for the middle of the day: its tiers are the next day's, not this one's.
    ledger.publish_prices(
        PriceList.from_toml(TIERED.format(second="0.001")), DAY + timedelta(hours=12)
    )
    records = [_usage(n, DAY + timedelta(hours=1 + 4 * n)) for n in range(6)]  # 3 after noon
    produce_records(settings_day, records)
    run_worker_until(build_ingest_worker(settings_day, ledger), 6, "six tiered records")

    txns = [ledger.transaction(transaction_id("acme", r.usage_id)) for r in records]
    assert {t.price_version for t in txns} == {2}
    assert {t.line_id for t in txns} == {txns[0].line_id}
    line = ledger.line_by_id(txns[0].line_id)  # type: ignore[arg-type]
    # Independently: 1,000 s at 1 cent, 1,400 s at 0.333 cents, the 100-cent fee.
    exact = Decimal(1000) + Decimal(1400) * Decimal("0.333") + Decimal(100)
    assert (line.quantity, line.exact_total, line.tier) == (2400, exact, 2)
    assert sum(t.amount for t in txns) == exact == Decimal("1566.2")
    assert [t.amount for t in txns][:3] == [Decimal(500), Decimal(400), Decimal("266.6")]

    preview = _preview(settings_day)
    assert [(r["meter"], r["model"], r["quantity"], r["tier"], r["billed"]) for r in preview] == [
        ("gpu.seconds", "graduated", 2400, 2, 1566)
    ]

    pusher = build_pusher(settings_day, ledger)
    closer = build_closer(settings_day, pusher)
    step = closer.step(line.invoice_id, close_now="test")
    for _ in range(5):
        if step.result is not CloseResult.WAITING:
            break
        step = closer.step(line.invoice_id)
    invoice = ledger.invoice_by_id(line.invoice_id)
    assert invoice is not None and invoice.state is InvoiceState.FINALIZED, step
    [stripe_invoice] = emulator.invoices()
    assert stripe_invoice["total"] == invoice.total == 1566  # f(2,400) rounded once, half up
    assert audit_findings(settings_day, ledger) == []


def _preview(settings: Settings) -> list[dict[str, object]]:
    env = settings_env(settings)
    with open_ledger(settings) as ledger:
        from adapters.bootstrap import build_projector

        with build_projector(settings, ledger) as projector:
            projector.pump_all()
    shown = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "invoices", "preview", "--customer", "acme"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "graduated" in shown.stdout and "2400" in shown.stdout
    as_json = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "invoices", "preview", "--customer", "acme", "--json"],  # noqa: E501
        capture_output=True, text=True, env=env, timeout=120, check=True,
    )  # fmt: skip
    rows: list[dict[str, object]] = json.loads(as_json.stdout, parse_float=Decimal)
    for row in rows:
        row["quantity"] = Decimal(str(row["quantity"]))
    return rows
