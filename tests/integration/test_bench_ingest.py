"""``billing-ledger bench ingest`` at a small size: every record produced is ingested by
one process and again by two, the same rows are copied raw, and the report has every
figure (or, with ``--end-to-end-only``, no store appends; with ``--saves-inline``, one
process again saving in line; with ``--prices tiered``, one process again pricing every
meter by tiers). Only what it counts is asserted, never its rates."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from typing import Any

import psycopg
import pytest

from adapters.settings import Settings
from store.schema import EVENTS_TABLE
from tools import bench_store
from tools.synthetic import bench_usage

pytestmark = pytest.mark.integration

RECORDS = 3000


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "bench", "ingest", "--records", str(RECORDS),
         "--batch", "500", *args],
        capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_bench_ingest_ingests_every_record_with_one_and_two_processes() -> None:
    result = json.loads(_bench("--workers", "2", "--json").stdout)

    for run, workers in (("end_to_end", 1), ("end_to_end_workers", 2)):
        figures = result[run]
        assert figures["workers"] == workers
        # Metered + Reserved per record, plus the accounts' and lines' own events.
        assert figures["events"] > 2 * RECORDS
        assert figures["batches"] >= RECORDS // 500
        assert figures["records_per_s"] > 0
    assert result["raw_copy"]["rows"] == result["end_to_end"]["events"]
    assert set(result["store_append"]) == {"ours", "at_250"}
    assert set(result["store_append"]["at_250"]) == {"ours", "stock", "ours_locking"}
    assert {"store_append_vs_copy", "end_to_end_workers_vs_1"} <= set(result["ratios"])


def test_bench_ingest_end_to_end_only_skips_the_store_appends() -> None:
    text = _bench("--end-to-end-only", "--saves-inline").stdout

    assert "end to end (1 ingest process): records" in text
    assert "end to end, 1 process, saves in line" in text
    assert "saving behind / in line" in text
    assert "raw binary COPY of the same rows" in text
    assert "end-to-end records / COPY" in text
    assert "store append" not in text


def test_bench_ingest_with_tiered_prices_ingests_every_record_by_tiers_too() -> None:
    result = json.loads(_bench("--end-to-end-only", "--prices", "tiered", "--json").stdout)
    tiered = result["end_to_end_tiered"]
    # The same records, and each line's events besides: Metered + Reserved per record.
    assert tiered["events"] > 2 * RECORDS
    assert tiered["records_per_s"] > 0
    assert result["ratios"]["end_to_end_tiered_vs_flat"] > 0
    assert tiered["first_record"] == {"price_version": 2, "line_model": "graduated"}


def test_a_stalled_store_append_is_reported_and_the_benchmark_goes_on(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writers that save nothing for ``stall_s`` (here: blocked behind a lock another
    session holds on the event table, as the stock recorder's pipeline can block) are
    stopped and reported, instead of holding the benchmark until its caller's timeout."""
    url = settings.database_url
    locked = threading.Event()
    ended = threading.Event()

    def hold_the_events_table() -> None:
        with contextlib.suppress(psycopg.Error), psycopg.connect(url) as conn:
            conn.execute(f"LOCK TABLE {EVENTS_TABLE} IN ACCESS EXCLUSIVE MODE")
            locked.set()
            while True:  # held until the stall's termination of every session ends this one
                conn.execute("SELECT pg_sleep(1)")
        ended.set()

    made = bench_store._app

    def app_then_lock_once(*args: Any) -> Any:
        app = made(*args)
        if not locked.is_set():  # the first writer's store: locked before it saves anything
            threading.Thread(target=hold_the_events_table, daemon=True).start()
            assert locked.wait(10)
        return app

    monkeypatch.setattr(bench_store, "_app", app_then_lock_once)
    result = bench_store.store_append(
        settings, url, bench_usage(400, customers=4), 10, "ours", stall_s=2.0
    )

    assert result["1_writer"] == {"stalled": True, "batches_saved": 0}
    assert ended.wait(10)  # the lock went with the terminated sessions
    assert result["2_writers"]["records_per_s"] > 0


def test_bench_ingest_with_credits_burns_credit_and_checks_alerts_in_as_many_processes() -> None:
    result = json.loads(
        _bench("--end-to-end-only", "--credits", "--workers", "2", "--rounds", "2", "--json").stdout
    )
    credited, after = result["end_to_end_credits"], result["end_to_end_after_credits"]
    rounds = result["credit_rounds"]
    assert len(rounds) == 2 and rounds[0]["credits_records_per_s"] == credited["records_per_s"]
    assert all(r["credits_records_per_s"] > 0 and r["none_after_records_per_s"] > 0 for r in rounds)
    assert credited["workers"] == after["workers"] == 2
    assert credited["alerts"] and all(":" in key for key in credited["alerts"])
    # The same records, plus what credit adds to each save: a CreditsConsumed per account
    # and the credit lines' events (the alerts' spend moves with the reservation).
    assert credited["events"] > after["events"] > 2 * RECORDS
    assert result["ratios"]["end_to_end_credits_vs_none"] > 0
