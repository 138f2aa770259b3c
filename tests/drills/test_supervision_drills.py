"""Supervision drill (issue 11): a role of a real ``billing-ledger run`` fails, and the
process restarts it, says so, and keeps charging; it does not take the process down."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from eventsourcing.application import AggregateNotFoundError

from adapters.observability.health_server import HealthProbe
from adapters.settings import Settings
from domain.ids import transaction_id
from domain.transaction import TxnState
from infra.embedded import free_port
from store.ledger import BillingLedger
from tests.drills.support import Worker
from tests.integration.support import produce_records, usage, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.drill]

FAILURE = "DrillFailure: drill: poll_once fails once"


@pytest.fixture
def drill_settings(charge_settings: Settings) -> Iterator[Settings]:
    yield charge_settings.model_copy(
        update={
            "health_port": free_port(),
            "heartbeat_interval_s": 0.5,
            # The restart waits 2-4 s (jittered): long enough for a heartbeat to report it.
            "role_restart_base_s": 4.0,
            # Only the charge role may charge: the reconciler leaves reservations alone.
            "stale_after_s": 3600.0,
        }
    )


def _restarts(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    found = re.search(r'^billing_role_restarts_total\{role="charge"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def _charged(ledger: BillingLedger, txn_id: UUID) -> bool:
    try:
        return ledger.transaction(txn_id).state is TxnState.CHARGED
    except AggregateNotFoundError:  # not ingested yet
        return False


def _charge_stats(report: dict[str, Any]) -> dict[str, Any]:
    [worker] = report["workers"]
    stats: dict[str, Any] = worker["stats"]
    return stats


def test_a_role_that_fails_is_restarted_named_in_health_and_the_process_keeps_charging(
    drill_settings: Settings, ledger: BillingLedger, tmp_path: Path
) -> None:
    settings = drill_settings
    records = [usage(f"s-{i}") for i in range(5)]
    produce_records(settings, records)
    probe = HealthProbe(settings, cache_s=0)

    worker = Worker(settings, "all", tmp_path / "worker.log", "--drill", "fail_charge_once")
    try:
        report = wait_for(
            lambda: worker.alive() and (r := probe.report())["status"] == "degraded"
            and any("charge failed" in reason for reason in r["reasons"]) and r,
            timeout=90,
            what="health to name the charge role while it waits to restart",
        )  # fmt: skip
        [reason] = [r for r in report["reasons"] if "charge failed" in r]
        assert reason.endswith(
            f": charge failed ({FAILURE}) and is restarting (failure 1 in the window)"
        )

        ids = [transaction_id("acme", r.usage_id) for r in records]
        wait_for(
            lambda: worker.alive() and all(_charged(ledger, t) for t in ids),
            timeout=90,
            what="the restarted charge role to charge every reservation",
        )
        stats = wait_for(
            lambda: (
                (s := _charge_stats(probe.report()))["push"]["charged"] >= len(ids)
                and s["charge"]["scheduled"] >= 1  # by the restarted role: the first poll raised
                and s
            ),
            what="the heartbeat to report the charges",
        )
        assert stats["restarts"] == {"charge": 1} and stats["restarting"] == {}
        assert _restarts(settings.health_port) == 1
        assert worker.alive()
    finally:
        code = worker.stop()
    assert code == 0, worker.stderr()[-3000:]
    [restart] = worker.lines("role failed, restarting")
    assert (restart["role"], restart["reason"], restart["failures"]) == ("charge", FAILURE, 1)
    assert 2.0 <= restart["restart_in_s"] <= 4.0
