"""Spend alerts end to end on a real PostgreSQL and broker: each crossing recorded once in
the ingest save, published to the alerts topic by the relay, and delivered signed to real
HTTP receivers (``http.server`` in threads), beside dead, hanging and redirecting ones."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from email.message import Message
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest

from adapters.alerts import deliveries
from adapters.alerts.messages import ALERT_EVENT_TOPIC, Alert
from adapters.alerts.worker import AlertWebhooks
from adapters.cli.main import main
from adapters.roles import run_roles
from adapters.settings import Settings
from billing_ledger_webhooks import EVENT_ID_HEADER, SIGNATURE_HEADER, SignatureError, verify
from store.connections import Database
from store.ledger import BillingLedger
from tests.conftest import settings_env
from tests.integration.support import (
    ingest_until,
    produce_records,
    run_cli,
    stored_states,
    usage,
    wait_for,
)
from tools.loopback import serve_posts

pytestmark = pytest.mark.integration

THRESHOLDS = ["percent_of_limit:50", "percent_of_limit:80", "spend:300"]


class Receiver:
    """An HTTP endpoint on 127.0.0.1 that answers as ``mode`` says: ok (verifying each
    signature), fail (500), hang (until released), redirect (302)."""

    def __init__(self, mode: str, secret: str = "") -> None:
        self.mode, self.secret = mode, secret
        self.verified: list[dict[str, Any]] = []  # events whose signature checked out
        self.event_ids: list[str] = []  # the event id header of every request
        self.refused = 0
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.server, self.url = serve_posts(self._post, "/hooks")

    def _post(self, body: bytes, headers: Message[str, str]) -> tuple[int, dict[str, str]]:
        with self.lock:
            self.event_ids.append(headers[EVENT_ID_HEADER])
        status = self.answer(body, headers[SIGNATURE_HEADER])
        moved = {"Location": "http://169.254.169.254/latest/meta-data"} if status == 302 else {}
        return status, moved

    def answer(self, body: bytes, signature: str) -> int:
        if self.mode == "hang":
            self.release.wait(60)
            return 200
        if self.mode == "fail":
            return 500
        if self.mode == "redirect":
            return 302
        try:  # what a receiver does (docs/operate/receiving-webhooks.md)
            event = verify(body, signature, self.secret)
        except SignatureError:
            with self.lock:
                self.refused += 1
            return 400
        with self.lock:
            self.verified.append(event)
        return 200

    def distinct(self) -> set[str]:
        with self.lock:
            return {e["id"] for e in self.verified}

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(mode: str, secret: str = "") -> Receiver:
        made.append(Receiver(mode, secret))
        return made[-1]

    yield make
    for r in made:
        r.close()


@pytest.fixture
def alert_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "alert_webhook_allow_private": True,  # the receivers are on 127.0.0.1
            "alert_webhook_retry_base_s": 0.05,
            "alert_webhook_retry_max_delay_s": 0.2,
            "alert_webhook_concurrency": 1,
        }
    )


def _cli(settings: Settings, *args: str) -> str:
    done = run_cli(settings, *args, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _crossings(url: str) -> list[dict[str, Any]]:
    return stored_states(url, ALERT_EVENT_TOPIC)


_ingest = ingest_until


def _delivery_rows(db: Database, endpoint: UUID) -> list[deliveries.Delivery]:
    with db.connection() as conn:
        return deliveries.deliveries(conn, endpoint=endpoint)


@pytest.fixture
def acme(alert_settings: Settings, ingest_ledger: BillingLedger) -> BillingLedger:
    """acme, limit 1,000 minor units, alerts at 50%, 80% and a period spend of 300, set
    by the command line."""
    ingest_ledger.set_spend_limit("acme", "USD", 1000)
    out = _cli(
        alert_settings, "alerts", "set", "--customer", "acme", "--currency", "USD",
        "--percent-of-limit", "50,80", "--spend", "300",
    )  # fmt: skip
    assert "percent_of_limit:50, percent_of_limit:80, spend:300" in out
    return ingest_ledger


def test_each_threshold_crosses_once_per_period_under_redelivery(
    alert_settings: Settings, acme: BillingLedger
) -> None:
    # ten records of 100 minor units each (1000 requests at 0.001 USD), produced twice
    records = [usage(f"u-{i}") for i in range(10)]
    produce_records(alert_settings, records + records)
    _ingest(alert_settings, acme, 20)
    # every record again, read by a second group from the start: a full redelivery
    _ingest(alert_settings.model_copy(update={"ingest_group": f"again-{uuid4().hex}"}), acme, 20)
    crossed = _crossings(alert_settings.database_url)
    assert [(c["threshold"], c["usage_id"], c["value"]) for c in crossed] == [
        ("spend:300", "u-2", "300"),
        ("percent_of_limit:50", "u-4", "500"),
        ("percent_of_limit:80", "u-7", "800"),
    ]
    assert {c["period"] for c in crossed} == {"2026-12-01T00:00:00Z"}
    listed = json.loads(_cli(alert_settings, "alerts", "list", "--customer", "acme",
                             "--currency", "USD", "--json"))  # fmt: skip
    assert [t["crossed_this_period"] for t in listed["thresholds"]] == [True, True, True]
    assert listed["period_spend"] == "1000"


def test_alerts_reach_a_live_endpoint_signed_once_each_beside_dead_and_hanging_ones(
    alert_settings: Settings, acme: BillingLedger, receivers: Callable[..., Receiver]
) -> None:
    settings = alert_settings.model_copy(update={"alert_webhook_timeout_s": 20.0})
    dead, hanging = receivers("fail"), receivers("hang")
    live = receivers("ok")
    added = _cli(settings, "webhooks", "add", live.url, "--events", "alert.crossed")
    live.secret = re.findall(r"whsec_\S+", added)[0]  # shown once, at registration
    live_id = UUID(re.findall(r"endpoint (\S+) added", added)[0])
    db = Database(settings.database_url, pool_size=0)
    with db.connection() as conn:
        dead_id, _ = deliveries.add_endpoint(conn, dead.url, ["alert.crossed"])
        deliveries.add_endpoint(conn, hanging.url, ["alert.crossed"])

    produce_records(settings, [usage(f"u-{i}") for i in range(10)])
    _ingest(settings, acme, 10)
    expected = {c["alert_id"] for c in _crossings(settings.database_url)}
    assert len(expected) == 3
    # The relay and the alerts role as `billing-ledger run --role relay --role alerts`.
    stop = threading.Event()
    running = threading.Thread(
        target=run_roles, args=(settings, acme, ["relay", "alerts"], stop), daemon=True
    )
    running.start()
    try:
        # The live endpoint has every alert, while the hanging one still holds its first
        # request (its lane is busy for 20 s more): nobody waited for it.
        wait_for(lambda: live.distinct() == expected, timeout=30, what="the live alerts")
        assert hanging.event_ids and not hanging.release.is_set()
        assert live.refused == 0
        assert sorted(live.event_ids) == sorted(expected)  # each sent once: no needless resend
        assert {e["customer_id"] for e in live.verified} == {"acme"}
        wait_for(  # the outcomes are written by the dispatcher's next round
            lambda: (
                [(r.status, r.attempts) for r in _delivery_rows(db, live_id)]
                == [("delivered", 1)] * 3
            ),
            what="the live deliveries recorded",
        )
        # The dead endpoint's failures are retried with backoff, and recorded.
        wait_for(
            lambda: all(r.attempts >= 3 for r in _delivery_rows(db, dead_id)),
            what="three attempts of each dead delivery",
        )
        for row in _delivery_rows(db, dead_id):
            assert (row.status, row.last_status) == ("pending", 500)
            assert row.last_error is not None and "HTTP 500" in row.last_error
        assert set(dead.event_ids) == expected  # the same event ids each time
    finally:
        stop.set()
        hanging.release.set()
        running.join(timeout=30)
    assert not running.is_alive()


def _alert(customer: str = "acme") -> Alert:
    ident = str(uuid4())
    body = json.dumps({"id": ident, "type": "alert.crossed", "customer_id": customer})
    return Alert(ident, "alert.crossed", customer, body.encode())


def _run(worker: AlertWebhooks) -> Callable[[], None]:
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()

    def halt() -> None:
        stop.set()
        thread.join(timeout=30)

    return halt


def test_timeouts_redirects_and_private_addresses_are_failures_recorded(
    alert_settings: Settings, ingest_ledger: BillingLedger, receivers: Callable[..., Receiver]
) -> None:
    hanging, moved, local = receivers("hang"), receivers("redirect"), receivers("ok")
    db = Database(alert_settings.database_url, pool_size=0)
    with db.connection() as conn:
        hang_id, _ = deliveries.add_endpoint(conn, hanging.url, ["alert.crossed"])
        moved_id, _ = deliveries.add_endpoint(conn, moved.url, ["alert.crossed"])
        deliveries.fan_out(conn, [_alert()])
    slow = alert_settings.alert_delivery_policy()
    policy = type(slow)(timeout_s=0.5, concurrency=1, retry=slow.retry, allow_private=True)
    halt = _run(AlertWebhooks(db, None, policy))
    try:
        wait_for(lambda: _delivery_rows(db, hang_id)[0].attempts >= 1, what="a timeout")
        wait_for(lambda: _delivery_rows(db, moved_id)[0].attempts >= 1, what="a redirect")
    finally:
        halt()
    (hung,) = _delivery_rows(db, hang_id)
    assert (hung.status, hung.last_status, hung.last_error) == (
        "pending", None, "timed out after 0.5 s"
    )  # fmt: skip
    (redirected,) = _delivery_rows(db, moved_id)
    assert redirected.last_status == 302
    assert redirected.last_error is not None and "not followed" in redirected.last_error

    # Registered while private addresses were allowed; the worker checks again at each
    # delivery and, not allowed now, refuses to call it.
    with db.connection() as conn:
        local_id, _ = deliveries.add_endpoint(conn, local.url, ["alert.crossed"])
        deliveries.fan_out(conn, [_alert()])
    strict = type(slow)(timeout_s=0.5, concurrency=1, retry=slow.retry, allow_private=False)
    halt = _run(AlertWebhooks(db, None, strict))
    try:
        wait_for(lambda: _delivery_rows(db, local_id)[0].attempts >= 1, what="a refusal")
    finally:
        halt()
    (refused,) = _delivery_rows(db, local_id)
    assert refused.last_error is not None and "refused" in refused.last_error
    assert "loopback" in refused.last_error
    assert local.event_ids == []  # never called


def test_two_workers_send_each_delivery_once(
    alert_settings: Settings, ingest_ledger: BillingLedger, receivers: Callable[..., Receiver]
) -> None:
    live = receivers("ok")
    db = Database(alert_settings.database_url, pool_size=0)
    alerts = [_alert() for _ in range(30)]
    with db.connection() as conn:
        endpoint, live.secret = deliveries.add_endpoint(conn, live.url, ["alert.crossed"])
    policy = alert_settings.alert_delivery_policy()
    policy = type(policy)(timeout_s=5, concurrency=4, retry=policy.retry, allow_private=True)
    halts = [_run(AlertWebhooks(db, None, policy)) for _ in range(2)]
    try:
        with db.connection() as conn:
            deliveries.fan_out(conn, alerts)
            assert deliveries.fan_out(conn, alerts) == 0  # a redelivered alert adds nothing
        wait_for(lambda: len(live.distinct()) == 30, what="every alert")
        wait_for(
            lambda: all(r.status == "delivered" for r in _delivery_rows(db, endpoint)),
            what="every delivery recorded",
        )
    finally:
        for halt in halts:
            halt()
    assert sorted(live.event_ids) == sorted(a.id for a in alerts)  # none sent twice


class _Refusing(Database):
    """The test database, refusing every connection while ``down`` is set."""

    down = False

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        if self.down:
            raise psycopg.OperationalError("the database is away")
        with super().connection() as conn:
            yield conn


def test_outcomes_the_database_refused_are_kept_and_written_on_a_later_round(
    alert_settings: Settings, ingest_ledger: BillingLedger, receivers: Callable[..., Receiver]
) -> None:
    live = receivers("ok")
    db = _Refusing(alert_settings.database_url, pool_size=0)
    alerts = [_alert() for _ in range(3)]
    with db.connection() as conn:
        endpoint, live.secret = deliveries.add_endpoint(conn, live.url, ["alert.crossed"])
        deliveries.fan_out(conn, alerts)
    policy = alert_settings.alert_delivery_policy()
    policy = type(policy)(timeout_s=5, concurrency=3, retry=policy.retry, allow_private=True)
    worker = AlertWebhooks(db, None, policy)
    try:
        assert worker.dispatch_once() == 3  # claimed and sent; outcomes written later
        wait_for(lambda: worker.stats()["outcomes_unwritten"] == 3, what="three answers")
        assert len(live.distinct()) == 3
        db.down = True
        with pytest.raises(psycopg.OperationalError):
            worker.dispatch_once()
        assert worker.stats()["outcomes_unwritten"] == 3  # kept, not dropped
        assert worker.stats()["delivered"] == 0
        db.down = False
        with db.connection() as conn:  # still claimed: nobody sends them again meanwhile
            assert deliveries.due(conn, limit=10) == []
        assert worker.write_outcomes() == 3
    finally:
        worker.close()
    rows = _delivery_rows(db, endpoint)
    assert [(r.status, r.attempts) for r in rows] == [("delivered", 1)] * 3
    assert worker.stats()["delivered"] == 3
    assert sorted(live.event_ids) == sorted(a.id for a in alerts)  # each sent once


def test_outcomes_written_one_by_one_are_counted_when_the_database_goes_away_between(
    alert_settings: Settings,
    ingest_ledger: BillingLedger,
    receivers: Callable[..., Receiver],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live = receivers("ok")
    db = _Refusing(alert_settings.database_url, pool_size=0)
    with db.connection() as conn:
        endpoint, live.secret = deliveries.add_endpoint(conn, live.url, ["alert.crossed"])
        deliveries.fan_out(conn, [_alert() for _ in range(3)])
    record = deliveries.record

    def one_at_a_time(conn: Any, outcomes: Any) -> Any:
        if len(outcomes) > 1:  # the batch is refused: each is written on its own
            raise psycopg.DataError("a value the database refuses")
        written = record(conn, outcomes)
        db.down = True  # and the database goes away after the first
        return written

    monkeypatch.setattr(deliveries, "record", one_at_a_time)
    policy = alert_settings.alert_delivery_policy()
    policy = type(policy)(timeout_s=5, concurrency=3, retry=policy.retry, allow_private=True)
    worker = AlertWebhooks(db, None, policy)
    try:
        assert worker.dispatch_once() == 3
        wait_for(lambda: worker.stats()["outcomes_unwritten"] == 3, what="three answers")
        with pytest.raises(psycopg.OperationalError):
            worker.write_outcomes()
        assert worker.stats()["delivered"] == 1  # the one written, and only it
        assert worker.stats()["outcomes_unwritten"] == 2  # kept for the next round
        db.down = False
        monkeypatch.setattr(deliveries, "record", record)
        assert worker.write_outcomes() == 2
    finally:
        worker.close()
    assert [r.status for r in _delivery_rows(db, endpoint)] == ["delivered"] * 3
    assert worker.stats()["delivered"] == 3


def test_an_outcome_whose_claim_lapsed_is_not_written_and_is_said(
    alert_settings: Settings,
    ingest_ledger: BillingLedger,
    receivers: Callable[..., Receiver],
    caplog: pytest.LogCaptureFixture,
) -> None:
    live = receivers("ok")
    db = Database(alert_settings.database_url, pool_size=0)
    with db.connection() as conn:
        endpoint, live.secret = deliveries.add_endpoint(conn, live.url, ["alert.crossed"])
        deliveries.fan_out(conn, [_alert()])
    policy = alert_settings.alert_delivery_policy()
    policy = type(policy)(timeout_s=5, concurrency=1, retry=policy.retry, allow_private=True)
    worker = AlertWebhooks(db, None, policy)
    try:
        assert worker.dispatch_once() == 1
        wait_for(lambda: worker.stats()["outcomes_unwritten"] == 1, what="the answer")
        with db.connection() as conn:  # another worker's claim, once this one's lapsed
            conn.execute("UPDATE billing.webhook_deliveries SET version = version + 1")
        with caplog.at_level(logging.WARNING, logger="adapters.alerts.worker"):
            assert worker.write_outcomes() == 0  # not written
        assert "claim had lapsed" in caplog.text
        assert worker.stats()["delivered"] == 0  # it is sent again: counted then, once
    finally:
        worker.close()
    (row,) = _delivery_rows(db, endpoint)
    assert (row.status, row.attempts) == ("pending", 0)  # the other worker's attempt stands


class _InProcess:
    """``billing-ledger`` run in this process (faster than a child), with ``settings``
    in the environment; each call gives (exit status, stdout, stderr)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
        self.monkeypatch, self.capsys = monkeypatch, capsys

    def __call__(self, settings: Settings, *args: str) -> tuple[int, str, str]:
        for key, value in settings_env(settings).items():
            if key.startswith("BILLING_LEDGER_"):
                self.monkeypatch.setenv(key, value)
        status = main(list(args))
        out, err = self.capsys.readouterr()
        return status, out, err


