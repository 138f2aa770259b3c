"""``billing-ledger bench ingest``: how fast usage becomes durable transactions.

Everything is measured in one run on one database server, so the figures compare
with each other rather than with another machine:

* end to end: N records already on the topic -> consumed, priced, Metered+Reserved
  saved, offsets committed (records/s, events/s, batch commit latency p50/p99);
* store append: the same batches saved straight to the event store (no Kafka), with
  our lock-free recorder and with eventsourcing's stock recorder (LOCK TABLE + NOTIFY),
  1 and 2 concurrent writers;
* raw PostgreSQL: ``COPY`` of the very rows the ledger wrote, 2,000 rows per
  transaction, into a table of the same shape; and single-row INSERT commits against
  single-transaction appends.
"""

from __future__ import annotations

import functools
import statistics
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

from adapters.eventstore import postgres_env
from adapters.kafka_io import make_producer
from adapters.ledger import BillingLedger
from adapters.progress import Progress, step
from adapters.runtime import build_ingest_worker, close_worker, open_ledger, prepare
from adapters.settings import Settings
from domain.metering import Metering
from domain.transaction import Source
from domain.usage import UsageRecord
from infra.embedded import EmbeddedPostgres, TansuBroker

__all__ = ["render", "run_ingest_bench"]

CUSTOMERS = 50
EVENTS_TABLE = "billingledger_events"


def run_ingest_bench(
    records: int, *, batch: int = 2000, database_url: str | None = None
) -> dict[str, Any]:
    with ExitStack() as stack:
        if database_url is None:
            step("starting embedded PostgreSQL")
            admin_url = stack.enter_context(EmbeddedPostgres()).url
        else:
            admin_url = database_url
        step("starting the Tansu broker")
        broker = stack.enter_context(TansuBroker())
        urls = {
            name: _fresh_database(admin_url, f"bench_{name}") for name in ("e2e", "ours", "stock")
        }
        settings = Settings(
            database_url=urls["e2e"],
            kafka_bootstrap=broker.bootstrap,
            ingest_group="bench",
            batch_max_records=batch,
        )
        prepare(settings)
        usage = _records(records)
        result: dict[str, Any] = {"records": records, "batch": batch, "cores": _cores()}
        result["server"] = _server_version(urls["e2e"])
        result["produce"] = _produce(settings, usage)
        result["end_to_end"] = _end_to_end(settings, records)
        result["store_append"] = {
            "ours": _store_append(settings, urls["ours"], usage, batch, lock_free=True),
            "stock": _store_append(settings, urls["stock"], usage, batch, lock_free=False),
        }
        result["raw_copy"] = _raw_copy(urls["e2e"])
        result["single_append"] = _single_appends(settings, urls["ours"], urls["stock"])
        ours = result["store_append"]["ours"]["1_writer"]["events_per_s"]
        result["ratios"] = {
            "store_append_vs_copy": round(ours / result["raw_copy"]["rows_per_s"], 3),
            "end_to_end_events_vs_copy": round(
                result["end_to_end"]["events_per_s"] / result["raw_copy"]["rows_per_s"], 3
            ),
            "stock_vs_ours_2_writers": round(
                result["store_append"]["stock"]["2_writers"]["events_per_s"]
                / result["store_append"]["ours"]["2_writers"]["events_per_s"],
                3,
            ),
        }
        return result


def _records(n: int) -> list[UsageRecord]:
    base = datetime(2026, 12, 1, tzinfo=UTC)
    meters = ("gpt-4o.input_tokens", "gpt-4o.output_tokens", "api.requests")
    return [
        UsageRecord(
            usage_id=f"bench-{i}",
            customer_id=f"cust-{i % CUSTOMERS:03d}",
            meter=meters[i % len(meters)],
            quantity=Decimal(1000 + i % 5000),
            occurred_at=base + timedelta(milliseconds=i),
        )
        for i in range(n)
    ]


def _produce(settings: Settings, usage: list[UsageRecord]) -> dict[str, float]:
    step(f"producing {len(usage):,} records")
    producer = make_producer(settings.kafka_bootstrap)
    started = time.perf_counter()
    for r in usage:
        producer.send(settings.usage_topic, key=r.customer_id.encode(), value=r.to_json())
    producer.flush()
    elapsed = time.perf_counter() - started
    producer.close()
    return {"seconds": round(elapsed, 3), "records_per_s": round(len(usage) / elapsed)}


def _end_to_end(settings: Settings, records: int) -> dict[str, Any]:
    step("end to end: consume, price, save, commit offsets")
    with open_ledger(settings) as ledger:
        worker = build_ingest_worker(settings, ledger)
        progress = Progress(records, "ingested")
        stop = threading.Event()
        first: list[float] = []

        def on_batch(stats: Any) -> None:
            if not first:
                first.append(time.perf_counter() - stats.batch_seconds[0])
            progress.update(stats.records)
            if stats.records >= records:
                stop.set()

        timer = threading.Timer(600, stop.set)
        timer.start()
        try:
            worker.run(stop, on_batch)
        finally:
            timer.cancel()
            close_worker(worker)
        progress.done()
        elapsed = time.perf_counter() - first[0]
        events = _count_events(settings.database_url)
        lat = sorted(worker.stats.batch_seconds)
        return {
            "seconds": round(elapsed, 3),
            "records_per_s": round(worker.stats.records / elapsed),
            "events_per_s": round(events / elapsed),
            "events": events,
            "batches": len(lat),
            "batch_commit_ms_p50": round(_pct(lat, 50) * 1000, 1),
            "batch_commit_ms_p99": round(_pct(lat, 99) * 1000, 1),
        }


