"""``billing-ledger bench outage`` at a tiny size: through a Stripe outage every record is
charged once, Stripe holds what the lines billed, and the report has its recovery
figures; with ``--plot`` the run's timeline is drawn, each series named in the legend.
Only what it counts is asserted, never its times."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tools.plots import LABELS

pytestmark = pytest.mark.integration


SVG = "{http://www.w3.org/2000/svg}"


def test_bench_outage_loses_nothing_bills_nothing_twice_and_reports_recovery(
    tmp_path: Path,
) -> None:
    plot = tmp_path / "outage.svg"
    proc = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "bench", "outage", "--rate", "40",
         "--seconds", "10", "--outage-at", "3", "--outage-s", "3", "--customers", "4",
         "--meters", "2", "--settle-interval", "1", "--latency-ms", "0", "--json",
         "--plot", str(plot)],
        capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["drained"] is True
    assert result["produced"] == result["charged"] > 0
    assert (result["lost"], result["duplicates"], result["compensated"]) == (0, 0, 0)
    assert result["stripe_equals_billed"] is True
    assert result["stripe_holds"] == result["lines_billed"] > 0
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
