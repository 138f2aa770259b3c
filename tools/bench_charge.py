"""``billing-ledger bench charge`` and ``bench outage``: billing under load, every role
running as it would be deployed, in worker processes of its own (``billing-ledger run``:
ingest; relay and projector; process manager and reconciler) on the embedded default,
against the Stripe emulator with added latency and Stripe's rate limit enforced, while
usage for ``customers`` x ``meters`` lines arrives at a steady rate:

* ``charge``: Stripe requests per 1,000 records, the backlog (records not yet charged)
  and whether it stops growing, the time to drain it once the load stops, usage ->
  Charged latency p50/p99; a spike is the same with a high rate for a short time;
* ``outage``: a Stripe outage in the middle of the load, then recovery: Stripe calls
  during the outage, time from recovery to an empty backlog, nothing lost, nothing
  billed twice.

Every run ends with the money checked: the amounts Stripe holds equal the lines' billed
totals, each the line's exact total rounded once (|billed - exact| <= 0.5 minor unit).
With ``plot``, the run's timeline (``tools.timeline``: the backlog, the latency p50/p99
and Stripe's requests a second over time) is drawn to that file (``tools.plots``).
A run reports what it measured even when the backlog did not drain within the drain
timeout (``drained: false``; ``lost`` is then unknown) or a worker process ended
(``workers_ended``): every worker is stopped before the report reads the ledger.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
from eventsourcing.utils import get_topic

from adapters.bootstrap import migrate, prepare
from adapters.ingest.producer import UsageProducer
from adapters.observability.logs import configure_logging
from adapters.progress import step
from adapters.settings import Settings, child_env
from domain.invoice_line import InvoiceLine
from domain.transaction import BillingTransaction
from domain.usage import UsageRecord
from infra.embedded import EmbeddedPostgres, TansuBroker
from infra.stripe_emulator import StripeEmulator
from tools.measure import cores, terminate
from tools.timeline import Timeline

__all__ = [
    "EventCount",
    "Pipeline",
    "charged_count",
    "measure_load",
    "pipeline",
    "render_load",
    "run_load",
]

METERS = ("api.requests", "gpt-4o.input_tokens", "gpt-4o.output_tokens", "gpu.a100.seconds")


@dataclass(frozen=True)
class Pipeline:
    """How a pipeline benchmark runs: the emulator's added latency and enforced limit
    (requests/s), the pushers at a time, the load's customers and meters a customer,
    and the settle interval (and quiet time)."""

    latency_ms: float = 30.0
    stripe_rate: int = 25
    concurrency: int = 8
    customers: int = 100
    meters: int = 3
    settle_interval_s: float = Settings.model_fields["settle_interval_s"].default
    settle_quiet_s: float = Settings.model_fields["settle_quiet_s"].default  # 0: off


def run_load(pipe: Pipeline, *, plot: Path | None = None, **load: Any) -> dict[str, Any]:
    """The report of a load run (``load``: the arguments of ``measure_load``), its
    timeline drawn to ``plot`` when given."""
    result, timeline = measure_load(pipe, **load)
    if plot is not None:
        from tools.plots import plot_run

        plot_run(timeline, plot)
        step(f"plot: {plot}")
    return result


def measure_load(
    pipe: Pipeline,
    *,
    rate: float,
    seconds: float,
    outage_at: float | None = None,
    outage_s: float = 0.0,
    drain_timeout: float = 300.0,
) -> tuple[dict[str, Any], Timeline]:
    """The report of a load run, and its timeline."""
    with pipeline(pipe) as (settings, stripe, workers, load):
        step(f"usage at {rate:g}/s for {seconds:g}s over {load.lines} lines")
        run = _drive(settings, stripe, load, rate, seconds, outage_at, outage_s,
                     drain_timeout)  # fmt: skip
        ended = workers.stop()
        run["money"] = money(settings, stripe)
        result = _report(run, rate=rate, seconds=seconds, stripe_rate=pipe.stripe_rate, load=load)
        timeline = _timeline(run, pipe.stripe_rate, rate)
    if ended:
        result["workers_ended"] = ended
    return result, timeline


class Workers:
    """The worker processes of a running pipeline, one per group of roles."""

    def __init__(self, stack: ExitStack, procs: list[subprocess.Popen[bytes]]) -> None:
        self._stack = stack
        self.procs = procs

    def stop(self) -> list[str]:
        """Stop every worker; the ones that had exited on their own, with their codes."""
        ended = [
            f"{'+'.join(r)} exited {w.returncode}"
            for r, w in zip(ROLE_PROCESSES, self.procs, strict=True)
            if w.poll() is not None
        ]
        self._stack.close()
        return ended


@contextmanager
def pipeline(pipe: Pipeline) -> Iterator[tuple[Settings, StripeEmulator, Workers, Load]]:
    """The embedded default with every role running in worker processes, against the
    Stripe emulator, and one record of the load charged (the groups joined). The
    caller stops the workers (``Workers.stop``) before it reads the ledger for its
    report; the services stop on exit."""
    configure_logging("ERROR")
    with (
        EmbeddedPostgres() as pg,
        TansuBroker() as broker,
        # Stripe's limit is enforced by the emulator; the client keeps a tenth below it.
        StripeEmulator(
            port=0, latency_ms=pipe.latency_ms, rate_limit_per_s=pipe.stripe_rate
        ) as stripe,
    ):
        settings = Settings(
            database_url=pg.url,
            kafka_bootstrap=broker.bootstrap,
            stripe_api_base=stripe.url,
            stripe_rate_per_s=max(1, pipe.stripe_rate * 9 // 10),
            stripe_max_concurrency=pipe.concurrency,
            batch_max_records=2000,
            poll_timeout_ms=50,
            retry_base_s=0.5,
            retry_max_delay_s=5.0,
            breaker_reset_s=2.0,
            stale_after_s=pipe.settle_interval_s * 2,
            reconcile_interval_s=1.0,
            settle_interval_s=pipe.settle_interval_s,
            settle_quiet_s=pipe.settle_quiet_s,
        )
        migrate(settings)
        prepare(settings)
        with ExitStack() as stack:
            procs = [stack.enter_context(_worker(settings, r)) for r in ROLE_PROCESSES]
            step(f"workers: {' | '.join('+'.join(r) for r in ROLE_PROCESSES)}")
            step("waiting for the consumer groups to join")
            load = Load(pipe.customers, min(pipe.meters, len(METERS)))
            warm_up(settings, load)
            yield settings, stripe, Workers(stack, procs), load


# One process per group of roles, as a deployment runs them: the two cores are used.
ROLE_PROCESSES = (("ingest",), ("relay", "project"), ("charge", "reconcile"))


@contextmanager
def _worker(settings: Settings, roles: tuple[str, ...]) -> Iterator[subprocess.Popen[bytes]]:
    env = child_env(settings)
    args = [a for role in roles for a in ("--role", role)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "adapters.cli", "run", *args, "--health-port", "0",
         "--log-level", "ERROR"],
        env=env,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield proc
    finally:
        terminate(proc)


class Load:
    """The records: ``customers`` x ``meters`` lines, each record a small usage."""

    def __init__(self, customers: int, meters: int) -> None:
        self.customers, self.meters = customers, meters
        self.lines = customers * meters
        self.produced = 0

    def record(self, i: int) -> UsageRecord:
        meter = METERS[(i // self.customers) % self.meters]
        quantity = Decimal(1 + i % 7) if meter == "api.requests" else Decimal(137 + i % 1000)
        return UsageRecord(
            usage_id=f"load-{i}",
            customer_id=f"cust-{i % self.customers:03d}",
            meter=meter,
            quantity=quantity,
            occurred_at=datetime.now(UTC),
        )


def warm_up(settings: Settings, load: Load) -> None:
    """One record through the whole pipeline, so group joins are not in the figures."""
    with UsageProducer(settings.kafka_bootstrap, settings.usage_topic, check=False) as usage:
        usage.send(load.record(-1))
    load.produced = 1
    deadline = time.monotonic() + 90
    while charged_count(settings) < 1 and time.monotonic() < deadline:
        time.sleep(0.1)


def _drive(  # noqa: PLR0917
    settings: Settings,
    stripe: StripeEmulator,
    load: Load,
    rate: float,
    seconds: float,
    outage_at: float | None,
    outage_s: float,
    drain_timeout: float,
) -> dict[str, Any]:
    samples: list[tuple[float, int]] = []
    charged = EventCount(settings)
    t0, started = time.monotonic(), time.time()
    producer = threading.Thread(target=produce, args=(settings, load, rate, seconds))
    producer.start()
    outage: tuple[float, float] | None = None
    load_ended: float | None = None
    drained = False
    try:
        while True:
            now = time.monotonic() - t0
            if outage_at is not None and outage is None and now >= outage_at:
                stripe.set_faults(outage=True, outage_mode="503")
                outage = (time.time(), time.time() + outage_s)
                step(f"Stripe outage for {outage_s:g}s")
            if outage is not None and stripe.faults()["outage"] and time.time() >= outage[1]:
                stripe.set_faults(outage=False)
                step("Stripe recovered")
            if load_ended is None and not producer.is_alive():
                load_ended = time.time()
                step("load stopped; draining")
            backlog = load.produced - charged()
            samples.append((time.time(), backlog))
            if load_ended is not None and backlog <= 0:
                drained = True
                break
            if now > seconds + drain_timeout:
                step("gave up waiting for the backlog to drain: reporting what was measured")
                break
            time.sleep(0.25)
    finally:
        charged.close()
    assert load_ended is not None or not producer.is_alive()
    return {"samples": samples, "started": started, "outage": outage,
            "load_ended": load_ended or time.time(), "drained": drained,
            "produced": load.produced, "stripe": stripe, "settings": settings}  # fmt: skip


def produce(
    settings: Settings,
    load: Load,
    rate: float,
    seconds: float,
    stop: threading.Event | None = None,
) -> None:
    """``load``'s records at ``rate`` a second for ``seconds`` or until ``stop``."""
    # Unchecked: the bench's own records, and the load must not take the pipeline's CPU.
    usage = UsageProducer(settings.kafka_bootstrap, settings.usage_topic, check=False)
    start = time.monotonic()
    i = 0
    while (elapsed := time.monotonic() - start) < seconds and not (stop and stop.is_set()):
        due = int(elapsed * rate)
        while i < due:
            usage.send(load.record(i))
            i += 1
        usage.flush()
        load.produced = i + 1  # + the warm-up record
        time.sleep(0.005)
    usage.close()


