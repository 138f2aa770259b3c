"""Restart drill: a worker started and SIGKILLed in a loop beside two that write under load.

The fault (issue 11, item 4): every process used to run the schema's DDL at start, and
``ALTER TABLE ... ADD COLUMN IF NOT EXISTS`` takes an ACCESS EXCLUSIVE lock on the
events table even when the column exists; a starting worker waited for it behind the
running workers' inserts, stopped every write meanwhile, and deadlocked with them
("deadlock detected ... AccessExclusiveLock on relation billingledger_events"). Now
``migrate`` runs the DDL once and a starting worker only reads the schema version.

Against real PostgreSQL, the broker and the Stripe emulator: two ``billing-ledger run``
processes (every role), started together, run for the whole drill while usage is
produced continuously (``BILLING_LEDGER_DRILL_RATE`` records/s, default 120, for many
customers, one in 50 malformed); a third ``run`` is started, awaited until it beats,
and SIGKILLed at a random moment of its work, again and again for
``BILLING_LEDGER_DRILL_S`` seconds (default 30). Then: no start failed (every third
process ended by our SIGKILL, the two stayed up and stop cleanly), nothing lost (I1, I6:
every record is a transaction or a dead letter, once), nothing double-billed (I3, I4:
``assert_invariants``).

Stripe is hostile too (the read-back): one in ``LATE_SHARE`` requests that set amounts
(an item's update, a draft's bulk update of its lines) is
left unanswered and applied by the emulator a second later, after its client gave
up and often after a newer push of the same line; invoice periods are
``PERIOD_S`` seconds and close a second after they end, with usage dated now. At the
end every invoice is finalized and, for each, the total Stripe finalized (read
through the SDK) equals the ledger's expected total and the sum of its lines, with no
mismatch and nothing waiting for an operator (I10); drift found and repaired on the way
is printed.

On the code before migrations it fails: the two steady workers starting together
die on "tuple concurrently updated" (two processes replacing the same function), and
with them started one after the other, two to four of six restarts at 100-150
records/s died on "deadlock detected ... AccessExclusiveLock".
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from uuid import UUID

import psycopg
import pytest
import stripe
from psycopg import sql

from adapters.bootstrap import migrate, open_ledger
from adapters.broker import ensure_topics, make_producer
from adapters.settings import Settings
from domain.ids import transaction_id
from domain.invoice_states import InvoiceState
from infra.stripe_emulator import StripeEmulator
from store.ledger import BillingLedger
from store.schema import EVENTS_TABLE
from tests.conftest import settings_env
from tests.drills.support import assert_invariants
from tests.integration.support import metered_usage_ids, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.drill]

DRILL_S = float(os.environ.get("BILLING_LEDGER_DRILL_S", "30"))
RATE_PER_S = int(os.environ.get("BILLING_LEDGER_DRILL_RATE", "120"))  # records/s, 1 in 50 bad
CUSTOMERS = 25
PERIOD_S = 15
LATE_SHARE = 0.1  # of amount updates (items', drafts' lines), applied a second late


@dataclass
class Worker:
    """A ``billing-ledger run --role all`` process, its stderr kept in a file."""

    proc: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, settings: Settings, log: Path) -> Worker:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "adapters.cli", "run", "--role", "all"],
                env=settings_env(settings),
                stdout=subprocess.DEVNULL,
                stderr=out,
            )
        return cls(proc, log)

    def started_or_ended(self, url: str) -> bool:
        """Its heartbeat row is there (it passed its start and runs its roles), or it exited."""
        if self.proc.poll() is not None:
            return True
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT 1 FROM billing.workers WHERE pid = %s", (self.proc.pid,)
            ).fetchone()
        return row is not None

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@dataclass
class Produced:
    valid: list[str] = field(default_factory=list)  # usage ids, all for distinct records
    customers: dict[str, str] = field(default_factory=dict)  # usage id -> customer
    malformed: int = 0


def _produce(settings: Settings, stop: threading.Event, produced: Produced) -> None:
    producer = make_producer(settings.kafka_bootstrap)
    n = 0
    try:
        while not stop.is_set():
            for _ in range(RATE_PER_S // 10):
                n += 1
                customer = f"cust-{n % CUSTOMERS}"
                if n % 50 == 0:
                    producer.send(settings.usage_topic, key=customer.encode(), value=b'{"usage_id"')
                    produced.malformed += 1
                    continue
                usage_id = f"u-{n}"
                record = {
                    "usage_id": usage_id,
                    "customer_id": customer,
                    "meter": "api.requests",
                    "quantity": 1000 + n % 7,
                    "occurred_at": datetime.now(UTC).isoformat(),
                }
                producer.send(
                    settings.usage_topic, key=customer.encode(), value=json.dumps(record).encode()
                )
                produced.valid.append(usage_id)
                produced.customers[usage_id] = customer
            producer.flush()
            stop.wait(0.1)  # the pace of the load, not a synchronisation
    finally:
        producer.flush()
        producer.close()


def _counts(url: str, topic: str) -> tuple[int, int]:
    """(finished transactions in the read model, dead letters of the usage topic)."""
    with psycopg.connect(url) as conn:
        finished = conn.execute(
            "SELECT count(*) FROM billing.transactions WHERE state IN ('charged', 'compensated')"
        ).fetchone()
        letters = conn.execute(
            "SELECT count(*) FROM billing.dead_letters WHERE source_topic = %s", (topic,)
        ).fetchone()
    return (int(finished[0]) if finished else -1, int(letters[0]) if letters else -1)


@pytest.fixture
def drill_settings(charge_settings: Settings) -> Settings:
    return charge_settings.model_copy(
        update={
            "stripe_rate_per_s": 1000,  # Stripe's pressure is not this drill's fault
            "stripe_max_concurrency": 16,
            "heartbeat_interval_s": 1.0,
            "reconcile_interval_s": 0.5,
            "stale_after_s": 2.0,
            "billing_period": str(PERIOD_S),
            "invoice_grace_s": 1.0,
        }
    )


@pytest.fixture
def steady(drill_settings: Settings, tmp_path: Path) -> Iterator[list[Worker]]:
    migrate(drill_settings)
    ensure_topics(
        drill_settings.kafka_bootstrap,
        [
            (drill_settings.usage_topic, drill_settings.usage_partitions),
            (drill_settings.dlq_topic, 1),
            (drill_settings.events_topic, drill_settings.events_partitions),
        ],
    )
    workers = [Worker.start(drill_settings, tmp_path / f"steady-{i}.log") for i in range(2)]
    yield workers
    for w in workers:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()


def test_workers_started_and_killed_in_a_loop_beside_two_writers_never_fail_to_start_and_lose_or_double_bill_nothing(  # noqa: E501
    drill_settings: Settings,
    steady: list[Worker],
    emulator: StripeEmulator,
    tmp_path: Path,
) -> None:
    settings, url = drill_settings, drill_settings.database_url
    for w in steady:
        wait_for(partial(w.started_or_ended, url), what="a steady worker to start")
        assert w.proc.poll() is None, w.tail()

    emulator.set_faults(late_execute_probability=LATE_SHARE, late_execute_s=1.0, seed=3)
    stop = threading.Event()
    produced = Produced()
    producer = threading.Thread(target=_produce, args=(settings, stop, produced))
    producer.start()
    rng = random.Random(11)
    starts, failed = 0, []
    try:
        end = time.monotonic() + DRILL_S
        while time.monotonic() < end:
            starts += 1
            third = Worker.start(settings, tmp_path / f"third-{starts}.log")
            wait_for(partial(third.started_or_ended, url), timeout=120, what="the third to start")
            if third.proc.poll() is None:
                time.sleep(rng.uniform(0.0, 1.5))  # the fault's moment: some work, then kill
                third.proc.kill()
            code = third.proc.wait()
            if code != -signal.SIGKILL:
                failed.append(f"start {starts} exited with {code}: {third.tail()}")
            assert all(w.proc.poll() is None for w in steady), [w.tail() for w in steady]
    finally:
        stop.set()
        producer.join(30)

    assert failed == [], "\n\n".join(failed)
    valid = set(produced.valid)
    wait_for(
        lambda: set(metered_usage_ids(url)) >= valid,
        timeout=180,
        what="every valid record to be recorded",
    )
    wait_for(
        lambda: _counts(url, settings.usage_topic) == (len(valid), produced.malformed),
        timeout=180,
        what="every transaction terminal and every malformed record dead-lettered",
    )
    wait_for(
        lambda: _all_finalized(url),
        timeout=180,
        what="every invoice finalized (its period over, its draft read back)",
    )
    for w in steady:
        assert w.proc.poll() is None, w.tail()
        w.proc.send_signal(signal.SIGTERM)
    assert [w.proc.wait(60) for w in steady] == [0, 0], [w.tail() for w in steady]

    metered = metered_usage_ids(url)
    assert sorted(metered) == sorted(valid)  # each record once (I1), none lost (I6)
    ids: list[UUID] = [transaction_id(produced.customers[u], u) for u in produced.valid]
    with open_ledger(settings) as ledger:
        states = assert_invariants(ledger, emulator, ids, settings)  # I3, I4
        invoices, repaired = _stripe_equals_the_ledger(url, ledger, emulator)  # I10
    assert states == {"charged": len(ids)}
    late = sum(r["outcome"] == "executed_late" for r in emulator.requests())
    claims, fenced = _claims(url)
    # Every charge consumer claimed what it was given: the two steady ones at least once
    # each, and every rebalance a start caused claimed its partitions again.
    assert claims >= 2 and fenced >= 1, (claims, fenced)
    print(
        f"restart drill: {starts} starts killed, {len(ids)} charged, {produced.malformed} dead;"
        f" {invoices} invoices finalized equal to the ledger, {late} amount updates applied"
        f" late, {repaired} drift(s) repaired before finalizing; {claims} partition claims,"
        f" {fenced} line pushes taken over under a newer claim"
    )


def _claims(url: str) -> tuple[int, int]:
    """Partition claims recorded, and claims recorded on line pushes."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT count(*) FILTER (WHERE topic LIKE '%%:PartitionClaim.Claimed'),"
                " count(*) FILTER (WHERE topic LIKE '%%:LinePush.OwnerClaimed') FROM {}"
            ).format(sql.Identifier(EVENTS_TABLE))
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _all_finalized(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE state NOT IN ('finalized', 'nothing_due')),"
            " count(*) FROM billing.invoices"
        ).fetchone()
    return row is not None and row[0] == 0 and row[1] > 0


def _stripe_equals_the_ledger(
    url: str, ledger: BillingLedger, emulator: StripeEmulator
) -> tuple[int, int]:
    """Every finalized invoice's total, read through the SDK, is the ledger's expected
    total and the sum of its lines; none differs or waits for an operator."""
    sdk = stripe.StripeClient("sk_test_drill", base_addresses={"api": emulator.url})
    finalized = repaired = 0
    with psycopg.connect(url) as conn:
        ids = [r[0] for r in conn.execute("SELECT invoice_id FROM billing.invoices").fetchall()]
    for invoice in ledger.invoices_by_id(ids).values():
        if invoice.state is not InvoiceState.FINALIZED:
            assert invoice.state is InvoiceState.NOTHING_DUE, invoice.state
            continue
        finalized += 1
        assert invoice.stripe_invoice_id is not None
        total = sdk.v1.invoices.retrieve(invoice.stripe_invoice_id).total
        lines = sum(ledger.line_by_id(line).billed for line in invoice.lines)
        assert total == invoice.total == invoice.expected_total == lines, invoice.id
        assert (invoice.mismatch, invoice.attention) == (None, None), invoice.id
        repaired += invoice.repairs
    return finalized, repaired
