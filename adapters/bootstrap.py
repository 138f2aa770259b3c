"""The composition root: every long-lived part of a process is built here, from settings.

``migrate`` applies the schema's migrations (the only DDL, run once per release by
``billing-ledger migrate``); ``prepare`` is what a process does at start, with no DDL:
it waits until the schema is current, records its health deadlines and creates the
topics it needs; ``open_ledger`` opens the event store; ``build_*`` make one worker
role each; ``run_roles`` runs a set of roles, each in its
own thread, until stopped. The CLI, the demo, the benchmarks and the tests build
processes through these functions only. Fault drills (``DRILLS``) are installed here
as wrappers around the built parts, never as switches of production constructors.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from adapters.broker import ensure_topics, make_consumer, make_producer
from adapters.charging.charger import Charger
from adapters.charging.process_manager import ChargeWorker, SeekToStored
from adapters.charging.reconciler import Reconciler
from adapters.charging.relay import Relay
from adapters.errors import WorkerFailed
from adapters.ingest.worker import IngestWorker
from adapters.observability.heartbeat import Heartbeat, Pulses
from adapters.settings import Settings
from adapters.stripe.breaker import CircuitBreaker
from adapters.stripe.client import StripeCharges
from projections import queue_health
from projections.projector import Projector
from store.connections import Database
from store.dead_letters import DeadLetterStore
from store.ledger import BillingLedger
from store.migrations import AppliedMigration, SchemaStatus, wait_until_current
from store.migrations import migrate as apply_migrations
from store.migrations import schema_status as read_schema_status
from store.recorder import postgres_env

__all__ = [
    "DRILLS",
    "ROLES",
    "build_charge_worker",
    "build_charger",
    "build_ingest_worker",
    "build_projector",
    "build_reconciler",
    "build_relay",
    "close_worker",
    "database",
    "install_drill",
    "migrate",
    "open_ledger",
    "prepare",
    "run_roles",
    "schema_status",
]

log = logging.getLogger(__name__)

ROLES = ("ingest", "relay", "project", "charge", "reconcile")
DRILLS = ("kill_after_save", "kill_after_stripe", "kill_before_stripe")


def database(settings: Settings, *, pool_size: int | None = None) -> Database:
    """Connections to the configured database: a pool of ``pool_size`` (default: the
    setting) opened on first use, or with 0 a fresh connection each time (nothing to
    close: for one-off commands and parts built on their own)."""
    size = settings.db_pool_size if pool_size is None else pool_size
    return Database(settings.database_url, pool_size=size)


def migrate(
    settings: Settings, *, on_applied: Callable[[AppliedMigration], None] = lambda m: None
) -> list[AppliedMigration]:
    """Apply the schema's pending migrations, each once (``store.migrations``); returns
    those this call applied. The one place where DDL runs; safe to run concurrently."""
    with Database(settings.database_url).dedicated(autocommit=True) as conn:
        return apply_migrations(
            conn,
            lock_timeout_s=settings.migrate_lock_timeout_s,
            attempts=settings.migrate_attempts,
            on_applied=on_applied,
        )


def schema_status(settings: Settings) -> SchemaStatus:
    """This build's migrations beside what the database has applied (reads only)."""
    with Database(settings.database_url).dedicated(autocommit=True) as conn:
        return read_schema_status(conn)


def prepare(settings: Settings, *, topics: bool = True) -> None:
    """What a process does at start: no DDL, no lock beyond one row.

    Waits until the schema is current (logging "schema at N, this build needs M: run
    billing-ledger migrate" every ``schema_check_interval_s``; raises SchemaNotReady
    after ``schema_wait_s``, SchemaAhead at once when a newer build migrated); then
    records its deadlines in ``billing.health_settings`` (one row: the last process to
    start wins) and creates the topics if they are missing.
    """
    db = Database(settings.database_url)

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
        )
    if topics:
        ensure_topics(
            settings.kafka_bootstrap,
            [
                (settings.usage_topic, settings.usage_partitions),
                (settings.dlq_topic, 1),
                (settings.events_topic, settings.events_partitions),
            ],
        )