_CHARGED = get_topic(BillingTransaction.Charged)


def charged_count(settings: Settings) -> int:
    """How many transactions are Charged now (the whole events table read: for a single
    look; a poll keeps an ``EventCount``)."""
    with EventCount(settings) as count:
        return count()


class EventCount:
    """How many events of one topic (Charged by default) the log holds, counted as it
    grows, on one connection.

    A poll reads only the rows written since the previous poll's horizon (the oldest
    transaction then still open, ``pg_snapshot_xmin``), through the events' ``xid``
    index: every row below a horizon was already written or never will be (``store.
    eventlog``), so it is counted once and never read again. Counting the whole table
    four times a second cost the machine under test a growing share of a core, the
    most while the backlog drained (a quarter of a million rows by then)."""

    def __init__(self, settings: Settings, topic: str = _CHARGED) -> None:
        self.topic = topic
        # No prepared statements: each count is planned for its own horizon (an index
        # range, never a generic plan's scan of the table).
        self._conn = psycopg.connect(settings.database_url, autocommit=True, prepare_threshold=None)
        self._below = 0  # Charged rows below the horizon
        self._horizon = "0"

    def __call__(self) -> int:
        conn = self._conn
        horizon = str(conn.execute(_HORIZON).fetchone()[0])  # type: ignore[index]
        settled, recent = conn.execute(
            _COUNT_CHARGED, {"from": self._horizon, "to": horizon, "topic": self.topic}
        ).fetchone()  # type: ignore[misc]
        self._below += int(settled)
        self._horizon = horizon
        return self._below + int(recent)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> EventCount:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


