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
   operation (from the emulator's request log) and the 429s it answered; and the money
   (sum of Stripe's invoice totals == sum of the lines billed == sum of the ledger's
   finalized totals).
3. **Webhooks** (measured): every invoice paid in the emulator (no endpoint: it sends
   nothing), its ``invoice.paid`` event signed before the clock starts, then posted by
   ``clients`` client threads over keep-alive HTTP to a real listener
   (``billing-ledger run --role webhooks`` in a process of its own), a tenth of them
   twice. Reported: webhooks per second end to end (answers 200), p50/p99 latency,
   duplicates answered, receipts and ``Paid`` events recorded, beside a raw baseline
   in the same run: a plain one-row INSERT per event into PostgreSQL from as many
   threads.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
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
from adapters.webhooks.app import PATH
from domain.invoice import Invoice
from domain.invoice_line import InvoiceLine
from domain.metering import Metering
from domain.transaction import Source
from domain.usage import UsageRecord
from infra.embedded import EmbeddedPostgres
from infra.stripe_emulator import StripeEmulator
from infra.stripe_emulator.webhooks import sign
from projections.invoices import due_invoices
from store.ledger import BillingLedger
from tools.measure import cores, percentile

__all__ = ["render_close", "run_close"]

SECRET = "whsec_bench_close"  # noqa: S105 (the bench signs and checks with it)
_ID = re.compile(r"/(cus|in|ii|cn)_[A-Za-z0-9]+")


def run_close(
    *,
    customers: int,
    stripe_rate: int,
    concurrency: int = 8,
    clients: int = 8,
    close_timeout_s: float = 3600.0,
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
            close = _close(settings, ledger, stripe, customers, close_timeout_s)
            stripe.set_faults(rate_limit_per_s=None)
        result: dict[str, Any] = {"cores": cores(), "customers": customers,
                                  "stripe_rate_per_s": stripe_rate, **close}  # fmt: skip
        result["money"] = _money(settings, stripe)
        if close["finalized"] == customers:
            result["webhooks"] = _webhooks(settings, stripe, clients)
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
) -> dict[str, Any]:
    closer = build_closer(settings, build_pusher(settings, ledger))
    stop = threading.Event()
    before = len(stripe.requests())
    step(f"closing {customers} invoices at {settings.stripe_rate_per_s} Stripe requests/s")
    t0 = time.monotonic()
    results: Counter[str] = Counter()
    finalized = 0
    while time.monotonic() - t0 < timeout_s:
        with psycopg.connect(settings.database_url) as conn:
            due = due_invoices(conn)
            finalized = _count(conn, Invoice.Finalized)
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
        "stripe_429s": sum(1 for r in api if r.get("status") == 429),
        "close_steps": dict(sorted(results.items())),
    }


def _count(conn: psycopg.Connection[Any], event: type) -> int:
    row = conn.execute(
        "SELECT count(*) FROM billingledger_events WHERE topic = %s", (get_topic(event),)
    ).fetchone()
    return int(row[0]) if row else 0


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


# -- webhooks --------------------------------------------------------------------------


def _webhooks(settings: Settings, stripe: StripeEmulator, clients: int) -> dict[str, Any]:
    for invoice in stripe.invoices():
        stripe.pay_invoice(invoice["id"])  # no endpoint: nothing is sent
    events = stripe.events("invoice.paid")
    repeats = events[::10]  # a tenth delivered twice
    now = int(time.time())
    bodies = [json.dumps(e).encode() for e in events + repeats]
    signed = [(b, sign(SECRET, now, b)) for b in bodies]
    raw = _raw_inserts(settings, len(signed), clients)
    step(f"posting {len(signed)} signed invoice.paid events from {clients} client threads")
    with _listener(settings):
        answers, seconds = _post_all(settings, signed, clients)
    ok = [a for a in answers if a[0] == 200]
    latencies = sorted(a[2] for a in answers)
    with psycopg.connect(settings.database_url) as conn:
        receipts = conn.execute(
            "SELECT outcome, count(*) FROM billing.webhook_events GROUP BY outcome"
        ).fetchall()
        paid = _count(conn, Invoice.Paid)
    per_s = len(ok) / seconds if seconds else 0.0
    return {
        "posted": len(signed),
        "answered_200": len(ok),
        "statuses": dict(Counter(str(a[0]) for a in answers)),
        "outcomes": dict(Counter(a[1] for a in answers)),
        "duplicates_answered": sum(1 for a in answers if a[1] == "duplicate"),
        "receipts": {str(o): int(n) for o, n in receipts},
        "paid_events": paid,
        "seconds": round(seconds, 2),
        "webhooks_per_s": round(per_s, 1),
        "latency_ms_p50": round(percentile(latencies, 50) * 1000, 1),
        "latency_ms_p99": round(percentile(latencies, 99) * 1000, 1),
        "clients": clients,
        "baseline_raw_insert_rows_per_s": round(raw, 1),
        "webhooks_vs_raw_insert": round(per_s / raw, 3) if raw else None,
    }


