"""The alerts relay (``adapters.alerts.relay``) on a real PostgreSQL and broker: the log's
alert crossings, and only they, to the alerts topic in commit order, on a position of its
own, whatever the relay of ``billing.events`` is doing; a row it cannot read is skipped
with its reason; a lost connection resumes from the stored position; migration 17 starts
the position where the events relay stood."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kafka import KafkaConsumer
from kafka.errors import KafkaTimeoutError
from kafka.future import Future
from psycopg import sql

from adapters.alerts.messages import ALERT_EVENT_TOPIC
from adapters.alerts.relay import POSITION_NAME, AlertRelay
from adapters.bootstrap import build_alert_relay
from adapters.broker import PublishFailed
from adapters.settings import Settings
from store.connections import Database
from store.ledger import BillingLedger
from store.schema import EVENTS_TABLE
from tests.integration.support import ingest_until, produce_records, stored_states, usage

pytestmark = pytest.mark.integration


@pytest.fixture
def crossed(settings: Settings, ingest_ledger: BillingLedger) -> list[dict[str, Any]]:
    """acme, alerts at a period spend of 300, 500, 800 and 1,100 minor units: ten records of
    100 cross the first three, among the ingest's other events."""
    ingest_ledger.set_alerts("acme", "USD", ["spend:300", "spend:500", "spend:800", "spend:1100"])
    produce_records(settings, [usage(f"u-{i}") for i in range(10)])
    ingest_until(settings, ingest_ledger, 10)
    crossings = stored_states(settings.database_url, ALERT_EVENT_TOPIC)
    assert len(crossings) == 3
    return crossings


def _published(settings: Settings) -> list[tuple[bytes | None, dict[str, Any], dict[str, bytes]]]:
    consumer = KafkaConsumer(
        settings.alerts_topic,
        bootstrap_servers=settings.kafka_bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=3000,
    )
    try:
        return [(m.key, json.loads(m.value), dict(m.headers)) for m in consumer]
    finally:
        consumer.close()


def _positions(settings: Settings) -> dict[str, tuple[int, int]]:
    with psycopg.connect(settings.database_url) as conn:
        rows = conn.execute(
            "SELECT name, xid::text::bigint, notification_id FROM billing.relay_position"
        ).fetchall()
    return {name: (xid, nid) for name, xid, nid in rows}


def _last_event(settings: Settings) -> tuple[int, int]:
    with psycopg.connect(settings.database_url) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT xid::text::bigint, notification_id FROM {}"
                " ORDER BY xid DESC, notification_id DESC LIMIT 1"
            ).format(sql.Identifier(EVENTS_TABLE))
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_only_the_crossings_are_published_in_commit_order_with_no_event_relayed(
    settings: Settings, crossed: list[dict[str, Any]]
) -> None:
    relay = build_alert_relay(settings)
    try:
        assert relay.pump() == 3
        assert relay.pump() == 0  # nothing new: nothing again
    finally:
        relay.close()
        relay.producer.close()
    published = _published(settings)
    assert [body["usage_id"] for _, body, _ in published] == [c["usage_id"] for c in crossed]
    assert [body["id"] for _, body, _ in published] == [c["alert_id"] for c in crossed]
    assert {key for key, _, _ in published} == {b"acme"}
    assert [h["event_id"].decode() for _, _, h in published] == [c["alert_id"] for c in crossed]
    assert {h["event"] for _, _, h in published} == {b"alert.crossed"}
    # The events relay never ran (billing.events is every event behind): the alerts
    # waited for none of them, and the alerts position is past every row of the log.
    assert _positions(settings) == {POSITION_NAME: _last_event(settings)}
    assert relay.published == 3


def test_a_new_relay_resumes_from_the_stored_position_and_publishes_only_what_is_new(
    settings: Settings, ingest_ledger: BillingLedger, crossed: list[dict[str, Any]]
) -> None:
    first = build_alert_relay(settings)
    try:
        assert first.pump() == 3
    finally:
        first.close()
        first.producer.close()
    produce_records(settings, [usage("u-10"), usage("u-11")])
    ingest_until(settings, ingest_ledger, 2)  # this worker's
    again = build_alert_relay(settings)  # as after a restart
    try:
        assert again.pump() == 1
    finally:
        again.close()
        again.producer.close()
    assert [body["usage_id"] for _, body, _ in _published(settings)] == [
        *(c["usage_id"] for c in crossed),
        "u-10",
    ]