def test_the_webhook_commands_register_list_replay_and_remove(
    alert_settings: Settings,
    ingest_ledger: BillingLedger,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:
    cli = _InProcess(monkeypatch, capsys)
    strict = alert_settings.model_copy(update={"alert_webhook_allow_private": False})
    url, events = "http://127.0.0.1:9/x", ("--events", "alert.crossed")
    status, _, err = cli(strict, "webhooks", "add", url, *events)
    assert status == 2
    assert err.count("\n") == 1 and "loopback" in err

    status, added, _ = cli(alert_settings, "webhooks", "add", url, *events)
    assert status == 0
    endpoint = re.findall(r"endpoint (\S+) added", added)[0]
    assert endpoint in cli(alert_settings, "webhooks", "list")[1]
    db = Database(alert_settings.database_url, pool_size=0)
    alert = _alert()
    with db.connection() as conn:
        deliveries.fan_out(conn, [alert])
    shown = json.loads(cli(alert_settings, "webhooks", "deliveries", "--json")[1])
    assert [(d["event_id"], d["status"], d["attempts"]) for d in shown] == [
        (alert.id, "pending", 0)
    ]
    assert "1 delivery due again" in cli(alert_settings, "webhooks", "replay", alert.id)[1]
    status, _, err = cli(alert_settings, "webhooks", "replay", str(uuid4()))
    assert status == 2 and "no delivery or alert" in err

    assert "removed" in cli(alert_settings, "webhooks", "remove", endpoint)[1]
    assert endpoint not in cli(alert_settings, "webhooks", "list")[1]
    assert endpoint in cli(alert_settings, "webhooks", "list", "--all")[1]
    (row,) = json.loads(cli(alert_settings, "webhooks", "deliveries", "--json")[1])
    assert (row["status"], row["last_error"]) == ("failed", "endpoint removed")
    assert cli(alert_settings, "webhooks", "remove", endpoint)[0] == 2


def test_credit_alerts_reach_a_live_endpoint_once_each_naming_the_grant(
    alert_settings: Settings, ingest_ledger: BillingLedger, receivers: Callable[..., Receiver]
) -> None:
    """A grant of 1,000 minor units, alerts at a balance of 300 and at half the grant:
    each crosses once under redelivery, on the record that reached it, and the receiver
    verifies both, the grant's naming it."""
    start = datetime.now(UTC) - timedelta(days=1)
    ingest_ledger.change_account("acme", "USD", lambda a: a.grant_credit(
        "welcome", 1000, effective_at=start, source="promotional", reason="trial",
    ))  # fmt: skip
    out = _cli(alert_settings, "alerts", "set", "--customer", "acme", "--currency", "USD",
               "--balance", "300", "--percent-of-grant", "50")  # fmt: skip
    assert "balance:300, percent_of_grant:50" in out
    live = receivers("ok")
    added = _cli(alert_settings, "webhooks", "add", live.url, "--events", "alert.crossed")
    live.secret = re.findall(r"whsec_\S+", added)[0]

    records = [usage(f"u-{i}") for i in range(10)]  # 100 minor units each
    produce_records(alert_settings, records + records)
    _ingest(alert_settings, ingest_ledger, 20)
    crossed = _crossings(alert_settings.database_url)
    assert [(c["threshold"], c["usage_id"], c["value"], c["grant_id"]) for c in crossed] == [
        ("percent_of_grant:50", "u-4", "500", "welcome"),
        ("balance:300", "u-6", "300", None),
    ]
    stop = threading.Event()
    running = threading.Thread(
        target=run_roles,
        args=(alert_settings, ingest_ledger, ["relay", "alerts"], stop),
        daemon=True,
    )
    running.start()
    try:
        expected = {c["alert_id"] for c in crossed}
        wait_for(lambda: live.distinct() == expected, timeout=30, what="the credit alerts")
    finally:
        stop.set()
        running.join(timeout=30)
    by_kind = {e["threshold"]["kind"]: e for e in live.verified}
    assert by_kind["percent_of_grant"]["grant_id"] == "welcome"
    assert (by_kind["balance"]["value"], by_kind["balance"]["grant_id"]) == ("300", None)
    assert live.refused == 0


def _nul_answering_server() -> tuple[Any, str]:
    """A receiver that fails every request with a body holding a NUL byte (as a binary
    error page or a C string does): text PostgreSQL cannot store."""
    return serve_posts(lambda body, headers: (500, {}, b"oops\x00"), "/hooks")


@pytest.mark.parametrize("cleaned", [True, False], ids=["nul-replaced", "outcome-dropped"])
def test_one_endpoints_unstorable_answer_does_not_stop_the_others(  # noqa: PLR0917
    alert_settings: Settings,
    ingest_ledger: BillingLedger,
    receivers: Callable[..., Receiver],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    cleaned: bool,
) -> None:
    if not cleaned:  # a value the database refuses, whatever it is: written without it
        monkeypatch.setattr(deliveries, "_storable", lambda text: text)
    live = receivers("ok")
    bad, bad_url = _nul_answering_server()
    db = Database(alert_settings.database_url, pool_size=0)
    first, later = _alert(), _alert()
    with db.connection() as conn:
        live_id, live.secret = deliveries.add_endpoint(conn, live.url, ["alert.crossed"])
        bad_id, _ = deliveries.add_endpoint(conn, bad_url, ["alert.crossed"])
        deliveries.fan_out(conn, [first])
    policy = alert_settings.alert_delivery_policy()
    policy = type(policy)(timeout_s=5, concurrency=2, retry=policy.retry, allow_private=True)
    worker = AlertWebhooks(db, None, policy)
    halt = _run(worker)
    try:
        wait_for(lambda: live.distinct() == {first.id}, timeout=10, what="the first alert")
        with db.connection() as conn:
            deliveries.fan_out(conn, [later])
        # The live endpoint still gets the next alert, and its outcomes are written.
        wait_for(
            lambda: live.distinct() == {first.id, later.id}, timeout=10, what="the later alert"
        )
        wait_for(
            lambda: [r.status for r in _delivery_rows(db, live_id)] == ["delivered"] * 2,
            timeout=10,
            what="the live deliveries recorded",
        )
        if cleaned:  # the failure is recorded, the NUL replaced
            wait_for(
                lambda: all(r.attempts >= 1 for r in _delivery_rows(db, bad_id)),
                what="the failures recorded",
            )
            for failed in _delivery_rows(db, bad_id):
                assert (failed.last_status, failed.last_error) == (500, "HTTP 500: oops\ufffd")
        else:  # dropped, not written: nor counted (it is sent again)
            wait_for(lambda: "refused by the database, dropped" in caplog.text, what="a drop")
    finally:
        halt()
        bad.shutdown()
        bad.server_close()
    assert worker.stats()["delivered"] == 2
    assert (worker.stats()["failed_attempts"] > 0) is cleaned
