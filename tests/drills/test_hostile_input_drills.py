"""Hostile input drills (issue 11): what a hostile producer can put on the usage topic
and on ``billing.events`` cannot stop a running ``billing-ledger run``.

Each drill starts a real worker process against real PostgreSQL and the broker, puts
the inputs that used to crash-loop it between valid ones, and checks that the worker
records or charges every valid one, sets every bad one aside with its reason, moves
its positions past them, and is still running, never having restarted a role.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from adapters.bootstrap import build_relay
from adapters.broker import consumer_lag, make_producer
from adapters.settings import Settings
from domain.transaction import TxnState
from infra.stripe_emulator import StripeEmulator
from store.ledger import BillingLedger
from tests.drills.support import Worker, assert_invariants, reserve
from tests.integration.support import (
    metered_usage_ids,
    produce,
    total_lag,
    usage,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.drill]

# 133 bytes: an unread field whose exponent Decimal refuses (decimal.InvalidOperation).
HUGE_EXPONENT = (
    b'{"usage_id":"u","customer_id":"a","meter":"api.requests","quantity":1,'
    b'"occurred_at":"2026-12-01T00:00:00Z","x":1e9999999999999999999}'
)
# An integer past Python's 4,300-digit limit for int() (ValueError), in the quantity.
HUGE_INTEGER = json.dumps(
    {"usage_id": "v", "customer_id": "acme", "meter": "api.requests",
     "occurred_at": "2026-12-01T00:00:00Z", "quantity": 0}
).encode().replace(b'"quantity": 0', b'"quantity": ' + b"9" * 4301)  # fmt: skip


@pytest.fixture
def worker_log(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "worker.log"


def _dead_letters(url: str, topic: str) -> dict[int, str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT source_offset, reason FROM billing.dead_letters WHERE source_topic = %s",
            (topic,),
        ).fetchall()
    return {int(offset): reason for offset, reason in rows}


def test_records_that_crash_looped_ingest_are_dead_letters_and_the_worker_keeps_recording(
    charge_settings: Settings, ledger: BillingLedger, worker_log: Path
) -> None:
    settings = charge_settings
    good = [usage(f"ok-{i}") for i in range(8)]
    messages = [(r.customer_id.encode(), r.to_json()) for r in good]
    messages.insert(2, (b"acme", HUGE_EXPONENT))
    messages.insert(6, (b"acme", HUGE_INTEGER))
    produce(settings, messages)  # one key: one partition, offsets 0..9 in this order

    worker = Worker(settings, "ingest", worker_log)
    try:
        wait_for(
            lambda: (
                worker.alive()
                and len(metered_usage_ids(settings.database_url)) == len(good)
                and len(_dead_letters(settings.database_url, settings.usage_topic)) == 2
                and total_lag(settings) == 0
            ),
            timeout=90,
            what="the valid records recorded, the two others dead letters, offsets committed",
        )
        produce(settings, [(b"acme", usage("after").to_json())])  # still consuming
        wait_for(
            lambda: worker.alive() and "after" in metered_usage_ids(settings.database_url),
            what="a record produced afterwards to be recorded",
        )
        assert worker.alive()
    finally:
        code = worker.stop()
    assert code == 0, worker.stderr()[-3000:]
    assert sorted(metered_usage_ids(settings.database_url)) == sorted(
        [r.usage_id for r in good] + ["after"]
    )
    assert _dead_letters(settings.database_url, settings.usage_topic) == {
        2: "number out of range: exponent 9999999999999999999 is beyond +/-1000",
        6: "number too long: a JSON number of 4301 characters (at most 100)",
    }
    quarantined = worker.lines("usage record quarantined")
    assert sorted(q["error_code"] for q in quarantined) == [
        "number_out_of_range",
        "number_too_long",
    ]
    assert worker.lines("role failed, restarting") == []


# Each stopped the charge role (and every other role of the process) on every start.
HOSTILE_EVENTS: list[bytes | None] = [
    b"[]",
    b"not json",
    b'{"notification_id": 1, "originator_version": 2, "topic": "t", "event": "e"}',
    b'{"notification_id": 1, "originator_id": "xyz", "originator_version": 2,'
    b' "topic": "domain.transaction:BillingTransaction.Reserved", "event": "Reserved"}',
    b'{"notification_id": "1", "originator_id": "285ad872-9dad-5d87-9f2b-3fbdc040090b",'
    b' "originator_version": 2, "topic": "domain.transaction:BillingTransaction.Reserved",'
    b' "event": "Reserved"}',
    b'{"notification_id": 1, "originator_id": "285ad872-9dad-5d87-9f2b-3fbdc040090b",'
    b' "originator_version": 2, "topic": "domain.evil:Evil.Happened", "event": "Happened"}',
    b"\x00\x01\xfe\xff binary garbage \x80",
    None,
]


def _relay_all(settings: Settings) -> int:
    relay = build_relay(settings)
    try:
        while relay.pump():
            pass
    finally:
        relay.close()
        relay.producer.close()
    return relay.published


def _produce_events(settings: Settings, values: list[bytes | None]) -> None:
    producer = make_producer(settings.kafka_bootstrap)
    for value in values:
        producer.send(settings.events_topic, key=b"acme", value=value)  # acme's partition
    producer.flush()
    producer.close()


def _charge_lag(settings: Settings) -> dict[int, int]:
    """The charge group's uncommitted messages per partition of ``billing.events``."""
    return consumer_lag(settings.kafka_bootstrap, settings.charge_group, settings.events_topic)


def test_malformed_billing_events_are_set_aside_and_the_charge_worker_keeps_charging(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator, worker_log: Path
) -> None:
    settings = charge_settings
    first = reserve(ledger, 3)
    _relay_all(settings)
    _produce_events(settings, HOSTILE_EVENTS[:4])
    second = reserve(ledger, 6)  # d-3..d-5 (d-0..d-2 are recorded already)
    _relay_all(settings)
    _produce_events(settings, HOSTILE_EVENTS[4:])
    ids = first + second

    worker = Worker(settings, "charge", worker_log)
    try:
        wait_for(
            lambda: (
                worker.alive()
                and all(ledger.transaction(t).state is TxnState.CHARGED for t in ids)
                and len(_dead_letters(settings.database_url, settings.events_topic))
                == len(HOSTILE_EVENTS)
                and sum(_charge_lag(settings).values()) == 0
            ),
            timeout=90,
            what="every valid record charged, every malformed message set aside, offsets committed",
        )
        assert worker.alive()
    finally:
        code = worker.stop()
    assert code == 0, worker.stderr()[-3000:]
    assert_invariants(ledger, emulator, ids, settings)

    set_aside = worker.lines("billing event set aside")
    assert len(set_aside) == len(HOSTILE_EVENTS)  # each read once: the position moved on
    codes = sorted(line["error_code"] for line in set_aside)
    assert codes == sorted(
        ["not_object", "not_json", "invalid", "invalid", "invalid", "unknown_event",
         "not_json", "empty"]
    )  # fmt: skip
    assert all(isinstance(line["offset"], int) for line in set_aside)
    assert len({line["partition"] for line in set_aside}) == 1  # acme's
    assert worker.lines("role failed, restarting") == []
