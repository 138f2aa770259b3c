"""``billing-ledger bench relay``: how fast the relay publishes the event store to Kafka.

The relay is the outbox's one reader: every event reaches the charge workers (and any
other consumer of ``billing.events``) through it, so when it falls behind, every line
is pushed late, however fast Stripe answers. One run, one database, one broker:

* generate: usage priced by the ingest's own decision (Metered + Reserved, as ``bench
  replay`` writes it);
* relay: the relay as ``run --role relay`` builds it publishes every event to
  ``billing.events`` until it has caught up (each batch read in commit order, sent,
  flushed, its position stored);
* raw producer: the very messages the relay sent (key, value and headers, built before
  the clock starts) sent again to a topic of their own by a plain producer with the
  same settings, then flushed: what any relay on this Kafka client pays at least.

Relay over raw producer, measured in the same run, is the figure to compare.
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack
from typing import Any

import psycopg

from adapters.bootstrap import build_relay, migrate, open_ledger
from adapters.broker import ensure_topics, make_producer
from adapters.charging.relay import event_message, root_trace_headers
from adapters.progress import Progress, step
from adapters.settings import Settings
from infra.embedded import EmbeddedPostgres, TansuBroker
from store.eventlog import START, read_after
from tools.bench_replay import generate
from tools.bench_store import fresh_database

__all__ = ["render_relay", "run_relay_bench"]

RAW_TOPIC = "bench.raw"
Message = tuple[bytes, bytes, list[tuple[str, bytes]]]  # key, value, headers


def run_relay_bench(events: int, *, database_url: str | None = None) -> dict[str, Any]:
    """Write about ``events`` events, then time the relay and a raw producer on them."""
    with ExitStack() as stack:
        if database_url is None:
            step("starting embedded PostgreSQL")
            database_url = stack.enter_context(EmbeddedPostgres()).url
        step("starting the broker")
        broker = stack.enter_context(TansuBroker())
        url = fresh_database(database_url, "bench_relay")
        settings = Settings(database_url=url, kafka_bootstrap=broker.bootstrap)
        migrate(settings)
        ensure_topics(
            broker.bootstrap,
            [(settings.events_topic, settings.events_partitions),
             (settings.alerts_topic, settings.events_partitions),
             (RAW_TOPIC, settings.events_partitions)],
        )  # fmt: skip
        with open_ledger(settings) as ledger:
            generated = generate(ledger, events)
        relay = _relay(settings)
        raw = _raw(settings, relay["messages"])
        return {
            "cores": os.cpu_count() or 1,
            "events": relay["published"],
            "generate": generated,
            "relay": {k: v for k, v in relay.items() if k != "messages"},
            "raw_producer": raw,
            "relay_vs_raw": round(relay["events_per_s"] / raw["messages_per_s"], 3),
        }


def _relay(settings: Settings) -> dict[str, Any]:
    """The relay's pumps until it has caught up; also the messages it sent, rebuilt from
    the rows and the customers it knew (for the raw producer)."""
    with psycopg.connect(settings.database_url) as conn:
        total = int(conn.execute("SELECT count(*) FROM billingledger_events").fetchone()[0])  # type: ignore[index]
    step(f"relay: publishing {total:,} events")
    relay = build_relay(settings)
    bar = Progress(total, "published events")
    started = time.perf_counter()
    published = 0
    while sent := relay.pump():
        published += sent
        bar.update(published)
    elapsed = time.perf_counter() - started
    bar.done()
    customers = dict(relay._customers)
    relay.close()
    relay.producer.close()
    messages: list[Message] = []
    with psycopg.connect(settings.database_url) as conn:
        for row in read_after(conn, START, total):
            message, headers = event_message(row)
            key = customers.get(message.originator_id, str(message.originator_id)).encode()
            messages.append((key, message.to_json(), [*headers, *root_trace_headers(row)]))
    return {
        "published": published,
        "seconds": round(elapsed, 2),
        "events_per_s": round(published / elapsed),
        "messages": messages,
    }


def _raw(
    settings: Settings, messages: list[tuple[bytes, bytes, list[tuple[str, bytes]]]]
) -> dict[str, Any]:
    step(f"raw producer: the same {len(messages):,} messages, prebuilt")
    producer = make_producer(settings.kafka_bootstrap)
    try:
        started = time.perf_counter()
        for key, value, headers in messages:
            producer.send(RAW_TOPIC, key=key, value=value, headers=headers)
        producer.flush()
        elapsed = time.perf_counter() - started
    finally:
        producer.close()
    return {
        "messages": len(messages),
        "seconds": round(elapsed, 2),
        "messages_per_s": round(len(messages) / elapsed),
    }


def render_relay(r: dict[str, Any]) -> str:
    rows = [
        (
            "relay (read, publish, flush, store position)",
            f"{r['relay']['events_per_s']:,} events/s",
        ),
        ("raw producer, the same messages prebuilt", f"{r['raw_producer']['messages_per_s']:,}/s"),
        ("relay / raw producer", str(r["relay_vs_raw"])),
    ]
    head = (
        f"billing-ledger bench relay: {r['events']:,} events"
        f" ({r['generate']['transactions']:,} transactions), {r['cores']} cores"
    )
    return "\n".join([head, "", *(f"{name:<46} {value:>18}" for name, value in rows)])
