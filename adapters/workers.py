"""Runs worker roles (ingest, relay, project, charge, reconcile), each in its own thread,
until stopped."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from adapters.breaker import CircuitBreaker
from adapters.heartbeat import Heartbeat, Pulses
from adapters.ledger import BillingLedger
from adapters.runtime import (
    build_charge_worker,
    build_charger,
    build_ingest_worker,
    build_projector,
    build_reconciler,
    build_relay,
    close_worker,
)
from adapters.settings import Settings

__all__ = ["WorkerFailed", "run_roles"]

log = logging.getLogger(__name__)


def run_roles(
    settings: Settings,
    ledger: BillingLedger,
    roles: list[str],
    stop: threading.Event,
    *,
    kill_after_save: bool = False,
    drill: str = "",
) -> None:
    """Start the roles; return when ``stop`` is set (or a role fails, which stops all)."""
    targets: dict[str, Callable[[], None]] = {}
    pulses = Pulses()
    breakers: list[CircuitBreaker] = []
    stats: dict[str, Callable[[], object]] = {}
    if "ingest" in roles:
        ingest = build_ingest_worker(settings, ledger, kill_after_save=kill_after_save)
        ingest.pulse = pulses.of("ingest")
        targets["ingest"] = lambda: _closing(lambda: ingest.run(stop), lambda: close_worker(ingest))
        stats["ingest"] = lambda: {
            k: v for k, v in vars(ingest.stats).items() if isinstance(v, int)
        }
    if "relay" in roles:
        relay = build_relay(settings)
        relay.pulse = pulses.of("relay")
        targets["relay"] = lambda: _closing(lambda: relay.run(stop), relay.producer.close)
    if "project" in roles:
        projector = build_projector(settings, ledger)
        projector.pulse = pulses.of("project")
        targets["project"] = lambda: projector.run(stop)
    if "charge" in roles:
        charge = build_charge_worker(settings, build_charger(settings, ledger, drill=drill))
        charge.pulse = pulses.of("charge")
        targets["charge"] = lambda: _closing(lambda: charge.run(stop), charge.consumer.close)
        breakers.append(charge.charger.stripe.breaker)
        stats["charge"] = lambda: {"driven": charge.driven}
    if "reconcile" in roles:
        reconciler = build_reconciler(settings, build_charger(settings, ledger, drill=drill))
        breakers.append(reconciler.charger.stripe.breaker)

        pulse = pulses.of("reconcile")

        def reconcile() -> None:
            while not stop.is_set():
                pulse()
                report = reconciler.pass_once()
                if report.driven:
                    log.info("reconciled", extra={"step": "reconcile", **vars(report)})
                stop.wait(settings.reconcile_interval_s)

        targets["reconcile"] = reconcile
    heartbeat = Heartbeat(
        settings,
        roles,
        breakers=breakers,
        stats=lambda: {k: f() for k, f in stats.items()},
        pulses=pulses,
    )
    targets["heartbeat"] = lambda: heartbeat.run(stop)

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


class WorkerFailed(RuntimeError):
    """Raised when a worker role stopped on an error (the others are stopped too)."""


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
