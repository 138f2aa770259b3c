"""``billing-ledger bench close`` at a tiny size: it closes every invoice, its money
check holds against totals recomputed here from the price list, and every webhook it
posts is answered and recorded once. Only what it counts is asserted, never its times."""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal

import pytest

from adapters.settings import DEFAULT_PRICE_LIST
from domain.money import round_minor
from domain.pricing import PriceList

pytestmark = pytest.mark.integration


def test_bench_close_finalizes_every_invoice_and_its_money_and_webhooks_add_up() -> None:
    customers = 20
    proc = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "bench", "close",
         "--customers", str(customers), "--stripe-rate", "25", "--clients", "4", "--json"],
        capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)

    # One record of 1000 + i api requests per customer, each line rounded once.
    price = PriceList.from_toml(DEFAULT_PRICE_LIST.read_text()).price_of("api.requests")
    expected = sum(round_minor(price.exact_amount(Decimal(1000 + i))) for i in range(customers))
    money = result["money"]
    assert money["ok"] is True
    assert (
        money["stripe_invoice_totals"]
        == money["lines_billed"]
        == money["ledger_finalized_totals"]
        == expected
    )
    assert result["finalized"] == money["stripe_invoices_finalized"] == customers
    assert result["stripe_requests_per_invoice_by_operation"]["POST /v1/invoices/{id}/finalize"]

    hooks = result["webhooks"]
    assert hooks["posted"] == hooks["answered_200"] == customers + customers // 10
    assert hooks["duplicates_answered"] == customers // 10  # a tenth sent twice
    assert hooks["receipts"] == {"applied": customers}
    assert hooks["paid_events"] == customers
    assert hooks["baseline_raw_insert_rows_per_s"] > 0
