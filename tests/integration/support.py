"""Helpers for integration tests: produce, drive a worker, await conditions, count rows."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg

from adapters.audit.replay import Scope
from adapters.audit.report import audit, stripe_invoice_totals
from adapters.bootstrap import (
    build_corrections,
    build_ingest_worker,
    build_projector,
    build_pusher,
    close_worker,
)
from adapters.broker import consumer_lag, make_producer
from adapters.charging.closer import CloseResult, InvoiceCloser
from adapters.ingest.worker import IngestWorker
from adapters.settings import DEFAULT_PRICE_LIST, Settings, child_env
from domain.account import CustomerAccount
from domain.audit import InvoiceItem
from domain.contract import check_terms
from domain.customer import CustomerLink
from domain.invoice import Invoice
from domain.invoice_states import InvoiceState
from domain.metering import Metering
from domain.pricing import PriceList
from domain.saga import StepResult
from domain.transaction import Source
from domain.usage import UsageRecord
from infra.stripe_emulator import StripeEmulator
from projections.projector import PROJECTIONS, Projector, rebuild
from store.connections import Database
from store.ledger import BillingLedger

METERED_TOPIC = "domain.transaction:BillingTransaction.Metered"


def usage(
    usage_id: str, customer: str = "acme", quantity: int = 1000, meter: str = "api.requests"
) -> UsageRecord:
    return UsageRecord(
        usage_id=usage_id,
        customer_id=customer,
        meter=meter,
        quantity=Decimal(quantity),
        occurred_at=datetime(2026, 12, 1, tzinfo=UTC),
    )


def produce(settings: Settings, messages: Iterable[tuple[bytes | None, bytes | None]]) -> int:
    producer = make_producer(settings.kafka_bootstrap)
    n = 0
    for key, value in messages:
        producer.send(settings.usage_topic, key=key, value=value)
        n += 1
    producer.flush()
    producer.close()
    return n


def produce_records(settings: Settings, records: Iterable[UsageRecord]) -> int:
    return produce(settings, ((r.customer_id.encode(), r.to_json()) for r in records))


def wait_for(condition: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def drive(worker: IngestWorker, until: Callable[[], bool], timeout: float = 60.0) -> None:
    """Run the worker's poll/process loop in this thread until ``until()`` holds."""
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError(f"worker did not get there in {timeout}s: {worker.stats}")
        polled = worker.consumer.poll(timeout_ms=100)
        records = [r for rs in polled.values() for r in rs]
        if records:
            worker.process(records)


def ingest_until(settings: Settings, ledger: BillingLedger, records: int) -> None:
    """Run an ingest worker of ``settings`` until it has read ``records`` records."""
    worker = build_ingest_worker(settings, ledger)
    try:
        drive(worker, until=lambda: worker.stats.records >= records)
    finally:
        close_worker(worker)


def run_cli(
    settings: Settings, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``billing-ledger ARGS`` in a child process with ``settings`` in its environment."""
    return subprocess.run(
        [sys.executable, "-m", "adapters.cli", *args],
        env=child_env(settings),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def total_lag(settings: Settings) -> int:
    return sum(
        consumer_lag(settings.kafka_bootstrap, settings.ingest_group, settings.usage_topic).values()
    )


def metered_usage_ids(url: str) -> list[str]:
    """usage_id of every Metered event in the store (decoded from the stored JSON)."""
    return [state["usage_id"] for state in stored_states(url, METERED_TOPIC)]


def stored_states(url: str, topic: str) -> list[dict[str, Any]]:
    """The stored state (JSON) of every event of ``topic``, in the log's order."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT convert_from(state, 'UTF8')::jsonb FROM billingledger_events"
            " WHERE topic = %s ORDER BY notification_id",
            (topic,),
        ).fetchall()
    return [r[0] for r in rows]


