"""``billing-ledger bench ingest``: how fast usage becomes durable transactions.

Everything is measured in one run on one database server, so the figures compare
with each other rather than with another machine:

* end to end: N records already on the topic -> consumed, priced, Metered+Reserved
  saved, offsets committed (records/s, events/s, batch commit latency p50/p99), by one
  ingest process, and then (``workers`` > 1) by ``workers`` processes in a consumer
  group of their own on a database of their own (timed from when the group has
  settled: each worker holds its partitions paused until all are assigned);
  with ``saves_inline``, one process again with its saves in line (``INGEST_OVERLAP_SAVES``
  off: each batch saved before the next is decided), which is what saving behind gains;
  with ``contracts``, one process again with a contract for half the customers (every
  meter 10 percent off, and a minimum), then once more without (each on a database of its
  own): what reading and applying contracts costs, against the mean of the runs without
  before and after it (the machine's drift during the run);
  with ``credits``, ``workers`` processes again where every customer holds a prepaid
  credit grant in each of its currencies (never exhausted: every record consumes credit
  and every invoice gets a credit line) and alert thresholds on it (``CREDIT_ALERTS``:
  a balance, two shares of the grant and a spend, each checked for every record), then
  once more without either (each on a database of its own): what burning credit down
  and checking alerts in the save costs, against the mean of the runs without before
  and after it (the same number of processes); with ``rounds`` > 1, credit and none
  alternate that many times (a run of each per round, each on a database of its own),
  each credit run is set against the runs without on either side of it, and the ratio
  reported is the median of the rounds' (two shared cores drift by 10 percent between
  two runs of the same work, about what credit costs: one pair cannot tell them apart);
* store append: the same batches saved straight to the event store (no Kafka), 1 and
  2 concurrent writers (threads of one process, so client CPU does not add up; the
  figure shows what the database lets through), with
  - our lock-free recorder at the configured batch;
  - at 250 records per batch, because eventsourcing's stock recorder stalls on
    larger ones (its psycopg pipeline with a large parameter never syncs; seen at
    500 on a 50,000-record run, and now and then at 250 on the embedded PostgreSQL:
    a writer count with no save for 20 s is reported as stalled, its connections
    terminated, and the run goes on): the stock recorder (LOCK TABLE + NOTIFY +
    composite-array insert), ours, and ours with the stock LOCK TABLE + NOTIFY
    added, which isolates what the lock and the NOTIFY cost;
* with ``prices="tiered"``, end to end again by one process on a database of its own
  whose price book prices every meter by graduated tiers (``tiered_prices``: each
  record's amount is what it adds to its line, priced when its line is chosen), then
  flat once more on another: tiered is set against the mean of the flat runs before
  and after it (a run second pays for the first one's writes);
* raw PostgreSQL: binary ``COPY`` of the very rows the ledger wrote, 2,000 rows per
  transaction, into a table of the same columns and primary key; and single-row
  INSERT commits against single-transaction appends.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from adapters.bootstrap import (
    build_ingest_worker,
    close_worker,
    migrate,
    open_ledger,
    prepare,
)
from adapters.broker import make_producer
from adapters.progress import Progress, step
from adapters.runtime import tune_gc, tune_switching
from adapters.settings import Settings
from domain.contract import check_terms
from domain.credits import MAX_GRANT_MINOR
from domain.ids import transaction_id
from domain.price_book import EPOCH
from domain.pricing import Price, PriceList, Tier
from domain.usage import UsageRecord
from infra.embedded import EmbeddedPostgres, TansuBroker
from tools.bench_store import (
    RECORDERS,
    STOCK_MAX_BATCH,
    count_events,
    fresh_database,
    raw_copy,
    server_version,
    single_appends,
    store_append,
)
from tools.measure import ServerCpu, cores, percentile, quiet_server
from tools.synthetic import bench_usage

__all__ = ["PRICES", "credit_ratios", "render", "run_ingest_bench", "tiered_prices"]

CUSTOMERS = 50
PRICES = ("flat", "tiered")


def run_ingest_bench(
    records: int,
    *,
    batch: int = 2000,
    database_url: str | None = None,
    workers: int = 1,
    end_to_end_only: bool = False,
    saves_inline: bool = False,
    contracts: bool = False,
    prices: str = "flat",
    credits: bool = False,
    customers: int = CUSTOMERS,
    rounds: int = 1,
) -> dict[str, Any]:
    """The figures above; ``end_to_end_only`` measures end to end and the raw ``COPY``
    of its rows only (no store appends: a third of the time); ``prices="tiered"`` also
    measures end to end with every meter priced by graduated tiers."""
    with ExitStack() as stack:
        if database_url is None:
            step("starting embedded PostgreSQL")
            admin_url = stack.enter_context(EmbeddedPostgres()).url
        else:
            admin_url = database_url
        step("starting the Tansu broker")
        broker = stack.enter_context(TansuBroker())
        names = (
            "e2e",
            *(("e2e_workers",) if workers > 1 else ()),
            *(("e2e_inline",) if saves_inline else ()),
            *(("e2e_contracts", "e2e_again") if contracts else ()),
            *(("e2e_tiered", "e2e_flat_again") if prices == "tiered" else ()),
            *(_credit_runs(rounds) if credits else ()),
            *(() if end_to_end_only else RECORDERS),
        )
        urls = {name: fresh_database(admin_url, f"bench_{name}") for name in names}
        settings = Settings(
            database_url=urls["e2e"],
            kafka_bootstrap=broker.bootstrap,
            ingest_group="bench",
            batch_max_records=batch,
        )
        migrate(settings)
        prepare(settings)
        usage = bench_usage(records, customers=customers)
        result: dict[str, Any] = {
            "records": records,
            "batch": batch,
            "workers": workers,
            "customers": customers,
            "cores": cores(),
        }
        result["server"] = server_version(urls["e2e"])
        result["produce"] = _produce(settings, usage)
        result["end_to_end"] = _end_to_end(settings, records, 1)
        if workers > 1:  # the same records again, by a group of its own, on a database of its own
            group = settings.model_copy(
                update={"database_url": urls["e2e_workers"], "ingest_group": "bench-workers"}
            )
            migrate(group)
            prepare(group, topics=False)
            result["end_to_end_workers"] = _end_to_end(group, records, workers)
        if saves_inline:
            inline = settings.model_copy(
                update={
                    "database_url": urls["e2e_inline"],
                    "ingest_group": "bench-inline",
                    "ingest_overlap_saves": False,
                }
            )
            migrate(inline)
            prepare(inline, topics=False)
            result["end_to_end_inline"] = _end_to_end(inline, records, 1)
        if contracts:  # then none again: the machine's drift during the run, measured
            result["end_to_end_contracts"] = _with_contracts(settings, urls["e2e_contracts"], usage)
            result["end_to_end_again"] = _fresh_run(
                settings, urls["e2e_again"], "bench-again", records
            )
        if prices == "tiered":
            result["end_to_end_tiered"] = _end_to_end_tiered(settings, urls["e2e_tiered"], records)
            # Flat again after it, on a database of its own: a run second pays for the
            # first one's writes (checkpoints, vacuum), so tiered is set against both.
            result["end_to_end_flat_again"] = _fresh_run(
                settings, urls["e2e_flat_again"], "bench-flat", records
            )
        if credits:  # then none again, with as many processes: the machine's drift
            runs = _credit_rounds(settings, urls, usage, records, workers, rounds)
            result["end_to_end_credits"], result["end_to_end_after_credits"] = runs[0]
            result["credit_rounds"] = [
                {"credits_records_per_s": c["records_per_s"],
                 "none_after_records_per_s": a["records_per_s"],
                 "cpu_us_per_record": {kind: [run["ingest_cpu_us_per_record"],
                                              run["server_cpu_us_per_record"]]
                                       for kind, run in (("credits", c), ("none", a))}}
                for c, a in runs
            ]  # fmt: skip
        if end_to_end_only:
            result["raw_copy"] = raw_copy(urls["e2e"])
            result["ratios"] = _ratios(result, 0)
            return result
        small = min(batch, STOCK_MAX_BATCH)
        result["store_append"] = {
            "ours": store_append(settings, urls["ours"], usage, batch, "ours"),
            f"at_{small}": {
                name: store_append(settings, urls[name], usage, small, name) for name in RECORDERS
            },
        }
        result["raw_copy"] = raw_copy(urls["e2e"])
        result["single_append"] = single_appends(settings, urls["ours"], urls["stock"])
        result["ratios"] = _ratios(result, small)
        return result


def _ratios(r: dict[str, Any], small: int) -> dict[str, float | None]:
    copy = r["raw_copy"]["rows_per_s"]
    scaling: dict[str, float] = {}
    if "end_to_end_workers" in r:
        many = r["end_to_end_workers"]
        scaling = {
            "end_to_end_workers_records_vs_copy": round(many["records_per_s"] / copy, 3),
            "end_to_end_workers_vs_1": round(
                many["records_per_s"] / r["end_to_end"]["records_per_s"], 2
            ),
        }
    if "end_to_end_tiered" in r:  # against the mean of the flat runs before and after it
        flat = (r["end_to_end"]["records_per_s"] + r["end_to_end_flat_again"]["records_per_s"]) / 2
        scaling["end_to_end_tiered_vs_flat"] = round(
            r["end_to_end_tiered"]["records_per_s"] / flat, 2
        )
    if "end_to_end_credits" in r:  # against the mean of the runs before and after it
        before = r["end_to_end_workers" if "end_to_end_workers" in r else "end_to_end"]
        per_round = credit_ratios(before["records_per_s"], r["credit_rounds"])
        for entry, ratio in zip(r["credit_rounds"], per_round, strict=True):
            entry["vs_none"] = round(ratio, 2)
        scaling["end_to_end_credits_vs_none"] = round(statistics.median(per_round), 2)
    if "end_to_end_inline" in r:
        scaling["end_to_end_behind_vs_inline"] = round(
            r["end_to_end"]["records_per_s"] / r["end_to_end_inline"]["records_per_s"], 2
        )
    if "end_to_end_contracts" in r:  # against the mean of the runs before and after it
        none = (r["end_to_end"]["records_per_s"] + r["end_to_end_again"]["records_per_s"]) / 2
        scaling["end_to_end_contracts_vs_none"] = round(
            r["end_to_end_contracts"]["records_per_s"] / none, 2
        )
    ratios = {
        "end_to_end_events_vs_copy": round(r["end_to_end"]["events_per_s"] / copy, 3),
        "end_to_end_records_vs_copy": round(r["end_to_end"]["records_per_s"] / copy, 3),
        **scaling,
    }
    if "store_append" not in r:  # end to end only
        return ratios
    at_small = r["store_append"][f"at_{small}"]

    def rate(name: str, writers: str) -> float | None:
        figures = at_small[name][writers]
        return None if figures.get("stalled") else float(figures["events_per_s"])

    def versus(name: str, writers: str) -> float | None:
        theirs, ours = rate(name, writers), rate("ours", writers)
        return None if theirs is None or ours is None else round(theirs / ours, 3)

    return {
        "store_append_vs_copy": round(
            r["store_append"]["ours"]["1_writer"]["events_per_s"] / copy, 3
        ),
        **ratios,
        **{
            f"{name}_vs_ours_{w}": versus(name, w)
            for name in ("stock", "ours_locking")
            for w in ("1_writer", "2_writers")
        },
    }


def _with_contracts(settings: Settings, url: str, usage: list[UsageRecord]) -> dict[str, Any]:
    """End to end by 1 process, on a database of its own where every other customer has a
    contract (every meter 10 percent off, a minimum of 100 in each currency)."""
    step("end to end with contracts for half the customers")
    this = settings.model_copy(update={"database_url": url, "ingest_group": "bench-contracts"})
    migrate(this)
    prepare(this, topics=False)
    customers = sorted({r.customer_id for r in usage})[::2]
    with open_ledger(this) as ledger:
        listed = ledger.refresh_prices().latest.prices
        meters = {name: {"discount": "10"} for name in listed.prices}
        currencies = {p.currency for p in listed.prices.values()}
        terms = check_terms(meters, {c: "100" for c in currencies}, listed)
        for customer in customers:
            ledger.set_contract(customer, terms, EPOCH)
    figures = _end_to_end(this, len(usage), 1)
    figures["customers_with_contracts"] = len(customers)
    return figures


def tiered_prices(prices: PriceList) -> PriceList:
    """Every meter of ``prices`` by graduated tiers: its own price up to 100,000 units, 90%
    of it up to 1,000,000, 80% above (the bench's lines cross all three)."""
    return PriceList({name: _tiered(p) for name, p in prices.prices.items()})


def _tiered(price: Price) -> Price:
    rate = price.unit_price
    tiers = (
        Tier(100_000, rate),
        Tier(1_000_000, rate * Decimal("0.9")),
        Tier(None, rate * Decimal("0.8")),
    )
    return Price(rate, price.currency, price.per, "graduated", tiers)


def _end_to_end_tiered(settings: Settings, url: str, records: int) -> dict[str, Any]:
    """End to end by one process on ``url``, whose book prices every meter by tiers from
    the epoch (so from the start of every period the usage falls in)."""
    tiered = settings.model_copy(update={"database_url": url, "ingest_group": "bench-tiered"})
    migrate(tiered)
    prepare(tiered, topics=False)
    with open_ledger(tiered) as ledger:
        ledger.publish_prices(tiered_prices(ledger.configured.latest.prices), EPOCH)
    step("  (every meter priced by graduated tiers)")
    result = _end_to_end(tiered, records, 1)
    with open_ledger(tiered) as ledger:  # what priced the first record, and its line
        first = bench_usage(1, customers=CUSTOMERS)[0]
        txn = ledger.transaction(transaction_id(first.customer_id, first.usage_id))
        assert txn.line_id is not None
        line = ledger.line_by_id(txn.line_id)
        result["first_record"] = {"price_version": txn.price_version, "line_model": line.model}
    return result


def _fresh_run(
    settings: Settings, url: str, group: str, records: int, workers: int = 1
) -> dict[str, Any]:
    """End to end by ``workers`` processes, on a database of its own."""
    this = settings.model_copy(update={"database_url": url, "ingest_group": group})
    migrate(this)
    prepare(this, topics=False)
    return _end_to_end(this, records, workers)


def _with_credits(  # noqa: PLR0917
    settings: Settings, url: str, usage: list[UsageRecord], records: int, workers: int, i: int
) -> dict[str, Any]:
    """End to end by ``workers`` processes, on a database of its own where every customer
    holds a prepaid credit grant in each of its currencies, with alerts on it."""
    group = f"bench-credits-{i}"
    credited = settings.model_copy(update={"database_url": url, "ingest_group": group})
    migrate(credited)
    prepare(credited, topics=False)
    _grant_everyone(credited, usage)
    return {**_end_to_end(credited, records, workers), "alerts": CREDIT_ALERTS}


# Checked for every record of a customer with credit; none is reached in the run (the
# grant never runs out), as most records reach none in real traffic.
CREDIT_ALERTS = ["balance:100000", "percent_of_grant:50", "percent_of_grant:90", "spend:10000000"]


def _credit_runs(rounds: int) -> tuple[str, ...]:
    """The databases of ``rounds`` rounds of credit, then none."""
    return tuple(f"e2e_{kind}_{i}" for i in range(rounds) for kind in ("credits", "none"))


def _credit_rounds(  # noqa: PLR0917
    settings: Settings,
    urls: dict[str, str],
    usage: list[UsageRecord],
    records: int,
    workers: int,
    rounds: int,
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``rounds`` times: the records with credit and alerts, then without (each by a
    group and on a database of its own)."""
    done: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for i in range(rounds):
        if rounds > 1:
            step(f"credit round {i + 1} of {rounds}")
        credited = _with_credits(settings, urls[f"e2e_credits_{i}"], usage, records, workers, i)
        after = _fresh_run(settings, urls[f"e2e_none_{i}"], f"bench-none-{i}", records, workers)
        done.append((credited, after))
    return done


def credit_ratios(first_none: float, rounds: list[dict[str, Any]]) -> list[float]:
    """Each round's credit rate over the mean of the runs without credit on either side
    of it (the first round's before: ``first_none``)."""
    ratios: list[float] = []
    before = first_none
    for r in rounds:
        after = r["none_after_records_per_s"]
        ratios.append(r["credits_records_per_s"] / ((before + after) / 2))
        before = after
    return ratios


def _grant_everyone(settings: Settings, usage: list[UsageRecord]) -> None:
    """A grant that never runs out, and the alerts ``CREDIT_ALERTS``, for each customer in
    each currency of its usage."""
    prices = settings.load_prices()
    accounts = {(r.customer_id, prices.price_of(r.meter).currency) for r in usage}
    step(f"granting credit to {len(accounts)} accounts")
    at = datetime.now(UTC) - timedelta(days=1)
    with open_ledger(settings) as ledger:
        for customer_id, currency in sorted(accounts):
            ledger.change_account(customer_id, currency, lambda a: a.grant_credit(
                "bench", MAX_GRANT_MINOR, effective_at=at, source="promotional", reason="bench",
            ))  # fmt: skip
            ledger.set_alerts(customer_id, currency, CREDIT_ALERTS)


def _produce(settings: Settings, usage: list[UsageRecord]) -> dict[str, float]:
    step(f"producing {len(usage):,} records")
    producer = make_producer(settings.kafka_bootstrap)
    started = time.perf_counter()
    for r in usage:
        producer.send(settings.usage_topic, key=r.customer_id.encode(), value=r.to_json())
    producer.flush()
    elapsed = time.perf_counter() - started
    producer.close()
    return {"seconds": round(elapsed, 3), "records_per_s": round(len(usage) / elapsed)}


def _end_to_end(settings: Settings, records: int, workers: int) -> dict[str, Any]:
    step(f"end to end: {workers} ingest process(es) consume, price, save, commit offsets")
    quiet_server(settings.database_url)  # no checkpoint owed for earlier writes
    ctx = multiprocessing.get_context("spawn")
    group = _Group(
        assigned=ctx.Array("i", workers),
        done=ctx.Value("q", 0),
        start=ctx.Event(),
        stop=ctx.Event(),
        results=ctx.Queue(),
    )
    procs = [
        ctx.Process(target=_ingest_process, args=(settings.model_dump(), w, group), daemon=True)
        for w in range(workers)
    ]
    for proc in procs:
        proc.start()
    try:
        _wait_settled(group.assigned, settings.usage_partitions, workers)
        server = ServerCpu(settings.database_url)
        server_before = server.read()
        progress = Progress(records, "ingested")
        started = time.monotonic()
        group.start.set()
        while group.done.value < records and time.monotonic() < started + 600:
            if not all(proc.is_alive() for proc in procs):
                raise RuntimeError("an ingest worker process died")
            progress.update(group.done.value)
            time.sleep(0.05)
        server_after = server.read()  # before the workers stop and their backends end
        progress.update(group.done.value)
        progress.done()
    finally:
        group.stop.set()
    stats = [group.results.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(10)
    elapsed = max(st["finished"] for st in stats) - started
    events = count_events(settings.database_url)
    # This run's vacuum and checkpoint now, outside every run's timing: the next run
    # does not pay for this one's writes.
    quiet_server(settings.database_url, vacuum=True)
    lat = sorted(sec for st in stats for sec in st["batch_seconds"])
    done = sum(st["records"] for st in stats)
    ingest_cpu = sum(st["cpu_seconds"] for st in stats)
    server_cpu = (
        None if server_before is None or server_after is None else server_after - server_before
    )
    return {
        "workers": workers,
        "seconds": round(elapsed, 3),
        "records_per_s": round(sum(st["records"] for st in stats) / elapsed),
        "events_per_s": round(events / elapsed),
        "events": events,
        "batches": len(lat),
        "batch_commit_ms_p50": round(percentile(lat, 50) * 1000, 1),
        "batch_commit_ms_p99": round(percentile(lat, 99) * 1000, 1),
        "ingest_cpu_us_per_record": round(ingest_cpu / done * 1e6, 1) if done else None,
        "server_cpu_us_per_record": (
            round(server_cpu / done * 1e6, 1) if done and server_cpu is not None else None
        ),
    }


def _wait_settled(assigned: Any, partitions: int, workers: int, timeout: float = 90.0) -> None:
    """Until every partition is held and every worker that can hold one does, for 1.5 s."""
    holders = min(workers, partitions)
    deadline = time.monotonic() + timeout
    settled_since: float | None = None
    while time.monotonic() < deadline:
        held = list(assigned)
        if sum(held) == partitions and sum(1 for n in held if n) == holders:
            settled_since = settled_since or time.monotonic()
            if time.monotonic() - settled_since >= 1.5:
                return
        else:
            settled_since = None
        time.sleep(0.05)
    raise RuntimeError(f"the consumer group did not settle in {timeout:.0f} s: {list(assigned)}")


@dataclass
class _Group:
    """What the benchmark shares with its ingest processes."""

    assigned: Any  # partitions each worker holds (multiprocessing Array)
    done: Any  # records processed by all the workers (multiprocessing Value)
    start: Any  # set when the group has settled
    stop: Any
    results: Any  # one dict of figures per worker (multiprocessing Queue)


def _ingest_process(settings_data: dict[str, Any], index: int, group: _Group) -> None:
    """One ingest worker: joins the group holding its partitions paused until ``start``."""
    from kafka import ConsumerRebalanceListener

    assigned, done, start = group.assigned, group.done, group.start

    settings = Settings(**settings_data)
    with open_ledger(settings) as ledger:
        worker = build_ingest_worker(settings, ledger)
        consumer = worker.consumer

        class HoldUntilStart(ConsumerRebalanceListener):  # type: ignore[misc]
            def on_partitions_revoked(self, revoked: Any) -> None:
                assigned[index] = 0

            def on_partitions_assigned(self, partitions: Any) -> None:
                assigned[index] = len(partitions)
                if not start.is_set():
                    consumer.pause(*partitions)

        consumer.subscribe([settings.usage_topic], listener=HoldUntilStart())
        while not start.is_set():
            consumer.poll(timeout_ms=100)  # joins the group; paused partitions yield nothing
        consumer.resume(*consumer.assignment())
        tune_gc()  # as ``billing-ledger run`` does after start-up
        if settings.ingest_overlap_saves:
            tune_switching()  # as its ingest role does
        counted = [0, time.monotonic()]
        cpu = [time.process_time(), time.process_time()]  # at the start, at the last batch

        def on_batch(stats: Any) -> None:
            cpu[1] = time.process_time()
            with done.get_lock():
                done.value += stats.records - counted[0]
            counted[0], counted[1] = stats.records, time.monotonic()

        try:
            worker.run(group.stop, on_batch)
        finally:
            close_worker(worker)
        group.results.put(
            {
                "records": worker.stats.records,
                "finished": counted[1],
                "batch_seconds": worker.stats.batch_seconds,
                "cpu_seconds": cpu[1] - cpu[0],
            }
        )


def render(r: dict[str, Any]) -> str:
    e2e = r["end_to_end"]

    ratios = r["ratios"]
    many = r.get("end_to_end_workers")
    rows = [
        ("produce (kafka-python -> Tansu)", _RATE(r["produce"]["records_per_s"], "records/s")),
        ("end to end (1 ingest process): records", _RATE(e2e["records_per_s"], "records/s")),
        ("end to end: events", _RATE(e2e["events_per_s"], "events/s")),
        (
            "  batch commit p50 / p99",
            f"{e2e['batch_commit_ms_p50']} / {e2e['batch_commit_ms_p99']} ms",
        ),
        ("end-to-end records / COPY", f"{ratios['end_to_end_records_vs_copy']:>10}"),
    ]
    if many is not None:
        rows += [
            (
                f"end to end ({many['workers']} ingest processes): records",
                _RATE(many["records_per_s"], "records/s"),
            ),
            (
                "  batch commit p50 / p99",
                f"{many['batch_commit_ms_p50']} / {many['batch_commit_ms_p99']} ms",
            ),
            (
                f"  records / COPY; {many['workers']} / 1 process",
                f"{ratios['end_to_end_workers_records_vs_copy']:>10} /"
                f" {ratios['end_to_end_workers_vs_1']}",
            ),
        ]
    for key, label, ratio, ratio_label in _ONE_PROCESS_AGAIN:
        again = r.get(key)
        if again is not None:
            rows += [
                (f"end to end, 1 process, {label}", _RATE(again["records_per_s"], "records/s")),
                (
                    "  batch commit p50 / p99",
                    f"{again['batch_commit_ms_p50']} / {again['batch_commit_ms_p99']} ms",
                ),
                (f"  {ratio_label}", f"{ratios[ratio]:>10}"),
            ]
    flat_again = r.get("end_to_end_flat_again")
    if flat_again is not None:
        rows.insert(
            -1, ("  flat prices again, after it", _RATE(flat_again["records_per_s"], "records/s"))
        )
    priced = r.get("end_to_end_contracts")
    if priced is not None:
        rows += [
            (
                f"end to end, 1 process, {priced['customers_with_contracts']} customers with"
                " contracts",
                _RATE(priced["records_per_s"], "records/s"),
            ),
            (
                "end to end, 1 process, none again",
                _RATE(r["end_to_end_again"]["records_per_s"], "records/s"),
            ),
            ("  with contracts / none (mean)", f"{ratios['end_to_end_contracts_vs_none']:>10}"),
        ]
    credited = r.get("end_to_end_credits")
    if credited is not None:
        n = credited["workers"]
        rows += [
            (
                f"end to end, {n} process(es), every customer with credit and alerts",
                _RATE(credited["records_per_s"], "records/s"),
            ),
            (
                "  batch commit p50 / p99",
                f"{credited['batch_commit_ms_p50']} / {credited['batch_commit_ms_p99']} ms",
            ),
            (
                f"end to end, {n} process(es), none again",
                _RATE(r["end_to_end_after_credits"]["records_per_s"], "records/s"),
            ),
        ]
        rows += _credit_round_rows(r.get("credit_rounds", []), ratios)
    rows += [
        ("raw binary COPY of the same rows", _RATE(r["raw_copy"]["rows_per_s"], "rows/s")),
        ("end-to-end events / COPY", f"{ratios['end_to_end_events_vs_copy']:>10}"),
    ]
    if "store_append" in r:
        rows += _appends_rows(r)
    head = (
        f"billing-ledger bench ingest: {r['records']:,} records of {r['customers']} customers, "
        f"batch {r['batch']}, 1 and {r['workers']} ingest processes, {r['cores']} cores, "
        f"PostgreSQL {r['server']}"
    )
    return "\n".join([head, ""] + [f"{name:<42} {value}" for name, value in rows])


_RATE = "{:>10,} {}".format
# One process again, another way: its result's key, its label, its ratio and that's label.
_ONE_PROCESS_AGAIN = (
    (
        "end_to_end_inline",
        "saves in line",
        "end_to_end_behind_vs_inline",
        "saving behind / in line",
    ),
    ("end_to_end_tiered", "tiered prices", "end_to_end_tiered_vs_flat",
     "tiered / flat (mean of before and after)"),
)  # fmt: skip


def _credit_round_rows(
    rounds: list[dict[str, Any]], ratios: dict[str, Any]
) -> list[tuple[str, str]]:
    """The ratio of credit to none; with more than one round, the later rounds' rates,
    each round's ratio and their median."""
    ratio = f"{ratios['end_to_end_credits_vs_none']:>10}"
    if len(rounds) <= 1:
        return [("  with credit and alerts / none", ratio), *_cpu_rows(rounds)]
    rows: list[tuple[str, str]] = []
    for i, later in enumerate(rounds[1:], start=2):
        rows += [
            (f"round {i}: with credit and alerts",
             _RATE(later["credits_records_per_s"], "records/s")),
            (f"round {i}: none again", _RATE(later["none_after_records_per_s"], "records/s")),
        ]  # fmt: skip
    each = ", ".join(f"{x['vs_none']:.2f}" for x in rounds)
    return [
        *rows,
        (f"  with credit and alerts / none: median of {each}", ratio),
        *_cpu_rows(rounds),
    ]


def _cpu_rows(rounds: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """CPU a record, the ingest processes' and the database server's, with credit and
    without (the median of the rounds): where what credit costs is spent."""
    rows: list[tuple[str, str]] = []
    for kind, label in (("credits", "with credit"), ("none", "none")):
        ingest, server = (
            [x["cpu_us_per_record"][kind][i] for x in rounds if "cpu_us_per_record" in x]
            for i in (0, 1)
        )
        rows.append((
            f"  CPU a record, {label}: ingest / PostgreSQL",
            f"{_median_us(ingest)} / {_median_us(server)} µs",
        ))  # fmt: skip
    return rows


def _median_us(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{statistics.median(known):,.1f}" if known else "-"


def _appends(label: str, figures: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (f"{label}, {n}", _append_rate(figures[key]))
        for n, key in (("1 writer", "1_writer"), ("2 writers", "2_writers"))
    ]


def _append_rate(figures: dict[str, Any]) -> str:
    if figures.get("stalled"):
        return f"stalled after {figures['batches_saved']} batches"
    return _RATE(figures["events_per_s"], "events/s")


def _appends_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    sa, one, ratios = r["store_append"], r["single_append"], r["ratios"]
    small = min(r["batch"], STOCK_MAX_BATCH)
    at_small = sa[f"at_{small}"]
    return [
        *_appends(f"store append, ours, batch {r['batch']}", sa["ours"]),
        ("store append (ours, 1 writer) / COPY", f"{ratios['store_append_vs_copy']:>10}"),
        (f"-- at batch {small} (the stock recorder stalls on larger batches):", ""),
        *_appends("store append, ours", at_small["ours"]),
        *_appends("  ours + LOCK TABLE + NOTIFY", at_small["ours_locking"]),
        *_appends("  eventsourcing stock recorder", at_small["stock"]),
        ("  ours+lock / ours, 1 / 2 writers", _pair(ratios, "ours_locking")),
        ("  stock / ours, 1 / 2 writers", _pair(ratios, "stock")),
        ("append 1 record, lock-free p50/p99", _ms(one["ours_append_ms"])),
        ("append 1 record, stock p50/p99", _ms(one["stock_append_ms"])),
        ("raw single-row INSERT commit p50/p99", _ms(one["raw_insert_commit_ms"])),
    ]


def _pair(ratios: dict[str, float | None], name: str) -> str:
    one, two = (ratios[f"{name}_vs_ours_{w}"] for w in ("1_writer", "2_writers"))
    return f"{one if one is not None else 'stalled':>10} / {two if two is not None else 'stalled'}"


def _ms(lat: dict[str, float]) -> str:
    return f"{lat['p50']} / {lat['p99']} ms"
