"""The composition root: every long-lived part of a process is built here, from settings.

``migrate`` applies the schema's migrations (the only DDL, run once per release by
``billing-ledger migrate``); ``prepare`` is what a process does at start, with no DDL:
it waits until the schema is current, records its health deadlines and creates the
topics it needs; ``open_ledger`` opens the event store; ``build_*`` make one worker
role each (``adapters.roles`` runs them, supervised, until stopped).
The CLI, the demo, the benchmarks and the tests build
processes through these functions only. Fault drills (``adapters.drills``) are
installed as wrappers around the parts built here, never as switches of production
constructors.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

from adapters.alerts.relay import AlertRelay
from adapters.alerts.worker import AlertWebhooks
from adapters.broker import ensure_topics, make_consumer, make_producer, use_security
from adapters.charging.closer import InvoiceCloser
from adapters.charging.corrections import Corrections
from adapters.charging.drafts import DraftChecker
from adapters.charging.ownership import Ownership
from adapters.charging.process_manager import ChargeWorker
from adapters.charging.purchases import Purchaser
from adapters.charging.pusher import LinePusher
from adapters.charging.reconciler import Reconciler
from adapters.charging.relay import Relay
from adapters.charging.repricing import Repricer
from adapters.charging.scheduler import LineScheduler
from adapters.http.server import HttpLimits, HttpServer
from adapters.ingest.retention import DeadLetterRetention
from adapters.ingest.worker import IngestWorker
from adapters.settings import Settings
from adapters.stripe.client import StripeGateway
from adapters.webhooks.app import webhook_server
from adapters.webhooks.handler import WebhookHandler
from domain.price_book import PriceVersion
from projections import queue_health
from projections.credits import CREDIT_TOPICS
from projections.projector import CREDIT_LANE, MAIN_LANE, Projector
from store.connections import Database
from store.dead_letters import DeadLetterStore
from store.ledger import BillingLedger
from store.migrations.runner import migrate as apply_migrations
from store.migrations.status import AppliedMigration, SchemaStatus, wait_until_current
from store.migrations.status import schema_status as read_schema_status
from store.recorder import postgres_env
from store.roles import AUDITOR, READER, WRITER, check_roles, set_passwords
from store.webhooks import WebhookStore

__all__ = [
    "ROLES",
    "build_alert_relay",
    "build_alert_webhooks",
    "build_charge_worker",
    "build_closer",
    "build_corrections",
    "build_ingest_worker",
    "build_projector",
    "build_pusher",
    "build_reconciler",
    "build_relay",
    "build_retention",
    "build_scheduler",
    "build_webhook_server",
    "close_worker",
    "database",
    "login",
    "migrate",
    "open_ledger",
    "owner_database",
    "prepare",
    "schema_status",
]

log = logging.getLogger(__name__)

ROLES = ("ingest", "relay", "project", "charge", "reconcile", "webhooks", "alerts")
"""``all`` runs every role; ``webhooks`` only where ``WEBHOOK_SECRETS`` is set."""


def database(settings: Settings, *, pool_size: int | None = None) -> Database:
    """Connections to the configured database: a pool of ``pool_size`` (default: the
    setting) opened on first use, or with 0 a fresh connection each time (nothing to
    close: for one-off commands and parts built on their own)."""
    size = settings.db_pool_size if pool_size is None else pool_size
    return login(settings, pool_size=size)


def login(settings: Settings, **kwargs: Any) -> Database:
    """This process's login (``DATABASE_URL`` and ``DATABASE_PASSWORD``: a worker's is
    ``billing_writer``), with the ``Database`` options given."""
    password = settings.database_password.get_secret_value() or None
    return Database(settings.database_url, password=password, **kwargs)


def owner_database(settings: Settings) -> Database:
    """The schema owner's login (``MIGRATE_DATABASE_URL``, else ``DATABASE_URL``): the
    only one that runs DDL, for ``migrate`` and ``rebuild``."""
    if settings.migrate_database_url is None:
        return login(settings)
    password = settings.migrate_database_password.get_secret_value() or None
    return Database(settings.migrate_database_url, password=password)


def migrate(
    settings: Settings,
    *,
    on_applied: Callable[[AppliedMigration], None] = lambda m: None,
    on_price_book: Callable[[PriceVersion], None] = lambda v: None,
) -> list[AppliedMigration]:
    """Apply the schema's pending migrations, each once (``store.migrations``), as the
    schema owner; then check the billing roles (``store.roles``: none may be more than
    its grants) and give them the passwords of the settings. Then, when the ledger has
    no price book yet, start it: the configured price file as version 1, effective from
    the epoch (``on_price_book`` is told; PriceListError when the file is not valid).
    Returns the migrations this call applied. The one place where DDL runs; safe to run
    concurrently."""
    applied = _apply_migrations(settings, on_applied)
    with open_ledger(settings) as ledger:
        started = ledger.start_price_book(settings.load_prices())
    if started is not None:
        on_price_book(started)
    return applied


def _apply_migrations(
    settings: Settings, on_applied: Callable[[AppliedMigration], None]
) -> list[AppliedMigration]:
    with owner_database(settings).dedicated(autocommit=True) as conn:
        applied = apply_migrations(
            conn,
            lock_timeout_s=settings.migrate_lock_timeout_s,
            attempts=settings.migrate_attempts,
            on_applied=on_applied,
        )
        set_passwords(
            conn,
            {
                WRITER: settings.writer_password.get_secret_value(),
                READER: settings.reader_password.get_secret_value(),
                AUDITOR: settings.auditor_password.get_secret_value(),
            },
        )
        check_roles(conn)
        return applied


def schema_status(settings: Settings) -> SchemaStatus:
    """This build's migrations beside what the database has applied (reads only)."""
    with login(settings).dedicated(autocommit=True) as conn:
        return read_schema_status(conn)