def count_events(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM billingledger_events").fetchone()
    assert row is not None
    return int(row[0])


def record(ledger: BillingLedger, customer: str, ids: Sequence[str], qty: int = 5000) -> list[UUID]:
    batch = [
        Metering(usage(u, customer=customer, quantity=qty + i), Source("usage", 0, i))
        for i, u in enumerate(ids)
    ]
    return [t.id for t in ledger.record_usage(batch).transactions]


def line_of(ledger: BillingLedger, txn_id: UUID) -> UUID:
    line = ledger.transaction(txn_id).line_id
    assert line is not None
    return line


def mixed_workload(
    settings: Settings, ledger: BillingLedger, emulator: StripeEmulator, projector: Projector
) -> dict[str, UUID]:
    """Duplicates, a spend-limit refusal, pushes, a permanent refusal compensated, a push
    whose answer was lost, a reversal, usage not pushed yet; projected between steps."""
    ledger.set_spend_limit("capped", "USD", 800)  # 8.00 USD: the second record is refused
    acme = record(ledger, "acme", ["a-1", "a-2"])
    projector.pump()
    capped = record(ledger, "capped", ["c-1", "c-2"])  # 5.00 USD each
    dup = ledger.record_usage(
        [Metering(usage("a-1", customer="acme", quantity=5000), Source("usage", 0, 9))]
    )
    assert dup.transactions == []  # a duplicate: no new transaction
    perm = record(ledger, "perm", ["p-1"])
    slow = record(ledger, "slow", ["s-1"])
    projector.pump()

    pusher = build_pusher(settings, ledger)
    assert pusher.push(line_of(ledger, acme[0])).result is StepResult.CHARGED
    assert pusher.push(line_of(ledger, capped[0])).result is StepResult.CHARGED
    assert pusher.push(line_of(ledger, slow[0])).result is StepResult.CHARGED
    projector.pump()
    # A customer Stripe does not know: the draft invoice is refused (400).
    ledger.save(CustomerLink(customer_id="perm", stripe_customer_id="cus_does_not_exist"))
    assert pusher.push(line_of(ledger, perm[0])).result is StepResult.COMPENSATED
    slow += record(ledger, "slow", ["s-2"])
    emulator.set_faults(drop_response_after_execute=1)  # Stripe executes, the answer is lost
    assert pusher.push(line_of(ledger, slow[0])).result is StepResult.RETRY  # due in ~30 s
    assert build_corrections(pusher).reverse(acme[1], "goodwill") is StepResult.REVERSED
    assert pusher.push(line_of(ledger, acme[0])).result is StepResult.CHARGED  # the lower total
    later = record(ledger, "acme", ["a-3", "a-4"])  # not pushed yet
    _credited(ledger)
    _contracted(ledger)
    projector.pump_all()
    return {
        "charged": acme[0],
        "reversed": acme[1],
        "reserved": later[0],
        "refused": capped[1],
        "failed": perm[0],
        "retry": slow[1],
    }


def _credited(ledger: BillingLedger) -> None:
    """A customer with prepaid credit: a grant partly consumed, a grant voided, a policy."""
    at = datetime.now(UTC) - timedelta(days=1)

    def grant(grant_id: str, amount: int) -> Callable[[CustomerAccount], bool]:
        return lambda a: a.grant_credit(
            grant_id, amount, effective_at=at, source="promotional", reason="welcome"
        )

    ledger.change_account("credited", "USD", grant("promo", 300))
    ledger.change_account("credited", "USD", grant("spare", 100))
    ledger.change_account("credited", "USD", lambda a: a.void_credit("spare", "sold in error"))
    record(ledger, "credited", ["k-1"])  # 5.00 USD: 3.00 of it from the grant
    ledger.change_account("credited", "USD", lambda a: a.set_credit_policy("block"))


def _contracted(ledger: BillingLedger) -> None:
    """A customer with two contract versions: minimums, then a discount alone (which ends
    them); it has no usage, so nothing is trued up."""
    listed = ledger.refresh_prices().latest.prices
    minimums = {"USD": "25.00", "meters": {"api.requests": "1.00"}}
    now = datetime.now(UTC)
    ledger.set_contract("contracted", check_terms({}, minimums, listed), now - timedelta(days=2))
    discount = {"api.requests": {"discount": "10"}}
    ledger.set_contract("contracted", check_terms(discount, {}, listed), now - timedelta(days=1))


def run_worker_until(worker: IngestWorker, records: int, what: str) -> None:
    """Run the worker's own loop (read-ahead, write-behind) in a thread until it has done
    ``records`` records (or died); then stop and close it."""
    stop = threading.Event()
    runner = threading.Thread(target=worker.run, args=(stop,))
    runner.start()
    try:
        wait_for(lambda: worker.stats.records == records or not runner.is_alive(), what=what)
    finally:
        stop.set()
        runner.join(30)
        if runner.is_alive():  # closing its clients under it would race its loop
            raise AssertionError(f"the worker did not stop within 30 s: {worker.stats}")
        close_worker(worker)


def audit_findings(
    settings: Settings,
    ledger: BillingLedger,
    stripe_items: Callable[[], list[InvoiceItem]] | None = None,
) -> list[str]:
    """The read models brought up to date, then the audit's findings (none: clean)."""
    with build_projector(settings, ledger) as projector:
        projector.pump_all()
    report = audit(
        Database(settings.database_url),
        Scope(),
        horizon=settings.overdue_after(),
        stripe_items=stripe_items,
        stripe_invoices=(
            (lambda: stripe_invoice_totals(settings.stripe())) if stripe_items is not None else None
        ),
        progress=False,
    )
    return [f"{f.kind} {f.subject}: {f.detail}" for f in report.findings]


def price_file(tmp_path: Path, api_requests: str) -> Path:
    """The shipped price file with another price of ``api.requests``."""
    text = DEFAULT_PRICE_LIST.read_text(encoding="utf-8")
    path = tmp_path / f"prices-{api_requests}.toml"
    path.write_text(text.replace('unit_price = "0.001"', f'unit_price = "{api_requests}"'))
    assert PriceList.from_toml(path.read_text()).price_of("api.requests").unit_price == Decimal(
        api_requests
    )
    return path


def projection_rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the read models a rebuild must give again, in a stable order."""
    with psycopg.connect(url) as conn:
        return {
            "transactions": conn.execute(
                "SELECT * FROM billing.transactions ORDER BY transaction_id"
            ).fetchall(),
            "balances": conn.execute(
                "SELECT * FROM billing.customer_balances ORDER BY customer_id, currency"
            ).fetchall(),
            "charge_attempts": conn.execute(
                "SELECT * FROM billing.charge_attempts ORDER BY transaction_id, version"
            ).fetchall(),
            "invoice_lines": conn.execute(
                "SELECT * FROM billing.invoice_lines ORDER BY line_id"
            ).fetchall(),
            "line_pushes": conn.execute(
                "SELECT * FROM billing.line_pushes ORDER BY push_id, version"
            ).fetchall(),
            "credit_grants": conn.execute(
                "SELECT * FROM billing.credit_grants ORDER BY customer_id, currency, grant_id"
            ).fetchall(),
            "credit_balances": conn.execute(
                "SELECT * FROM billing.credit_balances ORDER BY customer_id, currency"
            ).fetchall(),
            "contract_versions": conn.execute(
                "SELECT * FROM billing.contract_versions ORDER BY customer_id, version"
            ).fetchall(),
        }


def rebuild_all(url: str, ledger: BillingLedger) -> None:
    """Rebuild every projection from the history (in batches of 5: many turns)."""
    for name in (p.name for p in PROJECTIONS):
        rebuild(Database(url), name, ledger.mapper.to_domain_event, batch=5)


def finalize(closer: InvoiceCloser, ledger: BillingLedger, invoice_id: UUID) -> Invoice:
    """Close now, push the final totals, finalize: as the close role does."""
    step = closer.step(invoice_id, close_now="test")
    for _ in range(5):
        if step.result is not CloseResult.WAITING:
            break
        step = closer.step(invoice_id)
    invoice = ledger.invoice_by_id(invoice_id)
    assert invoice is not None
    assert invoice.state is InvoiceState.FINALIZED, step
    return invoice
