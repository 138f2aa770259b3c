"""``billing-ledger bench fairness``: does one customer's backlog delay the others?

Every role runs as deployed (``tools.bench_charge.pipeline``: worker processes on the
embedded default, the Stripe emulator with Stripe's rate limit). ``steady_customers``
customers send usage at ``steady_rate`` records/s in total the whole time; after a
warm-up (at least ``warmup_s``, and until the steady backlog is what the settle
interval holds back: every customer's Stripe customer and draft invoice made) and a
``before`` window, one more customer sends a burst of ``burst`` records as fast as the producer
can, while the steady traffic goes on; the ``during`` window lasts until the burst's
last record is charged, then an ``after`` window, then the steady traffic stops and
everything drains.

The others' latencies are reported per window (a record belongs to the window in which
it occurred), each from the events' own timestamps: usage -> recorded (the ``Metered``
event: the broker and ingest), recorded -> relayed and recorded -> projected (the
relay's and the ``billing.transactions`` projector's positions in the log reached it,
sampled every ``SAMPLE_S``, so to within that), recorded -> Charged and usage ->
Charged (the whole way, through the relay, the process manager, the line pushes and
Stripe). Also: the burst customer's own times, Stripe requests per window,
nothing lost (every record charged or compensated) and the money check (Stripe holds
the lines' billed totals).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import psycopg

from adapters.ingest.producer import UsageProducer
from adapters.progress import step
from adapters.settings import Settings
from domain.ids import transaction_id
from domain.usage import UsageRecord
from infra.stripe_emulator import StripeEmulator
from tools.bench_charge import (
    METERS,
    EventCount,
    Load,
    Pipeline,
    money,
    pipeline,
    produce,
)
from tools.fairness_report import Txn, render_fairness, window
from tools.measure import cores

__all__ = ["BURST_CUSTOMER", "render_fairness", "run_fairness"]

BURST_CUSTOMER = "burst-000"
SAMPLE_S = 0.25  # how often the relay's and the projector's positions are read

_TXN = "domain.transaction:BillingTransaction."


# Every transaction: its customer, when its usage occurred, was recorded and charged
# (epoch seconds), and where its Metered event stands in the log (the projector's
# position is compared with it).
_TRANSACTIONS = """
WITH m AS (SELECT originator_id, xid::text AS xid, notification_id,
                  convert_from(state, 'UTF8')::jsonb AS s
           FROM billingledger_events WHERE topic = %s),
     c AS (SELECT originator_id, convert_from(state, 'UTF8')::jsonb AS s
           FROM billingledger_events WHERE topic = %s)
SELECT m.s ->> 'customer_id',
       extract(epoch FROM (m.s -> 'occurred_at' ->> '_data_')::timestamptz)::float8,
       extract(epoch FROM (m.s -> 'timestamp' ->> '_data_')::timestamptz)::float8,
       m.xid, m.notification_id,
       extract(epoch FROM (c.s -> 'timestamp' ->> '_data_')::timestamptz)::float8
