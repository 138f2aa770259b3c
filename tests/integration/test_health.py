"""Queue health, the health server and the metrics, against what a test set up."""

from __future__ import annotations

import gc
import json
import re
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from adapters.bootstrap import build_projector, build_pusher, migrate, open_ledger, prepare
from adapters.observability.health_server import HealthProbe, HealthServer
from adapters.observability.heartbeat import Heartbeat
from adapters.settings import Settings
from adapters.stripe.breaker import CircuitBreaker
from domain.metering import Metering
from domain.saga import StepResult
from domain.transaction import Source
from infra.embedded import free_port
from infra.stripe_emulator import StripeEmulator
from projections.queue_health import write_settings
from store.connections import Database
from store.dead_letters import DeadLetter, DeadLetterStore
from store.ledger import BillingLedger
from tests.conftest import settings_env
from tests.integration.support import line_of, produce, usage, wait_for

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "adapters.cli"]


@pytest.fixture
def health_settings(charge_settings: Settings) -> Settings:
    return charge_settings.model_copy(update={"heartbeat_interval_s": 0.5})


@pytest.fixture
def ledger(health_settings: Settings) -> Iterator[BillingLedger]:
    migrate(health_settings)
    prepare(health_settings)
    with open_ledger(health_settings) as app:
        yield app


TOKEN = "test-token-0123456789"