@contextmanager
def _listener(settings: Settings) -> Iterator[None]:
    """The webhook listener (``build_webhook_server``, as the webhooks role builds it) in
    a process of its own, so the client threads do not share its interpreter; yields
    once it answers. (Not ``billing-ledger run --role webhooks``: that needs a broker
    for its topics, which this bench does without.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BILLING_LEDGER_")}
    for key, value in settings.model_dump().items():
        if value is not None:
            shown = value.get_secret_value() if isinstance(value, SecretStr) else value
            env[f"BILLING_LEDGER_{key.upper()}"] = str(shown)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.bench_close"], env=env, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while not _answers(settings.webhook_port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the webhook listener did not start ({proc.returncode})")
            time.sleep(0.1)
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _answers(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/")
        conn.getresponse().read()
        conn.close()
    except OSError:
        return False
    return True


def _post_all(
    settings: Settings, signed: list[tuple[bytes, str]], clients: int
) -> tuple[list[tuple[int, str, float]], float]:
    """Post every (body, signature), ``clients`` threads on a connection each; returns
    (status, outcome, seconds) per request and the wall time."""
    parts = [signed[i::clients] for i in range(clients)]
    answers: list[list[tuple[int, str, float]]] = [[] for _ in parts]

    def post(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", settings.webhook_port, timeout=60)
        for body, signature in parts[k]:
            headers = {"Content-Type": "application/json", "Stripe-Signature": signature}
            t = time.perf_counter()
            conn.request("POST", PATH, body, headers)
            reply = conn.getresponse()
            data = reply.read()
            elapsed = time.perf_counter() - t
            outcome = str(json.loads(data).get("outcome")) if data else ""
            answers[k].append((reply.status, outcome, elapsed))
        conn.close()

    threads = [threading.Thread(target=post, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [a for part in answers for a in part], time.perf_counter() - t0


def _raw_inserts(settings: Settings, rows: int, clients: int) -> float:
    """Rows/s of a plain one-row INSERT (autocommit) from ``clients`` threads."""
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(  # a table like the receipts' (logged, a primary key), the bench's own
            "CREATE TABLE IF NOT EXISTS public.bench_baseline"
            " (event_id text PRIMARY KEY, outcome text)"
        )
    parts = [range(k, rows, clients) for k in range(clients)]

    def insert(part: range) -> None:
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            for i in part:
                conn.execute(
                    "INSERT INTO public.bench_baseline VALUES (%s, 'applied')", (f"evt_{i}",)
                )

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(insert, parts))
    return rows / (time.perf_counter() - t0)


def render_close(result: dict[str, Any]) -> str:
    out = []
    for key, value in result.items():
        if isinstance(value, dict):
            out.append(f"{key}:")
            out += [f"  {k:<40} {v}" for k, v in value.items()]
        else:
            out.append(f"{key:<42} {value}")
    return "\n".join(out)


def _serve() -> None:
    """The listener's process: serves until SIGTERM."""
    from adapters.bootstrap import build_webhook_server

    configure_logging("ERROR")
    settings = Settings()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with open_ledger(settings) as ledger:
        server = build_webhook_server(settings, ledger)
        server.start()
        try:
            if not server.wait_started():
                raise SystemExit("the webhook listener did not start")
            stop.wait()
        finally:
            server.stop()


if __name__ == "__main__":
    _serve()