def test_a_crossing_it_cannot_read_is_skipped_with_its_reason_and_the_rest_published(
    settings: Settings,
    ingest_ledger: BillingLedger,
    crossed: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with psycopg.connect(settings.database_url) as conn:  # a hand's row, not a crossing
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (originator_id, originator_version, topic, state)"
                " VALUES (gen_random_uuid(), 1, %s, %s)"
            ).format(sql.Identifier(EVENTS_TABLE)),
            (ALERT_EVENT_TOPIC, b"not json"),
        )
    produce_records(settings, [usage("u-10")])  # and a crossing after it
    ingest_until(settings, ingest_ledger, 1)
    relay = build_alert_relay(settings)
    try:
        with caplog.at_level(logging.WARNING, logger="adapters.alerts.relay"):
            assert relay.pump() == 5
    finally:
        relay.close()
        relay.producer.close()
    assert [body["usage_id"] for _, body, _ in _published(settings)] == [
        *(c["usage_id"] for c in crossed),
        "u-10",
    ]
    assert relay.unreadable == 1 and relay.published == 4
    assert "unreadable, not published" in caplog.text


def test_a_lost_connection_resumes_from_the_stored_position_losing_no_crossing(
    settings: Settings, ingest_ledger: BillingLedger, crossed: list[dict[str, Any]]
) -> None:
    relay: AlertRelay = build_alert_relay(settings)
    try:
        assert relay.pump() == 3
        assert relay._conn is not None
        pid = relay._conn.info.backend_pid
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        produce_records(settings, [usage("u-10"), usage("u-11")])
        ingest_until(settings, ingest_ledger, 2)  # this worker's
        with pytest.raises(psycopg.OperationalError):
            relay.pump()  # the loop (store.eventlog.follow) waits and pumps again
        assert relay.pump() == 1
    finally:
        relay.close()
        relay.producer.close()
    assert [body["usage_id"] for _, body, _ in _published(settings)][-1] == "u-10"
    assert len(_published(settings)) == 4


def test_migration_17_starts_the_alerts_position_where_the_events_relay_stood(
    settings: Settings, ingest_ledger: BillingLedger
) -> None:
    migration = Path("store/migrations/0017_alerts_relay_position.sql").read_text()
    with psycopg.connect(settings.database_url) as conn:
        conn.execute("DELETE FROM billing.relay_position")
        conn.execute(  # as a relay of the build before leaves it
            "INSERT INTO billing.relay_position VALUES ('billing.events', '812'::xid8, 4711)"
        )
        conn.execute(migration)
        conn.execute(migration)  # a second run changes nothing
        conn.execute(
            "UPDATE billing.relay_position SET notification_id = 5000 WHERE name = 'billing.events'"
        )
        conn.execute(migration)
    assert _positions(settings) == {"billing.events": (812, 5000), POSITION_NAME: (812, 4711)}


class _Refusing:
    """A producer whose broker acknowledges nothing (as after delivery_timeout_ms)."""

    def __init__(self) -> None:
        self.flushes = 0

    def send(self, *args: Any, **kwargs: Any) -> Future:
        return Future().failure(KafkaTimeoutError("expired after 120000 ms"))

    def flush(self) -> None:
        self.flushes += 1


def test_crossings_the_broker_did_not_acknowledge_store_no_position_and_go_out_again(
    settings: Settings, crossed: list[dict[str, Any]]
) -> None:
    refused = AlertRelay(
        Database(settings.database_url, pool_size=0), _Refusing(), settings.alerts_topic
    )  # type: ignore[arg-type]
    try:
        with pytest.raises(PublishFailed, match="3 of 3 messages not acknowledged"):
            refused.pump()
    finally:
        refused.close()
    assert POSITION_NAME not in _positions(settings)
    relay = build_alert_relay(settings)  # the role restarted
    try:
        assert relay.pump() == 3
    finally:
        relay.close()
        relay.producer.close()
    assert [body["usage_id"] for _, body, _ in _published(settings)] == [
        c["usage_id"] for c in crossed
    ]
