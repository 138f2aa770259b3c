"""Schema migrations against a real PostgreSQL: applied once, in order, recorded;
adopting a database an earlier version prepared, without stopping its writers; refusing
an edited migration and a database ahead of the build; concurrent runs; lock waits
retried; workers that wait for ``migrate``, refuse a newer schema and run no DDL; rebuilds
that keep the migrated shape."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from adapters.bootstrap import build_projector, migrate, open_ledger, schema_status
from adapters.settings import Settings
from infra.stripe_emulator import StripeEmulator
from projections.projector import PROJECTIONS, rebuild
from projections.queue_health import read_health
from projections.transactions import COLUMNS as TRANSACTION_COLUMNS
from store import schema
from store.connections import Database
from store.errors import MigrationChanged, MigrationLocked, SchemaAhead
from store.migrations.runner import migrate as run_migrations
from store.migrations.status import AppliedMigration, Migration, migrations, read_applied
from tests.conftest import settings_env
from tests.integration.catalog import schema_shape
from tests.integration.legacy import (
    LEGACY_SQL,
    legacy_prepare,
    old_stripe_item,
    version_1_history,
)
from tests.integration.support import mixed_workload, record, wait_for

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "adapters.cli"]
LATEST = migrations()[-1].number


@pytest.fixture
def new_database(pg_server_url: str) -> Iterator[Callable[[], str]]:
    """Makes more empty databases for a test (dropped at its end)."""
    made: list[str] = []

    def make() -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        made.append(name)
        return psycopg.conninfo.make_conninfo(pg_server_url, dbname=name)

    yield make
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        for name in made:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _applied(url: str) -> tuple[AppliedMigration, ...]:
    with psycopg.connect(url) as conn:
        return read_applied(conn)


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        env=settings_env(settings),
        timeout=120,
        check=False,
    )


def _migrate_with(url: str, known: list[Migration], **kwargs: Any) -> list[AppliedMigration]:
    with psycopg.connect(url, autocommit=True) as conn:
        return run_migrations(conn, known, **kwargs)


def _relation_exists(url: str, name: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
    return bool(row and row[0])


# -- migrate ----------------------------------------------------------------------------


def test_migrate_on_an_empty_database_applies_each_migration_once_and_records_it(
    settings: Settings,
) -> None:
    done = migrate(settings)
    assert [(m.number, m.name) for m in done] == [(m.number, m.name) for m in migrations()]
    rows = _applied(settings.database_url)
    assert [(r.number, r.name, r.checksum) for r in rows] == [
        (m.number, m.name, m.checksum) for m in migrations()
    ]
    assert all(r.applied_at is not None and r.duration_s > 0 for r in rows)
    status = schema_status(settings)
    assert (status.version, status.problem()) == (LATEST, "")
    names = [
        f"public.{schema.EVENTS_TABLE}",
        f"public.{schema.SNAPSHOTS_TABLE}",
        *(
            f"{schema.SCHEMA}.{t}"
            for t in (
                schema.CONSUMER_POSITIONS, schema.RELAY_POSITION, schema.PROJECTION_POSITIONS,
                schema.DEAD_LETTERS, schema.WORKERS, schema.CONSUMER_LAG, schema.HEALTH_SETTINGS,
                schema.SCHEMA_MIGRATIONS, "queue_health", "stuck_transactions",
                schema.WEBHOOK_ENDPOINTS, schema.WEBHOOK_DELIVERIES,
                *(p.name for p in PROJECTIONS),
            )
        ),
    ]  # fmt: skip
    assert [n for n in names if not _relation_exists(settings.database_url, n)] == []


def test_migrate_again_applies_nothing_and_changes_no_row(settings: Settings) -> None:
    migrate(settings)
    before = _applied(settings.database_url)
    assert migrate(settings) == []
    assert _applied(settings.database_url) == before


def test_migration_one_makes_exactly_the_schema_the_old_prepare_made(
    settings: Settings, new_database: Callable[[], str]
) -> None:
    _migrate_with(settings.database_url, list(migrations()[:1]))
    legacy = settings.model_copy(update={"database_url": new_database()})
    legacy_prepare(legacy)
    migrated = schema_shape(settings.database_url, without=(schema.SCHEMA_MIGRATIONS,))
    assert migrated == schema_shape(legacy.database_url)
    assert sum(len(rows) for rows in migrated.values()) > 200  # the comparison saw a schema


def test_an_old_database_with_history_is_adopted_without_stopping_its_writers_then_upgraded(
    stripe_settings: Settings, emulator: StripeEmulator, new_database: Callable[[], str]
) -> None:
    """A database of the last release before migrations: version-1 events, its read
    models in their old shape (integer amounts, no lines) at the end of the log, and
    dead letters without counts. Migration 1 adopts it while a writer of each hot table
    holds its lock; migration 2 remakes the read models with their rows, which are then
    what the projector makes of the same history, counts the dead letters, and leaves a
    schema identical to a new database's; the audit against Stripe is clean and a
    rebuild changes nothing."""
    url = stripe_settings.database_url
    history = version_1_history(old_stripe_item(emulator))
    # What today's projector makes of that history, in a database of its own.
    scratch = stripe_settings.model_copy(update={"database_url": new_database()})
    migrate(scratch)
    with open_ledger(scratch) as ledger, build_projector(scratch, ledger) as projector:
        ledger.recorder.insert_events(history)
        projector.pump_all()
    expected = _read_models(scratch.database_url)
    assert len(expected["transactions"]) == 2 and expected["invoice_lines"] == []

    legacy_prepare(stripe_settings)
    with open_ledger(stripe_settings) as ledger:
        ledger.recorder.insert_events(history)
    _write_old_read_models(url, expected)
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO billing.dead_letters (source_topic, source_partition, source_offset,"
            " record_key, payload, reason) SELECT 'usage', 0, n, NULL, '[]', 'not an object'"
            " FROM generate_series(1, 3) n"
        )

    first, *later = migrations()
    with psycopg.connect(url) as writer:
        for table in (schema.EVENTS_TABLE, "billing.dead_letters", "billing.transactions"):
            writer.execute(sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(sql.SQL(table)))
        adopted = _migrate_with(url, [first], lock_timeout_s=0.5, attempts=1)
        writer.rollback()
    assert [m.number for m in adopted] == [1]
    upgraded = _migrate_with(url, list(migrations()))
    assert [m.number for m in upgraded] == [m.number for m in later]

    assert _read_models(url) == expected  # exact amounts, no line: the same rows
    fresh = new_database()
    migrate(stripe_settings.model_copy(update={"database_url": fresh}))
    assert schema_shape(url) == schema_shape(fresh)
    with psycopg.connect(url) as conn:
        health = read_health(conn)
        counted = conn.execute(
            "SELECT source_topic, reason_code, letters FROM billing.dead_letter_counts"
        ).fetchall()
    assert counted == [("usage", "invalid", 3)]
    assert (health["dead_letters_total"], health["projector_behind"]) == (3, 0)
    assert _migrate_with(url, list(migrations())) == []  # counted once

    audit = _cli(stripe_settings, "audit", "--stripe", "--json")
    assert (audit.returncode, json.loads(audit.stdout)["findings"]) == (0, []), audit.stderr
    rebuilt = _cli(stripe_settings, "rebuild", "--all")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert _read_models(url) == expected
    assert schema_shape(url) == schema_shape(fresh)


def _write_old_read_models(url: str, rows: dict[str, list[tuple[Any, ...]]]) -> None:
    """``rows`` (of today's read models) in the old shape, at the end of the log, as the
    projector of the last release left them."""
    newer = ("line_id", "line_sequence", "price_version")  # columns of later migrations
    txn_columns = [c for c in TRANSACTION_COLUMNS if c not in newer]
    with psycopg.connect(url) as conn:
        for row in rows["transactions"]:
            values = dict(zip(TRANSACTION_COLUMNS, row, strict=True))
            conn.execute(
                sql.SQL("INSERT INTO billing.transactions ({}) VALUES ({})").format(
                    sql.SQL(", ").join(map(sql.Identifier, txn_columns)),
                    sql.SQL(", ").join(sql.Placeholder() * len(txn_columns)),
                ),
                [int(v) if c == "amount" else v for c, v in values.items() if c in txn_columns],
            )
        for b in rows["customer_balances"]:
            (customer, currency, metered, charged, compensated, _, txns, refused, limit, _,
             updated) = b  # fmt: skip
            conn.execute(
                "INSERT INTO billing.customer_balances (customer_id, currency, metered, charged,"
                " compensated, transactions, refused, spend_limit, updated_at)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (customer, currency, int(metered), int(charged), int(compensated), txns,
                 refused, limit, updated),
            )  # fmt: skip
        for a in rows["charge_attempts"]:
            conn.execute(
                sql.SQL("INSERT INTO billing.charge_attempts VALUES ({})").format(
                    sql.SQL(", ").join(sql.Placeholder() * len(a))
                ),
                a,
            )
        conn.execute(
            "UPDATE billing.projection_positions p SET xid = e.xid,"
            " notification_id = e.notification_id"
            " FROM (SELECT xid, notification_id FROM billingledger_events"
            "       ORDER BY xid DESC, notification_id DESC LIMIT 1) e"
        )


def test_the_old_statements_would_have_waited_for_those_writers(settings: Settings) -> None:
    """The control of the test above: what ``prepare()`` ran at every start blocks on a
    writer's open transaction (ALTER TABLE ... IF NOT EXISTS locks even when done)."""
    legacy_prepare(settings)
    with (
        psycopg.connect(settings.database_url) as writer,
        psycopg.connect(settings.database_url, autocommit=True) as starter,
    ):
        writer.execute(
            sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(sql.SQL("billingledger_events"))
        )
        starter.execute("SET lock_timeout = '300ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            starter.execute(LEGACY_SQL.encode())
        writer.rollback()


def _read_models(url: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {
            p.name: conn.execute(
                sql.SQL("SELECT * FROM {} ORDER BY 1, 2").format(sql.Identifier("billing", p.name))
            ).fetchall()
            for p in PROJECTIONS
        }


def test_an_applied_migration_that_was_edited_is_refused_and_nothing_runs(
    settings: Settings,
) -> None:
    migrate(settings)
    first, *rest = migrations()
    edited = Migration(first.number, first.name, first.sql + "\nDROP TABLE billing.workers;\n")
    extra = Migration(LATEST + 1, "more", "CREATE TABLE billing.more (x int);")
    with pytest.raises(MigrationChanged, match="migration 1 initial was applied with checksum"):
        _migrate_with(settings.database_url, [edited, *rest, extra])
    assert _relation_exists(settings.database_url, "billing.workers")
    assert not _relation_exists(settings.database_url, "billing.more")
    status = _cli(settings, "migrate", "--status")
    assert status.returncode == 0 and "current" in status.stdout  # this build's files agree


def test_a_database_a_newer_build_migrated_is_refused_by_migrate_and_by_workers(
    settings: Settings,
) -> None:
    newer = Migration(LATEST + 1, "from_a_newer_build", "CREATE TABLE billing.newer (x int);")
    _migrate_with(settings.database_url, [*migrations(), newer])
    with pytest.raises(SchemaAhead, match=f"schema is at {LATEST + 1}, newer than this build"):
        migrate(settings)
    status = _cli(settings, "migrate", "--status")
    assert status.returncode == 1
    assert f"{LATEST + 1}  from_a_newer_build" in status.stdout
    worker = _cli(settings, "run", "--role", "project")
    assert worker.returncode == 1
    assert f"error: the database's schema is at {LATEST + 1}, newer" in worker.stderr
    assert "Traceback" not in worker.stderr


def test_concurrent_migrates_apply_each_migration_exactly_once(settings: Settings) -> None:
    slow = Migration(LATEST + 1, "slow", "SELECT pg_sleep(0.3); CREATE TABLE billing.slow (x int);")
    known = [*migrations(), slow]
    start = threading.Barrier(4)
    results: list[list[AppliedMigration]] = []
    errors: list[BaseException] = []

    def run() -> None:
        start.wait()
        try:
            results.append(_migrate_with(settings.database_url, known))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    applied = sorted(m.number for done in results for m in done)
    assert applied == [m.number for m in known]  # each once, by one of the four
    assert [r.number for r in _applied(settings.database_url)] == [m.number for m in known]


def test_a_migration_waiting_for_a_lock_gives_up_says_so_and_retries_until_it_gets_it(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    migrate(settings)
    alter = Migration(
        LATEST + 1, "add_a_column", "ALTER TABLE billingledger_events ADD COLUMN x int;"
    )
    known = [*migrations(), alter]
    url = settings.database_url
    done: list[list[AppliedMigration]] = []
    with psycopg.connect(url) as writer, caplog.at_level("WARNING", logger="store.migrations"):
        writer.execute("LOCK TABLE billingledger_events IN ROW EXCLUSIVE MODE")  # a long insert
        with pytest.raises(MigrationLocked, match="could not take its locks in 2 attempts"):
            _migrate_with(url, known, lock_timeout_s=0.05, attempts=2, sleep=lambda s: None)
        assert [r.number for r in _applied(url)] == [m.number for m in migrations()]
        caplog.clear()
        runner = threading.Thread(
            target=lambda: done.append(_migrate_with(url, known, lock_timeout_s=0.1, attempts=1000))
        )
        runner.start()
        wait_for(
            lambda: sum("retrying in" in r.getMessage() for r in caplog.records) >= 2,
            what="the migration to say it is retrying",
        )
        writer.rollback()  # the long transaction ends
        runner.join(60)
    assert [m.number for m in done[0]] == [LATEST + 1]
    retry = next(r.getMessage() for r in caplog.records if "retrying in" in r.getMessage())
    assert retry.startswith(f"migration {LATEST + 1} add_a_column: canceling statement due to lock")
    assert "lock_timeout 0.1 s" in retry


def test_the_migrate_command_prints_what_it_applied_and_status_shows_the_table(
    settings: Settings,
) -> None:
    before = _cli(settings, "migrate", "--status")
    assert before.returncode == 1
    assert "   1  initial" in before.stdout and "pending" in before.stdout
    assert f"schema at 0, this build needs {LATEST}: run billing-ledger migrate" in before.stdout
    first = _cli(settings, "migrate")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[0].startswith("applied 1 initial in ")
    assert first.stdout.splitlines()[-1] == f"schema at {LATEST} ({LATEST} applied)"
    again = _cli(settings, "migrate")
    assert (again.returncode, again.stdout) == (0, f"schema at {LATEST} (nothing to apply)\n")
    after = _cli(settings, "migrate", "--status")
    assert after.returncode == 0
    assert "applied 20" in after.stdout.splitlines()[0]  # the year of applied_at
    assert after.stdout.splitlines()[-1] == "current"


# -- workers ----------------------------------------------------------------------------


class _Worker:
    def __init__(self, settings: Settings, log: Path, *args: str) -> None:
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [*CLI, "run", *args], env=settings_env(settings), stderr=out
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def messages(self) -> list[str]:
        lines = [json.loads(line) for line in self.text().splitlines() if line.startswith("{")]
        return [line["message"] for line in lines]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


@pytest.fixture
def worker_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"schema_check_interval_s": 0.2, "heartbeat_interval_s": 1})


def _beating(url: str, pid: int) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT 1 FROM billing.workers WHERE pid = %s", (pid,)).fetchone()
    return row is not None


def test_a_worker_waits_for_migrate_saying_so_then_starts(
    worker_settings: Settings, tmp_path: Path
) -> None:
    url = worker_settings.database_url
    worker = _Worker(worker_settings, tmp_path / "worker.log", "--role", "project")
    try:
        wanted = f"schema at 0, this build needs {LATEST}: run billing-ledger migrate"
        wait_for(lambda: worker.messages().count(wanted) >= 2, what="the worker to say it waits")
        assert worker.proc.poll() is None
        assert not _relation_exists(url, f"public.{schema.EVENTS_TABLE}")  # it made nothing
        assert not _relation_exists(url, "billing.schema_migrations")
        assert _cli(worker_settings, "migrate").returncode == 0
        wait_for(partial(_beating, url, worker.proc.pid), what="the worker to start its roles")
    finally:
        code = worker.stop()
    assert code == 0, worker.text()[-2000:]


def test_a_worker_that_waited_too_long_exits_saying_what_to_run(
    worker_settings: Settings,
) -> None:
    proc = _cli(worker_settings.model_copy(update={"schema_wait_s": 0.5}), "run", "--role", "relay")
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        f"billing-ledger: error: schema at 0, this build needs {LATEST}:"
        " run billing-ledger migrate (gave up after 0.5 s)"
    )


def test_workers_run_no_ddl(
    charge_settings: Settings, emulator: StripeEmulator, tmp_path: Path
) -> None:
    """An event trigger records every DDL command; a worker of every role starts, works
    and stops, and the record stays empty (``migrate`` is the only DDL)."""
    settings = charge_settings.model_copy(update={"heartbeat_interval_s": 1})
    url = settings.database_url
    migrate(settings)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE ddl_seen (tag text, at timestamptz DEFAULT now());"
            " CREATE FUNCTION note_ddl() RETURNS event_trigger LANGUAGE plpgsql AS"
            " $$BEGIN INSERT INTO ddl_seen (tag) VALUES (tg_tag); END$$;"
            " CREATE EVENT TRIGGER note_ddl ON ddl_command_start EXECUTE FUNCTION note_ddl();"
        )
    worker = _Worker(settings, tmp_path / "worker.log", "--role", "all")
    try:
        wait_for(partial(_beating, url, worker.proc.pid), what="the worker to start")
        with open_ledger(settings) as ledger:
            record(ledger, "acme", ["r-1", "r-2"])

        def charged() -> bool:
            with psycopg.connect(url) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM billing.transactions WHERE state = 'charged'"
                ).fetchone()
            return bool(row and row[0] == 2)

        wait_for(charged, what="the worker to charge and project both")
    finally:
        code = worker.stop()
    assert code == 0, worker.text()[-2000:]
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT tag FROM ddl_seen").fetchall() == []
        conn.execute("CREATE TABLE billing.probe (x int)")  # the trigger does see DDL
        assert conn.execute("SELECT tag FROM ddl_seen").fetchall() == [("CREATE TABLE",)]