def prepare(settings: Settings, *, topics: bool = True) -> None:
    """What a process does at start: no DDL, no lock beyond one row.

    Waits until the schema is current (logging "schema at N, this build needs M: run
    billing-ledger migrate" every ``schema_check_interval_s``; raises SchemaNotReady
    after ``schema_wait_s``, SchemaAhead at once when a newer build migrated); then
    records its deadlines in ``billing.health_settings`` (one row: the last process to
    start wins) and creates the topics if they are missing.
    """
    use_security(
        settings.kafka_security_protocol,
        settings.kafka_sasl_mechanism,
        settings.kafka_sasl_username,
        settings.kafka_sasl_password.get_secret_value(),
    )
    db = login(settings)

    def status() -> SchemaStatus:
        with db.connection() as conn:
            return read_schema_status(conn)

    wait_until_current(
        status, timeout_s=settings.schema_wait_s, interval_s=settings.schema_check_interval_s
    )
    with db.connection() as conn:
        queue_health.write_settings(
            conn,
            retry_horizon_s=settings.retry_horizon_s,
            reconcile_interval_s=settings.reconcile_interval_s,
            stale_after_s=settings.stale_after_s,
            heartbeat_timeout_s=settings.heartbeat_timeout_s(),
            invoice_grace_s=settings.invoice_grace_s,
        )
    if topics:
        ensure_topics(
            settings.kafka_bootstrap,
            [
                (settings.usage_topic, settings.usage_partitions),
                (settings.dlq_topic, 1),
                (settings.events_topic, settings.events_partitions),
                (settings.alerts_topic, settings.events_partitions),
            ],
        )


def open_ledger(settings: Settings) -> BillingLedger:
    """The ledger application on the configured database. It creates no table
    (``CREATE_TABLE=n``): the schema is the migrations' (``prepare`` waits for it)."""
    env = postgres_env(settings.database_url, pool_size=settings.db_pool_size)
    env["CREATE_TABLE"] = "n"
    if settings.database_password.get_secret_value():
        env["POSTGRES_PASSWORD"] = settings.database_password.get_secret_value()
    return BillingLedger(settings.load_prices(), env=env, periods=settings.periods())


# -- the roles -------------------------------------------------------------------------


