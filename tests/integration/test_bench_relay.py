"""``billing-ledger bench relay`` at a tiny size: the relay publishes every event it wrote,
and the raw producer sends the same messages. Only what it counts is asserted, never
its times."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_bench_relay_publishes_every_event_and_sends_the_same_messages_raw() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "bench", "relay", "--events", "3000", "--json"],
        capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    # Every event written (the price book's and the usage's) published once, and the
    # raw producer sent exactly as many messages.
    assert result["events"] == result["relay"]["published"] >= 3000
    assert result["raw_producer"]["messages"] == result["events"]
    assert result["generate"]["transactions"] * 2 < result["events"]
    assert result["relay_vs_raw"] > 0
