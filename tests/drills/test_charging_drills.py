"""Charging drills: faults injected on purpose against real PostgreSQL, the broker and
the Stripe SDK over HTTP to the emulator. Each ends by checking the invariants and the
audit against the emulator (``tests.drills.support.assert_invariants``)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from uuid import UUID

import psycopg
import pytest

from adapters.bootstrap import (
    build_charge_worker,
    build_projector,
    build_pusher,
    build_reconciler,
    build_relay,
    build_scheduler,
)
from adapters.charging.process_manager import ChargeWorker
from adapters.charging.pusher import LinePusher
from adapters.roles import run_roles
from adapters.settings import Settings
from domain.customer import CustomerLink
from domain.metering import Metering
from domain.saga import StepResult
from domain.transaction import Source, TxnState
from infra.stripe_emulator import StripeEmulator
from projections.queue_health import write_settings
from store.ledger import BillingLedger
from tests.conftest import settings_env
from tests.drills.support import assert_invariants, reserve
from tests.integration.support import usage, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.drill]


def _lines(ledger: BillingLedger, ids: list[UUID]) -> set[UUID]:
    return {line for i in ids if (line := ledger.transaction(i).line_id) is not None}


def _push_until_settled(
    pusher: LinePusher, ledger: BillingLedger, ids: list[UUID], timeout: float = 60
) -> None:
    """Push every line of ``ids`` again and again until every transaction is terminal."""

    def settled() -> bool:
        for line in _lines(ledger, ids):
            pusher.push(line)
        return all(ledger.transaction(i).state.is_terminal for i in ids)

    wait_for(settled, timeout=timeout, what="every transaction charged or compensated")


def _relay_all(settings: Settings) -> int:
    relay = build_relay(settings)
    while relay.pump():
        pass
    relay.close()
    relay.producer.close()
    return relay.published


def _pump_until(worker: ChargeWorker, condition: Callable[[], bool], timeout: float = 60) -> None:
    """Poll the process manager (no pause between polls: polling is its work) until done."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"process manager stuck: seen {worker.seen}"
        worker.poll_once()


def _executed(emulator: StripeEmulator, path: str) -> list[dict[str, object]]:
    return [e for e in emulator.ledger() if e["path"] == path]


@pytest.mark.parametrize("drill", ["kill_after_stripe", "kill_before_stripe"])
def test_a_charge_worker_killed_around_the_stripe_call_is_finished_by_another_once(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator, drill: str
) -> None:
    ids = reserve(ledger, 3, "acme") + reserve(ledger, 3, "bolt")
    _relay_all(charge_settings)
    proc = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "run", "--role", "charge", "--drill", drill],
        env=settings_env(charge_settings),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    created = _executed(emulator, "/v1/invoiceitems")
    # Killed after Stripe set a line's item (another push may have been in flight beside
    # it), or before any item was sent.
    assert 1 <= len(created) <= 2 if drill == "kill_after_stripe" else created == []
    assert {ledger.transaction(i).state for i in ids} == {TxnState.RESERVED}

    _push_until_settled(build_pusher(charge_settings, ledger), ledger, ids)
    assert assert_invariants(ledger, emulator, ids, charge_settings) == {"charged": 6}
    assert len(_executed(emulator, "/v1/invoiceitems")) == 2  # one item a line, executed once


