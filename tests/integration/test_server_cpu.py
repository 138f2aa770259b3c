"""``tools.measure.ServerCpu``: the CPU a PostgreSQL server on this machine has used,
which ``bench ingest`` reads before and after a run to say where a record's CPU goes.
Work done by a backend counts while it runs, and still counts after it has ended."""

from __future__ import annotations

import os
import time

import psycopg
import pytest

from tools.measure import ServerCpu

pytestmark = pytest.mark.integration

# Enough work for a backend to show in CPU ticks (0.01 s) on any machine.
_WORK = "SELECT count(*) FROM generate_series(1, 3000000) AS g(n) WHERE n % 7 = 0"


def test_a_backend_s_work_counts_while_it_runs_and_after_it_has_ended(database_url: str) -> None:
    # Found every time: its backend is read while it is there (it ends with its connection).
    assert all(ServerCpu(database_url).postmaster is not None for _ in range(30))
    cpu = ServerCpu(database_url)
    first = cpu.read()
    assert first is not None
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(_WORK)
        live = cpu.read()  # its backend still runs: its own ticks
    assert live is not None
    work = live - first
    assert work > 0
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(_WORK)
    # Both backends have ended: their work is the postmaster's reaped children's now,
    # once it has waited for them. Without those, the total would fall below ``live``.
    deadline = time.monotonic() + 10
    total = cpu.read()
    while total is not None and total < live + work / 2 and time.monotonic() < deadline:
        time.sleep(0.05)
        total = cpu.read()
    assert total is not None
    assert total >= live + work / 2


def test_a_backend_id_that_is_not_a_local_postgres_process_is_not_read(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server on another machine: the backend's id names some other process here (this
    test's own, say), whose CPU must not be taken for the server's."""
    monkeypatch.setattr("tools.measure._stat", lambda pid: (pid, os.getpid(), 1, 1, 1, 1))
    monkeypatch.setattr("tools.measure._is_postgres", lambda pid: pid != os.getpid())
    cpu = ServerCpu(database_url)
    assert cpu.postmaster is None and cpu.read() is None
