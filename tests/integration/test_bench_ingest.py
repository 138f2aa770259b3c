"""``billing-ledger bench ingest`` at a small size: every record produced is ingested by
one process and again by two, the same rows are copied raw, and the report has every
figure (or, with ``--end-to-end-only``, no store appends; with ``--saves-inline``, one
process again saving in line; with ``--prices tiered``, one process again pricing every
meter by tiers). Only what it counts is asserted, never its rates."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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
