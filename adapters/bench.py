"""``billing-ledger bench ingest``: how fast usage becomes durable transactions.

Everything is measured in one run on one database server, so the figures compare
with each other rather than with another machine:

* end to end: N records already on the topic -> consumed, priced, Metered+Reserved
  saved, offsets committed (records/s, events/s, batch commit latency p50/p99), by
  ``workers`` ingest processes in one consumer group (timed from when the group has
  settled: each worker holds its partitions paused until all are assigned);
* store append: the same batches saved straight to the event store (no Kafka), 1 and
  2 concurrent writers (threads of one process, so client CPU does not add up; the
  figure shows what the database lets through), with
  - our lock-free recorder at the configured batch;
  - at 250 records per batch, because eventsourcing's stock recorder stalls on
    larger ones (its psycopg pipeline with a large parameter never syncs; seen at
    500 on a 50,000-record run): the stock recorder (LOCK TABLE + NOTIFY +
    composite-array insert), ours, and ours with the stock LOCK TABLE + NOTIFY
    added, which isolates what the lock and the NOTIFY cost;
* raw PostgreSQL: binary ``COPY`` of the very rows the ledger wrote, 2,000 rows per
  transaction, into a table of the same columns and primary key; and single-row
  INSERT commits against single-transaction appends.
"""

from __future__ import annotations

import functools
import multiprocessing
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
from eventsourcing.postgres import PostgresApplicationRecorder
from psycopg import Cursor, sql
from psycopg.rows import DictRow

from adapters.eventstore import LedgerRecorder, postgres_env
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
STOCK_MAX_BATCH = 250  # eventsourcing's stock recorder stalled at 500 records per batch
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


def run_ingest_bench(
    records: int, *, batch: int = 2000, database_url: str | None = None, workers: int = 1
) -> dict[str, Any]:
    with ExitStack() as stack:
        if database_url is None:
            step("starting embedded PostgreSQL")
            admin_url = stack.enter_context(EmbeddedPostgres()).url
        else:
            admin_url = database_url
        step("starting the Tansu broker")
        broker = stack.enter_context(TansuBroker())
        urls = {name: fresh_database(admin_url, f"bench_{name}") for name in ("e2e", *RECORDERS)}
        settings = Settings(
            database_url=urls["e2e"],
            kafka_bootstrap=broker.bootstrap,
            ingest_group="bench",
            batch_max_records=batch,
        )
        prepare(settings)
        usage = _records(records)
        result: dict[str, Any] = {
            "records": records,
            "batch": batch,
            "workers": workers,
            "cores": _cores(),
        }
        result["server"] = _server_version(urls["e2e"])
        result["produce"] = _produce(settings, usage)
        result["end_to_end"] = _end_to_end(settings, records, workers)
        small = min(batch, STOCK_MAX_BATCH)
        result["store_append"] = {
            "ours": _store_append(settings, urls["ours"], usage, batch, "ours"),
            f"at_{small}": {
                name: _store_append(settings, urls[name], usage, small, name) for name in RECORDERS
            },
        }
        result["raw_copy"] = _raw_copy(urls["e2e"])
        result["single_append"] = _single_appends(settings, urls["ours"], urls["stock"])
        result["ratios"] = _ratios(result, small)
        return result


def _ratios(r: dict[str, Any], small: int) -> dict[str, float]:
    copy = r["raw_copy"]["rows_per_s"]
    at_small = r["store_append"][f"at_{small}"]

    def rate(name: str, writers: str) -> float:
        return float(at_small[name][writers]["events_per_s"])

    return {
        "store_append_vs_copy": round(
            r["store_append"]["ours"]["1_writer"]["events_per_s"] / copy, 3
        ),
        "end_to_end_events_vs_copy": round(r["end_to_end"]["events_per_s"] / copy, 3),
        **{
            f"{name}_vs_ours_{w}": round(rate(name, w) / rate("ours", w), 3)
            for name in ("stock", "ours_locking")
            for w in ("1_writer", "2_writers")
        },
    }


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


