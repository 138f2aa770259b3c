"""``billing-ledger bench charge`` and ``bench outage``: the saga under steady load.

Both run the whole pipeline (ingest, relay, charge process manager, reconciler) on the
embedded default against the Stripe emulator with added latency, while usage arrives
at a steady rate:

* ``charge``: charges/s, usage -> Charged latency p50/p99, and how much of the Stripe
  rate limit was used;
* ``outage``: the seed incident's case study made reproducible: a Stripe outage in
  the middle of the load, then recovery. Peak backlog, time from recovery to an empty
  backlog, latency outside the outage, Stripe calls during the outage, duplicates
  (live invoice items beyond one per transaction) and lost records (must both be 0).
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
from eventsourcing.utils import get_topic

from adapters.bootstrap import migrate, open_ledger, prepare, run_roles
from adapters.broker import make_producer
from adapters.observability.logs import configure_logging
from adapters.progress import step
from adapters.settings import Settings
from domain.transaction import BillingTransaction
from domain.usage import UsageRecord
from infra.embedded import EmbeddedPostgres, TansuBroker
from infra.stripe_emulator import StripeEmulator
from tools.measure import percentile

__all__ = ["render_load", "run_load"]

CHARGED = get_topic(BillingTransaction.Charged)


def run_load(
    *,
    rate: float,
    seconds: float,
    latency_ms: float,
    stripe_rate: int,
    concurrency: int,
    outage_at: float | None = None,
    outage_s: float = 0.0,
    drain_timeout: float = 300.0,
) -> dict[str, Any]:
    configure_logging("ERROR")
    with (
        EmbeddedPostgres() as pg,
        TansuBroker() as broker,
        StripeEmulator(port=0, latency_ms=latency_ms) as stripe,
    ):
        settings = Settings(
            database_url=pg.url,
            kafka_bootstrap=broker.bootstrap,
            stripe_api_base=stripe.url,
            stripe_rate_per_s=stripe_rate,
            stripe_max_concurrency=concurrency,
            batch_max_records=500,
            poll_timeout_ms=50,
            retry_base_s=0.5,
            retry_max_delay_s=5.0,
            breaker_reset_s=2.0,
            stale_after_s=10.0,
            reconcile_interval_s=0.5,
        )
        migrate(settings)
        prepare(settings)
        with open_ledger(settings) as ledger:
            stop = threading.Event()
            roles = ["ingest", "relay", "charge", "reconcile"]
            workers = threading.Thread(target=run_roles, args=(settings, ledger, roles, stop))
            workers.start()
            step("waiting for the consumer groups to join")
            _warm_up(settings)
            step(f"usage at {rate:g}/s for {seconds:g}s, Stripe latency {latency_ms:g} ms")
            produced: list[int] = [1]  # the warm-up record
            samples: list[tuple[float, int]] = []
            t0 = time.monotonic()
            producer = threading.Thread(target=_produce, args=(settings, rate, seconds, produced))
            producer.start()
            outage: tuple[float, float] | None = None
            while producer.is_alive() or _charged(settings) < produced[0]:
                now = time.monotonic() - t0
                if outage_at is not None and outage is None and now >= outage_at:
                    stripe.set_faults(outage=True, outage_mode="503")
                    outage = (time.time(), time.time() + outage_s)
                    step(f"Stripe outage for {outage_s:g}s")
                if outage is not None and stripe.faults()["outage"] and time.time() >= outage[1]:
                    stripe.set_faults(outage=False)
                    step("Stripe recovered")
                samples.append((time.time(), produced[0] - _charged(settings)))
                if now > seconds + drain_timeout:
                    break
                time.sleep(0.25)
            stop.set()
            workers.join()
            return _report(
                settings=settings, ledger=ledger, stripe=stripe, samples=samples,
                outage=outage, produced=produced[0], rate=rate, seconds=seconds,
                stripe_rate=stripe_rate,
            )  # fmt: skip


def _warm_up(settings: Settings) -> None:
    """One record through the whole pipeline, so group joins are not in the figures."""
    producer = make_producer(settings.kafka_bootstrap)
    record = _record(-1)
    producer.send(settings.usage_topic, key=record.customer_id.encode(), value=record.to_json())
    producer.close()
    deadline = time.monotonic() + 60
    while _charged(settings) < 1 and time.monotonic() < deadline:
        time.sleep(0.1)


def _record(i: int) -> UsageRecord:
    return UsageRecord(
        usage_id=f"load-{i}",
        customer_id=f"cust-{i % 20:02d}",
        meter="api.requests",
        quantity=Decimal(100),
        occurred_at=datetime.now(UTC),
    )


def _produce(settings: Settings, rate: float, seconds: float, produced: list[int]) -> None:
    producer = make_producer(settings.kafka_bootstrap)
    start = time.monotonic()
    i = 0
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed * rate)
        while i < due:
            record = _record(i)
            producer.send(
                settings.usage_topic, key=record.customer_id.encode(), value=record.to_json()
            )
            i += 1
        producer.flush()
        produced[0] = i + 1  # + the warm-up record
        time.sleep(0.01)
    producer.close()


def _charged(settings: Settings) -> int:
    with psycopg.connect(settings.database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM billingledger_events WHERE topic = %s", (CHARGED,)
        ).fetchone()
    return int(row[0]) if row else 0


def _report(
    *,
    settings: Settings,
    ledger: Any,
    stripe: StripeEmulator,
    samples: list[tuple[float, int]],
    outage: tuple[float, float] | None,
    produced: int,
    rate: float,
    seconds: float,
    stripe_rate: int,
) -> dict[str, Any]:
    occurred: dict[Any, datetime] = {}
    metered_at: dict[Any, datetime] = {}
    charged_at: dict[Any, datetime] = {}
    compensated = 0
    for event in ledger.all_events():
        if isinstance(event, BillingTransaction.Metered):
            occurred[event.originator_id] = event.occurred_at
            metered_at[event.originator_id] = event.timestamp
        elif isinstance(event, BillingTransaction.Charged):
            charged_at[event.originator_id] = event.timestamp
        elif isinstance(event, BillingTransaction.Compensated):
            compensated += 1
    latencies, ingest_lat = [], []
    for txn, at in charged_at.items():
        start = occurred[txn].timestamp()
        if outage is None or not (outage[0] - 1 <= start <= _drained_at(samples, outage)):
            latencies.append((at - occurred[txn]).total_seconds())
            ingest_lat.append((metered_at[txn] - occurred[txn]).total_seconds())
    latencies.sort()
    ingest_lat.sort()
    items = stripe.live_invoice_items()
    per_txn: dict[str, int] = {}
    for item in items:
        key = str(item["metadata"].get("txn_id"))
        per_txn[key] = per_txn.get(key, 0) + 1
    requests = stripe.requests()
    api = [r for r in requests if str(r["path"]).startswith("/v1/")]
    busy = [r["at"] for r in api]
    span = (max(busy) - min(busy)) if len(busy) > 1 else 1.0
    result: dict[str, Any] = {
        "usage_rate_per_s": rate,
        "seconds": seconds,
        "produced": produced,
        "charged": len(charged_at),
        "compensated": compensated,
        "lost": produced - len(charged_at) - compensated,
        "duplicates": sum(n - 1 for n in per_txn.values() if n > 1),
        "charges_per_s": round(len(charged_at) / max(span, 1e-9), 1),
        "latency_ms_p50": round(percentile(latencies, 50) * 1000, 1),
        "latency_ms_p99": round(percentile(latencies, 99) * 1000, 1),
        "of_which_ingest_ms_p50": round(percentile(ingest_lat, 50) * 1000, 1),
        "stripe_requests": len(api),
        "stripe_rate_limit_per_s": stripe_rate,
        "rate_limit_utilisation": round(len(api) / max(span, 1e-9) / stripe_rate, 3),
        "peak_backlog": max((b for _, b in samples), default=0),
    }
    if outage is not None:
        drained = _drained_at(samples, outage)
        result["outage_s"] = round(outage[1] - outage[0], 1)
        result["stripe_calls_during_outage"] = sum(
            1 for r in api if outage[0] <= r["at"] <= outage[1]
        )
        result["drained_s_after_recovery"] = round(drained - outage[1], 1)
    return result


def _drained_at(samples: list[tuple[float, int]], outage: tuple[float, float]) -> float:
    for at, backlog in samples:
        if at > outage[1] and backlog <= 0:
            return at
    return samples[-1][0] if samples else outage[1]


def render_load(result: dict[str, Any]) -> str:
    return "\n".join(f"{key:<28} {value}" for key, value in result.items())
