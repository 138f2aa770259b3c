"""Running roles: ``run_roles`` runs a set of worker roles, each in its own thread under
``adapters.supervisor`` (a role that fails is rebuilt and restarted; only repeated
failure ends the process), until stopped, and returns only once every role has ended.
With ``ingest_processes`` > 1, ingest runs as that many child processes, each a role of
the same supervisor (``adapters.ingest.processes``).
Each role's factory is here (``_ingest_role``, ..., ``_webhook_role``, ``_alerts_role``);
the parts they run are built by ``adapters.bootstrap``, the composition root.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal
from uuid import UUID

from adapters.alerts.worker import AlertWebhooks
from adapters.bootstrap import (
    build_alert_relay,
    build_alert_webhooks,
    build_charge_worker,
    build_closer,
    build_draft_checker,
    build_ingest_worker,
    build_ownership,
    build_projector,
    build_pusher,
    build_reconciler,
    build_relay,
    build_retention,
    build_scheduler,
    build_webhook_server,
    close_worker,
    database,
    login,
)
from adapters.charging.closer import InvoiceCloser
from adapters.charging.drafts import DraftChecker
from adapters.charging.ownership import Ownership
from adapters.charging.process_manager import ChargeWorker
from adapters.charging.pusher import LinePusher
from adapters.charging.reconciler import Reconciler
from adapters.charging.scheduler import LineScheduler
from adapters.drills import fail_first_call, install_drill
from adapters.ingest.processes import child_roles, watch_parent
from adapters.ingest.worker import IngestStats
from adapters.observability.heartbeat import Heartbeat, Pulses
from adapters.runtime import tune_switching
from adapters.settings import Settings
from adapters.stripe.breaker import CircuitBreaker
from adapters.stripe.client import StripeGateway
from adapters.supervisor import RestartPolicy, RoleFactory, RoleRun, Supervisor
from projections.invoices import drafts_to_check, due_invoices
from store.connections import Database
from store.ledger import BillingLedger

__all__ = ["drive_invoices", "restart_policy", "run_ingest_child", "run_roles"]

log = logging.getLogger(__name__)

# -- running roles ---------------------------------------------------------------------


def run_roles(
    settings: Settings,
    ledger: BillingLedger,
    roles: list[str],
    stop: threading.Event,
    *,
    drill: str = "",
    log_level: str = "INFO",
) -> None:
    """Run the roles, each supervised (``adapters.supervisor``: a failed role restarts),
    until ``stop`` is set; return once every role has ended, so the caller may close
    the ledger. Raises ``WorkerFailed`` when a role failed too often (then ``stop`` is
    set and every other role has ended too)."""
    with database(settings) as db:
        _run_roles(settings, ledger, db, roles, stop, drill=drill, log_level=log_level)
    # the pool closes here, after every role's thread has ended


def _run_roles(
    settings: Settings,
    ledger: BillingLedger,
    db: Database,
    roles: list[str],
    stop: threading.Event,
    *,
    drill: str,
    log_level: str,
) -> None:
    if "webhooks" in roles and not settings.webhook_secret_list():
        log.warning("webhooks role not started: WEBHOOK_SECRETS is not set")
        roles = [r for r in roles if r != "webhooks"]
    factories: dict[str, RoleFactory] = {}
    pulses = Pulses()
    stats: dict[str, Callable[[], object]] = {}
    pusher: LinePusher | None = None
    breakers: list[CircuitBreaker] = []
    beating = list(roles)  # the roles this process's heartbeat names
    processes = settings.ingest_process_count() if "ingest" in roles else 0
    if processes > 1:  # each in a process of its own (adapters.ingest.processes)
        factories.update(child_roles(settings, processes, run_ingest_child, log_level, pulses.of))
        beating = [r for r in roles if r != "ingest"] + [f"ingest-processes:{processes}"]
    elif "ingest" in roles:
        factories["ingest"], stats["ingest"] = _ingest_role(settings, ledger, db, pulses)
        retention = build_retention(settings)
        factories["retention"] = lambda: retention.run
        stats["retention"] = lambda: {"dead_letters_purged": retention.purged}
    if "relay" in roles:  # two lanes: an alert waits for no event (adapters.alerts.relay)
        factories.update(_relay_roles(settings, db, pulses))
    if "project" in roles:  # two lanes: the credit projections keep up on their own
        factories["project"] = _project_role(settings, ledger, db, pulses, "main")
        factories["project-credits"] = _project_role(settings, ledger, db, pulses, "credits")
    if "charge" in roles or "reconcile" in roles:
        # One pusher (one Stripe client: breaker, limits) and one schedule across restarts.
        pusher = build_pusher(settings, ledger)
        scheduler = build_scheduler(settings, pusher)
        factories["push"] = lambda: lambda stop: scheduler.run(stop, pulses.of("push"))
        stats["push"] = lambda: {
            "pushed": scheduler.pushed,
            "requests": scheduler.requests,
            "charged": scheduler.charged,
            "waiting": scheduler.waiting(),
        }
        if isinstance(pusher.gateway, StripeGateway):
            breakers.append(pusher.gateway.breaker)
        # With a charge consumer here, this process pushes the lines of the customers
        # whose partitions it holds (adapters.charging.ownership); without, all it finds.
        ownership = build_ownership(settings, ledger) if "charge" in roles else None
        if ownership is not None:
            pusher.claims = ownership.claim_for  # its pushes carry the partition's claim
            factories["charge"], stats["charge"] = _charge_role(
                settings, scheduler, db, pulses, drill, ownership
            )
        if "reconcile" in roles:
            factories["reconcile"] = _reconcile_role(
                settings, pusher, scheduler, db, pulses, ownership
            )
            closer = build_closer(settings, pusher, scheduler)
            checker = build_draft_checker(pusher, scheduler)
            factories["close"], stats["close"] = _close_role(settings, closer, checker, db, pulses)
    if "webhooks" in roles:
        factories["webhooks"] = _webhook_role(settings, ledger, pulses)
    if "alerts" in roles:
        factories["alerts"], stats["alerts"] = _alerts_role(settings, db, pulses)
    if drill:
        install_drill(drill, ledger=ledger if "ingest" in roles else None, pusher=pusher)
    supervised: list[Supervisor] = []  # the heartbeat reports the supervisor's status
    heartbeat = Heartbeat(
        settings,
        login(settings, pool_size=0, connect_timeout_s=5),
        beating,
        breakers=breakers,
        stats=lambda: {
            **{k: f() for k, f in stats.items()},
            **(supervised[0].status() if supervised else {}),
        },
        pulses=pulses,
    )
    factories["heartbeat"] = lambda: heartbeat.run
    supervised.append(Supervisor(factories, stop, policy=restart_policy(settings)))
    supervised[0].run()


def run_ingest_child(settings_data: dict[str, Any], log_level: str, parent_pid: int) -> None:
    """One ingest process of ``run --ingest-processes N`` (``adapters.ingest.processes``):
    the ingest role (its retention and heartbeat too) under a supervisor of its own,
    until SIGTERM/SIGINT or its parent is gone."""
    from adapters.bootstrap import open_ledger
    from adapters.observability.logs import configure_logging
    from adapters.observability.telemetry import configure_tracing
    from adapters.runtime import tune_gc

    configure_logging(log_level)
    settings = Settings(**{**settings_data, "ingest_processes": 1})  # ingest right here
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=watch_parent, args=(parent_pid, stop), daemon=True).start()
    shutdown_tracing = configure_tracing(settings)
    try:
        with open_ledger(settings) as ledger:
            tune_gc()
            run_roles(settings, ledger, ["ingest"], stop)
    finally:
        shutdown_tracing()


def restart_policy(settings: Settings) -> RestartPolicy:
    """When a failed role restarts, and when failing ends the process (the settings)."""
    return RestartPolicy(
        base_s=settings.role_restart_base_s,
        max_delay_s=settings.role_restart_max_delay_s,
        max_failures=settings.role_max_failures,
        window_s=settings.role_failure_window_s,
    )


def _ingest_role(
    settings: Settings, ledger: BillingLedger, db: Database, pulses: Pulses
) -> tuple[RoleFactory, Callable[[], object]]:
    """The ingest role's factory (a fresh consumer and producer each time, the counters
    kept) and its heartbeat counters."""
    totals = IngestStats()
    if settings.ingest_overlap_saves:
        tune_switching()  # its writer thread gets the GIL back sooner (adapters.runtime)

    def build() -> RoleRun:
        worker = build_ingest_worker(settings, ledger, db)
        worker.stats = totals
        worker.pulse = pulses.of("ingest")
        return lambda stop: _closing(lambda: worker.run(stop), lambda: close_worker(worker))

    return build, lambda: {k: v for k, v in vars(totals).items() if isinstance(v, int)}


def _relay_roles(settings: Settings, db: Database, pulses: Pulses) -> dict[str, RoleFactory]:
    """The relay role's two lanes, each a supervised thread with its own producer:
    ``relay`` (every event to ``billing.events``) and ``relay-alerts`` (the alert
    crossings to ``billing.alerts``, on a position of their own)."""

    def events() -> RoleRun:
        relay = build_relay(settings, db)
        relay.pulse = pulses.of("relay")
        return lambda stop: _closing(lambda: relay.run(stop), relay.producer.close)

    def alerts() -> RoleRun:
        relay = build_alert_relay(settings, db)
        relay.pulse = pulses.of("relay-alerts")
        return lambda stop: _closing(lambda: relay.run(stop), relay.producer.close)

    return {"relay": events, "relay-alerts": alerts}


CREDIT_LANE_IDLE_WAIT_S = 0.01


def _project_role(
    settings: Settings,
    ledger: BillingLedger,
    db: Database,
    pulses: Pulses,
    lane: Literal["main", "credits"],
) -> RoleFactory:
    """One lane of the project role: ``main`` (its loop named ``project``) or ``credits``
    (``project-credits``), each a projector and a supervised thread of its own."""
    name = "project" if lane == "main" else "project-credits"
    # The credit lane's read is one indexed statement: polled often, a balance waits for
    # the poll less (the main lane's rounds over every read model keep the default).
    idle_wait_s = CREDIT_LANE_IDLE_WAIT_S if lane == "credits" else None

    def build() -> RoleRun:
        projector_ = build_projector(settings, ledger, db, lane=lane)
        projector_.pulse = pulses.of(name)
        if idle_wait_s is None:
            return projector_.run
        return lambda stop: projector_.run(stop, idle_wait_s=idle_wait_s)

    return build


def _charge_role(  # noqa: PLR0917
    settings: Settings,
    scheduler: LineScheduler,
    db: Database,
    pulses: Pulses,
    drill: str,
    ownership: Ownership,
) -> tuple[RoleFactory, Callable[[], object]]:
    """The process manager's factory (a fresh consumer each time, the counters kept)."""
    names = ("seen", "scheduled", "set_aside")
    counts = dict.fromkeys(names, 0)  # of the workers that ended, plus the current one
    current: list[ChargeWorker] = []
    armed = [drill == "fail_charge_once"]

    def build() -> RoleRun:
        for ended in current:
            for name in names:
                counts[name] += getattr(ended, name)
        worker = build_charge_worker(settings, scheduler, db, listener=ownership)
        worker.pulse = pulses.of("charge")
        if armed[0]:
            fail_first_call(worker, "poll_once", armed)
        current[:] = [worker]
        return lambda stop: _closing(lambda: worker.run(stop), worker.consumer.close)

    def stats() -> dict[str, int]:
        live = current[0] if current else None
        return {name: counts[name] + (getattr(live, name) if live else 0) for name in names}

    return build, stats


