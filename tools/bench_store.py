"""The store's side of ``bench ingest``: appends straight to the event store (no Kafka)
with our recorder, eventsourcing's stock one and ours with the stock lock put back,
against raw PostgreSQL (binary ``COPY`` of the very rows, single-row INSERT commits).
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from eventsourcing.persistence import PersistenceError
from eventsourcing.postgres import PostgresApplicationRecorder
from psycopg import Cursor, sql
from psycopg.rows import DictRow

from adapters.bootstrap import migrate
from adapters.progress import step
from adapters.settings import Settings
from domain.metering import Metering
from domain.transaction import Source
from domain.usage import UsageRecord
from store.ledger import BillingLedger
from store.recorder import LedgerRecorder, postgres_env
from store.schema import EVENTS_TABLE, SCHEMA, SNAPSHOTS_TABLE
from tools.measure import percentile
from tools.synthetic import bench_usage

__all__ = [
    "RECORDERS",
    "STOCK_MAX_BATCH",
    "count_events",
    "fresh_database",
    "raw_copy",
    "server_version",
    "single_appends",
    "store_append",
]

STOCK_MAX_BATCH = 250  # eventsourcing's stock recorder stalled at 500 records per batch
STALL_S = 20.0  # a 250-record save takes well under a second; none for this long is a stall
RECORDERS = ("ours", "stock", "ours_locking")


class LockingLedgerRecorder(LedgerRecorder):
    """Ours plus the stock recorder's LOCK TABLE and NOTIFY: what they cost, alone.

    Calls the stock recorder's private ``_lock_table`` and ``_notify_channel``
    (eventsourcing 9.5), in the same transaction, before the same COPY.
    """

    def _insert_events(
        self, curs: Cursor[DictRow], stored_events: Sequence[Any], **kwargs: Any
    ) -> None:
        PostgresApplicationRecorder._lock_table(self, curs)
        PostgresApplicationRecorder._notify_channel(self, curs)
        super()._insert_events(curs, stored_events, **kwargs)


def store_append(
    settings: Settings,
    url: str,
    usage: list[UsageRecord],
    batch: int,
    recorder: str,
    *,
    stall_s: float = STALL_S,
) -> dict[str, Any]:
    """Records and events per second with 1 and 2 writers; ``{"stalled": ...}`` for a
    writer count whose saves made no progress for ``stall_s`` (the stock recorder's
    psycopg pipeline can wait forever on a large parameter: its connections are
    terminated, so the benchmark reports the stall and goes on)."""
    step(f"store append, {recorder} recorder, {batch} records per batch")
    out: dict[str, Any] = {"batch": batch}
    for writers in (1, 2):
        _reset_events(url, recorder)
        apps = [_app(settings, url, recorder) for _ in range(writers)]
        # Each writer owns its customers, as Kafka partitioning by customer ensures.
        shares = [[r for r in usage if hash(r.customer_id) % writers == w] for w in range(writers)]
        batches = [
            [
                [Metering(r, Source("bench", w, i + j)) for j, r in enumerate(share[i : i + batch])]
                for i in range(0, len(share), batch)
            ]
            for w, share in enumerate(shares)
        ]
        saved = [0] * writers
        started = time.perf_counter()
        threads = [
            threading.Thread(target=_save_all, args=(apps[w], batches[w], saved, w), daemon=True)
            for w in range(writers)
        ]
        for t in threads:
            t.start()
        stalled = _join_unless_stalled(threads, saved, stall_s)
        elapsed = time.perf_counter() - started
        label = f"{writers}_writer{'s' if writers > 1 else ''}"
        if stalled:
            step(f"  {recorder}, {writers} writer(s): no save for {stall_s:.0f} s; stopping it")
            batches_saved = sum(saved)  # before the writers' connections are ended
            # Fenced off while its writers' sessions end: a recorder that reconnects and
            # retries (eventsourcing's does) would stall again holding its table's lock.
            _allow_connections(url, allow=False)
            try:
                _terminate_backends(url)
                for t in threads:
                    t.join(30)
                for app in apps:
                    with contextlib.suppress(psycopg.Error):
                        app.close()
            finally:
                _allow_connections(url, allow=True)
            out[label] = {"stalled": True, "batches_saved": batches_saved}
            continue
        events = count_events(url)
        for app in apps:
            app.close()
        out[label] = {
            "records_per_s": round(len(usage) / elapsed),
            "events_per_s": round(events / elapsed),
        }
    return out


def _save_all(app: BillingLedger, batches: list[list[Metering]], saved: list[int], w: int) -> None:
    try:
        for b in batches:
            app.record_usage(b)
            saved[w] += 1
    except (psycopg.Error, PersistenceError):  # ended after a stall; the caller reports it
        return


def _join_unless_stalled(threads: list[threading.Thread], saved: list[int], stall_s: float) -> bool:
    """Waits for the writers; True when none of them saved a batch for ``stall_s``."""
    last, last_at = sum(saved), time.monotonic()
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(0.2)
        if sum(saved) != last:
            last, last_at = sum(saved), time.monotonic()
        elif time.monotonic() - last_at > stall_s:
            return True
    return False


def _terminate_backends(url: str) -> None:
    """End every session of ``url``'s database (from the server's ``postgres`` database)."""
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(_admin(url), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )


def _allow_connections(url: str, *, allow: bool) -> None:
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(_admin(url), autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}").format(
                sql.Identifier(str(name)), sql.SQL("true" if allow else "false")
            )
        )


def _admin(url: str) -> str:
    return psycopg.conninfo.make_conninfo(url, dbname="postgres")


def raw_copy(url: str) -> dict[str, Any]:
    step("raw PostgreSQL COPY of the same rows")
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            sql.SQL("SELECT originator_id, originator_version, topic, state FROM {}").format(
                sql.Identifier(EVENTS_TABLE)
            )
        ).fetchall()
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_copy (originator_id uuid, originator_version bigint,"
            " topic text, state bytea, PRIMARY KEY (originator_id, originator_version))"
        )
        conn.execute("TRUNCATE bench_copy")
        conn.commit()
        started = time.perf_counter()
        for i in range(0, len(rows), 2000):
            with conn.cursor().copy("COPY bench_copy FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["uuid", "int8", "text", "bytea"])
                for row in rows[i : i + 2000]:
                    copy.write_row(row)
            conn.commit()
        elapsed = time.perf_counter() - started
    return {"rows": len(rows), "rows_per_s": round(len(rows) / elapsed), "rows_per_txn": 2000}


def single_appends(
    settings: Settings, ours_url: str, stock_url: str, n: int = 300
) -> dict[str, Any]:
    step(f"single-transaction appends ({n} each) vs single-row INSERT commits")
    out: dict[str, Any] = {}
    for name, url in (("ours", ours_url), ("stock", stock_url)):
        _reset_events(url, name)
        with _app(settings, url, name) as app:
            usage = bench_usage(n)
            calls: list[Callable[[], Any]] = [
                functools.partial(app.record_usage, [Metering(r, Source("one", 0, i))])
                for i, r in enumerate(usage)
            ]
            out[f"{name}_append_ms"] = _latencies(calls)
    with psycopg.connect(ours_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_insert (id bigserial, body bytea)")
        body = b"x" * 300
        out["raw_insert_commit_ms"] = _latencies(
            [lambda: conn.execute("INSERT INTO bench_insert (body) VALUES (%s)", (body,))] * n
        )
    return out


def _latencies(calls: list[Callable[[], Any]]) -> dict[str, float]:
    samples = []
    for call in calls:
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    samples.sort()
    return {
        "p50": round(percentile(samples, 50) * 1000, 2),
        "p99": round(percentile(samples, 99) * 1000, 2),
        "mean": round(statistics.fmean(samples) * 1000, 2),
    }


def _app(settings: Settings, url: str, recorder: str) -> BillingLedger:
    env = postgres_env(url, pool_size=2, lock_free=recorder != "stock")
    if recorder == "ours_locking":
        env["APPLICATION_RECORDER_TOPIC"] = f"{__name__}:{LockingLedgerRecorder.__name__}"
    # The stock recorder makes its own table, as eventsourcing does; ours find theirs migrated.
    env["CREATE_TABLE"] = "y" if recorder == "stock" else "n"
    return BillingLedger(settings.load_prices(), env=env)


def fresh_database(admin_url: str, name: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return psycopg.conninfo.make_conninfo(admin_url, dbname=name)


def _reset_events(url: str, recorder: str) -> None:
    """An empty event store: the schema dropped, then migrated again for our recorders
    (the stock recorder makes its own tables in ``_app``)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "DROP TABLE IF EXISTS {}, {} CASCADE; DROP SCHEMA IF EXISTS {} CASCADE;"
                " DROP FUNCTION IF EXISTS es_insert_events_uuid, billing_events_append_only;"
                " DROP TYPE IF EXISTS stored_event_uuid"
            ).format(
                sql.Identifier(EVENTS_TABLE),
                sql.Identifier(SNAPSHOTS_TABLE),
                sql.Identifier(SCHEMA),
            )
        )
    if recorder != "stock":
        migrate(Settings(database_url=url))


def count_events(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(EVENTS_TABLE))
        ).fetchone()
    return int(row[0]) if row else 0


def server_version(url: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "?"
