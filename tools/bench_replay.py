"""``billing-ledger bench replay``: how fast the audit replays and checks the history.

One run, one database server:

* generate: usage priced by the ingest's own decision (``domain.metering``, through
  ``BillingLedger.record_usage``: Metered + Reserved, appended by the recorder's
  binary COPY with hash chains), then Charged for half the transactions and
  Compensated for a tenth (appended the same way, chained to the stored events);
* database read: the server's own sequential read of the very rows the audit reads
  (the same ``COPY (SELECT ... ORDER BY notification_id) TO STDOUT``, bytes only);
* audit replay: those rows read, every hash chain verified, every event decoded and
  folded, balances computed and every invariant checked (``adapters.audit.replay``
  and the domain's checks; the read models are not compared: none are built here).
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import psycopg

from adapters.audit.replay import HISTORY_COPY, history_size, read_history, replay
from adapters.bootstrap import migrate, open_ledger
from adapters.progress import Progress, step
from adapters.settings import Settings
from domain.audit import balances_of, check_balances, check_transactions
from domain.audit_prices import check_prices
from domain.metering import Metering
from domain.transaction import BillingTransaction, Source, TxnState
from domain.usage import UsageRecord
from infra.embedded import EmbeddedPostgres
from store.ledger import BillingLedger
from tools.bench_store import fresh_database

__all__ = ["generate", "render_replay", "run_replay_bench"]

CUSTOMERS = 200
BATCH = 5000  # records per save


def run_replay_bench(events: int, *, database_url: str | None = None) -> dict[str, Any]:
    """Generate about ``events`` events, then time the database read and the audit replay."""
    with ExitStack() as stack:
        if database_url is None:
            step("starting embedded PostgreSQL")
            database_url = stack.enter_context(EmbeddedPostgres()).url
        url = fresh_database(database_url, "bench_replay")
        settings = Settings(database_url=url)
        migrate(settings)
        with open_ledger(settings) as ledger:
            generated = generate(ledger, events)
        db = _database_read(url)
        checked = _audit_replay(url)
        return {
            "cores": os.cpu_count() or 1,
            "events": db["rows"],
            "generate": generated,
            "database_read": db,
            "audit_replay": checked,
            "audit_ok": checked["findings"] == 0,
            "replay_vs_read": round(checked["events_per_s"] / db["rows_per_s"], 3),
        }


def generate(ledger: BillingLedger, events: int) -> dict[str, Any]:
    """Records so that Metered + Reserved + Charged (half) + Compensated (a tenth) ~ events."""
    records = max(1, int(events / 2.6))
    step(f"generating {records:,} transactions (~{events:,} events)")
    bar = Progress(records, "generated transactions")
    started = time.perf_counter()
    base = datetime(2026, 12, 1, tzinfo=UTC)
    for first in range(0, records, BATCH):
        batch = [
            Metering(
                UsageRecord(
                    usage_id=f"r-{i}",
                    customer_id=f"cust-{i % CUSTOMERS:03d}",
                    meter="api.requests",
                    quantity=Decimal(1000 + i % 5000),
                    occurred_at=base + timedelta(milliseconds=i),
                ),
                Source("bench", 0, i),
            )
            for i in range(first, min(first + BATCH, records))
        ]
        decision = ledger.record_usage(batch)
        ledger.save(*_outcomes([t.id for t in decision.transactions]), notification_ids=False)
        bar.update(min(first + BATCH, records))
    bar.done()
    elapsed = time.perf_counter() - started
    return {"transactions": records, "seconds": round(elapsed, 1)}


def _outcomes(txn_ids: list[UUID]) -> list[BillingTransaction.Event]:
    """Compensated for every tenth transaction (version 3); the others stay reserved. (A
    Charged is made by a line's push, whose history this bench does not write: a
    transaction charged without one is an audit finding.)"""
    out: list[BillingTransaction.Event] = []
    for i, txn_id in enumerate(txn_ids):
        now = BillingTransaction.Event.create_timestamp()
        if i % 10 == 1:
            out.append(
                BillingTransaction.Compensated(  # type: ignore[call-arg]
                    originator_id=txn_id, originator_version=3, timestamp=now,
                    reason="bench: gave up", from_state=str(TxnState.RESERVED),
                    stripe_reversal_id=None,
                )
            )  # fmt: skip
    return out


def _database_read(url: str) -> dict[str, Any]:
    step("database read: COPY of the same rows, bytes only")
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        rows = history_size(conn)
        started = time.perf_counter()
        size = 0
        with cur.copy(HISTORY_COPY) as copy:
            for block in copy:
                size += len(block)
        elapsed = time.perf_counter() - started
    return {"rows": rows, "mb": round(size / 1e6, 1), "rows_per_s": round(rows / elapsed)}


def _audit_replay(url: str) -> dict[str, Any]:
    step("audit replay: read, verify hash chains, decode, fold, check invariants")
    with psycopg.connect(url) as conn:
        started = time.perf_counter()
        result = replay(read_history(conn))
        balances = balances_of(result.transactions.values(), result.limits)
        findings = len(result.breaks) + len(check_balances(balances))
        findings += len(
            check_transactions(
                result.transactions.values(), now=datetime.now(UTC), horizon=timedelta(days=3650)
            )
        )
        findings += len(check_prices(result.transactions.values(), result.prices))
        elapsed = time.perf_counter() - started
    states: dict[str, int] = {}
    for txn in result.transactions.values():
        states[str(txn.state)] = states.get(str(txn.state), 0) + 1
    return {
        "events": result.events,
        "seconds": round(elapsed, 2),
        "events_per_s": round(result.events / elapsed),
        "transactions": states,
        "findings": findings,
    }


def render_replay(r: dict[str, Any]) -> str:
    db, audit = r["database_read"], r["audit_replay"]
    lines = [
        f"billing-ledger bench replay: {r['events']:,} events, {r['cores']} cores",
        f"generated {r['generate']['transactions']:,} transactions in {r['generate']['seconds']} s",
        f"database read (COPY of the same rows)   {db['rows_per_s']:>12,} rows/s  ({db['mb']} MB)",
        f"audit replay, verified and checked      {audit['events_per_s']:>12,} events/s"
        f"  ({audit['seconds']} s)",
        f"audit replay / database read            {r['replay_vs_read']:>12}",
        f"transactions by state: {audit['transactions']}",
        f"findings: {audit['findings']}" + (" (audit clean)" if r["audit_ok"] else ""),
    ]
    return "\n".join(lines)