def _store_append(
    settings: Settings, url: str, usage: list[UsageRecord], batch: int, *, lock_free: bool
) -> dict[str, Any]:
    step(f"store append, {'lock-free recorder' if lock_free else 'stock recorder'}")
    out: dict[str, Any] = {}
    for writers in (1, 2):
        _reset_events(url)
        apps = [_app(settings, url, lock_free) for _ in range(writers)]
        # Each writer owns its customers, as Kafka partitioning by customer ensures.
        shares = [[r for r in usage if hash(r.customer_id) % writers == w] for w in range(writers)]
        batches = [
            [
                [Metering(r, Source("bench", w, i + j)) for j, r in enumerate(share[i : i + batch])]
                for i in range(0, len(share), batch)
            ]
            for w, share in enumerate(shares)
        ]
        started = time.perf_counter()
        threads = [
            threading.Thread(target=_save_all, args=(apps[w], batches[w])) for w in range(writers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
        events = _count_events(url)
        for app in apps:
            app.close()
        out[f"{writers}_writer{'s' if writers > 1 else ''}"] = {
            "records_per_s": round(len(usage) / elapsed),
            "events_per_s": round(events / elapsed),
        }
    return out


def _save_all(app: BillingLedger, batches: list[list[Metering]]) -> None:
    for b in batches:
        app.record_usage(b)


def _raw_copy(url: str) -> dict[str, Any]:
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
            with conn.cursor().copy("COPY bench_copy FROM STDIN") as copy:
                for row in rows[i : i + 2000]:
                    copy.write_row(row)
            conn.commit()
        elapsed = time.perf_counter() - started
    return {"rows": len(rows), "rows_per_s": round(len(rows) / elapsed), "rows_per_txn": 2000}


def _single_appends(
    settings: Settings, ours_url: str, stock_url: str, n: int = 300
) -> dict[str, Any]:
    step(f"single-transaction appends ({n} each) vs single-row INSERT commits")
    out: dict[str, Any] = {}
    for name, url, lock_free in (("ours", ours_url, True), ("stock", stock_url, False)):
        _reset_events(url)
        with _app(settings, url, lock_free) as app:
            usage = _records(n)
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
        "p50": round(_pct(samples, 50) * 1000, 2),
        "p99": round(_pct(samples, 99) * 1000, 2),
        "mean": round(statistics.fmean(samples) * 1000, 2),
    }


def _app(settings: Settings, url: str, lock_free: bool) -> BillingLedger:
    env = postgres_env(url, pool_size=2, lock_free=lock_free)
    env["CREATE_TABLE"] = "y"
    return BillingLedger(settings.load_prices(), env=env)


def _fresh_database(admin_url: str, name: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return psycopg.conninfo.make_conninfo(admin_url, dbname=name)


def _reset_events(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for table in (EVENTS_TABLE, "billingledger_snapshots"):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


def _count_events(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(EVENTS_TABLE))
        ).fetchone()
    return int(row[0]) if row else 0


def _server_version(url: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "?"


def _cores() -> int:
    import os

    return os.cpu_count() or 1


def _pct(sorted_samples: list[float], pct: float) -> float:
    if not sorted_samples:
        return 0.0
    k = min(len(sorted_samples) - 1, round(pct / 100 * (len(sorted_samples) - 1)))
    return sorted_samples[k]


def render(r: dict[str, Any]) -> str:
    e2e, sa, one = r["end_to_end"], r["store_append"], r["single_append"]
    rate = "{:>10,} {}".format
    rows = [
        ("produce (kafka-python -> Tansu)", rate(r["produce"]["records_per_s"], "records/s")),
        ("end to end: records", rate(e2e["records_per_s"], "records/s")),
        ("end to end: events", rate(e2e["events_per_s"], "events/s")),
        (
            "  batch commit p50 / p99",
            f"{e2e['batch_commit_ms_p50']} / {e2e['batch_commit_ms_p99']} ms",
        ),
        (
            "store append, lock-free, 1 writer",
            rate(sa["ours"]["1_writer"]["events_per_s"], "events/s"),
        ),
        (
            "store append, lock-free, 2 writers",
            rate(sa["ours"]["2_writers"]["events_per_s"], "events/s"),
        ),
        (
            "store append, stock, 1 writer",
            rate(sa["stock"]["1_writer"]["events_per_s"], "events/s"),
        ),
        (
            "store append, stock, 2 writers",
            rate(sa["stock"]["2_writers"]["events_per_s"], "events/s"),
        ),
        ("raw COPY of the same rows", rate(r["raw_copy"]["rows_per_s"], "rows/s")),
        ("store append / COPY", f"{r['ratios']['store_append_vs_copy']:>10}"),
        ("end-to-end events / COPY", f"{r['ratios']['end_to_end_events_vs_copy']:>10}"),
        ("stock / lock-free, 2 writers", f"{r['ratios']['stock_vs_ours_2_writers']:>10}"),
        ("append 1 record, lock-free p50/p99", _ms(one["ours_append_ms"])),
        ("append 1 record, stock p50/p99", _ms(one["stock_append_ms"])),
        ("raw single-row INSERT commit p50/p99", _ms(one["raw_insert_commit_ms"])),
    ]
    head = (
        f"billing-ledger bench ingest: {r['records']:,} records, batch {r['batch']}, "
        f"{r['cores']} cores, PostgreSQL {r['server']}"
    )
    return "\n".join([head, ""] + [f"{name:<38} {value}" for name, value in rows])


def _ms(lat: dict[str, float]) -> str:
    return f"{lat['p50']} / {lat['p99']} ms"