def test_the_ambiguous_timeout_is_retried_with_the_same_keys_and_gets_the_saved_result(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    first = reserve(ledger, 1)
    pusher = build_pusher(charge_settings, ledger)
    [line] = _lines(ledger, first)
    assert pusher.push(line).result is StepResult.CHARGED
    later = reserve(ledger, 1, prefix="later")
    emulator.set_faults(drop_response_after_execute=1)  # Stripe executes, the answer is lost
    report = pusher.push(line)
    assert report.result is StepResult.RETRY
    push = ledger.line_push(line)
    assert push is not None and push.unknown_outcome and push.last_error is not None
    assert push.last_error.startswith("connection")
    assert ledger.transaction(later[0]).state is TxnState.RESERVED

    _push_until_settled(pusher, ledger, first + later)
    assert assert_invariants(ledger, emulator, first + later, charge_settings) == {"charged": 2}
    amount_paths = ("/v1/invoiceitems/", "/update_lines")
    updates = [e for e in emulator.ledger() if any(p in str(e["path"]) for p in amount_paths)]
    assert updates  # the draft's lines set after the items' creation: a bulk update
    assert len({e["idempotency_key"] for e in updates}) == len(updates)  # the retry replayed


def test_a_permanent_refusal_compensates_the_lines_transactions_and_releases_them(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    ids = reserve(ledger, 2)
    ledger.save(CustomerLink(customer_id="acme", stripe_customer_id="cus_does_not_exist"))
    pusher = build_pusher(charge_settings, ledger)
    [line] = _lines(ledger, ids)
    assert pusher.push(line).result is StepResult.COMPENSATED
    for txn_id in ids:
        txn = ledger.transaction(txn_id)
        assert txn.state is TxnState.COMPENSATED
        assert (txn.compensation_reason or "").startswith("Stripe refused the line: http_400")
    account = ledger.account("acme", "USD")
    assert account is not None and account.committed == 0
    # The line is empty now: its next push records that without a call to Stripe.
    again = pusher.push(line)
    assert (again.result, again.requests, again.charged) == (StepResult.CHARGED, 0, 0)
    assert _executed(emulator, "/v1/invoiceitems") == []
    assert assert_invariants(ledger, emulator, ids, charge_settings) == {"compensated": 2}


def test_racing_pushers_while_usage_arrives_charge_each_transaction_once(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    pushers = [build_pusher(charge_settings, ledger) for _ in range(3)]
    ids: list[UUID] = reserve(ledger, 5, "acme") + reserve(ledger, 5, "bolt")
    stop = threading.Event()
    errors: list[BaseException] = []

    def push_forever(pusher: LinePusher) -> None:
        try:
            while not stop.is_set():
                for line in _lines(ledger, ids):
                    pusher.push(line)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=push_forever, args=(p,)) for p in pushers]
    for t in threads:
        t.start()
    for batch in range(6):  # usage keeps arriving while three pushers race
        ids += reserve(ledger, 5, "acme", prefix=f"a{batch}")
        ids += reserve(ledger, 5, "bolt", prefix=f"b{batch}")
    _push_until_settled(pushers[0], ledger, ids)
    stop.set()
    for t in threads:
        t.join(60)
    assert errors == []
    assert assert_invariants(ledger, emulator, ids, charge_settings) == {"charged": len(ids)}
    assert len(_executed(emulator, "/v1/invoiceitems")) == 2  # one item a line


def test_an_outage_opens_the_breaker_bounds_the_calls_and_everything_is_charged_after(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    settings = charge_settings.model_copy(
        update={"settle_interval_s": 0.2, "reconcile_interval_s": 0.2, "breaker_reset_s": 1.0}
    )
    stop = threading.Event()
    roles = threading.Thread(
        target=run_roles, args=(settings, ledger, ["relay", "project", "charge", "reconcile"], stop)
    )
    roles.start()
    try:
        before = reserve(ledger, 3, "acme")
        wait_for(
            lambda: all(ledger.transaction(i).state is TxnState.CHARGED for i in before),
            what="the first charges",
        )
        emulator.set_faults(outage=True)
        at = len(emulator.requests())
        during: list[UUID] = []
        for customer in ("acme", "bolt", "cute", "dash"):
            during += reserve(ledger, 5, customer, prefix="o")
        time.sleep(4)  # the outage lasts: this drill is about what happens meanwhile
        sent = len(emulator.requests()) - at
        emulator.set_faults(outage=False)
        wait_for(
            lambda: all(ledger.transaction(i).state is TxnState.CHARGED for i in during),
            timeout=90,
            what="every charge after the outage",
        )
    finally:
        stop.set()
        roles.join(60)
    # 4 lines retried with backoff behind a breaker that opens after 5 failures and lets
    # one probe through a second: far fewer calls than 4 lines x 20 pushes a second.
    assert 1 <= sent <= 30, sent
    assert assert_invariants(ledger, emulator, before + during, settings) == {"charged": 23}


def test_stripe_answering_429_above_a_rate_never_sees_more_than_that_rate(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    """The client sends at most ``stripe_rate_per_s``; requests still arrive with jitter
    (a loaded machine delays some and bunches them), so the client is set a fifth below
    Stripe's limit, as a deployment should be, and Stripe never sees more than its own."""
    rate = 10
    settings = charge_settings.model_copy(update={"stripe_rate_per_s": rate * 4 // 5})
    emulator.set_faults(rate_limit_per_s=rate)
    ids: list[UUID] = []
    for customer in range(12):  # 12 customers: 36 calls to create them, their drafts, items
        ids += reserve(ledger, 2, f"cust-{customer}")
    pusher = build_pusher(settings, ledger)
    threads = [
        threading.Thread(target=lambda part=part: [pusher.push(line) for line in part])
        for part in (sorted(_lines(ledger, ids))[i::3] for i in range(3))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    _push_until_settled(pusher, ledger, ids)
    seen = sorted(r["at"] for r in emulator.requests() if r["path"].startswith("/v1/"))
    assert _max_in_any_second(seen) <= rate
    assert assert_invariants(ledger, emulator, ids, settings) == {"charged": 24}


def _max_in_any_second(times: list[float]) -> int:
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= 1.0:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def test_the_relay_killed_mid_stream_resumes_without_loss_and_duplicates_have_no_effect(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    from kafka import KafkaConsumer

    from tests.integration.support import count_events

    ids: list[UUID] = []
    for chunk in range(6):
        ids += reserve(ledger, 400, customer=f"cust-{chunk}")
    total = count_events(charge_settings.database_url)
    settings = charge_settings.model_copy(update={"stripe_rate_per_s": 500})
    relay = subprocess.Popen(
        [sys.executable, "-m", "adapters.cli", "run", "--role", "relay"],
        env=settings_env(settings),
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _relayed(settings) > 0, what="the relay to record a position")
    finally:
        relay.kill()  # SIGKILL, mid-stream or just after
        relay.wait()
    assert _relay_all(settings) >= 0  # a fresh relay resumes from the stored position

    consumer = KafkaConsumer(
        settings.events_topic,
        bootstrap_servers=settings.kafka_bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=3000,
    )
    published = [json.loads(m.value)["notification_id"] for m in consumer]
    consumer.close()
    assert len(set(published)) == total  # nothing lost
    assert len(published) >= total  # the batch in flight at the kill may be sent twice

    pusher = build_pusher(settings, ledger)
    scheduler = build_scheduler(settings, pusher)
    worker = build_charge_worker(settings, scheduler)
    stop = threading.Event()
    pushing = threading.Thread(target=scheduler.run, args=(stop,))
    pushing.start()
    try:
        _pump_until(
            worker,
            lambda: all(ledger.transaction(i).state is TxnState.CHARGED for i in ids),
            timeout=120,
        )
    finally:
        stop.set()
        pushing.join(60)
        worker.consumer.close()
    assert assert_invariants(ledger, emulator, ids, settings) == {"charged": len(ids)}


def _relayed(settings: Settings) -> int:
    with psycopg.connect(settings.database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM billing.relay_position WHERE name = 'billing.events'"
        ).fetchone()
    return int(row[0]) if row else 0


def test_past_the_key_window_a_retry_finds_the_item_instead_of_creating_a_second(
    charge_settings: Settings, ledger: BillingLedger
) -> None:
    with StripeEmulator(port=0, key_ttl_s=0.5) as stripe:
        settings = charge_settings.model_copy(
            update={"stripe_api_base": stripe.url, "stripe_key_window_s": 0.5}
        )
        pusher = build_pusher(settings, ledger)
        first = reserve(ledger, 1)  # a first line: the customer and the draft exist after it
        assert pusher.push(next(iter(_lines(ledger, first)))).result is StepResult.CHARGED
        gpu = Metering(usage("gpu-1", meter="gpu.a100.seconds"), Source("usage", 1, 1))
        other = [t.id for t in ledger.record_usage([gpu]).transactions]
        [line] = _lines(ledger, other)
        stripe.set_faults(drop_response_after_execute=1)
        assert pusher.push(line).result is StepResult.RETRY  # created at Stripe, answer lost
        time.sleep(0.6)  # let Stripe forget the key: the point of this drill is the clock
        _push_until_settled(pusher, ledger, other)
        assert assert_invariants(ledger, stripe, first + other, settings) == {"charged": 2}
        created = [e for e in stripe.ledger() if e["path"] == "/v1/invoiceitems"]
        assert len(created) == 2  # found by its line metadata, not created again


def test_reverse_lowers_the_line_and_the_next_push_sets_the_lower_amount(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    ids = reserve(ledger, 2)
    pusher = build_pusher(charge_settings, ledger)
    [line] = _lines(ledger, ids)
    pusher.push(line)
    before = ledger.line_by_id(line).billed
    account = ledger.account("acme", "USD")
    assert account is not None and account.committed == sum(
        ledger.transaction(i).amount for i in ids
    )

    proc = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "reverse", str(ids[0]), "--reason", "goodwill"],
        env=settings_env(charge_settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    txn = ledger.transaction(ids[0])
    assert txn.state is TxnState.COMPENSATED and txn.compensation_reason == "goodwill"
    pusher.push(line)
    after = ledger.line_by_id(line).billed
    assert after < before
    [item] = [i for i in emulator.live_invoice_items() if i["metadata"]["line_id"] == str(line)]
    assert item["amount"] == after
    account = ledger.account("acme", "USD")
    assert account is not None and account.committed == ledger.transaction(ids[1]).amount
    again = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "reverse", str(ids[0]), "--reason", "twice"],
        env=settings_env(charge_settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 2 and "not charged" in again.stderr  # misuse: nothing to reverse
    assert_invariants(ledger, emulator, ids, charge_settings)


def test_a_process_manager_reading_every_event_again_sends_nothing_new_to_stripe(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    ids = reserve(ledger, 8)
    _relay_all(charge_settings)
    pusher = build_pusher(charge_settings, ledger)
    first = build_charge_worker(charge_settings, build_scheduler(charge_settings, pusher))
    stop = threading.Event()
    pushing = threading.Thread(target=first.scheduler.run, args=(stop,))
    pushing.start()
    try:
        _pump_until(
            first, lambda: all(ledger.transaction(i).state is TxnState.CHARGED for i in ids)
        )
    finally:
        stop.set()
        pushing.join(60)
        first.consumer.close()
    requests_before = len(emulator.requests())

    # Another group reads the topic from the earliest event: every change is scheduled
    # again, and Stripe already holds every newest total.
    again = charge_settings.model_copy(update={"charge_group": charge_settings.charge_group + "2"})
    second = build_charge_worker(again, build_scheduler(again, pusher))
    stop = threading.Event()
    pushing = threading.Thread(target=second.scheduler.run, args=(stop,))
    pushing.start()
    try:
        _pump_until(second, lambda: second.scheduled > 0 and second.scheduler.waiting() == 0)
    finally:
        stop.set()
        pushing.join(60)
        second.consumer.close()
    assert len(emulator.requests()) == requests_before
    assert assert_invariants(ledger, emulator, ids, charge_settings) == {"charged": 8}


def test_the_reconciler_finds_open_lines_in_the_projection_and_past_its_position(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    pusher = build_pusher(charge_settings, ledger)
    scheduler = build_scheduler(charge_settings, pusher)
    reconciler = build_reconciler(charge_settings, pusher, scheduler)
    first = reserve(ledger, 2, "acme")
    with build_projector(charge_settings, ledger) as projector:
        projector.pump_all()
    later = reserve(ledger, 2, "bolt")  # past the projection's position
    assert reconciler.pass_once().lines == 2
    assert scheduler.waiting() == 2
    stop = threading.Event()
    pushing = threading.Thread(target=scheduler.run, args=(stop,))
    pushing.start()
    try:
        wait_for(
            lambda: (
                scheduler.waiting() == 0
                and all(ledger.transaction(i).state is TxnState.CHARGED for i in first + later)
            ),
            what="the scheduled lines pushed",
        )
    finally:
        stop.set()
        pushing.join(60)
    with build_projector(charge_settings, ledger) as projector:
        projector.pump_all()
    assert reconciler.pass_once().lines == 0  # nothing open any more
    assert_invariants(ledger, emulator, first + later, charge_settings)


def test_owed_usage_is_not_dropped_while_stripe_is_down_past_the_horizon(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    settings = charge_settings.model_copy(update={"retry_horizon_s": 0.5})
    ids = reserve(ledger, 2)
    pusher = build_pusher(settings, ledger)
    [line] = _lines(ledger, ids)
    emulator.set_faults(outage=True)
    deadline = ledger.transaction(ids[0]).created_on + timedelta(seconds=1)
    wait_for(
        lambda: pusher.push(line).result is StepResult.RETRY and pusher.clock() > deadline,
        what="pushes failing past the horizon",
    )
    assert {ledger.transaction(i).state for i in ids} == {TxnState.RESERVED}  # still owed
    with build_projector(settings, ledger) as projector:
        projector.pump_all()
    with psycopg.connect(settings.database_url) as conn:
        write_settings(
            conn,
            retry_horizon_s=0.5,
            reconcile_interval_s=0.1,
            stale_after_s=30,
            heartbeat_timeout_s=30,
        )
        row = conn.execute(
            "SELECT lines_failing, lines_past_deadline FROM billing.queue_health"
        ).fetchone()
    assert row == (1, 1)  # reported failing, not compensated
    emulator.set_faults(outage=False)
    _push_until_settled(pusher, ledger, ids)
    assert assert_invariants(ledger, emulator, ids, settings) == {"charged": 2}