def build_ingest_worker(
    settings: Settings, ledger: BillingLedger, db: Database | None = None
) -> IngestWorker:
    """An ingest worker in the configured consumer group."""
    return IngestWorker(
        ledger,
        DeadLetterStore(db or database(settings, pool_size=0)),
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
        usage_window=settings.usage_window(),
        poll_timeout_ms=settings.poll_timeout_ms,
        batch_max_records=settings.batch_max_records,
        dlq_max_message_bytes=settings.dlq_max_message_bytes,
        overlap_saves=settings.ingest_overlap_saves,
    )


def build_retention(settings: Settings) -> DeadLetterRetention:
    """The dead-letter retention loop, on connections of its own (run by ingest processes)."""
    return DeadLetterRetention(
        DeadLetterStore(database(settings, pool_size=0)), days=settings.dead_letter_retention_days
    )


def close_worker(worker: IngestWorker) -> None:
    """Close the worker's writer thread and Kafka clients (the ledger is closed by its
    owner)."""
    worker.close()
    worker.consumer.close()
    worker.producer.close(timeout=5)


def build_pusher(settings: Settings, ledger: BillingLedger) -> LinePusher:
    """The line pusher with its own Stripe client (breaker, limits) for this process."""
    return LinePusher(
        ledger,
        StripeGateway(settings.stripe()),
        settings.retry_policy(),
        key_window=timedelta(seconds=settings.stripe_key_window_s),
        landing=settings.landing_window(),
    )


def build_corrections(pusher: LinePusher) -> Corrections:
    """Adoptions and reversals, on the pusher's ledger, Stripe client and clock."""
    return Corrections(pusher.ledger, pusher.gateway, clock=pusher.clock)


def build_scheduler(settings: Settings, pusher: LinePusher) -> LineScheduler:
    """The schedule of line pushes, run by ``stripe_max_concurrency`` threads."""
    return LineScheduler(
        pusher,
        settle_interval_s=settings.settle_interval_s,
        workers=settings.stripe_max_concurrency,
        quiet_s=settings.settle_quiet_s,
        quiet_min_s=settings.settle_quiet_min_s,
    )


def build_closer(
    settings: Settings, pusher: LinePusher, scheduler: LineScheduler | None = None
) -> InvoiceCloser:
    """The invoice closer, on the pusher's ledger and Stripe client (one budget); lines
    it waits for are handed to ``scheduler``, or pushed at once without one (the CLI)."""
    return InvoiceCloser(
        pusher.ledger,
        pusher.gateway,
        scheduler.hand_over
        if scheduler is not None
        else (lambda line, _customer: pusher.push(line)),
        settings.retry_policy(),
        timedelta(seconds=settings.invoice_grace_s),
        landing=settings.landing_window(),
    )


def build_draft_checker(pusher: LinePusher, scheduler: LineScheduler) -> DraftChecker:
    """Open drafts read back, drifted lines handed to the scheduler (their pushers)."""
    return DraftChecker(
        pusher.ledger,
        pusher.gateway,
        scheduler.hand_over,
        clock=pusher.clock,
    )


def build_webhook_server(settings: Settings, ledger: BillingLedger) -> HttpServer:
    """The webhook listener (not started); needs ``WEBHOOK_SECRETS``. Its receipts' pool
    waits at most 3 s for a connection, so a database away is a 503 soon (and Stripe
    retries), not a request held until Stripe's own timeout."""
    db = Database(
        settings.database_url, pool_size=settings.db_pool_size, connect_timeout_s=3, wait_s=3.0
    )
    handler = WebhookHandler(
        ledger,
        WebhookStore(db),
        settings.webhook_secret_list(),
        tolerance_s=settings.webhook_tolerance_s,
        max_group=settings.webhook_group_max,
        answer_within_s=2 * settings.webhook_timeout_s,
    )
    limits = HttpLimits(
        header_timeout_s=settings.webhook_timeout_s,
        body_timeout_s=settings.webhook_timeout_s,
        max_body_bytes=settings.webhook_max_body_bytes,
        limit_concurrency=settings.webhook_max_concurrency * 4,
    )
    server = webhook_server(
        handler, settings.webhook_host, settings.webhook_port, limits,
        settings.webhook_max_concurrency,
    )  # fmt: skip
    handler.start()
    server.on_stop = handler.stop  # its last groups, then its receipts' pool
    return server