def _get(port: int, path: str, token: str | None = TOKEN) -> tuple[int, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310 (http only)
            status, body, kind = resp.status, resp.read(), resp.headers["Content-Type"]
    except urllib.error.HTTPError as exc:
        status, body, kind = exc.code, exc.read(), exc.headers["Content-Type"]
    return status, json.loads(body) if kind == "application/json" else body.decode()


def _headers(port: int, path: str) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    request.add_header("Authorization", f"Bearer {TOKEN}")
    with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310 (http only)
        return resp.headers


def _queue_health(url: str) -> dict[str, Any]:
    with psycopg.connect(url) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        row = cur.execute("SELECT * FROM billing.queue_health").fetchone()
    assert row is not None
    return row


def _set_up_trouble(
    settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> dict[str, Any]:
    """One line pushed; one line whose push got no answer, due again at once; one due
    in an hour; two reservations of a line left alone; one dead letter; a worker whose
    circuit breaker is open, one silent for a minute, one dead for hours; a lag row
    nobody refreshed."""
    customers = ["acme", "slow", "patient", "idle", "idle"]
    batch = [
        Metering(usage(f"{c}-{i}", customer=c), Source("usage", 0, i))
        for i, c in enumerate(customers)
    ]
    txns = [t.id for t in ledger.record_usage(batch).transactions]
    pusher = build_pusher(settings, ledger)
    assert pusher.push(line_of(ledger, txns[0])).result is StepResult.CHARGED
    emulator.set_faults(drop_response_after_execute=1)
    assert pusher.push(line_of(ledger, txns[1])).result is StepResult.RETRY
    patient = build_pusher(
        settings.model_copy(update={"retry_base_s": 3600.0, "retry_max_delay_s": 3600.0}), ledger
    )
    emulator.set_faults(drop_response_after_execute=1)
    assert patient.push(line_of(ledger, txns[2])).result is StepResult.RETRY  # not due soon
    DeadLetterStore(Database(settings.database_url)).record(
        [DeadLetter("usage", 0, 99, None, b"{not json", "invalid JSON: expecting a value")]
    )
    breaker = CircuitBreaker(fail_max=1, reset_s=3600)
    with pytest.raises(ConnectionError):
        breaker.call(lambda: (_ for _ in ()).throw(ConnectionError("Stripe down")))
    with psycopg.connect(settings.database_url) as conn:
        conn.execute(
            "INSERT INTO billing.workers VALUES"
            " ('gone:1:ingest', '{ingest}', 'gone', 1, now() - interval '3 hours',"
            "  now() - interval '2 hours', NULL, '{}'),"  # forgotten by the next heartbeat
            " ('quiet:2:relay', '{relay}', 'quiet', 2, now() - interval '1 hour',"
            "  now() - interval '1 minute', NULL, '{}')"  # silent: reported
        )
        conn.execute(
            "INSERT INTO billing.consumer_lag VALUES"
            " ('old-group', 'usage', 0, 10, 510, 500, now() - interval '10 minutes')"
        )
    heartbeat = Heartbeat(
        settings, Database(settings.database_url), ["reconcile"], breakers=[breaker]
    )
    heartbeat.beat_once()
    with build_projector(settings, ledger) as projector:
        projector.pump_all()
    return {"txns": txns, "worker": heartbeat.beat.worker_id}


def test_queue_health_and_the_health_endpoint_report_what_a_test_set_up(
    health_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    url = health_settings.database_url
    setup = _set_up_trouble(health_settings, ledger, emulator)

    # Time passes: the reservations go stale (those of failing lines are named as such).
    row = wait_for(
        lambda: (h := _queue_health(url))["stale_reserved"] == 2 and h,
        what="stale reservations",
    )
    assert (row["backlog_metered"], row["backlog_reserved"], row["backlog_charge_failed"]) == (
        0,
        4,
        0,
    )
    assert (row["lines_unsent"], row["lines_failing"], row["lines_past_deadline"]) == (3, 2, 0)
    # acme: customer, draft, item; slow and patient: one call each, unanswered
    assert row["oldest_unsent_age_s"] > 0 and row["stripe_requests_last_hour"] == 5
    assert row["oldest_open_age_s"] > 0 and row["past_deadline"] == 0
    assert row["dead_letters_last_hour"] == 1
    assert (row["stripe_errors_1m"], row["stripe_errors_5m"], row["stripe_errors_15m"]) == (2, 2, 2)
    assert row["stripe_errors_by_class"] == {"connection": {"1m": 2, "5m": 2, "15m": 2}}
    assert row["charges_last_minute"] == 1
    assert (row["workers_alive"], row["workers_silent"], row["breakers_not_closed"]) == (1, 1, 1)
    assert row["max_consumer_lag"] == 0  # the only lag row is ten minutes old
    assert row["projector_behind"] == 0

    with psycopg.connect(url) as conn:
        stuck = dict(
            conn.execute("SELECT transaction_id, stuck_because FROM billing.stuck_transactions")
        )
        workers = [r[0] for r in conn.execute("SELECT worker_id FROM billing.workers ORDER BY 1")]
    txns = setup["txns"]
    assert stuck == {
        txns[1]: "its line is failing to reach Stripe",
        txns[2]: "its line is failing to reach Stripe",
        txns[3]: "not charged after stale_after_s",
        txns[4]: "not charged after stale_after_s",
    }
    assert workers == sorted([setup["worker"], "quiet:2:relay"])  # "gone" was forgotten

    with HealthServer(HealthProbe(health_settings, cache_s=0), "127.0.0.1", 0) as server:
        status, body = _get(server.port, "/health")
        assert status == 200 and body["status"] == "degraded"
        silent = [r for r in body["reasons"] if r.startswith("worker quiet:2:relay silent since")]
        assert set(body["reasons"]) - set(silent) == {
            f"Stripe circuit breaker open in worker {setup['worker']}",
            "2 invoice line(s) failing to reach Stripe",
            "2 reserved transaction(s) not charged",
            "2 Stripe error(s) in 5 min (connection: 2)",  # one dead letter is no incident
        }
        assert len(silent) == 1
        by_id = {w["worker_id"]: w for w in body["workers"]}
        assert by_id[setup["worker"]]["breaker_state"] == "open"
        assert by_id[setup["worker"]]["alive"] and not by_id["quiet:2:relay"]["alive"]
        assert [(r["group_name"], r["fresh"]) for r in body["consumer_lag"]] == [
            ("old-group", False)
        ]

        with psycopg.connect(url, autocommit=True) as conn:  # the horizon is now behind them
            write_settings(
                conn,
                retry_horizon_s=0,
                reconcile_interval_s=0,
                stale_after_s=0.2,
                heartbeat_timeout_s=60,
            )
        status, body = _get(server.port, "/health")
        assert status == 503 and body["status"] == "failing"
        assert body["reasons"][:2] == [
            "4 transaction(s) past their deadline",
            "2 invoice line(s) failing to reach Stripe for longer than the retry horizon",
        ]

        assert _get(server.port, "/healthz") == (200, {"status": "alive"})
        assert _get(server.port, "/readyz") == (200, {"database": "ok", "broker": "ok"})


def test_a_worker_beats_while_the_broker_is_down_and_says_why_its_lag_is_missing(
    health_settings: Settings,
) -> None:
    migrate(health_settings)
    prepare(health_settings, topics=False)
    down = health_settings.model_copy(update={"kafka_bootstrap": f"127.0.0.1:{free_port()}"})
    heartbeat = Heartbeat(down, Database(down.database_url), ["ingest"])
    stop = threading.Event()
    beating = threading.Thread(target=heartbeat.run, args=(stop,))
    beating.start()
    url = health_settings.database_url

    def stats() -> dict[str, Any] | None:
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT stats FROM billing.workers WHERE worker_id = %s",
                (heartbeat.beat.worker_id,),
            ).fetchone()
        return row[0] if row and "lag_error" in row[0] else None

    try:
        error = wait_for(stats, what="a heartbeat naming the lag error")["lag_error"]
        assert "Connection refused" in error
        row = _queue_health(url)
        assert (row["workers_alive"], row["workers_silent"]) == (1, 0)
    finally:
        stop.set()
        beating.join(60)
    with psycopg.connect(url) as conn:  # stopped cleanly: signed off
        assert conn.execute("SELECT count(*) FROM billing.workers").fetchone() == (0,)
    gc.collect()  # a socket left unclosed would warn here (warnings are errors)


def test_the_health_server_refuses_bad_parameters_and_reports_an_unreachable_broker(
    health_settings: Settings, ledger: BillingLedger
) -> None:
    url = health_settings.database_url
    recorded = ledger.record_usage(
        [Metering(usage(f"b-{i}"), Source("usage", 0, i)) for i in range(3)]
    )
    held = sum(t.amount for t in recorded.transactions)
    # Opened + AmountsReserved of the account, Metered + Reserved of each transaction,
    # Opened + Settled of their line, Opened of its invoice, and Opened + Published of
    # the price book migrate started
    assert _queue_health(url)["projector_behind"] == 13
    with build_projector(health_settings, ledger) as projector:
        projector.pump_all()
    assert _queue_health(url)["projector_behind"] == 0
    with psycopg.connect(url) as conn:
        before = conn.execute("SELECT * FROM billing.transactions ORDER BY 1").fetchall()

    with HealthServer(HealthProbe(health_settings), "127.0.0.1", 0, token=TOKEN) as server:
        status, rows = _get(server.port, "/transactions?customer=acme&state=reserved&limit=2")
        assert status == 200 and len(rows) == 2
        _, last = _get(server.port, "/transactions?customer=acme&state=reserved&limit=3")
        assert [r["transaction_id"] for r in last[:2]] == [r["transaction_id"] for r in rows]
        cursor = _headers(server.port, "/transactions?customer=acme&limit=2")["X-Next-After"]
        status, rest = _get(server.port, f"/transactions?customer=acme&limit=2&after={cursor}")
        assert status == 200 and [r["transaction_id"] for r in rest] == [last[2]["transaction_id"]]
        for path in ("/transactions", "/balances?customer=acme"):
            assert _get(server.port, path, token=None)[0] == 401
            assert _get(server.port, path, token="wrong")[0] == 401
        assert {r["usage_id"] for r in rows} <= {"b-0", "b-1", "b-2"}
        status, rows = _get(server.port, "/balances?customer=acme")
        assert status == 200 and [(r["customer_id"], r["in_flight"]) for r in rows] == [
            ("acme", str(held))  # exact amounts: decimal text in JSON
        ]
        refusals = {
            "/transactions?state=stuck": "unknown state 'stuck'",
            "/transactions?customer=acme%27%20OR%20%271%27=%271": "invalid customer",
            "/transactions?limit=1;DROP%20TABLE%20billing.transactions": "invalid limit",
            "/transactions?limit=0": "invalid limit 0",
            "/transactions?customer=acme&customer=x": "more than once",
            "/transactions?sort=amount": "unknown parameter(s) sort",
            "/health?verbose=1": "unknown parameter(s) verbose",
        }
        for path, reason in refusals.items():
            status, body = _get(server.port, path)
            assert status == 400 and reason in body["error"], (path, body)
        assert _get(server.port, "/nope")[0] == 404

    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT * FROM billing.transactions ORDER BY 1").fetchall() == before

    unreachable = health_settings.model_copy(update={"kafka_bootstrap": f"127.0.0.1:{free_port()}"})
    with HealthServer(HealthProbe(unreachable), "127.0.0.1", 0) as server:
        status, body = _get(server.port, "/readyz")
    assert status == 503 and body["database"] == "ok" and "Connection refused" in body["broker"]


def _series(text: str) -> dict[str, float]:
    """Prometheus text as {'name{labels}': value}."""
    series = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            series[name] = float(value)
    return series


def _sample(series: dict[str, float], name: str, **labels: str) -> float | None:
    """The sample of ``name`` whose labels include ``labels`` (None when there is none)."""
    for key, value in series.items():
        metric, _, rest = key.partition("{")
        got = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if metric == name and all(got.get(k) == v for k, v in labels.items()):
            return value
    return None


def _value(series: dict[str, float], name: str, **labels: str) -> float:
    """The sample of ``name`` with ``labels``; fails when the series is not exposed."""
    value = _sample(series, name, **labels)
    assert value is not None, f"no sample of {name} {labels}"
    return value


def test_metrics_expose_the_named_series_with_the_right_values_after_a_known_workload(
    health_settings: Settings, emulator: StripeEmulator
) -> None:
    """A real ``billing-ledger run`` process: 12 records for 3 customers and 2 bad ones."""
    migrate(health_settings)
    prepare(health_settings)
    port = free_port()
    env = settings_env(health_settings)
    env["BILLING_LEDGER_STALE_AFTER_S"] = "60"  # only the process manager charges here
    env["BILLING_LEDGER_SETTLE_INTERVAL_S"] = "0.2"  # a failing line is tried again soon
    worker = subprocess.Popen(
        [*CLI, "run", "--health-port", str(port), "--log-level", "WARNING"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _reachable(port), what="the health server")
        records = [usage(f"m-{i}", customer=f"cust-{i % 3}") for i in range(12)]
        produce(
            health_settings,
            [*((r.customer_id.encode(), r.to_json()) for r in records),
             (b"cust-0", b"{not json"), (b"cust-1", b'{"usage_id": "x"}')],
        )  # fmt: skip
        series = wait_for(
            lambda: (
                (_sample(s := _metrics(port), "billing_transactions_charged_total") or 0) >= 12
                and s
            ),
            what="12 charges in /metrics",
        )
        assert _value(series, "billing_ingest_records_total", outcome="reserved") == 12
        assert _value(series, "billing_ingest_records_total", outcome="dead_letter") == 2
        assert _sample(series, "billing_ingest_records_total", outcome="duplicate") is None
        assert _value(series, "billing_dead_letters_total") == 2
        assert _value(series, "billing_transactions_charged_total") == 12
        assert _value(series, "billing_charge_steps_total", result="pushed") >= 3  # a line each
        assert _sample(series, "billing_charge_retries_total") is None  # none yet
        create = {"operation": "invoice_items.create", "outcome": "ok"}
        assert _value(series, "billing_stripe_requests_total", **create) == 3  # one per line
        assert _value(series, "billing_stripe_request_duration_seconds_count", **create) == 3
        assert _value(series, "billing_stripe_requests_total", operation="customers.create") == 3
        assert _value(series, "billing_stripe_requests_total", operation="invoices.create") == 3
        assert _value(series, "billing_charge_latency_seconds_count") == 12
        assert _value(series, "billing_breaker_state", client="stripe-1") == 0
        assert len(emulator.live_invoice_items()) == 3

        # The gauges come from queue_health once the projector and the heartbeat caught up.
        def settled() -> dict[str, float] | None:
            s = _metrics(port)
            lag = _sample(s, "billing_consumer_lag", group=health_settings.ingest_group)
            done = _sample(s, "billing_backlog", state="reserved") == 0
            return s if done and lag == 0 else None

        series = wait_for(settled, what="backlog 0 and the ingest lag recorded")
        assert _value(series, "billing_backlog", state="charge_failed") == 0
        assert _value(series, "billing_retries_due") == 0

        # The breaker opens in an outage: the transition is counted and /health says why.
        emulator.set_faults(outage=True)
        produce(
            health_settings,
            [(b"cust-0", usage(f"o-{i}", customer="cust-0").to_json()) for i in range(8)],
        )
        opened = {"from_state": "closed", "to_state": "open"}
        series = wait_for(
            lambda: (
                _sample(s := _metrics(port), "billing_breaker_transitions_total", **opened)
                and (_sample(s, "billing_charge_retries_total") or 0)
                >= 7  # 5 open it, then refused
                and s
            ),
            what="the breaker to open and the pushes to fail",
        )
        assert _value(series, "billing_stripe_requests_total", outcome="http_503") >= 5
        # A push our open breaker would refuse is not sent at all (no attempt, no backoff):
        # the pushes wait for its probe instead of counting refused calls.
        report = wait_for(
            lambda: (b := _get(port, "/health")[1])["breakers_not_closed"] and b,
            what="the heartbeat to report the open breaker",
        )
        assert report["status"] == "degraded"
        assert any(r.startswith("Stripe circuit breaker") for r in report["reasons"])
        (live,) = [w for w in report["workers"] if w["alive"]]  # every role's loop turns
        ages = live["stats"]["loop_age_s"]
        roles = {"ingest", "relay", "relay-alerts", "project", "project-credits", "charge"}
        roles |= {"reconcile", "push"}
        roles |= {"close", "alerts"}
        assert set(ages) == roles
        assert all(age < 60 for age in ages.values()), ages

        # Every series the Grafana dashboard queries is one this process exposes.
        exposed = {key.partition("{")[0] for key in _metrics(port)}
        assert _dashboard_metrics() <= exposed, _dashboard_metrics() - exposed
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=60)
        print(err[-4000:])  # shown when the test fails
    assert worker.returncode == 0, err[-2000:]
    with psycopg.connect(health_settings.database_url) as conn:  # stopped cleanly: signed off
        assert conn.execute("SELECT worker_id FROM billing.workers").fetchall() == []
    # Ours, that is: kafka-python 3 may log a socket it closed itself while stopping.
    ours = [line for line in err.splitlines() if '"logger": "kafka.' not in line]
    assert not [line for line in ours if "Traceback" in line], err[-2000:]


def _metrics(port: int) -> dict[str, float]:
    status, text = _get(port, "/metrics")
    assert status == 200, text
    return _series(text)


def _dashboard_metrics() -> set[str]:
    dashboard = Path(__file__).resolve().parents[2] / "infra/grafana/dashboards/billing-ledger.json"
    panels = json.loads(dashboard.read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    names = {n for e in exprs for n in re.findall(r"\bbilling_[a-z0-9_]+", e)}
    assert len(panels) >= 10 and len(names) >= 10
    return names


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def _reachable(port: int) -> bool:
    try:
        return _get(port, "/healthz")[0] == 200
    except OSError:
        return False


def test_the_health_command_shows_the_figures_as_a_table_json_and_live(
    health_settings: Settings,
) -> None:
    migrate(health_settings)
    prepare(health_settings, topics=False)
    env = settings_env(health_settings)
    quiet = _cli("health", env=env)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.startswith("status: ok\n") and "backlog: reserved" in quiet.stdout

    DeadLetterStore(Database(health_settings.database_url)).record(
        [DeadLetter("usage", 1, 5, b"k", b"[]", "not an object")]
    )
    one = _cli("health", "--json", env=env)
    assert one.returncode == 0, one.stdout  # one bad record is not an incident
    assert json.loads(one.stdout)["dead_letters_last_hour"] == 1
    env["BILLING_LEDGER_HEALTH_MAX_DEAD_LETTERS_PER_HOUR"] = "0"  # a rate above the threshold
    shown = _cli("health", "--json", env=env)
    assert shown.returncode == 1  # not ok: scripts can tell
    report = json.loads(shown.stdout)
    assert (report["status"], report["reasons"]) == (
        "degraded",
        [
            "1 dead letter(s) in the last hour (more than 0): `billing-ledger dead-letters list`"
            " says why"
        ],
    )
    assert report["dead_letters_last_hour"] == 1

    with subprocess.Popen(
        [*CLI, "health", "--watch", "0.1"], env=env, stdout=subprocess.PIPE, text=True
    ) as watch:
        assert watch.stdout is not None
        seen = 0
        for line in watch.stdout:  # two refreshes, then SIGTERM stops it like Ctrl-C
            seen += line.startswith("status: degraded")
            if seen == 2:
                break
        watch.terminate()
        assert watch.wait(timeout=30) == 0 and seen == 2  # stopping a watch is its end

    down = {**env, "BILLING_LEDGER_DATABASE_URL": f"postgresql://x@127.0.0.1:{free_port()}/x"}
    failing = _cli("health", env=down)
    assert failing.returncode == 1 and "Traceback" not in failing.stderr
    assert failing.stdout.splitlines()[0] == "status: failing"
    assert failing.stdout.splitlines()[1].startswith("  - database unreachable:")


def test_idle_and_trickling_sockets_do_not_stop_healthz(settings: Settings) -> None:
    """The stdlib server answered 8 requests at a time: 8 idle sockets stopped every
    probe. Now 16 idle and 8 trickling connections stay open while /healthz answers,
    with no-store, nosniff, compact JSON and no version in a Server header."""
    with HealthServer(HealthProbe(settings), "127.0.0.1", 0, token=TOKEN) as server:
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(16)]
        trickling = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(8)]
        try:
            for sock in trickling:
                sock.sendall(b"GET /health")  # a head that never ends
            for _ in range(3):
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{server.port}/healthz", timeout=10
                ) as resp:
                    assert resp.status == 200
                    assert resp.read() == b'{"status":"alive"}'
                    assert resp.headers["Cache-Control"] == "no-store"
                    assert resp.headers["X-Content-Type-Options"] == "nosniff"
                    assert resp.headers["Server"] is None
        finally:
            for sock in idle + trickling:
                sock.close()