def _reconcile_role(  # noqa: PLR0917
    settings: Settings,
    pusher: LinePusher,
    scheduler: LineScheduler,
    db: Database,
    pulses: Pulses,
    ownership: Ownership | None,
) -> RoleFactory:
    def build() -> RoleRun:
        reconciler = build_reconciler(settings, pusher, scheduler, db, ownership)
        return _reconcile_loop(reconciler, settings.reconcile_interval_s, pulses.of("reconcile"))

    return build


def _close_role(
    settings: Settings,
    closer: InvoiceCloser,
    checker: DraftChecker,
    db: Database,
    pulses: Pulses,
) -> tuple[RoleFactory, Callable[[], object]]:
    """The invoice closer's loop: every ``reconcile_interval_s``, each invoice with a
    step due (``projections.invoices.due_invoices``) is driven, ``stripe_max_concurrency``
    at a time; the Stripe client's budget bounds the pressure. Then up to
    ``draft_checks_per_pass`` open drafts are read back (``adapters.charging.drafts``)."""
    totals: dict[str, int] = {}
    budget = settings.draft_checks_per_pass()

    def build() -> RoleRun:
        pulse = pulses.of("close")

        def loop(stop: threading.Event) -> None:
            while not stop.is_set():
                pulse()
                with db.connection() as conn:
                    due = due_invoices(conn)
                if due:
                    results = drive_invoices(closer, due, stop, settings.stripe_max_concurrency)
                    for name, n in results.items():
                        totals[name] = totals.get(name, 0) + n
                    if set(results) - {"not_due", "waiting", "done"}:
                        log.info("invoices driven", extra={"step": "close", **results})
                if budget and not stop.is_set():
                    with db.connection() as conn:
                        drafts = drafts_to_check(conn, settings.settle_interval_s, budget)
                    for invoice_id in drafts:
                        if stop.is_set():
                            break
                        name = f"draft_{checker.check(invoice_id)}"
                        totals[name] = totals.get(name, 0) + 1
                stop.wait(settings.reconcile_interval_s)

        return loop

    return build, lambda: dict(totals)