# -- rebuild after migrations -----------------------------------------------------------


def test_rebuilds_keep_the_migrated_shape_index_names_and_grants(
    stripe_settings: Settings,
    emulator: StripeEmulator,
    new_database: Callable[[], str],
    pg_server_url: str,
) -> None:
    url = stripe_settings.database_url
    migrate(stripe_settings)
    fresh = new_database()
    migrate(stripe_settings.model_copy(update={"database_url": fresh}))
    reader = f"reader_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(reader)))
        conn.execute(
            sql.SQL("GRANT SELECT ON billing.transactions, billing.customer_balances TO {}").format(
                sql.Identifier(reader)
            )
        )
    try:
        with open_ledger(stripe_settings) as ledger:
            with build_projector(stripe_settings, ledger) as projector:
                mixed_workload(stripe_settings, ledger, emulator, projector)
            live = _read_models(url)
            for _ in range(2):  # the second rebuild starts from a swapped table
                for p in PROJECTIONS:
                    rebuild(Database(url), p.name, ledger.mapper.to_domain_event, batch=3)
                assert _read_models(url) == live
                assert schema_shape(url) == schema_shape(fresh)
                with psycopg.connect(url) as conn:
                    rows = conn.execute(
                        "SELECT has_table_privilege(%s, 'billing.transactions', 'SELECT'),"
                        " has_table_privilege(%s, 'billing.customer_balances', 'SELECT'),"
                        " has_table_privilege(%s, 'billing.charge_attempts', 'SELECT')",
                        (reader, reader, reader),
                    ).fetchone()
                assert rows == (True, True, False)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(reader)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(reader)))
