"""Charging drills: faults injected on purpose against real PostgreSQL, the broker and
the Stripe SDK over HTTP to the emulator. Each checks I1-I4 at the end."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from uuid import UUID

import pytest

from adapters.bootstrap import (
    build_charge_worker,
    build_charger,
    build_projector,
    build_reconciler,
)
from adapters.charging.charger import Charger
from adapters.charging.process_manager import ChargeWorker
from adapters.charging.reconciler import Reconciler
from adapters.settings import Settings
from adapters.stripe.client import StripeCharges
from domain.transaction import TxnState
from infra.stripe_emulator import StripeEmulator
from store.ledger import BillingLedger
from tests.conftest import settings_env
from tests.drills.support import assert_invariants, reserve
from tests.integration.support import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.drill]


def _reconcile_until_terminal(
    reconciler: Reconciler, ledger: BillingLedger, ids: list[UUID]
) -> None:
    def all_terminal() -> bool:
        reconciler.pass_once()
        return all(ledger.transaction(i).state.is_terminal for i in ids)

    wait_for(all_terminal, timeout=60, what="every transaction to reach a terminal state")


def _pump_until(worker: ChargeWorker, condition: Callable[[], bool], timeout: float = 60) -> None:
    """Poll the process manager (no pause between polls: polling is its work) until done."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"process manager stuck: driven {worker.driven}"
        worker.poll_once()


def _charge_worker_process(settings: Settings, drill: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "adapters.cli", "run", "--role", "charge", "--drill", drill],
        env=settings_env(settings),
        capture_output=True,
        timeout=120,
        check=False,
    )


def _relay_all(settings: Settings) -> int:
    from adapters.bootstrap import build_relay

    relay = build_relay(settings)
    while relay.pump():
        pass
    relay.close()
    relay.producer.close()
    return relay.published


@pytest.mark.parametrize("drill", ["kill_after_stripe", "kill_before_stripe"])
def test_a_charge_worker_killed_around_the_stripe_call_is_finished_by_the_reconciler_once(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator, drill: str
) -> None:
    ids = reserve(ledger, 3)
    _relay_all(charge_settings)
    proc = _charge_worker_process(charge_settings, drill)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    executed = [e for e in emulator.ledger() if e["path"] == "/v1/invoiceitems"]
    # Killed after Stripe executed a charge (others may have been in flight beside it),
    # or before any charge was sent.
    if drill == "kill_after_stripe":
        assert 1 <= len(executed) <= len(ids)
    else:
        assert executed == []
    assert all(ledger.transaction(i).state is TxnState.RESERVED for i in ids)

    reconciler = build_reconciler(charge_settings, build_charger(charge_settings, ledger))
    _reconcile_until_terminal(reconciler, ledger, ids)

    states = assert_invariants(ledger, emulator, ids)
    assert states == {"charged": 3}
    executed = [e for e in emulator.ledger() if e["path"] == "/v1/invoiceitems"]
    assert len(executed) == 3  # the repeated call for the first one was replayed, not run


