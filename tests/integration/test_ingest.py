"""Usage ingest against a real PostgreSQL and a real Kafka-protocol broker."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from kafka import KafkaConsumer, TopicPartition

from adapters.bootstrap import build_ingest_worker, close_worker, open_ledger
from adapters.settings import Settings
from domain.ids import transaction_id
from domain.price_book import PriceSchedule
from domain.transaction import TxnState
from projections.queue_health import read_health
from store.connections import Database
from store.dead_letters import DeadLetterStore, bounded
from store.ledger import BillingLedger
from tests.conftest import settings_env
from tests.fast.fakes import FaultyPrices
from tests.integration.support import (
    count_events,
    drive,
    metered_usage_ids,
    produce,
    produce_records,
    run_worker_until,
    total_lag,
    usage,
    wait_for,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def ledger(ingest_ledger: BillingLedger) -> BillingLedger:
    return ingest_ledger


def _worker_cmd(*extra: str) -> list[str]:
    return [sys.executable, "-m", "adapters.cli", "run", "--role", "ingest", *extra]


def test_the_same_record_produced_twice_yields_one_transaction(
    settings: Settings, ledger: BillingLedger
) -> None:
    record = usage("req-1", quantity=3)
    produce_records(settings, [record, usage("req-2"), record])
    worker = build_ingest_worker(settings, ledger)
    try:
        drive(worker, until=lambda: worker.stats.records == 3)
    finally:
        close_worker(worker)

    assert sorted(metered_usage_ids(settings.database_url)) == ["req-1", "req-2"]
    assert worker.stats.duplicates == 1
    txn = ledger.transaction(transaction_id("acme", "req-1"))
    assert txn.state is TxnState.RESERVED
    assert txn.amount == Decimal("0.3")  # 3 requests x 0.001 USD = 0.3 cents, exact
    assert total_lag(settings) == 0


def test_a_batch_redelivered_after_the_worker_dies_between_db_and_offset_commit_is_recorded_once(
    settings: Settings, ledger: BillingLedger
) -> None:
    records = [usage(f"req-{i}", customer=f"c{i % 5}", quantity=1000 + i) for i in range(120)]
    produce_records(settings, records)

    # A worker process that SIGKILLs itself right after its first database commit,
    # before it commits any offset.
    proc = subprocess.run(
        _worker_cmd("--drill", "kill_after_save"),
        env=settings_env(settings),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    recorded_by_dead_worker = set(metered_usage_ids(settings.database_url))
    assert recorded_by_dead_worker, "the killed worker committed nothing to the database"
    assert total_lag(settings) == len(records)  # no offset was committed

    worker = build_ingest_worker(settings, ledger)
    try:
        drive(
            worker, until=lambda: total_lag(settings) == 0 and worker.stats.records >= len(records)
        )
    finally:
        close_worker(worker)

    ids = metered_usage_ids(settings.database_url)
    assert sorted(ids) == sorted(r.usage_id for r in records)  # each exactly once
    assert worker.stats.duplicates == len(recorded_by_dead_worker)
    assert worker.stats.transactions == len(records) - len(recorded_by_dead_worker)


def test_two_workers_in_one_group_record_every_record_once_across_a_rebalance(
    settings: Settings, ledger: BillingLedger
) -> None:
    settings = settings.model_copy(update={"batch_max_records": 50})
    env = settings_env(settings)
    batches = [[usage(f"r{b}-{i}", customer=f"cust-{i % 9}") for i in range(300)] for b in range(4)]
    first = subprocess.Popen(_worker_cmd(), env=env, stderr=subprocess.DEVNULL)
    second: subprocess.Popen[bytes] | None = None
    try:
        produce_records(settings, batches[0])
        wait_for(lambda: metered_usage_ids(settings.database_url), what="first worker to record")
        second = subprocess.Popen(_worker_cmd(), env=env, stderr=subprocess.DEVNULL)
        produce_records(settings, batches[1])
        wait_for(
            lambda: len(metered_usage_ids(settings.database_url)) >= 450,
            what="recording to continue while the group rebalances",
        )
        first.kill()  # mid-stream: its partitions move to the second worker
        first.wait()
        produce_records(settings, batches[2] + batches[3])
        expected = sorted(r.usage_id for b in batches for r in b)
        wait_for(
            lambda: (
                len(metered_usage_ids(settings.database_url)) == len(expected)
                and total_lag(settings) == 0
            ),
            timeout=120,
            what="every record recorded and committed",
        )
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(10)
    assert sorted(metered_usage_ids(settings.database_url)) == expected


POISON = [
    (b"acme", b'{"usage_id": "x1", '),
    (b"acme", b'[1, 2, 3]'),
    (b"acme", json.dumps({"usage_id": "x3", "customer_id": "acme", "meter": "api.requests",
                          "quantity": -1, "occurred_at": "2026-12-01T00:00:00Z"}).encode()),
    (b"acme", json.dumps({"usage_id": "x4", "customer_id": "acme", "meter": "nope",
                          "quantity": 1, "occurred_at": "2026-12-01T00:00:00Z"}).encode()),
    (b"acme", json.dumps({"usage_id": "x5", "meter": "api.requests",
                          "quantity": 1, "occurred_at": "2026-12-01T00:00:00Z"}).encode()),
    (b"acme", json.dumps({"usage_id": "x6", "customer_id": "acme", "meter": "api.requests",
                          "quantity": 1, "occurred_at": "2026-12-01T00:00:00Z",
                          "currency": "EUR"}).encode()),
    (b"acme", None),
    (b"acme", b"{" + b" " * 20_000 + b"}"),
]  # fmt: skip
POISON_REASONS = [
    "not valid JSON",
    "expected a JSON object, got list",
    "quantity: input should be greater than or equal to 0",
    "unknown meter 'nope'",
    "customer_id: field required",
    "currency 'EUR' does not match meter 'api.requests' priced in USD",
    "empty message (no value)",
    "payload of 20002 bytes exceeds the 16384-byte limit",
]


def test_poison_records_go_to_the_dead_letter_topic_with_reasons_and_good_ones_are_recorded(
    settings: Settings, ledger: BillingLedger
) -> None:
    good = [usage(f"ok-{i}") for i in range(10)]
    messages = [(r.customer_id.encode(), r.to_json()) for r in good]
    mixed = [m for pair in zip(messages, POISON, strict=False) for m in pair] + messages[
        len(POISON) :
    ]
    produce(settings, mixed)

    worker = build_ingest_worker(settings, ledger)
    try:
        drive(worker, until=lambda: worker.stats.records == len(mixed))
    finally:
        close_worker(worker)

    assert sorted(metered_usage_ids(settings.database_url)) == sorted(r.usage_id for r in good)
    stored = DeadLetterStore(Database(settings.database_url)).all()
    by_offset = sorted(stored, key=lambda d: d.offset)
    assert [d.payload for d in by_offset] == [bounded(value).prefix for _, value in POISON]
    assert [(d.payload_size, d.payload_sha256) for d in by_offset] == [
        (b.size, b.sha256) for b in (bounded(value) for _, value in POISON)
    ]
    for letter, expected in zip(by_offset, POISON_REASONS, strict=True):
        assert letter.reason.startswith(expected), (letter.reason, expected)
    assert wait_for(lambda: total_lag(settings) == 0, what="lag to return to zero")

    dlq = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, consumer_timeout_ms=5000)
    dlq.assign([TopicPartition(settings.dlq_topic, 0)])
    dlq.seek_to_beginning()
    letters = [m for m in dlq if m is not None][: len(POISON)]
    dlq.close()
    assert [m.value for m in letters] == [value for _, value in POISON]
    headers = [dict(m.headers) for m in letters]
    assert [h["dlq.reason"].decode() for h in headers] == [d.reason for d in by_offset]
    assert all(h["dlq.source.topic"].decode() == settings.usage_topic for h in headers)
    assert [int(h["dlq.source.offset"]) for h in headers] == [d.offset for d in by_offset]


def test_a_record_whose_pricing_raises_unexpectedly_is_a_dead_letter_and_its_batch_is_recorded(
    settings: Settings, ledger: BillingLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = PriceSchedule.initial(FaultyPrices(ledger.prices.latest.prices.prices))
    ledger.prices = schedule  # raises for meter "faulty.meter", instead of the price book's
    monkeypatch.setattr(ledger, "refresh_prices", lambda: schedule)
    faulty = json.loads(usage("bad").to_json()) | {"meter": "faulty.meter"}
    good = [usage(f"ok-{i}") for i in range(6)]
    messages = [(r.customer_id.encode(), r.to_json()) for r in good]
    messages.insert(3, (b"acme", json.dumps(faulty).encode()))
    produce(settings, messages)

    worker = build_ingest_worker(settings, ledger)
    try:
        drive(worker, until=lambda: worker.stats.records == len(messages))
    finally:
        close_worker(worker)

    assert sorted(metered_usage_ids(settings.database_url)) == sorted(r.usage_id for r in good)
    [letter] = DeadLetterStore(Database(settings.database_url)).all()
    assert (letter.offset, letter.reason) == (3, "internal: RuntimeError")
    assert letter.payload == messages[3][1]
    assert wait_for(lambda: total_lag(settings) == 0, what="the batch to be committed")


def test_a_usage_id_sent_again_with_another_body_is_a_counted_conflict_and_resends_are_silent(
    settings: Settings, ledger: BillingLedger
) -> None:
    first = usage("req-1", quantity=3)
    produce_records(settings, [first, usage("req-2")])
    worker = build_ingest_worker(settings, ledger)
    try:
        drive(worker, until=lambda: worker.stats.records == 2)
        body = json.loads(first.to_json())
        produce(
            settings,
            [
                (b"acme", first.to_json()),  # a producer retry: silent
                (b"acme", json.dumps(body, indent=1).encode()),  # re-encoded: silent
                (b"acme", json.dumps({**body, "quantity": "4"}).encode()),  # changed its mind
                (b"acme", json.dumps({**body, "meter": "gpt-4o.input_tokens"}).encode()),
            ],
        )
        drive(worker, until=lambda: worker.stats.records == 6)
    finally:
        close_worker(worker)

    assert sorted(metered_usage_ids(settings.database_url)) == ["req-1", "req-2"]
    assert ledger.transaction(transaction_id("acme", "req-1")).quantity == 3  # the first stays
    letters = DeadLetterStore(Database(settings.database_url)).all()
    assert sorted(d.code for d in letters) == ["conflicting_duplicate"] * 2
    assert sorted(d.reason.split(" (")[0] for d in letters) == [
        "conflicting duplicate: usage_id 'req-1' of customer 'acme' was recorded with another"
        f" {field}"
        for field in ("meter", "quantity")
    ]
    assert (worker.stats.duplicates, worker.stats.conflicting_duplicates) == (2, 2)
    with psycopg.connect(settings.database_url) as conn:
        health = read_health(conn)
    assert (health["conflicting_duplicates_last_hour"], health["dead_letters_last_hour"]) == (2, 2)
    assert health["dead_letters_total"] == 2


def test_a_spend_limit_refuses_usage_past_it_and_releases_nothing_it_did_not_reserve(
    settings: Settings, ledger: BillingLedger
) -> None:
    ledger.set_spend_limit("acme", "USD", 250)  # 2.50 USD
    # 100,000 requests at 0.001 USD = 100.00 USD: far over; 1,000 requests = 1.00 USD each.
    records = [usage("small-1", quantity=1000), usage("big", quantity=100_000),
               usage("small-2", quantity=1000), usage("small-3", quantity=1000)]  # fmt: skip
    produce_records(settings, records)
    worker = build_ingest_worker(settings, ledger)
    try:
        drive(worker, until=lambda: worker.stats.records == len(records))
    finally:
        close_worker(worker)

    states = {r.usage_id: ledger.transaction(transaction_id("acme", r.usage_id)) for r in records}
    assert states["small-1"].state is TxnState.RESERVED
    assert states["small-2"].state is TxnState.RESERVED
    assert states["big"].state is TxnState.COMPENSATED
    assert "spend limit" in (states["big"].compensation_reason or "")
    assert states["small-3"].state is TxnState.COMPENSATED  # 1.00 + 1.00 + 1.00 > 2.50
    account = ledger.account("acme", "USD")
    assert account is not None
    assert (account.reserved, account.available) == (200, 50)


def test_a_batch_that_keeps_losing_concurrency_races_waits_and_is_saved_not_fatal(
    settings: Settings, ledger: BillingLedger
) -> None:
    """Another writer moves acme's account between each of four loads and saves, with
    one save attempt per batch: the write-behind save loses, then the batch done again
    the ordinary way loses three times: four real version conflicts, three pauses, no
    crash."""
    ledger.max_attempts = 1
    contentions = [4]
    batch_reads = ledger._batch_reads

    def contended_reads(*args: Any) -> Any:
        reads = batch_reads(*args)
        load = reads.account

        def contended_load(customer_id: str, currency: str) -> Any:
            account = load(customer_id, currency)
            if contentions[0]:
                contentions[0] -= 1
                with open_ledger(settings) as other:
                    other.set_spend_limit(customer_id, currency, 1_000_000 + contentions[0])
            return account

        reads.account = contended_load  # type: ignore[method-assign]
        return reads

    ledger._batch_reads = contended_reads  # type: ignore[method-assign]
    records = [usage(f"c-{i}") for i in range(5)]
    produce_records(settings, records)
    worker = build_ingest_worker(settings, ledger)
    run_worker_until(worker, 5, what="the batch")

    assert worker.stats.records == 5 and worker.stats.contended_batches == 3
    assert worker.stats.conflicts == 1  # the save behind
    assert sorted(metered_usage_ids(settings.database_url)) == [r.usage_id for r in records]
    account = ledger.account("acme", "USD")
    assert account is not None and account.spend_limit == 1_000_000  # the rival's last write
    assert total_lag(settings) == 0


def test_events_cannot_be_updated_or_deleted(settings: Settings, ledger: BillingLedger) -> None:
    before = count_events(settings.database_url)  # the price book migrate started
    ledger.set_spend_limit("acme", "USD", 100)
    assert count_events(settings.database_url) == before + 1
    with psycopg.connect(settings.database_url) as conn:
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            conn.execute("DELETE FROM billingledger_events")
        conn.rollback()
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            conn.execute("UPDATE billingledger_events SET state = 'x'")
    assert count_events(settings.database_url) == before + 1
