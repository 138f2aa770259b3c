"""``python -m tools.bench_alerts``: how long from a usage record on the topic to its
spend alert at a webhook receiver.

The embedded default (a private PostgreSQL and the Tansu broker), the roles in worker
processes (``ingest``; ``relay``; ``alerts``), and a receiver on 127.0.0.1
(``tools.loopback``: HTTP/1.1 keep-alive, verifying each signature) in a process of its
own, as a user's endpoint is. One record in ``--alert-every`` (every one
by default) goes round ``ceil(rate * seconds / every / 20)`` alerting customers, 100
minor units each, whose accounts have the 20 thresholds ``spend:100`` to ``spend:2000``,
so each such record crosses one and is one alert; the others go to 100 customers
without thresholds. Accounts, lines and invoices are reused, as with real traffic. Records
are made before the clock starts and produced at ``--rate`` a second for ``--seconds``
(``records``: how many were, fewer where the load generator lagged); a record's time
starts when the broker acknowledged it (its send's callback) and ends when the receiver
has verified its alert. Printed: how many alerts arrived, and the latencies' p50, p90, p99 and max,
whole and by stage. Numbers, no verdict: the machine is shared.

With ``--credits``, every account holds a prepaid credit grant (so every record burns
credit in its save) and the alerting ones have, instead, the 20 thresholds
``balance:2000`` down to ``balance:100`` on a grant of 2,100 minor units: each alerting
record takes the balance down 100 and crosses one. The ``project`` role runs too (in a
process of its own, both lanes: the credit projections in theirs), and a sampler reads
``billing.credit_balances`` every 20 ms: a record's balance time ends when the read
model first shows its customer's balance at or below what that record left (its
``consumed`` grew by 100 a record, in the order the customer's records were produced).
The save that burns the credit writes that row (``store.credit_rows``), so the balance is
shown when its save is: ``committed_to_balance_ms`` is 0 unless that breaks.
Printed from the broker's ack (``produced_to_balance_ms``) and from the moment the
ingest decided the record (``recorded_to_balance_ms``: the crossing's time, taken before
its save), and split in two: the save itself (``recorded_to_committed_ms``: decided to
readable, one batch commit) and the read model behind the committed save
(``committed_to_balance_ms``). A save is readable when the sampler, which also reads the
alerting accounts' newest versions in the event store every 20 ms (in the same snapshot
as the balances), first sees the account's version it wrote.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import queue
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from email.message import Message
from typing import Any
from uuid import UUID

import psycopg

from adapters.alerts import deliveries
from adapters.bootstrap import database, migrate, open_ledger, prepare
from adapters.ingest.producer import UsageProducer
from adapters.observability.logs import configure_logging
from adapters.settings import Settings
from billing_ledger_webhooks import SIGNATURE_HEADER, verify
from domain.account import CustomerAccount
from domain.usage import UsageRecord
from infra.embedded import EmbeddedPostgres, TansuBroker
from tools.bench_charge import _worker
from tools.loopback import serve_posts

__all__ = ["main", "run_alerts"]

ROLE_PROCESSES = (("ingest",), ("relay",), ("alerts",))


class _Receiver:
    """The webhook receiver, in a process of its own (as a user's endpoint is: not
    sharing the load generator's interpreter lock): it verifies each alert and notes
    when it arrived, by usage id; ``arrived`` and ``recorded`` read what it noted."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._notes: multiprocessing.Queue[tuple[str, float, float] | int] = context.Queue()
        self._secret: multiprocessing.Queue[str] = context.Queue()
        self.process = context.Process(
            target=_serve, args=(self._notes, self._secret), name="receiver", daemon=True
        )
        self.process.start()
        port = self._notes.get(timeout=60)
        assert isinstance(port, int)
        self.url = f"http://127.0.0.1:{port}/alerts"
        self._arrived: dict[str, float] = {}
        self._recorded: dict[str, float] = {}  # the crossing's event time (the ingest save)

    def use(self, secret: str) -> None:
        """Verify with ``secret`` (the endpoint's, shown once when it was added)."""
        self._secret.put(secret)

    @property
    def arrived(self) -> dict[str, float]:
        self._drain()
        return self._arrived

    @property
    def recorded(self) -> dict[str, float]:
        self._drain()
        return self._recorded

    def _drain(self) -> None:
        while True:
            try:
                note = self._notes.get_nowait()
            except queue.Empty:
                return
            assert not isinstance(note, int)
            usage_id, arrived, recorded = note
            self._arrived.setdefault(usage_id, arrived)
            self._recorded[usage_id] = recorded

    def close(self) -> None:
        self.process.terminate()
        self.process.join(timeout=10)


def _serve(
    notes: multiprocessing.Queue[tuple[str, float, float] | int],
    secret_queue: multiprocessing.Queue[str],
) -> None:
    secret: list[str] = []
    known = threading.Event()

    def answer(body: bytes, headers: Message[str, str]) -> tuple[int, dict[str, str]]:
        known.wait()  # the endpoint's secret, shown when it was added after this started
        event = verify(body, headers[SIGNATURE_HEADER], secret[0])
        arrived = time.time()
        recorded = datetime.fromisoformat(event["created_at"]).timestamp()
        notes.put((event["usage_id"], arrived, recorded))
        return 204, {}

    server, _ = serve_posts(answer, "/alerts")
    notes.put(int(server.server_address[1]))
    secret.append(secret_queue.get())
    known.set()
    threading.Event().wait()  # serving until terminated


THRESHOLDS = [f"spend:{100 * k}" for k in range(1, 21)]
CREDIT_THRESHOLDS = [f"balance:{100 * k}" for k in range(1, 21)]
CREDIT_GRANT = 2100  # minor units: 21 records of 100, each of the first 20 crossing one
QUIET_GRANT = 10**12  # the quiet customers' credit never runs out


def _record(i: int, customers: int, every: int = 1) -> UsageRecord:
    """Record ``i``: every ``every``-th one goes round the alerting customers (and
    crosses a threshold), the others to 100 customers without thresholds."""
    alerting = i % every == 0
    customer = f"alert-{i // every % customers:06d}" if alerting else f"quiet-{i % 100:03d}"
    return UsageRecord(
        usage_id=f"a-{i}" if alerting else f"q-{i}",
        customer_id=customer,
        meter="api.requests",
        quantity=Decimal(1000),  # 100 minor units: past spend:1
        occurred_at=datetime.now(UTC),
    )


def _accounts(settings: Settings, customers: int, credits: bool = False) -> None:
    """The alerting accounts, each with the 20 thresholds (saved 500 at a time); with
    ``credits``, each with a grant, and the quiet ones with a grant too."""
    since = datetime.now(UTC) - timedelta(days=1)
    with open_ledger(settings) as ledger:
        for start in range(0, customers, 500):
            accounts = []
            for i in range(start, min(start + 500, customers)):
                account = CustomerAccount.open(_record(i, customers).customer_id, "USD")
                account.set_alerts(CREDIT_THRESHOLDS if credits else THRESHOLDS)
                if credits:
                    account.grant_credit("bench", CREDIT_GRANT, effective_at=since,
                                         source="promotional", reason="bench")  # fmt: skip
                accounts.append(account)
            ledger.save(*accounts)
        if credits:
            quiet = [CustomerAccount.open(f"quiet-{i:03d}", "USD") for i in range(100)]
            for account in quiet:
                account.grant_credit("bench", QUIET_GRANT, effective_at=since,
                                     source="promotional", reason="bench")  # fmt: skip
            ledger.save(*quiet)


def _produce(
    settings: Settings, rate: float, seconds: float, customers: int, every: int
) -> tuple[dict[str, float], int]:
    """Records at ``rate`` a second (as far as the loop keeps up); when the broker
    acknowledged each alerting one, and how many records were sent.

    Each alerting record's time is taken in its send's callback, when the producer read
    the broker's answer for it: the record was on the topic by then. (The return of the
    batch's ``flush`` is later, by as much as the loop took to send the batch, and would
    make the latencies look shorter than they are.)"""
    # The records' bytes are made before the clock starts, and sent as they are: the load
    # generator shares the two cores with what it measures, so it must take little CPU.
    records = [_record(i, customers, every) for i in range(int(rate * seconds))]
    load = [
        (r.usage_id if r.usage_id.startswith("a-") else None, r.customer_id.encode(), r.to_json())
        for r in records
    ]
    acked: dict[str, float] = {}
    usage = UsageProducer(settings.kafka_bootstrap, settings.usage_topic, check=False)
    start, i = time.monotonic(), 0
    while (elapsed := time.monotonic() - start) < seconds:
        while i < min(int(elapsed * rate), len(load)):
            alerting, key, value = load[i]
            future = usage.producer.send(usage.topic, key=key, value=value)
            if alerting is not None:
                future.add_callback(_ack, acked, alerting)
            i += 1
        usage.flush()
        time.sleep(0.005)
    usage.close()
    return acked, i


def _ack(acked: dict[str, float], usage_id: str, _metadata: Any) -> None:
    acked[usage_id] = time.time()


@contextmanager
def _stack(concurrency: int) -> Iterator[tuple[Settings, _Receiver]]:
    with ExitStack() as stack:
        pg = stack.enter_context(EmbeddedPostgres())
        broker = stack.enter_context(TansuBroker())
        settings = Settings(
            database_url=pg.url,
            kafka_bootstrap=broker.bootstrap,
            batch_max_records=2000,
            poll_timeout_ms=50,
            alert_webhook_allow_private=True,  # the receiver is on 127.0.0.1
            alert_webhook_concurrency=concurrency,
        )
        migrate(settings)
        prepare(settings)
        receiver = _Receiver()
        stack.callback(receiver.close)
        with database(settings, pool_size=0).connection() as conn:
            _, secret = deliveries.add_endpoint(conn, receiver.url, ["alert.crossed"])
        receiver.use(secret)
        yield settings, receiver


class _Balances:
    """Samples, every 20 ms, the alerting customers' ``consumed`` in
    ``billing.credit_balances`` (when each first reached each value) and their accounts'
    newest version in the event store (when each save that changed one was first
    readable: its commit, to the sample)."""

    def __init__(self, settings: Settings, customers: int) -> None:
        self.settings = settings
        self.accounts = {
            CustomerAccount.create_id(c, "USD"): c
            for c in (f"alert-{k:06d}" for k in range(customers))
        }
        self.reached: dict[str, list[tuple[Decimal, float]]] = {}
        self.versions: dict[UUID, list[tuple[int, float]]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="balances", daemon=True)

    def _run(self) -> None:
        ids = list(self.accounts)
        with database(self.settings, pool_size=0).connection() as conn:
            # Both reads of a sample in one snapshot: a save and the rows it wrote are
            # seen together or not at all, never split by a commit between the reads.
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.autocommit = False
            while not self.stop.wait(0.02):
                with conn.transaction():
                    rows = conn.execute(
                        "SELECT customer_id, consumed FROM billing.credit_balances"
                        " WHERE customer_id LIKE 'alert-%'"
                    ).fetchall()
                    versions = conn.execute(_NEWEST_VERSIONS, (ids,)).fetchall()
                now = time.time()
                for customer, consumed in rows:
                    seen = self.reached.setdefault(customer, [])
                    if not seen or consumed > seen[-1][0]:
                        seen.append((Decimal(consumed), now))
                for account, version in versions:
                    saved = self.versions.setdefault(account, [])
                    if not saved or version > saved[-1][0]:
                        saved.append((version, now))

    def committed_at(self, account: UUID, version: int) -> float | None:
        """When the save that recorded ``version`` of ``account`` was first readable."""
        return next((at for v, at in self.versions.get(account, []) if v >= version), None)

    def shown_at(self, customer: str, consumed: Decimal) -> float | None:
        """When the read model first showed ``customer`` having consumed ``consumed``."""
        return next((at for value, at in self.reached.get(customer, []) if value >= consumed),
                    None)  # fmt: skip


def _balance_latencies(
    acked: dict[str, float],
    balances: _Balances,
    before: dict[str, Decimal],
    customers: int,
    every: int,
) -> dict[str, float]:
    """Each alerting record's moment its balance was first in the read model (its
    customer's ``consumed`` at least what it was before the load plus 100 for each of the
    customer's records up to this one), by usage id."""
    count: dict[str, int] = {}
    out: dict[str, float] = {}
    for usage_id in sorted(acked, key=lambda u: int(u[2:])):
        customer = _record(int(usage_id[2:]), customers, every).customer_id
        count[customer] = count.get(customer, 0) + 1
        shown = balances.shown_at(
            customer, before.get(customer, Decimal(0)) + 100 * count[customer]
        )
        if shown is not None:
            out[usage_id] = shown
    return out


def run_alerts(
    rate: float, seconds: float, concurrency: int, every: int = 1, credits: bool = False
) -> dict[str, Any]:
    """The measurement (see the module docstring)."""
    customers = -(-int(rate * seconds / every + 1) // len(THRESHOLDS))
    with _stack(concurrency) as (settings, receiver), ExitStack() as workers:
        _accounts(settings, customers, credits)
        for roles in ROLE_PROCESSES + ((("project",),) if credits else ()):
            workers.enter_context(_worker(settings, roles))
        # one record through everything first, so the groups' joins are not measured
        warm = UsageProducer(settings.kafka_bootstrap, settings.usage_topic, check=False)
        warm.send(_record(-1, customers))
        warm.close()
        _await(lambda: "a--1" in receiver.arrived, 120)
        balances = _Balances(settings, customers)
        if credits:  # the projector has caught up with the warm-up record
            warmed = _record(-1, customers).customer_id
            none = Decimal(0 if warmed.startswith("alert-") else 100)  # a quiet one: no wait
            _await(lambda: _consumed(settings).get(warmed, none) >= 100, 60)
            before = _consumed(settings)
            balances.thread.start()
        with database(settings, pool_size=0).connection() as conn:
            start = conn.execute(_LAST_EVENT).fetchone()[0]  # type: ignore[index]
        acked, produced = _produce(settings, rate, seconds, customers, every)
        _await(lambda: len(receiver.arrived) > len(acked), 60 + seconds)
        if credits:
            last = _record(max(int(u[2:]) for u in acked), customers, every).customer_id
            _await(lambda: balances.shown_at(last, Decimal(1)) is not None, 30)
            _await(lambda: len(_balance_latencies(acked, balances, before, customers, every))
                   >= len(acked), 30)  # fmt: skip
            balances.stop.set()
            balances.thread.join()
        with database(settings, pool_size=0).connection() as conn:
            stages = conn.execute(_STAGES).fetchall()
            crossings = conn.execute(_CROSSINGS, (start,)).fetchall()
    got = [u for u in acked if u in receiver.arrived]
    shown = _balance_latencies(acked, balances, before, customers, every) if credits else {}
    committed = _commits(balances, crossings)
    return {
        "rate_per_s": rate,
        "seconds": seconds,
        "credits": credits,
        "alerting_customers": customers,
        "records": produced,  # fewer than rate x seconds where the load generator lagged
        "alerting_records": len(acked),
        "alerts_received": len(got),
        "produced_to_received_ms": _percentiles([receiver.arrived[u] - acked[u] for u in got]),
        # the two stages: the ingest save that crossed it; the relay, topic and webhook
        "produced_to_recorded_ms": _percentiles([receiver.recorded[u] - acked[u] for u in got]),
        "recorded_to_received_ms": _percentiles(
            [receiver.arrived[u] - receiver.recorded[u] for u in got]
        ),
        # within the last stage: relay, topic, the role's consumer; then the sending
        "recorded_to_fanned_out_ms": _percentiles([r[0] for r in stages]),
        "fanned_out_to_delivered_ms": _percentiles([r[1] for r in stages]),
        # with credits: the record's balance in billing.credit_balances (the projector's
        # credit lane), from the broker's ack and from the save that crossed it
        **(
            {
                "balances_shown": len(shown),
                "produced_to_balance_ms": _percentiles([t - acked[u] for u, t in shown.items()]),
                "recorded_to_balance_ms": _percentiles(
                    [t - receiver.recorded[u] for u, t in shown.items() if u in receiver.recorded]
                ),
                # the save itself (decided to readable: one batch commit), then the read
                # model behind it (readable to the balance shown)
                "recorded_to_committed_ms": _percentiles(
                    [
                        t - receiver.recorded[u]
                        for u, t in committed.items()
                        if u in receiver.recorded
                    ]
                ),
                "committed_to_balance_ms": _percentiles(
                    [shown[u] - t for u, t in committed.items() if u in shown]
                ),
            }
            if credits
            else {}
        ),
    }


def _consumed(settings: Settings) -> dict[str, Decimal]:
    """The alerting customers' ``consumed`` in the read model now."""
    with database(settings, pool_size=0).connection() as conn:
        rows = conn.execute(
            "SELECT customer_id, consumed FROM billing.credit_balances"
            " WHERE customer_id LIKE 'alert-%'"
        ).fetchall()
    return {customer: Decimal(consumed) for customer, consumed in rows}


# Per delivery: crossing recorded -> delivery row made -> delivered (seconds).
_STAGES = """
SELECT extract(epoch FROM d.created_at - (convert_from(e.state, 'UTF8')::jsonb
               -> 'timestamp' ->> '_data_')::timestamptz)::float8,
       extract(epoch FROM d.delivered_at - d.created_at)::float8
FROM billing.webhook_deliveries d
JOIN billingledger_events e
  ON e.topic = 'domain.account:CustomerAccount.AlertCrossed'
 AND convert_from(e.state, 'UTF8')::jsonb ->> 'alert_id' = d.event_id::text
WHERE d.delivered_at IS NOT NULL
"""


# Each alerting account's newest version (through the primary key, one per account).
_NEWEST_VERSIONS = """
SELECT a.id, e.v FROM unnest(%s::uuid[]) AS a(id) CROSS JOIN LATERAL
  (SELECT originator_version AS v FROM billingledger_events WHERE originator_id = a.id
   ORDER BY originator_version DESC LIMIT 1) AS e
"""
# The account version at which each crossing of the load was recorded (its save's).
_CROSSINGS = """
SELECT convert_from(state, 'UTF8')::jsonb ->> 'usage_id', originator_id, originator_version
FROM billingledger_events
WHERE topic = 'domain.account:CustomerAccount.AlertCrossed' AND notification_id > %s
"""
_LAST_EVENT = "SELECT coalesce(max(notification_id), 0) FROM billingledger_events"


def _commits(balances: _Balances, crossings: list[tuple[str, UUID, int]]) -> dict[str, float]:
    """When each crossing's save was first readable, by usage id."""
    out = {}
    for usage_id, account, version in crossings:
        at = balances.committed_at(account, version)
        if at is not None:
            out[usage_id] = at
    return out


def _percentiles(seconds: list[float]) -> dict[str, float]:
    if not seconds:
        return {}
    ms = sorted(s * 1000 for s in seconds)
    cuts = statistics.quantiles(ms, n=100) if len(ms) > 1 else ms * 99
    return {
        "p50": round(cuts[49], 1),
        "p90": round(cuts[89], 1),
        "p99": round(cuts[98], 1),
        "max": round(ms[-1], 1),
        "min": round(ms[0], 1),
    }


def _await(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_alerts", description=__doc__)
    parser.add_argument("--rate", type=float, default=1000, help="records (alerts) a second")
    parser.add_argument("--seconds", type=float, default=10, help="how long the load runs")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    parser.add_argument(
        "--alert-every", type=int, default=1, help="one record in N crosses a threshold"
    )
    parser.add_argument(
        "--credits",
        action="store_true",
        help="every account holds credit; the alerts are its balance falling (balance:N)",
    )
    args = parser.parse_args(argv)
    configure_logging("ERROR")
    report = run_alerts(args.rate, args.seconds, args.concurrency, args.alert_every, args.credits)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