_HORIZON = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text"
# Rows from the last horizon to this one (final), and those at or above this one (some
# may yet commit: counted again at the next poll).
_COUNT_CHARGED = (
    "SELECT count(*) FILTER (WHERE xid < %(to)s::xid8),"
    " count(*) FILTER (WHERE xid >= %(to)s::xid8)"
    " FROM billingledger_events WHERE xid >= %(from)s::xid8 AND topic = %(topic)s"
)


_LINE_TOTALS = (
    "SELECT count(*), coalesce(sum(billed), 0), coalesce(max(abs(billed - exact)), 0) FROM ("
    " SELECT DISTINCT ON (originator_id) (s ->> 'billed')::bigint AS billed,"
    " (s -> 'exact_total' ->> '_data_')::numeric AS exact"
    " FROM (SELECT originator_id, originator_version, convert_from(state, 'UTF8')::jsonb AS s"
    "  FROM billingledger_events WHERE topic = ANY(%s)) e"
    " ORDER BY originator_id, originator_version DESC) lines"
)


def money(settings: Settings, stripe: StripeEmulator) -> dict[str, Any]:
    """What Stripe holds against the lines' billed and exact totals, from the events."""
    topics = [get_topic(InvoiceLine.Settled), get_topic(InvoiceLine.Removed)]
    with psycopg.connect(settings.database_url) as conn:
        lines, billed, worst = conn.execute(_LINE_TOTALS, (topics,)).fetchone() or (0, 0, 0)
    items = stripe.live_invoice_items()
    held = sum(int(i["amount"]) for i in items)
    per_chunk = Counter((i["metadata"].get("line_id"), i["metadata"].get("chunk")) for i in items)
    return {
        "lines": lines,
        "stripe_holds": held,
        "lines_billed": int(billed),
        "stripe_equals_billed": held == int(billed),
        "duplicates": sum(n - 1 for n in per_chunk.values()),  # two items for one line part
        "max_abs_billed_minus_exact": str(worst),
    }


