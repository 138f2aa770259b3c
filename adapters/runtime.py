"""Builds the long-lived parts from settings: the ledger, the stores, the workers."""

from __future__ import annotations

import time

import psycopg
from psycopg import errors as pgerrors

from adapters import relay
from adapters.charge_worker import ChargeWorker, SeekToStored
from adapters.charging import Charger, Reconciler
from adapters.eventstore import postgres_env
from adapters.ingest import IngestWorker
from adapters.kafka_io import ensure_topics, make_consumer, make_producer
from adapters.ledger import BillingLedger
from adapters.relay import Relay
from adapters.settings import Settings
from adapters.stripe_client import StripeCharges
from projections import dead_letters, projector, queue_health
from projections.projector import Projector

__all__ = ["build_ingest_worker", "build_projector", "open_ledger", "prepare"]


def prepare(settings: Settings, *, topics: bool = True) -> None:
    """Create the database tables and the topics if they do not exist yet (idempotent)."""
    for attempt in range(5):
        try:
            with psycopg.connect(settings.database_url, autocommit=True) as conn:
                conn.execute(dead_letters.SCHEMA_SQL)
            open_ledger(settings, create_tables=True).close()
            with psycopg.connect(settings.database_url, autocommit=True) as conn:
                conn.execute(relay.SCHEMA_SQL)
                conn.execute(projector.schema_sql())
                conn.execute(queue_health.SCHEMA_SQL)
                queue_health.write_settings(
                    conn,
                    retry_horizon_s=settings.retry_horizon_s,
                    reconcile_interval_s=settings.reconcile_interval_s,
                    stale_after_s=settings.stale_after_s,
                    heartbeat_timeout_s=settings.heartbeat_timeout_s(),
                )
            break
        except (pgerrors.UniqueViolation, pgerrors.DuplicateObject):
            # Another process created the same objects at the same moment; look again.
            time.sleep(0.1 * (attempt + 1))
    if topics:
        ensure_topics(
            settings.kafka_bootstrap,
            [
                (settings.usage_topic, settings.usage_partitions),
                (settings.dlq_topic, 1),
                (settings.events_topic, settings.events_partitions),
            ],
        )


def open_ledger(settings: Settings, *, create_tables: bool = False) -> BillingLedger:
    """The ledger application on the configured database."""
    env = postgres_env(settings.database_url, pool_size=settings.db_pool_size)
    env["CREATE_TABLE"] = "y" if create_tables else "n"
    return BillingLedger(settings.load_prices(), env=env)


def build_ingest_worker(
    settings: Settings, ledger: BillingLedger, *, kill_after_save: bool = False
) -> IngestWorker:
    """An ingest worker in the configured consumer group."""
    return IngestWorker(
        ledger,
        dead_letters.DeadLetterStore(settings.database_url),
        make_consumer(
            settings.kafka_bootstrap,
            settings.usage_topic,
            settings.ingest_group,
            max_poll_records=settings.batch_max_records,
            fetch_max_wait_ms=settings.fetch_max_wait_ms,
        ),
        make_producer(settings.kafka_bootstrap),
        dlq_topic=settings.dlq_topic,
        max_record_bytes=settings.max_record_bytes,
        poll_timeout_ms=settings.poll_timeout_ms,
        kill_after_save=kill_after_save,
    )


def close_worker(worker: IngestWorker) -> None:
    """Close the worker's Kafka clients (the ledger is closed by its owner)."""
    worker.consumer.close()
    worker.producer.close(timeout=5)


def build_charger(settings: Settings, ledger: BillingLedger, *, drill: str = "") -> Charger:
    """The saga driver with its own Stripe client (breaker, limits) for this process."""
    return Charger(ledger, StripeCharges(settings.stripe()), settings.retry_policy(), drill=drill)


def build_relay(settings: Settings) -> Relay:
    return Relay(
        settings.database_url, make_producer(settings.kafka_bootstrap), settings.events_topic
    )


def build_charge_worker(settings: Settings, charger: Charger) -> ChargeWorker:
    listener = SeekToStored(settings.database_url, settings.charge_group, settings.events_topic)
    consumer = make_consumer(
        settings.kafka_bootstrap,
        settings.events_topic,
        settings.charge_group,
        max_poll_records=200,
        fetch_max_wait_ms=settings.fetch_max_wait_ms,
        listener=listener,
    )
    listener.consumer = consumer
    return ChargeWorker(
        charger,
        consumer,
        database_url=settings.database_url,
        group=settings.charge_group,
        topic=settings.events_topic,
        parallel=settings.stripe_max_concurrency,
    )


def build_reconciler(settings: Settings, charger: Charger) -> Reconciler:
    return Reconciler(charger, settings.database_url, parallel=settings.stripe_max_concurrency)


def build_projector(settings: Settings, ledger: BillingLedger) -> Projector:
    """The projector of the SQL read models, decoding with the ledger's own mapper."""
    return Projector(settings.database_url, ledger.mapper.to_domain_event)
