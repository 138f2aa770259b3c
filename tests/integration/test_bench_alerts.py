"""``python -m tools.bench_alerts``: every alert arrives, verified, once; with
``--credits`` they are the balance falling on accounts that burn credit. Only what it
counts is asserted, never its latencies."""

from __future__ import annotations

import pytest

from tools.bench_alerts import run_alerts

pytestmark = pytest.mark.integration


def test_bench_alerts_with_credits_delivers_every_balance_alert() -> None:
    report = run_alerts(rate=50, seconds=2, concurrency=2, every=1, credits=True)
    assert report["credits"] is True
    assert 0 < report["alerting_records"] <= 100  # 50 a second for 2 s, as far as it got
    # Each alerting record took its customer's balance down one threshold: one alert each.
    assert report["alerts_received"] == report["alerting_records"]
    assert report["produced_to_received_ms"]["p50"] > 0
    # Every record's balance was seen in billing.credit_balances.
    assert report["balances_shown"] == report["alerting_records"]
    assert report["produced_to_balance_ms"]["p50"] > 0
    assert report["recorded_to_balance_ms"]["p50"] > 0
    # ... split at the save's commit, seen for every record; the save wrote the balance
    # (store.credit_rows), so every sample that saw a save saw its balance too: not a
    # latency, a fact of one snapshot.
    assert report["recorded_to_committed_ms"]["p50"] > 0
    assert report["committed_to_balance_ms"]["min"] == report["committed_to_balance_ms"]["max"] == 0