_TXN = "domain.transaction:BillingTransaction."
# Each charge: when it was made and its usage -> Charged latency (epoch seconds).
_CHARGES = (
    "SELECT extract(epoch FROM charged_at) AS charged_at,"
    " extract(epoch FROM charged_at - occurred_at) AS latency FROM ("
    " SELECT (convert_from(c.state, 'UTF8')::jsonb -> 'timestamp' ->> '_data_')::timestamptz"
    " AS charged_at,"
    " (convert_from(m.state, 'UTF8')::jsonb -> 'occurred_at' ->> '_data_')::timestamptz"
    " AS occurred_at"
    " FROM billingledger_events c JOIN billingledger_events m"
    " ON m.originator_id = c.originator_id AND m.originator_version = 1"
    " WHERE m.topic = %s AND c.topic = %s) charges"
)
_LATENCY = (
    "SELECT count(*), percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY latency)"  # noqa: S608
    f" FROM ({_CHARGES}) latencies"
)


def _timeline(run: dict[str, Any], stripe_rate: int, rate: float) -> Timeline:
    settings: Settings = run["settings"]
    stripe: StripeEmulator = run["stripe"]
    with psycopg.connect(settings.database_url) as conn:
        charges = conn.execute(_CHARGES, (_TXN + "Metered", _TXN + "Charged")).fetchall()
    return Timeline.measure(
        started=run["started"],
        backlog=run["samples"],
        charges=[(float(at), float(latency)) for at, latency in charges],
        requests=[float(r["at"]) for r in _api_requests(stripe)],
        stripe_rate_limit_per_s=stripe_rate,
        usage_rate_per_s=rate,
        load_end=run["load_ended"],
        outage=run["outage"],
    )