def open_ledger(settings: Settings) -> BillingLedger:
    """The ledger application on the configured database. It creates no table
    (``CREATE_TABLE=n``): the schema is the migrations' (``prepare`` waits for it)."""
    env = postgres_env(settings.database_url, pool_size=settings.db_pool_size)
    env["CREATE_TABLE"] = "n"
    return BillingLedger(settings.load_prices(), env=env)


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
        poll_timeout_ms=settings.poll_timeout_ms,
    )


def close_worker(worker: IngestWorker) -> None:
    """Close the worker's Kafka clients (the ledger is closed by its owner)."""
    worker.consumer.close()
    worker.producer.close(timeout=5)


def build_charger(settings: Settings, ledger: BillingLedger) -> Charger:
    """The saga driver with its own Stripe client (breaker, limits) for this process."""
    return Charger(ledger, StripeCharges(settings.stripe()), settings.retry_policy())


def build_relay(settings: Settings, db: Database | None = None) -> Relay:
    return Relay(
        db or database(settings, pool_size=0),
        make_producer(settings.kafka_bootstrap),
        settings.events_topic,
    )


def build_charge_worker(
    settings: Settings, charger: Charger, db: Database | None = None
) -> ChargeWorker:
    listener = SeekToStored(
        db or database(settings, pool_size=0), settings.charge_group, settings.events_topic
    )
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
        group=settings.charge_group,
        topic=settings.events_topic,
        parallel=settings.stripe_max_concurrency,
    )


def build_reconciler(
    settings: Settings, charger: Charger, db: Database | None = None
) -> Reconciler:
    return Reconciler(
        charger, db or database(settings, pool_size=0), parallel=settings.stripe_max_concurrency
    )


def build_projector(
    settings: Settings, ledger: BillingLedger, db: Database | None = None
) -> Projector:
    """The projector of the SQL read models, decoding with the ledger's own mapper."""
    return Projector(db or database(settings, pool_size=0), ledger.mapper.to_domain_event)


# -- drills ----------------------------------------------------------------------------


def install_drill(drill: str, *, ingest: IngestWorker | None, chargers: list[Charger]) -> None:
    """Wrap the built parts so that the process dies (SIGKILL) at the drill's moment:

    * ``kill_after_save``: after an ingest batch is saved, before its offsets commit;
    * ``kill_before_stripe``: as a charge is about to call Stripe;
    * ``kill_after_stripe``: after Stripe answered a charge, before it is recorded.
    """
    if drill not in DRILLS:
        raise ValueError(f"unknown drill {drill!r} (one of: {', '.join(DRILLS)})")
    if drill == "kill_after_save" and ingest is not None:
        _wrap(ingest.ledger, "record_usage", after=_die)
    for charger in chargers:
        if drill == "kill_before_stripe":
            _wrap(charger.stripe, "charge", before=_die)
        elif drill == "kill_after_stripe":
            _wrap(charger.stripe, "charge", after=_die)