FROM m LEFT JOIN c USING (originator_id)
"""


@dataclass
class _Clock:
    """Wall-clock moments of the run (epoch seconds)."""

    before: float = 0.0
    burst: float = 0.0
    burst_sent: float = 0.0
    burst_charged: float = 0.0  # seen by the driver; the report takes it from the events
    steady_stopped: float = 0.0


def run_fairness(
    pipe: Pipeline,
    *,
    steady_rate: float = 200.0,
    burst: int = 12_000,
    warmup_s: float | None = None,
    before_s: float = 30.0,
    after_s: float = 30.0,
    drain_timeout: float = 600.0,
) -> dict[str, Any]:
    """The run described in the module docstring: ``pipe.customers`` steady customers."""
    load_start = os.getloadavg()
    with pipeline(pipe) as (settings, stripe, workers, load):
        run = _Run(settings, load, burst)
        clock = run.drive(
            steady_rate,
            warmup_s=pipe.settle_interval_s + 5 if warmup_s is None else warmup_s,
            before_s=before_s,
            after_s=after_s,
            drain_timeout=drain_timeout,
        )
        ended = workers.stop()
        result = _report(run, clock, stripe, money(settings, stripe))
    result["settings"] = {
        "steady_customers": pipe.customers,
        "steady_rate_per_s": steady_rate,
        "meters_per_customer": load.meters,
        "burst_records": burst,
        "stripe_rate_limit_per_s": pipe.stripe_rate,
        "stripe_latency_ms": pipe.latency_ms,
        "stripe_concurrency": pipe.concurrency,
        "settle_interval_s": pipe.settle_interval_s,
    }
    result["cores"] = cores()
    result["load_average_1_5_15"] = {"start": load_start, "end": os.getloadavg()}
    if ended:
        result["workers_ended"] = ended
    return result


class _Run:
    """The traffic and the driver's observations while it flows."""

    def __init__(self, settings: Settings, load: Load, burst: int) -> None:
        self.settings = settings
        self.load = load
        self.burst = burst
        self.burst_produced = 0
        self.burst_ids: list[UUID] = []
        self.drained = False
        # (wall time, the relay's and the projector's positions in the log) every SAMPLE_S
        self.positions: list[tuple[float, tuple[int, int], tuple[int, int]]] = []
        self._last_progress = 0.0
        self._last_burst_check = 0.0
        self._charged: EventCount | None = None
        self._compensated: EventCount | None = None

    def drive(self, steady_rate: float, **phases: float) -> _Clock:
        """The run (``_drive``), its polls counting the log as it grows (``EventCount``)."""
        with (
            EventCount(self.settings) as self._charged,
            EventCount(self.settings, _TXN + "Compensated") as self._compensated,
        ):
            return self._drive(steady_rate, **phases)

    def _drive(
        self,
        steady_rate: float,
        *,
        warmup_s: float,
        before_s: float,
        after_s: float,
        drain_timeout: float,
    ) -> _Clock:
        clock = _Clock()
        stop_steady = threading.Event()
        steady = threading.Thread(
            target=produce,
            args=(self.settings, self.load, steady_rate, float("inf"), stop_steady),
            name="steady",
        )
        steady.start()
        try:
            step(f"steady usage: {self.load.customers} customers, {steady_rate:g}/s in total,"
                 f" {self.load.lines} lines; warm-up {warmup_s:g}s")  # fmt: skip
            self._watch("warm-up", warmup_s)
            # Steady state: no more owed than the settle interval (and a little) holds.
            held = steady_rate * (self.settings.settle_interval_s + 5)
            self._watch("warm-up", drain_timeout, until=lambda: self._steady_owed() <= held)
            clock.before = time.time()
            step(f"before the burst: {before_s:g}s")
            self._watch("before", before_s)
            clock.burst = time.time()
            step(f"burst: {self.burst:,} records from {BURST_CUSTOMER} as fast as they go")
            sender = threading.Thread(target=self._send_burst, args=(clock,), name="burst")
            sender.start()
            self._watch("during", drain_timeout, until=self._burst_done)
            sender.join()
            clock.burst_charged = time.time()
            step(f"burst charged after {clock.burst_charged - clock.burst:.1f}s;"
                 f" after the burst: {after_s:g}s")  # fmt: skip
            self._watch("after", after_s)
        finally:
            stop_steady.set()
            steady.join()
        clock.steady_stopped = time.time()
        step("steady usage stopped; draining")
        self.drained = self._watch("drain", drain_timeout, until=self._all_settled)
        if not self.drained:
            step("gave up waiting for the backlog to drain: reporting what was measured")
        return clock

    @property
    def produced(self) -> int:
        return self.load.produced + self.burst_produced

    def _send_burst(self, clock: _Clock) -> None:
        with UsageProducer(
            self.settings.kafka_bootstrap, self.settings.usage_topic, check=False
        ) as usage:
            for i in range(self.burst):
                usage.send(_burst_record(i))
                self.burst_produced = i + 1
        clock.burst_sent = time.time()

    def _watch(self, phase: str, seconds: float, until: Callable[[], bool] | None = None) -> bool:
        """Sample for ``seconds`` or until ``until()``; whether ``until`` came true."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._sample()
            self._progress(phase)
            if until is not None and until():
                return True
            time.sleep(SAMPLE_S)
        return until is None

    def _sample(self) -> None:
        with psycopg.connect(self.settings.database_url) as conn:
            row = conn.execute(
                "SELECT r.xid::text, r.notification_id, p.xid::text, p.notification_id"
                " FROM billing.relay_position r, billing.projection_positions p"
                " WHERE r.name = 'billing.events' AND p.name = 'transactions'"
            ).fetchone()
        if row is not None:
            relayed, projected = (int(row[0]), row[1]), (int(row[2]), row[3])
            self.positions.append((time.time(), relayed, projected))

    def _progress(self, phase: str) -> None:
        now = time.monotonic()
        if now - self._last_progress < 5:
            return
        self._last_progress = now
        with psycopg.connect(self.settings.database_url) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE customer_id <> %s), count(*) FILTER"
                " (WHERE customer_id = %s) FROM billing.transactions",
                (BURST_CUSTOMER,) * 2,
            ).fetchone()
        others, burst = row or (0, 0)
        step(f"{phase}: produced {self.load.produced:,} steady + {self.burst_produced:,}"
             f" burst; charged {self._charged_now():,} (burst {self._burst_charged():,});"
             f" projected {others:,} + {burst:,}")  # fmt: skip

    def _burst_charged(self) -> int:
        """The burst's records charged, from the events (the projection may lag)."""
        if not self.burst_ids:
            self.burst_ids = [
                transaction_id(BURST_CUSTOMER, _burst_record(i).usage_id) for i in range(self.burst)
            ]
        with psycopg.connect(self.settings.database_url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM billingledger_events"
                " WHERE originator_id = ANY(%s) AND topic = %s",
                (self.burst_ids, _TXN + "Charged"),
            ).fetchone()
        return int(row[0]) if row else 0

    def _burst_done(self) -> bool:
        """Every burst record charged (asked once a second)."""
        if time.monotonic() - self._last_burst_check < 1:
            return False
        self._last_burst_check = time.monotonic()
        return self._burst_charged() >= self.burst

    def _charged_now(self) -> int:
        assert self._charged is not None  # driving
        return self._charged()

    def _steady_owed(self) -> int:
        return self.load.produced - self._charged_now()

    def _all_settled(self) -> bool:
        """Every record produced is charged or compensated (from the events)."""
        assert self._compensated is not None  # driving
        return self._charged_now() + self._compensated() >= self.produced


