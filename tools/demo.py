"""``billing-ledger demo``: the whole pipeline on the embedded default, end to end.

It starts a private PostgreSQL and the Tansu broker, produces synthetic usage
(``tools.synthetic``: duplicates, malformed records, one customer over its limit),
ingests it, charges every reserved transaction through the Stripe emulator (relay,
process manager, reconciler), closes the invoices of the two hourly periods the usage
fell in (prices: a tiered meter, a price change during the usage and a contract with a
minimum, ``tools.demo_pricing``), finalizes them in Stripe, has the customers pay them
(one customer's card declined first) and records each payment from Stripe's signed
webhooks on the ledger's own listener; then reads back a summary from the database and
the emulator, audits the whole history and shows the queue health. Last, the credits
scene (``tools.demo_credits``): a customer burns a prepaid grant to zero and is cut
off, a spend alert reaches a webhook receiver signed, and an automatic top-up is
bought, paid and used.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from collections import Counter
from typing import Any

from pydantic import SecretStr

from adapters.audit.replay import Scope
from adapters.audit.report import audit, stripe_invoice_items, stripe_invoice_totals
from adapters.bootstrap import (
    build_ingest_worker,
    build_projector,
    close_worker,
    database,
    migrate,
    open_ledger,
    prepare,
)
from adapters.ingest.producer import UsageProducer
from adapters.ingest.worker import IngestStats
from adapters.observability.health_server import health_report
from adapters.observability.logs import configure_logging
from adapters.roles import run_roles
from adapters.settings import Settings
from domain.health import Thresholds
from infra.embedded import EmbeddedPostgres, TansuBroker
from infra.stripe_emulator import StripeEmulator
from projections.invoice_lines import lines
from projections.invoices import invoices
from projections.projector import projector_behind
from projections.transactions import open_transactions
from store.ledger import BillingLedger
from store.roles import AUDITOR, WRITER
from tools.demo_credits import run_credit_scene
from tools.demo_pricing import pricing_summary, set_up_pricing
from tools.demo_report import summarize
from tools.synthetic import DEMO_LIMITS, Produced, synthetic_usage

__all__ = ["charging_settings", "run_demo"]

# -- the demo command ----------------------------------------------------------


def run_demo(records: int, *, seed: int = 7, timeout: float = 300.0) -> dict[str, Any]:
    """Start the embedded stack, produce ``records``, ingest them all, summarise, stop."""
    from adapters.progress import Progress, step

    configure_logging("ERROR")  # the demo reports through its summary, not log lines
    logging.getLogger("kafka").setLevel(logging.ERROR)
    started = time.monotonic()
    step("starting embedded PostgreSQL and the Tansu broker")
    with EmbeddedPostgres() as pg, TansuBroker() as broker:
        # No superuser: migrate as the schema owner, everything else as the writer, the
        # audit as the auditor (docs/concepts/security.md).
        settings = Settings(
            database_url=pg.role_url(WRITER),
            migrate_database_url=pg.owner_url,
            kafka_bootstrap=broker.bootstrap,
            ingest_group="demo-ingest",
            billing_period="hour",  # the usage spans yesterday 00:00 to 01:23: two periods
            invoice_grace_s=0.0,  # both ended long ago: they close as soon as charged
        )
        migrate(settings)
        prepare(settings)
        prices = settings.load_prices()
        with open_ledger(settings) as ledger:
            # A meter priced by tiers, a price change during the usage, a contract.
            pricing = set_up_pricing(ledger, prices)
            for (customer, currency), limit in DEMO_LIMITS.items():
                ledger.set_spend_limit(customer, currency, limit)
            step(f"producing {records:,} usage records to '{settings.usage_topic}'")
            produced = list(
                synthetic_usage(
                    records, prices, seed=seed, max_record_bytes=settings.max_record_bytes
                )
            )
            # The stream as it is, its poison included: the ledger is what sets it aside.
            with UsageProducer(settings.kafka_bootstrap, settings.usage_topic) as usage:
                for p in produced:
                    usage.send_raw(p.key, p.value)

            step("ingesting (consumer group joins in ~3 s)")
            worker = build_ingest_worker(settings, ledger)
            progress = Progress(records, "ingested")
            stop = threading.Event()

            def on_batch(stats: IngestStats) -> None:
                progress.update(stats.records)
                if stats.records >= records:
                    stop.set()

            timer = threading.Timer(timeout, stop.set)
            timer.start()
            try:
                worker.run(stop, on_batch)
            finally:
                timer.cancel()
                close_worker(worker)
            progress.done()
            if worker.stats.records < records:
                raise TimeoutError(
                    f"only {worker.stats.records} of {records} records ingested "
                    f"after {timeout:.0f}s"
                )
            reserved = worker.stats.transactions - worker.stats.refused
            summary = _charge_and_invoice(
                settings, ledger, produced, reserved, timeout,
                auditor_url=pg.role_url(AUDITOR), pricing=pricing,
            )  # fmt: skip
    summary["seconds"] = round(time.monotonic() - started, 2)
    return summary


def _charge_and_invoice(
    settings: Settings,
    ledger: BillingLedger,
    produced: list[Produced],
    reserved: int,
    timeout: float,
    *,
    auditor_url: str,
    pricing: dict[str, Any],
) -> dict[str, Any]:
    """Charge, close, finalize and collect through the emulator; the summary (audited
    with the auditor's login, the prices ``pricing`` set up told); then the credits
    scene."""
    with StripeEmulator(port=0) as stripe:
        charging = charging_settings(settings, stripe)
        _charge_everything(charging, ledger, reserved, stripe, deadline=time.monotonic() + timeout)
        summary = summarize(ledger, settings, produced)
        summary["invoices"], summary["webhooks"] = _invoices(charging), _webhooks(charging)
        summary["health"] = _health(charging, ledger)
        summary["lines"] = _lines(charging)
        summary["audit"] = _audit(charging.model_copy(update={"database_url": auditor_url}))
        items = stripe.live_invoice_items()
        summary["stripe"] = {
            "live_invoice_items": len(items),
            "amount_by_currency": _amounts(items),
            "requests": len(stripe.requests()),
        }
        summary["pricing"] = pricing_summary(settings, pricing, summary["lines"])
        # The credits scene, after the audit: its customer's usage is its own chapter.
        summary["credits"] = run_credit_scene(
            charging, ledger, stripe, deadline=time.monotonic() + timeout
        )
    return summary


def charging_settings(settings: Settings, stripe: StripeEmulator) -> Settings:
    """``settings`` wired to the emulator, whose ``invoice.*`` and ``credit_note.*``
    webhooks it sends (signed) to the ledger's listener on a free port."""
    # The emulator is local: allow more than Stripe test mode's 25 requests/s.
    secret = "whsec_demo_" + secrets.token_hex(16)
    charging = settings.model_copy(
        update={
            "stripe_api_base": stripe.url,
            "stripe_rate_per_s": 250,
            "reconcile_interval_s": 0.5,
            "settle_interval_s": 1.0,
            "webhook_port": _free_port(),
            "webhook_secrets": SecretStr(secret),
        }
    )
    stripe.add_webhook_endpoint(
        f"http://127.0.0.1:{charging.webhook_port}/webhooks/stripe", secret,
        ["invoice.*", "credit_note.*"],
    )  # fmt: skip
    return charging


def _charge_everything(
    settings: Settings,
    ledger: BillingLedger,
    total: int,
    stripe: StripeEmulator,
    *,
    deadline: float,
) -> None:
    """Run the relay, the projector, the process manager, the reconciler (and its
    invoice closer) and the webhook listener until every transaction is charged or
    compensated and every invoice is finalized, then pay the invoices in the emulator
    and wait until the webhooks have recorded every payment."""
    from adapters.progress import Progress, step

    step("charging through the Stripe emulator: relay -> process manager -> line pushes")
    progress = Progress(total, "settled")
    stop = threading.Event()
    roles = ["relay", "project", "charge", "reconcile", "webhooks"]
    workers = threading.Thread(target=run_roles, args=(settings, ledger, roles, stop))
    workers.start()
    try:
        while True:
            still_open, behind = _open(settings)
            progress.update(total - still_open)
            if not still_open and not behind:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{still_open} transactions still open")
            stop.wait(0.25)
        progress.done()
        step("closing the two hourly periods: lines frozen, final totals pushed, finalized")
        finalized = _await_invoices(settings, {"finalized", "nothing_due"}, deadline, stop)
        step(f"customers pay {len(finalized)} invoices; Stripe's webhooks record each payment")
        for n, invoice in enumerate(finalized):
            if n == 0:  # the first customer's card is declined once, then it pays
                stripe.fail_payment(invoice["stripe_invoice_id"])
            stripe.pay_invoice(invoice["stripe_invoice_id"])
        _await_invoices(settings, {"paid", "nothing_due"}, deadline, stop)
    finally:
        stop.set()
        workers.join()


def _await_invoices(
    settings: Settings, states: set[str], deadline: float, stop: threading.Event
) -> list[dict[str, Any]]:
    """Wait until every invoice is in one of ``states`` (as the read model shows it);
    the invoices that have a Stripe invoice."""
    while True:
        rows = _invoice_rows(settings)
        if rows and all(r["state"] in states for r in rows):
            return [r for r in rows if r["stripe_invoice_id"] is not None]
        if time.monotonic() > deadline:
            pending = sorted({r["state"] for r in rows} - states)
            raise TimeoutError(f"invoices still {', '.join(pending) or 'missing'}")
        stop.wait(0.25)


def _invoice_rows(settings: Settings) -> list[dict[str, Any]]:
    with database(settings, pool_size=0) as db, db.connection() as conn:
        return invoices(conn, limit=10_000)


def _webhooks(settings: Settings) -> dict[str, int]:
    """How many webhooks the listener recorded, by Stripe event type."""
    with database(settings, pool_size=0) as db, db.connection() as conn:
        rows = conn.execute(
            "SELECT type, count(*) FROM billing.webhook_events GROUP BY type"
        ).fetchall()
    return {str(t): int(n) for t, n in rows}


def _invoices(settings: Settings) -> list[dict[str, Any]]:
    """Every invoice: customer, period, state, number, total, paid, payment failures."""
    return [
        {
            "customer_id": r["customer_id"],
            "currency": r["currency"].strip(),
            "period_start": r["period_start"].strftime("%Y-%m-%d %H:%M"),
            "state": r["state"],
            "number": r["number"],
            "lines": r["lines"],
            "total": r["total"],
            "amount_paid": r["amount_paid"],
            "payment_attempts": r["payment_attempts"],
        }
        for r in sorted(
            _invoice_rows(settings), key=lambda r: (r["period_start"], r["customer_id"])
        )
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _open(settings: Settings) -> tuple[int, int]:
    """Open transactions in the read model, and events the projector has not applied."""
    with database(settings, pool_size=0) as db, db.connection() as conn:
        return open_transactions(conn), projector_behind(conn)


def _lines(settings: Settings) -> list[dict[str, Any]]:
    """Every invoice line: records, exact total, billed, what Stripe holds, requests."""
    with database(settings, pool_size=0) as db, db.connection() as conn:
        return [
            {
                "customer_id": r["customer_id"],
                "currency": r["currency"].strip(),
                "meter": r["meter"],
                "model": r["model"] if r["tier"] is None else f"{r['model']} t{r['tier']}",
                "period_start": f"{r['period_start']:%Y-%m-%d %H:%M}",
                "transactions": r["transactions"],
                "exact": str(r["exact_total"]),
                "billed": r["billed"],
                "stripe": r["stripe_amount"],
                "requests": r["stripe_requests"],
            }
            for r in lines(conn, limit=10_000)
        ]


def _health(settings: Settings, ledger: BillingLedger) -> dict[str, Any]:
    """Queue health once the read models have caught up (what ``billing-ledger health``
    would print now): the demo's poison records are dead letters, more in an hour than
    ``HEALTH_MAX_DEAD_LETTERS_PER_HOUR`` allows, so it reports degraded and says why."""
    with build_projector(settings, ledger) as projector:
        projector.pump_all()
    with database(settings, pool_size=0) as db, db.connection() as conn:
        report = health_report(conn, Thresholds())
    return {"status": report["status"], "reasons": report["reasons"]}


def _audit(settings: Settings) -> dict[str, Any]:
    """``billing-ledger audit --stripe`` on the demo's history: chains, invariants, read
    models and the emulator's invoice items, all checked."""
    from adapters.progress import step

    step("auditing: replaying the history against the read models and Stripe")
    with database(settings, pool_size=0) as db:
        report = audit(
            db,
            Scope(),
            horizon=settings.overdue_after(),
            stripe_items=lambda: stripe_invoice_items(settings.stripe()),
            stripe_invoices=lambda: stripe_invoice_totals(settings.stripe()),
            progress=False,
        )
    return {
        "ok": report.ok,
        "events": report.events,
        "transactions": report.transactions,
        "stripe_items": report.stripe_items,
        "findings": [f"{f.kind} {f.subject}: {f.detail}" for f in report.findings[:20]],
    }


def _amounts(items: list[dict[str, Any]]) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for item in items:
        totals[str(item["currency"]).upper()] += int(item["amount"])
    return dict(sorted(totals.items()))