def _wrap(
    obj: object,
    name: str,
    *,
    before: Callable[[], None] = lambda: None,
    after: Callable[[], None] = lambda: None,
) -> None:
    original = getattr(obj, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        before()
        result = original(*args, **kwargs)
        after()
        return result

    setattr(obj, name, wrapped)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


# -- running roles ---------------------------------------------------------------------


def run_roles(
    settings: Settings,
    ledger: BillingLedger,
    roles: list[str],
    stop: threading.Event,
    *,
    drill: str = "",
) -> None:
    """Start the roles; return when ``stop`` is set (or a role fails, which stops all)."""
    with database(settings) as db:
        _run_roles(settings, ledger, db, roles, stop, drill=drill)


def _run_roles(
    settings: Settings,
    ledger: BillingLedger,
    db: Database,
    roles: list[str],
    stop: threading.Event,
    *,
    drill: str,
) -> None:
    targets: dict[str, Callable[[], None]] = {}
    pulses = Pulses()
    breakers: list[CircuitBreaker] = []
    stats: dict[str, Callable[[], object]] = {}
    chargers: list[Charger] = []
    ingest: IngestWorker | None = None
    if "ingest" in roles:
        ingest = worker = build_ingest_worker(settings, ledger, db)
        worker.pulse = pulses.of("ingest")
        targets["ingest"] = lambda: _closing(lambda: worker.run(stop), lambda: close_worker(worker))
        stats["ingest"] = lambda: {
            k: v for k, v in vars(worker.stats).items() if isinstance(v, int)
        }
    if "relay" in roles:
        relay = build_relay(settings, db)
        relay.pulse = pulses.of("relay")
        targets["relay"] = lambda: _closing(lambda: relay.run(stop), relay.producer.close)
    if "project" in roles:
        projector_ = build_projector(settings, ledger, db)
        projector_.pulse = pulses.of("project")
        targets["project"] = lambda: projector_.run(stop)
    if "charge" in roles:
        charge = build_charge_worker(settings, build_charger(settings, ledger), db)
        charge.pulse = pulses.of("charge")
        targets["charge"] = lambda: _closing(lambda: charge.run(stop), charge.consumer.close)
        chargers.append(charge.charger)
        stats["charge"] = lambda: {"driven": charge.driven}
    if "reconcile" in roles:
        reconciler = build_reconciler(settings, build_charger(settings, ledger), db)
        chargers.append(reconciler.charger)
        targets["reconcile"] = _reconcile_loop(
            reconciler, stop, settings.reconcile_interval_s, pulses.of("reconcile")
        )
    breakers += [c.stripe.breaker for c in chargers if isinstance(c.stripe, StripeCharges)]
    if drill:
        install_drill(drill, ingest=ingest, chargers=chargers)
    heartbeat = Heartbeat(
        settings,
        Database(settings.database_url, pool_size=0, connect_timeout_s=5),
        roles,
        breakers=breakers,
        stats=lambda: {k: f() for k, f in stats.items()},
        pulses=pulses,
    )
    targets["heartbeat"] = lambda: heartbeat.run(stop)
    _run_threads(targets, stop)


def _reconcile_loop(
    reconciler: Reconciler, stop: threading.Event, interval_s: float, pulse: Callable[[], None]
) -> Callable[[], None]:
    def loop() -> None:
        while not stop.is_set():
            pulse()
            report = reconciler.pass_once()
            if report.driven:
                log.info("reconciled", extra={"step": "reconcile", **vars(report)})
            stop.wait(interval_s)

    return loop


def _run_threads(targets: dict[str, Callable[[], None]], stop: threading.Event) -> None:
    failures: list[str] = []
    threads = [
        threading.Thread(target=_guard(name, fn, stop, failures), name=name, daemon=True)
        for name, fn in targets.items()
    ]
    for t in threads:
        t.start()
    stop.wait()
    for t in threads:
        t.join(timeout=30)
    if failures:
        raise WorkerFailed("; ".join(failures))


def _closing(body: Callable[[], None], close: Callable[[], object]) -> None:
    try:
        body()
    finally:
        close()


def _guard(
    name: str, fn: Callable[[], None], stop: threading.Event, failures: list[str]
) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        except Exception as exc:
            log.exception("worker %s failed; stopping the process", name)
            failures.append(f"{name} worker failed: {type(exc).__name__}: {exc}")
            stop.set()
            return
        if not stop.is_set():  # a role only returns when asked to
            log.error("worker %s stopped on its own; stopping the process", name)
            failures.append(f"{name} worker stopped unexpectedly")
            stop.set()

    return run
