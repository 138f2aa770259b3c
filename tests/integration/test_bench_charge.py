"""``billing-ledger bench charge`` and ``bench outage`` at a tiny size: every record
produced is charged once (through a Stripe outage too), Stripe holds what the lines
billed, and the reports have the figures the benchmarks page quotes; with ``--plot``
the run's timeline is drawn, each series named in the legend. Only what they count is
asserted, never their times."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from tools.plots import LABELS

pytestmark = pytest.mark.integration

TINY = ("--rate", "40", "--meters", "2", "--settle-interval", "1", "--latency-ms", "0")
SVG = "{http://www.w3.org/2000/svg}"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


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


def test_bench_charge_charges_every_record_once_and_reports_its_figures(
    tmp_path: Path,
) -> None:
    plot = tmp_path / "charge.png"
    result = _bench("charge", "--seconds", "5", "--customers", "3", "--plot", str(plot))
    assert result["lines"] == 6
    assert result["stripe_requests"] > 0
    assert result["stripe_requests_per_1000_records"] > 0
    assert result["latency_s_p99"] >= result["latency_s_p50"] >= 0
    assert "outage_s" not in result
    assert plot.read_bytes().startswith(PNG_SIGNATURE)


def test_bench_outage_loses_nothing_bills_nothing_twice_and_reports_recovery(
    tmp_path: Path,
) -> None:
    plot = tmp_path / "outage.svg"
    result = _bench("outage", "--seconds", "10", "--outage-at", "3", "--outage-s", "3",
                    "--customers", "4", "--plot", str(plot))  # fmt: skip
    assert result["outage_s"] == pytest.approx(3, abs=0.5)
    assert result["stripe_calls_during_outage"] >= 0
    assert result["back_to_that_backlog_s_after_recovery"] >= 0
    assert result["backlog_before_outage"] >= 0

    svg = ET.parse(plot).getroot()  # noqa: S314 (the file this test had drawn)
    assert svg.tag == SVG + "svg"  # well-formed SVG, its text kept as text
    texts = {t.text for t in svg.iter(SVG + "text")}
    named = {LABELS[k] for k in ("backlog", "p50", "p99", "requests", "outage", "load_end")}
    assert named <= texts, named - texts
    assert f"{LABELS['limit']} (25/s)" in texts
    assert "billing-ledger bench outage" in texts