def _webhook_role(settings: Settings, ledger: BillingLedger, pulses: Pulses) -> RoleFactory:
    """The webhook listener: serves until stopped; a server that dies fails the role
    (and the supervisor starts a new one)."""

    def build() -> RoleRun:
        server = build_webhook_server(settings, ledger)
        pulse = pulses.of("webhooks")

        def serve(stop: threading.Event) -> None:
            server.start()
            try:
                if not server.wait_started():
                    raise RuntimeError("the webhook listener did not start")
                while not stop.wait(1.0):
                    pulse()
                    if not server.alive:
                        raise RuntimeError("the webhook listener stopped")
            finally:
                server.stop()

        return serve

    return build


def _alerts_role(
    settings: Settings, db: Database, pulses: Pulses
) -> tuple[RoleFactory, Callable[[], object]]:
    """The alert webhooks (``adapters.alerts.worker``): a fresh consumer and lanes each
    time; the counters of the current one (the deliveries' table holds the history)."""
    current: list[AlertWebhooks] = []

    def build() -> RoleRun:
        worker = build_alert_webhooks(settings, db)
        worker.pulse = pulses.of("alerts")
        current[:] = [worker]
        return worker.run

    return build, lambda: current[0].stats() if current else {}


def drive_invoices(
    closer: InvoiceCloser, invoice_ids: list[UUID], stop: threading.Event, parallel: int
) -> dict[str, int]:
    """One ``step`` of each invoice, ``parallel`` at a time, none started once ``stop``
    is set; how many ended in each result."""
    counts: dict[str, int] = {}
    with ThreadPoolExecutor(parallel, thread_name_prefix="close") as pool:
        for done in pool.map(lambda i: None if stop.is_set() else closer.step(i), invoice_ids):
            if done is not None:
                counts[str(done.result)] = counts.get(str(done.result), 0) + 1
    return counts


def _reconcile_loop(
    reconciler: Reconciler, interval_s: float, pulse: Callable[[], None]
) -> RoleRun:
    def loop(stop: threading.Event) -> None:
        while not stop.is_set():
            pulse()
            report = reconciler.pass_once(stop)
            if report.adopted:
                log.info("reconciled", extra={"step": "reconcile", **vars(report)})
            stop.wait(interval_s)

    return loop


def _closing(body: Callable[[], None], close: Callable[[], object]) -> None:
    try:
        body()
    finally:
        close()