def _burst_record(i: int) -> UsageRecord:
    meter = METERS[i % 3]
    return UsageRecord(
        usage_id=f"burst-{i}",
        customer_id=BURST_CUSTOMER,
        meter=meter,
        quantity=Decimal(1 + i % 7) if meter == "api.requests" else Decimal(137 + i % 1000),
        occurred_at=datetime.now(UTC),
    )


def _compensated(settings: Settings) -> int:
    with psycopg.connect(settings.database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM billingledger_events WHERE topic = %s", (_TXN + "Compensated",)
        ).fetchone()
    return int(row[0]) if row else 0


def _transactions(settings: Settings) -> list[Txn]:
    with psycopg.connect(settings.database_url) as conn:
        rows = conn.execute(_TRANSACTIONS, (_TXN + "Metered", _TXN + "Charged")).fetchall()
    return [
        Txn(customer, occurred, recorded, (int(xid), nid), charged)
        for customer, occurred, recorded, xid, nid, charged in rows
    ]


def _report(
    run: _Run, clock: _Clock, stripe: StripeEmulator, money_check: dict[str, Any]
) -> dict[str, Any]:
    txns = _transactions(run.settings)
    burst = [t for t in txns if t.customer == BURST_CUSTOMER]
    others = [t for t in txns if t.customer != BURST_CUSTOMER]
    burst_done = max((t.charged or 0.0 for t in burst), default=clock.burst_charged)
    bounds = {
        "before": (clock.before, clock.burst),
        "during": (clock.burst, burst_done),
        "after": (burst_done, clock.steady_stopped),
    }
    charged = sum(t.charged is not None for t in txns)
    compensated = _compensated(run.settings)
    api = [r for r in stripe.requests() if str(r["path"]).startswith("/v1/")]
    windows = {
        name: window(others, lo, hi, run.positions)
        | {"seconds": round(hi - lo, 1), "stripe_requests": sum(lo <= r["at"] < hi for r in api)}
        for name, (lo, hi) in bounds.items()
    }
    before, during = windows["before"], windows["during"]
    return {
        "others": windows,
        "others_p99_during_minus_before_s": round(
            during["usage_to_charged_s"]["p99"] - before["usage_to_charged_s"]["p99"], 2
        ),
        "burst": {
            "customer": BURST_CUSTOMER,
            "records": len(burst),
            "sent_in_s": round(clock.burst_sent - clock.burst, 2),
            "recorded_in_s": round(max((t.recorded for t in burst), default=0) - clock.burst, 2),
            "charged_in_s": round(burst_done - clock.burst, 2),
        },
        "produced": run.produced,
        "charged": charged,
        "compensated": compensated,
        "drained": run.drained,
        # Not drained: what is missing may still be on its way, so nothing is known lost.
        "lost": run.produced - charged - compensated if run.drained else None,
        "stripe_requests": len(api),
        **money_check,
    }