def build_relay(settings: Settings, db: Database | None = None) -> Relay:
    return Relay(
        db or database(settings, pool_size=0),
        make_producer(settings.kafka_bootstrap),
        settings.events_topic,
    )


def build_alert_relay(settings: Settings, db: Database | None = None) -> AlertRelay:
    """The log's alert crossings to ``billing.alerts``, with a producer of its own (a
    flush waits for its own sends, not for the events relay's)."""
    return AlertRelay(
        db or database(settings, pool_size=0),
        make_producer(settings.kafka_bootstrap),
        settings.alerts_topic,
    )


def build_alert_webhooks(settings: Settings, db: Database | None = None) -> AlertWebhooks:
    """The alert webhooks role: ``billing.alerts`` in its own group, to the endpoints."""
    consumer = make_consumer(
        settings.kafka_bootstrap, settings.alerts_topic, settings.alert_webhook_group
    )
    return AlertWebhooks(db or database(settings), consumer, settings.alert_delivery_policy())


def build_charge_worker(
    settings: Settings,
    scheduler: LineScheduler,
    db: Database | None = None,
    *,
    listener: Ownership | None = None,
) -> ChargeWorker:
    """The process manager: line changes on ``billing.events`` to the scheduler; what it
    cannot read is set aside in the dead letters. ``listener`` hears which partitions it
    holds (the lines this process pushes)."""
    consumer = make_consumer(
        settings.kafka_bootstrap,
        settings.events_topic,
        settings.charge_group,
        max_poll_records=2000,
        fetch_max_wait_ms=settings.fetch_max_wait_ms,
        listener=listener,
    )
    return ChargeWorker(scheduler, consumer, DeadLetterStore(db or database(settings, pool_size=0)))


def build_ownership(settings: Settings, ledger: BillingLedger) -> Ownership:
    """Which lines this process pushes: those of the partitions its charge consumer holds
    (each claimed in ``ledger`` when it is given, as ``host:pid``), and any whose oldest
    unsent change is ``line_takeover_s`` old (the owner is late)."""
    owner = f"{socket.gethostname()}:{os.getpid()}"
    return Ownership(
        settings.events_topic,
        settings.events_partitions,
        timedelta(seconds=settings.line_takeover_s),
        claim=lambda partition: ledger.claim_partition(settings.events_topic, partition, owner),
    )


def build_purchaser(settings: Settings, pusher: LinePusher) -> Purchaser:
    """The purchaser of prepaid credit, on the pusher's ledger and Stripe client."""
    gateway = pusher.gateway
    if not isinstance(gateway, StripeGateway):  # a fake pusher's: the real client
        gateway = StripeGateway(settings.stripe())
    return Purchaser(pusher.ledger, gateway, settings.retry_policy(), clock=pusher.clock)


def build_reconciler(
    settings: Settings,
    pusher: LinePusher,
    scheduler: LineScheduler,
    db: Database | None = None,
    ownership: Ownership | None = None,
) -> Reconciler:
    db = db or database(settings, pool_size=0)
    return Reconciler(
        build_corrections(pusher),
        scheduler,
        db,
        ownership=ownership,
        clock=pusher.clock,
        repricer=Repricer(pusher.ledger, db),
        purchaser=build_purchaser(settings, pusher),
    )


def build_projector(
    settings: Settings,
    ledger: BillingLedger,
    db: Database | None = None,
    *,
    lane: Literal["all", "main", "credits"] = "all",
) -> Projector:
    """The projector of the SQL read models, decoding with the ledger's own mapper:
    every read model (``lane="all"``), or one of the project role's two lanes: ``main``
    (all but the credit projections) or ``credits`` (those alone, reading only their
    events; ``projections.projector.CREDIT_LANE``)."""
    db = db or database(settings, pool_size=0)
    decode = ledger.mapper.to_domain_event
    if lane == "main":
        return Projector(db, decode, projections=MAIN_LANE)
    if lane == "credits":
        return Projector(db, decode, projections=CREDIT_LANE, topics=CREDIT_TOPICS)
    return Projector(db, decode)