def _report(
    run: dict[str, Any], *, rate: float, seconds: float, stripe_rate: int, load: Load
) -> dict[str, Any]:
    settings: Settings = run["settings"]
    stripe: StripeEmulator = run["stripe"]
    samples: list[tuple[float, int]] = run["samples"]
    outage = run["outage"]
    with psycopg.connect(settings.database_url) as conn:
        charged = conn.execute(_LATENCY, (_TXN + "Metered", _TXN + "Charged")).fetchone()
        compensated_row = conn.execute(
            "SELECT count(*) FROM billingledger_events WHERE topic = %s", (_TXN + "Compensated",)
        ).fetchone()
    assert charged is not None
    compensated = compensated_row[0] if compensated_row else 0
    api = _api_requests(stripe)
    ended = run["load_ended"]
    in_load = [b for at, b in samples if at <= ended]
    last_third = in_load[len(in_load) * 2 // 3 :] or [0]
    result: dict[str, Any] = {
        "cores": cores(),
        "usage_rate_per_s": rate,
        "seconds": seconds,
        "lines": load.lines,
        "produced": run["produced"],
        "charged": charged[0],
        "compensated": compensated,
        "drained": run["drained"],
        # Not drained: what is missing may still be on its way, so nothing is known lost.
        "lost": run["produced"] - charged[0] - compensated if run["drained"] else None,
        "stripe_requests": len(api),
        "stripe_requests_per_1000_records": round(1000 * len(api) / max(run["produced"], 1), 2),
        "stripe_failures_by_status": dict(
            sorted(
                Counter(
                    str(r.get("status")) for r in api if (r.get("status") or 500) >= 400
                ).items()
            )
        ),
        "stripe_rate_limit_per_s": stripe_rate,
        "peak_backlog": max((b for _, b in samples), default=0),
        "backlog_max_last_third_of_load": max(last_third),
        "backlog_at_load_end": in_load[-1] if in_load else 0,
        "drained_s_after_load": round(_drained_at(samples, ended) - ended, 1)
        if run["drained"]
        else None,
        "latency_s_p50": round(float((charged[1] or [0, 0])[0]), 2),
        "latency_s_p99": round(float((charged[1] or [0, 0])[1]), 2),
        **run["money"],
    }
    if outage is not None:
        result["outage_s"] = round(outage[1] - outage[0], 1)
        result["stripe_calls_during_outage"] = sum(
            1 for r in api if outage[0] <= r["at"] <= outage[1]
        )
        result["drained_s_after_recovery"] = (
            round(_drained_at(samples, outage[1]) - outage[1], 1) if run["drained"] else None
        )
        # While the load goes on the backlog never empties: the outage is absorbed when
        # the backlog is back to what it was in the 10 s before the outage began.
        steady = max((b for at, b in samples if outage[0] - 10 <= at < outage[0]), default=0)
        result["backlog_before_outage"] = steady
        result["back_to_that_backlog_s_after_recovery"] = round(
            _drained_at(samples, outage[1], level=steady) - outage[1], 1
        )
    return result


def _api_requests(stripe: StripeEmulator) -> list[dict[str, Any]]:
    """The requests to Stripe's API the emulator received (not its control routes)."""
    return [r for r in stripe.requests() if str(r["path"]).startswith("/v1/")]


def _drained_at(samples: list[tuple[float, int]], after: float, level: int = 0) -> float:
    """When the backlog first fell to ``level`` or below after ``after`` (else the end)."""
    for at, backlog in samples:
        if at > after and backlog <= level:
            return at
    return samples[-1][0] if samples else after


def render_load(result: dict[str, Any]) -> str:
    return "\n".join(f"{key:<34} {value}" for key, value in result.items())
