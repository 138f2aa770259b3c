"""``python -m tools.bench_alert_sending``: every delivery sent and recorded delivered,
once, over either receiver. Only what it counts is asserted, never its rate."""

from __future__ import annotations

import pytest

from tools.bench_alert_sending import run_sending

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("keep_alive", [True, False])
def test_bench_alert_sending_delivers_every_pending_delivery(keep_alive: bool) -> None:
    report = run_sending(40, concurrency=4, keep_alive=keep_alive)
    assert (report["deliveries"], report["delivered"], report["failed_attempts"]) == (40, 40, 0)
    assert report["receiver_keep_alive"] is keep_alive
    assert report["deliveries_per_s"] > 0 and report["cpu_us_per_delivery"] > 0
