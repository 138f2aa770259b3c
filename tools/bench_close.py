"""``billing-ledger bench close``: closing a period's invoices, then their webhooks.

On the embedded PostgreSQL and the Stripe emulator (no broker: nothing here reads a
topic):

1. **Setup** (not measured): one usage record for each of ``customers`` customers on a
   past day, recorded through the ledger directly, and each customer's line pushed to
   Stripe (customer, draft, item) with the emulator's rate limit lifted.
2. **Close** (measured): the emulator enforces ``stripe_rate`` requests/s and the
   client is set to it; the closers (``drive_invoices``, the close role's own loop body,
   ``stripe_max_concurrency`` at a time) drive every due invoice until each is
   finalized. Reported: time, invoices/s, Stripe requests per invoice split by
   operation (from the emulator's request log), the share of the Stripe rate the close
   used (requests/s over the rate) and the 429s it answered; and the money (sum of
   Stripe's invoice totals == sum of the lines billed == sum of the ledger's finalized
   totals). ``verify=False`` finalizes without reading each draft back first: only to
   measure what the read-back costs (``--verify both`` runs the close both ways, each
   on a fresh database and emulator, in one command).
3. **Webhooks** (measured, ``tools.bench_webhooks``): every invoice's ``invoice.paid``
   posted, signed, to the ledger's real listener from ``clients`` threads; webhooks
   per second beside a raw INSERT baseline in the same run.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
from eventsourcing.utils import get_topic
from pydantic import SecretStr

from adapters.bootstrap import build_closer, build_pusher, migrate, open_ledger
from adapters.bootstrap import prepare as prepare_process
from adapters.observability.logs import configure_logging
from adapters.progress import step
from adapters.roles import drive_invoices
from adapters.settings import Settings
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine
from domain.metering import Metering
from domain.transaction import Source
from domain.usage import UsageRecord
from infra.embedded import EmbeddedPostgres
from infra.stripe_emulator import StripeEmulator
from projections.invoices import due_invoices
from store.ledger import BillingLedger
from tools.bench_webhooks import SECRET, count_events, run_webhooks
from tools.measure import cores

__all__ = ["render_close", "run_close"]

_ID = re.compile(r"/(cus|in|ii|cn)_[A-Za-z0-9]+")


def run_close(
    *,
    customers: int,
    stripe_rate: int,
    concurrency: int = 8,
    clients: int = 8,
    close_timeout_s: float = 3600.0,
    verify: bool = True,
    webhooks: bool = True,
) -> dict[str, Any]:
    configure_logging("ERROR")
    with EmbeddedPostgres() as pg, StripeEmulator(port=0) as stripe:
        settings = Settings(
            database_url=pg.url,
            stripe_api_base=stripe.url,
            stripe_rate_per_s=stripe_rate,
            stripe_max_concurrency=concurrency,
            billing_period="day",
            invoice_grace_s=0.0,
            retry_base_s=0.5,
            retry_max_delay_s=5.0,
            breaker_reset_s=2.0,
            db_pool_size=concurrency + 2,
            webhook_port=_free_port(),
            webhook_secrets=SecretStr(SECRET),
        )
        migrate(settings)
        prepare_process(settings, topics=False)
        with open_ledger(settings) as ledger:
            _setup(settings, ledger, customers)
            stripe.set_faults(rate_limit_per_s=stripe_rate)
            close = _close(settings, ledger, stripe, customers, close_timeout_s, verify=verify)
            stripe.set_faults(rate_limit_per_s=None)
        result: dict[str, Any] = {"cores": cores(), "customers": customers,
                                  "stripe_rate_per_s": stripe_rate, "read_back": verify,
                                  **close}  # fmt: skip
        result["money"] = _money(settings, stripe)
        if webhooks and close["finalized"] == customers:
            result["webhooks"] = run_webhooks(settings, stripe, clients)
        return result


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- setup -----------------------------------------------------------------------------


def _setup(settings: Settings, ledger: BillingLedger, customers: int) -> None:
    day = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
    past = day - timedelta(days=2)
    step(f"recording usage for {customers} customers on {past.date()}")
    for start in range(0, customers, 500):
        ledger.record_usage(
            [
                Metering(
                    UsageRecord(
                        usage_id=f"close-{i}",
                        customer_id=f"cust-{i:05d}",
                        meter="api.requests",
                        quantity=Decimal(1000 + i % 997),
                        occurred_at=past,
                    ),
                    Source("bench", 0, i),
                )
                for i in range(start, min(start + 500, customers))
            ]
        )
    step("pushing every line to Stripe (no rate limit: setup)")
    pusher = build_pusher(settings.model_copy(update={"stripe_rate_per_s": 10_000}), ledger)
    with psycopg.connect(settings.database_url) as conn:
        lines = [
            r[0]
            for r in conn.execute(
                "SELECT DISTINCT originator_id FROM billingledger_events WHERE topic = %s",
                (get_topic(InvoiceLine.Settled),),
            )
        ]
    with ThreadPoolExecutor(settings.stripe_max_concurrency) as pool:
        list(pool.map(pusher.push, lines))


# -- close -----------------------------------------------------------------------------


def _close(
    settings: Settings,
    ledger: BillingLedger,
    stripe: StripeEmulator,
    customers: int,
    timeout_s: float,
    *,
    verify: bool,
) -> dict[str, Any]:
    closer = build_closer(settings, build_pusher(settings, ledger))
    closer.verify = verify
    stop = threading.Event()
    before = len(stripe.requests())
    step(f"closing {customers} invoices at {settings.stripe_rate_per_s} Stripe requests/s")
    t0 = time.monotonic()
    results: Counter[str] = Counter()
    finalized = 0
    while time.monotonic() - t0 < timeout_s:
        with psycopg.connect(settings.database_url) as conn:
            due = due_invoices(conn)
            finalized = count_events(conn, Invoice.Finalized)
        if finalized >= customers or not due:
            break
        round_ = drive_invoices(closer, due, stop, settings.stripe_max_concurrency)
        results.update(round_)
        if set(round_) <= {"not_due", "waiting", "done"}:
            stop.wait(0.2)  # retries not due yet: the next round finds them due
    seconds = time.monotonic() - t0
    api = [r for r in stripe.requests()[before:] if str(r["path"]).startswith("/v1/")]
    ops = Counter(f"{r['method']} {_ID.sub('/{id}', str(r['path']))}" for r in api)
    return {
        "finalized": finalized,
        "close_s": round(seconds, 1),
        "invoices_per_s": round(finalized / seconds, 2) if seconds else None,
        "stripe_requests": len(api),
        "stripe_requests_per_invoice": round(len(api) / max(finalized, 1), 3),
        "stripe_requests_per_invoice_by_operation": {
            op: round(n / max(finalized, 1), 3) for op, n in sorted(ops.items())
        },
        "stripe_rate_used": (
            round(len(api) / seconds / settings.stripe_rate_per_s, 3) if seconds else None
        ),
        "stripe_429s": sum(1 for r in api if r.get("status") == 429),
        "close_steps": dict(sorted(results.items())),
        "close_failures": _failures(settings),
    }


_FAILURES = (
    "SELECT split_part(convert_from(state, 'UTF8')::jsonb ->> 'error_class', ':', 1), count(*)"
    " FROM billingledger_events WHERE topic = %s GROUP BY 1 ORDER BY 2 DESC"
)


def _failures(settings: Settings) -> dict[str, int]:
    """The recorded failures of close steps (``FinalizeFailed``) by error class."""
    with psycopg.connect(settings.database_url) as conn:
        rows = conn.execute(_FAILURES, (get_topic(Invoice.FinalizeFailed),)).fetchall()
    return {str(r[0]): int(r[1]) for r in rows}


_LINE_BILLED = (
    "SELECT coalesce(sum(billed), 0) FROM ("
    " SELECT DISTINCT ON (originator_id) (convert_from(state, 'UTF8')::jsonb ->> 'billed')::bigint"
    " AS billed FROM billingledger_events WHERE topic = ANY(%s)"
    " ORDER BY originator_id, originator_version DESC) lines"
)
_FINALIZED_TOTAL = (
    "SELECT coalesce(sum((convert_from(state, 'UTF8')::jsonb ->> 'total')::bigint), 0)"
    " FROM billingledger_events WHERE topic = %s"
)


def _money(settings: Settings, stripe: StripeEmulator) -> dict[str, Any]:
    """Stripe's invoice totals against the lines' billed totals and the ledger's record."""
    topics = [get_topic(InvoiceLine.Settled), get_topic(InvoiceLine.Removed)]
    with psycopg.connect(settings.database_url) as conn:
        billed = conn.execute(_LINE_BILLED, (topics,)).fetchone()
        recorded = conn.execute(_FINALIZED_TOTAL, (get_topic(Invoice.Finalized),)).fetchone()
    invoices = stripe.invoices()
    stripe_total = sum(int(i["total"]) for i in invoices if i["status"] != "draft")
    lines_billed = int(billed[0]) if billed else 0
    ledger_total = int(recorded[0]) if recorded else 0
    return {
        "stripe_invoices_finalized": sum(1 for i in invoices if i["status"] != "draft"),
        "stripe_invoice_totals": stripe_total,
        "lines_billed": lines_billed,
        "ledger_finalized_totals": ledger_total,
        "ok": stripe_total == lines_billed == ledger_total,
    }


def render_close(result: dict[str, Any]) -> str:
    out = []
    for key, value in result.items():
        if isinstance(value, dict):
            out.append(f"{key}:")
            out += [f"  {k:<40} {v}" for k, v in value.items()]
        else:
            out.append(f"{key:<42} {value}")
    return "\n".join(out)
