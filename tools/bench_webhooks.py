"""The webhooks part of ``billing-ledger bench close``: webhooks per second into the
ledger's real listener, beside a raw INSERT baseline in the same run.

Every invoice is paid in the emulator (no endpoint: it sends nothing), its
``invoice.paid`` event signed before the clock starts, then posted by ``clients``
client threads over keep-alive HTTP to a real listener (``build_webhook_server``, as
the webhooks role builds it, in a process of its own), a tenth of them twice.
Reported: webhooks per second end to end (answers 200), p50/p99 latency, duplicates
answered, receipts and ``Paid`` events recorded, and a plain one-row INSERT per event
into PostgreSQL from as many threads.
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import psycopg
from eventsourcing.utils import get_topic

from adapters.bootstrap import open_ledger
from adapters.observability.logs import configure_logging
from adapters.progress import step
from adapters.settings import Settings, child_env
from adapters.webhooks.app import PATH
from domain.invoice import Invoice
from infra.stripe_emulator import StripeEmulator
from infra.stripe_emulator.webhooks import sign
from tools.measure import percentile, terminate

__all__ = ["SECRET", "count_events", "run_webhooks"]

SECRET = "whsec_bench_close"  # noqa: S105 (the bench signs and checks with it)


def run_webhooks(settings: Settings, stripe: StripeEmulator, clients: int) -> dict[str, Any]:
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
        paid = count_events(conn, Invoice.Paid)
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


def count_events(conn: psycopg.Connection[Any], event: type) -> int:
    row = conn.execute(
        "SELECT count(*) FROM billingledger_events WHERE topic = %s", (get_topic(event),)
    ).fetchone()
    return int(row[0]) if row else 0


@contextmanager
def _listener(settings: Settings) -> Iterator[None]:
    """The webhook listener (``build_webhook_server``, as the webhooks role builds it) in
    a process of its own, so the client threads do not share its interpreter; yields
    once it answers. (Not ``billing-ledger run --role webhooks``: that needs a broker
    for its topics, which this bench does without.)"""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.bench_webhooks"], env=child_env(settings),
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not _answers(settings.webhook_port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the webhook listener did not start ({proc.returncode})")
            time.sleep(0.1)
        yield
    finally:
        terminate(proc)


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