def test_the_ambiguous_timeout_is_retried_with_the_same_key_and_gets_the_saved_result(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    [txn_id] = reserve(ledger, 1)
    charger = build_charger(charge_settings, ledger)
    charger.stripe.customer("acme")  # create the customer first; drop only the charge
    emulator.set_faults(drop_response_after_execute=1)

    assert charger.drive(txn_id) == "retry"
    txn = ledger.transaction(txn_id)
    assert (txn.state, txn.attempts) == (TxnState.CHARGE_FAILED, 1)
    assert txn.last_error is not None and txn.last_error.startswith("connection")
    assert len(emulator.live_invoice_items(str(txn_id))) == 1  # Stripe did execute it

    _reconcile_until_terminal(build_reconciler(charge_settings, charger), ledger, [txn_id])
    assert assert_invariants(ledger, emulator, [txn_id]) == {"charged": 1}
    keys = [e["idempotency_key"] for e in emulator.ledger() if e["path"] == "/v1/invoiceitems"]
    assert keys == [f"charge:{txn_id}"]  # executed once; the retry was a replay


def test_a_permanent_error_is_one_attempt_then_compensated_and_the_reservation_released(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    [txn_id] = reserve(ledger, 1)
    charger = build_charger(charge_settings, ledger)
    charger.stripe._customers["acme"] = "cus_does_not_exist"  # Stripe will answer 400

    assert charger.drive(txn_id) == "compensated"
    txn = ledger.transaction(txn_id)
    assert txn.state is TxnState.COMPENSATED
    assert txn.attempts == 1
    assert "permanent error" in (txn.compensation_reason or "")
    account = ledger.account("acme", "USD")
    assert account is not None and (account.reserved, account.charged) == (0, 0)
    posts = [r for r in emulator.requests() if r["path"] == "/v1/invoiceitems"]
    assert len(posts) == 1
    assert_invariants(ledger, emulator, [txn_id])


def test_two_process_managers_and_the_reconciler_racing_charge_each_transaction_once(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    ids = reserve(ledger, 20)
    emulator.set_faults(latency_ms=20)
    policy = charge_settings.retry_policy()
    drivers = [Charger(ledger, StripeCharges(charge_settings.stripe()), policy) for _ in range(3)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(drivers))

    def race(charger: Charger) -> None:
        start.wait()
        for txn_id in ids:
            try:
                charger.drive(txn_id)
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

    threads = [threading.Thread(target=race, args=(d,)) for d in drivers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    reconciler = build_reconciler(charge_settings, drivers[0])
    _reconcile_until_terminal(reconciler, ledger, ids)
    assert assert_invariants(ledger, emulator, ids) == {"charged": 20}


def test_an_outage_opens_the_breaker_bounds_the_calls_and_everything_is_charged_after(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    ids = reserve(ledger, 30)
    charger = build_charger(charge_settings, ledger)
    charger.stripe.customer("acme")
    emulator.set_faults(outage=True, outage_mode="503")
    sent_before = len(emulator.requests())
    results = [charger.drive(i) for i in ids]
    during = len(emulator.requests()) - sent_before
    assert charger.stripe.breaker_state() == "open"
    assert results.count("retry") == len(ids)  # recorded, none lost
    assert during <= charge_settings.breaker_fail_max  # the rest were refused locally
    keys_before = {ledger.transaction(i).id for i in ids}

    emulator.set_faults(outage=False)
    _reconcile_until_terminal(build_reconciler(charge_settings, charger), ledger, ids)
    assert assert_invariants(ledger, emulator, ids) == {"charged": 30}
    keys = {e["idempotency_key"] for e in emulator.ledger() if e["path"] == "/v1/invoiceitems"}
    assert keys == {f"charge:{i}" for i in keys_before}


def test_the_relay_publishes_reserved_events_and_the_process_manager_charges_them(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    ids = reserve(ledger, 12)
    # Metered + Reserved for each transaction; Opened + AmountsReserved for the account.
    assert _relay_all(charge_settings) == 12 * 2 + 2
    worker = build_charge_worker(charge_settings, build_charger(charge_settings, ledger))
    try:
        _pump_until(
            worker,
            lambda: all(ledger.transaction(i).state is TxnState.CHARGED for i in ids),
            timeout=60,
        )
    finally:
        worker.consumer.close()
        worker.pool.shutdown()
    assert assert_invariants(ledger, emulator, ids) == {"charged": 12}


def _max_in_any_second(times: list[float]) -> int:
    times = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= 1.0:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def test_stripe_answering_429_above_a_rate_never_sees_more_than_that_rate(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    """The client sends at most ``stripe_rate_per_s``; requests still arrive with jitter
    (a loaded machine delays some and bunches them), so the client is set a fifth below
    Stripe's limit, as a deployment should be, and Stripe never sees more than its own."""
    rate = 10
    settings = charge_settings.model_copy(update={"stripe_rate_per_s": rate * 4 // 5})
    ids = reserve(ledger, 30)
    emulator.set_faults(rate_limit_per_s=rate)
    charger = build_charger(settings, ledger)
    threads = [
        threading.Thread(target=lambda part=part: [charger.drive(i) for i in part])
        for part in (ids[0::3], ids[1::3], ids[2::3])
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    _reconcile_until_terminal(build_reconciler(settings, charger), ledger, ids)

    seen = [r["at"] for r in emulator.requests() if r["path"].startswith("/v1/")]
    assert _max_in_any_second(seen) <= rate
    assert assert_invariants(ledger, emulator, ids) == {"charged": 30}


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

    worker = build_charge_worker(settings, build_charger(settings, ledger))
    try:
        _pump_until(
            worker,
            lambda: all(ledger.transaction(i).state is TxnState.CHARGED for i in ids),
            timeout=120,
        )
    finally:
        worker.consumer.close()
        worker.pool.shutdown()
    assert assert_invariants(ledger, emulator, ids) == {"charged": len(ids)}


def _relayed(settings: Settings) -> int:
    import psycopg

    with psycopg.connect(settings.database_url) as conn:
        row = conn.execute("SELECT count(*) FROM billing.relay_position").fetchone()
    return int(row[0]) if row else 0


def test_past_the_key_window_a_retry_finds_the_charge_instead_of_creating_a_second(
    charge_settings: Settings, ledger: BillingLedger
) -> None:
    import time

    with StripeEmulator(port=0, key_ttl_s=0.5) as stripe:
        settings = charge_settings.model_copy(
            update={"stripe_api_base": stripe.url, "stripe_key_window_s": 0.5}
        )
        [txn_id] = reserve(ledger, 1)
        charger = build_charger(settings, ledger)
        charger.stripe.customer("acme")
        stripe.set_faults(drop_response_after_execute=1)
        assert charger.drive(txn_id) == "retry"  # executed at Stripe, response lost
        time.sleep(0.6)  # let Stripe forget the key: the point of this drill is the clock
        _reconcile_until_terminal(build_reconciler(settings, charger), ledger, [txn_id])
        assert assert_invariants(ledger, stripe, [txn_id]) == {"charged": 1}
        created = [e for e in stripe.ledger() if e["path"] == "/v1/invoiceitems"]
        assert len(created) == 1  # found by its txn_id metadata, not created again


def test_reverse_deletes_the_invoice_item_and_releases_the_hold(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    [txn_id] = reserve(ledger, 1)
    assert build_charger(charge_settings, ledger).drive(txn_id) == "charged"
    account = ledger.account("acme", "USD")
    assert account is not None and account.committed == ledger.transaction(txn_id).amount

    proc = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "reverse", str(txn_id), "--reason", "goodwill"],
        env=settings_env(charge_settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    txn = ledger.transaction(txn_id)
    assert txn.state is TxnState.COMPENSATED
    assert txn.compensation_reason == "goodwill"
    assert emulator.live_invoice_items(str(txn_id)) == []
    account = ledger.account("acme", "USD")
    assert account is not None and account.committed == 0
    again = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "reverse", str(txn_id), "--reason", "twice"],
        env=settings_env(charge_settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 1 and "not charged" in again.stderr


def test_past_the_retry_horizon_the_reconciler_removes_a_charge_an_unknown_outcome_left(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    settings = charge_settings.model_copy(
        update={"retry_horizon_s": 1.0, "retry_base_s": 5.0, "retry_max_delay_s": 10.0}
    )
    [txn_id] = reserve(ledger, 1)
    stripe = StripeCharges(settings.stripe())
    charger = Charger(ledger, stripe, settings.retry_policy(), jitter=lambda: 0.9)
    stripe.customer("acme")
    emulator.set_faults(drop_response_after_execute=1)
    # The retry would be due in 4.5 s, past the 1 s horizon: give up, and clean up.
    assert charger.drive(txn_id) == "compensated"
    txn = ledger.transaction(txn_id)
    assert txn.state is TxnState.COMPENSATED
    assert "retry horizon" in (txn.compensation_reason or "")
    assert emulator.live_invoice_items(str(txn_id)) == []  # Stripe executed it; it was removed
    assert len(emulator.invoice_items(str(txn_id))) == 1
    account = ledger.account("acme", "USD")
    assert account is not None and account.committed == 0
    assert_invariants(ledger, emulator, [txn_id])


def test_the_process_manager_resumes_from_the_positions_it_recorded_with_its_steps(
    charge_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    import psycopg

    ids = reserve(ledger, 8)
    _relay_all(charge_settings)
    first = build_charge_worker(charge_settings, build_charger(charge_settings, ledger))
    first.consumer.commit = lambda *a, **k: None  # as if every Kafka offset commit were lost
    try:
        _pump_until(
            first, lambda: all(ledger.transaction(i).state is TxnState.CHARGED for i in ids)
        )
    finally:
        first.consumer.close()
        first.pool.shutdown()
    with psycopg.connect(charge_settings.database_url) as conn:
        stored = conn.execute(
            "SELECT sum(next_offset) FROM billing.consumer_positions WHERE group_name = %s",
            (charge_settings.charge_group,),
        ).fetchone()
    assert stored is not None and stored[0] == 8 * 2 + 2  # every event on the topic
    requests_before = len(emulator.requests())

    # A second instance of the group: Kafka has no committed offset, so without the
    # stored positions it would start from the earliest event and drive all again.
    second = build_charge_worker(charge_settings, build_charger(charge_settings, ledger))
    try:
        _pump_until(second, lambda: bool(second.consumer.assignment()))
        for _ in range(10):
            second.poll_once(timeout_ms=100)
    finally:
        second.consumer.close()
        second.pool.shutdown()
    assert second.driven == 0
    assert len(emulator.requests()) == requests_before
    assert assert_invariants(ledger, emulator, ids) == {"charged": 8}


def test_the_reconciler_finds_open_transactions_in_the_projection_and_past_its_position(
    charge_settings: Settings, ledger: BillingLedger
) -> None:
    """Projected rows answer from the index; what the projector has not reached yet is
    found in the events after its position; a stopped projector hides nothing."""
    first = reserve(ledger, 3, customer="early")
    with build_projector(charge_settings, ledger) as projector:
        projector.pump_all()
    charger = build_charger(charge_settings, ledger)
    assert charger.drive(first[0]) == "charged"  # the projection still says reserved
    later = reserve(ledger, 2, customer="late")  # past the projection's position
    reconciler = build_reconciler(charge_settings, charger)
    assert set(reconciler.open_transactions()) == {*first, *later}

    with build_projector(charge_settings, ledger) as projector:
        projector.pump_all()
    assert set(reconciler.open_transactions()) == {first[1], first[2], *later}

    _reconcile_until_terminal(reconciler, ledger, [*first, *later])
    with build_projector(charge_settings, ledger) as projector:
        projector.pump_all()
    (done,) = reserve(ledger, 1, customer="done")
    assert charger.drive(done) == "charged"  # past the position, and terminal there
    assert reconciler.open_transactions() == []
