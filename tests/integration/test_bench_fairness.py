"""``billing-ledger bench fairness`` at a small size (5 steady customers, a burst of
1,500 records): the run completes, every record produced is charged, none is lost or
billed twice, Stripe holds exactly what the lines billed, and the report has every
window's figures. Only what it counts is asserted, never its times."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

STEADY, BURST = 5, 1500
FIGURES = (
    "usage_to_recorded_s",
    "recorded_to_relayed_s",
    "recorded_to_projected_s",
    "recorded_to_charged_s",
    "usage_to_charged_s",
)


def test_bench_fairness_charges_every_record_and_reports_each_window() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "bench", "fairness",
         "--steady-customers", str(STEADY), "--steady-rate", "50", "--burst", str(BURST),
         "--settle-interval", "2", "--warmup-s", "4", "--before-s", "5", "--after-s", "5",
         "--json"],
        capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)

    assert result["drained"] is True
    assert result["lost"] == 0
    assert result["compensated"] == 0
    assert result["charged"] == result["produced"] > BURST
    assert result["stripe_equals_billed"] is True
    assert result["stripe_holds"] == result["lines_billed"] > 0
    assert result["duplicates"] == 0
    assert "workers_ended" not in result

    burst = result["burst"]
    assert burst["customer"] not in {f"cust-{i:03d}" for i in range(STEADY)}
    assert burst["records"] == BURST
    assert 0 <= burst["sent_in_s"] <= burst["charged_in_s"]
    assert burst["recorded_in_s"] <= burst["charged_in_s"]

    assert set(result["others"]) == {"before", "during", "after"}
    for window in result["others"].values():
        assert window["records"] > 0
        for figure in FIGURES:
            assert set(window[figure]) == {"p50", "p99", "max"}
            assert 0 <= window[figure]["p50"] <= window[figure]["p99"] <= window[figure]["max"]
    assert sum(w["stripe_requests"] for w in result["others"].values()) > 0
    assert result["stripe_requests"] >= sum(w["stripe_requests"] for w in result["others"].values())
    assert result["settings"]["steady_customers"] == STEADY
    assert result["cores"] >= 1
    assert set(result["load_average_1_5_15"]) == {"start", "end"}
