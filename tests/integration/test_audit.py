"""``audit``, ``balances --as-of`` and ``export`` against a real PostgreSQL and the Stripe
emulator: a mixed workload audits clean; each corruption is found and named."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import psycopg
import pytest
import stripe

from adapters.bootstrap import build_corrections, build_pusher
from adapters.settings import Settings
from adapters.stripe.client import StripeGateway
from domain.chain import GENESIS
from domain.ids import contract_id
from domain.saga import StepResult
from infra.stripe_emulator import StripeEmulator
from projections.balances import balances
from projections.projector import PROJECTIONS, Projector
from projections.transactions import transactions
from store.connections import Database
from store.ledger import BillingLedger
from tests.conftest import settings_env
from tests.integration.support import line_of, mixed_workload, record

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "adapters.cli"]


@pytest.fixture
def workload(
    stripe_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> dict[str, UUID]:
    """The mixed workload (duplicates, failures, compensations, a reversal), projected."""
    url = stripe_settings.database_url
    with Projector(Database(url), ledger.mapper.to_domain_event, batch=7) as projector:
        return mixed_workload(stripe_settings, ledger, emulator, projector)


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        env=settings_env(settings),
        timeout=120,
        check=False,
    )


def _audit(settings: Settings, *args: str) -> tuple[int, dict[str, Any]]:
    proc = _cli(settings, "audit", "--json", *args)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _findings(report: dict[str, Any]) -> set[tuple[str, str]]:
    return {(f["kind"], f["subject"]) for f in report["findings"]}


def _as_superuser_attacker(url: str, statement: str, params: tuple[Any, ...]) -> int:
    """Run ``statement`` on the events table with its append-only trigger disabled."""
    with psycopg.connect(url) as conn:
        conn.execute("ALTER TABLE billingledger_events DISABLE TRIGGER events_append_only")
        changed = conn.execute(statement, params).rowcount
        conn.execute("ALTER TABLE billingledger_events ENABLE TRIGGER events_append_only")
    return changed


def test_a_mixed_workload_audits_clean_against_projections_and_stripe(
    stripe_settings: Settings, workload: dict[str, UUID], tmp_path: Any
) -> None:
    out = tmp_path / "report.json"
    status, report = _audit(stripe_settings, "--stripe", "--out", str(out))
    assert (status, report["findings"]) == (0, [])
    assert report["ok"] and json.loads(out.read_text()) == report
    # Lines of acme, capped and slow (whose last push got no answer); perm's was refused.
    assert report["transactions"] == 10 and report["stripe_items"] == 3  # credited: not pushed
    with psycopg.connect(stripe_settings.database_url) as conn:
        row = conn.execute("SELECT count(*) FROM billingledger_events").fetchone()
    assert row is not None and report["events"] == row[0]
    table = _cli(stripe_settings, "audit", "--customer", "acme")
    assert table.returncode == 0 and "OK: every check holds" in table.stdout
    assert "replayed events" in table.stderr  # progress goes to stderr


def test_the_appends_chain_every_event_to_its_predecessor(
    stripe_settings: Settings, workload: dict[str, UUID]
) -> None:
    with psycopg.connect(stripe_settings.database_url) as conn:
        rows = conn.execute(
            "SELECT originator_id, originator_version, prev_hash, hash FROM billingledger_events"
            " ORDER BY originator_id, originator_version"
        ).fetchall()
    hashes = {(r[0], r[1]): r[3] for r in rows}
    assert all(len(r[3]) == 32 for r in rows)
    for originator_id, version, prev_hash, _ in rows:
        assert prev_hash == (GENESIS if version == 1 else hashes[originator_id, version - 1])
    # Charged came through the INSERT path, Metered through COPY: both chained.
    assert (workload["charged"], 3) in hashes


def test_a_deleted_event_is_named_by_aggregate_and_version(
    stripe_settings: Settings, workload: dict[str, UUID]
) -> None:
    txn = workload["charged"]  # Metered v1, Reserved v2, Charged v3
    deleted = _as_superuser_attacker(
        stripe_settings.database_url,
        "DELETE FROM billingledger_events WHERE originator_id = %s AND originator_version = 2",
        (txn,),
    )
    assert deleted == 1
    status, report = _audit(stripe_settings)
    assert status == 1
    chain = [f for f in report["findings"] if f["kind"] == "chain"]
    assert [(f["subject"], f["detail"]) for f in chain] == [
        (f"{txn} v3", "version 2 missing (deleted)")
    ]


def test_an_edited_amount_is_named_and_differs_from_the_projection(
    stripe_settings: Settings, workload: dict[str, UUID]
) -> None:
    txn = workload["reserved"]
    edited = _as_superuser_attacker(
        stripe_settings.database_url,
        "UPDATE billingledger_events SET state = convert_to(jsonb_set("
        "convert_from(state, 'UTF8')::jsonb, '{amount}', '1')::text, 'UTF8')"
        " WHERE originator_id = %s AND originator_version = 1",
        (txn,),
    )
    assert edited == 1
    status, report = _audit(stripe_settings)
    assert status == 1
    assert ("chain", f"{txn} v1") in _findings(report)
    assert "edited" in next(f["detail"] for f in report["findings"] if f["kind"] == "chain")
    details = [f["detail"] for f in report["findings"] if f["subject"] == str(txn)]
    assert any(d.startswith("transactions.amount:") for d in details), details
    assert ("projection", "acme/USD") in _findings(report)  # the balance moved with it


def test_a_projection_row_changed_by_hand_is_named(
    stripe_settings: Settings, workload: dict[str, UUID]
) -> None:
    txn = workload["retry"]
    with psycopg.connect(stripe_settings.database_url) as conn:
        conn.execute(
            "UPDATE billing.transactions SET state = 'charged' WHERE transaction_id = %s", (txn,)
        )
    status, report = _audit(stripe_settings)
    assert status == 1
    assert report["findings"] == [
        {
            "kind": "projection",
            "subject": str(txn),
            "detail": "transactions.state: 'charged', history says 'reserved'",
        }
    ]


def test_a_contract_version_row_changed_or_moved_to_another_customer_is_named(
    stripe_settings: Settings, workload: dict[str, UUID]
) -> None:
    """``billing.contract_versions`` (the preview's minimums) is compared with the history:
    a minimum lowered by hand, and a version given to another customer."""
    cid = contract_id("contracted")
    with psycopg.connect(stripe_settings.database_url) as conn:
        conn.execute(
            "UPDATE billing.contract_versions SET minimums = '{\"USD\": 100}'"
            " WHERE customer_id = 'contracted' AND version = 1"
        )
        conn.execute(
            "UPDATE billing.contract_versions SET customer_id = 'acme'"
            " WHERE customer_id = 'contracted' AND version = 2"
        )
    status, report = _audit(stripe_settings)
    assert status == 1
    assert sorted((f["subject"], f["detail"]) for f in report["findings"]) == [
        (f"{cid}/1", "contract_versions.minimums: {'USD': 100}, history says {'USD': 2500}"),
        (f"{cid}/2", "contract_versions.customer: False, history says True"),
    ]


def test_an_invoice_item_created_outside_the_ledger_is_named(
    stripe_settings: Settings,
    ledger: BillingLedger,
    workload: dict[str, UUID],
    emulator: StripeEmulator,
) -> None:
    assert _audit(stripe_settings, "--stripe")[0] == 0
    customer = StripeGateway(stripe_settings.stripe()).create_customer("acme")
    client = stripe.StripeClient("sk_test_x", base_addresses={"api": emulator.url})
    item = client.v1.invoice_items.create(
        params={"customer": customer, "amount": 999, "currency": "usd"}
    )
    status, report = _audit(stripe_settings, "--stripe")
    assert status == 1
    assert _findings(report) == {("stripe", item.id)}
    assert "Stripe has a charge of 9.99 USD the ledger does not" in report["findings"][0]["detail"]
    assert _audit(stripe_settings)[0] == 0  # without --stripe, Stripe is not asked


def test_balances_as_of_match_what_the_projections_showed_at_those_instants(
    stripe_settings: Settings, ledger: BillingLedger, emulator: StripeEmulator
) -> None:
    url = stripe_settings.database_url
    seen: list[tuple[datetime, dict[str, Any]]] = []
    with Projector(Database(url), ledger.mapper.to_domain_event) as projector:

        def checkpoint() -> None:
            projector.pump_all()
            with psycopg.connect(url) as conn:
                shown = {
                    "balances": _balance_rows(balances(conn)),
                    "states": {
                        str(r["transaction_id"]): r["state"] for r in transactions(conn, limit=1000)
                    },
                }
            seen.append((datetime.now(UTC), shown))

        checkpoint()  # nothing yet
        ledger.set_spend_limit("capped", "USD", 800)
        acme = record(ledger, "acme", ["a-1", "a-2"])
        record(ledger, "capped", ["c-1", "c-2"])  # the second is refused
        checkpoint()
        pusher = build_pusher(stripe_settings, ledger)
        assert pusher.push(line_of(ledger, acme[0])).result is StepResult.CHARGED
        checkpoint()
        assert build_corrections(pusher).reverse(acme[1], "goodwill") is StepResult.REVERSED
        ledger.set_spend_limit("capped", "USD", 2000)
        record(ledger, "bolt", ["b-1"])
        record(ledger, "acme", ["a-3"])
        checkpoint()

    for at, shown in seen:
        proc = _cli(stripe_settings, "balances", "--as-of", at.isoformat(), "--json")
        assert proc.returncode == 0, proc.stderr
        past = json.loads(proc.stdout)
        assert _balance_rows(past["balances"]) == shown["balances"], at
        assert {t["transaction_id"]: t["state"] for t in past["transactions"]} == shown["states"]
    assert len({repr(s) for _, s in seen}) == len(seen)  # four different pictures

    at, shown = seen[2]
    one = _cli(stripe_settings, "balances", "--as-of", at.isoformat(), "--customer", "acme")
    assert one.returncode == 0, one.stderr
    assert [line.split()[0] for line in one.stdout.splitlines()[1:3]] == ["customer_id", "acme"]


def _balance_rows(rows: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[Any, ...]]:
    fields = ("metered", "charged", "compensated", "in_flight", "transactions", "refused",
              "spend_limit", "available")  # fmt: skip
    return {
        (r["customer_id"], r["currency"]): tuple(
            None if r[f] is None else Decimal(str(r[f])) for f in fields
        )
        for r in rows
    }


def test_export_gives_the_customers_events_with_positions_and_chained_hashes(
    stripe_settings: Settings, workload: dict[str, UUID]
) -> None:
    proc = _cli(stripe_settings, "export", "--customer", "acme")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    positions = [line["position"] for line in lines]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    by_version = {(line["aggregate_id"], line["version"]): line for line in lines}
    for line in lines:
        prev = by_version.get((line["aggregate_id"], line["version"] - 1))
        assert line["prev_hash"] == (prev["hash"] if prev else GENESIS.hex())
    events = {line["event"] for line in lines}
    assert {"BillingTransaction.Metered", "BillingTransaction.Charged"} <= events
    assert "CustomerAccount.Opened" in events
    assert {line["data"].get("customer_id") for line in lines} - {None} == {"acme"}
    assert f"exported {len(lines)} event(s) of acme" in proc.stderr

    late = _cli(stripe_settings, "export", "--customer", "acme", "--from", "2999-01-01T00:00:00Z")
    assert (late.returncode, late.stdout) == (0, "")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["audit", "--from", "yesterday"], "is not an ISO 8601 timestamp"),
        (["audit", "--from", "2026-12-02", "--to", "2026-12-01"], "--from must be before --to"),
        (["audit", "--customer", "x' OR '1'='1"], "invalid customer"),
        (["balances", "--as-of", "soon"], "is not an ISO 8601 timestamp"),
        (["export"], "--customer"),
    ],
)
def test_audit_misuse_is_one_line_and_exit_2(
    settings: Settings, args: list[str], message: str
) -> None:
    proc = _cli(settings, *args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr


def test_the_scope_selects_a_customer_or_a_range_of_metered_times(
    stripe_settings: Settings, workload: dict[str, UUID]
) -> None:
    with psycopg.connect(stripe_settings.database_url) as conn:
        row = conn.execute(
            "SELECT min(metered_at), max(metered_at) FROM billing.transactions"
        ).fetchone()
    assert row is not None
    first, last = row
    assert _audit(stripe_settings, "--customer", "acme")[1]["transactions"] == 4
    just_after = (first + timedelta(microseconds=1)).isoformat()
    status, after_first = _audit(stripe_settings, "--from", just_after, "--stripe")
    assert status == 0 and 0 < after_first["transactions"] < 10
    status, before_last = _audit(stripe_settings, "--to", last.isoformat())
    assert status == 0 and 0 < before_last["transactions"] < 10
    assert _audit(stripe_settings, "--from", "2999-01-01T00:00:00Z")[1]["transactions"] == 0


def test_a_dead_letter_without_a_reason_is_named(
    stripe_settings: Settings, workload: dict[str, UUID]
) -> None:
    with psycopg.connect(stripe_settings.database_url) as conn:
        conn.execute(
            "INSERT INTO billing.dead_letters (source_topic, source_partition, source_offset,"
            " reason) VALUES ('usage', 2, 41, ' ')"
        )
    status, report = _audit(stripe_settings)
    assert status == 1
    assert _findings(report) == {("dead_letter", "usage/2@41")}


def test_a_projection_behind_the_log_is_named_as_lag(
    stripe_settings: Settings, ledger: BillingLedger, workload: dict[str, UUID]
) -> None:
    record(ledger, "late", ["l-1"])  # not projected: the projector is not running
    status, report = _audit(stripe_settings)
    assert status == 1
    lag = {f["subject"]: f["detail"] for f in report["findings"] if f["kind"] == "projection_lag"}
    assert set(lag) == {p.name for p in PROJECTIONS}
    # The account's Opened and AmountsReserved, the transaction's Metered and Reserved,
    # its line's Opened and Settled, its invoice's Opened
    assert lag["transactions"].startswith("7 event(s) not applied yet")


def test_export_into_a_reader_that_stops_early_ends_quietly(
    stripe_settings: Settings, ledger: BillingLedger
) -> None:
    record(ledger, "bulk", [f"b-{i}" for i in range(600)])  # far more than a pipe holds
    with subprocess.Popen(
        [*CLI, "export", "--customer", "bulk"],
        env=settings_env(stripe_settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        first = json.loads(proc.stdout.readline())  # `| head -1`
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == 0, err
    assert first["version"] == 1 and "error" not in err and "Traceback" not in err
