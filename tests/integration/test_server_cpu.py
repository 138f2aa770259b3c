"""``tools.measure.ServerCpu``: the CPU a PostgreSQL server on this machine has used,
which ``bench ingest`` reads before and after a run to say where a record's CPU goes.
Work done by a backend counts while it runs, and still counts after it has ended."""

from __future__ import annotations

import os
import time

import psycopg
import pytest

from tools.measure import ServerCpu, quiet_server

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


def _checkpoints(conn: psycopg.Connection[tuple[int]]) -> int:
    """Checkpoints requested so far (the view moved in PostgreSQL 17)."""
    if conn.info.server_version >= 170000:
        row = conn.execute("SELECT num_requested FROM pg_stat_checkpointer").fetchone()
    else:
        row = conn.execute("SELECT checkpoints_req FROM pg_stat_bgwriter").fetchone()
    assert row is not None
    return int(row[0])


def test_a_quiet_server_owes_no_vacuum_and_no_checkpoint_for_earlier_writes(
    database_url: str,
) -> None:
    """``tools.measure.quiet_server``, which ``bench ingest`` runs between its runs: the
    database's tables vacuumed and analysed, and a checkpoint taken."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE written (n int)")
        conn.execute("INSERT INTO written SELECT generate_series(1, 20000)")
        conn.execute("DELETE FROM written WHERE n % 2 = 0")
        before = _checkpoints(conn)
    assert quiet_server(database_url, vacuum=True)
    with psycopg.connect(database_url, autocommit=True) as conn:
        deadline = time.monotonic() + 10
        while True:  # the statistics are reported as the vacuum's backend goes on
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                "SELECT last_vacuum IS NOT NULL AND last_analyze IS NOT NULL, n_dead_tup"
                " FROM pg_stat_user_tables WHERE relname = 'written'"
            ).fetchone()
            assert row is not None
            if (row[0] and _checkpoints(conn) > before) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert row == (True, 0)
        assert _checkpoints(conn) > before
