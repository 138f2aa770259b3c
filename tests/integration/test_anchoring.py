"""Anchored history against a real PostgreSQL (issue 13, invariant I9): the reproduction
(a charged amount edited, its aggregate's hash chain recomputed, every projection
rebuilt) and the deletions the per-aggregate chain cannot see are reported by the audit
against the signed checkpoint, while the writer cannot even try them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson
import psycopg
import pytest
from eventsourcing.domain import Snapshot
from pydantic import SecretStr

from adapters.audit.anchor import anchor_once, anchors, load_checkpoints
from adapters.audit.replay import Scope
from adapters.audit.report import AuditReport, audit
from adapters.bootstrap import build_projector, login, migrate, open_ledger, owner_database
from adapters.settings import Settings
from domain.chain import GENESIS, event_hash
from infra.embedded import OWNER
from infra.stripe_emulator import StripeEmulator
from projections.projector import PROJECTIONS, rebuild
from store.roles import AUDITOR
from tests.integration.roles import as_role
from tests.integration.support import mixed_workload, record

pytestmark = pytest.mark.integration

KEY = b"k" * 32
EVENTS = "public.billingledger_events"


@pytest.fixture
def history(roles_settings: Settings, emulator: StripeEmulator) -> Settings:
    """A migrated database with a mixed history written by the writer, projected."""
    migrate(roles_settings)
    with open_ledger(roles_settings) as ledger, build_projector(roles_settings, ledger) as proj:
        mixed_workload(roles_settings, ledger, emulator, proj)
        proj.pump_all()
    return roles_settings


def _auditor(settings: Settings, server: str, path: Path) -> Settings:
    return settings.model_copy(
        update={
            "database_url": as_role(server, AUDITOR),
            "anchor_path": path,
            "anchor_key": SecretStr(KEY.decode()),
        }
    )


def _audit(settings: Settings, path: Path) -> AuditReport:
    return audit(
        login(settings),
        Scope(),
        horizon=settings.overdue_after(),
        progress=False,
        anchors=anchors(path, KEY),
    )


def _kinds(report: AuditReport) -> set[str]:
    return {f.kind for f in report.findings}


def _charged(server: str) -> UUID:
    with psycopg.connect(server) as conn:
        row = conn.execute(
            "SELECT transaction_id FROM billing.transactions WHERE state = 'charged' LIMIT 1"
        ).fetchone()
    assert row is not None
    return UUID(str(row[0]))


def _as_owner(server: str, change: Callable[[psycopg.Connection[Any]], None]) -> None:
    """What the owner can do and the writer cannot: history with the trigger off."""
    with psycopg.connect(as_role(server, OWNER)) as conn:
        conn.execute(f"ALTER TABLE {EVENTS} DISABLE TRIGGER events_append_only")
        change(conn)
        conn.execute(f"ALTER TABLE {EVENTS} ENABLE TRIGGER events_append_only")


def _edit_amount_and_rechain(txn: UUID) -> Callable[[psycopg.Connection[Any]], None]:
    def change(conn: psycopg.Connection[Any]) -> None:
        rows = conn.execute(
            "SELECT originator_version, topic, state FROM public.billingledger_events"
            " WHERE originator_id = %s ORDER BY originator_version",
            (txn,),
        ).fetchall()
        prev = GENESIS
        for version, topic, stored in rows:
            state = bytes(stored)
            if version == 1:
                data = orjson.loads(state)
                data["amount"]["_data_"] = "1"  # a charged amount, edited
                state = orjson.dumps(data)
            digest = event_hash(prev, txn, version, topic, state)
            conn.execute(
                "UPDATE public.billingledger_events SET state = %s, prev_hash = %s, hash = %s"
                " WHERE originator_id = %s AND originator_version = %s",
                (state, prev, digest, txn, version),
            )
            prev = digest

    return change


def _rebuild_all(settings: Settings) -> None:
    with open_ledger(settings) as ledger, owner_database(settings) as db:
        for p in PROJECTIONS:
            rebuild(db, p.name, ledger.mapper.to_domain_event)


def test_the_reproduction_edit_rechain_rebuild_is_caught_by_the_anchor(
    history: Settings, server: str, tmp_path: Path
) -> None:
    path = tmp_path / "anchor.jsonl"
    auditor = _auditor(history, server, path)
    checkpoint = anchor_once(login(auditor), path, KEY)
    assert checkpoint is not None and checkpoint.events > 0
    assert _audit(auditor, path).ok
    txn = _charged(server)
    # The writer cannot: no UPDATE, no trigger switch, no replication role.
    with psycopg.connect(history.database_url) as conn, pytest.raises(psycopg.Error):
        conn.execute("UPDATE public.billingledger_events SET state = state")
    # The owner can, and recomputes the aggregate's chain and every read model...
    _as_owner(server, _edit_amount_and_rechain(txn))
    _rebuild_all(history)
    report = _audit(auditor, path)
    # ... the per-aggregate chains hold (re-chained), but the signed checkpoint does not.
    assert "chain" not in _kinds(report)
    assert "anchor" in _kinds(report), report.findings
    finding = next(f for f in report.findings if f.kind == "anchor")
    assert "edited or replaced" in finding.detail


@pytest.mark.parametrize("cut", ["latest_event_of_an_aggregate", "whole_aggregate"])
def test_deleting_anchored_events_is_caught(
    history: Settings, server: str, tmp_path: Path, cut: str
) -> None:
    path = tmp_path / "anchor.jsonl"
    auditor = _auditor(history, server, path)
    anchor_once(login(auditor), path, KEY)
    txn = _charged(server)

    def delete(conn: psycopg.Connection[Any]) -> None:
        if cut == "whole_aggregate":
            conn.execute("DELETE FROM public.billingledger_events WHERE originator_id = %s", (txn,))
        else:
            conn.execute(
                "DELETE FROM public.billingledger_events WHERE originator_id = %s"
                " AND originator_version = (SELECT max(originator_version)"
                " FROM public.billingledger_events WHERE originator_id = %s)",
                (txn, txn),
            )

    _as_owner(server, delete)
    _rebuild_all(history)
    report = _audit(auditor, path)
    assert "anchor" in _kinds(report), report.findings


def test_events_after_the_checkpoint_are_reported_unanchored_not_tampered(
    history: Settings, server: str, tmp_path: Path
) -> None:
    path = tmp_path / "anchor.jsonl"
    auditor = _auditor(history, server, path)
    first = anchor_once(login(auditor), path, KEY)
    assert anchor_once(login(auditor), path, KEY) is None  # nothing new: no line
    with open_ledger(history) as ledger:
        record(ledger, "late", ["l-1", "l-2"])
    with open_ledger(history) as ledger, build_projector(history, ledger) as proj:
        proj.pump_all()
    report = _audit(auditor, path)
    assert report.ok, report.findings
    assert report.anchor is not None and report.anchor["unanchored_events"] > 0
    second = anchor_once(login(auditor), path, KEY)
    assert first is not None and second is not None and second.events > first.events
    assert len(load_checkpoints(path, KEY)[0]) == 2
    again = _audit(auditor, path).anchor
    assert again is not None
    assert (again["checkpoints"], again["anchored_events"], again["unanchored_events"]) == (
        2,
        second.events,
        0,
    )


def test_an_edited_or_deleted_checkpoint_file_is_reported(
    history: Settings, server: str, tmp_path: Path
) -> None:
    path = tmp_path / "anchor.jsonl"
    auditor = _auditor(history, server, path)
    anchor_once(login(auditor), path, KEY)
    line = orjson.loads(path.read_text())
    line["events"] -= 1  # made to agree with a history that lost an event
    path.write_text(orjson.dumps(line).decode() + "\n")
    assert {"anchor_signature", "anchor_missing"} <= _kinds(_audit(auditor, path))
    path.unlink()
    assert "anchor_missing" in _kinds(_audit(auditor, path))


def test_the_writer_cannot_place_a_row_in_the_anchored_past(history: Settings) -> None:
    with (
        psycopg.connect(history.database_url) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute(
            "INSERT INTO public.billingledger_events"
            " (originator_id, originator_version, topic, state, xid)"
            " VALUES (gen_random_uuid(), 1, 'x', '\\x00', '3'::xid8)"
        )


def test_a_forged_account_snapshot_that_lifts_the_limit_is_reported_limit_exceeded(
    roles_settings: Settings, server: str, tmp_path: Path
) -> None:
    """The reproduction, with the writer's own login: a snapshot of the account with no
    limit (the writer may INSERT snapshots: the ledger takes them), then usage the limit
    refused before is reserved; the audit re-checks every reservation against the limit
    in force at its event."""
    migrate(roles_settings)
    with open_ledger(roles_settings) as ledger:
        ledger.set_spend_limit("capped", "USD", 800)  # 8.00 USD
        account = ledger.account("capped", "USD")
        assert account is not None and ledger.snapshots is not None
        account.spend_limit = None  # forged
        ledger.snapshots.put([Snapshot.take(account)])
    with open_ledger(roles_settings) as ledger, build_projector(roles_settings, ledger) as proj:
        record(ledger, "capped", ["c-1", "c-2", "c-3"])  # 5.000, 5.001, 5.002 USD: 15.003 reserved
        proj.pump_all()
    report = _audit(_auditor(roles_settings, server, tmp_path / "a.jsonl"), tmp_path / "none")
    exceeded = [f for f in report.findings if f.kind == "limit_exceeded"]
    assert [f.subject for f in exceeded] == ["capped/USD v2"], report.findings
    assert exceeded[0].detail == (
        "a reservation took what is committed to 15.003 USD, past the spend limit of 8.00 USD"
        " in force at that event"
    )
