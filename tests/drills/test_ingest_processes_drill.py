"""Drill: ``run --role ingest --ingest-processes 2`` runs two ingest processes in the group
under one supervisor; one is SIGKILLed mid-stream (issue 14).

The supervisor starts a new one (the role's restart policy), both report their own
heartbeat, every record is recorded exactly once (I1, I6), and stopping the run
process stops every ingest process with it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from adapters.bootstrap import migrate, prepare
from adapters.settings import Settings
from tests.drills.support import Worker
from tests.integration.support import metered_usage_ids, produce_records, usage, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.drill]


def _workers(url: str) -> list[tuple[list[str], int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT roles, pid FROM billing.workers").fetchall()
    return [(list(roles), int(pid)) for roles, pid in rows]


def _ingest_pids(url: str, parent: int) -> set[int]:
    return {pid for roles, pid in _workers(url) if roles == ["ingest"] and pid != parent}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _records(prefix: str, n: int) -> list[Any]:
    customers = [f"c{i}" for i in range(8)]  # spread over the topic's four partitions
    return [usage(f"{prefix}-{i}", customer=customers[i % 8]) for i in range(n)]


def test_two_ingest_processes_share_the_group_and_a_killed_one_is_restarted(
    settings: Settings, tmp_path: Path
) -> None:
    settings = settings.model_copy(
        update={"ingest_processes": None, "heartbeat_interval_s": 0.5, "role_restart_base_s": 0.5}
    )
    migrate(settings)
    prepare(settings)
    worker = Worker(settings, "ingest", tmp_path / "worker.log", "--ingest-processes", "2")
    parent = worker.proc.pid
    try:
        first = _records("a", 400)
        produce_records(settings, first)
        pids = wait_for(
            lambda: worker.alive() and len(p := _ingest_pids(settings.database_url, parent)) == 2
            and p,
            timeout=90,
            what="two ingest processes, each with its own heartbeat",
        )  # fmt: skip
        assert any(
            roles == ["ingest-processes:2"] and pid == parent
            for roles, pid in _workers(settings.database_url)
        )
        wait_for(lambda: len(metered_usage_ids(settings.database_url)) >= 400, timeout=90)

        killed = min(pids)
        os.kill(killed, signal.SIGKILL)
        second = _records("b", 400)
        produce_records(settings, second)
        wait_for(
            lambda: (
                worker.alive() and len(_ingest_pids(settings.database_url, parent) - {killed}) == 2
            ),
            timeout=90,
            what="the supervisor to start a new ingest process",
        )
        expected = sorted(r.usage_id for r in [*first, *second])
        wait_for(
            lambda: sorted(metered_usage_ids(settings.database_url)) == expected,
            timeout=120,
            what="every record recorded exactly once",
        )
        children = _ingest_pids(settings.database_url, parent) - {killed}
    finally:
        code = worker.stop()
    assert code == 0, worker.stderr()[-3000:]
    [restart] = worker.lines("role failed, restarting")
    assert restart["role"] in {"ingest-0", "ingest-1"}
    assert f"exited with -{int(signal.SIGKILL)}" in restart["reason"]
    assert not any(_alive(pid) for pid in children)
