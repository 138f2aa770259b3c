"""The alerting rules and the metrics, as Prometheus's own checker reads them.

``promtool`` (``tests/promtool.py``: installed by ``make test``) checks
``infra/alerts.yml``, runs its unit tests (``infra/alerts.test.yml``: for each alert,
series that fire it and series that must not), and lints what a real worker serves at
``/metrics`` and what ``billing-ledger audit --metrics-file`` writes.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from adapters.bootstrap import build_projector, migrate, open_ledger, prepare
from adapters.settings import Settings
from infra.embedded import free_port
from tests.conftest import settings_env
from tests.integration.support import produce, usage, wait_for
from tests.promtool import promtool

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "adapters.cli"]


def test_the_alerting_rules_are_rules_prometheus_loads() -> None:
    checked = promtool("check", "rules", "infra/alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 6 rules found" in checked.stdout


def test_the_prometheus_configuration_loads_the_rules() -> None:
    checked = promtool("check", "config", "infra/prometheus.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 1 rule files found" in checked.stdout


def test_each_alert_fires_on_its_series_and_stays_quiet_below_its_threshold() -> None:
    tested = promtool("test", "rules", "infra/alerts.test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_a_running_worker_serves_metrics_promtool_finds_no_fault_in(
    charge_settings: Settings,
) -> None:
    """A real ``billing-ledger run``: records charged and one dead letter, so its
    counters, histograms and queue gauges all have samples, then ``check metrics``."""
    settings = charge_settings.model_copy(update={"heartbeat_interval_s": 0.5})
    migrate(settings)
    prepare(settings)
    port = free_port()
    worker = subprocess.Popen(
        [*CLI, "run", "--health-port", str(port), "--log-level", "WARNING"],
        env=settings_env(settings),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _get(port, "/healthz") is not None, what="the health server")
        records = [usage(f"p-{i}", customer=f"cust-{i % 2}") for i in range(4)]
        produce(
            settings,
            [*((r.customer_id.encode(), r.to_json()) for r in records), (b"cust-0", b"{bad")],
        )
        text = wait_for(
            lambda: (
                (t := _get(port, "/metrics") or "")
                and "billing_transactions_charged_total 4.0" in t
                and "billing_dead_letters_total 1.0" in t
                and "billing_backlog{" in t
                and t
            ),
            what="4 charges, a dead letter and the queue gauges in /metrics",
        )
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=60)
        print(err[-4000:])  # shown when the test fails
    checked = promtool("check", "metrics", stdin=text)
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, ""), text


def test_the_audit_writes_series_promtool_finds_no_fault_in(
    settings: Settings, tmp_path: Path
) -> None:
    migrate(settings)
    with open_ledger(settings) as ledger, build_projector(settings, ledger) as projector:
        projector.pump_all()  # migrate's price book applied: a clean audit has nothing to say
    written = tmp_path / "audit.prom"
    audited = subprocess.run(
        [*CLI, "audit", "--metrics-file", str(written)],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert audited.returncode == 0, audited.stdout + audited.stderr
    text = written.read_text()
    assert "billing_audit_last_run_timestamp_seconds" in text
    assert "billing_audit_findings{" not in text  # nothing found: no series to alert on
    checked = promtool("check", "metrics", stdin=text)
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, ""), text


def _get(port: int, path: str) -> str | None:
    """The body of ``GET path`` (None while the server does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return str(resp.read().decode())
    except (urllib.error.URLError, OSError):
        return None
