"""The SQL read models (billing.transactions, billing.customer_balances) against a real
PostgreSQL: live equals rebuilt, exactly once, atomic rebuilds, validated filters."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

from adapters.bootstrap import build_projector, migrate, open_ledger, prepare
from adapters.settings import Settings
from domain.transaction import TxnState
from infra.stripe_emulator import StripeEmulator
from projections.balances import balances
from projections.base import History, InvalidFilter
from projections.projector import PROJECTIONS, Projector, rebuild
from projections.transactions import TransactionsProjection, transactions
from store.connections import Database
from store.eventlog import START, Position, read_after
from store.ledger import BillingLedger
from tests.conftest import settings_env
from tests.integration.support import (
    count_events,
    mixed_workload,
    projection_rows,
    rebuild_all,
    record,
    wait_for,
)
from tools.summary import Balances

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "adapters.cli"]


def _positions(url: str) -> dict[str, Position]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT name, xid::text, notification_id FROM billing.projection_positions"
        ).fetchall()
    return {r[0]: Position(r[1], r[2]) for r in rows}


def test_after_a_mixed_workload_live_projections_equal_rebuilt_ones_and_the_fold(
    stripe_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    url = stripe_settings.database_url
    with Projector(Database(url), ledger.mapper.to_domain_event, batch=7) as projector:
        txns = mixed_workload(stripe_settings, ledger, emulator, projector)
    live = projection_rows(url)
    positions = _positions(url)

    rebuild_all(url, ledger)
    assert projection_rows(url) == live
    assert _positions(url) == positions  # nothing new was written meanwhile

    with psycopg.connect(url) as conn:
        by_state = {TxnState(r["state"]): r for r in transactions(conn, limit=100)}
        rows = {r["transaction_id"]: r for r in transactions(conn, limit=100)}
        got = {(b["customer_id"], b["currency"]): b for b in balances(conn)}
    # ChargeFailed exists only in histories from before lines: a push fails, not a charge.
    assert set(by_state) == set(TxnState) - {TxnState.METERED, TxnState.CHARGE_FAILED}
    for txn_id, row in rows.items():  # every row says what the aggregate says
        txn = ledger.transaction(txn_id)
        assert (row["state"], row["attempts"], row["stripe_object_id"], row["amount"]) == (
            str(txn.state),
            txn.attempts,
            txn.stripe_object_id,
            txn.amount,
        )
        assert row["next_attempt_at"] == txn.next_attempt_at
    reversed_row = rows[txns["reversed"]]
    assert reversed_row["compensation_reason"] == "goodwill"
    assert reversed_row["charged_at"] < reversed_row["compensated_at"]
    assert rows[txns["refused"]]["reserved_at"] is None
    failed = rows[txns["failed"]]
    assert failed["compensation_reason"].startswith("Stripe refused the line: http_400")
    retry = rows[txns["retry"]]
    assert (retry["state"], retry["line_id"]) == (
        "reserved",
        ledger.transaction(txns["retry"]).line_id,
    )
    assert rows[txns["charged"]]["line_sequence"] is not None
    with psycopg.connect(url) as conn:
        failing = conn.execute(
            "SELECT push_attempts, next_attempt_at, last_error FROM billing.invoice_lines"
            " WHERE line_id = %s",
            (retry["line_id"],),
        ).fetchone()
    assert failing is not None and failing[0] == 1 and failing[1] is not None
    assert failing[2].startswith("connection")

    fold = Balances().apply_all(ledger.all_events())
    expected = {
        (customer, currency): bal
        for customer, currencies in fold.by_customer.items()
        for currency, bal in currencies.items()
    }
    assert set(got) == set(expected)
    for key, bal in expected.items():
        row = got[key]
        fields = ("metered", "in_flight", "charged", "compensated", "transactions", "refused")
        assert {f: row[f] for f in fields} == {f: getattr(bal, f) for f in fields}, key
        assert row["spend_limit"] == bal.spend_limit
        account = ledger.account(*key)
        assert account is not None and row["available"] == account.available, key
    assert got["capped", "USD"]["refused"] == 1 and got["capped", "USD"]["available"] == 300
    assert got["acme", "USD"]["compensated"] == rows[txns["reversed"]]["amount"] > 0

    attempts = {(r[0], r[4]): r for r in live["charge_attempts"]}  # (txn, outcome) -> row
    charged = {txn_id for txn_id, outcome in attempts if outcome == "charged"}
    first_slow = rows_by_usage(rows, "s-1")
    assert charged == {txns["charged"], txns["reversed"], rows_by_usage(rows, "c-1"), first_slow}
    assert all(attempts[t, "charged"][7] >= 0 for t in charged)  # seconds since metered
    # Failed pushes are rows of line_pushes: line id, outcome, error class, retryable.
    failed = {(r[2], r[5]): (r[8], r[9]) for r in live["line_pushes"] if r[5] == "failed"}
    assert failed == {
        (rows[txns["retry"]]["line_id"], "failed"): ("connection", True),
        (rows[txns["failed"]]["line_id"], "failed"): ("http_400", False),
    }


def rows_by_usage(rows: dict[UUID, dict[str, Any]], usage_id: str) -> UUID:
    (txn_id,) = [t for t, r in rows.items() if r["usage_id"] == usage_id]
    return txn_id


class _FailsOnce(TransactionsProjection):
    """The real projection, which raises after writing its rows, on its second batch."""

    def __init__(self) -> None:
        self.calls = 0
        self.rows_before_failure = -1

    def apply(
        self, conn: psycopg.Connection[Any], table: str, events: Sequence[Any], history: History
    ) -> None:
        super().apply(conn, table, events, history)
        self.calls += 1
        if self.calls == 2:
            row = conn.execute("SELECT count(*) FROM billing.transactions").fetchone()
            self.rows_before_failure = row[0] if row else -1
            raise RuntimeError("injected: the process dies before the commit")


def test_a_batch_that_fails_before_its_commit_leaves_rows_and_position_as_they_were(
    settings: Settings, request: pytest.FixtureRequest
) -> None:
    migrate(settings)
    with open_ledger(settings) as ledger:
        record(ledger, "acme", [f"r-{i}" for i in range(10)])
        decode = ledger.mapper.to_domain_event
        failing = _FailsOnce()
        projector = Projector(
            Database(settings.database_url), decode, projections=[failing], batch=8
        )  # 8: the price book's 2 events (migrate started it), then 6 of the usage
        request.addfinalizer(projector.close)
        assert projector.pump() == 8
        after_first = projection_rows(settings.database_url)
        position = _positions(settings.database_url)["transactions"]
        first_rows = len(after_first["transactions"])
        assert first_rows > 0

        with pytest.raises(RuntimeError, match="injected"):
            projector.pump()
        assert failing.rows_before_failure > first_rows  # it had written more rows...
        assert projection_rows(settings.database_url) == after_first  # ...all rolled back
        assert _positions(settings.database_url)["transactions"] == position

        # It resumes at the stored position: every remaining event, once.
        assert projector.pump_all() == count_events(settings.database_url) - 8
        live = projection_rows(settings.database_url)
        assert len(live["transactions"]) == 10
        rebuild(Database(settings.database_url), "transactions", decode)
        assert projection_rows(settings.database_url) == live


def test_applying_again_is_impossible_once_the_position_moved_even_for_racing_projectors(
    settings: Settings, request: pytest.FixtureRequest
) -> None:
    migrate(settings)
    with open_ledger(settings) as ledger:
        for chunk in range(4):
            record(ledger, f"cust-{chunk}", [f"r-{i}" for i in range(50)])
        decode = ledger.mapper.to_domain_event
        racers = [Projector(Database(settings.database_url), decode, batch=9) for _ in range(3)]
        for racer in racers:
            request.addfinalizer(racer.close)
        start = threading.Barrier(len(racers))
        errors: list[BaseException] = []

        def race(projector: Projector) -> None:
            start.wait()
            try:
                projector.pump_all()
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=race, args=(p,)) for p in racers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        # Metered+Reserved each; Opened+AmountsReserved per account, Opened+Settled per
        # line, Opened per invoice; Opened+Published of the price book migrate started
        events = 4 * (50 * 2 + 2 + 2 + 1) + 2
        # Each projection saw every event once, between the three of them.
        assert sum(p.applied for p in racers) == len(PROJECTIONS) * events
        live = projection_rows(settings.database_url)

        with Projector(Database(settings.database_url), decode) as fresh:  # no memory of its own
            assert fresh.pump() == 0
        assert projection_rows(settings.database_url) == live
        rebuild_all(settings.database_url, ledger)
        assert projection_rows(settings.database_url) == live
        fold = Balances().apply_all(ledger.all_events())
        assert [(b[0], b[2]) for b in live["balances"]] == [
            (c, fold.by_customer[c]["USD"].metered) for c in sorted(fold.by_customer)
        ]


def test_rebuild_under_concurrent_reads_never_shows_an_empty_or_partial_table(
    settings: Settings, request: pytest.FixtureRequest
) -> None:
    url = settings.database_url
    migrate(settings)
    with open_ledger(settings) as ledger:
        record(ledger, "acme", [f"r-{i}" for i in range(300)])
        projector = build_projector(settings, ledger)
        request.addfinalizer(projector.close)
        projector.pump_all()
        counts: list[int] = []
        seen = threading.Condition()
        stop = threading.Event()
        errors: list[BaseException] = []

        def reader() -> None:
            try:
                with psycopg.connect(url, autocommit=True) as conn:
                    while not stop.is_set():
                        row = conn.execute("SELECT count(*) FROM billing.transactions").fetchone()
                        with seen:
                            counts.append(row[0] if row else -1)
                            seen.notify_all()
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

        def await_reads(n: int) -> None:
            with seen:
                target = len(counts) + n
                assert seen.wait_for(lambda: len(counts) >= target or bool(errors), timeout=30)

        def table_oid() -> int:
            with psycopg.connect(url) as conn:
                row = conn.execute("SELECT 'billing.transactions'::regclass::oid").fetchone()
            assert row is not None
            return int(row[0])

        during: list[int] = []

        def before_swap() -> None:
            with psycopg.connect(url) as conn:
                row = conn.execute("SELECT count(*) FROM billing.transactions__rebuild").fetchone()
            assert row is not None and row[0] == 300  # the shadow is built, not yet swapped
            await_reads(5)  # readers keep reading the live table meanwhile
            during.append(len(counts))
            record(ledger, "acme", [f"late-{i}" for i in range(20)])
            projector.pump_all()  # the live projection moves on while the shadow waits

        oid = table_oid()
        thread = threading.Thread(target=reader)
        thread.start()
        try:
            await_reads(3)
            report = rebuild(Database(url), "transactions", ledger.mapper.to_domain_event, batch=50,
                             before_swap=before_swap)  # fmt: skip
            await_reads(5)
        finally:
            stop.set()
            thread.join(30)
        assert errors == []
        assert report.rows == 320  # the swap caught the shadow up with the late events
        assert table_oid() != oid  # a new table was swapped in
        assert during and counts
        assert set(counts) <= {300, 320}, sorted(set(counts))
        assert counts[-1] == 320
        assert projector.pump() == 0  # the position moved with the swap: nothing twice
        with psycopg.connect(url) as conn:
            assert len(transactions(conn, customer="acme", limit=10_000)) == 320


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"state": "charged; DROP TABLE billing.transactions"}, "unknown state"),
        ({"state": "Charged"}, "unknown state"),
        ({"customer": "x' OR '1'='1"}, "invalid customer"),
        ({"customer": ""}, "invalid customer"),
        ({"customer": "acme\n"}, "invalid customer"),
        ({"limit": 0}, "invalid limit"),
        ({"limit": 10_001}, "invalid limit"),
    ],
)
def test_invalid_filters_raise_invalid_filter_before_any_sql(
    settings: Settings, query: dict[str, Any], message: str
) -> None:
    migrate(settings)
    with psycopg.connect(settings.database_url) as conn:
        with pytest.raises(InvalidFilter, match=message) as caught:
            transactions(conn, **query)
        assert "\n" not in str(caught.value)
        assert transactions(conn) == []  # the table is still there


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_cli_shows_the_read_models_and_refuses_bad_filters_changing_nothing(
    settings: Settings,
) -> None:
    migrate(settings)
    with open_ledger(settings) as ledger:
        record(ledger, "acme", ["r-1", "r-2", "r-3"])
        record(ledger, "bolt", ["b-1"])
        with build_projector(settings, ledger) as projector:
            projector.pump_all()
    env = settings_env(settings)
    before = projection_rows(settings.database_url)

    shown = _cli("transactions", "--state", "reserved", "--customer", "acme", "--limit", "2",
                 "--json", env=env)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)
    assert len(rows) == 2 and {(r["customer_id"], r["state"]) for r in rows} == {
        ("acme", "reserved")
    }
    bal = _cli("balances", "--customer", "bolt", "--json", env=env)
    assert bal.returncode == 0, bal.stderr
    assert [(b["customer_id"], b["metered"], b["in_flight"]) for b in json.loads(bal.stdout)] == [
        ("bolt", "500", "500")  # exact amounts: decimal text, never a float
    ]
    table = _cli("balances", env=env)
    assert table.returncode == 0
    rows_shown, note = table.stdout.split("\n\n")
    assert [line.split()[0] for line in rows_shown.splitlines()] == [
        "customer_id",
        "acme",
        "bolt",
    ]
    assert note.startswith("Exact amounts keep fractions of a minor unit")

    for args, status, message in [
        (["transactions", "--state", "bogus"], 2, "unknown state 'bogus'"),
        (["transactions", "--limit", "0"], 2, "invalid limit 0"),
        (["transactions", "--limit", "ten"], 2, "is not a whole number"),
        (["balances", "--customer", "x' OR '1'='1"], 2, "invalid customer"),
        (["transactions", "--customer", "x' OR '1'='1"], 2, "invalid customer"),
        (["transactions", "--state", "charged; DROP TABLE billing.transactions"], 2, "unknown"),
        (["rebuild", "nope"], 2, "unknown projection 'nope'"),
        (["rebuild"], 2, "give a projection name or --all"),
    ]:
        proc = _cli(*args, env=env)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == status, (args, proc.stderr)
        assert len(lines) == 1 and message in lines[0], (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert projection_rows(settings.database_url) == before

    rebuilt = _cli("rebuild", "--all", env=env)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "rebuilt transactions: 4 rows" in rebuilt.stdout
    assert "rebuilt customer_balances: 2 rows" in rebuilt.stdout
    assert projection_rows(settings.database_url) == before
    with psycopg.connect(settings.database_url) as conn:  # the views read the swapped tables
        health = conn.execute("SELECT backlog_reserved FROM billing.queue_health").fetchone()
    assert health == (sum(1 for r in before["transactions"] if r[7] == "reserved"),)


def test_the_project_role_keeps_the_read_models_current(settings: Settings) -> None:
    migrate(settings)
    prepare(settings)
    worker = subprocess.Popen(
        [*CLI, "run", "--role", "project"], env=settings_env(settings), stderr=subprocess.PIPE
    )
    try:
        with open_ledger(settings) as ledger:
            record(ledger, "acme", [f"r-{i}" for i in range(5)])

        def projected() -> bool:
            with psycopg.connect(settings.database_url) as conn:
                return len(transactions(conn)) == 5 and len(balances(conn)) == 1

        wait_for(projected, timeout=30, what="the project role to apply the events")
        assert _positions(settings.database_url)["transactions"] != START
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err.decode()[-2000:]


def test_the_documented_sql_examples_run_against_the_read_models(settings: Settings) -> None:
    readme = (Path(__file__).resolve().parents[2] / "docs" / "operate" / "queries.md").read_text()
    blocks = re.findall(r"```sql\n(.*?)```", readme, flags=re.DOTALL)
    statements = [s for block in blocks for s in block.split(";") if s.strip()]
    assert len(statements) >= 3
    migrate(settings)
    with open_ledger(settings) as ledger:
        ledger.set_spend_limit("acme", "USD", 600)
        record(ledger, "acme", ["r-1"])
        with build_projector(settings, ledger) as projector:
            projector.pump_all()
    invoice_sql = [s for s in statements if "billing.invoices" in s or "webhook_events" in s]
    [preview_sql] = [s for s in statements if "billing.invoice_preview" in s]
    statements = [s for s in statements if s not in [*invoice_sql, preview_sql]]
    with psycopg.connect(settings.database_url) as conn:
        results = [conn.execute(statement).fetchall() for statement in statements]
        # The open invoice's one line, 5.00 USD exact, billed 500: the total so far.
        [(meter, late, count, exact, billed, total)] = conn.execute(preview_sql).fetchall()
        assert (late, count, exact, billed, total) == (False, 1, 500, 500, 500), meter
        # The invoices' examples run too: an open invoice of this month is in none of them.
        assert len(invoice_sql) == 3
        assert [conn.execute(statement).fetchall() for statement in invoice_sql] == [[], [], []]
    assert results[1] and results[1][0][2] == "reserved"  # the one transaction is unfinished
    assert results[2] == [("acme", "USD", 600, 100, 500, 0)]  # 1.00 USD left of 6.00


def test_a_projector_decoding_a_batch_holds_back_no_other_follower_of_the_log(
    settings: Settings, request: pytest.FixtureRequest
) -> None:
    """The projector reads and decodes a batch before the transaction that applies it:
    that transaction's row lock takes a transaction id, and while one is open no follower
    (the relay, the other lane) can read a save committed after it began."""
    migrate(settings)
    with open_ledger(settings) as ledger:
        record(ledger, "acme", [f"r-{i}" for i in range(5)])
        url = settings.database_url
        seen: list[int] = []

        def visible() -> int:
            with psycopg.connect(url, autocommit=True) as conn:
                return len(read_after(conn, START, 100_000))

        def decode(notification: Any) -> Any:
            if not seen:  # the first row of the first batch: a save commits meanwhile
                before = visible()
                record(ledger, "globex", ["late"])
                seen.append(visible() - before)
            return ledger.mapper.to_domain_event(notification)

        projector = Projector(Database(url), decode, batch=1000)
        request.addfinalizer(projector.close)
        projector.pump_all()
        assert seen and seen[0] > 0  # the late save's events, readable at once
        live = projection_rows(url)
        assert _rebuilt(settings, ledger) == live  # and every event applied once


def _rebuilt(settings: Settings, ledger: BillingLedger) -> dict[str, Any]:
    rebuild_all(settings.database_url, ledger)
    return projection_rows(settings.database_url)
