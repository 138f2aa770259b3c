"""``billing-ledger bench replay`` at a tiny size: it writes the history it says, reads it
back both ways and its audit is clean. Only what it counts is asserted, never its times."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_bench_replay_writes_reads_and_audits_its_history_clean() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "bench", "replay", "--events", "3000", "--json"],
        capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    replay = result["audit_replay"]
    assert result["events"] == result["database_read"]["rows"] == replay["events"] >= 3000
    assert sum(replay["transactions"].values()) == result["generate"]["transactions"]
    assert (replay["findings"], result["audit_ok"]) == (0, True)
