"""``billing-ledger bench charge`` and ``bench outage`` at a tiny size: every record
produced is charged once (through a Stripe outage too), Stripe holds what the lines
billed, and the reports have the figures the benchmarks page quotes. Only what they
count is asserted, never their times."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.integration

TINY = ("--rate", "40", "--meters", "2", "--settle-interval", "1", "--latency-ms", "0")


def _bench(*args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "bench", *args, *TINY, "--json"],
        capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout)
    assert result["drained"] is True
    assert result["produced"] == result["charged"] > 0
    assert (result["lost"], result["duplicates"], result["compensated"]) == (0, 0, 0)
    assert result["stripe_equals_billed"] is True
    assert result["stripe_holds"] == result["lines_billed"] > 0
    return result


def test_bench_charge_charges_every_record_once_and_reports_its_figures() -> None:
    result = _bench("charge", "--seconds", "5", "--customers", "3")
    assert result["lines"] == 6
    assert result["stripe_requests"] > 0
    assert result["stripe_requests_per_1000_records"] > 0
    assert result["latency_s_p99"] >= result["latency_s_p50"] >= 0
    assert "outage_s" not in result


def test_bench_outage_loses_nothing_bills_nothing_twice_and_reports_recovery() -> None:
    result = _bench("outage", "--seconds", "10", "--outage-at", "3", "--outage-s", "3",
                    "--customers", "4")  # fmt: skip
    assert result["outage_s"] == pytest.approx(3, abs=0.5)
    assert result["stripe_calls_during_outage"] >= 0
    assert result["back_to_that_backlog_s_after_recovery"] >= 0
    assert result["backlog_before_outage"] >= 0