def _end_to_end(settings: Settings, records: int, workers: int) -> dict[str, Any]:
    step(f"end to end: {workers} ingest process(es) consume, price, save, commit offsets")
    ctx = multiprocessing.get_context("spawn")
    group = _Group(
        assigned=ctx.Array("i", workers),
        done=ctx.Value("q", 0),
        start=ctx.Event(),
        stop=ctx.Event(),
        results=ctx.Queue(),
    )
    procs = [
        ctx.Process(target=_ingest_process, args=(settings.model_dump(), w, group), daemon=True)
        for w in range(workers)
    ]
    for proc in procs:
        proc.start()
    try:
        _wait_settled(group.assigned, settings.usage_partitions, workers)
        progress = Progress(records, "ingested")
        started = time.monotonic()
        group.start.set()
        while group.done.value < records and time.monotonic() < started + 600:
            if not all(proc.is_alive() for proc in procs):
                raise RuntimeError("an ingest worker process died")
            progress.update(group.done.value)
            time.sleep(0.05)
        progress.update(group.done.value)
        progress.done()
    finally:
        group.stop.set()
    stats = [group.results.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(10)
    elapsed = max(st["finished"] for st in stats) - started
    events = _count_events(settings.database_url)
    lat = sorted(sec for st in stats for sec in st["batch_seconds"])
    return {
        "workers": workers,
        "seconds": round(elapsed, 3),
        "records_per_s": round(sum(st["records"] for st in stats) / elapsed),
        "events_per_s": round(events / elapsed),
        "events": events,
        "batches": len(lat),
        "batch_commit_ms_p50": round(_pct(lat, 50) * 1000, 1),
        "batch_commit_ms_p99": round(_pct(lat, 99) * 1000, 1),
    }


def _wait_settled(assigned: Any, partitions: int, workers: int, timeout: float = 90.0) -> None:
    """Until every partition is held and every worker that can hold one does, for 1.5 s."""
    holders = min(workers, partitions)
    deadline = time.monotonic() + timeout
    settled_since: float | None = None
    while time.monotonic() < deadline:
        held = list(assigned)
        if sum(held) == partitions and sum(1 for n in held if n) == holders:
            settled_since = settled_since or time.monotonic()
            if time.monotonic() - settled_since >= 1.5:
                return
        else:
            settled_since = None
        time.sleep(0.05)
    raise RuntimeError(f"the consumer group did not settle in {timeout:.0f} s: {list(assigned)}")


@dataclass
class _Group:
    """What the benchmark shares with its ingest processes."""

    assigned: Any  # partitions each worker holds (multiprocessing Array)
    done: Any  # records processed by all the workers (multiprocessing Value)
    start: Any  # set when the group has settled
    stop: Any
    results: Any  # one dict of figures per worker (multiprocessing Queue)


def _ingest_process(settings_data: dict[str, Any], index: int, group: _Group) -> None:
    """One ingest worker: joins the group holding its partitions paused until ``start``."""
    from kafka import ConsumerRebalanceListener

    assigned, done, start = group.assigned, group.done, group.start

    settings = Settings(**settings_data)
    with open_ledger(settings) as ledger:
        worker = build_ingest_worker(settings, ledger)
        consumer = worker.consumer

        class HoldUntilStart(ConsumerRebalanceListener):  # type: ignore[misc]
            def on_partitions_revoked(self, revoked: Any) -> None:
                assigned[index] = 0

            def on_partitions_assigned(self, partitions: Any) -> None:
                assigned[index] = len(partitions)
                if not start.is_set():
                    consumer.pause(*partitions)

        consumer.subscribe([settings.usage_topic], listener=HoldUntilStart())
        while not start.is_set():
            consumer.poll(timeout_ms=100)  # joins the group; paused partitions yield nothing
        consumer.resume(*consumer.assignment())
        counted = [0, time.monotonic()]

        def on_batch(stats: Any) -> None:
            with done.get_lock():
                done.value += stats.records - counted[0]
            counted[0], counted[1] = stats.records, time.monotonic()

        try:
            worker.run(group.stop, on_batch)
        finally:
            close_worker(worker)
        group.results.put(
            {
                "records": worker.stats.records,
                "finished": counted[1],
                "batch_seconds": worker.stats.batch_seconds,
            }
        )


def _store_append(
    settings: Settings, url: str, usage: list[UsageRecord], batch: int, recorder: str
) -> dict[str, Any]:
    step(f"store append, {recorder} recorder, {batch} records per batch")
    out: dict[str, Any] = {"batch": batch}
    for writers in (1, 2):
        _reset_events(url)
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
            with conn.cursor().copy("COPY bench_copy FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["uuid", "int8", "text", "bytea"])
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
    for name, url in (("ours", ours_url), ("stock", stock_url)):
        _reset_events(url)
        with _app(settings, url, name) as app:
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


def _app(settings: Settings, url: str, recorder: str) -> BillingLedger:
    env = postgres_env(url, pool_size=2, lock_free=recorder != "stock")
    if recorder == "ours_locking":
        env["APPLICATION_RECORDER_TOPIC"] = f"{__name__}:{LockingLedgerRecorder.__name__}"
    env["CREATE_TABLE"] = "y"
    return BillingLedger(settings.load_prices(), env=env)


def fresh_database(admin_url: str, name: str) -> str:
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
    small = min(r["batch"], STOCK_MAX_BATCH)
    at_small = sa[f"at_{small}"]
    rate = "{:>10,} {}".format

    def appends(label: str, figures: dict[str, Any]) -> list[tuple[str, str]]:
        return [
            (f"{label}, 1 writer", rate(figures["1_writer"]["events_per_s"], "events/s")),
            (f"{label}, 2 writers", rate(figures["2_writers"]["events_per_s"], "events/s")),
        ]

    ratios = r["ratios"]
    rows = [
        ("produce (kafka-python -> Tansu)", rate(r["produce"]["records_per_s"], "records/s")),
        (
            f"end to end ({e2e['workers']} workers): records",
            rate(e2e["records_per_s"], "records/s"),
        ),
        ("end to end: events", rate(e2e["events_per_s"], "events/s")),
        (
            "  batch commit p50 / p99",
            f"{e2e['batch_commit_ms_p50']} / {e2e['batch_commit_ms_p99']} ms",
        ),
        *appends(f"store append, ours, batch {r['batch']}", sa["ours"]),
        ("raw binary COPY of the same rows", rate(r["raw_copy"]["rows_per_s"], "rows/s")),
        ("store append (ours, 1 writer) / COPY", f"{ratios['store_append_vs_copy']:>10}"),
        ("end-to-end events / COPY", f"{ratios['end_to_end_events_vs_copy']:>10}"),
        (f"-- at batch {small} (the stock recorder stalls on larger batches):", ""),
        *appends("store append, ours", at_small["ours"]),
        *appends("  ours + LOCK TABLE + NOTIFY", at_small["ours_locking"]),
        *appends("  eventsourcing stock recorder", at_small["stock"]),
        ("  ours+lock / ours, 1 / 2 writers", _pair(ratios, "ours_locking")),
        ("  stock / ours, 1 / 2 writers", _pair(ratios, "stock")),
        ("append 1 record, lock-free p50/p99", _ms(one["ours_append_ms"])),
        ("append 1 record, stock p50/p99", _ms(one["stock_append_ms"])),
        ("raw single-row INSERT commit p50/p99", _ms(one["raw_insert_commit_ms"])),
    ]
    head = (
        f"billing-ledger bench ingest: {r['records']:,} records, batch {r['batch']}, "
        f"{r['workers']} ingest workers, {r['cores']} cores, PostgreSQL {r['server']}"
    )
    return "\n".join([head, ""] + [f"{name:<42} {value}" for name, value in rows])


def _pair(ratios: dict[str, float], name: str) -> str:
    return f"{ratios[f'{name}_vs_ours_1_writer']:>10} / {ratios[f'{name}_vs_ours_2_writers']}"


def _ms(lat: dict[str, float]) -> str:
    return f"{lat['p50']} / {lat['p99']} ms"
